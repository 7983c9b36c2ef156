//! When the store fails: every failure posture, the latency bound, the breaker and recovery,
//! against real Redis servers behind the test kit's fault proxy.
//!
//! Each test puts hundreds of requests in flight at once and checks that callers in `open`
//! and `local` modes never get an error, that no decision waits much longer than the store
//! deadline, and that decisions return to Redis once it heals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::clock::SystemClock;
use tollgate::limiter::{
    CheckRequest, CheckResponse, Code, FailureSettings, LimitOverride, Limiter, RequestDescriptor,
};
use tollgate::policy::Policy;
use tollgate::resilience::{BreakerConfig, BreakerState, Posture};
use tollgate::store::{CoalesceOptions, LATE_SLACK, RedisOptions, Store, StoreBackend, StoreUrl};
use tollgate_testkit::{FaultProxy, Mode, RedisCluster, RedisServer};

const POLICY: &str = r#"
domain: f
descriptors:
  - key: open
    rate_limit: {unit: day, requests_per_unit: 1000, on_store_error: open}
  - key: closed
    rate_limit: {unit: day, requests_per_unit: 1000, on_store_error: closed}
  - key: local
    rate_limit: {unit: day, requests_per_unit: 8, on_store_error: local, local_share: 0.25}
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 10, charge: up_to_limit, on_store_error: open}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1, on_store_error: open}
"#;

/// The store deadline in these tests, and how much later than it a decision may finish on a
/// busy 2-core machine running a debug build.
const DEADLINE: Duration = Duration::from_millis(20);
const MARGIN: Duration = Duration::from_millis(80);

/// Held by every test: they time their bursts against `MARGIN`, and a sibling test starting a
/// cluster on the same two cores would eat into it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn limiter(url: &str) -> Arc<Limiter> {
    limiter_with_deadline(url, DEADLINE).await
}

async fn limiter_with_deadline(url: &str, deadline: Duration) -> Arc<Limiter> {
    limiter_with_options(url, options_with_deadline(deadline)).await
}

fn options_with_deadline(deadline: Duration) -> RedisOptions {
    RedisOptions {
        connect_timeout: Duration::from_millis(500),
        command_timeout: deadline,
        max_in_flight: 1024,
        breaker: BreakerConfig {
            open_for: Duration::from_millis(300),
            ..BreakerConfig::default()
        },
        ..RedisOptions::default()
    }
}

async fn limiter_with_options(url: &str, options: RedisOptions) -> Arc<Limiter> {
    let clock = Arc::new(SystemClock::new());
    let url: StoreUrl = url.parse().unwrap();
    let store = StoreBackend::open(&url, options, clock.clone())
        .await
        .unwrap();
    assert!(
        store.wait_ready(Duration::from_secs(10)).await,
        "store reachable at start"
    );
    let policy = Policy::from_yaml("faults.yaml", POLICY).unwrap();
    Arc::new(Limiter::with_failure_settings(
        policy,
        store,
        FailureSettings::default(),
        clock,
    ))
}

fn request(key: &str, value: &str) -> CheckRequest {
    request_of(&[(key, value, 1)])
}

/// A request in domain `f` with one descriptor `key=value` of `cost` per item.
fn request_of(descriptors: &[(&str, &str, u64)]) -> CheckRequest {
    let descriptors = descriptors
        .iter()
        .map(|(key, value, cost)| {
            let entries = vec![((*key).into(), (*value).into())];
            RequestDescriptor::new(entries, *cost, None).unwrap()
        })
        .collect();
    CheckRequest::new("f".into(), descriptors).unwrap()
}

/// A cluster of three primaries, a limiter on it with store deadline `deadline`, and users of
/// the `open` rule whose counters live on distinct primaries (see
/// [`users_on_distinct_primaries`]).
async fn cluster_with_placed_users(
    deadline: Duration,
) -> (RedisCluster, Arc<Limiter>, Vec<(String, u16)>) {
    let cluster = RedisCluster::start(3, 0);
    let limiter = limiter_with_deadline(&cluster.store_url(), deadline).await;
    let placed = users_on_distinct_primaries(&cluster, &limiter).await;
    (cluster, limiter, placed)
}

/// Sends `count` requests at once; returns each answer with how long it took.
async fn burst(
    limiter: &Arc<Limiter>,
    key: &str,
    value: &str,
    count: usize,
) -> Vec<(CheckResponse, Duration)> {
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let limiter = limiter.clone();
            let req = request(key, value);
            tokio::spawn(async move {
                let start = Instant::now();
                let answer = limiter
                    .check(&req)
                    .await
                    .expect("every request gets an answer");
                (answer, start.elapsed())
            })
        })
        .collect();
    let mut out = Vec::with_capacity(count);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn assert_latency_bound(answers: &[(CheckResponse, Duration)], what: &str) {
    assert_latency_within(answers, what, DEADLINE);
}

fn assert_latency_within(answers: &[(CheckResponse, Duration)], what: &str, deadline: Duration) {
    let mut latencies: Vec<Duration> = answers.iter().map(|(_, d)| *d).collect();
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    let max = latencies[latencies.len() - 1];
    assert!(p99 <= deadline + MARGIN, "{what}: p99 {p99:?}");
    assert!(max <= deadline + MARGIN, "{what}: max {max:?}");
}

/// Users whose `open` counters (each charged once here, by Redis) live on different primaries,
/// with the port of each one's primary: two at least.
async fn users_on_distinct_primaries(
    cluster: &RedisCluster,
    limiter: &Limiter,
) -> Vec<(String, u16)> {
    let owner_of = |value: &str| {
        cluster
            .primary_ports()
            .into_iter()
            .find(|p| cluster.cli(*p, &["--scan"]).contains(value))
    };
    let mut placed: Vec<(String, u16)> = Vec::new();
    for i in 0..20 {
        let value = format!("user{i}");
        let answer = limiter.check(&request("open", &value)).await.unwrap();
        assert!(answer.degraded().is_none());
        let port = owner_of(&value).expect("the counter is on some primary");
        if placed.iter().all(|(_, p)| *p != port) {
            placed.push((value, port));
        }
    }
    assert!(
        placed.len() >= 2,
        "counters on fewer than two primaries: {placed:?}"
    );
    placed
}

