//! Long-lived background tasks (the sweeps, the policy watcher and sync, Redis upkeep), kept
//! running by [`supervise`].
//!
//! A task spawned with `tokio::spawn` that panics just ends: the process goes on answering with
//! that duty gone (expired counters never swept, the policy never reloaded) and nothing says so.
//! Under [`supervise`] a panic is logged at `error` with the task's name and the panic's
//! message, counted in [`PANICS`], and the task is started again after [`RESTART_PAUSE`] (so a
//! task that panics at once cannot spin a core); a task that ends by itself while it is still
//! wanted is logged and restarted the same way. Both restarts are counted in [`RESTARTS`].
//!
//! The counters are the process's, not a limiter's: [`render_metrics`] appends them for every
//! task started so far (each from 0, so that an alert on their increase sees the first one).
//! A restarted task starts from scratch: what it kept in local variables is gone, and the shared
//! state it was changing when it panicked is as the panic left it (the locks do not poison).

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinHandle;
use tracing::{debug, error};

use crate::observe::prometheus::{Exposition, Kind};

/// Panics of a background task, by task.
pub const PANICS: &str = "tollgate_background_task_panics_total";

/// Restarts of a background task, after a panic or after it ended while still wanted, by task.
pub const RESTARTS: &str = "tollgate_background_task_restarts_total";

/// How long a task that panicked (or ended while still wanted) waits before it runs again.
pub const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// What happened to one task so far.
#[derive(Debug, Default)]
struct Tally {
    panics: AtomicU64,
    restarts: AtomicU64,
}

/// Every task supervised in this process, by name: a handful of names fixed in the code, so
/// the `task` label is bounded.
static TASKS: parking_lot::Mutex<BTreeMap<&'static str, Arc<Tally>>> =
    parking_lot::const_mutex(BTreeMap::new());

fn tally(task: &'static str) -> Arc<Tally> {
    TASKS.lock().entry(task).or_default().clone()
}

/// Spawns the task `run` makes, named `task` in logs and metrics, and makes it again whenever
/// it panics, or ends while `still_wanted` says it should still run, after [`RESTART_PAUSE`].
/// `still_wanted` is asked each time a run ends: it is how the task's owner says that the end
/// was expected (the process is stopping, what the task looked after is gone). A task that
/// panics while no longer wanted is logged and counted, not restarted. Aborting the returned
/// handle stops the task, whichever run it is in.
pub fn supervise<R, F, W>(task: &'static str, still_wanted: W, mut run: R) -> JoinHandle<()>
where
    R: FnMut() -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
    W: Fn() -> bool + Send + 'static,
{
    let tally = tally(task);
    let pause = humantime::format_duration(RESTART_PAUSE);
    tokio::spawn(async move {
        loop {
            // In this task, not a task of its own: aborting the supervisor must stop the run.
            // Making the future is inside the catch too.
            let ended = AssertUnwindSafe(async { run().await }).catch_unwind().await;
            let wanted = still_wanted();
            match ended {
                Ok(()) if !wanted => {
                    debug!(task, "Background task ended");
                    return;
                }
                Ok(()) => error!(
                    task,
                    "Background task {task} ended while it should still run; starting it again in {pause}"
                ),
                Err(panic) => {
                    tally.panics.fetch_add(1, Ordering::Relaxed);
                    let message = panic_message(panic.as_ref());
                    if !wanted {
                        error!(
                            task,
                            panic = message,
                            "Background task {task} panicked while stopping"
                        );
                        return;
                    }
                    error!(
                        task,
                        panic = message,
                        "Background task {task} panicked; starting it again in {pause}"
                    );
                }
            }
            tally.restarts.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(RESTART_PAUSE).await;
        }
    })
}

/// The text a panic was given (`panic!("...")`, `.expect("...")`), when it was given one.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(no message)"
    }
}

