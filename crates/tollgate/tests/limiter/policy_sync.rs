//! Runtime overrides shared through one Redis by replicas that change them at the same time,
//! while Redis fails, and after Redis lost them: every change made anywhere ends up on every
//! replica.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate::clock::SystemClock;
use tollgate::lifecycle::{Lifecycle, Origin};
use tollgate::limiter::{Limiter, Override};
use tollgate::policy::Policy;
use tollgate::store::{RedisOptions, StoreBackend};
use tollgate_testkit::{FaultProxy, Mode, RedisServer};

const POLICY: &str = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 10}\n";

/// The policy file with a limit of `n` a minute, as pushed.
fn policy(n: u64) -> Vec<(String, String)> {
    vec![(
        "p.yaml".to_owned(),
        POLICY.replace("10}", &format!("{n}}}")),
    )]
}

/// An override of `tenant`'s limit, set at `set_at`.
fn tenant(tenant: &str, limit: u64, set_at: tollgate_core::Timestamp) -> Override {
    Override {
        id: 0,
        domain: "api".into(),
        rule: "per_tenant".into(),
        entries: vec![("tenant".into(), tenant.into())],
        requests_per_unit: limit,
        period: None,
        expires_at: None,
        set_at,
        reason: String::new(),
    }
}

/// How often the replicas here look at Redis.
const EVERY: Duration = Duration::from_millis(100);

/// One replica: its life cycle, sharing through `url` until the returned sender says stop.
struct Replica {
    lifecycle: Arc<Lifecycle>,
    _stop: watch::Sender<bool>,
}

impl Replica {
    async fn start(url: &str) -> Replica {
        Self::start_on(url, POLICY).await
    }

    /// A replica whose policy file is `file`.
    async fn start_on(url: &str, file: &str) -> Replica {
        let options = RedisOptions {
            command_timeout: Duration::from_millis(200),
            ..RedisOptions::default()
        };
        let store =
            StoreBackend::open(&url.parse().unwrap(), options, Arc::new(SystemClock::new()))
                .await
                .unwrap();
        let limiter = Arc::new(Limiter::new(
            Policy::from_yaml("p.yaml", file).unwrap(),
            store,
        ));
        let sources = vec![("p.yaml".to_owned(), file.to_owned())];
        let lifecycle = Arc::new(Lifecycle::new(limiter, None, sources));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(tollgate::policy_sync::run(
            lifecycle.clone(),
            EVERY,
            stopped,
        ));
        Replica {
            lifecycle,
            _stop: stop,
        }
    }

    fn set(&self, tenant: &str, limit: u64) -> u64 {
        self.lifecycle
            .limiter()
            .overrides()
            .set(Override {
                id: 0,
                domain: "api".into(),
                rule: "per_tenant".into(),
                entries: vec![("tenant".into(), tenant.into())],
                requests_per_unit: limit,
                period: None,
                expires_at: None,
                set_at: self.lifecycle.limiter().clock().now(),
                reason: String::new(),
            })
            .unwrap()
    }

    /// The time on this replica's clock.
    fn now(&self) -> tollgate_core::Timestamp {
        self.lifecycle.limiter().clock().now()
    }

    /// The overrides in force here: (tenant, limit, id), by tenant.
    fn overrides(&self) -> Vec<(String, u64, u64)> {
        let mut all: Vec<_> = self
            .lifecycle
            .limiter()
            .overrides()
            .all()
            .into_iter()
            .map(|o| (o.entries[0].1.clone(), o.requests_per_unit, o.id))
            .collect();
        all.sort();
        all
    }
}

/// Waits (5 s at most) until every replica holds exactly `expected` (tenant, limit) pairs.
async fn converge(replicas: &[&Replica], expected: &[(&str, u64)]) {
    let want: Vec<(String, u64)> = expected.iter().map(|(t, l)| ((*t).into(), *l)).collect();
    let seen = |r: &Replica| -> Vec<(String, u64)> {
        r.overrides().into_iter().map(|(t, l, _)| (t, l)).collect()
    };
    for _ in 0..50 {
        if replicas.iter().all(|r| seen(r) == want) {
            return;
        }
        tokio::time::sleep(EVERY).await;
    }
    let got: Vec<_> = replicas.iter().map(|r| seen(r)).collect();
    panic!("replicas never agreed on {want:?}: {got:?}");
}

/// Two replicas on one Redis, A through a proxy that can cut it off.
async fn a_behind_a_proxy() -> (RedisServer, FaultProxy, Replica, Replica) {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let a = Replica::start(&proxy.url()).await;
    let b = Replica::start(&redis.url()).await;
    (redis, proxy, a, b)
}

