//! A Redis Cluster of real `redis-server` processes.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::panic;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::binary::redis_cli_binary;
use crate::deadline::Deadline;
use crate::node::{Node, NodeConfig, TERM_GRACE};
use crate::resp;
use crate::server::{DEFAULT_READY_TIMEOUT, run_cli};
use crate::slot::{SLOT_COUNT, key_slot};

/// How long a cluster gets to become healthy after start or after [`RedisCluster::restart_node`],
/// unless the builder says otherwise.
pub const DEFAULT_CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments every cluster node gets before the caller's.
const CLUSTER_ARGS: [&str; 8] = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    // A node is declared failed after 1 s, so failover tests take seconds, not the default 15+ s.
    "--cluster-node-timeout",
    "1000",
    // Replicas sync at once instead of waiting 5 s for more replicas to join the transfer.
    "--repl-diskless-sync-delay",
    "0",
];

/// Pause between cluster-state polls.
const POLL: Duration = Duration::from_millis(50);

/// Lines of each node's log quoted in a panic.
const PANIC_LOG_LINES: usize = 8;

/// A node's role in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeRole {
    /// A primary (Redis says "master"); owns slots unless it lost them in a failover.
    Primary,
    /// A replica of a primary (Redis says "slave").
    Replica,
}

/// One node as the cluster sees it (from `CLUSTER NODES` of a running node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's client port on 127.0.0.1.
    pub port: u16,
    /// The node's 40-character cluster id.
    pub id: String,
    /// Primary or replica.
    pub role: NodeRole,
    /// For a replica, the port of the primary it replicates.
    pub primary_port: Option<u16>,
    /// The slot ranges the node owns (empty for replicas).
    pub slots: Vec<RangeInclusive<u16>>,
    /// Whether the cluster flags the node as failing (`fail` or `fail?`).
    pub failed: bool,
    /// Whether the node's process is alive (the kit's knowledge, not the cluster's).
    pub running: bool,
}

impl ClusterNode {
    /// Whether the node owns `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }

    /// How many slots the node owns.
    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|range| range.len()).sum()
    }
}

/// A Redis Cluster of real `redis-server` processes on free loopback ports, each with its own
/// temporary directory and no persistence, created with `redis-cli --cluster create`.
///
/// Nodes use `--cluster-node-timeout 1000`, so a killed primary is replaced by its replica within a
/// few seconds. Every method blocks the calling thread; in an async test that must keep other tasks
/// running meanwhile, call it from `spawn_blocking`. Dropping the cluster ends every node
/// (`SIGTERM`, then `SIGKILL` after about 2 s), reaps them and removes their directories.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate_testkit::{RedisCluster, key_slot};
///
/// let cluster = RedisCluster::start(3, 1);
/// let slot = key_slot(b"{tenant}:bucket");
/// let old = cluster.node_for_slot(slot);
/// cluster.kill_node(old);
/// let new = cluster.wait_for_slot_owner_change(slot, old, Duration::from_secs(15));
/// assert_ne!(new, old);
/// cluster.restart_node(old); // it rejoins as a replica of `new`
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    timeout: Duration,
}

impl RedisCluster {
    /// Starts `primaries * (1 + replicas_per_primary)` nodes, creates the cluster and waits until
    /// it is healthy (see [`RedisCluster::wait_until_healthy`]).
    ///
    /// # Panics
    ///
    /// When `primaries < 3` (`redis-cli --cluster create` needs three), when Redis is missing, or
    /// when the cluster is not healthy within 30 s (the message says what was still wrong and
    /// quotes each node's log).
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Self {
        Self::builder(primaries, replicas_per_primary).start()
    }

    /// A builder for a cluster with extra node arguments or another timeout.
    pub fn builder(primaries: usize, replicas_per_primary: usize) -> RedisClusterBuilder {
        RedisClusterBuilder {
            primaries,
            replicas_per_primary,
            args: Vec::new(),
            timeout: DEFAULT_CLUSTER_TIMEOUT,
        }
    }

