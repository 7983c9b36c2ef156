//! Why upstream's environment cannot start `serve`.

/// Why upstream's environment cannot start `serve`. Each names the variables involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamEnvError {
    /// A variable tollgate knows, set to something it cannot do.
    #[error("{var}={value}: {why}")]
    Unhonourable {
        var: &'static str,
        value: String,
        why: &'static str,
    },
    /// A value that is not of the variable's form.
    #[error("{var}={value}: {why}")]
    Invalid {
        var: &'static str,
        value: String,
        why: String,
    },
    /// Two variables that say different things about one setting.
    #[error("{first} and {second} disagree: {why}")]
    Conflict {
        first: String,
        second: String,
        why: String,
    },
    /// The translation sets a `TOLLGATE_*` variable no flag of this build reads.
    #[error("{from} sets {target}, which this build of tollgate does not have")]
    NoSuchSetting { from: String, target: &'static str },
}
