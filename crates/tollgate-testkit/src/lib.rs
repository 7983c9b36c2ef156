//! Test-only kit for tollgate: real `redis-server` processes and Redis Clusters on free loopback
//! ports, always cleaned up.
//!
//! Servers run with no persistence in their own temporary directories. Dropping a
//! [`RedisServer`] or [`RedisCluster`] ends its processes (`SIGTERM`, then `SIGKILL`), reaps them
//! and removes the directories, also when the test panics. The API is synchronous, so it works
//! from `#[test]` and `#[tokio::test]` alike (its calls block the thread).
//!
//! When `redis-server` is not installed, the kit panics with how to install it: tests that need
//! Redis fail rather than skip.
//!
//! ```
//! use tollgate_testkit::RedisServer;
//!
//! let redis = RedisServer::start();
//! assert!(redis.url().starts_with("redis://127.0.0.1:"));
//! assert_eq!(redis.cli(&["SET", "greeting", "hello"]), "OK");
//! assert_eq!(redis.cli(&["GET", "greeting"]), "hello");
//!
//! redis.restart(); // same port, empty data set
//! assert_eq!(redis.cli(&["GET", "greeting"]), "");
//! // Dropping `redis` ends the process and removes its directory.
//! ```
//!
//! A cluster of three primaries with one replica each:
//!
//! ```no_run
//! use tollgate_testkit::RedisCluster;
//!
//! let cluster = RedisCluster::start(3, 1);
//! let seeds = cluster.urls(); // hand these to a cluster client
//! assert_eq!(cluster.primary_ports().len(), 3);
//! assert_eq!(cluster.cli(cluster.ports()[0], &["-c", "SET", "k", "v"]), "OK");
//! ```

// This is a test-only crate: when Redis cannot be started or does not behave, the test using it
// must fail loudly, so panicking (`expect`, `panic!`) is the kit's error handling.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod binary;
mod captured;
mod cluster;
mod deadline;
mod node;
mod port;
pub mod prometheus;
mod proxy;
mod resp;
mod server;
mod slot;

pub use binary::{installed_binary, redis_binary, redis_cli_binary};
pub use captured::CapturedLogs;
pub use cluster::{
    ClusterNode, DEFAULT_CLUSTER_TIMEOUT, NodeRole, RedisCluster, RedisClusterBuilder,
};
pub use prometheus::sample as metric_sample;
pub use proxy::{FaultProxy, Mode};
pub use server::{DEFAULT_READY_TIMEOUT, RedisServer, RedisServerBuilder};
pub use slot::{SLOT_COUNT, key_slot};
