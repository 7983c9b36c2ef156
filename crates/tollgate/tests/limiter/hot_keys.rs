//! The prefilter and local budgets, on a real `redis-server`, with a manual clock that drives
//! both the limiters and the store's scripts so every instant is known.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::limiter::{
    Candidate, CheckRequest, CheckResponse, Code, FailureSettings, Limiter, Override,
    RequestDescriptor,
};
use tollgate::policy::Policy;
use tollgate::resilience::{BreakerState, Posture};
use tollgate::store::{RedisOptions, RedisStore, Store, StoreBackend, StoreUrl};
use tollgate_core::Algorithm;
use tollgate_testkit::{FaultProxy, Mode, RedisCluster, RedisServer, metric_sample};

/// One rule per algorithm in each of two identical domains, `a` and `b` (so two limiters can
/// run the same sequence on separate counters of one Redis).
fn twin_policy(limit: u64, period: &str) -> String {
    let mut yaml = String::new();
    for domain in ["a", "b"] {
        yaml.push_str(&format!("---\ndomain: {domain}\ndescriptors:\n"));
        for algorithm in Algorithm::ALL {
            yaml.push_str(&format!(
                "  - key: {algorithm}\n    rate_limit: {{period: {period}, requests_per_unit: {limit}, algorithm: {algorithm}}}\n"
            ));
        }
    }
    yaml
}

fn policy(yaml: &str) -> Policy {
    let sources: Vec<(String, String)> = yaml
        .split("---\n")
        .filter(|doc| !doc.trim().is_empty())
        .enumerate()
        .map(|(n, doc)| (format!("p{n}.yaml"), doc.to_owned()))
        .collect();
    Policy::from_sources(&sources).unwrap()
}

async fn limiter(url: &str, clock: &Arc<ManualClock>, yaml: &str, prefilter: bool) -> Limiter {
    let url: StoreUrl = url.parse().unwrap();
    let options = RedisOptions {
        command_timeout: Duration::from_secs(2),
        // A call waits no longer than its deadline, busy Redis or not.
        max_wait: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&url, options, clock.clone())
        .await
        .unwrap()
        .pin_clock(clock.clone());
    let store = StoreBackend::Redis(Arc::new(store));
    assert!(store.wait_ready(Duration::from_secs(10)).await);
    Limiter::with_failure_settings(
        policy(yaml),
        store,
        FailureSettings::default(),
        clock.clone(),
    )
    .with_prefilter(prefilter)
}

fn request(domain: &str, key: &str, value: &str, cost: u64) -> CheckRequest {
    let entries = vec![(key.to_owned(), value.to_owned())];
    let descriptor = RequestDescriptor::new(entries, cost, None).unwrap();
    CheckRequest::new(domain.to_owned(), vec![descriptor]).unwrap()
}

/// Whether `limiter` admits one unit on descriptor `k=value` of domain `a`.
async fn admits(limiter: &Limiter, value: &str) -> bool {
    admits_on(limiter, "k", value).await
}

/// Whether `limiter` admits one unit on descriptor `key=value` of domain `a`.
async fn admits_on(limiter: &Limiter, key: &str, value: &str) -> bool {
    let answer = limiter.check(&request("a", key, value, 1)).await.unwrap();
    answer.allowed()
}

/// The verdict and retry-after a caller sees.
fn seen(response: &CheckResponse) -> (Code, Option<Duration>) {
    let retry = response
        .statuses
        .iter()
        .filter_map(|s| s.decision)
        .filter_map(|d| d.retry_after)
        .max();
    (response.overall, retry)
}

/// See [`ManualClock::ahead_of_wall_clock`]: Redis TTLs derive from the pinned time.
fn wall_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::ahead_of_wall_clock())
}

