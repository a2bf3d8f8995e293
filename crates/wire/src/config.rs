//! The configuration the CM publishes: the term, the members and the shard map.
//!
//! Keys are routed by a 64-bit routing hash ([`routing_hash`]) whose top 14 bits
//! are the key's Redis Cluster hash slot (CRC16 of the key or of its `{hash tag}`,
//! `rowankv_resp::key_slot`) and whose other 50 bits spread the keys of a slot.
//! Each shard owns a contiguous range of that hash space: from its `start_hash`
//! (inclusive) to the next shard's `start_hash` (exclusive), the last shard to
//! `u64::MAX`. Every `start_hash` lies on a slot boundary, so a shard owns whole
//! slots — a contiguous slot range ([`Config::slot_range`]) — and a cluster-aware
//! Redis client computes a key's shard itself, as with Redis Cluster. Each shard
//! has one primary and `replication_factor - 1` backups, all members of the
//! cluster.
//!
//! Servers and clients learn the configuration through [`ConfigSource`], the CM's
//! interface; the CM stores it as JSON ([`Config::to_json`]).
//!
//! # Invariants of a valid configuration ([`Config::validate`])
//!
//! - at least one member, no node listed twice, no address given to two members,
//!   every address `host:port`;
//! - `1 <= replication_factor` (at most the members initially; failures may leave
//!   fewer members than it);
//! - shards non-empty, at most `u16::MAX` of them, with ids exactly `0..n` in order;
//! - `start_hash` strictly increasing, the first 0, so the ranges cover the whole hash
//!   space without overlap, each on a slot boundary (hence at most 16,384 shards);
//! - every primary, backup and joining backup a member, the primary not among
//!   them, all distinct, and at most `replication_factor - 1` backups and joining
//!   backups together (fewer while failures left too few servers: the shard runs
//!   degraded).
//!
//! A *joining* backup receives every new write of its shard and a copy of the rest
//! (re-replication, seed 000 §4.5 phase 3); it becomes a backup, eligible for
//! promotion, only once the copy is complete.
//!
//! Lookups ([`Config::shard_for_hash`] and friends) assume a valid configuration;
//! [`Config::from_json`] and [`Config::initial`] only return valid ones.

use std::collections::BTreeSet;
use std::sync::Arc;

use rowankv_types::{NodeId, ShardId, Term};
use serde::{Deserialize, Serialize};

/// The seed of the part of the routing hash below the slot. The engine's index
/// hash is xxh3 unseeded and uses its top 16 bits as index tags; with the same
/// hash, the keys of a slot would share a narrow range of tags and the index tags
/// would stop telling them apart, so the two hashes must be independent.
pub const ROUTING_SEED: u64 = 0x526f_7761_6e4b_5631;

// xxh3 with seed 0 is the unseeded xxh3: the seed must not be 0.
const _: () = assert!(ROUTING_SEED != 0);

/// Bits of the routing hash below the slot.
pub const SLOT_SHIFT: u32 = 64 - 14;

// The slot takes exactly the top bits left above the shift.
const _: () = assert!(1u64 << (64 - SLOT_SHIFT) == rowankv_resp::SLOT_COUNT as u64);

/// The hash that decides which shard owns `key`: its Redis Cluster hash slot in
/// the top 14 bits, a seeded xxh3 of the key below.
pub fn routing_hash(key: &[u8]) -> u64 {
    let slot = u64::from(rowankv_resp::key_slot(key));
    let spread = xxhash_rust::xxh3::xxh3_64_with_seed(key, ROUTING_SEED) >> (64 - SLOT_SHIFT);
    (slot << SLOT_SHIFT) | spread
}

/// The first routing hash of `slot`.
pub fn slot_start_hash(slot: u16) -> u64 {
    u64::from(slot) << SLOT_SHIFT
}

/// The slot a routing hash lies in.
pub fn slot_of_hash(hash: u64) -> u16 {
    (hash >> SLOT_SHIFT) as u16
}

/// Checks that `text` is `host:port`: a non-empty host and a port number. The
/// one rule for every address of a deployment (configuration members, the
/// deployment files).
pub fn check_host_port(text: &str) -> Result<(), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not host:port"))?;
    if host.is_empty() {
        return Err(format!("{text:?} is not host:port: no host"));
    }
    port.parse::<u16>()
        .map_err(|_| format!("{text:?} is not host:port: {port:?} is not a port"))?;
    Ok(())
}

