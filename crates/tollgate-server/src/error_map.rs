//! One table mapping every error to an HTTP status and a gRPC code.

use axum::http::StatusCode;
use tollgate::limiter::LimitError;

/// How an error is reported on every transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The caller sent something wrong; nothing was counted.
    InvalidRequest,
    /// The limiter could not decide (store failure).
    Unavailable,
}

impl ErrorClass {
    /// Classifies a limiter error.
    pub fn of(error: &LimitError) -> Self {
        match error {
            LimitError::Invalid(_) => ErrorClass::InvalidRequest,
            LimitError::Store(_) => ErrorClass::Unavailable,
        }
    }

    /// HTTP status for this class.
    pub fn http_status(self) -> StatusCode {
        match self {
            ErrorClass::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// gRPC code for this class.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorClass::InvalidRequest => tonic::Code::InvalidArgument,
            ErrorClass::Unavailable => tonic::Code::Unavailable,
        }
    }
}