/// Polls until a request on `key` is decided by Redis again (not degraded).
async fn wait_for_recovery(limiter: &Arc<Limiter>, key: &str, value: &str, within: Duration) {
    let start = Instant::now();
    while start.elapsed() < within {
        if limiter
            .check(&request(key, value))
            .await
            .unwrap()
            .degraded()
            .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("decisions did not return to Redis within {within:?}");
}

fn breaker_state(limiter: &Limiter) -> BreakerState {
    let states = limiter.store().breakers();
    assert_eq!(states.len(), 1, "{states:?}");
    states[0].1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_shut_down_and_restarted() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let limiter = limiter(&redis.url()).await;
    for key in ["open", "closed", "local"] {
        assert!(
            limiter
                .check(&request(key, "warm"))
                .await
                .unwrap()
                .degraded()
                .is_none()
        );
    }
    let _ = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "SHUTDOWN", "NOSAVE"])
        .output();
    for _ in 0..100 {
        if !redis.is_running() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!redis.is_running());

    let open = burst(&limiter, "open", "a", 300).await;
    assert!(
        open.iter()
            .all(|(r, _)| r.allowed() && r.degraded() == Some(Posture::Open))
    );
    assert_latency_bound(&open, "open");

    let closed = burst(&limiter, "closed", "a", 300).await;
    assert!(
        closed
            .iter()
            .all(|(r, _)| r.unavailable() && r.degraded() == Some(Posture::Closed))
    );
    assert!(
        closed
            .iter()
            .all(|(r, _)| r.retry_after() == Some(Duration::from_secs(1)))
    );
    assert_latency_bound(&closed, "closed");

    // A quarter of 8 per replica: exactly 2 of 300.
    let local = burst(&limiter, "local", "a", 300).await;
    assert!(
        local
            .iter()
            .all(|(r, _)| r.degraded() == Some(Posture::Local))
    );
    assert_eq!(local.iter().filter(|(r, _)| r.allowed()).count(), 2);
    assert_latency_bound(&local, "local");
    assert_eq!(
        breaker_state(&limiter),
        BreakerState::Open,
        "the breaker spares the dead server"
    );
    let metrics = limiter.render_metrics().await;
    assert!(
        metrics.contains(
            r#"tollgate_degraded_decisions_total{domain="f",rule="closed",posture="closed"} 300"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_fail_open_total 300"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_breaker_state{node=\""),
        "{metrics}"
    );
    // The postures' answers are no throttling: not counted as the limit's denials, nor kept
    // as throttled keys; the local share's decisions are the limit's.
    let count = |rule: &str, outcome: &str| {
        let series =
            format!(r#"tollgate_decisions_total{{domain="f",rule="{rule}",outcome="{outcome}"}} "#);
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |v| v.parse::<u64>().unwrap())
    };
    assert_eq!(count("closed", "denied"), 0, "{metrics}");
    assert_eq!(count("open", "allowed"), 1, "the warm-up only");
    assert_eq!(count("local", "denied"), 298);
    assert!(limiter.top_keys("f", "closed", 10).unwrap().is_empty());
    assert_eq!(limiter.top_keys("f", "local", 10).unwrap().len(), 1);
    // A request the open posture lets through counts as failing open even when another of its
    // limits answered from the local share (the more severe posture it reports).
    let mixed = CheckRequest::new(
        "f".into(),
        ["open", "local"]
            .iter()
            .map(|key| RequestDescriptor::new(vec![((*key).into(), "mixed".into())], 1, None))
            .collect::<Result<_, _>>()
            .unwrap(),
    )
    .unwrap();
    let answer = limiter.check(&mixed).await.unwrap();
    assert!(answer.allowed() && answer.degraded() == Some(Posture::Local));
    assert!(
        limiter
            .render_metrics()
            .await
            .contains("tollgate_fail_open_total 301")
    );

    // Back up: decisions return to Redis (the restarted server has no scripts: NOSCRIPT is
    // absorbed), within a second or two.
    redis.restart();
    wait_for_recovery(&limiter, "open", "probe", Duration::from_secs(2)).await;
    let after = burst(&limiter, "local", "b", 20).await;
    assert!(
        after.iter().all(|(r, _)| r.degraded().is_none()),
        "Redis decides again"
    );
    assert_eq!(
        after.iter().filter(|(r, _)| r.allowed()).count(),
        8,
        "the full limit, from Redis"
    );
    assert_eq!(breaker_state(&limiter), BreakerState::Closed);
}

fn resident_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_redis_costs_at_most_the_deadline_and_leaks_nothing() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let limiter = limiter(&proxy.url()).await;
    assert!(
        limiter
            .check(&request("open", "warm"))
            .await
            .unwrap()
            .degraded()
            .is_none()
    );
    proxy.set_mode(Mode::Blackhole);

    let first = burst(&limiter, "open", "a", 300).await;
    assert!(
        first
            .iter()
            .all(|(r, _)| r.allowed() && r.degraded() == Some(Posture::Open))
    );
    assert_latency_bound(&first, "blackhole, breaker closed");
    assert_eq!(breaker_state(&limiter), BreakerState::Open);

    // With the breaker open, further rounds do not touch the store: memory and tasks stay flat.
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let rss_before = resident_kib();
    for _ in 0..5 {
        let round = burst(&limiter, "open", "b", 300).await;
        assert!(round.iter().all(|(r, _)| r.allowed()));
        assert_latency_bound(&round, "blackhole, breaker open");
    }
    let tasks_after = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let rss_after = resident_kib();
    assert!(
        tasks_after <= tasks_before + 2,
        "tasks {tasks_before} -> {tasks_after}"
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "resident {rss_before} KiB -> {rss_after} KiB"
    );

    proxy.set_mode(Mode::Pass);
    wait_for_recovery(&limiter, "open", "probe", Duration::from_secs(3)).await;
    assert_eq!(breaker_state(&limiter), BreakerState::Closed);
}