/// A server of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub node: NodeId,
    /// Worker threads the server runs (each with its own log).
    pub workers: u16,
    /// Where the server's NIC engine is reached (`host:port`): set for a server
    /// that runs as a process (`docs/deployment.md`), `None` in one process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Where the server's Redis front end is reached (`host:port`), if it runs
    /// one: what `CLUSTER SLOTS` and `-MOVED` name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resp: Option<String>,
    /// The term of the configuration that (last) added it to a running
    /// cluster (`plan_join`); 0 for a member of the initial configuration (or
    /// of one written before the field). A server whose pool last came up as
    /// a member of an older term was removed and added again while it was
    /// down: its pool predates the removal (`docs/deployment.md`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub added: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One shard's range of the routing hash space and its replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardAssignment {
    pub shard: ShardId,
    /// First routing hash of the range (inclusive); the range ends where the next
    /// shard's begins.
    pub start_hash: u64,
    pub primary: NodeId,
    pub backups: Vec<NodeId>,
    /// Backups being filled by re-replication: they take every write but are not
    /// promoted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<NodeId>,
}

impl ShardAssignment {
    /// Whether `node` is the primary or a backup of this shard.
    pub fn is_replica(&self, node: NodeId) -> bool {
        self.primary == node || self.backups.contains(&node) || self.joining.contains(&node)
    }

    /// Where the primary replicates each write: the backups, then the joining ones.
    pub fn write_targets(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.backups.iter().chain(&self.joining).copied()
    }

    /// How many replicas take each write (backups and joining backups).
    pub fn write_target_count(&self) -> usize {
        self.backups.len() + self.joining.len()
    }
}

/// The cluster's configuration at one term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub cluster_id: u64,
    pub term: Term,
    pub replication_factor: u8,
    pub members: Vec<Member>,
    pub shards: Vec<ShardAssignment>,
    /// Dynamic resharding (seed 000 §4.6): the primary shards being moved,
    /// ⟨source, target, shard⟩. The shard's assignment already names the
    /// target as its primary; the source still holds its data until the move
    /// ends (and is struck from this list). Empty in a configuration written
    /// before the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<Migration>,
}

/// One migration task of the list a configuration carries (seed 000 §4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    pub shard: ShardId,
    /// The server the shard's primary moves from: it stops serving the shard
    /// at this configuration and copies its entries to `to`.
    pub from: NodeId,
    /// The shard's new primary.
    pub to: NodeId,
}

/// A configuration that breaks an invariant, or bytes that are not a configuration.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("cannot decode configuration: {0}")]
    Decode(String),
    /// No configuration could be fetched (the CM did not answer).
    #[error("configuration unavailable: {0}")]
    Unavailable(String),
}

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid(message)
}

