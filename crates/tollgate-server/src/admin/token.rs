//! The admin token: every admin request must carry it when one is configured.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tracing::warn;

use super::state::AdminState;
use crate::ApiError;

pub(super) async fn require_token(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(expected) = &state.token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), expected.as_bytes())) {
            let due = state.refusals.note(Instant::now());
            // The path without its query, which may hold anything (a token, even); the client
            // is in the span around this request.
            if let Some(suppressed) = due {
                warn!(method = %request.method(), path = request.uri().path(), suppressed,
                    "Admin request refused: missing or wrong token");
            }
            return ApiError::unauthorized("missing or wrong admin token").into_response();
        }
    }
    next.run(request).await
}

/// The token of an `Authorization: Bearer TOKEN` value; the scheme's name is case-insensitive
/// (RFC 9110).
pub(super) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_comparison() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secret2"));
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"] {
            assert_eq!(super::bearer_token(value), Some("s3cret"), "{value}");
        }
        assert_eq!(super::bearer_token("Basic s3cret"), None);
        assert_eq!(super::bearer_token("Bearers3cret"), None);
    }
}
