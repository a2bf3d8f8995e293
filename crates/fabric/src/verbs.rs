//! The verbs vocabulary shared by every backend: access rights, work requests,
//! completions, errors, and the traits a backend implements.
//!
//! The semantics are those of RDMA reliable-connected (RC) queue pairs as libibverbs
//! exposes them, narrowed to what RowanKV uses. Where a backend cannot match the
//! hardware exactly the difference is documented on the backend, never hidden.

use std::sync::Arc;

use rowankv_types::{NodeId, QpNum, Rkey};

use crate::memory::{PowerFailure, RegionMemory};

/// Access rights of a registered memory region (a small bit set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Access(u8);

impl Access {
    pub const NONE: Access = Access(0);
    pub const REMOTE_READ: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_ATOMIC: Access = Access(4);
    /// FLUSH with the global-visibility placement type (`IBV_ACCESS_FLUSH_GLOBAL`).
    pub const FLUSH_GLOBAL: Access = Access(8);
    /// FLUSH with the persistence placement type (`IBV_ACCESS_FLUSH_PERSISTENT`).
    pub const FLUSH_PERSISTENT: Access = Access(16);
    pub const ALL: Access = Access(31);

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A registered memory region as its owner holds it: the memory, the window of it
/// that is registered, the key and the rights.
#[derive(Clone)]
pub struct MemoryRegion {
    pub node: NodeId,
    pub rkey: Rkey,
    pub access: Access,
    memory: Arc<dyn RegionMemory>,
    base: usize,
    len_bytes: usize,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("node", &self.node)
            .field("rkey", &self.rkey)
            .field("base", &self.base)
            .field("len_bytes", &self.len_bytes)
            .finish()
    }
}

impl MemoryRegion {
    /// For backends: build the owner's handle after registration.
    pub fn new(
        node: NodeId,
        rkey: Rkey,
        access: Access,
        memory: Arc<dyn RegionMemory>,
        base: usize,
        len_bytes: usize,
    ) -> Self {
        MemoryRegion {
            node,
            rkey,
            access,
            memory,
            base,
            len_bytes,
        }
    }

    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Offset of the region's first byte within its memory.
    pub fn base(&self) -> usize {
        self.base
    }

    pub fn memory(&self) -> &Arc<dyn RegionMemory> {
        &self.memory
    }

    /// What a peer needs to address this region (exchanged out of band).
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            node: self.node,
            rkey: self.rkey,
            len_bytes: self.len_bytes,
        }
    }

    /// Whether `[offset, offset + len)` lies inside the region.
    pub fn contains(&self, offset: u64, len: usize) -> bool {
        offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len_bytes as u64)
    }

    /// Local load from the region (the owner's CPU reading what the NIC landed).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            self.contains(offset as u64, out.len()),
            "local read outside region"
        );
        self.memory.dma_read(self.base + offset, out)
    }

    /// Local 8-byte load.
    pub fn read_u64(&self, offset: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(offset, &mut b);
        u64::from_le_bytes(b)
    }

    /// Local store into the region (not durable until persisted by its memory).
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            self.contains(offset as u64, data.len()),
            "local write outside region"
        );
        self.memory.dma_write(self.base + offset, data)
    }

    /// Make a local range of the region durable.
    pub fn persist(&self, offset: usize, len: usize) {
        assert!(self.contains(offset as u64, len), "persist outside region");
        self.memory.dma_persist(self.base + offset, len)
    }
}

/// What a peer knows of a region: enough to address it, nothing to touch it locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    pub node: NodeId,
    pub rkey: Rkey,
    pub len_bytes: usize,
}

impl RemoteRegion {
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            rkey: self.rkey,
            offset,
        }
    }
}

/// A remote address: a key and a byte offset within that region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    pub rkey: Rkey,
    pub offset: u64,
}

/// A local destination for READ results and atomic old values.
#[derive(Clone, Copy, Debug)]
pub struct LocalAddr<'a> {
    pub mr: &'a MemoryRegion,
    pub offset: usize,
}

/// The address of a queue pair, exchanged out of band to connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpAddr {
    pub node: NodeId,
    pub qpn: QpNum,
}

