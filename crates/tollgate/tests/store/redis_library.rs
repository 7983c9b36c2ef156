//! How a single server's batches reach the decision code: by `FCALL` of the function library
//! `tollgate_<sha1>`, reloaded when Redis loses it, and by `EVALSHA` of the batch script where
//! Redis refuses `FUNCTION`. Either way every decision is made and exact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::store::redis::script::decide_batch_library;
use tollgate::store::{Charge, Store, StoreBackend};
use tollgate_core::{Algorithm, Params};
use tollgate_testkit::RedisServer;

use super::redis_support::{hourly, open_ready};

/// A Redis that refuses `FUNCTION` (here renamed away; an ACL without `+function` answers
/// `NOPERM` alike) gets its batches by `EVALSHA`, which decides exactly: of 60 concurrent
/// requests on a limit of 25, exactly 25 are admitted, then none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_functions_decides_exactly_by_evalsha() {
    let redis = RedisServer::builder()
        .args(["--rename-command", "FUNCTION", ""])
        .start();
    assert!(
        redis.cli(&["FUNCTION", "LIST"]).contains("unknown command"),
        "FUNCTION is refused"
    );
    let store = Arc::new(connect(&redis).await);
    let params = hourly(Algorithm::FixedWindow, 25);

    assert_eq!(admitted(&store, b"refused", &params, 60).await, 25);
    assert_eq!(admitted(&store, b"refused", &params, 5).await, 0);

    let stats = redis.cli(&["INFO", "commandstats"]);
    assert!(calls(&stats, "evalsha") >= 1, "batches by EVALSHA: {stats}");
    assert_eq!(
        calls(&stats, "fcall"),
        0,
        "the refused load sends no FCALL: {stats}"
    );
}

/// An ACL that lets `FUNCTION LOAD` through but not `FCALL` is a refusal too: batches go by
/// `EVALSHA`, exactly, where every one failed with `NOPERM`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_whose_acl_refuses_fcall_decides_exactly_by_evalsha() {
    let redis = RedisServer::start();
    assert_eq!(redis.cli(&["ACL", "SETUSER", "default", "-fcall"]), "OK");
    let store = Arc::new(connect(&redis).await);
    let params = hourly(Algorithm::FixedWindow, 25);

    assert_eq!(admitted(&store, b"no-fcall", &params, 60).await, 25);
    assert_eq!(admitted(&store, b"no-fcall", &params, 5).await, 0);

    let stats = redis.cli(&["INFO", "commandstats"]);
    assert!(calls(&stats, "evalsha") >= 1, "batches by EVALSHA: {stats}");
    let library = library_name();
    let listed = redis.cli(&["FUNCTION", "LIST", "LIBRARYNAME", "tollgate_*"]);
    assert!(listed.contains(&library), "the load went through: {listed}");
}

/// The library deleted under a running store (`FUNCTION FLUSH`; a restarted Redis has none
/// either) is loaded again by the next batch, which then runs by `FCALL` as before, not by
/// `EVALSHA`: no decision fails and the count carries on exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_is_loaded_again_and_decisions_stay_exact() {
    let redis = RedisServer::start();
    let store = Arc::new(connect(&redis).await);
    let params = hourly(Algorithm::FixedWindow, 30);
    let library = library_name();

    assert_eq!(admitted(&store, b"flushed", &params, 10).await, 10);
    let listed = || redis.cli(&["FUNCTION", "LIST", "LIBRARYNAME", "tollgate_*"]);
    assert!(listed().contains(&library), "{}", listed());

    assert_eq!(redis.cli(&["FUNCTION", "FLUSH"]), "OK");
    assert!(!listed().contains(&library), "flushed: {}", listed());
    assert_eq!(admitted(&store, b"flushed", &params, 40).await, 20);
    assert_eq!(admitted(&store, b"flushed", &params, 3).await, 0);
    assert!(listed().contains(&library), "loaded again: {}", listed());

    let stats = redis.cli(&["INFO", "commandstats"]);
    assert!(calls(&stats, "fcall") >= 2, "{stats}");
    assert_eq!(calls(&stats, "evalsha"), 0, "never fell back: {stats}");
}

/// Sends `requests` charges of 1 on `key` at once; how many were admitted. Every one must be
/// decided by Redis (an error would be the failure posture's answer, not the store's).
async fn admitted(
    store: &Arc<StoreBackend>,
    key: &'static [u8],
    params: &Params,
    requests: usize,
) -> usize {
    let calls = (0..requests).map(|_| {
        let (store, params) = (store.clone(), *params);
        tokio::spawn(async move {
            let decisions = store
                .apply(&[Charge::new(key, &params, 1)])
                .await
                .expect("Redis decides every request");
            decisions[0].is_allowed()
        })
    });
    let mut admitted = 0;
    for call in calls.collect::<Vec<_>>() {
        admitted += usize::from(call.await.unwrap());
    }
    admitted
}

/// The `tollgate_<sha1>` library this build loads.
fn library_name() -> String {
    let code = &decide_batch_library().code;
    let first = code.lines().next().unwrap();
    first.strip_prefix("#!lua name=").unwrap().to_owned()
}

/// `calls=` of `cmdstat_<command>` in `INFO commandstats`; 0 when the command never ran.
fn calls(stats: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// A single-server store, coalescing as `serve` does, ready to decide.
async fn connect(redis: &RedisServer) -> StoreBackend {
    open_ready(&redis.url(), Duration::from_secs(2)).await
}