/// Waits (5 s at most) until every replica runs a policy whose limit is `limit`.
async fn run_limit(replicas: &[&Replica], limit: u64) {
    let limit_of = |r: &Replica| {
        r.lifecycle.limiter().policy().rules()[0]
            .limit
            .map(|p| p.limit())
    };
    for _ in 0..50 {
        if replicas.iter().all(|r| limit_of(r) == Some(limit)) {
            return;
        }
        tokio::time::sleep(EVERY).await;
    }
    let got: Vec<_> = replicas.iter().map(|r| limit_of(r)).collect();
    panic!("replicas never all ran the limit {limit}: {got:?}");
}

/// Two replicas set overrides within one check interval, neither having seen the other's:
/// both overrides reach both replicas, with distinct ids. A delete on one replica, racing a set
/// on the other, removes only what it named. (Each replica used to publish its whole list, so
/// the last one to publish won, and ids collided.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_on_two_replicas_at_once_all_survive() {
    let redis = RedisServer::start();
    let a = Replica::start(&redis.url()).await;
    let b = Replica::start(&redis.url()).await;
    let acme = a.set("acme", 100);
    let globex = b.set("globex", 200);
    assert_ne!(acme, globex);
    converge(&[&a, &b], &[("acme", 100), ("globex", 200)]).await;
    assert_eq!(a.overrides(), b.overrides(), "the same ids everywhere");

    let now = a.lifecycle.limiter().clock().now();
    assert!(
        a.lifecycle
            .limiter()
            .overrides()
            .delete(acme, now)
            .is_some()
    );
    b.set("initech", 300);
    converge(&[&a, &b], &[("globex", 200), ("initech", 300)]).await;
    // Setting a target again replaces its override, wherever it was set.
    a.set("globex", 250);
    converge(&[&a, &b], &[("globex", 250), ("initech", 300)]).await;
}

/// A change made while Redis does not answer (an override, a pushed version) is kept and shared
/// once it answers again; and
/// when Redis loses the shared overrides, the replicas that hold them share them again, so a
/// replica starting afterwards gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_survive_an_outage_and_a_lost_key() {
    let (redis, proxy, a, b) = a_behind_a_proxy().await;
    b.set("acme", 100);
    converge(&[&a, &b], &[("acme", 100)]).await;

    proxy.set_mode(Mode::Blackhole);
    a.set("globex", 200);
    a.lifecycle.activate(policy(20), Origin::Push).unwrap();
    tokio::time::sleep(EVERY * 4).await;
    assert_eq!(
        b.overrides().len(),
        1,
        "not shared yet: Redis is out of A's reach"
    );
    proxy.set_mode(Mode::Pass);
    converge(&[&a, &b], &[("acme", 100), ("globex", 200)]).await;
    // The version pushed during the outage reaches B too (its publishing used to be dropped).
    run_limit(&[&a, &b], 20).await;

    redis.cli(&["FLUSHALL"]);
    let c = Replica::start(&redis.url()).await;
    converge(&[&a, &b, &c], &[("acme", 100), ("globex", 200)]).await;

    // Redis loses everything while A holds a change it could not share: A shares that change
    // and every override it knows, not the change alone (the others would adopt only it).
    proxy.set_mode(Mode::Blackhole);
    a.set("initech", 300);
    redis.cli(&["FLUSHALL"]);
    tokio::time::sleep(EVERY * 3).await;
    proxy.set_mode(Mode::Pass);
    converge(
        &[&a, &b, &c],
        &[("acme", 100), ("globex", 200), ("initech", 300)],
    )
    .await;
}

/// What A changed while Redis was out of its reach does not undo what B changed after it:
/// B's later push stays the fleet's policy, and B's later limit for the same tenant stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_redis_missed_does_not_undo_a_later_one() {
    let (_redis, proxy, a, b) = a_behind_a_proxy().await;
    b.set("acme", 100);
    converge(&[&a, &b], &[("acme", 100)]).await;

    proxy.set_mode(Mode::Blackhole);
    a.lifecycle.activate(policy(20), Origin::Push).unwrap();
    a.set("acme", 200);
    tokio::time::sleep(Duration::from_millis(20)).await;
    b.lifecycle.activate(policy(30), Origin::Push).unwrap();
    b.set("acme", 300);
    tokio::time::sleep(EVERY * 3).await;
    proxy.set_mode(Mode::Pass);
    converge(&[&a, &b], &[("acme", 300)]).await;
    // B's later push.
    run_limit(&[&a, &b], 30).await;
}