/// One Redis and a limiter on it (prefilter on, manual clock) whose rule on key `k` of domain
/// `a` admits 10 an hour from local budgets of 10 that live `ttl`.
async fn leased_ten(ttl: &str) -> (RedisServer, Arc<ManualClock>, Limiter) {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let yaml = format!(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{period: 1h, requests_per_unit: 10, local_budget: 10, local_budget_ttl: {ttl}}}\n"
    );
    let limiter = limiter(&redis.url(), &clock, &yaml, true).await;
    (redis, clock, limiter)
}

/// xorshift64: a fixed sequence, the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The prefilter never changes an answer: a limiter with it and one without, fed the same
/// requests (random costs, random clock steps, every algorithm, runtime overrides set and
/// deleted, a policy reload), give the same verdicts and retry-afters; and the prefilter did
/// answer some of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefilter_never_changes_an_answer() {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let yaml = twin_policy(5, "2s");
    let with = limiter(&redis.url(), &clock, &yaml, true).await;
    let without = limiter(&redis.url(), &clock, &yaml, false).await;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut override_ids = Vec::new();
    for step in 0..3000 {
        let algorithm = Algorithm::ALL[rng.below(6) as usize].name();
        let value = if rng.below(8) == 0 { "y" } else { "x" };
        // Mostly unit costs, as hot keys are; sometimes heavier requests.
        let cost = if rng.below(4) == 0 {
            2 + rng.below(2)
        } else {
            1
        };
        match rng.below(100) {
            0 => {
                // A runtime override on both, with a higher or lower limit.
                let o = Override {
                    id: 0,
                    domain: String::new(),
                    rule: algorithm.to_owned(),
                    entries: vec![(algorithm.to_owned(), value.to_owned())],
                    requests_per_unit: 1 + rng.below(10),
                    period: None,
                    expires_at: None,
                    set_at: clock.now(),
                    reason: "test".into(),
                };
                for (domain, limiter) in [("a", &with), ("b", &without)] {
                    let id = limiter
                        .overrides()
                        .set(Override {
                            domain: domain.into(),
                            ..o.clone()
                        })
                        .unwrap();
                    override_ids.push((domain, id));
                }
            }
            1 if !override_ids.is_empty() => {
                for (domain, id) in override_ids.drain(..) {
                    let limiter = if domain == "a" { &with } else { &without };
                    limiter.overrides().delete(id, clock.now());
                }
            }
            2 => {
                let reloaded = twin_policy(3 + rng.below(5), "2s");
                with.replace_policy(policy(&reloaded));
                without.replace_policy(policy(&reloaded));
            }
            _ => {}
        }
        clock.advance(Duration::from_micros(rng.below(60_000)));
        let a = with
            .check(&request("a", algorithm, value, cost))
            .await
            .unwrap();
        let b = without
            .check(&request("b", algorithm, value, cost))
            .await
            .unwrap();
        assert_eq!(
            seen(&a),
            seen(&b),
            "step {step}: {algorithm} {value} cost {cost}"
        );
        assert!(
            a.degraded().is_none() && b.degraded().is_none(),
            "step {step}"
        );
    }
    let metrics = with.render_metrics().await;
    let answered = metric_sample(&metrics, "tollgate_prefilter_denials_total");
    assert!(
        answered > 100,
        "the prefilter answered only {answered} requests"
    );
    let metrics = without.render_metrics().await;
    assert_eq!(
        metric_sample(&metrics, "tollgate_prefilter_denials_total"),
        0
    );
}

