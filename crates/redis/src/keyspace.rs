//! The keyspace seam: what the command layer needs from storage, and nothing more.
//!
//! RowanKV's servers implement [`Keyspace`] over the cluster's client (reads and
//! conditional writes of the shards this node can reach); [`crate::MemKeyspace`]
//! implements it in memory for tests and demos. The command layer never reaches
//! past this trait, so every command can be tested against the in-memory model and
//! any backend can be checked with [`crate::conformance`].
//!
//! # Contract
//!
//! - Values are strings (bytes). A key has at most one live [`Record`].
//! - A record whose `expires_at_ms` has passed is not live: reads return `None` for
//!   it and conditions treat it as absent. "Passed" is Redis's rule: a record is
//!   live while `now_ms <= expires_at_ms` ([`Record::is_live`]).
//! - Every successful write gives the key a new version, greater than any version
//!   the key had before, so `Expect::Version(v)` holds only if nothing was written
//!   to the key since the read that returned version `v`.
//! - A conditional write ([`Expect::Absent`], [`Expect::Version`]) is atomic: the
//!   condition is checked and the write applied as one step, with respect to every
//!   other write to the same key. This is what makes the layer's read-modify-write
//!   commands atomic per key.
//! - A condition that does not hold is `Err(KeyspaceError::Conflict)`, never a
//!   silent no-op; [`Expect::Any`] never conflicts.
//! - [`Keyspace::move_slot`] is the one operation on the cluster rather than on
//!   keys (CLUSTER SETSLOT ... NODE): a keyspace that cannot move shards keeps
//!   the default, which refuses and changes nothing. A refusal, whatever its
//!   cause, leaves the cluster's configuration as it was.

/// A stored string, its expiry and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub value: Vec<u8>,
    /// Unix time in milliseconds after which the record is gone; `None` = no TTL.
    pub expires_at_ms: Option<u64>,
    /// Changes with every write to the key (see the module contract).
    pub version: u64,
}

impl Record {
    /// Whether the record is live at `now_ms`. As in Redis, a key expires once the
    /// clock is past its expiry time (`now > expires_at`), not at it.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|at| now_ms <= at)
    }
}

/// How a conditional write is conditioned, against the key's live record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Unconditional.
    Any,
    /// Only if the key has no live record.
    Absent,
    /// Only if the key's live record has this version.
    Version(u64),
}

impl Expect {
    /// Whether the condition holds for `current`, the key's live record (a helper
    /// for implementers).
    pub fn holds(self, current: Option<&Record>) -> bool {
        match (self, current) {
            (Expect::Any, _) => true,
            (Expect::Absent, current) => current.is_none(),
            (Expect::Version(v), Some(record)) => record.version == v,
            (Expect::Version(_), None) => false,
        }
    }
}

/// Why a keyspace operation did not happen. Each becomes the error reply Redis
/// clients act on (see `Session::execute`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyspaceError {
    /// The [`Expect`] of a conditional write did not hold; the layer re-reads and
    /// retries read-modify-write commands.
    #[error("the write's condition did not hold")]
    Conflict,
    /// The key's slot is served by another node: `-MOVED slot host:port`.
    #[error("slot {slot} is served by {host}:{port}")]
    Moved { slot: u16, host: String, port: u16 },
    /// The key cannot be served now but may be soon (a slot moving, a failover):
    /// `-TRYAGAIN <message>`, which cluster clients retry.
    #[error("try again: {0}")]
    TryAgain(String),
    /// The keyspace cannot serve requests: `-CLUSTERDOWN <message>` in cluster mode,
    /// `-ERR <message>` otherwise.
    #[error("down: {0}")]
    Down(String),
    /// Any other failure: `-ERR <message>`.
    #[error("{0}")]
    Other(String),
}

/// Why `CLUSTER SETSLOT <slot> NODE <node-id>` moved nothing
/// ([`Keyspace::move_slot`]). Slots are given as numbers, nodes by the Redis
/// Cluster node id the CLUSTER commands print.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotMoveError {
    /// `slot` lies inside a shard's range `start..=end` without being its first
    /// slot: the shard moves whole, so the request must name the range by its
    /// first slot (a request for one slot must not move a thousand unasked).
    #[error("slot {slot} is inside the shard of slots {start}-{end}")]
    NotShardStart { slot: u16, start: u16, end: u16 },
    /// No node of the cluster has this id.
    #[error("no node {0}")]
    UnknownNode(String),
    /// The node is the shard's primary already.
    #[error("{node} leads slots {start}-{end} already")]
    AlreadyPrimary { node: String, start: u16, end: u16 },
    /// The shard is being moved to `to` already.
    #[error("slots {start}-{end} are moving to {to}")]
    Migrating { start: u16, end: u16, to: String },
    /// The cluster's manager refused the move, for this reason (the target
    /// holds a replica of the shard, another reconfiguration is under way, ...).
    #[error("refused: {0}")]
    Refused(String),
    /// No cluster manager could be asked (none reachable, none active).
    #[error("no cluster manager answered: {0}")]
    NoManager(String),
    /// This keyspace cannot move shards (the default of [`Keyspace::move_slot`]).
    #[error("this keyspace does not move slots")]
    Unsupported,
}

/// What the command layer needs from storage (see the module contract).
pub trait Keyspace {
    /// The live record of `key` (an expired record is `None`: the implementer checks
    /// expiry against `now_ms`).
    fn get(&mut self, key: &[u8], now_ms: u64) -> Result<Option<Record>, KeyspaceError>;

    /// Writes `value` with `expires_at_ms` if `expect` holds for the key's current
    /// live record; returns the new version. Not met: `Err(Conflict)`.
    fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        expect: Expect,
        now_ms: u64,
    ) -> Result<u64, KeyspaceError>;

    /// Deletes the key if `expect` holds; returns whether a live record was deleted.
    /// Not met: `Err(Conflict)`.
    fn delete(&mut self, key: &[u8], expect: Expect, now_ms: u64) -> Result<bool, KeyspaceError>;

    /// Keys of this node's part of the keyspace from `cursor` (0 to start), about
    /// `count` of them, and the next cursor (0 = done). As Redis's SCAN: a key live
    /// for the whole iteration is returned at least once; keys written or deleted
    /// meanwhile may or may not be.
    fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        now_ms: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), KeyspaceError>;

    /// How many live keys this node's part of the keyspace holds.
    fn dbsize(&mut self, now_ms: u64) -> Result<u64, KeyspaceError>;

    /// Deletes every key of this node's part of the keyspace.
    fn flushall(&mut self) -> Result<(), KeyspaceError>;

    /// Moves the shard whose range of slots starts at `slot` to the node with
    /// the Redis Cluster id `node_id` (CLUSTER SETSLOT ... NODE), returning
    /// once the cluster's configuration names that node the shard's primary
    /// (its keys may still be copying: the node serves them meanwhile). The
    /// default refuses with [`SlotMoveError::Unsupported`].
    fn move_slot(&mut self, slot: u16, node_id: &str) -> Result<(), SlotMoveError> {
        let _ = (slot, node_id);
        Err(SlotMoveError::Unsupported)
    }
}
