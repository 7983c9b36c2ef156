//! The remote client when the service cannot answer: the caller-side posture decides, within
//! the timeout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use tollgate::limiter::{CheckRequest, RequestDescriptor};
use tollgate_client::{Backend, Outcome, Posture, Remote};

const TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling slack on a loaded 2-core machine.
const MARGIN: Duration = Duration::from_millis(300);

fn request() -> CheckRequest {
    let d = RequestDescriptor::new(vec![("user".into(), "alice".into())], 1, None).unwrap();
    CheckRequest::new("api".into(), vec![d]).unwrap()
}

/// A loopback port with no listener behind it.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A listener that accepts connections and never answers; kept open by the returned task.
async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (url, task)
}

async fn decide(url: &str, posture: Posture) -> (tollgate_client::Verdict, Duration) {
    let remote = Remote::http(url, TIMEOUT, posture).unwrap();
    // `Instant` is banned outside the real clock for library code; tests measure wall time.
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let verdict = remote.check(&request()).await.unwrap();
    (verdict, started.elapsed())
}

#[tokio::test]
async fn unreachable_service_open_posture_allows_marked_degraded() {
    let url = format!("http://127.0.0.1:{}", dead_port());
    let (verdict, elapsed) = decide(&url, Posture::Open).await;
    assert_eq!(verdict.outcome, Outcome::Allowed);
    assert_eq!(verdict.header("x-tollgate-degraded"), Some("open"));
    assert!(elapsed < TIMEOUT + MARGIN, "took {elapsed:?}");
}

#[tokio::test]
async fn unreachable_service_closed_posture_denies_as_unavailable() {
    let url = format!("http://127.0.0.1:{}", dead_port());
    let (verdict, elapsed) = decide(&url, Posture::Closed).await;
    assert_eq!(verdict.outcome, Outcome::Unavailable);
    assert_eq!(verdict.header("x-tollgate-degraded"), Some("closed"));
    assert_eq!(verdict.header("retry-after"), Some("1"));
    assert!(elapsed < TIMEOUT + MARGIN, "took {elapsed:?}");
}

#[tokio::test]
async fn silent_service_answers_by_posture_within_the_timeout() {
    let (url, task) = silent_server().await;
    for (posture, outcome) in [
        (Posture::Open, Outcome::Allowed),
        (Posture::Closed, Outcome::Unavailable),
    ] {
        let (verdict, elapsed) = decide(&url, posture).await;
        assert_eq!(verdict.outcome, outcome);
        assert!(
            elapsed >= TIMEOUT,
            "answered before the timeout: {elapsed:?}"
        );
        assert!(elapsed < TIMEOUT + MARGIN, "took {elapsed:?}");
    }
    task.abort();
}
