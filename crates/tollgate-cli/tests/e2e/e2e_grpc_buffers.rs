//! What hostile gRPC clients may make the server hold: streams whose request message never
//! finishes arriving, and connections past the cap. RSS is read from `/proc/PID/status` of the
//! real server process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{self, Server, descriptor};

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hyper::body::Bytes;

const POLICY: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 1000000}
"#;

/// The message each hostile stream starts: a length prefix announcing 250 000 bytes (under the
/// 256 KiB message limit), then `SENT` of them; the rest never comes.
const DECLARED: u32 = 250_000;
const SENT: usize = 200_000;
/// The HTTP/2 connection preface and an empty SETTINGS frame: a gRPC caller's first bytes.
const HTTP2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A figure (kB) of the server's `/proc/PID/status`: `VmRSS` now, `VmHWM` its peak.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// One HTTP/2 connection opening `streams` `ShouldRateLimit` calls, each sending [`SENT`]
/// bytes of a message and never finishing it. Returns what keeps them open (dropping it resets
/// them), once every stream was opened and written or `within` passed.
async fn unfinished_streams(
    addr: SocketAddr,
    streams: usize,
    within: Duration,
) -> Vec<Box<dyn Send>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    let mut message = Vec::with_capacity(5 + SENT);
    message.push(0u8);
    message.extend_from_slice(&DECLARED.to_be_bytes());
    message.resize(5 + SENT, b'v');
    let message = Bytes::from(message);
    let mut held: Vec<Box<dyn Send>> = vec![Box::new(AbortOnDrop(driver))];
    let deadline = tokio::time::Instant::now() + within;
    for _ in 0..streams {
        client = match tokio::time::timeout_at(deadline, client.clone().ready()).await {
            Ok(Ok(client)) => client,
            // The server closed the connection, or `within` passed: nothing more to open.
            _ => break,
        };
        let request = http::Request::post(format!(
            "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let Ok((response, mut stream)) = client.send_request(request, false) else {
            break;
        };
        let _ = stream.send_data(message.clone(), false);
        held.push(Box::new((response, stream)));
    }
    held.push(Box::new(client));
    held
}

struct AbortOnDrop(tokio::task::JoinHandle<Result<(), h2::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn check() -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor(&[("user", "legit")])],
        hits_addend: 1,
    }
}

/// Waits `settle` for the server to take in what was sent, then returns its peak RSS growth
/// over `before` (kB), checking meanwhile that a legitimate caller on its own connection is
/// answered.
async fn growth_while_answering(server: &Server, before: u64, settle: Duration) -> u64 {
    let mut grpc = server.grpc_client().await;
    let deadline = tokio::time::Instant::now() + settle;
    while tokio::time::Instant::now() < deadline {
        let answered =
            tokio::time::timeout(Duration::from_secs(20), grpc.should_rate_limit(check()))
                .await
                .expect("a legitimate call waited 20 s for its answer")
                .expect("a legitimate call was refused");
        assert_eq!(answered.get_ref().statuses.len(), 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    status_kb(server.pid(), "VmHWM:").saturating_sub(before)
}

/// One connection opening 1,000 streams that each send 200 KB of a message and never finish
/// grew the server by 185-200 MB (each stream may hold up to the 256 KiB message limit): the
/// bytes held per connection are bounded, and another connection is answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_of_unfinished_streams_holds_a_bounded_memory() {
    let server = Server::start(POLICY);
    let mut grpc = server.grpc_client().await;
    grpc.should_rate_limit(check()).await.unwrap();
    let before = status_kb(server.pid(), "VmRSS:");

    let held = unfinished_streams(server.grpc, 1000, Duration::from_secs(60)).await;
    let grown = growth_while_answering(&server, before, Duration::from_secs(3)).await;
    eprintln!(
        "one connection of 1000 unfinished streams: RSS grew {} kB (peak)",
        grown
    );
    assert!(grown < 64 * 1024, "the server grew by {} MB", grown / 1024);
    // The streams past the connection's budget were refused (and so freed), not left to grow.
    let metrics = server.metrics().await;
    let refused: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("tollgate_grpc_requests_refused_total "))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no refused requests counted:\n{metrics}"));
    assert!(refused > 0, "{metrics}");
    drop(held);
}

/// Ten such connections together: the server's RSS stays under a bound (the global budget of
/// request bytes, 64 MiB by default, and what each connection holds besides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_connections_of_unfinished_streams_hold_a_bounded_memory() {
    let server = Server::start(POLICY);
    let mut grpc = server.grpc_client().await;
    grpc.should_rate_limit(check()).await.unwrap();
    let before = status_kb(server.pid(), "VmRSS:");

    let hostile = (0..10).map(|_| unfinished_streams(server.grpc, 1000, Duration::from_secs(90)));
    let held = futures_util::future::join_all(hostile).await;
    let grown = growth_while_answering(&server, before, Duration::from_secs(3)).await;
    eprintln!(
        "ten connections of 1000 unfinished streams: RSS grew {} kB (peak)",
        grown
    );
    assert!(grown < 128 * 1024, "the server grew by {} MB", grown / 1024);
    drop(held);
}

/// Past `--grpc-max-connections`, a new connection is closed at once, counted and logged; one
/// closing makes room for the next.
#[tokio::test]
async fn connections_past_the_cap_are_refused() {
    let server = Server::start_logged(POLICY, &["--grpc-max-connections", "2"]);
    let first = server.grpc_client().await;
    let mut second = server.grpc_client().await;
    second.should_rate_limit(check()).await.unwrap();

    let mut third = support::silent_client(server.grpc, HTTP2_HELLO);
    assert!(
        support::closed_within(&mut third, Duration::from_secs(10)),
        "a third connection was kept past a cap of 2"
    );
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("tollgate_grpc_connections_refused_total 1\n"),
        "{metrics}"
    );
    assert!(
        server.log().contains("gRPC connection refused"),
        "{}",
        server.log()
    );

    drop(first);
    support::eventually(
        Duration::from_secs(10),
        "a connection after one closed",
        async || {
            let mut next = support::silent_client(server.grpc, HTTP2_HELLO);
            !support::closed_within(&mut next, Duration::from_millis(500))
        },
    )
    .await;
}