    /// Every node's port, in start order (the first `primaries` were created as primaries).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(Node::port).collect()
    }

    /// Every node's `redis://127.0.0.1:port`, in start order: the seed list for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.ports().into_iter().map(url).collect()
    }

    /// The URL of the first node that is running, as a single seed for a cluster client.
    ///
    /// # Panics
    ///
    /// When no node is running.
    pub fn seed_url(&self) -> String {
        let node = self
            .nodes
            .iter()
            .find(|node| node.is_running())
            .expect("no cluster node is running");
        url(node.port())
    }

    /// Every node as the first running node that answers sees the cluster, sorted by port. Nodes
    /// still in handshake are left out.
    ///
    /// # Panics
    ///
    /// When no running node answers `CLUSTER NODES`.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        let view = self.some_view();
        let mut nodes: Vec<ClusterNode> = view
            .iter()
            .filter_map(|entry| {
                Some(ClusterNode {
                    port: entry.port,
                    id: entry.id.clone(),
                    role: entry.role()?,
                    primary_port: entry.primary_id.as_ref().and_then(|primary| {
                        view.iter()
                            .find(|other| &other.id == primary)
                            .map(|other| other.port)
                    }),
                    slots: entry.slots.clone(),
                    failed: entry.is_failed(),
                    running: self.find(entry.port).is_some_and(Node::is_running),
                })
            })
            .collect();
        nodes.sort_by_key(|node| node.port);
        nodes
    }

    /// Ports of the primaries that own at least one slot, ascending.
    pub fn primary_ports(&self) -> Vec<u16> {
        self.nodes()
            .into_iter()
            .filter(|node| node.role == NodeRole::Primary && !node.slots.is_empty())
            .map(|node| node.port)
            .collect()
    }

    /// A tollgate store URL (`redis+cluster://...`) with every primary as a seed.
    pub fn store_url(&self) -> String {
        let seeds: Vec<String> = self
            .primary_ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Ports of the replicas, ascending.
    pub fn replica_ports(&self) -> Vec<u16> {
        self.nodes()
            .into_iter()
            .filter(|node| node.role == NodeRole::Replica)
            .map(|node| node.port)
            .collect()
    }

    /// The port of the primary owning `slot` (0..16384), as the first running node sees it.
    ///
    /// # Panics
    ///
    /// When `slot` is out of range, or no node owns it.
    pub fn node_for_slot(&self, slot: u16) -> u16 {
        assert!(slot < SLOT_COUNT, "slot {slot} is not below {SLOT_COUNT}");
        self.nodes()
            .into_iter()
            .find(|node| node.role == NodeRole::Primary && node.owns(slot))
            .map(|node| node.port)
            .unwrap_or_else(|| panic!("no primary owns slot {slot}"))
    }

    /// The port of the primary owning the slot of `key` (see [`key_slot`]).
    pub fn node_for_key(&self, key: &str) -> u16 {
        self.node_for_slot(key_slot(key.as_bytes()))
    }

    /// Whether the node on `port` is alive.
    pub fn is_running(&self, port: u16) -> bool {
        self.node(port).is_running()
    }

    /// The process id of the node on `port` while it runs.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.node(port).pid()
    }

    /// Kills the node on `port` with `SIGKILL`, like a crash. Its port and `nodes.conf` are kept
    /// for [`RedisCluster::restart_node`].
    pub fn kill_node(&self, port: u16) {
        self.node(port).kill();
    }

    /// Stops the node on `port` gracefully (`SIGTERM`, then `SIGKILL` after about 2 s).
    pub fn stop_node(&self, port: u16) {
        self.node(port).stop();
    }

    /// Stops the node on `port` if it runs, starts it again on the same port with its
    /// `nodes.conf` (so it rejoins with the same id; a primary that lost a failover comes back as
    /// a replica), then waits until the whole cluster is healthy.
    ///
    /// # Panics
    ///
    /// When the node does not come back, or the cluster is not healthy within the cluster timeout.
    pub fn restart_node(&self, port: u16) {
        self.node(port).restart();
        self.wait_until_healthy(self.timeout);
    }

    /// Waits until the cluster is healthy: every running node reports `cluster_state:ok`, knows
    /// every node with none in handshake, flags no running node as failing, and sees all 16384 slots
    /// owned by running primaries with the same owners as every other node; every running replica
    /// reports `master_link_status:up`, and no node sees a running primary without slots (every
    /// node meant to be a replica, a restarted failed-over primary included, is one everywhere).
    /// Stopped nodes are not asked.
    ///
    /// # Panics
    ///
    /// When that does not happen within `timeout`, saying what was still wrong.
    pub fn wait_until_healthy(&self, timeout: Duration) {
        self.wait_for(Deadline::after(timeout), "cluster not healthy", |_| Ok(()));
    }

    /// Waits until the cluster is healthy (as [`RedisCluster::wait_until_healthy`]) with `slot`
    /// owned by a node other than `old_primary_port`, and returns the new owner's port. Use it
    /// after [`RedisCluster::kill_node`] on a primary, or a `CLUSTER FAILOVER` on a replica.
    ///
    /// # Panics
    ///
    /// When that does not happen within `timeout`.
    pub fn wait_for_slot_owner_change(
        &self,
        slot: u16,
        old_primary_port: u16,
        timeout: Duration,
    ) -> u16 {
        assert!(slot < SLOT_COUNT, "slot {slot} is not below {SLOT_COUNT}");
        let what = format!("slot {slot} did not move away from 127.0.0.1:{old_primary_port}");
        self.wait_for(Deadline::after(timeout), &what, |owners| {
            let owner = owners
                .iter()
                .find(|(range, _)| range.contains(&slot))
                .map(|(_, port)| *port)
                .unwrap_or(old_primary_port);
            if owner == old_primary_port {
                Err(format!("slot {slot} is still owned by 127.0.0.1:{owner}"))
            } else {
                Ok(owner)
            }
        })
    }

    /// Runs `redis-cli -p port args...` against the node on `port` and returns its standard output
    /// without the trailing newline. Pass `-c` first to follow cluster redirections.
    ///
    /// # Panics
    ///
    /// When `redis-cli` cannot be run or exits with a failure (for instance when it cannot
    /// connect), quoting its standard error.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        run_cli(port, args)
    }

    fn find(&self, port: u16) -> Option<&Node> {
        self.nodes.iter().find(|node| node.port() == port)
    }

    fn node(&self, port: u16) -> &Node {
        self.find(port).unwrap_or_else(|| {
            panic!(
                "127.0.0.1:{port} is not a node of this cluster (its ports: {:?})",
                self.ports()
            )
        })
    }

    /// The view of the first running node that answers `CLUSTER NODES`.
    fn some_view(&self) -> Vec<ViewEntry> {
        self.nodes
            .iter()
            .filter(|node| node.is_running())
            .find_map(|node| read_view(node.port()).ok())
            .expect("no running cluster node answers CLUSTER NODES")
    }

    /// Runs `redis-cli --cluster create` over all nodes.
    fn create(&self, replicas_per_primary: usize, deadline: Deadline) {
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(
            self.ports()
                .into_iter()
                .map(|port| format!("127.0.0.1:{port}")),
        );
        args.extend([
            "--cluster-replicas".into(),
            replicas_per_primary.to_string(),
            "--cluster-yes".into(),
        ]);
        // A file, not a pipe, so a chatty redis-cli can never block on a full pipe while we poll.
        let mut output = tempfile::tempfile().expect("cannot create a file for redis-cli output");
        let mut child = Command::new(redis_cli_binary())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("cannot share redis-cli output"))
            .stderr(output.try_clone().expect("cannot share redis-cli output"))
            .spawn()
            .expect("cannot run redis-cli --cluster create");
        let status = loop {
            if let Some(status) = child.try_wait().expect("cannot wait for redis-cli") {
                break Some(status);
            }
            if deadline.expired() {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(POLL);
        };
        let text = {
            use std::io::{Read, Seek, SeekFrom};
            let mut text = String::new();
            let _ = output.seek(SeekFrom::Start(0));
            let _ = output.read_to_string(&mut text);
            text
        };
        match status {
            Some(status) if status.success() => {}
            Some(status) => panic!(
                "redis-cli {} failed ({status}):\n{text}{}",
                args.join(" "),
                self.log_tails()
            ),
            None => panic!(
                "redis-cli {} did not finish within {:?}:\n{text}{}",
                args.join(" "),
                deadline.elapsed(),
                self.log_tails()
            ),
        }
    }

    /// Polls until the cluster is healthy and `accept` takes its slot owners, or panics at the
    /// deadline with `what` and the last reason.
    fn wait_for<T>(
        &self,
        deadline: Deadline,
        what: &str,
        accept: impl Fn(&[(RangeInclusive<u16>, u16)]) -> Result<T, String>,
    ) -> T {
        loop {
            let reason = match self.health().and_then(|owners| accept(&owners)) {
                Ok(value) => return value,
                Err(reason) => reason,
            };
            if deadline.expired() {
                panic!(
                    "{what} within {:?}: {reason}{}",
                    deadline.elapsed(),
                    self.log_tails()
                );
            }
            thread::sleep(POLL.min(deadline.remaining()));
        }
    }

    /// The agreed slot owners if the cluster is healthy, else what is wrong.
    fn health(&self) -> Result<SlotOwners, String> {
        let all: BTreeSet<u16> = self.ports().into_iter().collect();
        let running: BTreeSet<u16> = self
            .nodes
            .iter()
            .filter(|node| node.is_running())
            .map(Node::port)
            .collect();
        let mut agreed: Option<(u16, SlotOwners)> = None;
        for &port in &running {
            let info = resp::text(port, &["CLUSTER", "INFO"])
                .map_err(|err| format!("127.0.0.1:{port} CLUSTER INFO: {err}"))?;
            if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
                let state = info
                    .lines()
                    .find(|line| line.starts_with("cluster_state:"))
                    .unwrap_or("no cluster_state")
                    .trim();
                return Err(format!("127.0.0.1:{port} reports {state}"));
            }
            let view = read_view(port)?;
            for &other in &all {
                let Some(entry) = view.iter().find(|entry| entry.port == other) else {
                    return Err(format!(
                        "127.0.0.1:{port} does not know 127.0.0.1:{other} yet"
                    ));
                };
                if entry.role().is_none() || entry.has_flag("handshake") {
                    return Err(format!(
                        "127.0.0.1:{port} is still in handshake with 127.0.0.1:{other}"
                    ));
                }
                if running.contains(&other) && entry.is_failed() {
                    return Err(format!(
                        "127.0.0.1:{port} still flags running 127.0.0.1:{other} as failing"
                    ));
                }
            }
            let owners = slot_owners(&view).map_err(|err| format!("127.0.0.1:{port} {err}"))?;
            // A node that is becoming a replica (set up, or a failed-over primary restarted)
            // shows as a primary without slots until every node has heard: not settled yet.
            if let Some(empty) = view.iter().find(|entry| {
                entry.role() == Some(NodeRole::Primary)
                    && running.contains(&entry.port)
                    && !owners.iter().any(|(_, owner)| *owner == entry.port)
            }) {
                return Err(format!(
                    "127.0.0.1:{port} sees 127.0.0.1:{} as a primary without slots",
                    empty.port
                ));
            }
            if let Some((stopped, _)) = owners.iter().find(|(_, owner)| !running.contains(owner)) {
                return Err(format!(
                    "127.0.0.1:{port} sees slots {}-{} owned by a stopped node",
                    stopped.start(),
                    stopped.end()
                ));
            }
            match &agreed {
                Some((first, first_owners)) if *first_owners != owners => {
                    return Err(format!(
                        "127.0.0.1:{port} and 127.0.0.1:{first} disagree on slot owners"
                    ));
                }
                Some(_) => {}
                None => agreed = Some((port, owners)),
            }
            let myself = view.iter().find(|entry| entry.has_flag("myself"));
            if myself.and_then(ViewEntry::role) == Some(NodeRole::Replica) {
                let replication = resp::text(port, &["INFO", "replication"])
                    .map_err(|err| format!("127.0.0.1:{port} INFO replication: {err}"))?;
                if !replication
                    .lines()
                    .any(|line| line.trim() == "master_link_status:up")
                {
                    return Err(format!(
                        "replica 127.0.0.1:{port} has no link to its primary"
                    ));
                }
            }
        }
        agreed
            .map(|(_, owners)| owners)
            .ok_or_else(|| "no cluster node is running".to_owned())
    }

    /// Each node's state and log tail, for panic messages.
    fn log_tails(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            let state = if node.is_running() {
                "running"
            } else {
                "stopped"
            };
            let _ = write!(
                text,
                "\n--- node 127.0.0.1:{} ({state}), log tail:\n",
                node.port()
            );
            let tail = node.log_tail();
            let lines: Vec<&str> = tail.lines().collect();
            text.push_str(&lines[lines.len().saturating_sub(PANIC_LOG_LINES)..].join("\n"));
        }
        text
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // Signal every node first so they shut down in parallel, then reap them all.
        for node in &self.nodes {
            node.terminate();
        }
        let deadline = Deadline::after(TERM_GRACE);
        for node in &self.nodes {
            node.reap(deadline);
        }
    }
}

