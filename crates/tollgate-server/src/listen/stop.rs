//! The stop signal every listener watches: a `watch` channel whose value turns `true` once the
//! shutdown begins.

use tokio::sync::watch;

/// Resolves once `rx` says stop: the servers' graceful-shutdown signal. Also once its sender is
/// gone.
pub async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