/// Overrides an earlier version shared as one list are carried over by the first replica of
/// this version, which then shares them in the merged form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_an_earlier_version_shared_are_carried_over() {
    let redis = RedisServer::start();
    let list = r#"[{"id":7,"domain":"api","rule":"per_tenant","entries":[["tenant","acme"]],"requests_per_unit":100,"period_us":null,"expires_at_us":null,"reason":"old"}]"#;
    redis.cli(&[
        "HSET",
        "tg:{tollgate-policy}:overrides",
        "seq",
        "3",
        "hash",
        "h",
        "doc",
        list,
    ]);
    let a = Replica::start(&redis.url()).await;
    let b = Replica::start(&redis.url()).await;
    converge(&[&a, &b], &[("acme", 100)]).await;
    assert_eq!(a.overrides()[0].2, 7, "the same override, id and all");
}

/// Redis loses everything while A and B cannot reach it, and C, starting then, sets an
/// override first: A and B add all they know to what C made (not adopt C's one override in
/// place of theirs), and C's file policy does not undo the version the fleet was running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starting_after_redis_lost_everything_undoes_nothing() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let a = Replica::start(&proxy.url()).await;
    let b = Replica::start(&proxy.url()).await;
    a.set("acme", 100);
    b.set("globex", 200);
    a.lifecycle.activate(policy(40), Origin::Push).unwrap();
    converge(&[&a, &b], &[("acme", 100), ("globex", 200)]).await;
    run_limit(&[&a, &b], 40).await;

    proxy.set_mode(Mode::Blackhole);
    redis.cli(&["FLUSHALL"]);
    let c = Replica::start(&redis.url()).await;
    c.set("initech", 300);
    tokio::time::sleep(EVERY * 3).await;
    proxy.set_mode(Mode::Pass);
    converge(
        &[&a, &b, &c],
        &[("acme", 100), ("globex", 200), ("initech", 300)],
    )
    .await;
    // The pushed version, not C's file.
    run_limit(&[&a, &b, &c], 40).await;
}

/// A replica that starts on the files the fleet's policy was made beside adopts that policy: a
/// push made on top survives its restart. One that starts on files the fleet has not seen (a
/// deploy changed them: a new ConfigMap, a rollout) makes them the fleet's policy, and the
/// others adopt it. Before, every starting replica adopted the shared policy, so a rollout
/// whose only change was the policy file never applied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_new_files_brings_them_to_the_fleet() {
    let redis = RedisServer::start();
    let a = Replica::start(&redis.url()).await;
    a.lifecycle.activate(policy(40), Origin::Push).unwrap();
    run_limit(&[&a], 40).await;
    let restarted = Replica::start(&redis.url()).await;
    run_limit(&[&a, &restarted], 40).await;

    let deployed = Replica::start_on(&redis.url(), &policy(70)[0].1).await;
    run_limit(&[&a, &restarted, &deployed], 70).await;
    // Once: the fleet then stays on it.
    tokio::time::sleep(EVERY * 3).await;
    run_limit(&[&a, &restarted, &deployed], 70).await;
}

/// A deletion stays: an older set for the same tenant, held by a replica that lost Redis and
/// shared late, does not bring the override back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_older_set_does_not_undo_a_deletion() {
    let (_redis, proxy, a, b) = a_behind_a_proxy().await;
    proxy.set_mode(Mode::Blackhole);
    a.set("acme", 200);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let id = b.set("acme", 300);
    converge(&[&b], &[("acme", 300)]).await;
    let now = b.lifecycle.limiter().clock().now();
    assert!(b.lifecycle.limiter().overrides().delete(id, now).is_some());
    converge(&[&b], &[]).await;
    tokio::time::sleep(EVERY * 2).await;
    proxy.set_mode(Mode::Pass);
    converge(&[&a, &b], &[]).await;
    // And it stays so (A's late set was not merely not yet shared).
    tokio::time::sleep(EVERY * 5).await;
    converge(&[&a, &b], &[]).await;
}