/// A remembered denial is answered without Redis: with Redis unreachable, the denied key is
/// still denied as over its limit (not by a failure posture) until its retry-after; then the
/// posture answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_denials_need_no_store() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let clock = wall_clock();
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 10s, requests_per_unit: 2}\n";
    let limiter = limiter(&proxy.url(), &clock, yaml, true).await;
    for _ in 0..2 {
        assert!(admits(&limiter, "v").await);
    }
    let denied = limiter.check(&request("a", "k", "v", 1)).await.unwrap();
    let (code, retry) = seen(&denied);
    assert_eq!(code, Code::OverLimit);
    let retry = retry.unwrap();

    proxy.set_mode(Mode::Refuse);
    let half = Duration::from_micros(retry.as_micros() as u64 / 2);
    clock.advance(half);
    let again = limiter.check(&request("a", "k", "v", 1)).await.unwrap();
    assert_eq!(seen(&again), (Code::OverLimit, Some(retry - half)));
    assert_eq!(again.degraded(), None);
    // Another cost, or another key, goes to the (unreachable) store.
    let costly = limiter.check(&request("a", "k", "v", 2)).await.unwrap();
    assert_eq!(costly.degraded(), Some(Posture::Open));
    let other = limiter.check(&request("a", "k", "w", 1)).await.unwrap();
    assert_eq!(other.degraded(), Some(Posture::Open));
    // At the retry-after the store must decide again: the posture answers.
    clock.advance(retry - half);
    let due = limiter.check(&request("a", "k", "v", 1)).await.unwrap();
    assert_eq!(due.degraded(), Some(Posture::Open));
}

/// The store latency histogram times calls that reach the store: not the admissions a local
/// budget makes alone (every one of them used to be observed, as a near-zero "store" latency),
/// but its reservations and give-backs, each under an operation of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_latency_times_only_calls_to_the_store() {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 1h, requests_per_unit: 1000, local_budget: 100, local_budget_ttl: 60s}\n  - key: plain\n    rate_limit: {period: 1h, requests_per_unit: 1000}\n";
    let limiter = limiter(&redis.url(), &clock, yaml, true).await;
    let timed = async |op: &str| {
        let series = format!(
            r#"tollgate_store_operation_duration_seconds_count{{store="redis",op="{op}"}} "#
        );
        let text = limiter.render_metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.parse::<u64>().unwrap())
    };
    for _ in 0..20 {
        assert!(admits(&limiter, "v").await);
    }
    assert_eq!(timed("apply").await, 0, "the lease decided alone");
    assert_eq!(timed("reserve").await, 1, "after reserving it");
    for _ in 0..3 {
        let answer = limiter.check(&request("a", "plain", "v", 1)).await.unwrap();
        assert!(answer.allowed());
    }
    assert_eq!(timed("apply").await, 3);
    assert_eq!(timed("give_back").await, 0);
    limiter.release_local_budgets().await;
    assert_eq!(timed("give_back").await, 1, "the unused 80 went back");
}

/// Explain counts what this replica's lease would still admit: the store has the whole lease
/// charged, so its peek alone reads the key as exhausted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_sees_the_units_a_lease_holds() {
    let (_redis, _clock, limiter) = leased_ten("60s").await;
    assert!(admits(&limiter, "v").await);
    let explained = limiter.explain(&request("a", "k", "v", 1)).await.unwrap();
    assert!(explained.allowed(), "the lease still holds 9");
    assert_eq!(explained.statuses[0].decision.unwrap().remaining, 8);
    // It took nothing: the nine are all still there.
    for _ in 0..9 {
        assert!(admits(&limiter, "v").await);
    }
    assert!(!admits(&limiter, "v").await);
}

/// A check (cost 0) on a key this replica holds a lease for is answered from the lease, which
/// it leaves as it was, and denied once the lease and the store have no unit left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_takes_nothing_from_a_lease() {
    let (_redis, _clock, limiter) = leased_ten("60s").await;
    let check = request("a", "k", "v", 0);
    // No lease yet: the store answers, and no lease is reserved for a check.
    let answer = limiter.check(&check).await.unwrap();
    assert_eq!(answer.statuses[0].decision.unwrap().remaining, 10);
    assert_eq!(limiter.release_local_budgets().await, 0, "nothing reserved");
    assert!(admits(&limiter, "v").await);
    for _ in 0..3 {
        let answer = limiter.check(&check).await.unwrap();
        assert!(answer.allowed());
        assert_eq!(answer.statuses[0].decision.unwrap().remaining, 9);
    }
    for _ in 0..9 {
        assert!(admits(&limiter, "v").await, "the checks took nothing");
    }
    let answer = limiter.check(&check).await.unwrap();
    assert_eq!(answer.overall, Code::OverLimit, "the lease is empty");
}