/// Calls that a paused Redis runs after their callers had their answer (here the `closed`
/// posture's refusal) write nothing: past their deadline and `LATE_SLACK`, the script refuses
/// them. Coalesced, and with one call per decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_reach_redis_after_their_deadline_charge_nothing() {
    let _serial = SERIAL.lock().await;
    for max_batch in [CoalesceOptions::default().max_batch, 0] {
        let redis = RedisServer::start();
        let mut options = options_with_deadline(DEADLINE);
        options.coalesce.max_batch = max_batch;
        let limiter = limiter_with_options(&redis.url(), options).await;
        // A first answer tells the replica the server's clock.
        let warm = limiter.check(&request("closed", "warm")).await.unwrap();
        assert!(warm.allowed() && warm.degraded().is_none());
        // Scripts that may write wait out the pause, then run: long after their deadline.
        let pause = DEADLINE + LATE_SLACK + Duration::from_secs(1);
        let millis = pause.as_millis().to_string();
        assert_eq!(redis.cli(&["CLIENT", "PAUSE", &millis, "WRITE"]), "OK");
        let refused = burst(&limiter, "closed", "held", 4).await;
        assert!(
            refused.iter().all(|(r, _)| r.unavailable()),
            "batch {max_batch}"
        );
        assert_nothing_held_was_charged(&redis, &limiter, &format!("batch {max_batch}")).await;
    }
}

/// Waits until decisions reach `redis` again (whatever it held has run by then), then checks
/// that no counter of a `held` value was written.
async fn assert_nothing_held_was_charged(redis: &RedisServer, limiter: &Arc<Limiter>, what: &str) {
    wait_for_recovery(limiter, "open", "after", Duration::from_secs(5)).await;
    let keys = redis.cli(&["--scan"]);
    assert!(keys.contains("after"), "{keys}");
    assert!(
        !keys.contains("held"),
        "{what}: a refused decision was charged: {keys}"
    );
}

