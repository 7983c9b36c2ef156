//! Coalescing: concurrent decisions bound for one Redis server share one `DECIDE_BATCH` call.
//!
//! Each decision becomes a [`Job`] on a queue. A driver task takes the first job waiting, then
//! (after an optional window) every job queued behind it, up to a batch size, and sends them as
//! one script call; at most `in_flight` batches are outstanding at once, so while they are out
//! the next batch fills by itself. Under light load a decision goes out alone at once; under
//! heavy load Redis runs one script call for many decisions instead of one each, which is what
//! bounds a single Redis server's throughput.
//!
//! A burst is not a store failure: past the in-flight cap (more decisions waiting than the
//! batches out hold), a batch grows to carry its share of the backlog, up to the in-flight cap
//! over the batches out, rather than any decision skipping the store. The time a decision
//! waits in the queue is not the store's: the breaker and the store's deadline see each batch
//! from when it is sent (see [`super::patience`]).
//!
//! Exactness is unchanged: the script decides each request on its own, atomically and in order,
//! exactly as back-to-back `DECIDE` calls would (see `script`). A decision whose caller has
//! already given up (its wait passed `max_wait`) is dropped before the batch is sent, so it
//! charges nothing.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManager;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use super::breaker::{Breaker, Logged};
use super::now::{NowArg, NowSource, real_now};
use super::patience::{self, Deadline, Unanswered};
use super::script;
use crate::store::{Charge, Failure, Invalid, Refusal, StoreError, Timeout};

/// How one server's batches are sent: the coalescing options and what the store's options
/// say about every call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub coalesce: super::options::CoalesceOptions,
    /// Decisions out at once over the batches in flight, past which batches grow.
    pub max_in_flight: usize,
    /// Decisions waiting in the queue; more are shed for load.
    pub queue: usize,
    /// A call's deadline from when it is sent, and the most a decision waits.
    pub command_timeout: Duration,
    pub max_wait: Duration,
}

impl Limits {
    /// Most decisions in the next batch when `waiting` are queued: the batch size, or behind a
    /// backlog its share of it over the batches out, capped at their share of the in-flight
    /// cap.
    fn batch(&self, waiting: usize) -> usize {
        let batches = self.coalesce.in_flight.max(1);
        let share = waiting
            .div_ceil(batches)
            .min(self.max_in_flight.div_ceil(batches));
        self.coalesce.max_batch.max(share).max(1)
    }
}

/// One request's charges for the batch script.
#[derive(Debug)]
pub(super) struct Request {
    /// The charges' Redis keys, back to back.
    pub keys: Vec<u8>,
    /// Per charge: its key's range in `keys` and its six script arguments
    /// ([`script::decide_args`]).
    pub charges: Vec<(Range<usize>, [u64; 6])>,
    /// Write if admitted.
    pub commit: bool,
}

impl Request {
    /// An empty request for `charges` charges.
    pub fn new(commit: bool, charges: usize) -> Self {
        Request {
            keys: Vec::with_capacity(charges * 64),
            charges: Vec::with_capacity(charges),
            commit,
        }
    }

    /// Adds `charge`, writing its Redis key.
    pub fn push(&mut self, charge: &Charge<'_>) {
        let start = self.keys.len();
        super::slot::redis_key(&mut self.keys, charge.key);
        self.charges
            .push((start..self.keys.len(), script::decide_args(charge)));
    }
}

type Answer = Result<Vec<i64>, StoreError>;

#[derive(Debug)]
struct Job {
    request: Request,
    reply: oneshot::Sender<Answer>,
    /// When it was queued (real time, for the late-call guard).
    queued: std::time::Instant,
}

/// The queue into one server's batches, and the task that drains it.
#[derive(Debug)]
pub(super) struct Coalescer {
    jobs: mpsc::Sender<Job>,
    driver: JoinHandle<()>,
    stats: Arc<BatchStats>,
}

/// What the coalescer has sent so far.
#[derive(Debug, Default)]
struct BatchStats {
    /// Script calls sent.
    batches: AtomicU64,
    /// Decisions those calls carried.
    decisions: AtomicU64,
}

impl Drop for Coalescer {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Coalescer {
    /// Starts the driver for `connection`, the server `node` whose breaker sees every batch.
    /// `now` gives each call's `now` argument.
    pub fn start(
        connection: ConnectionManager,
        (node, breaker): (Arc<str>, Arc<Breaker>),
        limits: Limits,
        now: NowSource,
    ) -> Self {
        let (jobs, queued) = mpsc::channel(limits.queue.max(1));
        let stats = Arc::new(BatchStats::default());
        // Shared with every run of the driver, so that a run started again after a panic takes
        // the same queue (the jobs of the batches the panic dropped get a store error).
        let driving = Arc::new(Driving {
            queued: Arc::new(tokio::sync::Mutex::new(queued)),
            connection,
            limits,
            node,
            breaker,
            now,
            stats: stats.clone(),
            outstanding: Arc::new(Semaphore::new(limits.coalesce.in_flight.max(1))),
            script: Arc::new(redis::Script::new(script::DECIDE_BATCH_SCRIPT)),
            functions: AtomicBool::new(true),
        });
        // Dropping the coalescer aborts the driver; the queue closes with it.
        let open = jobs.downgrade();
        let driver = crate::background::supervise(
            "redis_batcher",
            move || open.strong_count() > 0,
            move || drive(driving.clone()),
        );
        Coalescer {
            jobs,
            driver,
            stats,
        }
    }

