//! A TCP fault-injection proxy between a client and one upstream (usually a [`RedisServer`]):
//! added latency, blackholes, resets, refused connections and replies cut mid-stream, switched at
//! run time with [`FaultProxy::set_mode`].
//!
//! Its two public items are `FaultProxy` and `Mode`; `Mode` documents what a client observes in
//! each fault.
//!
//! [`RedisServer`]: crate::RedisServer

mod fault_proxy;
mod link;
mod listener;
mod mode;
mod shared;

pub use fault_proxy::FaultProxy;
pub use mode::Mode;