/// A set older than what its target holds is refused, and the answer names the target with
/// what it holds, whatever the sender last saw. The sender may have read the newer value
/// already (a read while its own set waited to be shared: it kept its set over what it read),
/// and an answer of only the targets changed since then did not name it: the replica that made
/// the set kept it for good (`a_late_older_set_does_not_undo_a_deletion`, when Redis came back
/// while that replica was reading rather than sharing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_older_set_is_answered_with_what_its_target_holds() {
    use tollgate::store::redis::{SharedOverride, SharedOverrideChange};
    let redis = RedisServer::start();
    let clock = Arc::new(SystemClock::new());
    let store = StoreBackend::open(
        &redis.url().parse().unwrap(),
        RedisOptions::default(),
        clock.clone(),
    )
    .await
    .unwrap();
    let StoreBackend::Redis(store) = &store else {
        panic!("a Redis store");
    };
    let now = tollgate::clock::Clock::now(clock.as_ref());
    let at = |ago: u64| now.as_micros() - ago;
    let target = r#"["api","per_tenant",[["tenant","acme"]]]"#.to_owned();
    let change = |value: String| SharedOverride {
        target: target.clone(),
        value,
    };
    // Another replica's set, then its deletion (a tombstone).
    let tombstone = format!("2 {} {} -", at(0) + 86_400_000_000, at(1_000));
    let changes = [
        SharedOverrideChange::Set(change(format!("2 0 {} {{}}", at(2_000)))),
        SharedOverrideChange::Delete(change(tombstone.clone())),
    ];
    let (_, read) = store.merge_overrides(&changes, now, None).await.unwrap();
    // A set made before both, from a replica that has read that far.
    let older = [SharedOverrideChange::Set(change(format!(
        "1 0 {} {{}}",
        at(3_000)
    )))];
    let (_, answer) = store
        .merge_overrides(&older, now, Some(&read.stamp))
        .await
        .unwrap();
    assert!(!answer.whole, "{answer:?}");
    assert_eq!(answer.overrides, [change(tombstone)], "{answer:?}");
}

/// A replica with no overrides of its own adopts the overrides shared after Redis lost them
/// (it used to keep waiting to add its own, which were none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_nothing_to_add_adopts_a_remade_list() {
    let redis = RedisServer::start();
    let a = Replica::start(&redis.url()).await;
    let b = Replica::start(&redis.url()).await;
    let id = b.set("acme", 100);
    converge(&[&a, &b], &[("acme", 100)]).await;
    let now = b.lifecycle.limiter().clock().now();
    b.lifecycle.limiter().overrides().delete(id, now).unwrap();
    converge(&[&a, &b], &[]).await;

    redis.cli(&["FLUSHALL"]);
    b.set("globex", 200);
    converge(&[&a, &b], &[("globex", 200)]).await;
}

/// The cost of sharing: per replica and interval, one `HMGET` of the policy pipelined with
/// the `PEXPIRE` that renews its key, and one script call for the overrides that reads their
/// `seq` and `epoch` (one `HMGET`) and renews their four keys; nothing else while nothing
/// changes, and never the overrides themselves, however many are in force (they were read
/// whole, with an `HGETALL`, at every check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_replica_costs_two_reads_and_two_renewals_an_interval() {
    let redis = RedisServer::start();
    let replica = Replica::start(&redis.url()).await;
    replica.set("acme", 100);
    converge(&[&replica], &[("acme", 100)]).await;
    let many: Vec<Override> = (0..1_000)
        .map(|i| tenant(&format!("t{i}"), 5, replica.now()))
        .collect();
    replica
        .lifecycle
        .limiter()
        .overrides()
        .set_all(many)
        .unwrap();
    // Past the first checks (the one-time look for an earlier version's overrides).
    tokio::time::sleep(EVERY * 3).await;
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let window = Duration::from_secs(2);
    tokio::time::sleep(window).await;
    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls = |command: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    };
    let intervals = (window.as_millis() / EVERY.as_millis()) as u64;
    let (scripts, hmget) = (calls("evalsha"), calls("hmget"));
    let policy_reads = hmget.saturating_sub(scripts);
    assert!(
        (intervals - 3..=intervals + 1).contains(&policy_reads),
        "one policy HMGET an interval over {intervals}: {stats}"
    );
    // Off by one at most: the statistics can be reset or read between a check's two reads.
    assert!(
        scripts.abs_diff(policy_reads) <= 1,
        "one script call for the overrides with each: {stats}"
    );
    assert_eq!(calls("hgetall"), 0, "the overrides are not read: {stats}");
    assert!(
        calls("pexpire").abs_diff(policy_reads + 4 * scripts) <= 4,
        "a renewal with each read: {stats}"
    );
    let others: Vec<&str> = stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter(|l| {
            !["hmget", "evalsha", "pexpire", "info", "config|resetstat"]
                .iter()
                .any(|c| l.starts_with(&format!("cmdstat_{c}:")))
        })
        .collect();
    assert!(others.is_empty(), "nothing else: {others:?}");
}

