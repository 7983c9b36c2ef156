//! A policy managed from outside (xDS) has one writer: the admin API's pushes, reloads,
//! rollbacks and candidates answer `409`, while its versions stay readable and diffable.

use crate::ApiError;

use super::state::AdminState;

/// `409` naming the policy's writer when something outside tollgate manages the policy.
pub(super) fn writable(state: &AdminState) -> Result<(), ApiError> {
    match state.lifecycle.managed_by() {
        None => Ok(()),
        Some(source) => Err(ApiError::conflict(format!(
            "policy is managed by {source}: change it on the management server (versions stay readable here)"
        ))),
    }
}