/// Decisions queued behind batches stuck on a paused Redis count their allowance from when
/// they were queued, not from when their batch finally goes: a batch sent long after its
/// callers had their `closed` refusal must not charge them when Redis resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_decisions_count_their_allowance_from_the_queue() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let deadline = Duration::from_secs(1);
    let mut options = options_with_deadline(deadline);
    // The breaker stays closed, so that batches keep going out during the pause.
    options.breaker.consecutive_failures = u32::MAX;
    options.breaker.min_calls = u32::MAX;
    // A caller waits no longer than the deadline (a busy Redis gets no more).
    options.max_wait = deadline;
    let limiter = limiter_with_options(&redis.url(), options).await;
    let warm = limiter.check(&request("closed", "warm")).await.unwrap();
    assert!(warm.allowed() && warm.degraded().is_none());

    let pause = Duration::from_secs(4);
    let millis = pause.as_millis().to_string();
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", &millis, "WRITE"]), "OK");
    let paused_at = Instant::now();
    // Decisions queued until well before the pause ends, less the allowance: with the
    // allowance counted from the queue, none may write when Redis resumes.
    let last = pause - deadline - LATE_SLACK - Duration::from_millis(500);
    let mut callers = Vec::new();
    let mut i = 0;
    while paused_at.elapsed() < last {
        let limiter = limiter.clone();
        let value = format!("held-{i}");
        callers.push(tokio::spawn(async move {
            limiter.check(&request("closed", &value)).await.unwrap()
        }));
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for caller in callers {
        assert!(
            caller.await.unwrap().unavailable(),
            "refused by the posture"
        );
    }
    tokio::time::sleep_until(paused_at + pause).await;
    assert_nothing_held_was_charged(&redis, &limiter, "queued").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_trips_the_deadline_and_the_breaker_then_recovers() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let limiter = limiter(&proxy.url()).await;
    assert!(
        limiter
            .check(&request("local", "warm"))
            .await
            .unwrap()
            .degraded()
            .is_none()
    );

    // 50 ms each way: every call misses the 20 ms deadline.
    proxy.set_mode(Mode::Latency(Duration::from_millis(50)));
    let slow = burst(&limiter, "local", "a", 300).await;
    assert!(
        slow.iter()
            .all(|(r, _)| r.degraded() == Some(Posture::Local))
    );
    assert_eq!(
        slow.iter().filter(|(r, _)| r.allowed()).count(),
        2,
        "the local share, exactly"
    );
    assert_latency_bound(&slow, "latency");
    assert_eq!(breaker_state(&limiter), BreakerState::Open);
    proxy.set_mode(Mode::Pass);
    wait_for_recovery(&limiter, "local", "probe", Duration::from_secs(3)).await;
    assert_eq!(breaker_state(&limiter), BreakerState::Closed);

    // Redis itself stalls writes (scripts that write wait on CLIENT PAUSE).
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "1500", "WRITE"]), "OK");
    let paused = burst(&limiter, "open", "p", 300).await;
    assert!(
        paused
            .iter()
            .all(|(r, _)| r.allowed() && r.degraded() == Some(Posture::Open))
    );
    assert_latency_bound(&paused, "client pause");
    assert_eq!(breaker_state(&limiter), BreakerState::Open);
    wait_for_recovery(&limiter, "open", "probe", Duration::from_secs(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_and_a_foreign_value_affect_only_their_requests() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let limiter = limiter(&redis.url()).await;

    // A foreign value at one counter: that request takes the posture; the store stays healthy.
    assert!(
        limiter
            .check(&request("closed", "victim"))
            .await
            .unwrap()
            .allowed()
    );
    let keys = redis.cli(&["--scan"]);
    let victim = keys
        .lines()
        .find(|k| k.contains("victim"))
        .unwrap()
        .to_owned();
    redis.cli(&["SET", &victim, "not ours"]);
    for _ in 0..20 {
        let r = limiter.check(&request("closed", "victim")).await.unwrap();
        assert!(r.unavailable(), "closed posture for the broken counter");
    }
    let other = limiter
        .check(&request("closed", "bystander"))
        .await
        .unwrap();
    assert!(
        other.allowed() && other.degraded().is_none(),
        "other counters are unaffected"
    );
    assert_eq!(
        breaker_state(&limiter),
        BreakerState::Closed,
        "bad data is not an outage"
    );

    // Out of memory: every write fails; the postures answer and nothing crashes.
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let open = burst(&limiter, "open", "oom", 300).await;
    assert!(
        open.iter()
            .all(|(r, _)| r.allowed() && r.degraded() == Some(Posture::Open))
    );
    let unmatched = limiter.check(&request("no-rule", "x")).await.unwrap();
    assert!(
        unmatched.allowed() && unmatched.degraded().is_none(),
        "requests without limits are unaffected"
    );
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    wait_for_recovery(&limiter, "open", "probe", Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_affects_only_its_own_slots() {
    let _serial = SERIAL.lock().await;
    let cluster = Arc::new(RedisCluster::start(3, 1));
    // By default a cluster refuses every query while any slot is uncovered; a deployment that
    // wants healthy slots to keep serving during a failover turns that off (see the README).
    for port in cluster.ports() {
        cluster.cli(
            port,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        );
    }
    // A deadline no healthy call misses on a busy machine running a debug build: this test
    // is about which slots a dead primary affects, and a healthy call timing out would read
    // as one it affected (the other tests hold the 20 ms one).
    let deadline = Duration::from_millis(250);
    let limiter = limiter_with_deadline(&cluster.store_url(), deadline).await;
    let placed = users_on_distinct_primaries(&cluster, &limiter).await;
    let (victim, dead) = placed[0].clone();
    let (healthy, _) = placed[1].clone();
    // Let the slot map (refreshed every second) know the owners.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    cluster.kill_node(dead);
    let failover = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || {
            // Wait until every slot is served again (the dead primary's replica promoted).
            cluster.wait_until_healthy(Duration::from_secs(20));
        }
    });
    let mut victim_degraded = 0;
    while !failover.is_finished() {
        let v = burst(&limiter, "open", &victim, 50).await;
        victim_degraded += v.iter().filter(|(r, _)| r.degraded().is_some()).count();
        assert!(
            v.iter().all(|(r, _)| r.allowed()),
            "open: never an error, never a denial"
        );
        assert_latency_within(&v, "dead primary's slot", deadline);
        let h = burst(&limiter, "open", &healthy, 50).await;
        assert!(
            h.iter().all(|(r, _)| r.degraded().is_none()),
            "other slots are unaffected throughout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    failover.await.unwrap();
    assert!(
        victim_degraded > 0,
        "the dead primary's slot took the posture"
    );
    wait_for_recovery(&limiter, "open", &victim, Duration::from_secs(5)).await;
    let v = burst(&limiter, "open", &victim, 20).await;
    assert!(
        v.iter().all(|(r, _)| r.degraded().is_none()),
        "the promoted replica decides"
    );
}

/// Past the in-flight cap a decision waits its turn for the store instead of going to the
/// posture at once (a burst is not a store failure). On a store that answers nothing, behind a
/// breaker kept closed, the calls out wait to `max_wait` and fail; the decisions still waiting
/// for a place then are shed for load, counted apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_work_beyond_the_in_flight_cap_waits_its_turn_up_to_the_longest_wait() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let max_wait = Duration::from_secs(1);
    let options = RedisOptions {
        connect_timeout: Duration::from_millis(500),
        command_timeout: Duration::from_millis(300),
        max_in_flight: 4,
        max_wait,
        // Keep the breaker out of the way: this test is about the cap.
        breaker: BreakerConfig {
            consecutive_failures: 1_000,
            min_calls: 1_000,
            ..BreakerConfig::default()
        },
        // One call per decision, so that the cap counts calls.
        coalesce: CoalesceOptions {
            max_batch: 0,
            ..CoalesceOptions::default()
        },
    };
    let clock = Arc::new(SystemClock::new());
    let store = StoreBackend::open(&proxy.url().parse().unwrap(), options, clock.clone())
        .await
        .unwrap();
    assert!(store.wait_ready(Duration::from_secs(10)).await);
    let policy = Policy::from_yaml("faults.yaml", POLICY).unwrap();
    let limiter = Arc::new(Limiter::with_failure_settings(
        policy,
        store,
        FailureSettings::default(),
        clock,
    ));
    proxy.set_mode(Mode::Blackhole);
    let answers = burst(&limiter, "open", "cap", 50).await;
    assert!(
        answers
            .iter()
            .all(|(r, _)| r.allowed() && r.degraded() == Some(Posture::Open))
    );
    let at_once = answers
        .iter()
        .filter(|(_, d)| *d < Duration::from_millis(250))
        .count();
    assert_eq!(at_once, 0, "none skipped the store at once");
    assert_latency_within(
        &answers,
        "the longest wait",
        max_wait + Duration::from_millis(200),
    );
    let StoreBackend::Redis(redis_store) = limiter.store() else {
        unreachable!("a Redis store");
    };
    let shed = redis_store.shed_for_load();
    // The rest waited their longest and were shed, unless a place handed over at the ceiling
    // (the calls ahead failing at theirs) reached them first: on a loaded machine that
    // hand-over can run through every waiter, and they fail as the calls ahead did.
    assert!(
        shed <= 46,
        "the cap's rounds failed at their deadlines, the rest waited their longest: {shed} shed"
    );
}

/// A caller's limit of 0 denies the request while the store is down too, as a limit (a `429`,
/// not the `closed` posture's `503`), and charges none of its other limits: not even the
/// `local` posture's share, which a blocked client could otherwise use up for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_descriptor_charges_nothing_while_the_store_is_down() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let limiter = limiter(&proxy.url()).await;
    proxy.set_mode(Mode::Refuse);
    let blocked_with = |key: &str| {
        let zero = LimitOverride::new(0, Duration::from_secs(60)).unwrap();
        let blocked =
            RequestDescriptor::new(vec![("user".into(), "hal".into())], 1, Some(zero)).unwrap();
        let other = RequestDescriptor::new(vec![(key.into(), "x".into())], 1, None).unwrap();
        CheckRequest::new("f".into(), vec![blocked, other]).unwrap()
    };
    for key in ["local", "closed", "open"] {
        for _ in 0..3 {
            let r = limiter.check(&blocked_with(key)).await.unwrap();
            assert!(!r.allowed(), "{key}");
            assert!(
                !r.unavailable(),
                "{key}: blocked by a limit, not by the outage"
            );
        }
    }
    // The local share (2 of 8 here) is untouched.
    let local = burst(&limiter, "local", "x", 3).await;
    assert_eq!(local.iter().filter(|(r, _)| r.allowed()).count(), 2);
}

/// A cost its limit can never hold is answered as such while the store is down, as it would be
/// with the store up: not let through by `open`, not a `503` with a retry from `closed`, and it
/// charges nothing to a `local` share. Before, `open` admitted a cost of 2000 on a limit of 1000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_the_limit_is_refused_whatever_the_posture() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let limiter = limiter(&proxy.url()).await;
    proxy.set_mode(Mode::Refuse);
    for (key, cost) in [("open", 1001), ("closed", 2000), ("local", 9)] {
        let r = limiter
            .check(&request_of(&[(key, "x", cost)]))
            .await
            .unwrap();
        assert!(!r.allowed(), "{key}");
        assert!(!r.unavailable(), "{key}: a 429, not the outage's 503");
        assert_eq!(r.retry_after(), None, "{key}: no retry will help");
        assert_eq!(r.degraded(), None, "{key}: decided without the store");
        assert!(r.statuses[0].cost_exceeds_capacity(), "{key}");
    }
    // Beside a cost that fits, on another limit: the request is denied, and the local share
    // (2 of 8) was not charged for it.
    let both = request_of(&[("local", "x", 1), ("open", "y", 1001)]);
    assert!(!limiter.check(&both).await.unwrap().allowed());
    let local = burst(&limiter, "local", "x", 3).await;
    assert_eq!(local.iter().filter(|(r, _)| r.allowed()).count(), 2);
    // A cost that fits still takes the posture.
    let r = limiter
        .check(&request_of(&[("open", "z", 1000)]))
        .await
        .unwrap();
    assert!(r.allowed());
    assert_eq!(r.degraded(), Some(Posture::Open));
}

