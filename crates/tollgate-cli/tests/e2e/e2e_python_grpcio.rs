//! A real third-party Envoy RLS client (Python grpcio + envoy-data-plane) against the binary.
//!
//! The interpreter is `$TOLLGATE_PYTHON` (the test command points it at a virtualenv with
//! `tests/interop/requirements.txt`), else `python3`. Missing packages fail the test; they are
//! never a silent skip.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use support::Server;

const POLICY: &str = r#"
domain: interop
descriptors:
  - key: client
    rate_limit: {name: per_client, unit: day, requests_per_unit: 3}
  - key: anon
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: anon
    value: blocked
    rate_limit: {name: blocklist, unit: hour, requests_per_unit: 0}
  - key: free
    value: "yes"
    rate_limit: {unlimited: true}
"#;

#[test]
fn python_grpcio_client_gets_envoy_semantics() {
    let server = Server::start(POLICY);
    run_interop_client(&server, &[]);
}

/// The same client over TLS (`--grpc-tls-cert`), trusting the test CA as Envoy's
/// `transport_socket` would.
#[test]
fn python_grpcio_client_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = support::certificates(dir.path());
    let server = Server::start_with_args(POLICY, &certs.serve_args(false));
    run_interop_client(&server, &[certs.ca.to_str().unwrap()]);
}

/// Runs `tests/interop/envoy_rls_client.py` against `server`'s gRPC port with `extra`
/// arguments; fails the test with the script's output unless it says `interop ok`.
fn run_interop_client(server: &Server, extra: &[&str]) {
    let grpc = server.grpc.to_string();
    let args: Vec<&str> = std::iter::once(grpc.as_str())
        .chain(extra.iter().copied())
        .collect();
    support::run_interop("envoy_rls_client.py", &args);
}
