//! The `tollgate` binary end to end: real listeners on free loopback ports, real Redis, nginx,
//! Prometheus and Python grpcio clients.
//!
//! One test binary for all of them: each links the whole stack once, not once a file.

mod support;

mod bench;
mod cli;
mod e2e_candidate;
mod e2e_dashboard;
mod e2e_envoy_gateway;
mod e2e_governance;
mod e2e_grpc;
mod e2e_grpc_buffers;
mod e2e_http;
mod e2e_metrics;
mod e2e_mixed_fleet;
mod e2e_nginx;
mod e2e_overrides_bulk;
mod e2e_prometheus;
mod e2e_python_grpcio;
mod e2e_redis;
mod e2e_remote_client;
mod e2e_rls_quota;
mod e2e_upstream_env;
mod e2e_xds;
