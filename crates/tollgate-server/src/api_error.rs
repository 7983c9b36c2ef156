//! One error type for every transport, and ONE table mapping each kind of error to both its
//! HTTP status and its gRPC code ([`ErrorKind::codes`]). Handlers return
//! `Result<_, ApiError>`; the HTTP answer is `{"error": "..."}` (with more fields where the
//! error has details), the gRPC answer a `Status`. (A store failure is not an error: the
//! failure postures answer it; see `tollgate::limiter::FailureSettings`.)
//!
//! The typed errors the handlers meet are given their kind here too ([`KindOf`]), so that no
//! handler picks a status by hand.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
use tollgate::limiter::{InvalidRequest, LimitError};

use crate::admin::{InvalidOverride, InvalidPush};
use crate::http::InvalidBody;
use crate::json_object::InvalidJson;

/// What went wrong, as every transport reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller sent something wrong; nothing was counted or changed.
    Invalid,
    /// The admin token is missing or wrong.
    Unauthorized,
    /// The token given may not do that (a read-only token asked to change something), or the
    /// request's headers are refused (a `Host` or `Origin` that is not this listener's).
    Forbidden,
    /// What was asked for does not exist (an endpoint, a version, an override).
    NotFound,
    /// The endpoint does not take that method.
    MethodNotAllowed,
    /// The request did not arrive in time.
    TooSlow,
    /// Something else changed meanwhile; nothing was done, try again.
    Conflict,
    /// The body is larger than the endpoint takes.
    TooLarge,
    /// The body is encoded in a way the server does not read.
    UnsupportedEncoding,
    /// The server failed at something it should not have.
    Internal,
    /// The request uses an HTTP feature the server does not implement.
    NotImplemented,
}

impl ErrorKind {
    /// The table: each kind's HTTP status and gRPC code.
    pub const fn codes(self) -> (StatusCode, tonic::Code) {
        use tonic::Code;
        match self {
            ErrorKind::Invalid => (StatusCode::BAD_REQUEST, Code::InvalidArgument),
            ErrorKind::Unauthorized => (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
            ErrorKind::Forbidden => (StatusCode::FORBIDDEN, Code::PermissionDenied),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, Code::NotFound),
            ErrorKind::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, Code::Unimplemented),
            ErrorKind::TooSlow => (StatusCode::REQUEST_TIMEOUT, Code::DeadlineExceeded),
            ErrorKind::Conflict => (StatusCode::CONFLICT, Code::Aborted),
            ErrorKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, Code::OutOfRange),
            ErrorKind::UnsupportedEncoding => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, Code::InvalidArgument)
            }
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
            ErrorKind::NotImplemented => (StatusCode::NOT_IMPLEMENTED, Code::Unimplemented),
        }
    }

    /// Every kind, in the table's order.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Invalid,
        ErrorKind::Unauthorized,
        ErrorKind::Forbidden,
        ErrorKind::NotFound,
        ErrorKind::MethodNotAllowed,
        ErrorKind::TooSlow,
        ErrorKind::Conflict,
        ErrorKind::TooLarge,
        ErrorKind::UnsupportedEncoding,
        ErrorKind::Internal,
        ErrorKind::NotImplemented,
    ];

    /// HTTP status of this kind.
    pub const fn http_status(self) -> StatusCode {
        self.codes().0
    }

    /// gRPC code of this kind.
    pub const fn grpc_code(self) -> tonic::Code {
        self.codes().1
    }

    /// The kind whose HTTP status is `status` (for an extractor's rejection, which comes with
    /// one); one not in the table is the caller's fault below 500 and the server's from it.
    pub fn of_status(status: StatusCode) -> ErrorKind {
        ErrorKind::ALL
            .into_iter()
            .find(|kind| kind.http_status() == status)
            .unwrap_or(if status.is_server_error() {
                ErrorKind::Internal
            } else {
                ErrorKind::Invalid
            })
    }
}

/// An error answered to a caller: its kind, its message, and the body's other fields if any.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    kind: ErrorKind,
    message: String,
    details: Map<String, Value>,
}

