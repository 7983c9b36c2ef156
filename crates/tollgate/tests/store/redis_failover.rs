//! A cluster failover: the promoted replica never saw our script (Redis replicates script
//! effects, not scripts), so the first call there answers NOSCRIPT, which must be absorbed.
//! And a request whose limits live in several slots, decided in two steps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::resilience::BreakerState;
use tollgate::store::{Charge, Store, StoreBackend};
use tollgate_core::{Algorithm, Params};
use tollgate_testkit::RedisCluster;

use super::redis_support::{hourly, open_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_resume_on_the_promoted_replica() {
    let cluster = RedisCluster::start(3, 1);
    let store = connect(&cluster, Duration::from_secs(2)).await;
    let params = hourly(Algorithm::TokenBucket, 1_000);
    let charge = one(b"failover", &params);
    assert!(store.apply(&charge).await.unwrap()[0].is_allowed());

    let (owner, _, slot) = home_of_the_only_key(&cluster);
    let slot: u16 = slot.parse().unwrap();
    cluster.kill_node(owner);
    let promoted = tokio::task::spawn_blocking({
        let cluster = std::sync::Arc::new(cluster);
        move || {
            let port = cluster.wait_for_slot_owner_change(slot, owner, Duration::from_secs(20));
            (cluster, port)
        }
    });
    let (cluster, promoted) = promoted.await.unwrap();
    assert_ne!(promoted, owner);
    let sha = redis::Script::new(tollgate::store::redis::script::DECIDE_SCRIPT)
        .get_hash()
        .to_owned();
    assert_eq!(
        cluster.cli(promoted, &["SCRIPT", "EXISTS", &sha]),
        "0",
        "the replica never loaded it"
    );

    // Requests may fail while the client learns the new topology, then all succeed.
    let mut recovered = false;
    for _ in 0..50 {
        if store.apply(&charge).await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "no decision within 5 s of the failover");
    assert_eq!(
        cluster.cli(promoted, &["SCRIPT", "EXISTS", &sha]),
        "1",
        "reloaded after NOSCRIPT"
    );
    for _ in 0..20 {
        let d = store
            .apply(&charge)
            .await
            .expect("every decision after recovery succeeds");
        assert!(d[0].is_allowed());
    }
}

/// A coordinated failover (`CLUSTER FAILOVER` on the replica) while traffic runs: the client
/// follows the MOVED redirects, absorbs NOSCRIPT on the new primary, and no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_under_traffic_fails_no_request() {
    let cluster = std::sync::Arc::new(RedisCluster::start(3, 1));
    let store = connect(&cluster, Duration::from_secs(5)).await;
    let store = Arc::new(store);
    let params = hourly(Algorithm::FixedWindow, 1_000_000);
    assert!(store.apply(&hot(&params)).await.unwrap()[0].is_allowed());

    let (owner, _, slot) = home_of_the_only_key(&cluster);
    let slot: u16 = slot.parse().unwrap();
    // The replica's view of its primary can lag the cluster's start by a moment: poll.
    let mut replica = None;
    for _ in 0..50 {
        replica = cluster
            .nodes()
            .into_iter()
            .find(|n| n.primary_port == Some(owner));
        if replica.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replica = replica
        .unwrap_or_else(|| panic!("no replica of {owner}: {:?}", cluster.nodes()))
        .port;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = tokio::spawn({
        let (store, stop) = (store.clone(), stop.clone());
        async move {
            let mut decided = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let d = store
                    .apply(&hot(&params))
                    .await
                    .expect("no request fails during the failover");
                assert!(d[0].is_allowed());
                decided += 1;
            }
            decided
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(cluster.cli(replica, &["CLUSTER", "FAILOVER"]), "OK");
    let promoted = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || cluster.wait_for_slot_owner_change(slot, owner, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(promoted, replica);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let decided = traffic.await.unwrap();
    assert!(decided > 20, "traffic ran throughout ({decided} decisions)");
    let sha = redis::Script::new(tollgate::store::redis::script::DECIDE_SCRIPT)
        .get_hash()
        .to_owned();
    assert_eq!(
        cluster.cli(promoted, &["SCRIPT", "EXISTS", &sha]),
        "1",
        "loaded on the new primary"
    );
}

/// While a slot migrates (resharding), a counter already moved to the importing node is
/// answered there: the old owner replies ASK, and the call is sent again to the new one behind
/// `ASKING`, with the count carried on. Before, every such decision took the failure posture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_in_a_migrating_slot_follows_the_ask_redirect() {
    let cluster = RedisCluster::start(3, 0);
    let store = connect(&cluster, Duration::from_secs(2)).await;
    let params = hourly(Algorithm::FixedWindow, 1_000);
    let charge = one(b"migrating", &params);
    assert_eq!(store.apply(&charge).await.unwrap()[0].remaining, 999);

    let (owner, key, slot) = home_of_the_only_key(&cluster);
    let target = other_primary(&cluster, owner);
    begin_migration(&cluster, &slot, owner, target);
    let port = target.to_string();
    cluster.cli(
        owner,
        &["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &key],
    );
    assert!(cluster.cli(owner, &["--scan"]).trim().is_empty(), "moved");

    let decided = store.apply(&charge).await.unwrap();
    assert_eq!(decided[0].remaining, 998, "counted on the importing node");
    assert!(cluster.cli(target, &["--scan"]).contains("migrating"));
}

/// Two counters of one request in one slot, caught by a migration between them: the old owner
/// holds one and the importing node the other, so each answers `TRYAGAIN`. That is no failure
/// of the node: the call is made again until the migration moves the rest, within the
/// decision's deadline, and the node's breaker stays closed. Before, the request took its
/// failure posture at once, and enough of them opened the old owner's breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_counters_split_by_a_migration_wait_for_it_to_finish() {
    let cluster = RedisCluster::start(3, 0);
    let store = connect(&cluster, Duration::from_secs(2)).await;
    let params = hourly(Algorithm::FixedWindow, 1_000);
    let mut first_in_slot = std::collections::HashMap::new();
    let (a, b) = (0u32..)
        .map(|i| format!("pair-{i}"))
        .find_map(|key| {
            let slot = tollgate::store::redis::counter_slot(key.as_bytes());
            first_in_slot
                .insert(slot, key.clone())
                .map(|other| (other, key))
        })
        .unwrap();
    let both = |cost| [a.as_bytes(), b.as_bytes()].map(|key| Charge::new(key, &params, cost));
    let decided = store.apply(&both(1)).await.unwrap();
    assert_eq!((decided[0].remaining, decided[1].remaining), (999, 999));

    let (owner, _, slot) = home_of_the_only_key(&cluster);
    let target = other_primary(&cluster, owner);
    let target_id = begin_migration(&cluster, &slot, owner, target);
    let keys: Vec<String> = cluster
        .cli(owner, &["--scan"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    let port = target.to_string();
    let migrate = |key: &str| {
        cluster.cli(
            owner,
            &["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", key],
        )
    };
    migrate(&keys[0]);

    let store = Arc::new(store);
    let request = tokio::spawn({
        let store = store.clone();
        let (a, b, params) = (a.clone(), b.clone(), params);
        async move {
            let charges = [a.as_bytes(), b.as_bytes()].map(|key| Charge::new(key, &params, 1));
            store
                .apply(&charges)
                .await
                .map(|d| (d[0].remaining, d[1].remaining))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!request.is_finished(), "waits while the keys are split");
    migrate(&keys[1]);
    for port in cluster.primary_ports() {
        cluster.cli(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
    }
    assert_eq!(request.await.unwrap().unwrap(), (998, 998));
    let node = format!("127.0.0.1:{owner}");
    assert!(
        store
            .breakers()
            .iter()
            .all(|(n, state)| *n != node || *state == BreakerState::Closed),
        "{:?}",
        store.breakers()
    );
}

/// A slot moved to a node that then hangs: the old owner answers `MOVED`, and the timeouts
/// that follow are the new owner's failures. Before, they were charged to the node that
/// redirected, whose breaker opened and shed every other slot it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_after_a_redirect_open_the_breaker_of_the_node_redirected_to() {
    let cluster = RedisCluster::start(3, 0);
    let store = Arc::new(connect(&cluster, Duration::from_millis(200)).await);
    let params = hourly(Algorithm::FixedWindow, 1_000);
    assert!(store.apply(&one(b"moving", &params)).await.unwrap()[0].is_allowed());
    let (owner, key, slot) = home_of_the_only_key(&cluster);
    let target = other_primary(&cluster, owner);
    let target_id = node_id(&cluster, target);
    cluster.cli(owner, &["DEL", &key]);
    // The slot is the target's from now on; the store's map still says `owner` (it is read
    // again every second, or at once after a MOVED), and the target stops answering.
    cluster.cli(target, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
    cluster.cli(owner, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
    cluster.cli(target, &["CLIENT", "PAUSE", "1500", "ALL"]);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.apply(&one(b"moving", &params)).await.is_err() })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap(), "the new owner hangs: no decision");
    }
    let state_of = |port: u16| {
        let node = format!("127.0.0.1:{port}");
        store
            .breakers()
            .into_iter()
            .find(|(n, _)| *n == node)
            .map(|(_, state)| state)
    };
    assert_eq!(
        state_of(target),
        Some(BreakerState::Open),
        "the hung node's breaker"
    );
    assert_eq!(
        state_of(owner),
        Some(BreakerState::Closed),
        "the node that redirected answered"
    );
    // The other nodes' slots are still decided.
    let mut decided = 0;
    for i in 0..200 {
        let key = format!("other-{i}");
        if store.apply(&one(key.as_bytes(), &params)).await.is_ok() {
            decided += 1;
        }
    }
    assert!(
        decided > 100,
        "{decided} of 200 decided: only the target's slots may fail"
    );
}

/// A request whose limits live in different slots, denied by one of them, charges none, and
/// the limit that allowed answers with its figures as they stand (as one slot's script answers
/// for a request it denies itself), not as after the charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_denied_across_slots_reports_the_allowed_limit_as_it_stands() {
    let cluster = RedisCluster::start(3, 0);
    let store = connect(&cluster, Duration::from_secs(2)).await;
    let port = cluster.primary_ports()[0];
    let slot = |key: &str| cluster.cli(port, &["CLUSTER", "KEYSLOT", key]);
    assert_ne!(slot("wide"), slot("narrow"));
    let wide = hourly(Algorithm::FixedWindow, 10);
    let narrow = hourly(Algorithm::FixedWindow, 1);
    let charge = |key: &'static str, params, cost| Charge::new(key.as_bytes(), params, cost);
    store.apply(&[charge("narrow", &narrow, 1)]).await.unwrap();
    store.apply(&[charge("wide", &wide, 4)]).await.unwrap();
    let denied = store
        .apply(&[charge("wide", &wide, 3), charge("narrow", &narrow, 1)])
        .await
        .unwrap();
    assert!(!denied[1].is_allowed());
    assert!(denied[0].is_allowed());
    assert_eq!(denied[0].remaining, 6, "4 of 10 used, and nothing charged");
    let alone = store.apply(&[charge("wide", &wide, 1)]).await.unwrap();
    assert_eq!(alone[0].remaining, 5);
}

/// A cluster store through one seed node, ready to decide.
async fn connect(cluster: &RedisCluster, command_timeout: Duration) -> StoreBackend {
    let seed = cluster.seed_url();
    let url = format!("redis+cluster://{}", seed.trim_start_matches("redis://"));
    open_ready(&url, command_timeout).await
}

/// Where the cluster's only key lives: its primary's port, the key, and its slot.
fn home_of_the_only_key(cluster: &RedisCluster) -> (u16, String, String) {
    let owner = cluster
        .primary_ports()
        .into_iter()
        .find(|p| !cluster.cli(*p, &["--scan"]).is_empty())
        .expect("a node holds the key");
    let key = cluster.cli(owner, &["--scan"]).trim().to_owned();
    let slot = cluster
        .cli(owner, &["CLUSTER", "KEYSLOT", &key])
        .trim()
        .to_owned();
    (owner, key, slot)
}

/// A primary other than `port`.
fn other_primary(cluster: &RedisCluster, port: u16) -> u16 {
    cluster
        .primary_ports()
        .into_iter()
        .find(|p| *p != port)
        .expect("another primary")
}

/// Starts moving `slot` from `owner` to `target` (importing there, migrating here), as a
/// resharding tool does before it moves the keys; returns the target's node id.
fn begin_migration(cluster: &RedisCluster, slot: &str, owner: u16, target: u16) -> String {
    let (owner_id, target_id) = (node_id(cluster, owner), node_id(cluster, target));
    cluster.cli(
        target,
        &["CLUSTER", "SETSLOT", slot, "IMPORTING", &owner_id],
    );
    cluster.cli(
        owner,
        &["CLUSTER", "SETSLOT", slot, "MIGRATING", &target_id],
    );
    target_id
}

fn node_id(cluster: &RedisCluster, port: u16) -> String {
    cluster.cli(port, &["CLUSTER", "MYID"]).trim().to_owned()
}

/// One charge of 1 on `key`.
fn one<'a>(key: &'a [u8], params: &'a Params) -> [Charge<'a>; 1] {
    [Charge::new(key, params, 1)]
}

fn hot(params: &Params) -> [Charge<'_>; 1] {
    one(b"hot-key", params)
}
