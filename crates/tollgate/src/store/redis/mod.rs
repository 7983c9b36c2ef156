//! Redis and Redis Cluster backends: one Lua script call decides and charges all of a
//! request's limits that live on one node.
//!
//! - Keys are tagged by the service ([`slot`]), so each counter lives on one slot and a client
//!   value can never choose it.
//! - The script ([`script`]) reads `TIME` on the server, so replicas with skewed clocks agree.
//!   It is run with `EVALSHA`; `NOSCRIPT` (restart, `SCRIPT FLUSH`, failover) reloads it and
//!   retries transparently.
//! - Every decision has one deadline for all its store calls, from when they are sent (the
//!   refunds of a cross-slot request that failed get one more each, so a slow node cannot
//!   leave the other slots' charges standing by using the first up); a call past it fails
//!   unless its node is busy answering others ([`patience`]: a burst is not a store failure);
//!   connections are multiplexed and reconnect with backoff; calls in flight are capped, and
//!   the excess waits its turn (on one server, joining larger batches), up to `max_wait`.
//! - A circuit breaker per node ([`topology`]) stops calling a sick node; the limiter's
//!   failure posture answers instead. On a cluster, tollgate routes to each node over its own
//!   connection ([`cluster`]) so that one dead primary cannot stall the others' slots.
//!
//! ## All-or-nothing on a cluster
//!
//! On one Redis server a request is one atomic script call. On a cluster, a request whose
//! counters span several slots is decided in two steps: first every slot is asked without
//! writing; if any enforced limit denies, the request is denied and nothing is written
//! anywhere. Otherwise every slot charges in its own atomic call; if a concurrent request took
//! the last quota of one slot in between, that slot denies and the slots that charged are
//! refunded; so are they when another slot's charge fails. A refund is exact when nothing else
//! charged that counter in between and never credits more than was charged, so the race can
//! only under-admit, by at most the request's own cost, never over-admit. (A refund gives back
//! what the script says it charged: for a limit that charges up to itself, what was left.)

mod client;
mod cluster;
mod coalesce;
mod cross_slot;
mod decide;
mod error;
mod in_flight;
mod leases;
mod load;
mod now;
mod patience;
mod route;
pub mod script;
mod shared_overrides;
mod shared_policy;
mod slot;
mod store;
mod timeout;
mod topology;

// The breaker and the settings live beside this module: they are not Redis's alone (the
// breaker's states are every store's health, and the settings a memory store ignores can
// be built without a Redis client); named here for the files below.
pub(super) use super::breaker;
pub(super) use super::redis_options as options;

pub use self::breaker::{Breaker, BreakerConfig, BreakerState, Permit};
pub use self::now::LATE_SLACK;
pub use self::options::{
    CoalesceOptions, DEFAULT_MAX_WAIT, MAX_SETTING, QUEUED_PER_IN_FLIGHT, RedisOptions,
};
pub use self::shared_overrides::{SharedOverride, SharedOverrideChange, SharedOverrides};
pub use self::shared_policy::{LEGACY_OVERRIDES_KEY, POLICY_KEY, SharedPolicy, Stamp};
pub use self::slot::counter_slot;
pub use self::store::RedisStore;
pub use super::redis_invalid_options::{InvalidOptions, OptionsProblem};
