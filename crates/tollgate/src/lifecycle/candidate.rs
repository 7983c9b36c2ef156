//! The shadow candidate's life cycle: a policy decided beside the running one on real traffic,
//! never enforced, until it is promoted or dropped (see [`crate::limiter::Candidate`]).

use std::sync::Arc;

use tracing::{info, warn};

use super::{Activation, Lifecycle, Origin, PromoteError};
use crate::policy::PolicyErrors;
use crate::policy::sources::sources_hash;

impl Lifecycle {
    /// Validates `sources` exactly as [`Lifecycle::activate`] does (including whether the store
    /// can decide each limit) and, if valid, makes them the shadow candidate. Setting the texts
    /// already shadowing keeps that candidate and its counts; other texts replace it. An invalid
    /// candidate changes nothing.
    pub fn set_candidate(
        &self,
        sources: Vec<(String, String)>,
    ) -> Result<Arc<crate::limiter::Candidate>, PolicyErrors> {
        let hash = sources_hash(&sources);
        if let Some(same) = self.limiter.candidate().filter(|c| c.hash() == hash) {
            return Ok(same);
        }
        let compiled = self.compile(&sources);
        let policy = match compiled {
            Ok(policy) => policy,
            Err(errors) => {
                for e in errors.iter() {
                    warn!(problem = %e, "Policy candidate rejected; the shadow candidate stays");
                }
                return Err(errors);
            }
        };
        let rules = policy.rules().len();
        let candidate = Arc::new(crate::limiter::Candidate::new(
            policy,
            sources,
            self.limiter.clock().now(),
        ));
        let replaced = self.limiter.set_candidate(Some(candidate.clone()));
        info!(
            candidate = %hash,
            rules,
            replaced = replaced.as_ref().map_or("none", |c| c.hash()),
            "Policy candidate shadowing"
        );
        Ok(candidate)
    }

    /// Activates the shadow candidate's texts (as a push) and clears it.
    pub fn promote(&self) -> Result<Activation, PromoteError> {
        self.promote_against(None)
    }

    /// [`Lifecycle::promote`], deciding "unchanged" against `fleet` as
    /// [`Lifecycle::activate_against`] does.
    pub(super) fn promote_against(&self, fleet: Option<&str>) -> Result<Activation, PromoteError> {
        let candidate = self.limiter.candidate().ok_or(PromoteError::NoCandidate)?;
        let activation = self
            .activate_against(candidate.sources().to_vec(), Origin::Push, None, fleet)
            .map_err(PromoteError::Rejected)?;
        // A candidate set meanwhile is a different one: it keeps shadowing.
        self.limiter.clear_candidate(&candidate);
        info!(
            candidate = candidate.hash(),
            version = %activation.version().label(),
            "Policy candidate promoted"
        );
        Ok(activation)
    }

    /// Stops shadowing; returns the candidate dropped, if there was one.
    pub fn drop_candidate(&self) -> Option<Arc<crate::limiter::Candidate>> {
        let dropped = self.limiter.set_candidate(None);
        if let Some(c) = &dropped {
            info!(candidate = c.hash(), "Policy candidate dropped");
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{lifecycle, policy};
    use super::*;

    /// A candidate whose texts become the running policy (promoted on another replica and
    /// adopted from Redis here) stops shadowing; another candidate keeps shadowing.
    #[test]
    fn a_candidate_that_becomes_the_policy_stops_shadowing() {
        let lifecycle = lifecycle();
        lifecycle.set_candidate(policy(3)).unwrap();
        lifecycle.activate(policy(2), Origin::Shared).unwrap();
        assert!(lifecycle.limiter().candidate().is_some(), "another policy");
        lifecycle.activate(policy(3), Origin::Shared).unwrap();
        assert!(lifecycle.limiter().candidate().is_none());
    }
}