/// A check on a key whose lease has lapsed and not been swept yet: the lease gives its unused
/// units back first, so the check sees them, as a request of 1 (which renews the lease) would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_sees_the_units_a_lapsed_lease_held() {
    let (_redis, clock, limiter) = leased_ten("1s").await;
    assert!(admits(&limiter, "v").await, "a lease of all 10, one used");
    clock.advance(Duration::from_secs(2));
    let answer = limiter.check(&request("a", "k", "v", 0)).await.unwrap();
    assert!(answer.allowed(), "the 9 unused are back in Redis");
    assert_eq!(answer.statuses[0].decision.unwrap().remaining, 9);
    assert_eq!(
        limiter.release_local_budgets().await,
        0,
        "none held any more"
    );
}

/// Three replicas with local budgets on one Redis, many requests in flight on each: a fixed
/// window never admits more than its limit, and once the leases are given back the rest of
/// the quota is admitted to the unit (nothing is lost). Most admissions come from the leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_budgets_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let algorithms = [
        "fixed_window",
        "gcra",
        "token_bucket",
        "sliding_window_counter",
    ];
    budgets_admit_exactly_the_limit(&redis.url(), &algorithms).await;
}

/// The same on a 3+3 Redis Cluster: leases are reserved and given back on the slot that owns
/// the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_budgets_admit_exactly_the_limit_on_a_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let url = cluster.store_url();
    budgets_admit_exactly_the_limit(&url, &["fixed_window", "gcra"]).await;
}

async fn budgets_admit_exactly_the_limit(url: &str, algorithms: &[&str]) {
    for algorithm in algorithms {
        let clock = wall_clock();
        let yaml = format!(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{period: 1h, requests_per_unit: 500, algorithm: {algorithm}, local_budget: 20, local_budget_ttl: 1s}}\n"
        );
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(limiter(url, &clock, &yaml, true).await);
        }
        let key = format!("hot-{algorithm}");
        let wave = |n: usize| {
            let requests = (0..n).map(|i| {
                let (replica, key) = (&replicas[i % 3], &key);
                async move {
                    replica
                        .check(&request("a", "k", key, 1))
                        .await
                        .unwrap()
                        .allowed()
                }
            });
            futures_util::future::join_all(requests)
        };
        let first: usize = wave(900).await.into_iter().filter(|a| *a).count();
        assert!(
            first <= 500,
            "{algorithm}: {first} admitted over a limit of 500"
        );
        // At most three leases of 20 sit unused, and only while they live.
        assert!(first >= 500 - 3 * 20, "{algorithm}: only {first} admitted");
        // The leases lapse and are given back: the remaining quota is admitted, no more.
        clock.advance(Duration::from_secs(2));
        for replica in &replicas {
            replica.sweep_hot_keys().await;
        }
        let second: usize = wave(300).await.into_iter().filter(|a| *a).count();
        clock.advance(Duration::from_secs(2));
        for replica in &replicas {
            replica.release_local_budgets().await;
        }
        let third: usize = wave(100).await.into_iter().filter(|a| *a).count();
        // Two seconds of refill at 500 per hour is less than one unit.
        assert_eq!(
            first + second + third,
            500,
            "{algorithm}: {first} + {second} + {third}"
        );
        let local: u64 =
            futures_util::future::join_all(replicas.iter().map(|r| r.render_metrics()))
                .await
                .iter()
                .map(|m| metric_sample(m, "tollgate_local_budget_admissions_total"))
                .sum();
        assert!(
            local >= 400,
            "{algorithm}: only {local} admissions came from leases"
        );
    }
}

/// A request a second limit denies gives its local-budget units back: the budget rule's
/// counter only ever counts admitted requests, and the denied request reports it uncharged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_returns_what_it_took_from_a_lease() {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let yaml = "domain: a
descriptors:
  - key: tenant
    rate_limit: {period: 1h, requests_per_unit: 100, local_budget: 10}
  - key: user
    rate_limit: {period: 1h, requests_per_unit: 3}
