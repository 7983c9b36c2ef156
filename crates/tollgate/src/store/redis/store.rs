//! The store itself: its connections (one server, or a cluster's nodes through
//! [`ClusterRouter`]), its settings and counters, and the [`Store`] contract it answers.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_core::{Decision, Params};

use super::breaker::BreakerState;
use super::client::open_client;
use super::cluster::{self, ClusterRouter};
use super::coalesce::{Coalescer, Limits};
use super::error::store_error;
use super::load::load_scripts_on;
use super::now::{NowSource, ServerClock};
use super::options::{QUEUED_PER_IN_FLIGHT, RedisOptions};
use super::patience::Shed;
use super::script;
use super::timeout::within;
use super::topology::Topology;
use crate::clock::SharedClock;
use crate::store::{
    Answered, Call, Charge, Decisions, Failure, RedisCall, ShedReason, Store, StoreError, StoreUrl,
    Unsupported,
};

pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(Arc<ClusterRouter>),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Single(_) => "Single",
            Connection::Cluster(_) => "Cluster",
        })
    }
}

/// A Redis or Redis Cluster store.
#[derive(Debug)]
pub struct RedisStore {
    pub(super) connection: Connection,
    pub(super) topology: Arc<Topology>,
    pub(super) decide: redis::Script,
    pub(super) refund: redis::Script,
    pub(super) options: RedisOptions,
    pub(super) in_flight: Semaphore,
    /// Decisions waiting for a place under the in-flight cap.
    pub(super) waiting: AtomicUsize,
    /// Decisions the posture answered for load.
    pub(super) shed: Shed,
    /// Batches a single server's decisions; `None` on a cluster or when disabled.
    pub(super) coalescer: Option<Coalescer>,
    pub(super) background: Option<JoinHandle<()>>,
    /// The `now` of DECIDE calls: the server's `TIME` with the late-call guard, or (tests) a
    /// pinned clock's.
    pub(super) now: NowSource,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Some(task) = &self.background {
            task.abort();
        }
    }
}

impl RedisStore {
    /// Connects to the store named by `url` (which must be a Redis or cluster URL). `clock`
    /// drives the circuit breakers.
    ///
    /// Connections are opened lazily and re-opened with backoff: the service starts even while
    /// Redis is down, and the failure posture answers meanwhile.
    pub async fn connect(
        url: &StoreUrl,
        options: RedisOptions,
        clock: SharedClock,
    ) -> Result<Self, StoreError> {
        options.check().map_err(StoreError::InvalidOptions)?;
        let (connection, topology, background) = match url {
            StoreUrl::Memory => {
                return Err(StoreError::Unavailable(Failure::NotRedis));
            }
            StoreUrl::Redis(url) => {
                let client = open_client(url.as_str())
                    .map_err(|e| StoreError::Unavailable(Failure::InvalidUrl(e)))?;
                let node = client.get_connection_info().addr().to_string();
                let manager = ConnectionManager::new_lazy_with_config(
                    client,
                    cluster::manager_config(&options),
                )
                .map_err(|e| StoreError::Unavailable(Failure::NoConnection(e)))?;
                let topology = Arc::new(Topology::single(&node, options.breaker, clock));
                (Connection::Single(manager), topology, None)
            }
            StoreUrl::Cluster(seeds) => {
                for seed in seeds {
                    open_client(seed.as_str())
                        .map_err(|e| StoreError::Unavailable(Failure::InvalidSeedUrl(e)))?;
                }
                let topology = Arc::new(Topology::cluster(options.breaker, clock));
                let router = Arc::new(ClusterRouter::new(seeds.clone(), topology.clone(), options));
                let upkeep = Arc::downgrade(&router);
                let alive = upkeep.clone();
                let task = crate::background::supervise(
                    "redis_cluster_upkeep",
                    move || alive.strong_count() > 0,
                    move || cluster::maintain(upkeep.clone()),
                );
                (Connection::Cluster(router), topology, Some(task))
            }
        };
        let now = NowSource::Server(Arc::new(ServerClock::new(options.command_timeout)));
        let coalescer = match (&connection, topology.breaker_for(0)) {
            (Connection::Single(manager), Some(server)) if options.coalesce.enabled() => Some(
                Coalescer::start(manager.clone(), server, limits(&options), now.clone()),
            ),
            _ => None,
        };
        Ok(RedisStore {
            connection,
            coalescer,
            topology,
            decide: redis::Script::new(script::DECIDE_SCRIPT),
            refund: redis::Script::new(script::REFUND_SCRIPT),
            options,
            in_flight: Semaphore::new(options.max_in_flight),
            waiting: AtomicUsize::new(0),
            shed: Shed::default(),
            background,
            now,
        })
    }

