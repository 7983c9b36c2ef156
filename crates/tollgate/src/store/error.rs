//! Why a store could not decide, or cannot decide a limit at all.
//!
//! Each [`StoreError`] holds its cause as a value: what failed, what refused the call, what did
//! not answer, what was invalid. Its text is the cause's, after a prefix that says the kind
//! (`store unavailable: ...`); the cause is the message's content, not an error under it, so
//! [`source`](std::error::Error::source) walks no further and a report prints it once. A
//! Redis client error is kept in the cause as its `#[source]`.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::Decision;

#[cfg(feature = "redis")]
use super::redis::script::InexactInLua;
use super::redis_invalid_options::InvalidOptions;

/// A limit a store cannot decide exactly (see [`Store::supports`](super::Store::supports)).
/// Without the `redis` feature it has no variant: the memory store decides every limit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Unsupported {
    /// The Redis scripts, which work on doubles, cannot represent it exactly.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    InexactInLua(#[from] InexactInLua),
}

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend is unreachable, slow or failing; a retry may succeed. The call may have
    /// been sent, and even applied, before it failed.
    #[error("store unavailable: {0}")]
    Unavailable(Failure),
    /// The call was refused before anything was sent (circuit breaker open, too many calls in
    /// flight, cluster slot map not known yet): the store has not seen it, and a retry may
    /// succeed.
    #[error("store unavailable, not called: {0}")]
    NotCalled(Refusal),
    /// The call was sent and no answer came before its deadline: a store that is down or
    /// overloaded, or one that never answers this client at all (a plaintext server to a TLS
    /// client). The call may have been applied. A retry may succeed.
    #[error("store did not answer in time: {0}")]
    TimedOut(Timeout),
    /// The backend answered something we cannot use (for example a foreign value at our key).
    #[error("store returned invalid data: {0}")]
    InvalidData(Invalid),
    /// The store's settings cannot work (see [`RedisOptions::check`](super::RedisOptions::check)).
    #[error("invalid store settings: {0}")]
    InvalidOptions(InvalidOptions),
    /// Some of a request's counters could not be decided (`cause`): they live on Redis
    /// Cluster nodes that could not answer, or are new to a memory store at its most keys.
    /// The others were decided without charging anything: `decided[i]` is charge `i`'s
    /// decision as it stands, `None` where it could not be decided. The limiter lets the
    /// failure postures answer for those charges alone and charges the others
    /// ([`Store::apply_before`](super::Store::apply_before) `deadline`, the request's).
    #[error("{cause}")]
    Partly {
        decided: Vec<Option<Decision>>,
        cause: Box<StoreError>,
        deadline: tokio::time::Instant,
    },
}

impl StoreError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable(_) | StoreError::NotCalled(_) | StoreError::TimedOut(_) => true,
            StoreError::Partly { cause, .. } => cause.is_transient(),
            StoreError::InvalidData(_) | StoreError::InvalidOptions(_) => false,
        }
    }
}

