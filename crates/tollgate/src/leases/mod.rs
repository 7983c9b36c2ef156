//! Leases: quota handed down to a holder for a while.
//!
//! A **lease** is the engine's record of quota handed to a holder: the holder (this replica),
//! the counter (its key and limit), the units, when it expires, and what is given back when it
//! lapses, and how (the units left, refunded at the instant of the charge that reserved them).
//! When the store that granted it loses its data, the lease is forfeit: dropped, never given
//! back. A **grant** is the units one holder may spend.
//!
//! The engine runs over any store that [`Grants`](crate::store::Grants): Redis and the memory
//! store, which give back alike (`tollgate_core::refund`, REFUND's twin: exact when nothing else
//! touched the counter since, never more than was charged, nothing into a counter made after
//! the charge). Reservations and concurrency slots will be leases on either.
//!
//! Local budgets are the engine's first user: for a rule with `local_budget: s`, a replica
//! reserves `s` units of a key's quota from the shared store in one charge and admits requests
//! from them without calling the store; what it did not use is given back when the lease lapses
//! (after `local_budget_ttl`, or at the end of the window for a fixed window).
//!
//! The bound each use gives. Every unit admitted locally was charged to the store before it
//! was admitted, so the store's own limit bounds the total. What a lease changes is *when* the
//! store sees a unit: at the reservation instant, up to one TTL `h` before it is used. With `R`
//! replicas, per key:
//!
//! - fixed window: never over the limit (a lease ends with its window);
//! - sliding window log and counter: at most `min(R * s, units reserved in the h before the
//!   window)` over the limit in any window;
//! - token bucket and GCRA: in any interval of length `L`, at most `burst + rate * L` plus
//!   `min(R * s, rate * h)`;
//! - under the limit: at most `R * s` units sit reserved and unused, for at most `h`, then go
//!   back.
//!
//! `docs/hot-keys.md` derives these bounds and reports measured ones. The prefilter, the
//! layer's other half, never denies what the store would allow (see its module).
//!
//! [`HotKeys`] is the store layer that applies both; it sits on both stacks, and applies them
//! only over a store replicas share ([`Granting::shared`](crate::store::Granting::shared)): on
//! the memory store, which grants leases but is already local, it is inert.

mod hot_keys;
mod keyed_shards;
mod lease;
mod prefilter;

pub use hot_keys::HotKeys;