    /// Loads the scripts on every primary, so that the first decisions after a start do not
    /// each pay for loading (and Redis for compiling) one within their deadline. Not on the
    /// request path: the store's first answer at startup calls it; a decision still loads a
    /// script a restarted Redis lacks.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        load_scripts_on(self.primaries()?).await
    }

    /// Whether this is a Redis Cluster (else one server).
    pub fn is_cluster(&self) -> bool {
        matches!(self.connection, Connection::Cluster(_))
    }

    pub(super) fn primaries(&self) -> Result<Vec<ConnectionManager>, StoreError> {
        match &self.connection {
            Connection::Single(m) => Ok(vec![m.clone()]),
            Connection::Cluster(router) => router.primary_connections(),
        }
    }

    /// The state of every node's circuit breaker.
    pub fn breakers(&self) -> Vec<(String, BreakerState)> {
        self.topology.states()
    }

    /// Decisions the failure posture answered for load so far (tollgate's queue full, waits
    /// past `max_wait`), not for a store failure.
    pub fn shed_for_load(&self) -> u64 {
        self.shed.count(ShedReason::QueueFull) + self.shed.count(ShedReason::WaitedTooLong)
    }

    /// Prometheus text for this store's own counters (`tollgate_store_shed_total`).
    pub fn render_metrics(&self, out: &mut String) {
        self.shed.render(out);
    }

    /// Coalescing so far: script calls sent and the decisions they carried (`None` when
    /// decisions are not coalesced).
    pub fn batch_stats(&self) -> Option<(u64, u64)> {
        self.coalescer.as_ref().map(Coalescer::stats)
    }

    /// Tests only: decide at this clock's time instead of the Redis server's.
    pub fn pin_clock(mut self, clock: SharedClock) -> Self {
        if let (Some(_), Connection::Single(manager), Some(server)) = (
            &self.coalescer,
            &self.connection,
            self.topology.breaker_for(0),
        ) {
            self.coalescer = Some(Coalescer::start(
                manager.clone(),
                server,
                limits(&self.options),
                NowSource::Pinned(clock.clone()),
            ));
        }
        self.now = NowSource::Pinned(clock);
        self
    }

    /// Checks that a limit can be decided exactly by the script (Lua numbers are doubles).
    pub fn supports(params: &Params) -> Result<(), script::InexactInLua> {
        script::fits_lua(params)
    }

    pub(super) fn connection_to(&self, node: &str) -> Result<ConnectionManager, StoreError> {
        match &self.connection {
            Connection::Single(manager) => Ok(manager.clone()),
            Connection::Cluster(router) => router.connection(node),
        }
    }
}

/// What the coalescer of a single server takes from the store's options.
fn limits(options: &RedisOptions) -> Limits {
    Limits {
        coalesce: options.coalesce,
        max_in_flight: options.max_in_flight,
        queue: options.max_in_flight.saturating_mul(QUEUED_PER_IN_FLIGHT),
        command_timeout: options.command_timeout,
        max_wait: options.max_wait,
    }
}

impl Store for RedisStore {
    async fn decide(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<Answered, StoreError> {
        decisions.clear();
        decisions.extend(self.decide_all(charges, call.mode.applies()).await?);
        Ok(Answered::Store)
    }

    async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        RedisStore::apply_before(self, charges, deadline).await
    }

    fn supports(&self, params: &Params) -> Result<(), Unsupported> {
        Ok(RedisStore::supports(params)?)
    }

    fn breakers(&self) -> Vec<(String, BreakerState)> {
        RedisStore::breakers(self)
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn description(&self) -> &'static str {
        if self.is_cluster() {
            "redis cluster"
        } else {
            "redis"
        }
    }

    async fn key_count(&self) -> Result<usize, StoreError> {
        let connections = self.primaries()?;
        // Not on the request path: a little more patience than a decision gets, but one
        // deadline for all the primaries, asked at once, well inside a readiness probe's
        // timeout (Kubernetes waits 1 s by default), however many primaries hang.
        let deadline = self
            .options
            .command_timeout
            .clamp(Duration::from_millis(100), Duration::from_millis(500));
        let counts = connections.into_iter().map(|mut connection| async move {
            redis::cmd("DBSIZE")
                .query_async::<usize>(&mut connection)
                .await
                .map_err(store_error)
        });
        let counts = futures_util::future::try_join_all(counts);
        let counts = within(Instant::now() + deadline, RedisCall::KeyCount, counts).await?;
        Ok(counts.into_iter().sum())
    }
}