/// What failed: the cause of [`StoreError::Unavailable`]. The causes that hold a Redis
/// client's error come with the `redis` feature (hence `non_exhaustive`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// Redis answered an error, or the client failed to reach it (unreachable, out of memory,
    /// cluster reconfiguring, script cache lost twice...).
    #[error("redis: {0}")]
    Redis(RedisFailure),
    /// Redis wants a password the store URL does not give (`NOAUTH`).
    #[error(
        "redis: authentication required: the store URL has no password or not the right one ({0})"
    )]
    AuthRequired(RedisFailure),
    /// The Redis URL names no server the client can open.
    #[cfg(feature = "redis")]
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(#[source] redis::RedisError),
    /// A cluster seed URL names no server the client can open.
    #[cfg(feature = "redis")]
    #[error("invalid cluster seed URL: {0}")]
    InvalidSeedUrl(#[source] redis::RedisError),
    /// The connection to the Redis server could not be set up.
    #[cfg(feature = "redis")]
    #[error("cannot create Redis connection: {0}")]
    NoConnection(#[source] redis::RedisError),
    /// A cluster node's address, as the slot map gives it, is no address the client can open.
    #[cfg(feature = "redis")]
    #[error("invalid node address {node}: {source}")]
    InvalidNodeAddress {
        node: Arc<str>,
        source: redis::RedisError,
    },
    /// The connection to a cluster node could not be set up.
    #[cfg(feature = "redis")]
    #[error("cannot connect to {node}: {source}")]
    CannotConnect {
        node: Arc<str>,
        source: redis::RedisError,
    },
    /// A Redis store was asked to open the memory store's URL.
    #[error("memory is not a Redis URL")]
    NotRedis,
    /// The batch a decision was queued in ended without answering it.
    #[error("redis batch dropped")]
    BatchDropped,
    /// No primary of the cluster is known yet.
    #[error("cluster topology not known yet")]
    TopologyUnknown,
    /// A slot redirected the call more often than a failover moves it.
    #[error("slot {slot}: more than {most} redirects")]
    TooManyRedirects { slot: u16, most: usize },
    /// A request across slots was taken as failed with no slot's failure to show (never
    /// expected: kept as a failure rather than a panic).
    #[error("no slot failed")]
    NoSlotFailed,
}

/// What Redis answered a failed call with. The client's error comes with the `redis` feature
/// (hence `non_exhaustive`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RedisFailure {
    /// The client's error: the server's, or its own (I/O, protocol).
    #[cfg(feature = "redis")]
    #[error("{0}")]
    Client(#[source] redis::RedisError),
    /// The error a batched script call answered for one request: the server's error as its
    /// script saw it, code first ("WRONGTYPE Operation against a key...").
    #[error("{0}")]
    Script(String),
}

// Asked by the Redis stores alone.
#[cfg(feature = "redis")]
impl RedisFailure {
    /// Whether its text says `mark`.
    pub(crate) fn says(&self, mark: &str) -> bool {
        match self {
            RedisFailure::Client(e) => e.to_string().contains(mark),
            RedisFailure::Script(message) => message.contains(mark),
        }
    }
}

/// What refused a call before it was sent: the cause of [`StoreError::NotCalled`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    /// The circuit breaker of this node (`host:port`) is open.
    #[error("circuit open for {node}")]
    CircuitOpen { node: Arc<str> },
    /// Tollgate was behind, not the store: the failure posture answered for load.
    #[error("redis busy: {0}")]
    Busy(ShedReason),
    /// The store is shutting down.
    #[error("redis store closed")]
    Closed,
    /// The cluster's slot map has no owner for this slot.
    #[error("no known node serves slot {slot}")]
    NoNodeForSlot { slot: u16 },
    /// The cluster's slot map is not known yet.
    #[error("cluster slot map not known yet")]
    SlotMapUnknown,
    /// The memory store holds its most keys (`--memory-max-keys`, `max`).
    #[error(
        "the memory store holds its most keys ({max}, --memory-max-keys): a limit on a new key takes its failure posture until keys expire"
    )]
    MostKeys { max: usize },
    /// The memory store holds its most bytes (`--memory-max-bytes`, `max`; `held` now).
    #[error(
        "the memory store holds its most bytes ({held} of {max}, --memory-max-bytes): a limit on a new key takes its failure posture until keys expire"
    )]
    MostBytes { held: usize, max: usize },
}

/// Why the failure posture answered a decision for load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShedReason {
    /// Tollgate's queue towards the store was full.
    #[error("tollgate's queue towards Redis is full")]
    QueueFull,
    /// The decision waited `max_wait` (in the queue, for a place, or on a busy node).
    #[error("the decision waited --store-max-wait for a busy Redis")]
    WaitedTooLong,
}

/// What did not answer before its deadline: the cause of [`StoreError::TimedOut`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum Timeout {
    /// A call to this node (`host:port`).
    #[error("{node}: deadline exceeded")]
    Node { node: Arc<str> },
    /// A call to this node while its slot was migrating (`TRYAGAIN` until the deadline).
    #[error("{node}: deadline exceeded (slot migrating)")]
    SlotMigrating { node: Arc<str> },
    /// A kind of call, on whichever node it went to.
    #[error("{0}: deadline exceeded")]
    Call(RedisCall),
    /// The store, waited for at startup this long.
    #[error("no answer within {0:?}")]
    NotReady(Duration),
}

/// A kind of call to Redis, as a timeout names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RedisCall {
    /// A decision's script calls (decide, refund, lease).
    #[error("redis")]
    Scripts,
    /// `DBSIZE` on the primaries.
    #[error("redis DBSIZE")]
    KeyCount,
    /// `SCRIPT LOAD` of the decision scripts.
    #[error("redis SCRIPT LOAD")]
    LoadScripts,
    /// A read or write of the shared policy.
    #[error("redis policy")]
    Policy,
}

/// What the store answered that cannot be used: the cause of [`StoreError::InvalidData`]. The
/// causes the Redis client or scripts give come with the `redis` feature (hence
/// `non_exhaustive`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    /// A foreign value at one of our keys (`WRONGTYPE`).
    #[error("{0}")]
    ForeignValue(RedisFailure),
    /// A reply the client could not read as what was asked.
    #[cfg(feature = "redis")]
    #[error("{0}")]
    Unreadable(#[source] redis::RedisError),
    /// A limit the Redis scripts cannot decide exactly.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Inexact(#[from] InexactInLua),
    /// A decision script's reply of the wrong length.
    #[error("script answered {numbers} numbers for {charges} charges")]
    ReplyLength { numbers: usize, charges: usize },
    /// A batch script's reply with not one reply per request.
    #[error("batch script answered {values} values, not the replies of {requests} requests")]
    BatchLength { values: usize, requests: usize },
    /// A verdict code the scripts do not answer.
    #[error("unknown verdict {0}")]
    Verdict(i64),
    /// A lease's script reply with no decision in it.
    #[error("the script answered no decision")]
    NoDecision,
    /// The store answered fewer decisions than it was asked for.
    #[error("the store answered too few decisions")]
    TooFewFromStore,
    /// The failure postures answered fewer decisions than they were asked for.
    #[error("the postures answered too few decisions")]
    TooFewFromPostures,
}

