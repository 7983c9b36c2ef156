//! The fault proxy against a real `redis-server`, spoken to in raw RESP over std sockets so that
//! every byte, timeout, end-of-file and reset the client sees is visible.
// Helpers outside `#[test]` functions unwrap too: a failed socket call must fail the test.
#![allow(clippy::unwrap_used, clippy::panic)]

#[allow(dead_code)] // this binary uses only `port_is_free`
mod support;

use std::fs;
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::port_is_free;
use tollgate_testkit::{FaultProxy, Mode, RedisServer};

/// How long a read waits before the test calls the connection silent.
const SILENCE: Duration = Duration::from_millis(300);

/// Bound on reads that must succeed (or fail) promptly.
const PROMPT: Duration = Duration::from_secs(2);

const PONG: &[u8] = b"+PONG\r\n";

#[test]
fn pass_forwards_both_ways_and_drop_cleans_up() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    assert_eq!(proxy.addr().port(), proxy.port());
    assert_eq!(proxy.upstream(), redis.addr());
    assert_eq!(proxy.mode(), Mode::Pass);
    assert_ne!(proxy.port(), redis.port());

    let mut client = connect(&proxy);
    let value: String = (0..100).map(|i| char::from(b'!' + i % 90)).collect();
    // Larger than one read chunk, so it crosses the proxy in pieces.
    let large: String = (0..1 << 20)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut sent = 0;
    let mut received = 0;
    for (args, reply) in [
        (vec!["PING"], PONG.to_vec()),
        (vec!["SET", "k", &value], b"+OK\r\n".to_vec()),
        (
            vec!["GET", "k"],
            format!("$100\r\n{value}\r\n").into_bytes(),
        ),
        (vec!["SET", "large", &large], b"+OK\r\n".to_vec()),
        (
            vec!["GET", "large"],
            format!("${}\r\n{large}\r\n", large.len()).into_bytes(),
        ),
    ] {
        let request = encode(&args);
        client.write_all(&request).unwrap();
        assert_eq!(read_exactly(&mut client, reply.len()), reply);
        sent += request.len();
        received += reply.len();
    }
    assert_eq!(redis.cli(&["GET", "k"]), value, "the SET reached Redis");
    assert_eq!(proxy.bytes_forwarded(), (sent + received) as u64);

    let mut other = connect(&proxy);
    ping(&mut other);
    assert_eq!(proxy.connections(), 2);
    drop(other);
    wait_until("the closed connection is forgotten", || {
        proxy.connections() == 1
    });

    let port = proxy.port();
    assert!(!port_is_free(port));
    assert!(proxy_threads(port) >= 5, "accept thread + 4 per connection");
    drop(proxy);
    assert_eq!(read_outcome(&mut client, PROMPT), Outcome::Eof);
    assert_cleaned_up(port);
}

#[test]
fn latency_delays_every_chunk_one_way_without_piling_up() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let mut client = connect(&proxy);
    ping(&mut client);

    let delay = Duration::from_millis(50);
    proxy.set_mode(Mode::Latency(delay));
    let started = now();
    ping(&mut client);
    let round_trip = started.elapsed();
    assert!(
        round_trip >= 2 * delay,
        "request and reply each wait {delay:?}, the round trip took {round_trip:?}"
    );
    assert!(round_trip < Duration::from_secs(5), "took {round_trip:?}");

    // Pings sent 10 ms apart each arrive one delay late. A proxy that delayed each chunk after the
    // previous one would need at least 60 × 50 ms = 3 s; one-way latency needs the sending time
    // plus two delays.
    let count = 60;
    let started = now();
    for _ in 0..count {
        client.write_all(&encode(&["PING"])).unwrap();
        thread::sleep(Duration::from_millis(10));
    }
    let sending = started.elapsed();
    assert_eq!(
        read_exactly(&mut client, count * PONG.len()),
        PONG.repeat(count)
    );
    let total = started.elapsed();
    assert!(total >= 2 * delay, "took {total:?}");
    assert!(
        total < sending + Duration::from_secs(1),
        "pipelined pings took {total:?} after {sending:?} of sending: the delays pile up"
    );

    proxy.set_mode(Mode::Pass);
    ping(&mut client);
    stop(proxy);
}

