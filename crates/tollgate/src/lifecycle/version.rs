//! One accepted policy, and where it came from.

use tollgate_core::Timestamp;

/// Where a version came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Read from the config path (startup, file change, SIGHUP, reload request).
    File,
    /// Pushed through the admin API (`tollgate policy push`).
    Push,
    /// A rollback to an earlier version's texts.
    Rollback,
    /// Adopted from the version another replica published to the shared store.
    Shared,
    /// Sent by an xDS management server (`--config-source xds://...`), or the empty policy
    /// served before its first push.
    Xds,
}

impl Origin {
    /// Name for the API and logs.
    pub fn name(self) -> &'static str {
        match self {
            Origin::File => "file",
            Origin::Push => "push",
            Origin::Rollback => "rollback",
            Origin::Shared => "shared",
            Origin::Xds => "xds",
        }
    }
}

/// One accepted policy.
#[derive(Debug)]
pub struct PolicyVersion {
    /// 1, 2, 3... in order of acceptance.
    pub seq: u64,
    /// 16 hex digits of the sources' FNV-1a hash: equal texts give equal hashes.
    pub hash: String,
    /// Where it came from.
    pub origin: Origin,
    /// When it was accepted.
    pub accepted_at: Timestamp,
    /// The `(file name, text)` pairs it was compiled from.
    pub sources: Vec<(String, String)>,
    /// Its rules, for listings.
    pub rules: usize,
    /// For a version a rollback made, the version whose texts it restored: a plain rollback
    /// from it steps back from there, so two in a row go back two versions instead of the
    /// second undoing the first.
    pub restored: Option<u64>,
}

impl PolicyVersion {
    /// `seq-hash`, how versions are shown.
    pub fn label(&self) -> String {
        format!("{}-{}", self.seq, self.hash)
    }

    /// The bytes of its sources' names and texts: what the history's byte bound counts.
    pub fn source_bytes(&self) -> usize {
        self.sources
            .iter()
            .map(|(name, text)| name.len().saturating_add(text.len()))
            .fold(0, usize::saturating_add)
    }
}
