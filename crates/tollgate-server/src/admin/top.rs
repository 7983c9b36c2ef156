//! `GET /v1/admin/top?domain=D&rule=R[&n=10]`: the keys a rule denied most often since the
//! policy was loaded, from a bounded heavy-hitters sketch (counts may overestimate by `error`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{AdminQuery, AdminState};
use crate::http::error_response;

#[derive(Debug, Deserialize)]
pub struct TopQuery {
    domain: String,
    rule: String,
    n: Option<usize>,
}

pub async fn top(State(state): State<AdminState>, AdminQuery(q): AdminQuery<TopQuery>) -> Response {
    let n = q.n.unwrap_or(10).min(100);
    if n == 0 {
        return error_response(StatusCode::BAD_REQUEST, "n must be at least 1".into());
    }
    match state.lifecycle.limiter().top_keys(&q.domain, &q.rule, n) {
        Some(entries) => {
            let keys: Vec<_> = entries
                .iter()
                .map(|e| json!({"key": e.key, "count": e.count, "error": e.error}))
                .collect();
            Json(json!({"domain": q.domain, "rule": q.rule, "keys": keys})).into_response()
        }
        None => error_response(
            StatusCode::NOT_FOUND,
            format!("no rule `{}` in domain `{}`", q.rule, q.domain),
        ),
    }
}
