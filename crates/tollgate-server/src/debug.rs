//! The read-only debug listener (`--debug-addr`, envoyproxy/ratelimit's `DEBUG_PORT`): `GET
//! /rlconfig`, the loaded limits as text. Nothing else is served on it, and nothing that
//! changes anything: the admin API has a listener (and tokens) of its own.

use std::fmt::Write;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tollgate::lifecycle::Lifecycle;
use tollgate::policy::{Policy, RuleMode};

use crate::ApiError;

/// The debug routes over the policy `lifecycle` runs.
pub fn router(lifecycle: Arc<Lifecycle>) -> Router {
    Router::new()
        .route("/rlconfig", get(rlconfig))
        .with_state(lifecycle)
        .fallback(|| async { ApiError::not_found("the debug listener serves only /rlconfig") })
        .method_not_allowed_fallback(|| async {
            ApiError::method_not_allowed("the debug listener is read-only")
        })
}

async fn rlconfig(State(lifecycle): State<Arc<Lifecycle>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        dump(&lifecycle.limiter().policy()),
    )
}

/// One line per rule, in upstream's layout: `DOMAIN.NAME: unit=UNIT requests_per_unit=N,
/// shadow_mode: BOOL, quota_mode: BOOL`. NAME is the rule's (its descriptor path, `key_value`
/// levels joined by `.`, when it was not given one, which is upstream's key); UNIT is Envoy's
/// unit name, `UNKNOWN` for a `period` that is none and for `unlimited` (with 0 requests, as
/// upstream writes it); a `requests_per_unit: 0` block shows 0.
pub fn dump(policy: &Policy) -> String {
    let mut out = String::new();
    for rule in policy.rules() {
        let unit = match (rule.unit, &rule.limit) {
            (Some(unit), Some(_)) => unit.name().to_ascii_uppercase(),
            _ => "UNKNOWN".to_owned(),
        };
        let requests = match &rule.limit {
            Some(_) if rule.blocked => 0,
            Some(params) => params.limit(),
            None => 0,
        };
        let _ = writeln!(
            out,
            "{}.{}: unit={unit} requests_per_unit={requests}, shadow_mode: {}, quota_mode: false",
            rule.domain,
            rule.name,
            rule.mode == RuleMode::Shadow,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_is_one_line_in_upstreams_layout() {
        let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: path\n    value: /login\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: free\n    rate_limit: {unlimited: true}\n";
        let policy = Policy::from_yaml("api.yaml", yaml).unwrap();
        assert_eq!(
            dump(&policy),
            "api.user: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false\n\
             api.path_/login: unit=SECOND requests_per_unit=2, shadow_mode: true, quota_mode: false\n\
             api.free: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n"
        );
    }
}
