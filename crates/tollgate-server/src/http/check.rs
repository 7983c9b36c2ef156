//! `POST /v1/check`: tollgate's own JSON API.
//!
//! Request: `{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "alice"}],
//! "hits_addend": 1}], "hits_addend": 1}`. `hits_addend` is optional at both levels (default 1;
//! the descriptor's wins). A descriptor's 0 checks its limit without charging it; the request's
//! 0 is an error here, unlike in proto3 where 0 means unset.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tollgate::limiter::{
    CheckRequest, CheckResponse, Code, DescriptorStatus, InvalidRequest, LimitOverride,
    RequestDescriptor, Transport, check_cost,
};
use tollgate::resilience::Posture;
use tollgate_core::Verdict;

use super::answer_json::{self, WireResponse, WireStatus};
use super::body::Body;
use super::invalid::InvalidBody;
use super::respond::decision_response;
use crate::ApiError;
use crate::Decide;
use crate::headers::ceil_ms;
use crate::json_object::{Object, from_body};
use crate::units::{period_of_unit, unit_from_name};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireRequest {
    domain: String,
    descriptors: Vec<Object<WireDescriptor>>,
    #[serde(default)]
    hits_addend: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireDescriptor {
    entries: Vec<Object<WireEntry>>,
    #[serde(default)]
    hits_addend: Option<u64>,
    #[serde(default)]
    limit: Option<Object<WireLimit>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireEntry {
    key: String,
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireLimit {
    requests_per_unit: u64,
    unit: String,
}

impl TryFrom<WireRequest> for CheckRequest {
    type Error = InvalidRequest;

    fn try_from(wire: WireRequest) -> Result<Self, Self::Error> {
        let request_cost = check_cost(wire.hits_addend.unwrap_or(1))?;
        let descriptors = wire
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(i, Object(d))| {
                let at = |e: InvalidRequest| InvalidRequest(format!("descriptor {i}: {e}"));
                let limit_override = d
                    .limit
                    .map(|Object(l)| {
                        let period = unit_from_name(&l.unit)
                            .and_then(period_of_unit)
                            .ok_or_else(|| InvalidRequest(format!("unknown unit `{}`", l.unit)))?;
                        LimitOverride::new(l.requests_per_unit, period)
                    })
                    .transpose()
                    .map_err(at)?;
                // Envoy's protocols allow a descriptor without entries (it matches nothing);
                // in tollgate's own API it can only be a caller's mistake.
                if d.entries.is_empty() {
                    return Err(at(InvalidRequest("descriptor has no entries".into())));
                }
                let entries = d
                    .entries
                    .into_iter()
                    .map(|Object(e)| (e.key, e.value))
                    .collect();
                RequestDescriptor::new(
                    entries,
                    d.hits_addend.unwrap_or(request_cost),
                    limit_override,
                )
                .map_err(at)
            })
            .collect::<Result<Vec<_>, _>>()?;
        CheckRequest::new(wire.domain, descriptors)
    }
}

pub(super) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

fn wire_status(status: &DescriptorStatus) -> WireStatus<'_> {
    let decision = status.decision;
    let params = status.limit.as_ref().and_then(|l| l.params());
    WireStatus {
        code: code_name(status.code),
        limit_name: status.limit.as_ref().map(|l| l.name()),
        algorithm: params.map(|p| p.algorithm().name()),
        limit: decision.map(|d| d.limit),
        period_ms: params.map(|p| ceil_ms(p.period())),
        remaining: decision.map(|d| d.remaining),
        reset_after_ms: decision.map(|d| ceil_ms(d.reset_after)),
        retry_after_ms: match status.is_blocked() {
            // Over until its unit ends, as envoyproxy/ratelimit's `duration_until_reset`.
            true => decision.map(|d| ceil_ms(d.reset_after)),
            false => decision.and_then(|d| d.retry_after).map(ceil_ms),
        },
        delay_ms: decision.map(|d| ceil_ms(d.delay)),
        shadow_would_deny: status.shadow_would_deny,
        soft_exceeded: status.soft_exceeded,
        reason: match (decision.map(|d| d.verdict), status.degraded) {
            _ if status.is_blocked() => Some("blocked"),
            (Some(Verdict::Denied), Some(Posture::Closed)) if status.code == Code::OverLimit => {
                Some("store_unavailable")
            }
            (Some(Verdict::CostExceedsCapacity), _) => Some("cost_exceeds_capacity"),
            (Some(Verdict::Denied), _) if status.code == Code::OverLimit => Some("over_limit"),
            _ => None,
        },
        degraded: status.degraded.map(Posture::name),
    }
}

fn encode(decided: &CheckResponse) -> WireResponse<'_> {
    WireResponse {
        allowed: decided.allowed(),
        overall_code: code_name(decided.overall),
        retry_after_ms: decided.retry_after().map(ceil_ms),
        degraded: decided.degraded().map(Posture::name),
        soft_delay_ms: decided.soft_delay().map(ceil_ms),
        statuses: decided.statuses.iter().map(wire_status).collect(),
    }
}

/// A `/v1/check` body (also `/v1/explain`'s) as a request, or why it is not one (a `400`).
pub(super) fn decode(body: &[u8]) -> Result<CheckRequest, InvalidBody> {
    let wire: WireRequest = from_body(body)?;
    Ok(CheckRequest::try_from(wire)?)
}

pub async fn check<D: Decide>(State(decider): State<Arc<D>>, Body(body): Body) -> Response {
    let request = match decode(&body) {
        Ok(r) => r,
        Err(why) => {
            decider.refused(Transport::Http, &why);
            return ApiError::from(why).into_response();
        }
    };
    match decider.decide(&request).await {
        Ok(decided) => decision_response(&decided, answer_json::to_vec(&encode(&decided))),
        Err(e) => {
            decider.refused(Transport::Http, &e);
            ApiError::from(&e).into_response()
        }
    }
}