#[test]
fn blackhole_stalls_without_closing_then_pass_delivers_what_it_held() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let mut open = connect(&proxy);
    ping(&mut open);

    proxy.set_mode(Mode::Blackhole);
    open.write_all(&encode(&["PING"])).unwrap();
    assert_eq!(read_outcome(&mut open, SILENCE), Outcome::Silent(0));
    let mut new = connect(&proxy);
    new.write_all(&encode(&["PING"])).unwrap();
    assert_eq!(read_outcome(&mut new, SILENCE), Outcome::Silent(0));
    assert_eq!(proxy.connections(), 2, "nothing was closed");

    proxy.set_mode(Mode::Pass);
    ping(&mut connect(&proxy));
    // The held requests reach Redis now and their replies come back, in order.
    assert_eq!(read_exactly(&mut open, PONG.len()), PONG);
    assert_eq!(read_exactly(&mut new, PONG.len()), PONG);
    ping(&mut open);
    stop(proxy);
}

#[test]
fn reset_sends_rst_to_open_and_new_connections() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let mut open = connect(&proxy);
    ping(&mut open);

    proxy.set_mode(Mode::Reset);
    assert_eq!(proxy.connections(), 0);
    let started = now();
    assert_eq!(read_outcome(&mut open, PROMPT), Outcome::Reset);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the reset was not prompt"
    );
    for _ in 0..3 {
        // The handshake completes in the kernel before the proxy accepts, so the connect usually
        // succeeds and the next step fails; a connect that polls for completion may see the RST.
        let error = first_error(&proxy);
        assert!(is_reset(&error), "a new connection failed with {error}");
    }
    assert_eq!(proxy.connections(), 0);

    proxy.set_mode(Mode::Pass);
    ping(&mut connect(&proxy));
    stop(proxy);
}

#[test]
fn refuse_closes_and_refuses_then_listens_on_the_same_port_again() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.addr());
    let port = proxy.port();
    let mut open = connect(&proxy);
    ping(&mut open);

    for _ in 0..2 {
        proxy.set_mode(Mode::Refuse);
        assert_eq!(proxy.connections(), 0);
        let refused = TcpStream::connect(proxy.addr()).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);

        proxy.set_mode(Mode::Pass);
        assert_eq!(proxy.port(), port);
        let mut fresh = connect(&proxy);
        ping(&mut fresh);
        assert_eq!(
            read_outcome(&mut open, PROMPT),
            Outcome::Eof,
            "closed with a FIN"
        );
        open = fresh;
    }
    // Straight from refusing to resetting: the port listens again before `set_mode` returns.
    proxy.set_mode(Mode::Refuse);
    proxy.set_mode(Mode::Reset);
    let error = first_error(&proxy);
    assert!(is_reset(&error), "a new connection failed with {error}");
    stop(proxy);
}

#[test]
fn cut_replies_forwards_requests_but_only_the_first_reply_bytes() {
    let redis = RedisServer::start();
    let value = "v".repeat(100);
    assert_eq!(redis.cli(&["SET", "big", &value]), "OK");
    let proxy = FaultProxy::start(redis.addr());
    let mut open = connect(&proxy);
    ping(&mut open);

    proxy.set_mode(Mode::CutReplies { after_bytes: 3 });
    open.write_all(&encode(&["GET", "big"])).unwrap();
    assert_eq!(read_outcome(&mut open, SILENCE), Outcome::Silent(3));
    // Requests still reach Redis even though their replies are held.
    open.write_all(&encode(&["SET", "after-cut", "yes"]))
        .unwrap();
    wait_until("the SET sent after the cut reaches Redis", || {
        redis.cli(&["GET", "after-cut"]) == "yes"
    });
    assert_eq!(read_outcome(&mut open, SILENCE), Outcome::Silent(0));
    // A new connection gets its own allowance.
    let mut new = connect(&proxy);
    new.write_all(&encode(&["PING"])).unwrap();
    assert_eq!(read_outcome(&mut new, SILENCE), Outcome::Silent(3));
    assert_eq!(proxy.connections(), 2, "nothing was closed");

    proxy.set_mode(Mode::Pass);
    let rest = format!("0\r\n{value}\r\n+OK\r\n").into_bytes();
    assert_eq!(read_exactly(&mut open, rest.len()), rest);
    assert_eq!(read_exactly(&mut new, 4), b"NG\r\n");
    ping(&mut open);
    stop(proxy);
}

