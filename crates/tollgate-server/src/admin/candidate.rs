//! The shadow candidate over the admin API: set one, read what it would have denied, promote or
//! drop it.
//!
//! The bodies' fields are declared in alphabetical order, the order in which they have always
//! been written.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use tollgate::limiter::Candidate;

use super::policy::{Activated, activation, invalid_policy, pushed_sources};
use super::state::AdminState;
use super::top::TopKey;
use crate::ApiError;
use crate::http::Body;

/// Top keys listed per rule in a report.
const TOP_KEYS: usize = 5;

fn no_candidate() -> ApiError {
    ApiError::not_found("no candidate policy is shadowing")
}

/// What the candidate would have decided since it started shadowing.
#[derive(Debug, Serialize)]
pub struct Report {
    files: Vec<String>,
    hash: String,
    rules: Vec<RuleReport>,
    shadowing_for_ms: u64,
    started_at_us: u64,
}

/// One candidate rule's counts.
#[derive(Debug, Serialize)]
pub struct RuleReport {
    allowed: u64,
    domain: String,
    mode: &'static str,
    name: String,
    top_keys: Vec<TopKey>,
    would_deny: u64,
}

fn report(state: &AdminState, candidate: &Candidate) -> Report {
    let now = state.lifecycle.limiter().clock().now();
    let started = candidate.started_at();
    let rules = candidate
        .report(TOP_KEYS)
        .iter()
        .map(|r| RuleReport {
            allowed: r.allowed,
            domain: r.domain.clone(),
            mode: r.mode.name(),
            name: r.name.clone(),
            top_keys: r.top.iter().map(TopKey::from).collect(),
            would_deny: r.would_deny,
        })
        .collect();
    Report {
        files: candidate.sources().iter().map(|(n, _)| n.clone()).collect(),
        hash: candidate.hash().to_owned(),
        rules,
        shadowing_for_ms: now.as_micros().saturating_sub(started.as_micros()) / 1000,
        started_at_us: started.as_micros(),
    }
}

/// `POST /v1/admin/policy/candidate`: the push body; validated like a push, then shadowed.
pub async fn set(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Result<Json<Report>, ApiError> {
    super::managed::writable(&state)?;
    let sources = pushed_sources(&body)?;
    match state.lifecycle.set_candidate(sources) {
        Ok(candidate) => Ok(Json(report(&state, &candidate))),
        Err(errors) => Err(invalid_policy("the shadow candidate is unchanged", &errors)),
    }
}

/// `GET /v1/admin/policy/candidate`: what each candidate rule would have decided.
pub async fn show(State(state): State<AdminState>) -> Result<Json<Report>, ApiError> {
    let candidate = state
        .lifecycle
        .limiter()
        .candidate()
        .ok_or_else(no_candidate)?;
    Ok(Json(report(&state, &candidate)))
}

/// `POST /v1/admin/policy/promote`: the candidate becomes the running policy.
pub async fn promote(State(state): State<AdminState>) -> Result<Json<Activated>, ApiError> {
    super::managed::writable(&state)?;
    if state.lifecycle.limiter().candidate().is_none() {
        return Err(no_candidate());
    }
    match state.lifecycle.fleet_promote().await {
        Ok(a) => activation(Ok(a)),
        Err(why) => Err(ApiError::invalid(why.to_string())),
    }
}

/// What a dropped candidate was.
#[derive(Debug, Serialize)]
pub struct Dropped {
    hash: String,
    result: &'static str,
}

/// `DELETE /v1/admin/policy/candidate`: stop shadowing.
pub async fn remove(State(state): State<AdminState>) -> Result<Json<Dropped>, ApiError> {
    super::managed::writable(&state)?;
    let candidate = state.lifecycle.drop_candidate().ok_or_else(no_candidate)?;
    Ok(Json(Dropped {
        hash: candidate.hash().to_owned(),
        result: "dropped",
    }))
}
