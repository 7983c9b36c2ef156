//! Policy versions over the admin API.
//!
//! The bodies' fields are declared in alphabetical order, the order in which they have always
//! been written.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use tollgate::lifecycle::{Activation, Origin, PolicyVersion, RollbackError, diff as version_diff};
use tollgate::policy::PolicyErrors;

use super::extract::{AdminPath, AdminQuery};
use super::invalid::InvalidPush;
use super::state::AdminState;
use crate::ApiError;
use crate::http::Body;
use crate::json_object::{Object, from_body};

/// One kept version, as listed.
#[derive(Debug, Serialize)]
pub struct Summary {
    accepted_at_us: u64,
    current: bool,
    files: Vec<String>,
    hash: String,
    origin: &'static str,
    rules: usize,
    seq: u64,
    version: String,
}

fn summary(v: &PolicyVersion, current: u64) -> Summary {
    Summary {
        accepted_at_us: v.accepted_at.as_micros(),
        current: v.seq == current,
        files: v.sources.iter().map(|(n, _)| n.clone()).collect(),
        hash: v.hash.clone(),
        origin: v.origin.name(),
        rules: v.rules,
        seq: v.seq,
        version: v.label(),
    }
}

/// What an activation did: `activated` or `unchanged`, and the version running now.
#[derive(Debug, Serialize)]
pub struct Activated {
    result: &'static str,
    version: Summary,
}

/// The answer to a push, a reload, a rollback or a promotion: `409` when another activation
/// overtook it, `400` with every problem when the policy is invalid.
pub(super) fn activation(
    result: Result<Activation, PolicyErrors>,
) -> Result<Json<Activated>, ApiError> {
    let (result, v) = match &result {
        Ok(Activation::Activated(v)) => ("activated", v),
        Ok(Activation::Unchanged(v)) => ("unchanged", v),
        Ok(Activation::Superseded(v)) => {
            return Err(ApiError::conflict(format!(
                "version {} became the running one meanwhile; nothing changed, \
                                 try again",
                v.label()
            ))
            .with_detail("version", summary(v, v.seq)));
        }
        Err(errors) => return Err(invalid_policy("the running policy is unchanged", errors)),
    };
    Ok(Json(Activated {
        result,
        version: summary(v, v.seq),
    }))
}

/// `400` for an invalid policy, with every problem; `unchanged` says what was kept.
pub(super) fn invalid_policy(unchanged: &str, errors: &PolicyErrors) -> ApiError {
    ApiError::invalid(format!("invalid policy; {unchanged}")).with_detail(
        "problems",
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
    )
}

/// `GET /v1/admin/policy`: the kept versions.
#[derive(Debug, Serialize)]
pub struct Versions {
    current: u64,
    versions: Vec<Summary>,
}

pub async fn list(State(state): State<AdminState>) -> Json<Versions> {
    let current = state.lifecycle.current().seq;
    let versions = state
        .lifecycle
        .versions()
        .iter()
        .map(|v| summary(v, current))
        .collect();
    Json(Versions { current, versions })
}

/// One version with its source texts.
#[derive(Debug, Serialize)]
pub struct Shown {
    accepted_at_us: u64,
    current: bool,
    files: Vec<String>,
    hash: String,
    origin: &'static str,
    rules: usize,
    seq: u64,
    sources: Vec<Source>,
    version: String,
}

/// A policy file's name and text.
#[derive(Debug, Serialize)]
pub struct Source {
    name: String,
    text: String,
}

pub async fn show(
    State(state): State<AdminState>,
    AdminPath(seq): AdminPath<u64>,
) -> Result<Json<Shown>, ApiError> {
    let v = state
        .lifecycle
        .version(seq)
        .ok_or_else(|| ApiError::not_found(format!("no kept version {seq}")))?;
    let Summary {
        accepted_at_us,
        current,
        files,
        hash,
        origin,
        rules,
        seq,
        version,
    } = summary(&v, state.lifecycle.current().seq);
    let sources = v
        .sources
        .iter()
        .map(|(name, text)| Source {
            name: name.clone(),
            text: text.clone(),
        })
        .collect();
    Ok(Json(Shown {
        accepted_at_us,
        current,
        files,
        hash,
        origin,
        rules,
        seq,
        sources,
        version,
    }))
}