/// One operation. Source bytes of SEND and WRITE are copied when posted (inline),
/// so the caller's buffer may be reused as soon as `post_send` returns.
#[derive(Clone, Copy, Debug)]
pub enum Op<'a> {
    Send {
        data: &'a [u8],
        imm: Option<u32>,
    },
    Write {
        data: &'a [u8],
        remote: RemoteAddr,
        imm: Option<u32>,
    },
    Read {
        remote: RemoteAddr,
        len: usize,
        local: LocalAddr<'a>,
    },
    CompareSwap {
        remote: RemoteAddr,
        expect: u64,
        swap: u64,
        local: LocalAddr<'a>,
    },
    FetchAdd {
        remote: RemoteAddr,
        add: u64,
        local: LocalAddr<'a>,
    },
    /// IBTA 1.5 FLUSH of `len` bytes at `remote`: once it completes, every WRITE
    /// posted before it on this queue pair that landed in the range has reached
    /// `placement` at the target. Needs the region's flush right of that
    /// placement ([`Access::FLUSH_GLOBAL`], [`Access::FLUSH_PERSISTENT`]).
    Flush {
        remote: RemoteAddr,
        len: usize,
        placement: Placement,
    },
    /// IBTA 1.5 ATOMIC WRITE: 8 bytes stored at an 8-byte aligned `remote` as one
    /// indivisible write (never torn, atomic with respect to the target's other
    /// atomics). Needs [`Access::REMOTE_WRITE`]. With [`WorkRequest::persist`],
    /// the completion means the 8 bytes are durable.
    AtomicWrite {
        remote: RemoteAddr,
        value: u64,
    },
}

/// Where a FLUSH makes earlier WRITEs reach (IBTA 1.5 placement types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Visible to every reader at the target, CPU included. A WRITE the fabric
    /// has landed already is: the FLUSH orders and checks, and moves no byte.
    GlobalVisibility,
    /// In the target's persistence domain: survives a power failure.
    Persistence,
}

impl Placement {
    /// The access right a FLUSH of this placement needs at the target.
    pub fn right(self) -> Access {
        match self {
            Placement::GlobalVisibility => Access::FLUSH_GLOBAL,
            Placement::Persistence => Access::FLUSH_PERSISTENT,
        }
    }
}

/// A work request for a queue pair's send queue.
#[derive(Clone, Copy, Debug)]
pub struct WorkRequest<'a> {
    /// Returned in the completion; the caller's context.
    pub wr_id: u64,
    pub op: Op<'a>,
    /// Generate a completion on success. Errors always complete.
    pub signaled: bool,
    /// SEND, WRITE and ATOMIC WRITE only: the completion means the bytes are
    /// durable at the target (WRITE followed by READ on today's RNICs, seed 000
    /// §2.2; the shorthand of a WRITE followed by a FLUSH of
    /// [`Placement::Persistence`] on the same queue pair).
    pub persist: bool,
    /// A persisted SEND made durable by the *sender's* NIC flushing where the
    /// SEND landed (seed 002's SFlush), which first learns that place from
    /// the target: the wire model charges the lookup (`docs/wire-model.md`).
    /// Without it a persisted SEND is a SEND followed by a 1-byte READ on
    /// the same queue pair (seed 000 §2.2), which needs no lookup.
    pub sender_flush: bool,
}

impl<'a> WorkRequest<'a> {
    pub fn new(wr_id: u64, op: Op<'a>) -> Self {
        WorkRequest {
            wr_id,
            op,
            signaled: true,
            persist: false,
            sender_flush: false,
        }
    }

    pub fn persisted(mut self) -> Self {
        self.persist = true;
        self
    }

    /// Persisted by a sender-initiated flush (SFlush, seed 002 §4.1): see
    /// [`WorkRequest::sender_flush`].
    pub fn persisted_by_sender_flush(mut self) -> Self {
        self.persist = true;
        self.sender_flush = true;
        self
    }

    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }
}

/// A receive buffer for a shared receive queue: a window of a local region.
#[derive(Clone, Debug)]
pub struct RecvBuffer {
    pub wr_id: u64,
    pub mr: MemoryRegion,
    pub offset: usize,
    pub len_bytes: usize,
}

/// Status of a completion, after `ibv_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// The target refused the access: bad key, out of bounds, missing right or a
    /// misaligned atomic. Nothing was changed at the target.
    RemoteAccessError,
    /// The target could not take the message (larger than a receive buffer).
    RemoteInvalidRequest,
    /// The receive side: a message larger than the receive buffer.
    LocalLengthError,
    /// No receive buffer was posted at the target.
    RnrRetryExceeded,
    /// The peer is unreachable (link cut, node crashed).
    RetryExceeded,
    /// The queue pair was in the error state; the request was not executed.
    WrFlushError,
}

