//! Which of the script's paths decides a request, seen from Redis's `MONITOR`: every one-charge
//! request of a cost, whatever its flags (enforced or not, quota mode or not, a gRPC request's
//! "checks as the counter stands"), goes to the one-charge path, which reads the hash's fields
//! `t x y p` (and `z`, `l` as its algorithm needs) but not `b`; the general path reads `b`.
//!
//! Both paths decide alike (the Lua twin tests hold each to the Rust core), so only speed tells
//! them apart, and a request that silently took the general one cost Redis nearly twice the time
//! (every gRPC charge did, until the flags it sent were fixed): this pins the plan.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use tollgate::store::{Charge, Store};
use tollgate_core::Algorithm;
use tollgate_testkit::RedisServer;

use super::redis_support::{hourly, open_ready};

/// The fields of each `HMGET` the script ran on `key`, as `MONITOR` shows them, while `run`
/// decides: one list per read, in order.
async fn reads_of<F: std::future::Future<Output = ()>>(
    redis: &RedisServer,
    key: &[u8],
    run: F,
) -> Vec<Vec<String>> {
    let stream = TcpStream::connect(redis.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    (&stream).write_all(b"MONITOR\r\n").unwrap();
    let mut lines = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "+OK", "MONITOR answered {line:?}");

    run.await;
    // A marker after the decision: everything the script ran comes before it.
    redis.cli(&["ECHO", "reads-done"]);

    // The store's key is `tg:{tag}:` and the charge's.
    let key_end = format!(":{}\"", String::from_utf8_lossy(key));
    // Each line waits at most the read timeout; the test's own commands are a few dozen.
    let mut reads = Vec::new();
    for _ in 0..10_000 {
        line.clear();
        lines.read_line(&mut line).unwrap();
        if line.contains("\"reads-done\"") {
            return reads;
        }
        let Some((_, command)) = line.split_once("] ") else {
            continue;
        };
        let words: Vec<&str> = command.split_whitespace().collect();
        if words.len() > 2 && words[0] == "\"HMGET\"" && words[1].ends_with(&key_end) {
            reads.push(
                words[2..]
                    .iter()
                    .map(|w| w.trim_matches('"').to_owned())
                    .collect(),
            );
        }
    }
    panic!("MONITOR never showed the marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_one_charge_request_of_a_cost_takes_the_one_charge_path() {
    let redis = RedisServer::start();
    let store = open_ready(&redis.url(), Duration::from_secs(2)).await;
    let cases = [
        (Algorithm::FixedWindow, "t x y p"),
        (Algorithm::SlidingWindowCounter, "t x y p z"),
        (Algorithm::Gcra, "t x y p z l"),
        (Algorithm::TokenBucket, "t x y p z l"),
        (Algorithm::LeakyBucket, "t x y p z l"),
    ];
    for (algorithm, fields) in cases {
        let params = hourly(algorithm, 1000);
        for flags in 0..8u8 {
            let key = format!("plan-{algorithm:?}-{flags}").into_bytes();
            let charge = Charge {
                enforce: flags & 1 != 0,
                quota: flags & 2 != 0,
                checks_as_is: flags & 4 != 0,
                ..Charge::new(&key, &params, 1)
            };
            // The first decision makes the key; the second meets a stored state.
            let reads = reads_of(&redis, &key, async {
                for _ in 0..2 {
                    let decisions = store.apply(&[charge]).await.unwrap();
                    assert!(decisions[0].is_allowed(), "{algorithm:?} flags {flags}");
                }
            })
            .await;
            let expected = vec![fields.split(' ').map(str::to_owned).collect::<Vec<_>>(); 2];
            assert_eq!(reads, expected, "{algorithm:?}, flags {flags}");
        }
    }
}

/// The other side: a check (cost 0) answering as the counter stands is the general path's, and
/// `MONITOR` shows it reading `b` — so the test above can tell the paths apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_as_the_counter_stands_takes_the_general_path() {
    let redis = RedisServer::start();
    let store = open_ready(&redis.url(), Duration::from_secs(2)).await;
    let params = hourly(Algorithm::FixedWindow, 1000);
    let key = b"plan-check".to_vec();
    let check = Charge {
        checks_as_is: true,
        ..Charge::new(&key, &params, 0)
    };
    let reads = reads_of(&redis, &key, async {
        store.apply(&[check]).await.unwrap();
    })
    .await;
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert!(reads[0].iter().any(|f| f == "b"), "{reads:?}");
}

/// A replica from before the flags were fixed sends a charge of a cost with the "as the counter
/// stands" flag (8), which means nothing to it: the script's plan takes it to the one-charge
/// path all the same, so a fleet mid-upgrade does not pay the general path for its old replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_replicas_flagged_charge_takes_the_one_charge_path() {
    use tollgate::store::redis::script::{batch_request_arg, decide_args, decide_batch_library};

    let redis = RedisServer::start();
    let library = decide_batch_library();
    let loaded = redis.cli(&["FUNCTION", "LOAD", &library.code]);
    assert!(
        loaded.starts_with("tollgate_"),
        "FUNCTION LOAD answered {loaded}"
    );
    let params = hourly(Algorithm::FixedWindow, 1000);
    for flags in [8, 9, 12, 13] {
        let name = format!("plan-older-{flags}");
        let key = format!("tg:{{older}}:{name}");
        let mut args = decide_args(&Charge::new(key.as_bytes(), &params, 1));
        args[5] = flags;
        let mut request = Vec::new();
        batch_request_arg(&mut request, true, [args].iter());
        let request = String::from_utf8(request).unwrap();
        let reads = reads_of(&redis, name.as_bytes(), async {
            let reply = redis.cli(&["FCALL", &library.function, "1", &key, "", &request]);
            // The call's now, then the short form of an allowed charge: -2, remaining 999.
            let words: Vec<&str> = reply.lines().collect();
            assert_eq!(words.get(1..3), Some(&["-2", "999"][..]), "{reply}");
        })
        .await;
        assert_eq!(reads, vec![vec!["t", "x", "y", "p"]], "flags {flags}");
    }
}
