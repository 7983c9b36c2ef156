//! Watching the config path: the policy files are read again when they change (the file
//! watcher, a reload request, SIGHUP), and files that cannot be read are logged once per
//! reason and change nothing.

use std::sync::atomic::Ordering;

use tracing::{info, warn};

use super::{Activation, Lifecycle, Origin};
use crate::policy::sources::{read_settled, settled, sources_hash};
use crate::policy::{Policy, PolicyErrors};

impl Lifecycle {
    /// The content hash of the policy files as last read (at start, or by a reload or the file
    /// watcher), whatever version runs.
    pub fn files_hash(&self) -> String {
        self.files_seen.lock().clone()
    }

    /// Re-reads the config path and activates it if it changed.
    pub fn reload(&self) -> Result<Activation, PolicyErrors> {
        match self.read_for_reload() {
            Some(Ok(sources)) => self.activate(sources, Origin::File),
            Some(Err(errors)) => Err(errors),
            None => Ok(Activation::Unchanged(self.current())),
        }
    }

    /// The config path's files for a reload, noted as the files last read; `None` without a
    /// config path. Files that cannot be read are counted as a rejection and logged.
    pub(super) fn read_for_reload(&self) -> Option<Result<Vec<(String, String)>, PolicyErrors>> {
        let path = self.config.as_ref()?;
        match read_settled(path) {
            Ok(sources) => {
                *self.files_seen.lock() = sources_hash(&sources);
                Some(Ok(sources))
            }
            Err(errors) => {
                self.counts.reject();
                for e in errors.iter() {
                    warn!(problem = %e, "Cannot read the policy files; the running policy stays");
                }
                Some(Err(errors))
            }
        }
    }

    /// Re-reads the config path and activates it only if the files changed since they were
    /// last read, so that unchanged files never undo a push or a rollback (the file watcher).
    /// `None` when nothing changed, or when the files cannot be read right now (a file
    /// briefly missing mid-swap): the next call tries again.
    pub fn reload_if_files_changed(&self) -> Option<Result<Activation, PolicyErrors>> {
        let path = self.config.as_ref()?;
        // Read once; only files that changed are read a second time to confirm them.
        let read = Policy::read_sources(path).and_then(|first| {
            if sources_hash(&first) == *self.files_seen.lock() {
                return Ok(None);
            }
            settled(path, first).map(Some)
        });
        let sources = match read {
            Ok(read) => {
                if self.unreadable_checks.swap(0, Ordering::Relaxed) >= 2 {
                    self.counts.readable_again();
                }
                self.unreadable_logged.lock().clear();
                read?
            }
            Err(errors) => {
                // Once is a swap in progress; twice in a row is a problem worth a line (and
                // another when the reason changes), and a rejection in the metrics (once per
                // run of failed reads).
                let checks = self.unreadable_checks.fetch_add(1, Ordering::Relaxed);
                if checks == 1 {
                    self.counts.unreadable();
                }
                let reason = errors.to_string();
                let mut logged = self.unreadable_logged.lock();
                if checks >= 1 && *logged != reason {
                    for e in errors.iter() {
                        warn!(problem = %e, "Cannot read the policy files; the running policy stays");
                    }
                    *logged = reason;
                }
                return None;
            }
        };
        let hash = sources_hash(&sources);
        {
            let mut seen = self.files_seen.lock();
            if *seen == hash {
                return None;
            }
            *seen = hash;
        }
        info!(path = %path.display(), "Policy files changed; reloading");
        Some(self.activate(sources, Origin::File))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{lifecycle_reading, policy};
    use super::*;

    /// Config files that cannot be read change nothing; once they can, the watcher takes them.
    #[test]
    fn unreadable_files_change_nothing_until_they_are_back() {
        let dir = std::env::temp_dir().join(format!("tollgate-lifecycle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.yaml");
        std::fs::write(&file, &policy(1)[0].1).unwrap();
        let lifecycle = lifecycle_reading(Some(dir.clone()));
        std::fs::remove_file(&file).unwrap();
        for _ in 0..3 {
            assert!(lifecycle.reload_if_files_changed().is_none());
        }
        assert!(lifecycle.reload().is_err());
        assert_eq!(lifecycle.current().seq, 1);
        std::fs::write(&file, &policy(2)[0].1).unwrap();
        let taken = lifecycle.reload_if_files_changed().unwrap().unwrap();
        assert!(matches!(taken, Activation::Activated(ref v) if v.seq == 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Each new reason the files cannot be read is logged once: a file that went missing after
    /// holding invalid UTF-8 does not leave the first cause as the last word in the log.
    #[test]
    fn a_new_reason_the_files_cannot_be_read_is_logged_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, &policy(1)[0].1).unwrap();
        let lifecycle = lifecycle_reading(Some(file.clone()));
        let logs = tollgate_testkit::CapturedLogs::default();
        let subscriber = logs.subscriber();
        tracing::subscriber::with_default(subscriber, || {
            std::fs::write(&file, b"domain: \xff\n").unwrap();
            for _ in 0..3 {
                assert!(lifecycle.reload_if_files_changed().is_none());
            }
            std::fs::remove_file(&file).unwrap();
            for _ in 0..3 {
                assert!(lifecycle.reload_if_files_changed().is_none());
            }
        });
        let text = logs.text();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Cannot read the policy files"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("UTF-8"), "{}", lines[0]);
        assert!(lines[1].contains("No such file"), "{}", lines[1]);
    }
}
