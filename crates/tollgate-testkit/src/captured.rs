//! Log lines written to memory, for tests that check what was logged.

use std::sync::Arc;

/// A writer that keeps what is written, shared by its clones: log through
/// [`CapturedLogs::subscriber`] (or hand a clone to a subscriber of your own) and read the
/// lines with [`CapturedLogs::text`].
///
/// ```
/// use std::io::Write;
/// use tollgate_testkit::CapturedLogs;
///
/// let logs = CapturedLogs::default();
/// writeln!(logs.clone(), "a line").unwrap();
/// assert_eq!(logs.text(), "a line\n");
/// ```
#[derive(Debug, Clone, Default)]
pub struct CapturedLogs(Arc<parking_lot::Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// A `tracing` subscriber writing plain text lines here (install it with
    /// `tracing::subscriber::with_default` or `set_default`).
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
    }

    /// Everything written so far, as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