";
    let limiter = limiter(&redis.url(), &clock, yaml, false).await;
    let both = || {
        let descriptors = ["tenant", "user"]
            .map(|k| RequestDescriptor::new(vec![(k.into(), "t1".into())], 1, None).unwrap());
        CheckRequest::new("a".into(), descriptors.to_vec()).unwrap()
    };
    let requests: Vec<CheckRequest> = (0..10).map(|_| both()).collect();
    let admitted = futures_util::future::join_all(requests.iter().map(|r| limiter.check(r)))
        .await
        .into_iter()
        .filter(|r| r.as_ref().unwrap().allowed())
        .count();
    assert_eq!(admitted, 3);
    limiter.release_local_budgets().await;
    // The tenant counter holds exactly the three admitted requests: explain answers for one
    // more, which would leave 96.
    let tenant = request("a", "tenant", "t1", 1);
    let answer = limiter.explain(&tenant).await.unwrap();
    assert_eq!(answer.statuses[0].decision.unwrap().remaining, 96);
    // Denied again, from a fresh lease: the tenant limit answers as it stands, 3 of 100 used.
    let denied = limiter.check(&both()).await.unwrap();
    assert!(!denied.allowed());
    assert_eq!(denied.statuses[0].decision.unwrap().remaining, 97);
}

/// A request that charges one counter twice is denied by its second charge; the counter
/// itself still has room, so the prefilter must not remember that denial for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_charged_twice_is_not_remembered_from_its_second_charge() {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let yaml =
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 1h, requests_per_unit: 2}\n";
    let limiter = limiter(&redis.url(), &clock, yaml, true).await;
    assert!(admits(&limiter, "v").await);
    let twice = {
        let d = || RequestDescriptor::new(vec![("k".into(), "v".into())], 1, None).unwrap();
        CheckRequest::new("a".into(), vec![d(), d()]).unwrap()
    };
    assert!(!limiter.check(&twice).await.unwrap().allowed());
    // One unit is left: Redis admits a single charge, and so must the limiter.
    assert!(admits(&limiter, "v").await);
}

/// A lease reserved under an old policy is given back after the rule lost its budget and a
/// denial was remembered for it: the denial is forgotten, since Redis has room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_give_back_clears_a_remembered_denial() {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let rule = |extra: &str| {
        format!(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{period: 1h, requests_per_unit: 10{extra}}}\n"
        )
    };
    let limiter = limiter(&redis.url(), &clock, &rule(", local_budget: 5"), true).await;
    // A lease of 5: one used, four held.
    assert!(admits(&limiter, "v").await);
    limiter.replace_policy(policy(&rule("")));
    // Without the budget: five more fill the counter, the next is denied and remembered.
    for _ in 0..5 {
        assert!(admits(&limiter, "v").await);
    }
    assert!(!admits(&limiter, "v").await);
    // The old lease lapses: its four units go back to Redis.
    assert_eq!(limiter.sweep_hot_keys().await, 1);
    for n in 0..4 {
        let answer = limiter.check(&request("a", "k", "v", 1)).await.unwrap();
        assert!(answer.allowed(), "unit {n} given back");
    }
    assert!(!admits(&limiter, "v").await);
}

/// One Redis behind a fault proxy, and a limiter through it whose rule `tenant` (100 an hour,
/// `algorithm`) has local budgets of 10 that lapse after 1 s.
async fn leased_behind_a_proxy(
    algorithm: &str,
) -> (RedisServer, FaultProxy, Arc<ManualClock>, Limiter) {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let clock = wall_clock();
    let yaml = format!(
        "domain: a
descriptors:
  - key: tenant
    rate_limit: {{period: 1h, requests_per_unit: 100, algorithm: {algorithm}, local_budget: 10, local_budget_ttl: 1s}}
"
    );
    let limiter = limiter(&proxy.url(), &clock, &yaml, false).await;
    (redis, proxy, clock, limiter)
}

