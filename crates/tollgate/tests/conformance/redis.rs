//! The suite on a single Redis server (with and without coalescing) and on a 3+3 Redis
//! Cluster, real servers started by the test kit.

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::SystemClock;
use tollgate::store::{CoalesceOptions, RedisOptions, RedisStore, Store, StoreBackend, StoreUrl};
use tollgate_testkit::{RedisCluster, RedisServer};

use super::{Backend, run_suite, wall_clock};

fn options() -> RedisOptions {
    // Generous deadlines: these tests check behaviour, not latency.
    RedisOptions {
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_redis_conforms() {
    single_redis(options()).await;
}

async fn single_redis(options: RedisOptions) {
    let server = Arc::new(RedisServer::start());
    run_suite(async || {
        server.cli(&["FLUSHALL"]);
        let clock = wall_clock();
        let url: StoreUrl = server.url().parse().unwrap();
        let store = RedisStore::connect(&url, options, clock.clone())
            .await
            .unwrap()
            .pin_clock(clock.clone());
        let server = server.clone();
        Backend {
            name: "redis",
            store: StoreBackend::Redis(Arc::new(store)),
            clock,
            redis_cli: Box::new(move |args| vec![server.cli(args)]),
        }
    })
    .await;
}

/// Decisions in flight together share script calls, and each still gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_share_script_calls() {
    let server = RedisServer::start();
    let url: StoreUrl = server.url().parse().unwrap();
    let store = RedisStore::connect(&url, options(), Arc::new(SystemClock::new()))
        .await
        .unwrap();
    let params = tollgate_core::Params::new(
        tollgate_core::Algorithm::FixedWindow,
        1,
        Duration::from_secs(60),
        None,
    )
    .unwrap();
    let keys: Vec<&'static str> = (0..200).map(|i| &*format!("k{i}").leak()).collect();
    let decide = |key: &'static str| {
        let charge = tollgate::store::Charge::new(key.as_bytes(), &params, 1);
        let store = &store;
        async move { store.apply(&[charge]).await.unwrap()[0] }
    };
    // Distinct keys with a limit of 1: every first request is allowed with 0 left, every second
    // one is denied, whatever batch it rode in.
    let first = futures_util::future::join_all(keys.iter().copied().map(decide)).await;
    assert!(first.iter().all(|d| d.is_allowed() && d.remaining == 0));
    let (batches, decisions) = store.batch_stats().unwrap();
    assert_eq!(decisions, 200);
    assert!(batches < 200, "{batches} script calls for 200 decisions");
    let again = futures_util::future::join_all(keys.iter().copied().map(decide)).await;
    assert!(again.iter().all(|d| !d.is_allowed()));
}

/// The same without coalescing: one script call per decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_redis_without_coalescing_conforms() {
    single_redis(RedisOptions {
        coalesce: CoalesceOptions {
            max_batch: 0,
            ..CoalesceOptions::default()
        },
        ..options()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_conforms() {
    let cluster = Arc::new(RedisCluster::start(3, 1));
    run_suite(async || {
        for port in cluster.primary_ports() {
            cluster.cli(port, &["FLUSHALL"]);
        }
        let clock = wall_clock();
        let url: StoreUrl = cluster.store_url().parse().unwrap();
        let store = RedisStore::connect(&url, options(), clock.clone())
            .await
            .unwrap()
            .pin_clock(clock.clone());
        let store = StoreBackend::Redis(Arc::new(store));
        assert!(
            store.wait_ready(Duration::from_secs(10)).await,
            "cluster connection"
        );
        let cluster = cluster.clone();
        Backend {
            name: "cluster",
            store,
            clock,
            redis_cli: Box::new(move |args| {
                cluster
                    .primary_ports()
                    .iter()
                    .map(|p| cluster.cli(*p, args))
                    .collect()
            }),
        }
    })
    .await;
}
