//! Push, reload and rollback commands on replicas sharing one Redis: what a command answers is
//! what the fleet then runs, even on a replica that has not yet adopted the version another
//! replica published a moment ago.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate::clock::SystemClock;
use tollgate::lifecycle::{Activation, Lifecycle, Origin};
use tollgate::limiter::Limiter;
use tollgate::policy::Policy;
use tollgate::policy::sources::sources_hash;
use tollgate::store::{RedisOptions, StoreBackend};
use tollgate_testkit::RedisServer;

const FILE: &str = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 10}\n";

/// The policy file with a limit of `n` a minute.
fn policy(n: u64) -> Vec<(String, String)> {
    vec![("p.yaml".to_owned(), FILE.replace("10}", &format!("{n}}}")))]
}

/// One replica reading `p.yaml` (the limit of 10) from its own directory, sharing through `url`
/// every `every`.
struct Replica {
    lifecycle: Arc<Lifecycle>,
    _dir: tempfile::TempDir,
    _stop: watch::Sender<bool>,
}

impl Replica {
    async fn start(url: &str, every: Duration) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.yaml"), FILE).unwrap();
        let store = StoreBackend::open(
            &url.parse().unwrap(),
            RedisOptions::default(),
            Arc::new(SystemClock::new()),
        )
        .await
        .unwrap();
        let limiter = Arc::new(Limiter::new(
            Policy::from_yaml("p.yaml", FILE).unwrap(),
            store,
        ));
        let config = Some(dir.path().to_path_buf());
        let lifecycle = Arc::new(Lifecycle::new(limiter, config, policy(10)));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(tollgate::policy_sync::run(
            lifecycle.clone(),
            every,
            stopped,
        ));
        Replica {
            lifecycle,
            _dir: dir,
            _stop: stop,
        }
    }

    fn runs(&self) -> String {
        self.lifecycle.current().hash.clone()
    }
}

/// Three replicas on one Redis, their syncs started.
async fn fleet(redis: &RedisServer, every: Duration) -> [Replica; 3] {
    let fleet = [
        Replica::start(&redis.url(), every).await,
        Replica::start(&redis.url(), every).await,
        Replica::start(&redis.url(), every).await,
    ];
    // Each sync subscribes to its replica's changes when it first runs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    fleet
}

/// The hash of the policy the fleet runs: the one Redis holds.
async fn shared(replica: &Replica) -> Option<String> {
    let StoreBackend::Redis(store) = replica.lifecycle.limiter().store() else {
        panic!("not on Redis");
    };
    store.shared_policy().await.unwrap().map(|s| s.hash)
}

