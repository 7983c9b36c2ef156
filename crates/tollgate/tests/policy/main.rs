//! Policy files: loading, Envoy's format, errors with their locations, matching.
//!
//! One test binary for all of them: each links the whole stack once, not once a file.

mod policy_directory;
mod policy_envoy;
mod policy_errors;
mod policy_matching;
mod policy_quota;
