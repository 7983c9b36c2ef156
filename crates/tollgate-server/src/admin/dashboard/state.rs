//! What the dashboard's handlers share: the admin state, the history and the tokens.

use std::sync::Arc;

use axum::extract::FromRef;
use tollgate::observe::history::History;

use crate::admin::state::AdminState;

/// What the dashboard's handlers share.
#[derive(Debug, Clone)]
pub(super) struct DashboardState {
    pub(super) admin: AdminState,
    pub(super) history: Arc<History>,
    pub(super) tokens: Tokens,
}

impl FromRef<DashboardState> for AdminState {
    fn from_ref(state: &DashboardState) -> AdminState {
        state.admin.clone()
    }
}

/// The admin tokens: `full` changes things (as on the whole admin API), `read` only looks.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// `--admin-token-file`: every admin request needs it.
    pub full: Option<Arc<str>>,
    /// `--admin-read-token-file`: the dashboard's reads take it too.
    pub read: Option<Arc<str>>,
}

impl Tokens {
    /// The tokens given, empty ones as none.
    pub fn new(full: Option<String>, read: Option<String>) -> Tokens {
        let keep = |t: Option<String>| t.filter(|t| !t.is_empty()).map(Into::into);
        Tokens {
            full: keep(full),
            read: keep(read),
        }
    }
}