/// What a completion reports the completion of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    Write,
    Read,
    CompareSwap,
    FetchAdd,
    Flush,
    AtomicWrite,
    /// A message landed in a receive buffer.
    Recv,
    /// A WRITE-with-immediate's immediate arrived.
    RecvWriteImm,
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// The local queue pair this completion belongs to.
    pub qpn: QpNum,
    /// Receive completions: bytes landed.
    pub byte_len: u32,
    /// Receive completions: offset of the message within the receive buffer
    /// (multi-packet receive queues land many messages per buffer).
    pub offset: u64,
    pub imm: Option<u32>,
    /// Receive completions: the sending queue pair.
    pub src: Option<QpAddr>,
}

impl Completion {
    /// A placeholder to fill poll buffers with; its status is an error so that an
    /// unfilled slot is never mistaken for a success.
    pub const BLANK: Completion = Completion {
        wr_id: 0,
        status: WcStatus::WrFlushError,
        opcode: WcOpcode::Send,
        qpn: QpNum(0),
        byte_len: 0,
        offset: 0,
        imm: None,
        src: None,
    };
}

/// The kind of a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqKind {
    /// At most `capacity` unpolled entries; one more is an overflow, which is an
    /// error (the CQ and the queue pair that overflowed it enter the error state).
    Bounded { capacity: usize },
    /// A ring of `capacity` entries the NIC overwrites round-robin; nobody has to
    /// poll it (seed 000 §3.2, after eRPC). A poll returns what is still there.
    Ring { capacity: usize },
}

/// Configuration of a shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqConfig {
    /// Bound on posted, unconsumed receive buffers.
    pub buffers_max: usize,
    /// `Some(stride)`: a multi-packet receive queue. Each buffer takes many
    /// messages, each landed at the next `stride_bytes`-aligned offset; when a
    /// message does not fit in the rest of the buffer the next buffer is taken.
    /// `None`: one message per buffer.
    pub stride_bytes: Option<usize>,
}

impl SrqConfig {
    /// The stride Rowan uses: 64 B, the PCIe data word (seed 000 §3.2).
    pub const ROWAN_STRIDE_BYTES: usize = 64;

    pub fn multi_packet(buffers_max: usize) -> Self {
        SrqConfig {
            buffers_max,
            stride_bytes: Some(Self::ROWAN_STRIDE_BYTES),
        }
    }

    pub fn single(buffers_max: usize) -> Self {
        SrqConfig {
            buffers_max,
            stride_bytes: None,
        }
    }
}

/// Queue pair state, after RC's state machine narrowed to what can be observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created, not connected.
    Init,
    /// Connected and able to send.
    Ready,
    /// An error completion moved it here; posted requests flush until `reset`.
    Error,
}

/// Errors returned by verbs calls themselves (as opposed to error completions).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FabricError {
    #[error("send queue full: {outstanding} work requests outstanding (bound {depth}); poll completions first")]
    SendQueueFull { outstanding: usize, depth: usize },
    #[error("receive queue full: {posted} buffers posted (bound {buffers_max})")]
    RecvQueueFull { posted: usize, buffers_max: usize },
    #[error("completion queue overflowed: more than {capacity} unpolled completions")]
    CqOverflow { capacity: usize },
    #[error("node {0} is down")]
    NodeDown(NodeId),
    #[error("node {0} is unknown to the fabric")]
    UnknownNode(NodeId),
    #[error("queue pair {0:?} does not exist")]
    UnknownQp(QpAddr),
    #[error("queue pair is not connected")]
    NotConnected,
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// A fabric: the network that connects nodes.
pub trait Fabric: Send + Sync + 'static {
    type Nic: Nic;
    /// Attach `node` to the fabric and return its NIC. Attaching a node that crashed
    /// gives it a fresh NIC (its old regions and queue pairs are gone).
    fn attach(&self, node: NodeId) -> Result<Self::Nic, FabricError>;
}

