//! Coalescing: concurrent decisions bound for one Redis server share one `DECIDE_BATCH` call.
//!
//! Each decision becomes a [`Job`] on a queue. A driver task takes the first job waiting, then
//! (after an optional window) every job queued behind it, up to a batch size, and sends them as
//! one script call; at most `in_flight` batches are outstanding at once, so while they are out
//! the next batch fills by itself. Under light load a decision goes out alone at once; under
//! heavy load Redis runs one script call for many decisions instead of one each, which is what
//! bounds a single Redis server's throughput.
//!
//! Exactness is unchanged: the script decides each request on its own, atomically and in order,
//! exactly as back-to-back `DECIDE` calls would (see `script`). A decision whose caller has
//! already given up (its deadline passed) is dropped before the batch is sent, so it charges
//! nothing.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManager;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use super::now::{NowArg, NowSource, real_now};
use super::script;
use crate::store::{Charge, StoreError};

/// How decisions are coalesced on a single Redis server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceOptions {
    /// Most decisions in one script call; 0 sends every decision as its own call (no
    /// coalescing).
    pub max_batch: usize,
    /// How long the first decision of a batch waits for others before the batch is sent.
    /// Zero sends at once whatever is queued. Tokio's timers tick in milliseconds, so a
    /// non-zero window is at least about 1 ms.
    pub window: Duration,
    /// Batches outstanding at once.
    pub in_flight: usize,
}

impl Default for CoalesceOptions {
    fn default() -> Self {
        // Measured on one Redis server, see docs/benchmarks.md.
        CoalesceOptions {
            max_batch: 64,
            window: Duration::ZERO,
            in_flight: 2,
        }
    }
}

impl CoalesceOptions {
    /// Whether decisions are coalesced at all.
    pub fn enabled(&self) -> bool {
        self.max_batch > 0
    }

    /// Whether the window leaves a decision waiting `deadline` time for its call: a window
    /// over half of it would spend the deadline waiting for company.
    pub fn window_fits(&self, deadline: Duration) -> bool {
        self.window.checked_mul(2).is_some_and(|w| w <= deadline)
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
    /// When it was queued: its caller's deadline runs from about then.
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
    /// Starts the driver for `connection`. `queue` bounds the jobs waiting; `now` gives each
    /// call's `now` argument.
    pub fn start(
        connection: ConnectionManager,
        options: CoalesceOptions,
        queue: usize,
        now: NowSource,
    ) -> Self {
        let (jobs, queued) = mpsc::channel(queue.max(1));
        let stats = Arc::new(BatchStats::default());
        // Shared with every run of the driver, so that a run started again after a panic takes
        // the same queue (the jobs of the batches the panic dropped get a store error).
        let driving = Arc::new(Driving {
            queued: Arc::new(tokio::sync::Mutex::new(queued)),
            connection,
            options,
            now,
            stats: stats.clone(),
            outstanding: Arc::new(Semaphore::new(options.in_flight.max(1))),
            script: Arc::new(redis::Script::new(script::DECIDE_BATCH_SCRIPT)),
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

    /// A place in the queue, or why there is none (the queue is full: this process is behind,
    /// which says nothing about the Redis server, so it is kept apart from the breaker).
    pub fn place(&self) -> Result<Place<'_>, StoreError> {
        self.jobs
            .try_reserve()
            .map(Place)
            .map_err(|_| StoreError::NotCalled("redis batch queue full or closed".into()))
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
            .map_err(|_| StoreError::Unavailable("redis batch dropped".into()))?
    }
}

/// What every run of the driver shares.
#[derive(Debug)]
struct Driving {
    queued: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    connection: ConnectionManager,
    options: CoalesceOptions,
    now: NowSource,
    stats: Arc<BatchStats>,
    /// Batches out at once.
    outstanding: Arc<Semaphore>,
    script: Arc<redis::Script>,
}

async fn drive(driving: Arc<Driving>) {
    let Driving {
        queued,
        connection,
        options,
        now: now_source,
        stats,
        outstanding,
        script,
    } = driving.as_ref();
    let mut queued = queued.clone().lock_owned().await;
    let max_batch = options.max_batch.max(1);
    loop {
        let Ok(permit) = outstanding.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queued.recv().await else {
            return;
        };
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
        // Counted from the longest-waiting decision (the queue is first in, first out): one
        // queued while earlier batches were out must not get a fresh allowance when its batch
        // finally goes.
        let now = now_source.argument_since(batch[0].queued);
        let (script, mut connection) = (script.clone(), connection.clone());
        tokio::spawn(async move {
            let _permit = permit;
            send(&script, &mut connection, batch, now).await;
        });
    }
}

/// Runs one batch and hands every job its reply.
async fn send(
    script: &redis::Script,
    connection: &mut ConnectionManager,
    batch: Vec<Job>,
    now: NowArg,
) {
    // EVALSHA built in one buffer (a ScriptInvocation would copy every argument twice).
    let keys: usize = batch.iter().map(|job| job.request.charges.len()).sum();
    let mut call = redis::cmd("EVALSHA");
    call.arg(script.get_hash()).arg(keys);
    for Job { request, .. } in &batch {
        for (key, _) in &request.charges {
            call.arg(&request.keys[key.clone()]);
        }
    }
    call.arg(now).arg(batch.len());
    for Job { request, .. } in &batch {
        call.arg(request.charges.len())
            .arg(if request.commit { "1" } else { "0" });
        for (_, args) in &request.charges {
            for arg in args {
                call.arg(*arg);
            }
        }
    }
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
    match answer {
        Ok(replies) if replies.len() == batch.len() => {
            for (job, reply) in batch.into_iter().zip(replies) {
                let _ = job.reply.send(parse(reply));
            }
        }
        Ok(replies) => {
            let error = StoreError::InvalidData(format!(
                "batch script answered {} replies for {} requests",
                replies.len(),
                batch.len()
            ));
            for job in batch {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
        Err(e) => {
            let error = super::store_error(e);
            for job in batch {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
    }
}

/// One request's reply: its DECIDE numbers, or the error it raised.
fn parse(reply: Value) -> Result<Vec<i64>, StoreError> {
    if let Value::Array(items) = &reply
        && let [Value::Int(-1), message] = items.as_slice()
    {
        let message: String = redis::from_redis_value_ref(message).unwrap_or_default();
        return Err(super::classify(message));
    }
    redis::from_redis_value(reply).map_err(|e| StoreError::InvalidData(e.to_string()))
}
