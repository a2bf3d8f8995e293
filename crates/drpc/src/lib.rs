//! `rowankv-drpc`: durable RPCs over RDMA Flush (seed 002 §4): SFlush-RPC,
//! WFlush-RPC, S-RFlush-RPC and W-RFlush-RPC.
//!
//! # What this crate owns
//! - The receiver's redo ring in persistent memory ([`Receiver`]): one ring and one
//!   header per connection in a registered [`rowankv_pmem::Pool`], entries with a
//!   length and a CRC-32C, FIFO processing per connection, truncation (the persisted
//!   `head_abs`) after completion, a slow-down signal when a connection's backlog
//!   passes a threshold, and recovery after a crash that re-executes every durable,
//!   incomplete request exactly once.
//! - The sender ([`Sender`]): the four message patterns, batching of several
//!   requests into one entry and one flush (Figure 6), the in-flight window and the
//!   throttle on a slow-down signal.
//! - The byte layout of the pool, the entries and the replies ([`layout`]; tables in
//!   `docs/drpc.md`).
//!
//! # What it must never depend on
//! Only the fabric's interface (`Fabric`, `Nic`, `QueuePair`, `CompletionQueue`,
//! `SharedReceiveQueue`), never a backend: it runs on `LoopbackFabric` and
//! `TcpFabric` alike. Nothing above the pmem crate (no engine, replication, server).
//!
//! # Invariants
//! - A request is acknowledged as durable (`Event::Durable`) only once every byte of
//!   its entry is in the receiver's persistence domain.
//! - The receiver processes a connection's requests in seq order, one at a time.
//! - A request's effect on the receiver's state and its completion mark are one
//!   failure-atomic step: the effect is logged in the apply record (checksummed) and
//!   persisted before the state is touched, and `done_seq` moves only after the state
//!   writes are durable; recovery redoes a logged effect (physical writes, idempotent)
//!   and re-executes every durable request past `done_seq`. So after any crash each
//!   durable request has taken effect exactly once, and a request that never became
//!   durable at most once (see `docs/drpc.md`, "Recovery").
//! - RFlush is emulated by the receiver's CPU (it persists the landed entry and
//!   answers), as the paper emulates it; SFlush and WFlush are the fabric's own
//!   persistence operations.

#![forbid(unsafe_code)]

pub mod layout;
mod receiver;
mod sender;

use rowankv_fabric::{FabricError, WcStatus};
use rowankv_pmem::Pool;

pub use layout::{RingGeometry, StateWrite};
pub use receiver::{persisted_header, Offer, Receiver, ReceiverStats, RecoveryReport};
pub use sender::{Event, Sender, SenderStats};

/// A connection's index at the receiver: which ring and header it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u32);

/// The four durable RPC designs of seed 002 (§4.1, §5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// SEND whose completion means durable at the receiver (the NIC finds the
    /// destination, the posted ring chunk, and flushes it): the fabric's persisted
    /// SEND.
    SFlush,
    /// WRITE of the entry's body, FLUSH of it (IBTA 1.5, persistence placement), then
    /// an ATOMIC WRITE of the entry's seq word, persisted: data before operator.
    WFlush,
    /// SEND; the receiver's CPU persists the landed entry and answers (RFlush,
    /// emulated by the CPU).
    SRFlush,
    /// WRITE; the receiver's CPU finds it by polling the ring, persists it and
    /// answers (RFlush, emulated by the CPU).
    WRFlush,
}

impl Variant {
    pub const ALL: [Variant; 4] = [
        Variant::SFlush,
        Variant::WFlush,
        Variant::SRFlush,
        Variant::WRFlush,
    ];

    /// The name used in benchmarks and docs.
    pub fn name(self) -> &'static str {
        match self {
            Variant::SFlush => "sflush",
            Variant::WFlush => "wflush",
            Variant::SRFlush => "s-rflush",
            Variant::WRFlush => "w-rflush",
        }
    }

    /// The request travels as a SEND into the ring's posted chunks (else a WRITE).
    pub fn uses_send(self) -> bool {
        matches!(self, Variant::SFlush | Variant::SRFlush)
    }

    /// The receiver's CPU makes the entry durable and tells the sender (RFlush).
    pub fn receiver_initiated(self) -> bool {
        matches!(self, Variant::SRFlush | Variant::WRFlush)
    }
}