impl Config {
    /// The first configuration: term 1; `shards_per_server * nodes.len()` shards of
    /// equal ranges of the hash space (shard i starts at i * ceil(2^64/n)); shard i's
    /// primary is nodes[i % n], its backups the next rf-1 nodes in ring order.
    pub fn initial(
        cluster_id: u64,
        nodes: &[Member],
        shards_per_server: u16,
        replication_factor: u8,
    ) -> Result<Config, ConfigError> {
        if nodes.is_empty() {
            return Err(invalid("no members".into()));
        }
        if shards_per_server == 0 {
            return Err(invalid("shards_per_server must be at least 1".into()));
        }
        let rf = replication_factor as usize;
        if rf == 0 || rf > nodes.len() {
            return Err(invalid(format!(
                "replication factor {rf} must be between 1 and the {} members",
                nodes.len()
            )));
        }
        let node_count = nodes.len();
        let shard_count = shards_per_server as usize * node_count;
        let slots = usize::from(rowankv_resp::SLOT_COUNT);
        if shard_count > slots {
            return Err(invalid(format!(
                "{shards_per_server} shards per server × {node_count} servers = \
                 {shard_count} shards, more than the {slots} slots"
            )));
        }
        // Shard i starts at slot floor(i × 16384 / n): whole slots, as even as
        // they divide.
        let shards = (0..shard_count)
            .map(|i| ShardAssignment {
                shard: ShardId(i as u16),
                start_hash: slot_start_hash((i * slots / shard_count) as u16),
                primary: nodes[i % node_count].node,
                backups: (1..rf).map(|k| nodes[(i + k) % node_count].node).collect(),
                joining: Vec::new(),
            })
            .collect();
        let config = Config {
            cluster_id,
            term: Term(1),
            replication_factor,
            members: nodes.to_vec(),
            shards,
            migrations: Vec::new(),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks every invariant listed in the module documentation.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.members.is_empty() {
            return Err(invalid("no members".into()));
        }
        let mut nodes = BTreeSet::new();
        let mut addresses = BTreeSet::new();
        for member in &self.members {
            if !nodes.insert(member.node) {
                return Err(invalid(format!("member {} is listed twice", member.node)));
            }
            if let Some(a) = &member.address {
                check_host_port(a)
                    .map_err(|why| invalid(format!("member {}'s address: {why}", member.node)))?;
                if !addresses.insert(a.as_str()) {
                    return Err(invalid(format!(
                        "member {}'s address {a} is another member's too",
                        member.node
                    )));
                }
            }
            if let Some(r) = &member.resp {
                check_host_port(r).map_err(|why| {
                    invalid(format!("member {}'s Redis address: {why}", member.node))
                })?;
            }
        }
        // More replicas than members is a cluster that failures left degraded.
        let rf = self.replication_factor as usize;
        if rf == 0 {
            return Err(invalid("replication factor 0".into()));
        }
        if self.shards.is_empty() {
            return Err(invalid("no shards".into()));
        }
        if self.shards.len() > u16::MAX as usize {
            return Err(invalid(format!(
                "{} shards, more than {}",
                self.shards.len(),
                u16::MAX
            )));
        }
        let mut previous_start: Option<u64> = None;
        for (i, s) in self.shards.iter().enumerate() {
            if s.shard.0 as usize != i {
                return Err(invalid(format!(
                    "shard at position {i} has id {}; ids must be 0..{} in order",
                    s.shard,
                    self.shards.len()
                )));
            }
            match previous_start {
                None if s.start_hash != 0 => {
                    return Err(invalid(format!(
                        "{} starts at hash {:#x}; the first shard must start at 0",
                        s.shard, s.start_hash
                    )))
                }
                Some(previous) if s.start_hash <= previous => {
                    return Err(invalid(format!(
                        "{} starts at hash {:#x}, not after the previous shard's {:#x}",
                        s.shard, s.start_hash, previous
                    )))
                }
                _ => {}
            }
            if s.start_hash & ((1 << SLOT_SHIFT) - 1) != 0 {
                return Err(invalid(format!(
                    "{} starts at hash {:#x}, inside slot {}: shards own whole slots \
                     (a configuration of a RowanKV before slot routing?)",
                    s.shard,
                    s.start_hash,
                    slot_of_hash(s.start_hash)
                )));
            }
            previous_start = Some(s.start_hash);
            if !nodes.contains(&s.primary) {
                return Err(invalid(format!(
                    "{}'s primary {} is not a member",
                    s.shard, s.primary
                )));
            }
            if s.write_target_count() > rf - 1 {
                return Err(invalid(format!(
                    "{} has {} backups; replication factor {rf} allows {}",
                    s.shard,
                    s.write_target_count(),
                    rf - 1
                )));
            }
            let targets: Vec<NodeId> = s.write_targets().collect();
            for (k, backup) in targets.iter().enumerate() {
                if !nodes.contains(backup) {
                    return Err(invalid(format!(
                        "{}'s backup {backup} is not a member",
                        s.shard
                    )));
                }
                if *backup == s.primary {
                    return Err(invalid(format!(
                        "{}'s primary {backup} is also one of its backups",
                        s.shard
                    )));
                }
                if targets[..k].contains(backup) {
                    return Err(invalid(format!("{} lists backup {backup} twice", s.shard)));
                }
            }
        }
        let mut migrating = BTreeSet::new();
        for m in &self.migrations {
            let Some(s) = self.shard(m.shard) else {
                return Err(invalid(format!(
                    "a migration of {}, which does not exist",
                    m.shard
                )));
            };
            if !migrating.insert(m.shard) {
                return Err(invalid(format!("{} is migrated twice at once", m.shard)));
            }
            if m.from == m.to {
                return Err(invalid(format!(
                    "{} migrates from {} to itself",
                    m.shard, m.from
                )));
            }
            if s.primary != m.to {
                return Err(invalid(format!(
                    "{} migrates to {}, but its primary is {}",
                    m.shard, m.to, s.primary
                )));
            }
            if !nodes.contains(&m.from) {
                return Err(invalid(format!(
                    "{} migrates from {}, which is not a member",
                    m.shard, m.from
                )));
            }
            if s.is_replica(m.from) {
                return Err(invalid(format!(
                    "{} migrates from {}, which is also one of its replicas",
                    m.shard, m.from
                )));
            }
        }
        Ok(())
    }

    /// The migration of `shard` under way, if any.
    pub fn migration(&self, shard: ShardId) -> Option<&Migration> {
        self.migrations.iter().find(|m| m.shard == shard)
    }

    /// The shard whose range holds `hash`. Requires a validated configuration.
    pub fn shard_for_hash(&self, hash: u64) -> &ShardAssignment {
        // The first shard starts at 0, so at least one shard starts at or before `hash`.
        let after = self.shards.partition_point(|s| s.start_hash <= hash);
        assert!(
            after > 0,
            "shard_for_hash on a configuration that does not start at hash 0"
        );
        &self.shards[after - 1]
    }

    /// The hash slots shard at position `index` owns: first and last, inclusive.
    /// Requires a validated configuration.
    pub fn slot_range(&self, index: usize) -> (u16, u16) {
        let first = slot_of_hash(self.shards[index].start_hash);
        let last = match self.shards.get(index + 1) {
            Some(next) => slot_of_hash(next.start_hash) - 1,
            None => rowankv_resp::SLOT_COUNT - 1,
        };
        (first, last)
    }

    /// The shard that owns `key`. Requires a validated configuration.
    pub fn shard_for_key(&self, key: &[u8]) -> &ShardAssignment {
        self.shard_for_hash(routing_hash(key))
    }

    pub fn shard(&self, id: ShardId) -> Option<&ShardAssignment> {
        self.shards.get(id.0 as usize).filter(|s| s.shard == id)
    }

    pub fn member(&self, node: NodeId) -> Option<&Member> {
        self.members.iter().find(|m| m.node == node)
    }

    /// Number of shards. Requires a validated configuration.
    pub fn shard_count(&self) -> u16 {
        u16::try_from(self.shards.len()).expect("a valid configuration has at most u16::MAX shards")
    }

    /// Shards whose primary is `node`.
    pub fn primary_shards(&self, node: NodeId) -> impl Iterator<Item = &ShardAssignment> {
        self.shards.iter().filter(move |s| s.primary == node)
    }

    /// Shards of which `node` is a backup (joining or not).
    pub fn backup_shards(&self, node: NodeId) -> impl Iterator<Item = &ShardAssignment> {
        self.shards
            .iter()
            .filter(move |s| s.write_targets().any(|b| b == node))
    }

    /// The configuration as JSON, the form the CM stores and publishes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a configuration always serializes to JSON")
    }