/// Appends [`PANICS`] and [`RESTARTS`] in Prometheus text format, a series per task supervised
/// so far in this process.
pub fn render_metrics(out: &mut String) {
    let tasks: Vec<(&'static str, Arc<Tally>)> = TASKS
        .lock()
        .iter()
        .map(|(name, tally)| (*name, tally.clone()))
        .collect();
    let families = [
        (
            PANICS,
            "Panics of a long-lived background task (each logged at error with its message).",
            (|t: &Tally| t.panics.load(Ordering::Relaxed)) as fn(&Tally) -> u64,
        ),
        (
            RESTARTS,
            "Restarts of a long-lived background task that panicked or ended while it should still run.",
            |t: &Tally| t.restarts.load(Ordering::Relaxed),
        ),
    ];
    let mut text = Exposition::new(out);
    for (name, help, count) in families {
        let mut family = text.family(name, help, Kind::Counter);
        for (task, tally) in &tasks {
            family.sample(&[("task", *task)], count(tally));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32};

    use tokio::sync::Notify;
    use tokio::time::Instant;

    use super::*;

    /// The series of `task` in `family`, as rendered.
    fn series(family: &str, task: &str) -> Option<u64> {
        let mut out = String::new();
        render_metrics(&mut out);
        let prefix = format!("{family}{{task=\"{task}\"}} ");
        out.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(|n| n.parse().unwrap())
    }

    /// A task that panics on its first run is counted, and runs again after the pause; its
    /// second run is the one that then keeps going. (Its log line is checked in
    /// `tests/background.rs`, a process of its own: tracing caches whether a log line is wanted
    /// once for the whole process, and the other tests here log the same lines without a
    /// subscriber.)
    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_runs_again_after_the_pause() {
        let runs = Arc::new(AtomicU32::new(0));
        let second_run_started = Arc::new(Notify::new());
        let began = Instant::now();
        let task = supervise("test_panics_once", || true, {
            let (runs, second_run_started) = (runs.clone(), second_run_started.clone());
            move || {
                let (runs, second_run_started) = (runs.clone(), second_run_started.clone());
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("the first run fails");
                    }
                    second_run_started.notify_one();
                    std::future::pending::<()>().await;
                }
            }
        });
        assert_eq!(
            series(PANICS, "test_panics_once"),
            Some(0),
            "registered at 0"
        );
        second_run_started.notified().await;
        assert!(began.elapsed() >= RESTART_PAUSE, "{:?}", began.elapsed());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(series(PANICS, "test_panics_once"), Some(1));
        assert_eq!(series(RESTARTS, "test_panics_once"), Some(1));
        // Still running, and not run again: one panic, one restart.
        tokio::time::sleep(RESTART_PAUSE * 5).await;
        assert!(!task.is_finished());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        task.abort();
    }

    /// A task that keeps panicking is restarted once per pause, never faster.
    #[tokio::test(start_paused = true)]
    async fn a_task_that_always_panics_is_restarted_once_per_pause() {
        let runs = Arc::new(AtomicU32::new(0));
        let task = supervise("test_always_panics", || true, {
            let runs = runs.clone();
            move || {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    panic!("{}", String::from("always"));
                }
            }
        });
        tokio::time::sleep(RESTART_PAUSE * 10 + RESTART_PAUSE / 2).await;
        assert_eq!(runs.load(Ordering::SeqCst), 11);
        assert_eq!(series(PANICS, "test_always_panics"), Some(11));
        assert_eq!(series(RESTARTS, "test_always_panics"), Some(11));
        task.abort();
    }

    /// A task that ends while still wanted is restarted (not counted as a panic); once its
    /// owner no longer wants it, its end is the supervisor's end.
    #[tokio::test(start_paused = true)]
    async fn a_task_ending_while_wanted_is_restarted_and_one_no_longer_wanted_is_not() {
        let runs = Arc::new(AtomicU32::new(0));
        let wanted = Arc::new(AtomicBool::new(true));
        let task = supervise(
            "test_ends",
            {
                let wanted = wanted.clone();
                move || wanted.load(Ordering::SeqCst)
            },
            {
                let runs = runs.clone();
                move || {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            },
        );
        tokio::time::sleep(RESTART_PAUSE * 2).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "ran, paused, ran again");
        assert_eq!(series(RESTARTS, "test_ends"), Some(2));
        assert_eq!(series(PANICS, "test_ends"), Some(0));
        wanted.store(false, Ordering::SeqCst);
        tokio::time::timeout(RESTART_PAUSE * 2, task)
            .await
            .expect("the supervisor ends with the run in progress")
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(series(RESTARTS, "test_ends"), Some(2));
    }

    /// A panic while making the task's future is caught like one while running it.
    #[tokio::test(start_paused = true)]
    async fn a_panic_making_the_task_is_caught_too() {
        let runs = Arc::new(AtomicU32::new(0));
        let task = supervise("test_panics_making", || true, {
            let runs = runs.clone();
            move || {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("before the future");
                }
                std::future::pending::<()>()
            }
        });
        tokio::time::sleep(RESTART_PAUSE * 3).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(series(PANICS, "test_panics_making"), Some(1));
        assert!(!task.is_finished());
        task.abort();
    }

    /// A panic while the task is no longer wanted (during a shutdown) is counted, and the task
    /// is not started again.
    #[tokio::test(start_paused = true)]
    async fn a_panic_while_stopping_is_counted_and_not_restarted() {
        let runs = Arc::new(AtomicU32::new(0));
        let task = supervise("test_panics_stopping", || false, {
            let runs = runs.clone();
            move || {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    panic!("while stopping");
                }
            }
        });
        task.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(series(PANICS, "test_panics_stopping"), Some(1));
        assert_eq!(series(RESTARTS, "test_panics_stopping"), Some(0));
    }

    #[test]
    fn panic_messages_are_read_from_both_payload_types() {
        let from = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        assert_eq!(
            panic_message(from(|| panic!("literal")).as_ref()),
            "literal"
        );
        assert_eq!(
            panic_message(from(|| panic!("{}", 42)).as_ref()),
            "42",
            "a formatted message is a String"
        );
        assert_eq!(
            panic_message(from(|| std::panic::panic_any(7_u8)).as_ref()),
            "(no message)"
        );
    }
}
