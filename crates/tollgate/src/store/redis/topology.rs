//! Which node owns which slot, and one circuit breaker per node.
//!
//! A cluster's slot map is refreshed from `CLUSTER SLOTS` in the background (see
//! [`super::cluster`]), so a call for a slot is charged to the breaker of the node that owns
//! it: a dead primary opens its own breaker and leaves the other nodes' slots alone.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use redis::Value;

use super::breaker::{Breaker, BreakerConfig, BreakerState};
use super::slot::SLOTS;
use crate::clock::SharedClock;

/// A node's address and its breaker.
type Owner = (Arc<str>, Arc<Breaker>);

/// Slot owners and per-node breakers.
#[derive(Debug)]
pub(super) struct Topology {
    /// The single server's address and breaker (also in `breakers`), looked up without a lock;
    /// `None` for a cluster, whose slots have no owner until the first `CLUSTER SLOTS` answer.
    single: Option<Owner>,
    /// Per slot, its owner with the owner's breaker: a call reads one entry under a read lock.
    /// `None` for a slot no node serves (the map says so, or none came yet).
    owners: RwLock<Vec<Option<Owner>>>,
    /// Every node's breaker, kept while the node is in the slot map.
    breakers: Mutex<HashMap<Arc<str>, Arc<Breaker>>>,
    config: BreakerConfig,
    clock: SharedClock,
}

impl Topology {
    /// One server owning every slot.
    pub fn single(node: &str, config: BreakerConfig, clock: SharedClock) -> Self {
        let node: Arc<str> = node.into();
        let breaker = Arc::new(Breaker::new(config, clock.clone()));
        let topology = Self::new(Some((node.clone(), breaker.clone())), config, clock);
        topology.breakers.lock().insert(node, breaker);
        topology
    }

    /// A cluster whose slot map is not known yet.
    pub fn cluster(config: BreakerConfig, clock: SharedClock) -> Self {
        Self::new(None, config, clock)
    }

    fn new(single: Option<Owner>, config: BreakerConfig, clock: SharedClock) -> Self {
        Topology {
            single,
            owners: RwLock::new(Vec::new()),
            breakers: Mutex::new(HashMap::new()),
            config,
            clock,
        }
    }

    /// The node owning `slot` and its breaker; `None` while a cluster's map is unknown, or when
    /// no node serves the slot (a failure there is no node's fault).
    pub fn breaker_for(&self, slot: u16) -> Option<Owner> {
        if let Some(single) = &self.single {
            return Some(single.clone());
        }
        self.owners.read().get(usize::from(slot)).cloned().flatten()
    }

    /// `node` with its breaker, made on first sight.
    pub fn owner(&self, node: &str) -> Owner {
        self.owner_in(&mut self.breakers.lock(), node)
    }

    fn owner_in(&self, breakers: &mut HashMap<Arc<str>, Arc<Breaker>>, node: &str) -> Owner {
        if let Some((name, breaker)) = breakers.get_key_value(node) {
            return (name.clone(), breaker.clone());
        }
        let name: Arc<str> = node.into();
        let breaker = Arc::new(Breaker::new(self.config, self.clock.clone()));
        breakers.insert(name.clone(), breaker.clone());
        (name, breaker)
    }

    /// Records that `slot` moved to `node` (a `MOVED` answer), ahead of the next refresh.
    pub fn moved(&self, slot: u16, node: &str) {
        // `breakers` then `owners`, as in `update`: a map replaced meanwhile cannot prune the
        // breaker of the node the slot now points to.
        let mut breakers = self.breakers.lock();
        let owner = self.owner_in(&mut breakers, node);
        if let Some(entry) = self.owners.write().get_mut(usize::from(slot)) {
            *entry = Some(owner);
        }
    }

    /// Every node that owns a slot.
    pub fn primaries(&self) -> Vec<Arc<str>> {
        if let Some((node, _)) = &self.single {
            return vec![node.clone()];
        }
        let mut nodes: Vec<Arc<str>> = Vec::new();
        for (node, _) in self.owners.read().iter().flatten() {
            if !nodes.iter().any(|n| n == node) {
                nodes.push(node.clone());
            }
        }
        nodes
    }

    /// Replaces the slot map with a `CLUSTER SLOTS` reply. Returns false if it was unusable
    /// (the last good map is kept).
    pub fn update(&self, reply: &Value) -> bool {
        let Some(ranges) = parse_cluster_slots(reply) else {
            return false;
        };
        if ranges.is_empty() {
            return false;
        }
        let mut breakers = self.breakers.lock();
        let mut owners: Vec<Option<Owner>> = vec![None; usize::from(SLOTS)];
        for (start, end, node) in &ranges {
            let owner = self.owner_in(&mut breakers, node);
            for slot in *start..=(*end).min(SLOTS - 1) {
                owners[usize::from(slot)] = Some(owner.clone());
            }
        }
        // A node that left the map (replaced, failed over) takes its breaker with it: it is
        // not reported forever, and one that comes back starts afresh.
        breakers.retain(|node, _| ranges.iter().any(|(_, _, owner)| **owner == **node));
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
        let topology = Topology::cluster(BreakerConfig::default(), clock);
        assert!(
            topology.breaker_for(7).is_none(),
            "unknown until the first map"
        );
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16000),
                node("127.0.0.1", 7001),
            ]),
        ]);
        assert!(topology.update(&reply));
        assert!(
            topology.breaker_for(16001).is_none(),
            "a slot no node serves has no owner to blame"
        );
        let (a, breaker_a) = topology.breaker_for(100).unwrap();
        let (b, breaker_b) = topology.breaker_for(9000).unwrap();
        assert_eq!((&*a, &*b), ("127.0.0.1:7000", "127.0.0.1:7001"));
        assert!(!Arc::ptr_eq(&breaker_a, &breaker_b));
        assert!(Arc::ptr_eq(
            &breaker_a,
            &topology.breaker_for(8191).unwrap().1
        ));
        assert_eq!(topology.primaries().len(), 2);
        assert!(!topology.update(&Value::Int(3)), "garbage is ignored");
        assert_eq!(
            &*topology.breaker_for(100).unwrap().0,
            "127.0.0.1:7000",
            "the last map stays"
        );
        topology.moved(100, "127.0.0.1:7003");
        assert_eq!(&*topology.breaker_for(100).unwrap().0, "127.0.0.1:7003");
        // A node gone from the map is no longer reported.
        let without_7001 = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            node("127.0.0.1", 7003),
        ])]);
        assert!(topology.update(&without_7001));
        let nodes: Vec<String> = topology.states().into_iter().map(|(n, _)| n).collect();
        assert_eq!(nodes, ["127.0.0.1:7003"]);
    }
}