/// Bounds of one connection, agreed by both ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowConfig {
    /// Requests sent and not yet completed, at most.
    pub inflight_max: usize,
    /// The same bound while the receiver asks to slow down.
    pub inflight_slowed_max: usize,
    /// Requests packed into one entry, one flush (Figure 6). 1 disables batching.
    pub batch_max: usize,
    /// A connection's backlog (found, not completed requests) above which the
    /// receiver's replies carry the slow-down signal.
    pub slow_down_threshold: usize,
    /// Requests the receiver executes per `poll` over all connections.
    pub requests_per_poll_max: usize,
    /// Largest reply an operator may return.
    pub reply_bytes_max: usize,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            inflight_max: 16,
            inflight_slowed_max: 2,
            batch_max: 1,
            slow_down_threshold: 8,
            requests_per_poll_max: 16,
            reply_bytes_max: 256,
        }
    }
}

impl FlowConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.inflight_max == 0 || self.inflight_slowed_max == 0 {
            return Err("in-flight bounds must be at least 1".into());
        }
        if self.inflight_slowed_max > self.inflight_max {
            return Err("inflight_slowed_max exceeds inflight_max".into());
        }
        if self.batch_max == 0 || self.batch_max > self.inflight_max {
            return Err("batch_max must be in 1..=inflight_max".into());
        }
        if self.batch_max > layout::ENTRY_REQUESTS_MAX {
            return Err("batch_max exceeds the requests an entry can carry".into());
        }
        if self.requests_per_poll_max == 0 {
            return Err("requests_per_poll_max must be at least 1".into());
        }
        Ok(())
    }

    /// Replies that can be in flight to a sender at once: a durable notice and a
    /// completion per request.
    pub fn replies_max(&self) -> usize {
        2 * self.inflight_max
    }
}

/// A request as the operator sees it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub conn: ConnId,
    pub seq: u64,
    pub op: u16,
    pub payload: &'a [u8],
}

/// What executing a request does: writes to the state area (applied failure-atomically
/// with the request's completion) and the reply bytes for the sender.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effect {
    pub writes: Vec<StateWrite>,
    pub reply: Vec<u8>,
}

/// Read access to the receiver's state area during execution.
pub struct StateView<'a> {
    pool: &'a Pool,
    offset: usize,
    len_bytes: usize,
}

impl StateView<'_> {
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Loads `out.len()` bytes at `offset` of the state area.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|e| e <= self.len_bytes),
            "state read outside the state area"
        );
        self.pool.read(self.offset + offset, out)
    }

    pub fn read_u64(&self, offset: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(offset, &mut b);
        u64::from_le_bytes(b)
    }
}

/// The receiver's service: executes a request against the state and says what it
/// changes. It must not change anything outside the returned writes (nothing else is
/// recovered), and its writes must lie inside the state area and fit in the apply
/// record area (both checked, as programmer errors).
///
/// An operator that cannot take a request now (its store is out of room, say)
/// answers [`NotNow`]: nothing of the request has taken effect, it stays where it
/// is, and it is offered again, first on its connection, at a later poll. The
/// receiver never waits inside `execute`, so whatever would make room (another
/// role of the same process, or of a simulated one) gets to run meanwhile.
pub trait Operator {
    fn execute(&mut self, state: &StateView<'_>, request: &Request<'_>) -> Result<Effect, NotNow>;
}

/// An operator's answer to a request it cannot execute yet, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotNow(pub String);

impl std::fmt::Display for NotNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Errors of the durable RPC layer.
#[derive(Debug, thiserror::Error)]
pub enum DrpcError {
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    /// The in-flight window, the ring or the send queue is full: poll, then retry.
    #[error("would block: the in-flight window or the ring is full; poll and retry")]
    WouldBlock,
    #[error("request payload of {len} bytes exceeds the largest of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// A work request of the connection failed; the connection is broken.
    #[error("connection failed: a work request completed with {0:?}")]
    Connection(WcStatus),
    #[error("not connected")]
    NotConnected,
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The pool does not hold a durable-RPC ring of the expected geometry.
    #[error("pool: {0}")]
    Pool(String),
    /// The peer sent bytes that are not a reply.
    #[error("malformed reply: {0}")]
    BadReply(&'static str),
    #[error("connection {0:?} is out of range or already accepted")]
    BadConnection(ConnId),
    /// The operator answered [`NotNow`] to a request that had to be executed
    /// now (a drain, a release, recovery): it and those after it on its
    /// connection wait, durable in the ring; call again later.
    #[error("connection {conn:?}, request {seq}: not executed yet: {why}")]
    NotNow { conn: ConnId, seq: u64, why: String },
}
