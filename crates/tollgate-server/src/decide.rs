//! What the transports ask for a decision: the [`Limiter`], or [`AllowAll`] for the ceiling
//! benchmark.
//!
//! The gRPC service and `POST /v1/check` are generic over [`Decide`] so that a no-op server runs
//! exactly the same decoding, validation and encoding as `tollgate serve`, and differs only in the
//! decision. The dispatch is static: the real server pays nothing for it.

use std::future::Future;
use std::time::Duration;

use tollgate::limiter::{
    AppliedLimit, CheckRequest, CheckResponse, Code, DescriptorStatus, LimitError, Limiter,
    Transport,
};
use tollgate_core::{Algorithm, Decision, Params, Verdict};

/// Something that answers a validated [`CheckRequest`].
pub trait Decide: Send + Sync + 'static {
    /// Decides `request`, charging whatever it charges.
    fn decide(
        &self,
        request: &CheckRequest,
    ) -> impl Future<Output = Result<CheckResponse, LimitError>> + Send;

    /// A request refused as invalid, over `over`, for `why`.
    fn refused(&self, over: Transport, why: &dyn std::fmt::Display) {
        let _ = (over, why);
    }
}

impl Decide for Limiter {
    fn decide(
        &self,
        request: &CheckRequest,
    ) -> impl Future<Output = Result<CheckResponse, LimitError>> + Send {
        self.check(request)
    }

    fn refused(&self, over: Transport, why: &dyn std::fmt::Display) {
        self.note_invalid(over, why);
    }
}

/// Allows every request without looking at a policy or a store: the ceiling `tollgate bench`
/// measures tollgate against (`tollgate bench-server`). A benchmarking aid, never for production.
///
/// Each descriptor gets the answer shape a real allowed decision has (a limit, remaining quota,
/// reset time), so the transports encode the same headers and body as for `tollgate serve`,
/// and the two servers differ only in the decision itself.
#[derive(Debug, Clone, Copy)]
pub struct AllowAll {
    limit: Params,
}

impl Default for AllowAll {
    fn default() -> Self {
        AllowAll {
            limit: Params::new(Algorithm::FixedWindow, 1000, Duration::from_secs(1), None)
                .unwrap_or_else(|_| unreachable!("1000 per second is a valid limit")),
        }
    }
}

impl Decide for AllowAll {
    async fn decide(&self, request: &CheckRequest) -> Result<CheckResponse, LimitError> {
        let decision = Decision {
            verdict: Verdict::Allowed,
            limit: self.limit.limit(),
            remaining: self.limit.limit() - 1,
            reset_after: self.limit.period(),
            retry_after: None,
            delay: Duration::ZERO,
        };
        let statuses = request
            .descriptors()
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok,
                limit: Some(AppliedLimit::Override(self.limit)),
                decision: Some(decision),
                shadow_would_deny: false,
                soft_exceeded: false,
                degraded: None,
                unlimited_rule: false,
            })
            .collect();
        Ok(CheckResponse {
            overall: Code::Ok,
            statuses,
        })
    }
}
