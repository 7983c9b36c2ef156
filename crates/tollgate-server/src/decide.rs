//! What the transports ask for a decision: the [`Limiter`], or [`AllowAll`] for the ceiling
//! benchmark.
//!
//! The gRPC service and `POST /v1/check` are generic over [`Decide`] so that a no-op server runs
//! exactly the same decoding, validation and encoding as `tollgate serve`, and differs only in the
//! decision. The dispatch is static: the real server pays nothing for it.

use std::future::Future;

use tollgate::limiter::{CheckRequest, CheckResponse, Code, DescriptorStatus, LimitError, Limiter};

/// Something that answers a validated [`CheckRequest`].
pub trait Decide: Send + Sync + 'static {
    /// Decides `request`, charging whatever it charges.
    fn decide(
        &self,
        request: &CheckRequest,
    ) -> impl Future<Output = Result<CheckResponse, LimitError>> + Send;
}

impl Decide for Limiter {
    fn decide(
        &self,
        request: &CheckRequest,
    ) -> impl Future<Output = Result<CheckResponse, LimitError>> + Send {
        self.check(request)
    }
}

/// Allows every request without looking at a policy or a store: the ceiling `tollgate bench`
/// measures tollgate against (`tollgate bench-server`). A benchmarking aid, never for production.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Decide for AllowAll {
    async fn decide(&self, request: &CheckRequest) -> Result<CheckResponse, LimitError> {
        // One unlimited OK status per descriptor, as the real limiter reports a descriptor that
        // matched no rule: a valid, minimal answer.
        let statuses = request
            .descriptors()
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok,
                limit: None,
                decision: None,
                shadow_would_deny: false,
                soft_exceeded: false,
                degraded: None,
            })
            .collect();
        Ok(CheckResponse {
            overall: Code::Ok,
            statuses,
        })
    }
}