    /// Parses and validates a configuration.
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        let config: Config =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Decode(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }
}

/// What servers and clients call to learn the current configuration: the CM's
/// interface (its implementation lives in the `cm` crate).
pub trait ConfigSource: Send + Sync {
    fn fetch(&self) -> Result<Arc<Config>, ConfigError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u32) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                added: 0,
                node: NodeId(i),
                workers: 1,
                address: None,
                resp: None,
            })
            .collect()
    }

    #[test]
    fn a_single_shard_covers_everything() {
        let config = Config::initial(7, &members(1), 1, 1).unwrap();
        assert_eq!(config.shards.len(), 1);
        assert_eq!(config.shard_for_hash(u64::MAX).shard, ShardId(0));
        assert!(config.shards[0].backups.is_empty());
    }

    #[test]
    fn the_largest_shard_count_gives_each_shard_one_slot() {
        // 16384 = 4 × 4096 shards: one slot each, the last at 2^64 − 2^50.
        let config = Config::initial(7, &members(4), 4096, 1).unwrap();
        assert_eq!(config.shard_count(), 16384);
        assert_eq!(config.shard_for_hash(u64::MAX).shard, ShardId(16383));
        for i in [0, 1, 9000, 16383] {
            assert_eq!(config.slot_range(i), (i as u16, i as u16));
        }
    }
}
