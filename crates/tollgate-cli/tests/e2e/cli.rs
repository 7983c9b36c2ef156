//! The binary's subcommands as a user runs them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::process::Command;

use support::{Server, binary};

const GOOD: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 2}
  - key: api_key
    rate_limit: {algorithm: gcra, period: 30s, requests_per_unit: 10, burst: 4}
";

const BAD: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: -1}
  - key: ip
    rate_limit: {unit: fortnight, requests_per_unit: 5}
";

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn validate_summarises_a_good_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "good.yaml", GOOD);
    let out = Command::new(binary())
        .arg("validate")
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("1 domain(s), 2 rule(s)"), "{stdout}");
    assert!(
        stdout.contains("per_user: fixed_window 2 per 86400s"),
        "{stdout}"
    );
    assert!(stdout.contains("gcra 10 per 30s burst 4"), "{stdout}");
}

#[test]
fn validate_reports_every_problem_with_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "bad.yaml", BAD);
    let out = Command::new(binary())
        .arg("validate")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let file = path.display().to_string();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with(&file)).collect();
    assert!(
        lines.iter().any(|l| l.starts_with(&format!("{file}:4:"))),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("{file}:6:")) && l.contains("fortnight")),
        "{stderr}"
    );
    assert!(stderr.contains("2 problem(s) found"), "{stderr}");
}

/// Forward auth with no descriptor would allow every request: refused before anything starts.
#[test]
fn serve_refuses_forward_auth_without_a_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "ok.yaml", "domain: edge\ndescriptors: []\n");
    let (code, stderr) = support::serve_refused(&[
        "--authorize-domain",
        "edge",
        "--config",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--authorize-descriptor"), "{stderr}");
}

#[test]
fn serve_refuses_an_invalid_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "bad.yaml", BAD);
    let out = Command::new(binary())
        .args([
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fortnight") && stderr.contains("not starting"),
        "{stderr}"
    );
}

/// A store URL's password shows nowhere: not in `--help` (which shows environment values), not
/// in the error for a mistyped URL, from the flag or the environment.
#[test]
fn a_store_password_never_shows() {
    let help = Command::new(binary())
        .args(["serve", "--help"])
        .env("TOLLGATE_STORE", "redis://:hunter2@127.0.0.1:1")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("TOLLGATE_STORE"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");

    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "good.yaml", GOOD);
    let serve = |flag: Option<&str>, env: Option<&str>| {
        let mut command = Command::new(binary());
        command
            .args([
                "serve",
                "--http-addr",
                "127.0.0.1:0",
                "--grpc-addr",
                "127.0.0.1:0",
            ])
            .arg("--config")
            .arg(&path)
            .args(flag.map(|url| ["--store", url]).into_iter().flatten())
            .env_remove("TOLLGATE_STORE");
        if let Some(url) = env {
            command.env("TOLLGATE_STORE", url);
        }
        command.output().unwrap()
    };
    for out in [
        serve(Some("memory://:hunter2@x"), None),
        serve(None, Some("redis//:hunter2@127.0.0.1:6379")),
    ] {
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--store") && stderr.contains("***@"),
            "{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    // Nor in the warnings of a server whose Redis is not there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://:hunter2@{}", closed.local_addr().unwrap());
    drop(closed);
    let server = Server::start_logged(GOOD, &["--store", &url]);
    let log = server.log();
    assert!(log.contains("Store not ready yet"), "{log}");
    assert!(!log.contains("hunter2"), "{log}");
}

/// Under `--log-format json` every line on stderr is a JSON object, the reasons for not
/// starting included: an invalid policy, a port in use.
#[test]
fn json_logs_say_why_serve_does_not_start_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(&dir, "bad.yaml", BAD);
    let good = write(&dir, "good.yaml", GOOD);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    for (config, http, says) in [
        (&bad, "127.0.0.1:0", "fortnight"),
        (&good, taken.as_str(), "Address already in use"),
    ] {
        let out = Command::new(binary())
            .args([
                "serve",
                "--log-format",
                "json",
                "--grpc-addr",
                "127.0.0.1:0",
            ])
            .args([
                "--admin-addr",
                "127.0.0.1:0",
                "--http-addr",
                http,
                "--config",
            ])
            .arg(config)
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<serde_json::Value> = stderr
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect();
        let last = lines.last().unwrap();
        assert_eq!(last["level"], "ERROR", "{stderr}");
        assert!(last.to_string().contains(says), "{stderr}");
    }
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        "serve",
        "check",
        "validate",
        "policy",
        "top",
        "bench",
        "bench-server",
    ] {
        let out = Command::new(binary())
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sub} --help");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: tollgate"),
            "{sub}"
        );
    }
}

#[test]
fn check_prints_the_decision_and_exits_by_verdict() {
    let server = Server::start(GOOD);
    let addr = server.url("");
    let run_with = |hits: &str| {
        Command::new(binary())
            .args([
                "check",
                "--domain",
                "api",
                "--descriptor",
                "user=zoe",
                "--hits",
                hits,
                "--addr",
                &addr,
            ])
            .output()
            .unwrap()
    };
    let run = || run_with("1");
    let first = run();
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert_eq!(first.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("OK (HTTP 200)"), "{stdout}");
    assert!(
        stdout.contains("limit `per_user` fixed_window 2 per 86400s, 1 remaining"),
        "{stdout}"
    );
    for _ in 0..2 {
        let checked = run_with("0");
        let stdout = String::from_utf8_lossy(&checked.stdout);
        assert_eq!(checked.status.code(), Some(0), "{stdout}");
        assert!(
            stdout.contains("1 remaining"),
            "--hits 0 counts nothing: {stdout}"
        );
    }
    run();
    assert_eq!(run_with("0").status.code(), Some(1), "no unit left");
    let denied = run();
    let stdout = String::from_utf8_lossy(&denied.stdout);
    assert_eq!(denied.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.starts_with("OVER_LIMIT (HTTP 429), retry after"),
        "{stdout}"
    );

    let malformed = Command::new(binary())
        .args([
            "check",
            "--domain",
            "api",
            "--descriptor",
            "novalue",
            "--addr",
            &addr,
        ])
        .output()
        .unwrap();
    assert_eq!(malformed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("is not key=value"));
}