/// Options for [`RedisCluster`]; [`RedisClusterBuilder::start`] starts it.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisClusterBuilder {
    primaries: usize,
    replicas_per_primary: usize,
    args: Vec<String>,
    timeout: Duration,
}

impl RedisClusterBuilder {
    /// Adds one `redis-server` argument for every node. Arguments come after the kit's own, so
    /// they can override them (for instance `--cluster-node-timeout`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds `redis-server` arguments for every node, such as `["--enable-debug-command", "yes"]`.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long the cluster gets to become healthy at start and after
    /// [`RedisCluster::restart_node`] (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Starts the nodes, creates the cluster and waits until it is healthy.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::start`].
    pub fn start(self) -> RedisCluster {
        assert!(
            self.primaries >= 3,
            "redis-cli --cluster create needs at least 3 primaries, got {}",
            self.primaries
        );
        let deadline = Deadline::after(self.timeout);
        let count = self.primaries * (1 + self.replicas_per_primary);
        let config = NodeConfig {
            cluster: true,
            args: CLUSTER_ARGS
                .iter()
                .map(|arg| (*arg).to_owned())
                .chain(self.args)
                .collect(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        };
        let cluster = RedisCluster {
            nodes: start_nodes(count, &config),
            timeout: self.timeout,
        };
        cluster.create(self.replicas_per_primary, deadline);
        let what = format!(
            "cluster of {} primaries with {} replicas each not healthy",
            self.primaries, self.replicas_per_primary
        );
        cluster.wait_for(deadline, &what, |_| Ok(()));
        cluster
    }
}

/// Starts `count` nodes in parallel; if any fails, the others are dropped (ended) and the panic
/// goes on.
fn start_nodes(count: usize, config: &NodeConfig) -> Vec<Node> {
    let results: Vec<thread::Result<Node>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|_| scope.spawn(|| Node::start(config.clone())))
            .collect();
        handles.into_iter().map(|handle| handle.join()).collect()
    });
    let mut nodes = Vec::with_capacity(count);
    for result in results {
        match result {
            Ok(node) => nodes.push(node),
            Err(payload) => panic::resume_unwind(payload),
        }
    }
    nodes
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// Slot ranges with the port of the primary owning each, ascending and contiguous.
type SlotOwners = Vec<(RangeInclusive<u16>, u16)>;

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ViewEntry {
    id: String,
    port: u16,
    flags: Vec<String>,
    primary_id: Option<String>,
    slots: Vec<RangeInclusive<u16>>,
}