/// Redis loses its data (here `FLUSHALL`) while a replica holds a lease, and other requests
/// make the counter again before the replica learns of the loss (at its next policy sync): the
/// lease's give-back then meets a counter that was never charged for it, and takes nothing
/// from it. (It took its unused units back from the new count, which others had used: 109
/// admitted of 100 across replicas.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_after_redis_lost_its_data_takes_nothing_from_the_new_counter() {
    for algorithm in [
        "fixed_window",
        "sliding_window_counter",
        "token_bucket",
        "gcra",
    ] {
        let (redis, _proxy, clock, limiter) = leased_behind_a_proxy(algorithm).await;
        // A lease of 10 reserved, 1 of it used.
        assert!(admits_on(&limiter, "tenant", "t1").await);
        assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
        clock.advance(Duration::from_millis(10));
        // A cost above the budget goes to Redis itself: the counter is made again.
        let direct = request("a", "tenant", "t1", 40);
        assert!(
            limiter.check(&direct).await.unwrap().allowed(),
            "{algorithm}"
        );
        let remaining = async || {
            let answer = limiter
                .explain(&request("a", "tenant", "t1", 1))
                .await
                .unwrap();
            answer.statuses[0].decision.unwrap().remaining
        };
        // The lease lapses (explain reads Redis now), then it is given back.
        clock.advance(Duration::from_secs(2));
        let before = remaining().await;
        assert_eq!(before, 100 - 40 - 1, "{algorithm}: the new counter");
        limiter.sweep_hot_keys().await;
        assert_eq!(remaining().await, before, "{algorithm}: nothing taken back");
    }
}

/// Lease calls that fail are counted by operation: a reservation that timed out after Redis ran
/// it strands its units, a failed give-back leaves them charged, and nothing else showed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_lease_calls_are_counted() {
    let (_redis, proxy, clock, limiter) = leased_behind_a_proxy("fixed_window").await;
    let failures = async |op: &str| {
        let metrics = limiter.render_metrics().await;
        let name = format!("tollgate_local_budget_store_failures_total{{op=\"{op}\"}}");
        metric_sample(&metrics, &name)
    };
    assert!(admits_on(&limiter, "tenant", "t1").await);
    assert_eq!(failures("reserve").await, 0);
    clock.advance(Duration::from_secs(2));
    proxy.set_mode(Mode::Refuse);
    assert_eq!(limiter.sweep_hot_keys().await, 0);
    assert_eq!(failures("give_back").await, 1);
    let answer = limiter
        .check(&request("a", "tenant", "t2", 1))
        .await
        .unwrap();
    assert!(answer.degraded().is_some(), "{answer:?}");
    assert_eq!(failures("reserve").await, 1);
}

/// While Redis is unreachable, explain answers a key this replica's lease still serves as a
/// check does, from the lease, not as the store's failure posture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_from_a_lease_while_redis_is_down() {
    let (_redis, proxy, _clock, limiter) = leased_behind_a_proxy("fixed_window").await;
    let tenant = request("a", "tenant", "t1", 1);
    assert!(limiter.check(&tenant).await.unwrap().allowed());
    proxy.set_mode(Mode::Refuse);
    let explained = limiter.explain(&tenant).await.unwrap();
    let status = &explained.statuses[0];
    assert_eq!(status.degraded, None, "answered by the lease");
    // 90 left in Redis and 9 in the lease; explain answers as if for one more.
    assert_eq!(status.decision.unwrap().remaining, 98);
    let checked = limiter.check(&tenant).await.unwrap();
    assert_eq!(checked.statuses[0].degraded, None);
    assert_eq!(checked.statuses[0].decision.unwrap().remaining, 98);
}