/// `/readyz` and `/metrics` count the store's keys: against a server that never answers, that
/// gives up within half a second even when decisions may wait 2 s, well inside a readiness
/// probe's default 1 s timeout, so a hung Redis does not take every replica out of service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_keys_on_a_hung_server_gives_up_in_time() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let options = RedisOptions {
        command_timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    let clock = Arc::new(SystemClock::new());
    let store = StoreBackend::open(&proxy.url().parse().unwrap(), options, clock)
        .await
        .unwrap();
    assert!(store.wait_ready(Duration::from_secs(10)).await);
    assert!(store.key_count().await.is_ok());
    proxy.set_mode(Mode::Blackhole);
    let start = Instant::now();
    assert!(store.key_count().await.is_err());
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_millis(900),
        "{waited:?}"
    );
}

/// A request whose counters live on two primaries, one of them out of memory: the peek
/// passes on both, the charge fails on the full one and lands on the other. The request takes
/// the posture, and the charge that landed is taken back: all or nothing, on a cluster too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_that_fails_on_one_primary_is_refunded_on_the_others() {
    let _serial = SERIAL.lock().await;
    let (cluster, limiter, placed) = cluster_with_placed_users(DEADLINE).await;
    let [(doomed, failing), (healthy, _), ..] = placed.as_slice() else {
        unreachable!("two at least");
    };
    cluster.cli(
        *failing,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );
    cluster.cli(*failing, &["CONFIG", "SET", "maxmemory", "1"]);

    let both = request_of(&[("open", doomed, 1), ("open", healthy, 1)]);
    for _ in 0..30 {
        let answer = limiter.check(&both).await.unwrap();
        assert!(answer.allowed() && answer.degraded().is_some());
    }
    // One charge from the placement loop; explain answers as if for one more. A refund has a
    // deadline of its own (20 ms): one cut short on a busy machine leaves its unit charged
    // (under-admission), so allow a few. Without refunds all 30 would stay (968).
    let left = limiter.explain(&request("open", healthy)).await.unwrap();
    assert!(left.degraded().is_none(), "the healthy primary decides");
    let remaining = left.statuses[0].decision.unwrap().remaining;
    assert!((1000 - 5..=1000 - 2).contains(&remaining), "{remaining}");
}