impl ApiError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// The caller sent something wrong (`400`, `INVALID_ARGUMENT`).
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Invalid, message)
    }

    /// The admin token is missing or wrong (`401` with `WWW-Authenticate: Bearer`,
    /// `UNAUTHENTICATED`).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Unauthorized, message)
    }

    /// Refused for the token's rights or the request's headers (`403`, `PERMISSION_DENIED`).
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Forbidden, message)
    }

    /// No such thing (`404`, `NOT_FOUND`).
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::NotFound, message)
    }

    /// The endpoint does not take that method (`405`, `UNIMPLEMENTED`).
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::MethodNotAllowed, message)
    }

    /// The request did not arrive in time (`408`, `DEADLINE_EXCEEDED`).
    pub fn too_slow(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::TooSlow, message)
    }

    /// Something changed meanwhile (`409`, `ABORTED`).
    pub fn conflict(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Conflict, message)
    }

    /// The body is too large (`413`, `OUT_OF_RANGE`).
    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::TooLarge, message)
    }

    /// The body is encoded in a way the server does not read (`415`, `INVALID_ARGUMENT`).
    pub fn unsupported_encoding(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::UnsupportedEncoding, message)
    }

    /// The server failed (`500`, `INTERNAL`).
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Internal, message)
    }

    /// An HTTP feature the server does not implement (`501`, `UNIMPLEMENTED`).
    pub fn not_implemented(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::NotImplemented, message)
    }

    /// The error with the HTTP status `status` (an extractor's rejection), saying `message`.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::of_status(status), message)
    }

    /// The error with one more field in its HTTP body beside `error`.
    pub fn with_detail(mut self, name: &str, value: impl Serialize) -> Self {
        // A value that does not serialize (none of the server's) is left out.
        if let Ok(value) = serde_json::to_value(value) {
            self.details.insert(name.to_owned(), value);
        }
        self
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What the error says.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

/// A typed error a handler answers with, and its kind in the table.
pub trait KindOf: std::fmt::Display {
    /// The kind of error this is, and so its HTTP status and gRPC code.
    fn kind(&self) -> ErrorKind;
}

/// The kind of each typed error the handlers answer with.
impl KindOf for LimitError {
    fn kind(&self) -> ErrorKind {
        match self {
            LimitError::Invalid(_) => ErrorKind::Invalid,
        }
    }
}

impl KindOf for InvalidRequest {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
}

impl KindOf for InvalidJson {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
}

impl KindOf for InvalidBody {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
}

impl KindOf for InvalidPush {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
}

impl KindOf for InvalidOverride {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
}

impl ApiError {
    /// `error`, with its kind from the table, saying `message` (the error's own message with
    /// what it was about around it).
    pub fn of_kind(error: &impl KindOf, message: impl Into<String>) -> Self {
        ApiError::new(error.kind(), message)
    }
}

/// `From` each typed error (and a reference to one): its kind and its message.
macro_rules! answered_by_kind {
    ($($error:ty),* $(,)?) => {$(
        impl From<&$error> for ApiError {
            fn from(error: &$error) -> Self {
                ApiError::new(error.kind(), error.to_string())
            }
        }

        impl From<$error> for ApiError {
            fn from(error: $error) -> Self {
                ApiError::from(&error)
            }
        }
    )*};
}

answered_by_kind!(
    LimitError,
    InvalidRequest,
    InvalidJson,
    InvalidBody,
    InvalidPush,
    InvalidOverride,
);

impl From<ApiError> for tonic::Status {
    fn from(error: ApiError) -> Self {
        tonic::Status::new(error.kind.grpc_code(), error.message)
    }
}

/// The HTTP body: `error` first, then the details.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    #[serde(flatten)]
    details: &'a Map<String, Value>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: &self.message,
            details: &self.details,
        };
        let mut response = (self.kind.http_status(), axum::Json(body)).into_response();
        // RFC 9110 §15.5.2: a 401 says how to authenticate.
        if self.kind == ErrorKind::Unauthorized {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    async fn body(response: Response) -> Value {
        let bytes = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn each_kind_has_its_own_status_and_is_found_by_it() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::of_status(kind.http_status()), kind);
        }
        assert_eq!(
            ErrorKind::of_status(StatusCode::IM_A_TEAPOT),
            ErrorKind::Invalid
        );
        assert_eq!(
            ErrorKind::of_status(StatusCode::BAD_GATEWAY),
            ErrorKind::Internal
        );
    }

    #[test]
    fn the_table_gives_both_codes() {
        let invalid = ApiError::from(LimitError::Invalid(tollgate::limiter::InvalidRequest(
            "no domain".into(),
        )));
        assert_eq!(invalid.kind().http_status(), StatusCode::BAD_REQUEST);
        let status = tonic::Status::from(invalid.clone());
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), invalid.message());
        assert_eq!(
            ApiError::not_found("x").kind().grpc_code(),
            tonic::Code::NotFound
        );
    }

    #[tokio::test]
    async fn the_http_body_is_the_error_then_its_details() {
        let response = ApiError::conflict("try again")
            .with_detail("version", serde_json::json!({"seq": 3}))
            .into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            body(response).await,
            serde_json::json!({"error": "try again", "version": {"seq": 3}})
        );
        let response = ApiError::unauthorized("no token").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(
            body(response).await,
            serde_json::json!({"error": "no token"})
        );
    }
}