/// A caller that hangs up while its request reserves a lease (a client reset, a proxy's
/// timeout) leaves no lease charged in Redis and recorded nowhere: the reservation still
/// lands in this replica's table, and a release gives back everything but the two units taken
/// (before, the lease's other nine units stayed charged until the window ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_hangs_up_mid_renewal_strands_no_lease() {
    let (_redis, proxy, _clock, limiter) = leased_behind_a_proxy("fixed_window").await;
    let tenant = request("a", "tenant", "t1", 1);

    proxy.set_mode(Mode::Latency(Duration::from_millis(150)));
    let hung_up = tokio::time::timeout(Duration::from_millis(50), limiter.check(&tenant)).await;
    assert!(hung_up.is_err(), "the reservation took under 50 ms");
    proxy.set_mode(Mode::Pass);

    assert!(limiter.check(&tenant).await.unwrap().allowed());
    limiter.release_local_budgets().await;
    let left = limiter.explain(&tenant).await.unwrap();
    // Two units used; explain answers as if for one more.
    assert_eq!(left.statuses[0].decision.unwrap().remaining, 97);
}

/// A caller that hangs up while waiting for another request's renewal has taken nothing: only
/// the request that reserves a lease is charged for it when its caller goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_hangs_up_while_waiting_for_a_renewal_takes_nothing() {
    let (_redis, proxy, _clock, limiter) = leased_behind_a_proxy("fixed_window").await;
    let limiter = Arc::new(limiter);
    let tenant = request("a", "tenant", "t1", 1);
    // The first request's reservation takes 500 ms; the second comes 100 ms in and gives up
    // after another 100.
    proxy.set_mode(Mode::Latency(Duration::from_millis(250)));
    let renewing = tokio::spawn({
        let (limiter, tenant) = (limiter.clone(), tenant.clone());
        async move { limiter.check(&tenant).await.unwrap().allowed() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = tokio::time::timeout(Duration::from_millis(100), limiter.check(&tenant)).await;
    assert!(waited.is_err(), "the renewal took under 200 ms");
    assert!(renewing.await.unwrap());
    proxy.set_mode(Mode::Pass);
    limiter.release_local_budgets().await;
    // One unit used; explain answers as if for one more.
    let left = limiter.explain(&tenant).await.unwrap();
    assert_eq!(left.statuses[0].decision.unwrap().remaining, 98);
}

/// A give-back refused while Redis is away (its circuit breaker open, so nothing was sent) is
/// tried again by the sweeps after Redis comes back, for a window algorithm: the lease's
/// unused units return to the counter instead of staying charged until the window ends. A
/// bucket's is not: late, it would credit a bucket that has refilled and been charged again
/// since, an over-admission; its units stay charged instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_give_back_is_retried_for_windows_only() {
    // One unit used; explain answers as if for one more. GCRA keeps the whole lease of 10.
    for (algorithm, retried, left) in [("fixed_window", 1, 98), ("gcra", 0, 89)] {
        let (_redis, proxy, clock, limiter) = leased_behind_a_proxy(algorithm).await;
        let breaker = |limiter: &Limiter| limiter.store().breakers()[0].1;
        let tenant = request("a", "tenant", "t1", 1);
        assert!(limiter.check(&tenant).await.unwrap().allowed());

        // The lease lapses; Redis goes away and requests for other tenants open the breaker.
        clock.advance(Duration::from_secs(2));
        proxy.set_mode(Mode::Refuse);
        for n in 0..20 {
            if breaker(&limiter) == BreakerState::Open {
                break;
            }
            let _ = limiter
                .check(&request("a", "tenant", &format!("other-{n}"), 1))
                .await;
        }
        assert_eq!(breaker(&limiter), BreakerState::Open, "{algorithm}");
        assert_eq!(limiter.sweep_hot_keys().await, 0, "{algorithm}: refused");

        proxy.set_mode(Mode::Pass);
        assert!(limiter.store().wait_ready(Duration::from_secs(10)).await);
        // The breaker lets a probe through: the kept give-back, if any.
        clock.advance(Duration::from_secs(1));
        assert_eq!(limiter.sweep_hot_keys().await, retried, "{algorithm}");
        let answer = limiter.explain(&tenant).await.unwrap();
        assert_eq!(
            answer.statuses[0].decision.unwrap().remaining,
            left,
            "{algorithm}"
        );
    }
}

/// A give-back that timed out may still have reached Redis (here: a link slow enough that the
/// call lands after 1.5 s and its answer comes after the 2 s deadline) and is not kept for a
/// retry: sent twice, it would take back units that were used (99 left instead of 97).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_that_may_have_reached_redis_is_not_sent_twice() {
    let (_redis, proxy, clock, limiter) = leased_behind_a_proxy("fixed_window").await;
    let tenant = request("a", "tenant", "t1", 1);
    // A first lease and its give-back, so Redis knows the give-back script (an unknown one
    // would cost a second round trip and land after the deadline).
    assert!(limiter.check(&tenant).await.unwrap().allowed());
    clock.advance(Duration::from_secs(2));
    assert_eq!(limiter.sweep_hot_keys().await, 1);
    assert!(limiter.check(&tenant).await.unwrap().allowed());
    clock.advance(Duration::from_secs(2));
    proxy.set_mode(Mode::Latency(Duration::from_millis(1500)));
    assert_eq!(limiter.sweep_hot_keys().await, 0, "the give-back timed out");
    proxy.set_mode(Mode::Pass);
    assert!(limiter.store().wait_ready(Duration::from_secs(10)).await);
    clock.advance(Duration::from_secs(1));
    for _ in 0..3 {
        assert_eq!(
            limiter.sweep_hot_keys().await,
            0,
            "nothing is given back again"
        );
    }
    // Two units used; explain answers as if for one more.
    let left = limiter.explain(&tenant).await.unwrap();
    assert_eq!(left.statuses[0].decision.unwrap().remaining, 97);
}

