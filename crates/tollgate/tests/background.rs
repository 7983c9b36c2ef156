//! What a panicking background task logs. Alone in its test binary: tracing decides once per
//! process whether a log line is wanted, and a test elsewhere reaching the same line first
//! without a subscriber would turn it off for this one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::Notify;
use tollgate::background::{PANICS, RESTART_PAUSE, render_metrics, supervise};

/// A panic is logged at error, once, with the task's name and the panic's message, and says
/// when the task starts again; the task's second run is then under way.
#[tokio::test(start_paused = true)]
async fn a_panicking_task_is_logged_at_error_with_its_name_and_message() {
    let logs = tollgate_testkit::CapturedLogs::default();
    let subscriber = logs.subscriber();
    // The test's runtime has one thread: the supervisor logs on it.
    let _logging = tracing::subscriber::set_default(subscriber);
    let runs = Arc::new(AtomicU32::new(0));
    let second_run = Arc::new(Notify::new());
    let task = supervise("logged_task", || true, {
        let (runs, second_run) = (runs.clone(), second_run.clone());
        move || {
            let (runs, second_run) = (runs.clone(), second_run.clone());
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("the first run fails");
                }
                second_run.notify_one();
                std::future::pending::<()>().await;
            }
        }
    });
    second_run.notified().await;
    let text = logs.text();
    let logged: Vec<&str> = text.lines().filter(|l| l.contains("panicked")).collect();
    assert_eq!(logged.len(), 1, "{text}");
    let expected = format!(
        "starting it again in {}",
        humantime::format_duration(RESTART_PAUSE)
    );
    for says in [
        "ERROR",
        "Background task logged_task panicked",
        "task=\"logged_task\"",
        "panic=\"the first run fails\"",
        &expected,
    ] {
        assert!(logged[0].contains(says), "`{says}` in {}", logged[0]);
    }
    let mut metrics = String::new();
    render_metrics(&mut metrics);
    assert!(
        metrics.contains(&format!("{PANICS}{{task=\"logged_task\"}} 1\n")),
        "{metrics}"
    );
    task.abort();
}
