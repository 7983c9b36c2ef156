//! envoyproxy/ratelimit's answers on the wire, from a real third-party client (Python grpcio +
//! envoy-data-plane, as `e2e_python_grpcio`): quota-mode descriptors, a check
//! (`hits_addend: 0`) on a limit exactly used up, and `--default-charge` for rules that do not
//! say how they are charged (as xDS sends them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::process::Command;

use support::Server;

const POLICY: &str = r#"
domain: quota
descriptors:
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: qa
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: qb
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: qs
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 5, charge: up_to_limit}
  - key: xds
    rate_limit: {unit: day, requests_per_unit: 5}
"#;

#[test]
fn python_grpcio_sees_quota_mode_and_checks_as_upstream_answers_them() {
    let server = Server::start(POLICY);
    run_client(&server, "whole");
}

#[test]
fn the_default_charge_applies_to_rules_without_one() {
    let server = Server::start_with_args(POLICY, &["--default-charge", "up_to_limit"]);
    run_client(&server, "up_to_limit");
}

/// `tollgate validate` compiles as `serve` would with the same default, from the flag or
/// from `TOLLGATE_DEFAULT_CHARGE`; a value it does not know is refused, naming it.
#[test]
fn validate_honours_the_default_charge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let validate = |args: &[&str], env: Option<&str>| {
        let mut command = Command::new(support::binary());
        command.arg("validate").args(args).arg(&path);
        command.env_remove("TOLLGATE_DEFAULT_CHARGE");
        if let Some(value) = env {
            command.env("TOLLGATE_DEFAULT_CHARGE", value);
        }
        command.output().unwrap()
    };
    let up_to_limit = |output: &std::process::Output| {
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}");
        let line = |key: &str| {
            stdout
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("quota / {key}:")))
                .unwrap_or_else(|| panic!("no rule {key} in {stdout}"))
                .contains("[charges up to the limit]")
        };
        assert!(line("tokens"), "{stdout}");
        assert!(stdout.contains("[quota mode]"), "{stdout}");
        line("xds")
    };
    assert!(!up_to_limit(&validate(&[], None)));
    assert!(up_to_limit(&validate(
        &["--default-charge", "up_to_limit"],
        None
    )));
    assert!(up_to_limit(&validate(&[], Some("up_to_limit"))));
    let refused = validate(&["--default-charge", "all"], None);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("unknown charge `all`"), "{stderr}");
}

/// Runs `tests/interop/rls_quota_and_checks.py` against `server`, started with
/// `--default-charge default_charge`; fails the test with its output unless it says
/// `interop ok`.
fn run_client(server: &Server, default_charge: &str) {
    let grpc = server.grpc.to_string();
    support::run_interop("rls_quota_and_checks.py", &[&grpc, default_charge]);
}
