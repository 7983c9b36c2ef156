//! `POST /v1/explain`: the same body as `/v1/check`; charges nothing and answers which rules
//! matched (an unlimited rule, or one set aside by another's `replaces`, too), which binds, the
//! current counters and each rule's mode.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use tollgate::limiter::{AppliedLimit, Limiter};

use super::body::Body;
use super::check::{code_name, decode};
use crate::ApiError;
use crate::headers::ceil_ms;

pub async fn explain(
    State(limiter): State<Arc<Limiter>>,
    Body(body): Body,
) -> Result<Json<Value>, ApiError> {
    let request = match decode(&body) {
        Ok(r) => r,
        Err(why) => return Err(ApiError::from(why)),
    };
    let answer = limiter.explain(&request).await?;
    let binding = answer.binding_index();
    let policy = limiter.policy();
    let statuses: Vec<Value> = answer
        .statuses
        .iter()
        .zip(request.descriptors())
        .enumerate()
        .map(|(i, (s, d))| {
            let entries: Vec<Value> = d
                .entries()
                .iter()
                .map(|(k, v)| json!({"key": k, "value": v}))
                .collect();
            let mut v = json!({
                "entries": entries,
                "code": code_name(s.code),
                "matched": s.limit.is_some(),
                "binding": binding == Some(i),
            });
            if s.limit.is_none()
                && let Some(rule) = policy.find(request.domain(), d.entries())
            {
                // A rule matched but applies no limit: it is unlimited, or another matched
                // rule's `replaces` (or an unlimited one's) set it aside.
                v["matched"] = json!(true);
                v["limit_name"] = json!(rule.name);
                v["rule_location"] = json!(rule.location.to_string());
                v["mode"] = json!(rule.mode.name());
                v["source"] = json!("policy");
                if rule.limit.is_none() {
                    v["unlimited"] = json!(true);
                } else {
                    v["replaced"] = json!(true);
                }
            }
            if let (Some(limit), Some(decision)) = (&s.limit, s.decision) {
                let rule = limit.rule();
                let params = limit.params();
                v["limit_name"] = json!(limit.name());
                v["source"] = json!(match limit {
                    AppliedLimit::Rule(_) => "policy",
                    AppliedLimit::Overridden(..) => "runtime_override",
                    AppliedLimit::Blocked(_, Some(_)) => "policy",
                    AppliedLimit::Override(_) | AppliedLimit::Blocked(_, None) =>
                        "request_override",
                });
                v["rule_location"] = json!(rule.map(|r| r.location.to_string()));
                v["mode"] = json!(rule.map_or("enforce", |r| r.mode.name()));
                v["on_store_error"] = json!(limiter.posture_of(Some(limit)).name());
                v["algorithm"] = json!(params.map(|p| p.algorithm().name()));
                v["limit"] = json!(decision.limit);
                v["period_ms"] = json!(params.map(|p| ceil_ms(p.period())));
                v["remaining"] = json!(decision.remaining);
                v["reset_after_ms"] = json!(ceil_ms(decision.reset_after));
                v["retry_after_ms"] = json!(decision.retry_after.map(ceil_ms));
                v["would_allow"] = json!(decision.is_allowed());
                if let Some(p) = s.degraded {
                    v["degraded"] = json!(p.name());
                }
            }
            v
        })
        .collect();
    Ok(Json(json!({
        "would_allow": answer.allowed(),
        "overall_code": code_name(answer.overall),
        "statuses": statuses,
    })))
}