/// Waits (`within` at most) until every replica runs the texts hashed `hash`.
async fn all_run(fleet: &[Replica], hash: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if fleet.iter().all(|r| r.runs() == hash) {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got: Vec<_> = fleet.iter().map(Replica::runs).collect();
    panic!("the replicas never all ran {hash}: {got:?}");
}

fn hash_of(activation: &Activation) -> String {
    activation.version().hash.clone()
}

/// The sequences of the issue: a push of the texts a replica still runs, made just after
/// another replica rolled the fleet back, and a reload just after another replica's push
/// (the documented way to undo one). Both used to answer "unchanged", publish nothing, and
/// the fleet then ran the other version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_on_a_replica_behind_the_fleet_is_what_the_fleet_runs() {
    let redis = RedisServer::start();
    // Long enough that no replica adopts anything between two commands made at once.
    let every = Duration::from_secs(2);
    let [r1, r2, r3] = fleet(&redis, every).await;
    let (a, b) = (sources_hash(&policy(10)), sources_hash(&policy(20)));
    let replicas = [r1, r2, r3];
    let [r1, r2, r3] = &replicas;

    // A push on r1, then at once a reload on r2 (which still runs the files' A).
    let pushed = r1.lifecycle.fleet_activate(policy(20), Origin::Push).await;
    assert!(matches!(pushed, Ok(Activation::Activated(_))), "{pushed:?}");
    let reloaded = r2.lifecycle.fleet_reload().await.unwrap();
    assert!(
        matches!(reloaded, Activation::Activated(_)),
        "a reload undoing a push is a change: {reloaded:?}"
    );
    assert_eq!(shared(r1).await.as_deref(), Some(a.as_str()));
    all_run(&replicas, &a, every * 3).await;

    // Push B on r1; all run it; roll back on r2, at once push B on r3.
    let pushed = r1
        .lifecycle
        .fleet_activate(policy(20), Origin::Push)
        .await
        .unwrap();
    assert_eq!(hash_of(&pushed), b);
    all_run(&replicas, &b, every * 3).await;
    let back = r2.lifecycle.fleet_rollback(None).await.unwrap();
    assert_eq!(hash_of(&back), a);
    let again = r3
        .lifecycle
        .fleet_activate(policy(20), Origin::Push)
        .await
        .unwrap();
    assert!(
        matches!(again, Activation::Activated(_)),
        "the fleet ran A: pushing B is a change: {again:?}"
    );
    assert_eq!(shared(r3).await.as_deref(), Some(b.as_str()));
    all_run(&replicas, &b, every * 3).await;
    // And stays there.
    tokio::time::sleep(every + every / 2).await;
    all_run(&replicas, &b, Duration::ZERO).await;

    // A push of what the fleet runs is unchanged, even on a replica that has not adopted it.
    let c = r1
        .lifecycle
        .fleet_activate(policy(30), Origin::Push)
        .await
        .unwrap();
    let same = r2
        .lifecycle
        .fleet_activate(policy(30), Origin::Push)
        .await
        .unwrap();
    assert!(matches!(same, Activation::Unchanged(_)), "{same:?}");
    assert_eq!(hash_of(&same), hash_of(&c));
    assert_eq!(r2.runs(), hash_of(&c), "adopted at once");
}

/// SplitMix64: a small seeded generator, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// One random command on `replica`: the hash of what it answered it runs, `None` when it was
/// refused (a rollback with nothing to go back to).
async fn command(replica: &Replica, rng: &mut Rng) -> Option<(String, String)> {
    let lifecycle = &replica.lifecycle;
    let (what, result) = match rng.below(4) {
        0 | 1 => {
            let n = 10 * (1 + rng.below(4));
            let done = lifecycle.fleet_activate(policy(n), Origin::Push).await;
            (format!("push {n}"), done.ok())
        }
        2 => (
            "rollback".to_owned(),
            lifecycle.fleet_rollback(None).await.ok(),
        ),
        _ => ("reload".to_owned(), lifecycle.fleet_reload().await.ok()),
    };
    let activation = result?;
    assert!(
        !matches!(activation, Activation::Superseded(_)),
        "{what}: commands one after the other are never overtaken: {activation:?}"
    );
    Some((what, hash_of(&activation)))
}

/// Random pushes, rollbacks and reloads across three replicas, some before the others
/// adopted the last change, some after: after every command Redis holds what it answered, and
/// the fleet ends on the version the last command answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_ends_on_what_the_last_command_answered() {
    for seed in [7, 2026] {
        let redis = RedisServer::start();
        let every = Duration::from_millis(100);
        let replicas = fleet(&redis, every).await;
        let mut rng = Rng(seed);
        let mut last = None;
        let mut log = Vec::new();
        for _ in 0..50 {
            let i = rng.below(3) as usize;
            let pause = Duration::from_millis(rng.below(150));
            if let Some((what, hash)) = command(&replicas[i], &mut rng).await {
                log.push(format!("r{} {what} -> {hash}", i + 1));
                let fleet_runs = shared(&replicas[i]).await;
                assert_eq!(
                    fleet_runs.as_deref(),
                    Some(hash.as_str()),
                    "seed {seed}: {log:#?}"
                );
                last = Some(hash);
            }
            tokio::time::sleep(pause).await;
        }
        let last = last.expect("some command succeeded");
        all_run(&replicas, &last, Duration::from_secs(5)).await;
        tokio::time::sleep(every * 5).await;
        all_run(&replicas, &last, Duration::ZERO).await;
        assert_eq!(shared(&replicas[0]).await, Some(last), "seed {seed}");
    }
}