impl ViewEntry {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn role(&self) -> Option<NodeRole> {
        if self.has_flag("master") {
            Some(NodeRole::Primary)
        } else if self.has_flag("slave") {
            Some(NodeRole::Replica)
        } else {
            None
        }
    }

    fn is_failed(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }
}

fn read_view(port: u16) -> Result<Vec<ViewEntry>, String> {
    let text = resp::text(port, &["CLUSTER", "NODES"])
        .map_err(|err| format!("127.0.0.1:{port} CLUSTER NODES: {err}"))?;
    parse_nodes(&text).map_err(|err| format!("127.0.0.1:{port} CLUSTER NODES: {err}"))
}

/// Parses `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <primary|-> <ping> <pong> <epoch> <link> <slot>...`.
fn parse_nodes(text: &str) -> Result<Vec<ViewEntry>, String> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return Err(format!("short line {line:?}"));
            }
            let client_addr = fields[1].split(['@', ',']).next().unwrap_or_default();
            let port = client_addr
                .rsplit(':')
                .next()
                .and_then(|port| port.parse().ok())
                .ok_or_else(|| format!("bad address in {line:?}"))?;
            let slots = fields[8..]
                .iter()
                // `[slot->-id]` and `[slot-<-id]` are migrations in progress, not ownership.
                .filter(|field| !field.starts_with('['))
                .map(|field| parse_slot_range(field).ok_or_else(|| format!("bad slot {field:?}")))
                .collect::<Result<_, _>>()?;
            Ok(ViewEntry {
                id: fields[0].to_owned(),
                port,
                flags: fields[2].split(',').map(str::to_owned).collect(),
                primary_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

fn parse_slot_range(field: &str) -> Option<RangeInclusive<u16>> {
    let (start, end) = field.split_once('-').unwrap_or((field, field));
    let (start, end): (u16, u16) = (start.parse().ok()?, end.parse().ok()?);
    (start <= end && end < SLOT_COUNT).then_some(start..=end)
}

/// The owner port of every slot as contiguous ranges, if primaries cover all slots exactly once.
fn slot_owners(view: &[ViewEntry]) -> Result<SlotOwners, String> {
    let mut owner: Vec<Option<u16>> = vec![None; usize::from(SLOT_COUNT)];
    for entry in view.iter().filter(|entry| entry.has_flag("master")) {
        for range in &entry.slots {
            for slot in range.clone() {
                if let Some(other) = owner[usize::from(slot)].replace(entry.port) {
                    return Err(format!(
                        "sees slot {slot} owned by both 127.0.0.1:{other} and 127.0.0.1:{}",
                        entry.port
                    ));
                }
            }
        }
    }
    let mut ranges: SlotOwners = Vec::new();
    for (slot, port) in (0..SLOT_COUNT).zip(owner) {
        let Some(port) = port else {
            return Err(format!("sees slot {slot} unassigned"));
        };
        match ranges.last_mut() {
            Some((range, last)) if *last == port => *range = *range.start()..=slot,
            _ => ranges.push((slot..=slot, port)),
        }
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001,host1 myself,master - 0 0 1 connected 0-5460
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10921 10922 [10923->-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@40003 master,fail? - 0 1426238318243 3 connected 10923-16383
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
";

    #[test]
    fn parses_cluster_nodes_lines() {
        let view = parse_nodes(NODES).unwrap();
        assert_eq!(view.len(), 4);
        assert_eq!(view[0].port, 30001);
        assert!(view[0].has_flag("myself"));
        assert_eq!(view[0].role(), Some(NodeRole::Primary));
        assert_eq!(view[1].slots, vec![5461..=10921, 10922..=10922]);
        assert!(view[2].is_failed());
        assert_eq!(view[3].role(), Some(NodeRole::Replica));
        assert_eq!(view[3].primary_id.as_deref(), Some(view[0].id.as_str()));
        assert!(parse_nodes("abc 127.0.0.1:1@2 master").is_err());
    }

    #[test]
    fn slot_owners_merge_ranges_and_require_full_coverage() {
        let view = parse_nodes(NODES).unwrap();
        assert_eq!(
            slot_owners(&view).unwrap(),
            vec![
                (0..=5460, 30001),
                (5461..=10922, 30002),
                (10923..=16383, 30003)
            ]
        );
        let partial = parse_nodes(&NODES.replace("10923-16383", "10923-16382")).unwrap();
        assert_eq!(
            slot_owners(&partial).unwrap_err(),
            "sees slot 16383 unassigned"
        );
        let overlapping = parse_nodes(&NODES.replace("0-5460", "0-5461")).unwrap();
        assert!(
            slot_owners(&overlapping)
                .unwrap_err()
                .contains("owned by both")
        );
    }

    #[test]
    fn slot_ranges_are_bounded() {
        assert_eq!(parse_slot_range("7"), Some(7..=7));
        assert_eq!(parse_slot_range("0-16383"), Some(0..=16383));
        assert_eq!(parse_slot_range("0-16384"), None);
        assert_eq!(parse_slot_range("9-3"), None);
    }
}