/// The same with a `charge: up_to_limit` limit on the healthy primary: its charge takes only
/// what was left there, and the refund gives back exactly that, as the script reports it (not
/// the request's whole cost, which would credit what others used, nor nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_up_to_the_limit_is_refunded_what_it_took() {
    let _serial = SERIAL.lock().await;
    // A deadline a busy machine does not cut short: this test is about the amount refunded.
    let (cluster, limiter, placed) = cluster_with_placed_users(Duration::from_secs(2)).await;
    let [(doomed, failing), ..] = placed.as_slice() else {
        unreachable!("two at least");
    };
    // A `tokens` counter on another primary, charged 1 by its placement: 9 left.
    let mut on_other = None;
    for i in 0..40 {
        let value = format!("tk{i}z");
        limiter.check(&request("tokens", &value)).await.unwrap();
        let owner = cluster
            .primary_ports()
            .into_iter()
            .find(|p| cluster.cli(*p, &["--scan"]).contains(value.as_str()));
        if owner.is_some_and(|p| p != *failing) {
            on_other = Some(value);
            break;
        }
    }
    let tokens = on_other.expect("a tokens counter off the failing primary");
    cluster.cli(
        *failing,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );
    cluster.cli(*failing, &["CONFIG", "SET", "maxmemory", "1"]);

    let both = request_of(&[("open", doomed, 1), ("tokens", &tokens, 50)]);
    let answer = limiter.check(&both).await.unwrap();
    assert!(answer.allowed() && answer.degraded().is_some());
    // The 9 it took came back; explain answers as if for one more.
    let left = limiter.explain(&request("tokens", &tokens)).await.unwrap();
    assert_eq!(left.statuses[0].decision.unwrap().remaining, 8);
}

/// A value whose `key` counter (charged once here) lives on the primary on `port`, or off it
/// when `on` is false.
async fn counter_placed(
    cluster: &RedisCluster,
    limiter: &Limiter,
    key: &str,
    port: u16,
    on: bool,
) -> String {
    for i in 0..60 {
        let value = format!("{key}-{port}-{on}-{i}z");
        limiter.check(&request(key, &value)).await.unwrap();
        let owner = cluster
            .primary_ports()
            .into_iter()
            .find(|p| cluster.cli(*p, &["--scan"]).contains(value.as_str()));
        if (owner == Some(port)) == on {
            return value;
        }
    }
    panic!("no `{key}` counter placed (on: {on}) on {port}");
}

/// Quota limits on a dead primary and on a healthy one decide together: the healthy one over
/// and the dead one answered by its `open` posture, the request is admitted, and Redis charges
/// the healthy primary's limit that admits (the part Redis decides is not denied on its own
/// because its only quota limit is over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_limits_across_a_dead_primary_decide_together() {
    let _serial = SERIAL.lock().await;
    let (cluster, limiter, placed) = cluster_with_placed_users(Duration::from_millis(500)).await;
    let [(_, dead), (healthy, _), ..] = placed.as_slice() else {
        unreachable!("two at least");
    };
    // Each charged once: a quota of 1 a day, used up.
    let quota_healthy = counter_placed(&cluster, &limiter, "quota", *dead, false).await;
    let quota_on_dead = counter_placed(&cluster, &limiter, "quota", *dead, true).await;
    let used = async |value: &str| {
        let answer = limiter.explain(&request("open", value)).await.unwrap();
        assert!(
            answer.degraded().is_none(),
            "open={value} is decided by Redis"
        );
        1000 - answer.statuses[0].decision.unwrap().remaining
    };
    let before = used(healthy).await;
    let proxy = behind_proxy(&cluster, &limiter, *dead).await;
    proxy.set_mode(Mode::Refuse);
    let both = request_of(&[
        ("open", healthy, 1),
        ("quota", &quota_healthy, 1),
        ("quota", &quota_on_dead, 1),
    ]);
    let answer = limiter.check(&both).await.unwrap();
    assert!(answer.allowed(), "{answer:?}");
    assert_eq!(answer.statuses[1].code, Code::OverLimit, "{answer:?}");
    assert_eq!(answer.statuses[1].degraded, None);
    assert_eq!(answer.statuses[2].degraded, Some(Posture::Open));
    assert_eq!(
        used(healthy).await,
        before + 1,
        "the limit that admits is charged"
    );
}

