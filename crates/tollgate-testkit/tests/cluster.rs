//! The cluster half of the kit, against a real 3+3 Redis Cluster. One test in this binary, so the
//! `redis-server` children of this process are exactly the cluster's nodes.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::{port_is_free, process_exists, redis_children};
use tollgate_testkit::{NodeRole, RedisCluster, SLOT_COUNT, key_slot};

#[test]
fn three_plus_three_cluster_serves_fails_over_and_cleans_up() {
    let cluster = RedisCluster::start(3, 1);

    // Shape: 3 primaries covering every slot once, each with one replica.
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    let primaries: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == NodeRole::Primary)
        .collect();
    let replicas: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == NodeRole::Replica)
        .collect();
    assert_eq!(primaries.len(), 3);
    assert_eq!(replicas.len(), 3);
    assert_eq!(
        primaries.iter().map(|n| n.slot_count()).sum::<usize>(),
        usize::from(SLOT_COUNT)
    );
    for slot in [0, 5460, 5461, 10922, 10923, SLOT_COUNT - 1] {
        assert_eq!(primaries.iter().filter(|p| p.owns(slot)).count(), 1);
    }
    let primary_ports: BTreeSet<u16> = primaries.iter().map(|n| n.port).collect();
    let replicated: BTreeSet<u16> = replicas.iter().filter_map(|r| r.primary_port).collect();
    assert_eq!(replicated, primary_ports, "each primary has one replica");
    assert!(
        nodes
            .iter()
            .all(|n| n.running && !n.failed && n.port < 55_536)
    );
    assert_eq!(
        cluster.primary_ports(),
        primary_ports.into_iter().collect::<Vec<_>>()
    );
    assert_eq!(cluster.urls().len(), 6);
    assert_eq!(cluster.seed_url(), cluster.urls()[0]);
    for port in cluster.ports() {
        assert!(
            cluster
                .cli(port, &["CLUSTER", "INFO"])
                .contains("cluster_slots_assigned:16384")
        );
    }

    // Data: a key written through redirections is readable from any node and lives on its owner.
    let entry = cluster.ports()[0];
    let far = cluster.ports()[5];
    assert_eq!(
        cluster.cli(entry, &["-c", "SET", "greeting", "hello"]),
        "OK"
    );
    assert_eq!(cluster.cli(far, &["-c", "GET", "greeting"]), "hello");
    let slot = key_slot(b"greeting");
    assert_eq!(
        cluster.cli(entry, &["CLUSTER", "KEYSLOT", "greeting"]),
        slot.to_string()
    );
    let owner = cluster.node_for_slot(slot);
    assert_eq!(cluster.node_for_key("greeting"), owner);
    assert_eq!(cluster.cli(owner, &["GET", "greeting"]), "hello");
    // Replication is asynchronous: the write must have reached the replica before its primary
    // dies, or the new owner rightly holds nothing (a run failed so, `GET` answering "").
    assert_eq!(cluster.cli(owner, &["WAIT", "1", "5000"]), "1");

    // Failover: kill the owner, its replica takes over, the old primary rejoins as a replica.
    cluster.kill_node(owner);
    assert!(!cluster.is_running(owner));
    let new_owner = cluster.wait_for_slot_owner_change(slot, owner, Duration::from_secs(15));
    assert_ne!(new_owner, owner);
    assert_eq!(cluster.node_for_slot(slot), new_owner);
    assert_eq!(cluster.cli(new_owner, &["GET", "greeting"]), "hello");
    cluster.restart_node(owner);
    let rejoined = cluster
        .nodes()
        .into_iter()
        .find(|n| n.port == owner)
        .unwrap();
    assert_eq!(rejoined.role, NodeRole::Replica);
    assert_eq!(rejoined.primary_port, Some(new_owner));
    assert!(rejoined.running && !rejoined.failed);

    // Cleanup: no redis-server child survives the drop, no port stays taken.
    let pids: Vec<u32> = cluster
        .ports()
        .iter()
        .filter_map(|&p| cluster.pid(p))
        .collect();
    assert_eq!(pids.len(), 6);
    let mut children = redis_children();
    children.sort_unstable();
    let mut expected = pids.clone();
    expected.sort_unstable();
    assert_eq!(children, expected);
    let ports = cluster.ports();
    drop(cluster);
    assert_eq!(redis_children(), Vec::<u32>::new());
    assert!(pids.iter().all(|&pid| !process_exists(pid)));
    for port in ports {
        assert!(port_is_free(port) && port_is_free(port + 10_000));
    }
}
