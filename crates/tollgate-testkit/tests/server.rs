//! The single-server half of the kit, against real `redis-server` processes.

mod support;

use std::sync::mpsc;
use std::thread;

use support::{port_is_free, process_exists};
use tollgate_testkit::RedisServer;

#[test]
fn serves_commands_then_drop_ends_the_process_and_frees_the_port() {
    let redis = RedisServer::start();
    assert!(redis.is_running());
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    assert_eq!(redis.addr().port(), redis.port());
    assert!(redis.port() < 55_536);
    assert_eq!(redis.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(redis.cli(&["GET", "k"]), "v");
    assert_eq!(redis.cli(&["CONFIG", "GET", "save"]), "save\n");
    assert_eq!(
        redis.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );

    let (port, pid, dir) = (redis.port(), redis.pid().unwrap(), redis.dir().to_owned());
    assert!(process_exists(pid));
    assert!(!port_is_free(port));
    assert!(dir.join("redis.log").exists());
    drop(redis);
    assert!(!process_exists(pid), "redis-server {pid} survived drop");
    assert!(port_is_free(port), "port {port} still taken after drop");
    assert!(!dir.exists(), "{} survived drop", dir.display());
}

#[test]
fn restart_keeps_the_port_and_loses_the_data() {
    let redis = RedisServer::start();
    let port = redis.port();
    let old_pid = redis.pid().unwrap();
    assert_eq!(redis.cli(&["SET", "k", "v"]), "OK");

    redis.restart();
    assert_eq!(redis.port(), port);
    assert!(redis.is_running());
    assert_ne!(redis.pid(), Some(old_pid));
    assert!(!process_exists(old_pid));
    assert_eq!(redis.cli(&["GET", "k"]), "");
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
}

#[test]
fn stop_and_kill_end_the_process_and_restart_brings_it_back() {
    let redis = RedisServer::start();
    let port = redis.port();

    let pid = redis.pid().unwrap();
    redis.stop();
    assert!(!redis.is_running());
    assert_eq!(redis.pid(), None);
    assert!(!process_exists(pid));
    assert!(port_is_free(port));

    redis.restart();
    assert_eq!(redis.cli(&["PING"]), "PONG");

    let pid = redis.pid().unwrap();
    redis.kill();
    assert!(!redis.is_running());
    assert!(!process_exists(pid));

    redis.restart();
    assert_eq!(redis.port(), port);
    assert_eq!(redis.cli(&["PING"]), "PONG");
}

#[test]
fn two_servers_at_once_get_different_ports() {
    let servers: Vec<RedisServer> = thread::scope(|scope| {
        let handles: Vec<_> = (0..2).map(|_| scope.spawn(RedisServer::start)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_ne!(servers[0].port(), servers[1].port());
    servers[0].cli(&["SET", "owner", "first"]);
    assert_eq!(servers[1].cli(&["GET", "owner"]), "");
    assert_eq!(servers[0].cli(&["GET", "owner"]), "first");
}

#[test]
fn builder_arguments_reach_the_server() {
    let redis = RedisServer::builder()
        .args(["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"])
        .arg("--enable-debug-command")
        .arg("yes")
        .start();
    assert_eq!(
        redis.cli(&["CONFIG", "GET", "maxmemory"]),
        "maxmemory\n1048576"
    );
    assert_eq!(redis.cli(&["DEBUG", "SLEEP", "0"]), "OK");
    // One tiny command allocates 2 MB; past maxmemory, noeviction refuses further writes.
    assert_eq!(redis.cli(&["SETRANGE", "big", "2000000", "x"]), "2000001");
    assert!(redis.cli(&["SET", "k", "v"]).starts_with("OOM"));

    // The arguments survive a restart.
    redis.restart();
    assert_eq!(
        redis.cli(&["CONFIG", "GET", "maxmemory"]),
        "maxmemory\n1048576"
    );
}

#[test]
fn a_panicking_test_still_ends_its_server() {
    let (sender, receiver) = mpsc::channel();
    let outcome = thread::spawn(move || {
        let redis = RedisServer::start();
        sender
            .send((redis.port(), redis.pid().unwrap(), redis.dir().to_owned()))
            .unwrap();
        panic!("the test failed");
    })
    .join();
    assert!(outcome.is_err());
    let (port, pid, dir) = receiver.recv().unwrap();
    assert!(
        !process_exists(pid),
        "redis-server {pid} survived the panic"
    );
    assert!(port_is_free(port));
    assert!(!dir.exists());
}

#[test]
fn a_rejected_argument_panics_with_the_server_log() {
    let outcome = std::panic::catch_unwind(|| {
        RedisServer::builder()
            .args(["--no-such-option", "1"])
            .start()
    });
    let payload = outcome.expect_err("redis-server accepted an unknown option");
    let message = payload.downcast_ref::<String>().unwrap();
    assert!(message.contains("exited"), "{message}");
    assert!(message.contains("no-such-option"), "{message}");
}

#[test]
fn restart_waits_for_its_port_when_another_process_holds_it() {
    let redis = RedisServer::start();
    let port = redis.port();
    redis.stop();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    thread::scope(|scope| {
        scope.spawn(|| {
            thread::sleep(std::time::Duration::from_millis(500));
            drop(squatter);
        });
        redis.restart();
    });
    assert_eq!(redis.port(), port);
    assert_eq!(redis.cli(&["PING"]), "PONG");
    assert!(redis.dir().join("redis.log").exists());
    let log = std::fs::read_to_string(redis.dir().join("redis.log")).unwrap();
    assert!(
        log.contains("Address already in use"),
        "restart never met the taken port"
    );
}

#[test]
fn stop_kills_a_server_that_ignores_sigterm() {
    let redis = RedisServer::start();
    let pid = redis.pid().unwrap();
    // A stopped process cannot act on SIGTERM: only the SIGKILL fallback ends it.
    let status = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(redis.is_running());
    redis.stop();
    assert!(!redis.is_running());
    assert!(!process_exists(pid));
}