/// Faults for tests and the simulator. Each takes effect for operations executed
/// after it returns.
pub trait FaultInjector {
    /// Cut the link between `a` and `b` in both directions.
    fn cut_link(&self, a: NodeId, b: NodeId);
    /// Heal the link. Queue pairs that went to the error state stay there until reset.
    fn heal_link(&self, a: NodeId, b: NodeId);
    /// Add one-way delay to every operation between `a` and `b` (0 removes it).
    fn set_delay_ns(&self, a: NodeId, b: NodeId, delay_ns: u64);
    /// Crash `node`: its peers' operations fail, its memory leaves the fabric.
    fn crash_node(&self, node: NodeId);
    /// Crash `node` by power failure: as `crash_node`, and every memory it had
    /// registered is handed to its crash model with `policy`.
    fn power_fail(&self, node: NodeId, policy: PowerFailure);
}

/// A node's NIC.
pub trait Nic: Send + Sync + Clone + 'static {
    type Cq: CompletionQueue;
    type Srq: SharedReceiveQueue;
    type Qp: QueuePair;

    fn node(&self) -> NodeId;
    /// Register `[offset, offset + len_bytes)` of `memory` with `access` rights.
    fn register(
        &self,
        memory: Arc<dyn RegionMemory>,
        offset: usize,
        len_bytes: usize,
        access: Access,
    ) -> Result<MemoryRegion, FabricError>;
    /// Deregister a region: later remote accesses with its key fail.
    fn deregister(&self, rkey: Rkey) -> Result<(), FabricError>;
    fn create_cq(&self, kind: CqKind) -> Result<Self::Cq, FabricError>;
    fn create_srq(&self, config: SrqConfig) -> Result<Self::Srq, FabricError>;
    /// A reliable connected queue pair. `send_depth` bounds outstanding work
    /// requests; an SRQ is needed to receive messages.
    fn create_qp(
        &self,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        srq: Option<&Self::Srq>,
        send_depth: usize,
    ) -> Result<Self::Qp, FabricError>;
}

/// A reliable connected queue pair.
pub trait QueuePair: Send + Sync + 'static {
    fn addr(&self) -> QpAddr;
    fn state(&self) -> QpState;
    /// The remote queue pair this one is connected to.
    fn peer(&self) -> Option<QpAddr>;
    /// Connect to a remote queue pair; both ends must connect to each other.
    fn connect(&self, remote: QpAddr) -> Result<(), FabricError>;
    /// Post work requests in order. Requests of one queue pair are executed in
    /// posting order. Fails without posting anything past the send-queue bound.
    fn post_send(&self, wrs: &[WorkRequest<'_>]) -> Result<(), FabricError>;
    /// From the error state back to ready with the same peer (RESET→RTS).
    fn reset(&self) -> Result<(), FabricError>;
    /// Tear the connection down for good (destroying the queue pair): requests
    /// queued here are flushed, and the peer's requests on this connection fail
    /// from now on, including those it posted earlier that a delay still holds.
    fn close(&self);
    /// Work requests posted whose send-queue slots are not yet retired.
    fn outstanding(&self) -> usize;
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync + 'static {
    /// Move up to `out.len()` completions into `out`; returns how many.
    fn poll(&self, out: &mut [Completion]) -> Result<usize, FabricError>;
    /// Ring CQs: completions overwritten before they could be polled, in total.
    fn overwritten(&self) -> u64;
}

/// A shared receive queue.
pub trait SharedReceiveQueue: Send + Sync + 'static {
    /// Post receive buffers; they are consumed strictly in posting order.
    fn post_recv(&self, buffers: &[RecvBuffer]) -> Result<(), FabricError>;
    /// Buffers posted and not yet fully consumed.
    fn posted(&self) -> usize;
}

/// A shared queue pair is a queue pair (the sender side of Rowan and the stream
/// drivers hold them in `Arc`s).
impl<Q: QueuePair> QueuePair for Arc<Q> {
    fn addr(&self) -> QpAddr {
        (**self).addr()
    }
    fn state(&self) -> QpState {
        (**self).state()
    }
    fn connect(&self, remote: QpAddr) -> Result<(), FabricError> {
        (**self).connect(remote)
    }
    fn post_send(&self, wrs: &[WorkRequest<'_>]) -> Result<(), FabricError> {
        (**self).post_send(wrs)
    }
    fn reset(&self) -> Result<(), FabricError> {
        (**self).reset()
    }
    fn peer(&self) -> Option<QpAddr> {
        (**self).peer()
    }
    fn close(&self) {
        (**self).close()
    }
    fn outstanding(&self) -> usize {
        (**self).outstanding()
    }
}