/// While a shadow candidate runs, the prefilter stands aside: the candidate must see every
/// request the running policy decides, those it denies included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_candidate_sees_what_the_prefilter_would_have_answered() {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let live = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: k, period: 1h, requests_per_unit: 2}\n";
    let limiter = limiter(&redis.url(), &clock, live, true).await;
    let text = live.replace("requests_per_unit: 2", "requests_per_unit: 1");
    let sources = vec![("candidate.yaml".to_owned(), text)];
    let candidate = Arc::new(Candidate::new(policy(&sources[0].1), sources, clock.now()));
    limiter.set_candidate(Some(candidate.clone()));
    // One after another, so the running policy's first denial is remembered before the next.
    let mut allowed = 0;
    for _ in 0..10 {
        allowed += usize::from(admits(&limiter, "v").await);
    }
    assert_eq!(allowed, 2);
    let report = candidate.report(5);
    assert_eq!(
        (report[0].allowed, report[0].would_deny),
        (1, 9),
        "{report:?}"
    );
}

/// A request whose other limit can never admit its cost gets the store's answer (no
/// retry-after: retrying cannot help), not the prefilter's remembered denial of one limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefilter_does_not_hide_a_cost_beyond_capacity() {
    let redis = RedisServer::start();
    let clock = wall_clock();
    let yaml = "domain: a
descriptors:
  - key: user
    rate_limit: {period: 1m, requests_per_unit: 10}
  - key: tenant
    rate_limit: {period: 1m, requests_per_unit: 3}
";
    let limiter = limiter(&redis.url(), &clock, yaml, true).await;
    let both = |cost: u64| {
        let d = |k: &str| RequestDescriptor::new(vec![(k.into(), "x".into())], cost, None).unwrap();
        CheckRequest::new("a".into(), vec![d("user"), d("tenant")]).unwrap()
    };
    // `user` is left with 2; a request of cost 5 is denied by it (remembered) and can never
    // fit `tenant`'s 3.
    assert!(
        limiter
            .check(&request("a", "user", "x", 8))
            .await
            .unwrap()
            .allowed()
    );
    for _ in 0..3 {
        let answer = limiter.check(&both(5)).await.unwrap();
        assert!(!answer.allowed());
        assert_eq!(answer.retry_after(), None, "{answer:?}");
        assert!(answer.statuses.iter().any(|s| s.cost_exceeds_capacity()));
    }
}