/// A request whose limits live on two primaries, one of them gone: the postures answer for
/// that primary's limits alone, Redis decides the others, and the request stays all or
/// nothing. (The whole request once took the posture: an `open` limit on the dead primary let
/// through a request over its limit on the healthy one, and a healthy `closed` limit answered
/// as unavailable.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_under_part_of_a_request_leaves_the_rest_to_redis() {
    let _serial = SERIAL.lock().await;
    // A deadline a busy machine does not cut short: a healthy call timing out would take the
    // posture for the whole request.
    let (cluster, limiter, placed) = cluster_with_placed_users(Duration::from_millis(500)).await;
    let [(on_dead, dead), (healthy, _), ..] = placed.as_slice() else {
        unreachable!("two at least");
    };
    let closed_on_dead = counter_placed(&cluster, &limiter, "closed", *dead, true).await;
    let closed_healthy = counter_placed(&cluster, &limiter, "closed", *dead, false).await;
    let local_on_dead = counter_placed(&cluster, &limiter, "local", *dead, true).await;
    let used = async |key: &str, value: &str| {
        let answer = limiter.explain(&request(key, value)).await.unwrap();
        assert!(
            answer.degraded().is_none(),
            "{key}={value} is decided by Redis"
        );
        1000 - answer.statuses[0].decision.unwrap().remaining
    };
    let closed_before = used("closed", &closed_healthy).await;
    let proxy = behind_proxy(&cluster, &limiter, *dead).await;
    proxy.set_mode(Mode::Refuse);

    // The healthy primary's `open` limit used up: the dead primary's `open` limit does not
    // let the request through.
    let up_to_limit = limiter
        .check(&request_of(&[("open", healthy, 999)]))
        .await
        .unwrap();
    assert!(up_to_limit.allowed() && up_to_limit.degraded().is_none());
    let over = request_of(&[("open", healthy, 1), ("open", on_dead, 1)]);
    let answer = limiter.check(&over).await.unwrap();
    assert!(!answer.allowed(), "{answer:?}");
    assert!(!answer.unavailable(), "a 429: Redis denied it");
    assert_eq!(answer.statuses[0].degraded, None, "{answer:?}");
    assert_eq!(answer.statuses[0].decision.unwrap().remaining, 0);
    assert_eq!(answer.statuses[1].degraded, Some(Posture::Open));

    // A healthy `closed` limit is decided, and charged, by Redis.
    let mixed = request_of(&[("closed", &closed_healthy, 1), ("open", on_dead, 1)]);
    let answer = limiter.check(&mixed).await.unwrap();
    assert!(answer.allowed(), "{answer:?}");
    assert_eq!(answer.statuses[0].degraded, None, "{answer:?}");
    assert_eq!(answer.statuses[1].degraded, Some(Posture::Open));
    assert_eq!(used("closed", &closed_healthy).await, closed_before + 1);

    // A `closed` limit on the dead primary denies the request as unavailable, and the healthy
    // limit beside it is not charged.
    let refused = request_of(&[
        ("closed", &closed_healthy, 1),
        ("closed", &closed_on_dead, 1),
    ]);
    let answer = limiter.check(&refused).await.unwrap();
    assert!(answer.unavailable(), "{answer:?}");
    assert_eq!(answer.statuses[0].degraded, None, "{answer:?}");
    assert_eq!(answer.statuses[1].degraded, Some(Posture::Closed));
    assert_eq!(used("closed", &closed_healthy).await, closed_before + 1);

    // A `local` limit on the dead primary (8 a day, a quarter here: 2) admits twice, then
    // denies; Redis charges the healthy limit for the two it admitted only.
    let with_local = request_of(&[("closed", &closed_healthy, 1), ("local", &local_on_dead, 1)]);
    for _ in 0..2 {
        let answer = limiter.check(&with_local).await.unwrap();
        assert!(answer.allowed(), "{answer:?}");
        assert_eq!(answer.statuses[1].degraded, Some(Posture::Local));
    }
    let answer = limiter.check(&with_local).await.unwrap();
    assert!(!answer.allowed() && !answer.unavailable(), "{answer:?}");
    assert_eq!(answer.statuses[0].degraded, None, "{answer:?}");
    assert_eq!(used("closed", &closed_healthy).await, closed_before + 3);
    proxy.set_mode(Mode::Pass);
}

/// Puts a fault proxy in front of the cluster's primary on `port`: the primary announces the
/// proxy's port, and this returns once `limiter` (at its next look at the slot map) has called
/// the primary through it.
async fn behind_proxy(cluster: &RedisCluster, limiter: &Limiter, port: u16) -> FaultProxy {
    let proxy = FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    let announced = proxy.port().to_string();
    cluster.cli(
        port,
        &["CONFIG", "SET", "cluster-announce-port", &announced],
    );
    let until = Instant::now() + Duration::from_secs(10);
    while proxy.bytes_forwarded() == 0 {
        assert!(
            Instant::now() < until,
            "the limiter never called {port} through the proxy"
        );
        // `DBSIZE` on every primary.
        let _ = limiter.store().key_count().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy
}

/// Readiness asks every primary for its key count at once, under one deadline: however many
/// primaries hang, the answer comes within that deadline (500 ms at most), not one deadline
/// per hung primary after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_one_deadline_however_many_primaries_hang() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start(3, 0);
    let limiter = limiter_with_deadline(&cluster.store_url(), Duration::from_millis(500)).await;
    let primaries = cluster.primary_ports();
    let mut proxies = Vec::new();
    for &port in &primaries[..2] {
        proxies.push(behind_proxy(&cluster, &limiter, port).await);
    }
    for proxy in &proxies {
        proxy.set_mode(Mode::Blackhole);
    }
    let started = Instant::now();
    assert!(limiter.store().key_count().await.is_err());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(900),
        "two hung primaries, one deadline of 500 ms: took {took:?}"
    );
    for proxy in &proxies {
        proxy.set_mode(Mode::Pass);
    }
}

