//! One script call on the node that owns a slot: through that node's circuit breaker and
//! [`patience`](super::patience), following `MOVED` and `ASK` redirects and waiting out a
//! migrating slot's `TRYAGAIN`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::breaker::{Breaker, Logged};
use super::client::invoke_asking;
use super::error::store_error;
use super::patience::{self, Deadline, Unanswered};
use super::store::{Connection, RedisStore};
use crate::store::{Failure, Refusal, ShedReason, StoreError, Timeout};

/// `MOVED` and `ASK` redirects followed within one call.
const MAX_REDIRECTS: usize = 3;

impl RedisStore {
    /// The node that owns `slot`, with its breaker; refused before calling when none does.
    fn owner_of(&self, slot: u16) -> Result<(Arc<str>, Arc<Breaker>), StoreError> {
        self.topology
            .breaker_for(slot)
            .ok_or_else(|| StoreError::NotCalled(Refusal::NoNodeForSlot { slot }))
    }

    /// Runs a script invocation on the node that owns `slot`, following `MOVED` and `ASK`
    /// redirects; its reply read as a `T` (DECIDE answers a list of integers, REFUND one
    /// integer). Each node called goes through its own breaker: a node that redirects answered,
    /// and a failure after a redirect is the failure of the node redirected to.
    ///
    /// A `TRYAGAIN` (keys of one call split between the two nodes of a migrating slot) is an
    /// answer too: the call is made again from the slot's owner every millisecond, until the
    /// migration has moved the rest or the caller's deadline cuts it.
    pub(super) async fn invoke_on_slot<T: redis::FromRedisValue>(
        &self,
        slot: u16,
        invocation: &redis::ScriptInvocation<'_>,
        deadline: Deadline,
    ) -> Result<T, StoreError> {
        let (mut node, mut breaker) = self.owner_of(slot)?;
        let mut asking = false;
        let mut redirects = 0;
        loop {
            let call = async {
                let mut connection = self.connection_to(&node)?;
                let answer = if asking {
                    invoke_asking(&mut connection, invocation).await
                } else {
                    invocation.invoke_async::<T>(&mut connection).await
                };
                match answer {
                    Ok(reply) => Ok(Ok(reply)),
                    Err(e) if !matches!(self.connection, Connection::Cluster(_)) => {
                        Err(store_error(e))
                    }
                    // A redirect is an answer: the node is fine, the slot is elsewhere.
                    Err(e) => match e.redirect_node() {
                        Some((to, moved_slot)) => {
                            let ask =
                                e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask);
                            Ok(Err(Some((to.to_owned(), moved_slot, ask))))
                        }
                        None if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain) =>
                        {
                            Ok(Err(None))
                        }
                        None => Err(store_error(e)),
                    },
                }
            };
            let (to, moved_slot, ask) = match self.through(&node, &breaker, deadline, call).await? {
                Ok(reply) => return Ok(reply),
                Err(Some(redirect)) => redirect,
                Err(None) => {
                    if Instant::now() >= deadline.at {
                        return Err(StoreError::TimedOut(Timeout::SlotMigrating { node }));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    // From the owner again: an `ASK` that led to the `TRYAGAIN` is no
                    // redirect followed too many.
                    (node, breaker) = self.owner_of(slot)?;
                    (asking, redirects) = (false, 0);
                    continue;
                }
            };
            // During a failover the slot can move twice (old primary -> promoting replica):
            // follow a few redirects, all within the decision's deadline.
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return Err(StoreError::Unavailable(Failure::TooManyRedirects {
                    slot,
                    most: MAX_REDIRECTS,
                }));
            }
            asking = ask;
            if !asking {
                self.topology.moved(moved_slot, &to);
                if let Connection::Cluster(router) = &self.connection {
                    router.refresh_soon();
                }
            }
            // A migrating slot (`ASK`) is asked on `to` this once, the map unchanged until the
            // migration ends with a `MOVED`.
            (node, breaker) = self.topology.owner(&to);
        }
    }

    /// Runs `call` through `node`'s `breaker`: refused at once while it is open, and its outcome
    /// recorded (bad data is no failure of the node). The call waits as [`patience`] says: it
    /// fails at `deadline` (a failure of the node) unless the node is busy answering others,
    /// and is given up for load at the ceiling (no failure); a cancelled permit counts as a
    /// failure.
    async fn through<T>(
        &self,
        node: &Arc<str>,
        breaker: &Arc<Breaker>,
        deadline: Deadline,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let permit = breaker
            .try_call()
            .ok_or_else(|| StoreError::NotCalled(Refusal::CircuitOpen { node: node.clone() }))?;
        let mut permit = Logged::new(node, permit);
        let sent = Instant::now();
        match patience::patiently(deadline, (node, breaker), sent, 1, call).await {
            Ok(answer) => {
                permit.record(matches!(answer, Ok(_) | Err(StoreError::InvalidData(_))));
                answer
            }
            // Dropped unreported: a failure.
            Err(Unanswered::Stalled) => {
                Err(StoreError::TimedOut(Timeout::Node { node: node.clone() }))
            }
            Err(Unanswered::TooLong) => {
                permit.release();
                Err(self.shed.shed(ShedReason::WaitedTooLong))
            }
        }
    }
}
