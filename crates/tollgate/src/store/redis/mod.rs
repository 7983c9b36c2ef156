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

mod breaker;
mod cluster;
mod coalesce;
mod cross_slot;
mod error;
mod leases;
mod now;
mod options;
mod patience;
pub mod script;
mod shared_overrides;
mod shared_policy;
mod slot;
mod topology;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use smallvec::SmallVec;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_core::{Decision, Params, Verdict};

use self::breaker::Logged;
pub use self::breaker::{Breaker, BreakerConfig, BreakerState, Permit};
use self::cluster::ClusterRouter;
pub use self::coalesce::CoalesceOptions;
use self::coalesce::{Coalescer, Limits, Request};
use self::error::{store_error, timed_out, unavailable};
pub use self::now::LATE_SLACK;
use self::now::{NowSource, ServerClock};
pub use self::options::{
    DEFAULT_MAX_WAIT, InvalidOptions, MAX_SETTING, QUEUED_PER_IN_FLIGHT, RedisOptions,
};
use self::patience::{Deadline, Shed, ShedReason, Unanswered};
use self::script::decide_args;
pub use self::shared_overrides::{SharedOverride, SharedOverrideChange, SharedOverrides};
pub use self::shared_policy::{LEGACY_OVERRIDES_KEY, POLICY_KEY, SharedPolicy, Stamp};
use self::topology::Topology;
use super::url::StoreUrl;
use super::{Charge, Decisions, INLINE_CHARGES, Mode, Store, StoreError, Unsupported};
use crate::clock::SharedClock;

enum Connection {
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
    connection: Connection,
    topology: Arc<Topology>,
    decide: redis::Script,
    refund: redis::Script,
    options: RedisOptions,
    in_flight: Semaphore,
    /// Decisions waiting for a place under the in-flight cap.
    waiting: AtomicUsize,
    /// Decisions the posture answered for load.
    shed: Shed,
    /// Batches a single server's decisions; `None` on a cluster or when disabled.
    coalescer: Option<Coalescer>,
    background: Option<JoinHandle<()>>,
    /// The `now` of DECIDE calls: the server's `TIME` with the late-call guard, or (tests) a
    /// pinned clock's.
    now: NowSource,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Some(task) = &self.background {
            task.abort();
        }
    }
}

/// A client for `url` whose connections send at once (`TCP_NODELAY`). The redis crate leaves
/// Nagle's algorithm on, which may hold a pipelined call back until the previous one is
/// acknowledged; coalescing keeps several calls in flight on one connection.
fn open_client(url: &str) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = url
        .into_connection_info()?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    redis::Client::open(info)
}

/// Runs `invocation` behind `ASKING` (one pipeline, so nothing else runs between them on the
/// shared connection), loading the script first if the node lacks it.
async fn invoke_asking<T: redis::FromRedisValue>(
    connection: &mut ConnectionManager,
    invocation: &redis::ScriptInvocation<'_>,
) -> redis::RedisResult<T> {
    let mut asking = redis::pipe();
    asking.cmd("ASKING").ignore().invoke_script(invocation);
    match asking.query_async::<(T,)>(connection).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            invocation.load_async(connection).await?;
            asking.query_async::<(T,)>(connection).await.map(|(t,)| t)
        }
        answer => answer.map(|(t,)| t),
    }
}

/// The Redis Cluster slot of the counter a limiter names `counter_key` (see [`slot`]).
pub fn counter_slot(counter_key: &[u8]) -> u16 {
    slot::redis_key(&mut Vec::new(), counter_key)
}

/// A decision counted among those waiting for a place under the in-flight cap while it lives.
struct Waiting<'a> {
    count: &'a AtomicUsize,
    /// How many were waiting before it.
    ahead: usize,
}