// The causes' texts, most of them Redis's (its client's errors among them): the `redis`
// feature's.
#[cfg(all(test, feature = "redis"))]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::store::RedisOptions;

    /// An error of the Redis client, as a failed connection gives it.
    fn client_error() -> redis::RedisError {
        redis::RedisError::from((redis::ErrorKind::Io, "connection refused"))
    }

    fn script(message: &str) -> RedisFailure {
        RedisFailure::Script(message.to_owned())
    }

    /// Each cause reads as the text it replaced (which logs and the CLI show, and operators
    /// grep), and keeps its kind's transience.
    #[test]
    fn each_cause_reads_as_before_and_keeps_its_kind() {
        use StoreError::{InvalidData, NotCalled, TimedOut, Unavailable};
        let node: Arc<str> = "10.0.0.1:6379".into();
        let e = client_error();
        let options = RedisOptions {
            max_in_flight: 0,
            command_timeout: Duration::ZERO,
            ..RedisOptions::default()
        };
        let Err(invalid_options) = options.check() else {
            panic!("settings that cannot work pass the check");
        };
        let cases: Vec<(StoreError, String, bool)> = vec![
            (
                Unavailable(Failure::Redis(script("OOM command not allowed"))),
                "store unavailable: redis: OOM command not allowed".into(),
                true,
            ),
            (
                Unavailable(Failure::Redis(RedisFailure::Client(e.clone()))),
                format!("store unavailable: redis: {e}"),
                true,
            ),
            (
                Unavailable(Failure::AuthRequired(script("NOAUTH Authentication required."))),
                "store unavailable: redis: authentication required: the store URL has no password or not the right one (NOAUTH Authentication required.)".into(),
                true,
            ),
            (
                Unavailable(Failure::InvalidUrl(e.clone())),
                format!("store unavailable: invalid Redis URL: {e}"),
                true,
            ),
            (
                Unavailable(Failure::InvalidSeedUrl(e.clone())),
                format!("store unavailable: invalid cluster seed URL: {e}"),
                true,
            ),
            (
                Unavailable(Failure::NoConnection(e.clone())),
                format!("store unavailable: cannot create Redis connection: {e}"),
                true,
            ),
            (
                Unavailable(Failure::InvalidNodeAddress {
                    node: node.clone(),
                    source: e.clone(),
                }),
                format!("store unavailable: invalid node address 10.0.0.1:6379: {e}"),
                true,
            ),
            (
                Unavailable(Failure::CannotConnect {
                    node: node.clone(),
                    source: e.clone(),
                }),
                format!("store unavailable: cannot connect to 10.0.0.1:6379: {e}"),
                true,
            ),
            (
                Unavailable(Failure::NotRedis),
                "store unavailable: memory is not a Redis URL".into(),
                true,
            ),
            (
                Unavailable(Failure::BatchDropped),
                "store unavailable: redis batch dropped".into(),
                true,
            ),
            (
                Unavailable(Failure::TopologyUnknown),
                "store unavailable: cluster topology not known yet".into(),
                true,
            ),
            (
                Unavailable(Failure::TooManyRedirects { slot: 7, most: 3 }),
                "store unavailable: slot 7: more than 3 redirects".into(),
                true,
            ),
            (
                Unavailable(Failure::NoSlotFailed),
                "store unavailable: no slot failed".into(),
                true,
            ),
            (
                NotCalled(Refusal::CircuitOpen { node: node.clone() }),
                "store unavailable, not called: circuit open for 10.0.0.1:6379".into(),
                true,
            ),
            (
                NotCalled(Refusal::Busy(ShedReason::QueueFull)),
                "store unavailable, not called: redis busy: tollgate's queue towards Redis is full"
                    .into(),
                true,
            ),
            (
                NotCalled(Refusal::Busy(ShedReason::WaitedTooLong)),
                "store unavailable, not called: redis busy: the decision waited --store-max-wait for a busy Redis".into(),
                true,
            ),
            (
                NotCalled(Refusal::Closed),
                "store unavailable, not called: redis store closed".into(),
                true,
            ),
            (
                NotCalled(Refusal::NoNodeForSlot { slot: 7 }),
                "store unavailable, not called: no known node serves slot 7".into(),
                true,
            ),
            (
                NotCalled(Refusal::SlotMapUnknown),
                "store unavailable, not called: cluster slot map not known yet".into(),
                true,
            ),
            (
                NotCalled(Refusal::MostKeys { max: 10 }),
                "store unavailable, not called: the memory store holds its most keys (10, --memory-max-keys): a limit on a new key takes its failure posture until keys expire".into(),
                true,
            ),
            (
                NotCalled(Refusal::MostBytes { held: 5, max: 4 }),
                "store unavailable, not called: the memory store holds its most bytes (5 of 4, --memory-max-bytes): a limit on a new key takes its failure posture until keys expire".into(),
                true,
            ),
            (
                TimedOut(Timeout::Node { node: node.clone() }),
                "store did not answer in time: 10.0.0.1:6379: deadline exceeded".into(),
                true,
            ),
            (
                TimedOut(Timeout::SlotMigrating { node }),
                "store did not answer in time: 10.0.0.1:6379: deadline exceeded (slot migrating)"
                    .into(),
                true,
            ),
            (
                TimedOut(Timeout::Call(RedisCall::Scripts)),
                "store did not answer in time: redis: deadline exceeded".into(),
                true,
            ),
            (
                TimedOut(Timeout::Call(RedisCall::KeyCount)),
                "store did not answer in time: redis DBSIZE: deadline exceeded".into(),
                true,
            ),
            (
                TimedOut(Timeout::Call(RedisCall::LoadScripts)),
                "store did not answer in time: redis SCRIPT LOAD: deadline exceeded".into(),
                true,
            ),
            (
                TimedOut(Timeout::Call(RedisCall::Policy)),
                "store did not answer in time: redis policy: deadline exceeded".into(),
                true,
            ),
            (
                TimedOut(Timeout::NotReady(Duration::from_millis(300))),
                "store did not answer in time: no answer within 300ms".into(),
                true,
            ),
            (
                InvalidData(Invalid::ForeignValue(script("WRONGTYPE Operation"))),
                "store returned invalid data: WRONGTYPE Operation".into(),
                false,
            ),
            (
                InvalidData(Invalid::Unreadable(e.clone())),
                format!("store returned invalid data: {e}"),
                false,
            ),
            (
                InvalidData(Invalid::ReplyLength {
                    numbers: 5,
                    charges: 1,
                }),
                "store returned invalid data: script answered 5 numbers for 1 charges".into(),
                false,
            ),
            (
                InvalidData(Invalid::BatchLength {
                    values: 2,
                    requests: 3,
                }),
                "store returned invalid data: batch script answered 2 values, not the replies of 3 requests".into(),
                false,
            ),
            (
                InvalidData(Invalid::Verdict(9)),
                "store returned invalid data: unknown verdict 9".into(),
                false,
            ),
            (
                InvalidData(Invalid::NoDecision),
                "store returned invalid data: the script answered no decision".into(),
                false,
            ),
            (
                InvalidData(Invalid::TooFewFromStore),
                "store returned invalid data: the store answered too few decisions".into(),
                false,
            ),
            (
                InvalidData(Invalid::TooFewFromPostures),
                "store returned invalid data: the postures answered too few decisions".into(),
                false,
            ),
            (
                StoreError::InvalidOptions(invalid_options),
                "invalid store settings: command_timeout is 0: every call would miss its deadline; max_in_flight is 0: every decision would be shed".into(),
                false,
            ),
        ];
        for (error, text, transient) in cases {
            assert_eq!(error.to_string(), text);
            assert_eq!(error.is_transient(), transient, "{text}");
            // In part, an error reads and counts as its cause.
            let partly = StoreError::Partly {
                decided: vec![None],
                cause: Box::new(error),
                deadline: tokio::time::Instant::now(),
            };
            assert_eq!(partly.to_string(), text);
            assert_eq!(partly.is_transient(), transient, "partly: {text}");
        }
    }

    /// A Redis client error stays the source of the cause that holds it; the store error's
    /// text already holds the cause's, so it names no source of its own (a report that prints
    /// every source prints each text once).
    #[test]
    fn a_client_error_is_the_source_of_its_cause() {
        let e = client_error();
        let cause = Failure::InvalidUrl(e.clone());
        let source = cause.source().map(ToString::to_string);
        assert_eq!(source, Some(e.to_string()));
        assert!(StoreError::Unavailable(cause).source().is_none());
        let late = redis::RedisError::from((
            redis::ErrorKind::Io,
            "reply",
            "ERR tollgate: late: the call reached Redis after its deadline".to_owned(),
        ));
        assert!(RedisFailure::Client(late).says("tollgate: late"));
        assert!(!RedisFailure::Client(e).says("tollgate: late"));
        assert!(script("ERR tollgate: late: after its deadline").says("tollgate: late"));
    }
}