/// Waits (5 s at most) until `replica` holds `n` overrides and `has` says yes.
async fn holds(replica: &Replica, n: usize, has: impl Fn(&[(String, u64, u64)]) -> bool) {
    for _ in 0..50 {
        let held = replica.overrides();
        if held.len() == n && has(&held) {
            return;
        }
        tokio::time::sleep(EVERY).await;
    }
    panic!("never held {n}: {:?}", replica.overrides().len());
}

/// Whether `tenant` is among `held`.
fn has(tenant: &str) -> impl Fn(&[(String, u64, u64)]) -> bool + '_ {
    move |held| held.iter().any(|(t, _, _)| t == tenant)
}

/// A set or a delete travels as itself: with 500 overrides shared, what changed since a
/// replica last looked is the one target changed (a delete, its tombstone), and nothing when
/// nothing changed; only a replica that never looked reads them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_shared_as_itself_not_the_whole_list() {
    let redis = RedisServer::start();
    let a = Replica::start(&redis.url()).await;
    let b = Replica::start(&redis.url()).await;
    let many: Vec<Override> = (0..500)
        .map(|i| tenant(&format!("t{i}"), 5, a.now()))
        .collect();
    a.lifecycle.limiter().overrides().set_all(many).unwrap();
    holds(&b, 500, |_| true).await;
    let StoreBackend::Redis(store) = b.lifecycle.limiter().store() else {
        panic!("a Redis store");
    };
    let whole = store.shared_overrides(None).await.unwrap().unwrap();
    assert!(whole.whole);
    assert_eq!(whole.overrides.len(), 500);

    let acme = a.set("acme", 7);
    holds(&b, 501, has("acme")).await;
    let since = store
        .shared_overrides(Some(&whole.stamp))
        .await
        .unwrap()
        .unwrap();
    assert!(!since.whole, "{since:?}");
    assert_eq!(since.overrides.len(), 1, "{since:?}");
    assert!(since.overrides[0].target.contains("acme"), "{since:?}");
    let current = store
        .shared_overrides(Some(&since.stamp))
        .await
        .unwrap()
        .unwrap();
    assert!(
        !current.whole && current.overrides.is_empty(),
        "{current:?}"
    );

    let now = a.lifecycle.limiter().clock().now();
    a.lifecycle.limiter().overrides().delete(acme, now).unwrap();
    holds(&b, 500, |held| !has("acme")(held)).await;
    let deleted = store
        .shared_overrides(Some(&since.stamp))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(deleted.overrides.len(), 1, "{deleted:?}");
    assert!(
        deleted.overrides[0].value.ends_with(" -"),
        "a tombstone: {deleted:?}"
    );
}

/// A replica of the earlier version, in a rolling upgrade, changes the shared hash without
/// logging its change: the replicas of this version read the hash whole then, and after their
/// next change they read changes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_an_earlier_version_made_is_adopted() {
    let redis = RedisServer::start();
    let a = Replica::start(&redis.url()).await;
    let b = Replica::start(&redis.url()).await;
    a.set("acme", 100);
    converge(&[&a, &b], &[("acme", 100)]).await;

    // What the earlier version's merge does to set one: the field, and `seq` raised.
    let key = "tg:{tollgate-policy}:overrides:2";
    let doc = r#"{"domain":"api","entries":[["tenant","old"]],"expires_at_us":null,"id":77,"period_us":null,"reason":"","requests_per_unit":40,"rule":"per_tenant","set_at_us":1}"#;
    let target = r#"["api","per_tenant",[["tenant","old"]]]"#;
    redis.cli(&["HSET", key, target, &format!("77 0 1 {doc}")]);
    redis.cli(&["HINCRBY", key, "seq", "1"]);
    converge(&[&a, &b], &[("acme", 100), ("old", 40)]).await;

    b.set("globex", 200);
    converge(&[&a, &b], &[("acme", 100), ("globex", 200), ("old", 40)]).await;
    let StoreBackend::Redis(store) = a.lifecycle.limiter().store() else {
        panic!("a Redis store");
    };
    let seen = store.shared_overrides(None).await.unwrap().unwrap();
    b.set("initech", 300);
    converge(
        &[&a, &b],
        &[
            ("acme", 100),
            ("globex", 200),
            ("initech", 300),
            ("old", 40),
        ],
    )
    .await;
    let since = store
        .shared_overrides(Some(&seen.stamp))
        .await
        .unwrap()
        .unwrap();
    assert!(!since.whole, "read as changes again: {since:?}");
    assert_eq!(since.overrides.len(), 1, "{since:?}");
}
