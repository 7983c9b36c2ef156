//! `GET /v1/admin/top?domain=D&rule=R[&n=10]`: the keys a rule denied most often since the
//! policy was loaded, from a bounded heavy-hitters sketch (counts may overestimate by `error`).
//!
//! The bodies' fields are declared in alphabetical order, the order in which they have always
//! been written.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use tollgate::observe::TopEntry;

use super::extract::AdminQuery;
use super::state::AdminState;
use crate::ApiError;

#[derive(Debug, Deserialize)]
pub struct TopQuery {
    domain: String,
    rule: String,
    n: Option<usize>,
}

/// A rule's top keys.
#[derive(Debug, Serialize)]
pub struct Top {
    domain: String,
    keys: Vec<TopKey>,
    rule: String,
}

/// One key and how often it was denied (at most `error` fewer times than `count`).
#[derive(Debug, Serialize)]
pub struct TopKey {
    count: u64,
    error: u64,
    key: String,
}

impl From<&TopEntry> for TopKey {
    fn from(e: &TopEntry) -> Self {
        TopKey {
            count: e.count,
            error: e.error,
            key: e.key.clone(),
        }
    }
}

pub async fn top(
    State(state): State<AdminState>,
    AdminQuery(q): AdminQuery<TopQuery>,
) -> Result<Json<Top>, ApiError> {
    let n = q.n.unwrap_or(10).min(100);
    if n == 0 {
        return Err(ApiError::invalid("n must be at least 1"));
    }
    match state.lifecycle.limiter().top_keys(&q.domain, &q.rule, n) {
        Some(entries) => Ok(Json(Top {
            keys: entries.iter().map(TopKey::from).collect(),
            domain: q.domain,
            rule: q.rule,
        })),
        None => Err(ApiError::not_found(format!(
            "no rule `{}` in domain `{}`",
            q.rule, q.domain
        ))),
    }
}
