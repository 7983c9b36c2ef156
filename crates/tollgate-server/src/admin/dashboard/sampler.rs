//! The background duty filling the dashboard's history: once per [`SAMPLE_EVERY`], the
//! limiter's counters are read (not rendered) and pushed into the ring, whether or not anyone
//! looks.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate::lifecycle::Lifecycle;
use tollgate::observe::history::{History, Sample};

/// Time between two samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Samples the counters of `lifecycle`'s limiter into `history` every `every` until `stop`
/// turns true (or its sender is gone).
pub async fn sample_forever(
    lifecycle: Arc<Lifecycle>,
    history: Arc<History>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let limiter = lifecycle.limiter();
                let now_ms = limiter.clock().now().as_micros() / 1000;
                history.push(Sample::of(limiter.sample_metrics(), now_ms));
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}