#[test]
fn a_panicking_test_still_stops_its_proxy() {
    let redis = RedisServer::start();
    let upstream = redis.addr();
    let (sender, receiver) = mpsc::channel();
    let outcome = thread::spawn(move || {
        let proxy = FaultProxy::start(upstream);
        let mut client = connect(&proxy);
        ping(&mut client);
        proxy.set_mode(Mode::Blackhole);
        sender.send((proxy.port(), client)).unwrap();
        panic!("the test failed");
    })
    .join();
    assert!(outcome.is_err());
    let (port, mut client) = receiver.recv().unwrap();
    assert_eq!(read_outcome(&mut client, PROMPT), Outcome::Eof);
    assert_cleaned_up(port);
}

/// Connects to the proxy with bounded reads and writes.
fn connect(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect_timeout(&proxy.addr(), PROMPT).unwrap();
    stream.set_read_timeout(Some(PROMPT)).unwrap();
    stream.set_write_timeout(Some(PROMPT)).unwrap();
    stream
}

/// A RESP command: an array of bulk strings.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

fn ping(stream: &mut TcpStream) {
    stream.write_all(&encode(&["PING"])).unwrap();
    assert_eq!(read_exactly(stream, PONG.len()), PONG);
}

fn read_exactly(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    stream.read_exact(&mut bytes).unwrap();
    bytes
}

/// How reading a connection until it stops ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The read timed out after this many bytes: the connection is open but silent.
    Silent(usize),
    /// End-of-file: the peer closed with a FIN.
    Eof,
    /// The peer reset the connection.
    Reset,
    Other(String),
}

/// Reads until a read times out, returns end-of-file or fails.
fn read_outcome(stream: &mut TcpStream, timeout: Duration) -> Outcome {
    stream.set_read_timeout(Some(timeout)).unwrap();
    let mut total = 0;
    let mut buffer = [0; 1024];
    let outcome = loop {
        match stream.read(&mut buffer) {
            Ok(0) => break Outcome::Eof,
            Ok(n) => total += n,
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break Outcome::Silent(total);
            }
            Err(error) if is_reset(&error) => break Outcome::Reset,
            Err(error) => break Outcome::Other(error.to_string()),
        }
    };
    stream.set_read_timeout(Some(PROMPT)).unwrap();
    outcome
}

/// The first error a new connection meets when it connects, sends `PING` and reads.
fn first_error(proxy: &FaultProxy) -> io::Error {
    let mut buffer = [0; 64];
    let outcome = TcpStream::connect_timeout(&proxy.addr(), PROMPT).and_then(|mut stream| {
        stream.set_read_timeout(Some(PROMPT))?;
        stream.write_all(&encode(&["PING"]))?;
        stream.read(&mut buffer)
    });
    match outcome {
        Ok(n) => panic!("the connection read {n} bytes instead of failing"),
        Err(error) => error,
    }
}

fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
    )
}

/// Drops the proxy and checks that it left nothing behind.
fn stop(proxy: FaultProxy) {
    let port = proxy.port();
    assert!(proxy_threads(port) >= 1, "the accept thread runs");
    drop(proxy);
    assert_cleaned_up(port);
}

fn assert_cleaned_up(port: u16) {
    assert!(port_is_free(port), "port {port} still taken after drop");
    // A joined thread can linger in /proc for a moment while the kernel reaps it.
    wait_until("the proxy's threads are gone", || proxy_threads(port) == 0);
}

/// Threads of this process named after the proxy on `port`.
fn proxy_threads(port: u16) -> usize {
    let prefix = format!("proxy-{port}-");
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(&prefix))
        .count()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = now();
    while !done() {
        assert!(started.elapsed() < PROMPT, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

// The workspace bans `Instant::now` to keep the limiter's clock injectable; these tests measure
// real sockets, which only the real clock can.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}
