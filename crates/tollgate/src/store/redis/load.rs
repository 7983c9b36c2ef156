//! Loading the decision scripts on the primaries ahead of the decisions that run them.

use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::error::store_error;
use super::script;
use super::timeout::within;
use crate::store::{RedisCall, StoreError};

/// Loads the decision scripts on each of `primaries`, one pipeline each, within 5 s: at
/// startup (see [`RedisStore::load_scripts`]) and on a primary new to a cluster's slot map (a
/// promoted replica has none: Redis does not replicate its script cache).
pub(super) async fn load_scripts_on(primaries: Vec<ConnectionManager>) -> Result<(), StoreError> {
    let scripts = [
        script::DECIDE_SCRIPT,
        script::DECIDE_BATCH_SCRIPT,
        script::REFUND_SCRIPT,
    ];
    let mut load = redis::pipe();
    for text in scripts {
        load.cmd("SCRIPT").arg("LOAD").arg(text);
    }
    // Redis compiles each script as it loads it: a busy machine takes a while.
    let deadline = Instant::now() + Duration::from_secs(5);
    let loads = primaries.into_iter().map(|mut connection| {
        let load = &load;
        async move {
            // The connection may give up on a command before a busy Redis has compiled it; it
            // compiles on regardless, and a second load finds the script cached. So load
            // again until the deadline.
            loop {
                let error = match load.query_async::<Vec<String>>(&mut connection).await {
                    Ok(_) => return Ok(()),
                    Err(e) => store_error(e),
                };
                if Instant::now() + SCRIPT_LOAD_RETRY >= deadline {
                    return Err(error);
                }
                tokio::time::sleep(SCRIPT_LOAD_RETRY).await;
            }
        }
    });
    let loads = futures_util::future::try_join_all(loads);
    within(deadline, RedisCall::LoadScripts, loads).await?;
    Ok(())
}

/// Pause between two loads of the scripts on a primary that did not answer the first in time.
const SCRIPT_LOAD_RETRY: Duration = Duration::from_millis(50);
