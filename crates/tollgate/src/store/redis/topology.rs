//! Which node owns which slot, and one circuit breaker per node.
//!
//! A cluster's slot map is refreshed from `CLUSTER SLOTS` in the background, so a call for a
//! slot is charged to the breaker of the node that owns it: a dead primary opens its own
//! breaker and leaves the other nodes' slots alone. Until the map is known (and for a single
//! server) every slot belongs to one node.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use redis::Value;

use super::slot::SLOTS;
use crate::clock::SharedClock;
use crate::resilience::{Breaker, BreakerConfig, BreakerState};

/// Slot owners and per-node breakers.
#[derive(Debug)]
pub(super) struct Topology {
    default_node: Arc<str>,
    owners: RwLock<Vec<Arc<str>>>,
    breakers: Mutex<HashMap<Arc<str>, Arc<Breaker>>>,
    config: BreakerConfig,
    clock: SharedClock,
}

impl Topology {
    /// Every slot owned by `node` until told otherwise.
    pub fn new(node: &str, config: BreakerConfig, clock: SharedClock) -> Self {
        Topology {
            default_node: node.into(),
            owners: RwLock::new(Vec::new()),
            breakers: Mutex::new(HashMap::new()),
            config,
            clock,
        }
    }

    /// The node owning `slot` and its breaker.
    pub fn breaker_for(&self, slot: u16) -> (Arc<str>, Arc<Breaker>) {
        let node = self
            .owners
            .read()
            .get(usize::from(slot))
            .cloned()
            .unwrap_or_else(|| self.default_node.clone());
        let breaker = self
            .breakers
            .lock()
            .entry(node.clone())
            .or_insert_with(|| Arc::new(Breaker::new(self.config, self.clock.clone())))
            .clone();
        (node, breaker)
    }

    /// Replaces the slot map with a `CLUSTER SLOTS` reply. Returns false if it was unusable.
    pub fn update(&self, reply: &Value) -> bool {
        let Some(ranges) = parse_cluster_slots(reply) else {
            return false;
        };
        let mut owners: Vec<Arc<str>> = vec![self.default_node.clone(); usize::from(SLOTS)];
        let mut names: HashMap<String, Arc<str>> = HashMap::new();
        for (start, end, node) in ranges {
            let node = names
                .entry(node.clone())
                .or_insert_with(|| node.into())
                .clone();
            for slot in start..=end.min(SLOTS - 1) {
                owners[usize::from(slot)] = node.clone();
            }
        }
        *self.owners.write() = owners;
        true
    }

    /// Every breaker's state, by node.
    pub fn states(&self) -> Vec<(String, BreakerState)> {
        let mut states: Vec<(String, BreakerState)> = self
            .breakers
            .lock()
            .iter()
            .map(|(node, b)| (node.to_string(), b.state()))
            .collect();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        states
    }
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, ...], replicas...], ...]`.
fn parse_cluster_slots(reply: &Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let number = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let start = number(fields.first()?)?;
            let end = number(fields.get(1)?)?;
            let Value::Array(primary) = fields.get(2)? else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = number(primary.get(1)?)?;
            Some((start, end, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.into()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn slots_map_to_their_primary_and_each_node_has_its_own_breaker() {
        let clock = Arc::new(ManualClock::default());
        let topology = Topology::new("seed", BreakerConfig::default(), clock);
        assert_eq!(&*topology.breaker_for(7).0, "seed");
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                node("127.0.0.1", 7001),
            ]),
        ]);
        assert!(topology.update(&reply));
        let (a, breaker_a) = topology.breaker_for(100);
        let (b, breaker_b) = topology.breaker_for(9000);
        assert_eq!((&*a, &*b), ("127.0.0.1:7000", "127.0.0.1:7001"));
        assert!(!Arc::ptr_eq(&breaker_a, &breaker_b));
        assert!(Arc::ptr_eq(&breaker_a, &topology.breaker_for(8191).1));
        assert!(!topology.update(&Value::Int(3)), "garbage is ignored");
        assert_eq!(
            &*topology.breaker_for(100).0,
            "127.0.0.1:7000",
            "and keeps the last map"
        );
    }
}