    /// Batches and decisions sent so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.stats.batches.load(Ordering::Relaxed),
            self.stats.decisions.load(Ordering::Relaxed),
        )
    }

    /// A place in the queue, or `None` when it is full (this process is behind, which says
    /// nothing about the Redis server, so it is kept apart from the breaker) or closed.
    pub fn place(&self) -> Option<Place<'_>> {
        self.jobs.try_reserve().ok().map(Place)
    }
}

/// A reserved place in the coalescer's queue.
#[derive(Debug)]
pub(super) struct Place<'a>(mpsc::Permit<'a, Job>);

impl Place<'_> {
    /// Queues `request` and waits for its DECIDE reply.
    pub async fn decide(self, request: Request) -> Answer {
        let (reply, answer) = oneshot::channel();
        self.0.send(Job {
            request,
            reply,
            queued: real_now(),
        });
        answer
            .await
            .map_err(|_| StoreError::Unavailable(Failure::BatchDropped))?
    }
}

/// What every run of the driver shares.
#[derive(Debug)]
struct Driving {
    queued: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    connection: ConnectionManager,
    limits: Limits,
    node: Arc<str>,
    breaker: Arc<Breaker>,
    now: NowSource,
    stats: Arc<BatchStats>,
    /// Batches out at once.
    outstanding: Arc<Semaphore>,
    script: Arc<redis::Script>,
    /// Whether batches go by `FCALL` of [`script::decide_batch_library`]; until a Redis server
    /// refuses to load it (before 7.0, or an ACL that forbids `FUNCTION`) or to run it (an ACL
    /// that forbids `FCALL`), then by `EVALSHA`.
    functions: AtomicBool,
}

/// DECIDE_BATCH's call of `batch` by `verb` (`FCALL` or `EVALSHA`) of `name`, in one buffer
/// (a ScriptInvocation would copy every argument twice).
fn batch_call(verb: &str, name: &str, batch: &[Job], now: NowArg) -> redis::Cmd {
    let keys: usize = batch.iter().map(|job| job.request.charges.len()).sum();
    let mut call = redis::cmd(verb);
    call.arg(name).arg(keys);
    for Job { request, .. } in batch {
        for (key, _) in &request.charges {
            call.arg(&request.keys[key.clone()]);
        }
    }
    call.arg(now);
    let mut text = Vec::with_capacity(64);
    for Job { request, .. } in batch {
        text.clear();
        let args = request.charges.iter().map(|(_, args)| args);
        script::batch_request_arg(&mut text, request.commit, args);
        call.arg(&text[..]);
    }
    call
}

/// Loads (again) the DECIDE_BATCH function library.
async fn load_library(connection: &mut ConnectionManager) -> redis::RedisResult<()> {
    let library = script::decide_batch_library();
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&library.code)
        .query_async::<()>(connection)
        .await
}

