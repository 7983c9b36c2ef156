//! A store call cut at a deadline: its answer, or the failure of what it called to answer in time.

use tokio::time::Instant;

use crate::store::{RedisCall, StoreError, Timeout};

/// `work`'s answer, or once `deadline` has passed, the failure of `what` (a kind of call) to
/// answer in time.
pub(super) async fn within<T>(
    deadline: Instant,
    what: RedisCall,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout_at(deadline, work).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::TimedOut(Timeout::Call(what))),
    }
}
