//! One table mapping every error to an HTTP status and a gRPC code. (A store failure is not an
//! error: the failure postures answer it; see `tollgate::limiter::FailureSettings`.)

use axum::http::StatusCode;
use tollgate::limiter::LimitError;

/// How an error is reported on every transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The caller sent something wrong; nothing was counted.
    InvalidRequest,
}

impl ErrorClass {
    /// Classifies a limiter error.
    pub fn of(error: &LimitError) -> Self {
        match error {
            LimitError::Invalid(_) => ErrorClass::InvalidRequest,
        }
    }

    /// HTTP status for this class.
    pub fn http_status(self) -> StatusCode {
        match self {
            ErrorClass::InvalidRequest => StatusCode::BAD_REQUEST,
        }
    }

    /// gRPC code for this class.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorClass::InvalidRequest => tonic::Code::InvalidArgument,
        }
    }
}
