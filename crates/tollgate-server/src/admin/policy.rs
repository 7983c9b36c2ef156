//! Policy versions over the admin API.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tollgate::lifecycle::{Activation, Origin, PolicyVersion, RollbackError, diff as version_diff};
use tollgate::policy::PolicyErrors;

use super::{AdminPath, AdminQuery, AdminState};
use crate::http::{Body, error_response};
use crate::json_object::{Object, from_body};

fn summary(v: &PolicyVersion, current: u64) -> Value {
    json!({
        "seq": v.seq,
        "hash": v.hash,
        "version": v.label(),
        "origin": v.origin.name(),
        "accepted_at_us": v.accepted_at.as_micros(),
        "rules": v.rules,
        "files": v.sources.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        "current": v.seq == current,
    })
}

pub(super) fn activation(result: Result<Activation, PolicyErrors>) -> Response {
    match result {
        Ok(a) => {
            let (status, v) = match &a {
                Activation::Activated(v) => ("activated", v),
                Activation::Unchanged(v) => ("unchanged", v),
                Activation::Superseded(v) => {
                    return (
                        StatusCode::CONFLICT,
                        Json(json!({
                            "error": format!(
                                "version {} became the running one meanwhile; nothing changed, \
                                 try again",
                                v.label()
                            ),
                            "version": summary(v, v.seq),
                        })),
                    )
                        .into_response();
                }
            };
            Json(json!({"result": status, "version": summary(v, v.seq)})).into_response()
        }
        Err(errors) => (
            StatusCode::BAD_REQUEST,
            Json(json!({
                "error": "invalid policy; the running policy is unchanged",
                "problems": errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
    }
}

pub async fn list(State(state): State<AdminState>) -> Json<Value> {
    let current = state.lifecycle.current().seq;
    let versions: Vec<Value> = state
        .lifecycle
        .versions()
        .iter()
        .map(|v| summary(v, current))
        .collect();
    Json(json!({ "current": current, "versions": versions }))
}

pub async fn show(State(state): State<AdminState>, AdminPath(seq): AdminPath<u64>) -> Response {
    match state.lifecycle.version(seq) {
        Some(v) => {
            let mut body = summary(&v, state.lifecycle.current().seq);
            body["sources"] = v
                .sources
                .iter()
                .map(|(name, text)| json!({"name": name, "text": text}))
                .collect();
            Json(body).into_response()
        }
        None => error_response(StatusCode::NOT_FOUND, format!("no kept version {seq}")),
    }
}

#[derive(Debug, Deserialize)]
pub struct DiffQuery {
    from: u64,
    to: Option<u64>,
}

pub async fn diff(
    State(state): State<AdminState>,
    AdminQuery(q): AdminQuery<DiffQuery>,
) -> Response {
    let lifecycle = &state.lifecycle;
    let to = q.to.unwrap_or_else(|| lifecycle.current().seq);
    match (lifecycle.version(q.from), lifecycle.version(to)) {
        // Off the runtime: a long policy with many changes takes a while to diff, and
        // decisions must not wait behind it.
        (Some(a), Some(b)) => match tokio::task::spawn_blocking(move || version_diff(&a, &b)).await
        {
            Ok(text) => text.into_response(),
            Err(e) => error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the diff failed: {e}"),
            ),
        },
        (a, _) => error_response(
            StatusCode::NOT_FOUND,
            format!("no kept version {}", if a.is_none() { q.from } else { to }),
        ),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushBody {
    sources: Vec<Object<PushSource>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PushSource {
    name: String,
    text: String,
}

/// The `(name, text)` pairs of a push body, or why the body is refused (a `400`).
pub(super) fn pushed_sources(body: &[u8]) -> Result<Vec<(String, String)>, String> {
    let push: PushBody = from_body(body)?;
    if push.sources.is_empty() {
        return Err("a push needs at least one source".into());
    }
    let sources: Vec<(String, String)> = push
        .sources
        .into_iter()
        .map(|Object(s)| (s.name, s.text))
        .collect();
    // Names tell the sources apart in errors, listings and diffs.
    for (i, (name, _)) in sources.iter().enumerate() {
        if name.trim().is_empty() {
            return Err(format!("source {i} has an empty name"));
        }
        // A name goes into log lines and `file:line:column` errors as it is.
        if name.chars().any(char::is_control) {
            return Err(format!(
                "source {i}'s name {name:?} holds a control character"
            ));
        }
        if sources[..i].iter().any(|(other, _)| other == name) {
            return Err(format!("two sources are named `{name}`"));
        }
    }
    // As a file read from disk is: kept with 50 versions, a larger one only fills memory.
    if let Some((name, text)) = sources
        .iter()
        .find(|(_, text)| text.len() as u64 > tollgate::policy::MAX_POLICY_FILE)
    {
        return Err(format!(
            "source `{name}` is {} bytes, larger than {} MiB, which no policy file needs",
            text.len(),
            tollgate::policy::MAX_POLICY_FILE / (1024 * 1024)
        ));
    }
    Ok(sources)
}

pub async fn push(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Response {
    let sources = match pushed_sources(&body) {
        Ok(sources) => sources,
        Err(why) => return error_response(StatusCode::BAD_REQUEST, why),
    };
    let lifecycle = state.lifecycle.clone();
    activation(lifecycle.activate(sources, Origin::Push))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    to: Option<u64>,
}

pub async fn rollback(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Response {
    let request: RollbackBody = if body.is_empty() {
        RollbackBody::default()
    } else {
        match from_body(&body) {
            Ok(r) => r,
            Err(e) => {
                return error_response(StatusCode::BAD_REQUEST, e);
            }
        }
    };
    match state.lifecycle.rollback(request.to) {
        Ok(a) => activation(Ok(a)),
        Err(e @ RollbackError::NotKept(_)) => error_response(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) => error_response(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

pub async fn reload(State(state): State<AdminState>) -> Response {
    activation(state.lifecycle.reload())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_core::Timestamp;

    use super::*;

    /// An activation another one overtook changed nothing, and says so with a `409`.
    #[test]
    fn an_overtaken_activation_is_a_conflict() {
        let version = Arc::new(PolicyVersion {
            seq: 3,
            hash: "0123456789abcdef".into(),
            origin: Origin::Push,
            accepted_at: Timestamp::from_micros(0),
            sources: Vec::new(),
            rules: 0,
            restored: None,
        });
        let answer = |a: Activation| activation(Ok(a)).status();
        assert_eq!(
            answer(Activation::Superseded(version.clone())),
            StatusCode::CONFLICT
        );
        assert_eq!(answer(Activation::Unchanged(version)), StatusCode::OK);
    }
}