impl<'a> Waiting<'a> {
    fn join(count: &'a AtomicUsize) -> Self {
        let ahead = count.fetch_add(1, Ordering::Relaxed);
        Waiting { count, ahead }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `MOVED` and `ASK` redirects followed within one call.
const MAX_REDIRECTS: usize = 3;

/// One script call's worth of charges: indexes into the request's charges, all on `slot`.
#[derive(Clone)]
struct Group {
    slot: u16,
    indexes: Vec<usize>,
}

/// What one DECIDE call answered.
struct Reply {
    now_micros: i64,
    admitted: bool,
    decisions: Vec<Decision>,
    /// Per decision, the units it takes (see the DECIDE reply in [`script`]).
    charged: SmallVec<[u64; INLINE_CHARGES]>,
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
        options
            .check()
            .map_err(|e| StoreError::InvalidOptions(e.to_string()))?;
        let (connection, topology, background) = match url {
            StoreUrl::Memory => {
                return Err(StoreError::Unavailable("memory is not a Redis URL".into()));
            }
            StoreUrl::Redis(url) => {
                let client =
                    open_client(url.as_str()).map_err(|e| unavailable("invalid Redis URL", e))?;
                let node = client.get_connection_info().addr().to_string();
                let manager = ConnectionManager::new_lazy_with_config(
                    client,
                    cluster::manager_config(&options),
                )
                .map_err(|e| unavailable("cannot create Redis connection", e))?;
                let topology = Arc::new(Topology::single(&node, options.breaker, clock));
                (Connection::Single(manager), topology, None)
            }
            StoreUrl::Cluster(seeds) => {
                for seed in seeds {
                    open_client(seed.as_str())
                        .map_err(|e| unavailable("invalid cluster seed URL", e))?;
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

    fn primaries(&self) -> Result<Vec<ConnectionManager>, StoreError> {
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

    fn connection_to(&self, node: &str) -> Result<ConnectionManager, StoreError> {
        match &self.connection {
            Connection::Single(manager) => Ok(manager.clone()),
            Connection::Cluster(router) => router.connection(node),
        }
    }

    /// The node that owns `slot`, with its breaker; refused before calling when none does.
    fn owner_of(&self, slot: u16) -> Result<(Arc<str>, Arc<Breaker>), StoreError> {
        self.topology
            .breaker_for(slot)
            .ok_or_else(|| StoreError::NotCalled(format!("no known node serves slot {slot}")))
    }

    /// Runs a script invocation on the node that owns `slot`, following `MOVED` and `ASK`
    /// redirects; its reply read as a `T` (DECIDE answers a list of integers, REFUND one
    /// integer). Each node called goes through its own breaker: a node that redirects answered,
    /// and a failure after a redirect is the failure of the node redirected to.
    ///
    /// A `TRYAGAIN` (keys of one call split between the two nodes of a migrating slot) is an
    /// answer too: the call is made again from the slot's owner every millisecond, until the
    /// migration has moved the rest or the caller's deadline cuts it.
    async fn invoke_on_slot<T: redis::FromRedisValue>(
        &self,
        slot: u16,
        invocation: &redis::ScriptInvocation<'_>,
        deadline: Deadline,
    ) -> Result<T, StoreError> {
        let (mut node, mut breaker) = self.owner_of(slot)?;
        let mut asking = false;
        let mut redirects = 0;
        loop {
            let call = async {
                let mut connection = self.connection_to(&node)?;
                let answer = if asking {
                    invoke_asking(&mut connection, invocation).await
                } else {
                    invocation.invoke_async::<T>(&mut connection).await
                };
                match answer {
                    Ok(reply) => Ok(Ok(reply)),
                    Err(e) if !matches!(self.connection, Connection::Cluster(_)) => {
                        Err(store_error(e))
                    }
                    // A redirect is an answer: the node is fine, the slot is elsewhere.
                    Err(e) => match e.redirect_node() {
                        Some((to, moved_slot)) => {
                            let ask =
                                e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask);
                            Ok(Err(Some((to.to_owned(), moved_slot, ask))))
                        }
                        None if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain) =>
                        {
                            Ok(Err(None))
                        }
                        None => Err(store_error(e)),
                    },
                }
            };
            let (to, moved_slot, ask) = match self.through(&node, &breaker, deadline, call).await? {
                Ok(reply) => return Ok(reply),
                Err(Some(redirect)) => redirect,
                Err(None) => {
                    if Instant::now() >= deadline.at {
                        return Err(timed_out(&node, "deadline exceeded (slot migrating)"));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    // From the owner again: an `ASK` that led to the `TRYAGAIN` is no
                    // redirect followed too many.
                    (node, breaker) = self.owner_of(slot)?;
                    (asking, redirects) = (false, 0);
                    continue;
                }
            };
            // During a failover the slot can move twice (old primary -> promoting replica):
            // follow a few redirects, all within the decision's deadline.
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return Err(StoreError::Unavailable(format!(
                    "slot {slot}: more than {MAX_REDIRECTS} redirects"
                )));
            }
            asking = ask;
            if !asking {
                self.topology.moved(moved_slot, &to);
                if let Connection::Cluster(router) = &self.connection {
                    router.refresh_soon();
                }
            }
            // A migrating slot (`ASK`) is asked on `to` this once, the map unchanged until the
            // migration ends with a `MOVED`.
            (node, breaker) = self.topology.owner(&to);
        }
    }

    /// Runs `call` through `node`'s `breaker`: refused at once while it is open, and its outcome
    /// recorded (bad data is no failure of the node). The call waits as [`patience`] says: it
    /// fails at `deadline` (a failure of the node) unless the node is busy answering others,
    /// and is given up for load at the ceiling (no failure); a cancelled permit counts as a
    /// failure.
    async fn through<T>(
        &self,
        node: &str,
        breaker: &Arc<Breaker>,
        deadline: Deadline,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let permit = breaker
            .try_call()
            .ok_or_else(|| StoreError::NotCalled(format!("circuit open for {node}")))?;
        let mut permit = Logged::new(node, permit);
        let sent = Instant::now();
        match patience::patiently(deadline, (node, breaker), sent, 1, call).await {
            Ok(answer) => {
                permit.record(matches!(answer, Ok(_) | Err(StoreError::InvalidData(_))));
                answer
            }
            // Dropped unreported: a failure.
            Err(Unanswered::Stalled) => Err(timed_out(node, "deadline exceeded")),
            Err(Unanswered::TooLong) => {
                permit.release();
                Err(self.shed.shed(ShedReason::WaitedTooLong))
            }
        }
    }

    async fn run_decide(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        group: &Group,
        commit: bool,
        deadline: Deadline,
    ) -> Result<Reply, StoreError> {
        if let Some(coalescer) = &self.coalescer {
            let charges = group.indexes.iter().map(|&i| &charges[i]);
            return self.coalesced(coalescer, charges, commit, deadline).await;
        }
        let mut invocation = self.decide.prepare_invoke();
        for &i in &group.indexes {
            invocation.key(&keys[spans[i].clone()]);
        }
        invocation.arg(if commit { "1" } else { "0" });
        invocation.arg(self.now.argument_since(deadline.guard_since()));
        for &i in &group.indexes {
            invocation.arg(&decide_args(&charges[i])[..]);
        }
        let raw = self.invoke_on_slot(group.slot, &invocation, deadline).await;
        self.replied(raw, group.indexes.iter().map(|&i| &charges[i]))
    }

    /// Decides `charges` as one entry of a coalesced batch (one server only). The batch goes
    /// through the breaker and the store's deadline from when it is sent; the wait in the
    /// queue is bounded by `deadline`'s ceiling alone, and is no failure of the store.
    async fn coalesced<'a>(
        &self,
        coalescer: &Coalescer,
        charges: impl ExactSizeIterator<Item = &'a Charge<'a>> + Clone,
        commit: bool,
        deadline: Deadline,
    ) -> Result<Reply, StoreError> {
        let mut request = Request::new(commit, charges.len());
        for c in charges.clone() {
            request.push(c);
        }
        let place = coalescer
            .place()
            .ok_or_else(|| self.shed.shed(ShedReason::QueueFull))?;
        let raw = tokio::time::timeout_at(deadline.ceiling, place.decide(request))
            .await
            .unwrap_or_else(|_| Err(self.shed.shed(ShedReason::WaitedTooLong)));
        self.replied(raw, charges)
    }

    /// A DECIDE call's answer, its `now` taken in (or its late refusal: see [`now`]).
    fn replied<'a>(
        &self,
        raw: Result<Vec<i64>, StoreError>,
        charges: impl ExactSizeIterator<Item = &'a Charge<'a>>,
    ) -> Result<Reply, StoreError> {
        let raw = raw.inspect_err(|e| self.now.failed(e))?;
        let reply = parse_reply(&raw, charges)?;
        self.now.learn(reply.now_micros);
        Ok(reply)
    }

    /// Decides `charges` with one script call per slot they live in, each within `deadline`
    /// (see [`RedisStore::apply_across_slots`] for several).
    async fn apply_by_slot(
        &self,
        charges: &[Charge<'_>],
        keys: &[u8],
        spans: &[Range<usize>],
        slots: &[u16],
        commit: bool,
        deadline: Deadline,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut groups: Vec<Group> = Vec::new();
        // One server holds every slot (all 0 here): one call covers the whole request.
        for (i, &slot) in slots.iter().enumerate() {
            match groups.iter_mut().find(|g| g.slot == slot) {
                Some(g) => g.indexes.push(i),
                None => groups.push(Group {
                    slot,
                    indexes: vec![i],
                }),
            }
        }
        if let [only] = groups.as_slice() {
            let decide = self.run_decide(charges, keys, spans, only, commit, deadline);
            return Ok(within(deadline.ceiling, "redis", decide).await?.decisions);
        }
        self.apply_across_slots(charges, keys, spans, &groups, commit, deadline)
            .await
    }
}

/// Loads the decision scripts on each of `primaries`, one pipeline each, within 5 s: at
/// startup (see [`RedisStore::load_scripts`]) and on a primary new to a cluster's slot map (a
/// promoted replica has none: Redis does not replicate its script cache).
pub(super) async fn load_scripts_on(primaries: Vec<ConnectionManager>) -> Result<(), StoreError> {
    let scripts = [
        script::DECIDE_SCRIPT,
        script::DECIDE_BATCH_SCRIPT,
        script::REFUND_SCRIPT,
    ];
    let mut load = redis::pipe();
    for text in scripts {
        load.cmd("SCRIPT").arg("LOAD").arg(text);
    }
    // Redis compiles each script as it loads it: a busy machine takes a while.
    let deadline = Instant::now() + Duration::from_secs(5);
    let loads = primaries.into_iter().map(|mut connection| {
        let load = &load;
        async move {
            // The connection may give up on a command before a busy Redis has compiled it; it
            // compiles on regardless, and a second load finds the script cached. So load
            // again until the deadline.
            loop {
                let error = match load.query_async::<Vec<String>>(&mut connection).await {
                    Ok(_) => return Ok(()),
                    Err(e) => store_error(e),
                };
                if Instant::now() + SCRIPT_LOAD_RETRY >= deadline {
                    return Err(error);
                }
                tokio::time::sleep(SCRIPT_LOAD_RETRY).await;
            }
        }
    });
    let loads = futures_util::future::try_join_all(loads);
    within(deadline, "redis SCRIPT LOAD", loads).await?;
    Ok(())
}

/// Pause between two loads of the scripts on a primary that did not answer the first in time.
const SCRIPT_LOAD_RETRY: Duration = Duration::from_millis(50);

/// `work`'s answer, or once `deadline` has passed, the failure of `what` (a node, a kind of
/// call) to answer in time.
async fn within<T>(
    deadline: Instant,
    what: &str,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout_at(deadline, work).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(what, "deadline exceeded")),
    }
}

fn parse_reply<'a>(
    raw: &[i64],
    charges: impl ExactSizeIterator<Item = &'a Charge<'a>>,
) -> Result<Reply, StoreError> {
    let n = charges.len();
    if raw.len() != 2 + 6 * n {
        return Err(StoreError::InvalidData(format!(
            "script answered {} numbers for {n} charges",
            raw.len()
        )));
    }
    let micros = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
    let per_charge = raw[2..].chunks_exact(6);
    let charged = per_charge
        .clone()
        .map(|r| u64::try_from(r[5]).unwrap_or(0))
        .collect();
    let decisions = charges
        .zip(per_charge)
        .map(|(charge, r)| {
            let verdict = match r[0] {
                0 => Verdict::Allowed,
                1 => Verdict::Denied,
                2 => Verdict::CostExceedsCapacity,
                other => {
                    return Err(StoreError::InvalidData(format!("unknown verdict {other}")));
                }
            };
            Ok(Decision {
                verdict,
                limit: charge.params.limit(),
                remaining: u64::try_from(r[1]).unwrap_or(0),
                reset_after: micros(r[2]),
                retry_after: (r[3] >= 0).then(|| micros(r[3])),
                delay: micros(r[4]),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Reply {
        now_micros: raw[0],
        admitted: raw[1] == 1,
        decisions,
        charged,
    })
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

impl RedisStore {
    /// The deadline of a decision beginning now.
    fn deadline(&self) -> Deadline {
        Deadline::starting(self.options.command_timeout, self.options.max_wait)
    }

    /// Runs the store work `work` makes under the in-flight cap and within the deadline of a
    /// decision beginning now.
    async fn bounded<T, F>(&self, work: impl FnOnce(Deadline) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let (_in_flight, deadline) = self.in_flight_place(self.deadline()).await?;
        within(deadline.ceiling, "redis", work(deadline)).await
    }

    /// A place under the in-flight cap, and the decision's deadline from when it got it. Past
    /// the cap a decision waits its turn, up to its ceiling (or sheds at once when
    /// [`QUEUED_PER_IN_FLIGHT`] times the cap already wait): a burst is not a store failure.
    async fn in_flight_place(
        &self,
        deadline: Deadline,
    ) -> Result<(tokio::sync::SemaphorePermit<'_>, Deadline), StoreError> {
        if let Ok(permit) = self.in_flight.try_acquire() {
            return Ok((permit, deadline));
        }
        let queue = self
            .options
            .max_in_flight
            .saturating_mul(QUEUED_PER_IN_FLIGHT);
        let waiting = Waiting::join(&self.waiting);
        if waiting.ahead >= queue {
            return Err(self.shed.shed(ShedReason::QueueFull));
        }
        match tokio::time::timeout_at(deadline.ceiling, self.in_flight.acquire()).await {
            Ok(Ok(permit)) => Ok((permit, deadline.sent())),
            Ok(Err(_)) => Err(StoreError::NotCalled("redis store closed".into())),
            Err(_) => Err(self.shed.shed(ShedReason::WaitedTooLong)),
        }
    }

    async fn decide_all(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        for c in charges {
            script::fits_lua(c.params).map_err(|e| StoreError::InvalidData(e.to_string()))?;
        }
        if let Some(coalescer) = &self.coalescer {
            // One server: the whole request is one entry of a batch; the coalescer's queue
            // holds those past the in-flight cap.
            let decide = self.coalesced(coalescer, charges.iter(), commit, self.deadline());
            return decide.await.map(|reply| reply.decisions);
        }
        self.decide_by_slot(charges, commit, self.deadline()).await
    }

    /// Decides `charges` with one script call per slot they live in, within `deadline`.
    async fn decide_by_slot(
        &self,
        charges: &[Charge<'_>],
        commit: bool,
        deadline: Deadline,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut keys = Vec::with_capacity(charges.len() * 96);
        let mut spans = Vec::with_capacity(charges.len());
        let mut slots = Vec::with_capacity(charges.len());
        for c in charges {
            let start = keys.len();
            slots.push(self.key_and_slot(&mut keys, c.key));
            spans.push(start..keys.len());
        }
        let (_in_flight, deadline) = self.in_flight_place(deadline).await?;
        self.apply_by_slot(charges, &keys, &spans, &slots, commit, deadline)
            .await
    }

    /// [`Store::apply`] within `deadline`: the charges a request's [`StoreError::Partly`]
    /// answer left to make, inside that request's deadline.
    pub async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        for c in charges {
            script::fits_lua(c.params).map_err(|e| StoreError::InvalidData(e.to_string()))?;
        }
        let deadline = Deadline::until(
            deadline,
            self.options.command_timeout,
            self.options.max_wait,
        );
        self.decide_by_slot(charges, true, deadline).await
    }

    /// Appends `counter_key`'s Redis key to `buf`; returns the slot to call (0 on a single
    /// server, which holds every slot).
    fn key_and_slot(&self, buf: &mut Vec<u8>, counter_key: &[u8]) -> u16 {
        let slot = slot::redis_key(buf, counter_key);
        match self.connection {
            Connection::Single(_) => 0,
            Connection::Cluster(_) => slot,
        }
    }
}

impl Store for RedisStore {
    async fn decide(
        &self,
        charges: &[Charge<'_>],
        mode: Mode,
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        decisions.clear();
        decisions.extend(self.decide_all(charges, mode.applies()).await?);
        Ok(())
    }

    async fn apply_before(
        &self,
        charges: &[Charge<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        RedisStore::apply_before(self, charges, deadline).await
    }

    fn supports(&self, params: &Params) -> Result<(), Unsupported> {
        RedisStore::supports(params).map_err(|e| Unsupported(e.to_string()))
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
        let counts = within(Instant::now() + deadline, "redis DBSIZE", counts).await?;
        Ok(counts.into_iter().sum())
    }
}
