//! What the admin handlers take from a request: a body up to [`MAX_BODY`], and path and query
//! extractors whose rejections answer like every other admin error.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tollgate::policy::MAX_POLICY_FILE;

use crate::ApiError;

/// Largest admin request: a push of a policy file as large as `serve` reads
/// ([`MAX_POLICY_FILE`]), with room for its JSON escaping.
pub const MAX_BODY: usize = 2 * MAX_POLICY_FILE as usize;

/// [`Path`](axum::extract::Path) whose rejection (a malformed segment) is answered like every
/// other admin error: `400` with a JSON `error`, not axum's plain text, which clients that
/// expect JSON cannot read.
pub(super) struct AdminPath<T>(pub T);

/// [`Query`](axum::extract::Query), rejections answered as for [`AdminPath`].
pub(super) struct AdminQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for AdminPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(AdminPath(value)),
            Err(e) => Err(ApiError::invalid(e.body_text())),
        }
    }
}

impl<S, T> FromRequestParts<S> for AdminQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(AdminQuery(value)),
            Err(e) => Err(ApiError::invalid(e.body_text())),
        }
    }
}
