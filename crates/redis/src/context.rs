//! What the server tells the command layer on every call: the time, the node's
//! identity and settings, and (on a cluster node) the cluster's topology.
//!
//! The layer has no clock and no configuration of its own: the server builds one
//! [`Context`], keeps it current (at least `now_ms`) and passes it to every
//! `Session::execute`.

use rowankv_resp::SLOT_COUNT;

/// The Redis version RowanKV's command layer answers as (HELLO's `version`, INFO's
/// `redis_version`): clients gate features on it, and the commands here behave as
/// Redis 7.2's.
pub const REDIS_COMPATIBLE_VERSION: &str = "7.2.0";

/// Per call: time, identity, settings, topology.
#[derive(Clone, Debug)]
pub struct Context {
    /// Unix time in milliseconds: the "now" of every expiry decision of the call.
    pub now_ms: u64,
    pub server: ServerInfo,
    /// `requirepass`: when set, a connection must AUTH (user `default`) first.
    pub requirepass: Option<Vec<u8>>,
    /// Whether FLUSHALL/FLUSHDB may run; refused with an error when not.
    pub flushall_enabled: bool,
    /// Whether CLUSTER SETSLOT ... NODE may move shards; refused with an error
    /// when not.
    pub setslot_enabled: bool,
    /// How many replicas every acknowledged write is durable on (WAIT's answer).
    pub replicas: u64,
    /// Open client connections of the server (INFO clients).
    pub connected_clients: u64,
    /// Lines of INFO's `stats` section, as (field, value), from the server.
    pub stats: Vec<(String, String)>,
    /// Lines of INFO's `rowankv` section (term, replication strategy, DLWA, segment
    /// states, ...), as (field, value).
    pub rowankv: Vec<(String, String)>,
    /// The cluster's topology: the CLUSTER commands describe it.
    pub topology: Option<Topology>,
    /// With a topology, whether the node answers as a Redis Cluster node
    /// (cluster mode: `-CROSSSLOT`, the keyspace's `-MOVED`, its own part of
    /// the keyspace, `cluster_enabled:1`). `false`: the node serves every key
    /// itself (forwarding to the key's primary), as a standalone Redis, and
    /// the topology only lets cluster-aware clients route directly.
    pub redirects: bool,
}

impl Context {
    /// A standalone node's context at `now_ms`, with no password, FLUSHALL and
    /// CLUSTER SETSLOT refused, no replicas and the default [`ServerInfo`].
    pub fn new(now_ms: u64) -> Context {
        Context {
            now_ms,
            server: ServerInfo::default(),
            requirepass: None,
            flushall_enabled: false,
            setslot_enabled: false,
            replicas: 0,
            connected_clients: 1,
            stats: Vec::new(),
            rowankv: Vec::new(),
            topology: None,
            redirects: true,
        }
    }

    /// Whether the session answers as a Redis Cluster node.
    pub fn cluster_mode(&self) -> bool {
        self.topology.is_some() && self.redirects
    }
}

/// The node as INFO, HELLO and CLUSTER describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// HELLO's `server` field.
    pub name: String,
    /// RowanKV's version (INFO's `rowankv_version`).
    pub version: String,
    /// The Redis version answered as (see [`REDIS_COMPATIBLE_VERSION`]).
    pub redis_version: String,
    /// 40 hex characters, new at every start of the server (INFO's `run_id`).
    pub run_id: String,
    /// The RESP port.
    pub tcp_port: u16,
    /// Unix time in milliseconds when the server started (INFO's uptime).
    pub started_at_ms: u64,
}

impl Default for ServerInfo {
    fn default() -> Self {
        ServerInfo {
            name: "rowankv".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            redis_version: REDIS_COMPATIBLE_VERSION.to_string(),
            run_id: "0".repeat(NODE_ID_LEN),
            tcp_port: 6379,
            started_at_ms: 0,
        }
    }
}

/// A Redis Cluster node id is 40 hex characters.
pub const NODE_ID_LEN: usize = 40;

/// A node of the cluster as Redis clients address it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// 40 lower- or upper-case hex characters.
    pub id: String,
    pub host: String,
    pub port: u16,
}

/// An inclusive range of hash slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
}

/// A shard: the slots it owns, its primary and its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterShard {
    pub slots: Vec<SlotRange>,
    pub primary: ClusterNode,
    pub replicas: Vec<ClusterNode>,
}

/// A topology that cannot be described to Redis clients.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("node id {0:?} is not 40 hex characters")]
    NodeId(String),
    #[error("slot range {start}-{end} is empty or beyond slot 16383")]
    SlotRange { start: u16, end: u16 },
    #[error("slot {0} belongs to two shards")]
    SlotOwnedTwice(u16),
    #[error("node {0} (myself) is in no shard")]
    MyselfUnknown(String),
}

/// The cluster as this node knows it: shards over slot ranges, and which node is
/// this one. Invariants (checked by [`Topology::new`]): node ids are 40 hex
/// characters, ranges lie within the 16,384 slots, no slot belongs to two shards,
/// and `myself` is a node of some shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    epoch: u64,
    myself: String,
    shards: Vec<ClusterShard>,
}

impl Topology {
    /// `epoch` is the configuration's term (CLUSTER's `current_epoch`).
    pub fn new(
        epoch: u64,
        myself: impl Into<String>,
        shards: Vec<ClusterShard>,
    ) -> Result<Topology, TopologyError> {
        let myself = myself.into();
        let mut owned = vec![false; usize::from(SLOT_COUNT)];
        for shard in &shards {
            for node in std::iter::once(&shard.primary).chain(&shard.replicas) {
                if node.id.len() != NODE_ID_LEN || !node.id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(TopologyError::NodeId(node.id.clone()));
                }
            }
            for range in &shard.slots {
                if range.start > range.end || range.end >= SLOT_COUNT {
                    return Err(TopologyError::SlotRange {
                        start: range.start,
                        end: range.end,
                    });
                }
                for slot in range.start..=range.end {
                    if std::mem::replace(&mut owned[usize::from(slot)], true) {
                        return Err(TopologyError::SlotOwnedTwice(slot));
                    }
                }
            }
        }
        let topology = Topology {
            epoch,
            myself,
            shards,
        };
        if topology.node(&topology.myself).is_none() {
            return Err(TopologyError::MyselfUnknown(topology.myself));
        }
        Ok(topology)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This node's id.
    pub fn myself(&self) -> &str {
        &self.myself
    }

    pub fn shards(&self) -> &[ClusterShard] {
        &self.shards
    }

    /// The node with `id`, wherever it serves.
    pub fn node(&self, id: &str) -> Option<&ClusterNode> {
        self.shards
            .iter()
            .flat_map(|shard| std::iter::once(&shard.primary).chain(&shard.replicas))
            .find(|node| node.id == id)
    }

    /// How many slots some shard owns.
    pub fn slots_assigned(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(|shard| &shard.slots)
            .map(|range| u64::from(range.end - range.start) + 1)
            .sum()
    }
}