/// Whether `FCALL` failed for want of the function (Redis lost or never had the library).
fn function_missing(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// Whether the server answered a `FUNCTION LOAD` with a refusal (an unknown command before
/// Redis 7.0, an ACL's `NOPERM`, ...) rather than failing to answer.
fn refused(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

/// Sends this server's batches by `EVALSHA` from now on.
fn refuse_functions(functions: &AtomicBool, node: &str, e: &redis::RedisError) {
    if functions.swap(false, Ordering::Relaxed) {
        tracing::warn!(node, error = %e, "Redis refused the decision function library; batches go by EVALSHA");
    }
}

/// Loads the function library as the driver starts, so that no batch waits for Redis to
/// compile it; a server that refuses it gets its batches by `EVALSHA`. A load that gets no
/// answer is left to the first batch, which loads it when its `FCALL` finds no function.
async fn prepare_functions(driving: &Driving) {
    let mut connection = driving.connection.clone();
    let load = tokio::time::timeout(LIBRARY_LOAD_TIMEOUT, load_library(&mut connection)).await;
    if let Ok(Err(e)) = load
        && refused(&e)
    {
        refuse_functions(&driving.functions, &driving.node, &e);
    }
}

/// How long the driver waits for the library to load before it takes the first batch.
const LIBRARY_LOAD_TIMEOUT: Duration = Duration::from_secs(5);

async fn drive(driving: Arc<Driving>) {
    let Driving {
        queued,
        limits,
        now: now_source,
        stats,
        outstanding,
        ..
    } = driving.as_ref();
    let options = &limits.coalesce;
    let mut queued = queued.clone().lock_owned().await;
    if driving.functions.load(Ordering::Relaxed) {
        prepare_functions(&driving).await;
    }
    loop {
        let Ok(permit) = outstanding.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queued.recv().await else {
            return;
        };
        let max_batch = limits.batch(queued.len() + 1);
        let mut batch = vec![first];
        if !options.window.is_zero() {
            let until = tokio::time::Instant::now() + options.window;
            while batch.len() < max_batch {
                match tokio::time::timeout_at(until, queued.recv()).await {
                    Ok(Some(job)) => batch.push(job),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        while batch.len() < max_batch {
            match queued.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // A caller past its deadline has taken its posture already: do not charge for it.
        batch.retain(|job| !job.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats
            .decisions
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        // The store's deadline runs from now; the guard counts from now too, or from earlier
        // when the longest-waiting decision's caller gives up sooner (the queue is first in,
        // first out): one queued near its `max_wait` must not write after its caller left.
        let deadline = Deadline::starting(limits.command_timeout, limits.max_wait);
        let latest = limits.max_wait.saturating_sub(limits.command_timeout);
        let since = batch[0]
            .queued
            .checked_add(latest)
            .map_or(real_now(), |latest| latest.min(real_now()));
        let now = now_source.argument_since(since);
        let driving = driving.clone();
        tokio::spawn(async move {
            let _permit = permit;
            send(&driving, batch, now, deadline).await;
        });
    }
}

/// Runs one batch, each decision through the breaker, and hands every job its reply.
async fn send(driving: &Driving, batch: Vec<Job>, now: NowArg, deadline: Deadline) {
    let Driving {
        connection,
        node,
        breaker,
        script,
        functions,
        ..
    } = driving;
    let library = script::decide_batch_library();
    let mut connection = connection.clone();
    let connection = &mut connection;
    // One permit per decision, as when each was its own call: an open breaker refuses them
    // without calling, and a failed batch counts one failure for each.
    let mut permits = Vec::with_capacity(batch.len());
    let batch: Vec<Job> = batch
        .into_iter()
        .filter_map(|job| match breaker.try_call() {
            Some(permit) => {
                permits.push(Logged::new(node, permit));
                Some(job)
            }
            None => {
                let refused = StoreError::NotCalled(Refusal::CircuitOpen { node: node.clone() });
                let _ = job.reply.send(Err(refused));
                None
            }
        })
        .collect();
    if batch.is_empty() {
        return;
    }
    let sent = tokio::time::Instant::now();
    let call = async {
        if functions.load(Ordering::Relaxed) {
            let call = batch_call("FCALL", &library.function, &batch, now);
            match call.query_async::<Vec<Value>>(connection).await {
                // Redis restarted empty or flushed its functions: load them and try once more.
                Err(e) if function_missing(&e) => match load_library(connection).await {
                    Ok(()) => return call.query_async(connection).await,
                    Err(e) if refused(&e) => refuse_functions(functions, node, &e),
                    Err(e) => return Err(e),
                },
                // An ACL that lets `FUNCTION LOAD` through but not `FCALL`.
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
                    refuse_functions(functions, node, &e)
                }
                answer => return answer,
            }
        }
        let call = batch_call("EVALSHA", script.get_hash(), &batch, now);
        let mut answer = call.query_async::<Vec<Value>>(connection).await;
        if let Err(e) = &answer
            && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        {
            // Redis restarted or flushed its scripts: load it and try once more.
            answer = match script.load_async(connection).await {
                Ok(_) => call.query_async(connection).await,
                Err(e) => Err(e),
            };
        }
        answer
    };
    // What the node's silence counts for the breaker is the patience rule's, not per decision.
    let decisions = batch.len();
    let answer = match patience::patiently(deadline, (node, breaker), sent, decisions, call).await {
        Ok(answer) => answer,
        Err(Unanswered::Stalled) => {
            // Dropping the permits unreported counts a failure for each.
            drop(permits);
            let error = StoreError::TimedOut(Timeout::Node { node: node.clone() });
            for job in batch {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
        Err(Unanswered::TooLong) => {
            // Every caller has left (a decision waits `max_wait` at most): they were answered
            // for load, and the node that kept answering others is not blamed.
            permits.into_iter().for_each(Logged::release);
            return;
        }
    };
    let charges = batch.iter().map(|job| job.request.charges.len());
    let answer = answer.map(|reply| (script::split_batch_reply(&reply, charges), reply.len()));
    match answer {
        Ok((Some(replies), _)) => {
            for ((job, reply), mut permit) in batch.into_iter().zip(replies).zip(permits) {
                let reply = reply.map_err(super::error::script_error);
                permit.record(matches!(reply, Ok(_) | Err(StoreError::InvalidData(_))));
                let _ = job.reply.send(reply);
            }
        }
        Ok((None, values)) => {
            let error = StoreError::InvalidData(Invalid::BatchLength {
                values,
                requests: batch.len(),
            });
            for (job, mut permit) in batch.into_iter().zip(permits) {
                permit.record(true);
                let _ = job.reply.send(Err(error.clone()));
            }
        }
        Err(e) => {
            let error = super::error::store_error(e);
            let answered = matches!(error, StoreError::InvalidData(_));
            for (job, mut permit) in batch.into_iter().zip(permits) {
                permit.record(answered);
                let _ = job.reply.send(Err(error.clone()));
            }
        }
    }
}