/// An empty forward-auth domain would refuse every request: refused before anything starts.
#[test]
fn serve_refuses_an_empty_forward_auth_domain() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "ok.yaml", "domain: edge\ndescriptors: []\n");
    let (code, stderr) = support::serve_refused(&[
        "--authorize-domain",
        "",
        "--authorize-descriptor",
        "user=header:x-user",
        "--config",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("must not be empty"), "{stderr}");
}

/// Store settings under which a healthy Redis would never decide (nothing may be in flight, a
/// breaker that opens without a failure, no batch may be sent, a batch window as long as the
/// deadline) would fail every request open: refused before anything starts, naming the flag.
#[test]
fn serve_refuses_store_settings_that_would_never_decide() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "ok.yaml", "domain: edge\ndescriptors: []\n");
    let cases: [(&[&str], &str); 8] = [
        // Up to u64::MAX seconds parses; past a day the deadlines computed from it overflow.
        (
            &["--grpc-keepalive", "18446744073709551615s"],
            "is more than a day (24h)",
        ),
        (&["--store-max-in-flight", "0"], "--store-max-in-flight"),
        // A negative number reaches the option's own check (not clap's "unexpected argument").
        (
            &["--store-max-in-flight", "-3"],
            "`-3` is not a whole number of at least 1",
        ),
        (&["--breaker-failures", "0"], "--breaker-failures"),
        (
            &["--store-batches-in-flight", "0"],
            "--store-batches-in-flight",
        ),
        (
            &["--store-batch-window", "6ms", "--store-timeout", "10ms"],
            "--store-batch-window 6ms is more than half of --store-timeout 10ms",
        ),
        (&["--memory-max-bytes", "4XB"], "--memory-max-bytes"),
        (
            &["--policy-history-max-bytes", "0"],
            "--policy-history-max-bytes",
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["--config", path.to_str().unwrap()];
        args.extend([
            "--store",
            "redis://127.0.0.1:1",
            "--admin-addr",
            "127.0.0.1:0",
        ]);
        args.extend(flags);
        let (code, stderr) = support::serve_refused(&args);
        assert_eq!(code, Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

/// A forward-auth domain the policy does not have (a typo) limits nothing: the server starts
/// (a later policy may add it) but says so.
#[test]
fn serve_warns_of_a_forward_auth_domain_without_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "ok.yaml", "domain: edge\ndescriptors: []\n");
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&path)
        .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .args(["--authorize-domain", "egde"])
        .args(["--authorize-descriptor", "user=header:x-user"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0
        && !line.contains("grpc listening")
    {
        line.clear();
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(line.contains("grpc listening"), "it starts: {stderr}");
    assert!(
        stderr.contains("no rules in the --authorize-domain") && stderr.contains("egde"),
        "{stderr}"
    );
}

/// `top -n 0` would ask for nothing and then say the rule denied nothing: refused.
#[test]
fn top_refuses_a_count_of_zero() {
    let out = Command::new(binary())
        .args(["top", "--domain", "d", "--rule", "r", "-n", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 1"), "{stderr}");
}

/// A reader that stops early (`tollgate validate big.yaml | head -1`) ends the command quietly
/// with status 0, where `println!` panicked on the closed pipe (status 101).
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    // A summary line per rule: far more than a pipe holds, so a write meets the closed end.
    let rules: String = (0..3000)
        .map(|i| format!("  - key: k{i}\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"))
        .collect();
    let path = write(
        &dir,
        "big.yaml",
        &format!("domain: d\ndescriptors:\n{rules}"),
    );
    let mut child = Command::new(binary())
        .arg("validate")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

/// Problems that cannot be written (stderr a closed pipe, `2>&1 | head -1`, or a full disk) still
/// end with the command's own status, 1 for an invalid policy and 2 for an error, where
/// `eprintln!` panicked (status 101).
#[test]
fn problems_into_a_closed_stderr_keep_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(&dir, "bad.yaml", BAD);
    for (args, status) in [
        (vec!["validate", bad.to_str().unwrap()], 1),
        (vec!["validate", "/nonexistent/policy.yaml"], 1),
        (
            vec![
                "check",
                "--domain",
                "d",
                "--descriptor",
                "k",
                "--addr",
                "http://127.0.0.1:1",
            ],
            2,
        ),
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = Command::new(binary())
            .args(&args)
            .stderr(full)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(status), "{args:?}");
    }
}

/// A watch interval that would keep a core busy re-reading the policy files is refused; `0s`
/// (no watching) is not.
#[test]
fn serve_refuses_a_watch_interval_under_100ms() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "good.yaml", GOOD);
    let out = Command::new(binary())
        .args([
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--watch-interval",
            "1ms",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("shorter than 100ms"), "{stderr}");
}