/// A slow primary that answers a cross-slot request's first step but not, within the deadline,
/// its charge: the other primary's charge is still refunded, on a deadline of its own. (The
/// whole request under one deadline dropped the refund with the slow call, and the other
/// primary's charge stood.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_primary_does_not_leave_the_other_slots_charged() {
    let _serial = SERIAL.lock().await;
    // One-way latency 100 ms on the slow primary: its first step answers at about 200 ms,
    // inside the 300 ms deadline, its charge at about 400 ms, past it.
    // A caller waits no longer than the deadline (a slow but answering Redis gets no more).
    let deadline = Duration::from_millis(300);
    let cluster = RedisCluster::start(3, 0);
    let options = RedisOptions {
        max_wait: deadline,
        ..options_with_deadline(deadline)
    };
    let limiter = limiter_with_options(&cluster.store_url(), options).await;
    let placed = users_on_distinct_primaries(&cluster, &limiter).await;
    let [(fast_user, _), (slow_user, slow_port), ..] = placed.as_slice() else {
        unreachable!("two at least");
    };
    let proxy = behind_proxy(&cluster, &limiter, *slow_port).await;
    let remaining = async |user: &str| {
        let answer = limiter.explain(&request("open", user)).await.unwrap();
        assert!(answer.degraded().is_none());
        answer.statuses[0].decision.unwrap().remaining
    };
    let before = remaining(fast_user).await;
    let slow_before = remaining(slow_user).await;

    proxy.set_mode(Mode::Latency(Duration::from_millis(100)));
    let both = request_of(&[("open", fast_user, 1), ("open", slow_user, 1)]);
    let started = Instant::now();
    let answer = limiter.check(&both).await.unwrap();
    let took = started.elapsed();
    assert!(
        answer.allowed() && answer.degraded() == Some(Posture::Open),
        "the slow charge failed and the open posture answered: {answer:?}"
    );
    // The decision's deadline, then the refunds' own (README: at most twice as long).
    assert!(
        took < Duration::from_millis(2 * 300) + MARGIN,
        "took {took:?}"
    );
    proxy.set_mode(Mode::Pass);
    assert_eq!(
        remaining(fast_user).await,
        before,
        "the fast primary's charge was refunded"
    );
    // The slow primary's charge was sent (so the first step had admitted the request, and the
    // fast primary had charged too); it lands late and stands, unknown to the request.
    let until = Instant::now() + Duration::from_secs(2);
    while remaining(slow_user).await != slow_before - 1 {
        assert!(
            Instant::now() < until,
            "the slow primary's charge never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Redis that wants a password the URL does not carry: readiness fails with Redis's own
/// reason (`NOAUTH`), which `serve` logs at startup, not a bare "not reachable" that would send
/// an operator to the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_password_is_reported_as_such() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    assert_eq!(redis.cli(&["CONFIG", "SET", "requirepass", "secret"]), "OK");
    let url: StoreUrl = redis.url().parse().unwrap();
    let clock = Arc::new(SystemClock::new());
    let store = StoreBackend::open(&url, options_with_deadline(DEADLINE), clock)
        .await
        .unwrap();
    let error = store.ready_within(Duration::from_millis(300)).await;
    // A decision's script call is large enough that Redis answers it with a protocol error
    // about an "unauthenticated multibulk length", which says nothing of a password.
    let params = tollgate_core::Params::new(
        tollgate_core::Algorithm::FixedWindow,
        10,
        Duration::from_secs(1),
        None,
    )
    .unwrap();
    let charges: Vec<_> = (0..8)
        .map(|_| tollgate::store::Charge::new(b"a:b", &params, 1))
        .collect();
    let decided = store.apply(&charges).await;
    // Back to no password, so that the test kit can stop the server.
    redis.cli(&["-a", "secret", "CONFIG", "SET", "requirepass", ""]);
    let error = error.unwrap_err();
    assert!(error.to_string().contains("NOAUTH"), "{error}");
    let error = decided.unwrap_err().to_string();
    assert!(error.contains("authentication required"), "{error}");
}

/// `number_of_cached_scripts` of an `INFO memory` answer.
fn cached(info: String) -> Option<u32> {
    info.lines()
        .find_map(|line| line.strip_prefix("number_of_cached_scripts:"))
        .map(|n| n.trim().parse::<u32>().unwrap())
}

/// A store on `url`, once it answers.
async fn open(url: String) -> StoreBackend {
    let clock = Arc::new(SystemClock::new());
    let store = StoreBackend::open(&url.parse().unwrap(), RedisOptions::default(), clock)
        .await
        .unwrap();
    assert!(store.wait_ready(Duration::from_secs(10)).await);
    store
}

/// Once the store first answers, the decision scripts are on every primary (a single server and
/// a cluster's three): the first decisions after a start do not each load, and Redis compile,
/// one inside their deadline, which had made a cold start's first decision fail open.
#[tokio::test]
async fn the_scripts_are_loaded_once_the_store_answers() {
    let redis = RedisServer::start();
    assert_eq!(cached(redis.cli(&["INFO", "memory"])), Some(0));
    let _store = open(redis.url()).await;
    assert_eq!(cached(redis.cli(&["INFO", "memory"])), Some(3));

    let cluster = RedisCluster::start(3, 0);
    let _store = open(cluster.store_url()).await;
    for port in cluster.primary_ports() {
        let info = cluster.cli(port, &["INFO", "memory"]);
        assert_eq!(cached(info), Some(3), "primary {port}");
    }
}

/// A Redis too busy to load the scripts within `--store-timeout` (here paused for 300 ms) gets
/// them all the same: the load is tried again until its own deadline of 5 s, where it once gave
/// up at the first timeout and left the first decisions to load them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_are_loaded_on_a_redis_slower_than_the_store_timeout() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let store = open(redis.url()).await;
    let StoreBackend::Redis(store) = store else {
        unreachable!("a Redis URL");
    };
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "300", "ALL"]), "OK");
    store.load_scripts().await.unwrap();
    assert_eq!(cached(redis.cli(&["INFO", "memory"])), Some(3));
}

/// A replica promoted after its primary died has no scripts (Redis does not replicate its
/// script cache): it gets them as soon as the slot map shows it, before any decision would
/// load one inside its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_gets_the_scripts_before_any_decision() {
    let _serial = SERIAL.lock().await;
    let cluster = Arc::new(RedisCluster::start(3, 1));
    let _store = open(cluster.store_url()).await;
    let before = cluster.primary_ports();
    cluster.kill_node(before[0]);
    let healthy = cluster.clone();
    tokio::task::spawn_blocking(move || healthy.wait_until_healthy(Duration::from_secs(20)))
        .await
        .unwrap();
    let promoted: Vec<u16> = cluster
        .primary_ports()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(promoted.len(), 1, "{promoted:?}");
    // The slot map is read every second; the load follows.
    let until = Instant::now() + Duration::from_secs(10);
    while cached(cluster.cli(promoted[0], &["INFO", "memory"])) != Some(3) {
        assert!(
            Instant::now() < until,
            "the promoted replica {} never got the scripts",
            promoted[0]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