#[derive(Debug, Deserialize)]
pub struct DiffQuery {
    from: u64,
    to: Option<u64>,
}

pub async fn diff(
    State(state): State<AdminState>,
    AdminQuery(q): AdminQuery<DiffQuery>,
) -> Result<String, ApiError> {
    let lifecycle = &state.lifecycle;
    let to = q.to.unwrap_or_else(|| lifecycle.current().seq);
    match (lifecycle.version(q.from), lifecycle.version(to)) {
        // Off the runtime: a long policy with many changes takes a while to diff, and
        // decisions must not wait behind it.
        (Some(a), Some(b)) => match tokio::task::spawn_blocking(move || version_diff(&a, &b)).await
        {
            Ok(text) => Ok(text),
            Err(e) => Err(ApiError::internal(format!("the diff failed: {e}"))),
        },
        (a, _) => Err(ApiError::not_found(format!(
            "no kept version {}",
            if a.is_none() { q.from } else { to }
        ))),
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
pub(super) fn pushed_sources(body: &[u8]) -> Result<Vec<(String, String)>, InvalidPush> {
    let push: PushBody = from_body(body)?;
    if push.sources.is_empty() {
        return Err(InvalidPush::NoSources);
    }
    let sources: Vec<(String, String)> = push
        .sources
        .into_iter()
        .map(|Object(s)| (s.name, s.text))
        .collect();
    // Names tell the sources apart in errors, listings and diffs.
    for (i, (name, _)) in sources.iter().enumerate() {
        if name.trim().is_empty() {
            return Err(InvalidPush::EmptyName(i));
        }
        // A name goes into log lines and `file:line:column` errors as it is.
        if name.chars().any(char::is_control) {
            return Err(InvalidPush::ControlInName {
                index: i,
                name: name.clone(),
            });
        }
        if sources[..i].iter().any(|(other, _)| other == name) {
            return Err(InvalidPush::SameName(name.clone()));
        }
    }
    // As a file read from disk is: a larger one only fills the kept versions' memory.
    if let Some((name, text)) = sources
        .iter()
        .find(|(_, text)| text.len() as u64 > tollgate::policy::MAX_POLICY_FILE)
    {
        return Err(InvalidPush::TooLarge {
            name: name.clone(),
            bytes: text.len(),
        });
    }
    Ok(sources)
}

pub async fn push(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Result<Json<Activated>, ApiError> {
    super::managed::writable(&state)?;
    let sources = pushed_sources(&body)?;
    let lifecycle = state.lifecycle.clone();
    activation(lifecycle.fleet_activate(sources, Origin::Push).await)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    to: Option<u64>,
}

pub async fn rollback(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Result<Json<Activated>, ApiError> {
    super::managed::writable(&state)?;
    let request: RollbackBody = if body.is_empty() {
        RollbackBody::default()
    } else {
        from_body(&body)?
    };
    match state.lifecycle.fleet_rollback(request.to).await {
        Ok(a) => activation(Ok(a)),
        Err(e @ RollbackError::NotKept(_)) => Err(ApiError::not_found(e.to_string())),
        Err(e) => Err(ApiError::invalid(e.to_string())),
    }
}

pub async fn reload(State(state): State<AdminState>) -> Result<Json<Activated>, ApiError> {
    super::managed::writable(&state)?;
    activation(state.lifecycle.fleet_reload().await)
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
        let answer =
            |a: Activation| axum::response::IntoResponse::into_response(activation(Ok(a))).status();
        assert_eq!(
            answer(Activation::Superseded(version.clone())),
            axum::http::StatusCode::CONFLICT
        );
        assert_eq!(
            answer(Activation::Unchanged(version)),
            axum::http::StatusCode::OK
        );
    }
}
