//! The shadow candidate over the admin API: set one, read what it would have denied, promote or
//! drop it.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tollgate::limiter::Candidate;

use super::AdminState;
use super::policy::{activation, pushed_sources};
use crate::http::{Body, error_response};

/// Top keys listed per rule in a report.
const TOP_KEYS: usize = 5;

fn no_candidate() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "no candidate policy is shadowing".into(),
    )
}

fn report(state: &AdminState, candidate: &Candidate) -> Value {
    let now = state.lifecycle.limiter().clock().now();
    let started = candidate.started_at();
    let rules: Vec<Value> = candidate
        .report(TOP_KEYS)
        .iter()
        .map(|r| {
            json!({
                "domain": r.domain,
                "name": r.name,
                "mode": r.mode.name(),
                "allowed": r.allowed,
                "would_deny": r.would_deny,
                "top_keys": r.top.iter()
                    .map(|e| json!({"key": e.key, "count": e.count, "error": e.error}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "hash": candidate.hash(),
        "started_at_us": started.as_micros(),
        "shadowing_for_ms": now.as_micros().saturating_sub(started.as_micros()) / 1000,
        "files": candidate.sources().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        "rules": rules,
    })
}

/// `POST /v1/admin/policy/candidate`: the push body; validated like a push, then shadowed.
pub async fn set(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Response {
    let sources = match pushed_sources(&body) {
        Ok(sources) => sources,
        Err(why) => return error_response(StatusCode::BAD_REQUEST, why),
    };
    match state.lifecycle.set_candidate(sources) {
        Ok(candidate) => Json(report(&state, &candidate)).into_response(),
        Err(errors) => (
            StatusCode::BAD_REQUEST,
            Json(json!({
                "error": "invalid policy; the shadow candidate is unchanged",
                "problems": errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
    }
}

/// `GET /v1/admin/policy/candidate`: what each candidate rule would have decided.
pub async fn show(State(state): State<AdminState>) -> Response {
    match state.lifecycle.limiter().candidate() {
        Some(candidate) => Json(report(&state, &candidate)).into_response(),
        None => no_candidate(),
    }
}

/// `POST /v1/admin/policy/promote`: the candidate becomes the running policy.
pub async fn promote(State(state): State<AdminState>) -> Response {
    if state.lifecycle.limiter().candidate().is_none() {
        return no_candidate();
    }
    match state.lifecycle.promote() {
        Ok(a) => activation(Ok(a)),
        Err(why) => error_response(StatusCode::BAD_REQUEST, why),
    }
}

/// `DELETE /v1/admin/policy/candidate`: stop shadowing.
pub async fn remove(State(state): State<AdminState>) -> Response {
    match state.lifecycle.drop_candidate() {
        Some(candidate) => {
            Json(json!({"result": "dropped", "hash": candidate.hash()})).into_response()
        }
        None => no_candidate(),
    }
}
