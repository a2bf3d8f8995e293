//! `rowankv-classic-rpc`: the seven classic RDMA RPC designs that seed 002 (§3,
//! Figure 2, §5.1) compares its durable RPCs with — DaRPC, FaRM, FaSST, L5, RFP,
//! Octopus and ScaleRPC — each with its message pattern on RowanKV's fabric and each
//! durable at the receiver as the paper says it is: the receiver's CPU persists the
//! request before it answers. `docs/classic-rpc.md` draws every pattern.
//!
//! # What this crate owns
//! - [`Design`]: the seven designs and their names (`darpc`, `farm`, `fasst`, `l5`,
//!   `rfp`, `octopus`, `scalerpc`).
//! - The receiver ([`Server`]): one event-driven state machine ([`Server::poll`])
//!   serving every connection, run by a thread of its own ([`Server::spawn`]) or
//!   stepped by a test; a pluggable [`Handler`] and an optional processing delay
//!   per request (the paper's heavy load: [`HEAVY_LOAD_PROCESSING_NS`]).
//! - The sender ([`Client`]): `post`/`poll` with an in-flight window, and `call`.
//! - The counters a benchmark reports beside any timing, which do not depend on
//!   timing ([`ClientStats`], [`ServerStats`], [`Totals`]).
//! - The byte layout of the messages and of both ends' memory ([`layout`]).
//!
//! # The uniform API (what a benchmark drives, and what the durable RPCs of
//! `rowankv-drpc` will be adapted to)
//! ```text
//! let memory = Arc::new(DramMemory::new(Layout::new(&config).server_bytes()));  // or a Pool
//! let mut server = Server::new(design, server_nic, memory, config, handler)?;
//! let mut client = server.connect(&client_nic)?;        // once per client, before spawn
//! let running = server.spawn()?;                        // the receiver's thread
//! let reply = client.call(b"request")?;                 // or client.post(..) / client.poll()
//! let server = running.stop()?;                         // the state machine back
//! let totals = Totals::of(&[client.stats()], &server.stats());
//! ```
//!
//! # What it must never depend on
//! Only the fabric's interface (`Fabric`, `Nic`, `QueuePair`, `CompletionQueue`,
//! `SharedReceiveQueue`), never a backend: the same code runs on `LoopbackFabric`
//! (with or without its wire model) and on `TcpFabric`. The receiver's memory is any
//! `RegionMemory`: a `rowankv_pmem::Pool` for durability, `DramMemory` otherwise.
//! Nothing above the fabric (no engine, replication, server).
//!
//! # Invariants
//! - A reply (and so a successful `call`) is produced only after the receiver's CPU
//!   persisted the whole request (header and payload) in the receiver's memory,
//!   unless [`ServerConfig::persist_requests`] is off (a control for tests and for
//!   measuring what durability costs).
//! - The receiver serves each connection's requests in sequence order, one at a
//!   time; a client has at most [`ServerConfig::inflight_max`] requests outstanding,
//!   which is the number of slots its rings hold, so no slot is reused before the
//!   request it held was answered.
//! - Every message carries a 32 B header with a CRC-32C over header and payload, and
//!   a reader polling memory takes a message only when its sequence number and
//!   checksum match: a WRITE that is still landing is never taken for a whole one.
//! - FaSST's messages (header included) are at most [`UD_MTU_BYTES`]; larger ones
//!   are refused with [`RpcError::TooLarge`] before anything is sent.

#![forbid(unsafe_code)]

mod client;
pub mod layout;
mod server;

use std::sync::Arc;

use rowankv_fabric::{FabricError, WcOpcode, WcStatus};

pub use client::{Client, Reply};
pub use layout::{Layout, HEADER_BYTES};
pub use server::{RunningServer, Server};

/// The receiver's processing time per request in the paper's heavy-load runs (seed
/// 002 §5.2: "an additional latency of 100 us for data processing, like DaRPC").
pub const HEAVY_LOAD_PROCESSING_NS: u64 = 100_000;

/// The MTU of an unreliable-datagram queue pair (FaSST's transport): one message
/// per request, header included, at most this many bytes (seed 002 §5.1).
pub const UD_MTU_BYTES: usize = 4096;

/// ScaleRPC: process-phase calls after each warm-up call (seed 002 §5.1: "we
/// interleave one warm-up phase with 100 process phases").
pub const SCALERPC_PROCESS_PER_WARMUP: u64 = 100;

/// RFP: bytes the client's first READ of a result fetches (header included). A
/// longer result takes a second READ for the rest, as RFP's fixed fetch size does.
pub const RFP_FETCH_BYTES: usize = 1024;

/// Bounds on a configuration (named limits: a typo must not allocate a terabyte).
pub const CLIENTS_MAX_LIMIT: usize = 1024;
pub const INFLIGHT_MAX_LIMIT: usize = 64;
pub const MESSAGE_BYTES_MAX_LIMIT: usize = 16 << 20;

const _: () = assert!(HEADER_BYTES < UD_MTU_BYTES && HEADER_BYTES < RFP_FETCH_BYTES);
const _: () = assert!(MESSAGE_BYTES_MAX_LIMIT <= u32::MAX as usize);

/// The receiver's request handler: the request's payload in, the reply out. It runs
/// on the receiver's thread, after the request was persisted.
pub type Handler = Arc<dyn Fn(&[u8]) -> Vec<u8> + Send + Sync>;

/// The seven classic designs (seed 002 Figure 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Design {
    /// SEND the request, SEND the reply (Figure 2(a)).
    DaRpc,
    /// WRITE into a ring at the receiver, which polls memory; WRITE the reply into
    /// the sender's ring, which polls (Figure 2(b)).
    Farm,
    /// SEND over an unreliable-datagram-like path: one message of at most the MTU
    /// each way (Figure 2(d)). Emulated on RC: see `docs/classic-rpc.md`.
    Fasst,
    /// Two WRITEs, the data then its flag; the reply by WRITE (Figure 2(e)).
    L5,
    /// WRITE the request; the receiver leaves the result in its own memory, and
    /// the sender READs it (remote fetch, Figure 2(f)).
    Rfp,
    /// WRITE with immediate each way: the data lands and a receive completion
    /// notifies the CPU (Figure 2(h)).
    Octopus,
    /// Clients in groups served a group at a time; a warm-up call (WRITE of the
    /// request's address, the receiver READs the data, WRITE of the reply) before
    /// each run of 100 process calls, which are FaRM's pattern (Figure 2(g)).
    ScaleRpc,
}

/// The primitive a design moves requests with: the paper compares durable RPCs
/// within a family (§5.1: SFlush/S-RFlush with SEND designs, WFlush/W-RFlush with
/// WRITE designs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VerbFamily {
    Send,
    Write,
}

impl Design {
    pub const ALL: [Design; 7] = [
        Design::DaRpc,
        Design::Farm,
        Design::Fasst,
        Design::L5,
        Design::Rfp,
        Design::Octopus,
        Design::ScaleRpc,
    ];

    /// The name used in benchmarks, JSON and docs.
    pub fn name(self) -> &'static str {
        match self {
            Design::DaRpc => "darpc",
            Design::Farm => "farm",
            Design::Fasst => "fasst",
            Design::L5 => "l5",
            Design::Rfp => "rfp",
            Design::Octopus => "octopus",
            Design::ScaleRpc => "scalerpc",
        }
    }

    /// The design of a name given by [`Design::name`].
    pub fn from_name(name: &str) -> Option<Design> {
        Design::ALL.into_iter().find(|d| d.name() == name)
    }

    pub fn family(self) -> VerbFamily {
        match self {
            Design::DaRpc | Design::Fasst => VerbFamily::Send,
            _ => VerbFamily::Write,
        }
    }

    /// The largest request payload the design can carry under `config`.
    pub fn request_bytes_limit(self, config: &ServerConfig) -> usize {
        match self {
            Design::Fasst => config.request_bytes_max.min(UD_MTU_BYTES - HEADER_BYTES),
            _ => config.request_bytes_max,
        }
    }

    /// The largest reply payload the design can carry under `config`.
    pub fn reply_bytes_limit(self, config: &ServerConfig) -> usize {
        match self {
            Design::Fasst => config.reply_bytes_max.min(UD_MTU_BYTES - HEADER_BYTES),
            _ => config.reply_bytes_max,
        }
    }
}

impl std::fmt::Display for Design {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bounds and behaviour of one server and its connections (both ends use it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Connections the server accepts.
    pub clients_max: usize,
    /// Requests a client may have outstanding; also the slots of each ring.
    pub inflight_max: usize,
    /// Largest request payload (FaSST: further limited by the MTU).
    pub request_bytes_max: usize,
    /// Largest reply payload; a handler's longer reply is answered with
    /// [`RpcError::ReplyTooLarge`].
    pub reply_bytes_max: usize,
    /// The receiver's CPU time per request after the handler (busy, measured on the
    /// server's clock): 0 is the paper's light load, [`HEAVY_LOAD_PROCESSING_NS`]
    /// its heavy load. Needs a clock that moves by itself.
    pub processing_delay_ns: u64,
    /// Persist each request before answering (the durability every design has in
    /// the paper). Off only to measure what it costs, or to show a test can tell.
    pub persist_requests: bool,
    /// ScaleRPC: clients per group.
    pub scalerpc_group_size: usize,
    /// ScaleRPC: requests a group is served in one time slice before the next
    /// group's turn (a group with nothing to do yields its slice at once).
    pub scalerpc_slice_requests_max: usize,
    /// How long `Client::call` waits for its reply (on the client's clock).
    pub reply_timeout_ns: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            clients_max: 4,
            inflight_max: 4,
            request_bytes_max: 64 << 10,
            reply_bytes_max: 64 << 10,
            processing_delay_ns: 0,
            persist_requests: true,
            scalerpc_group_size: 2,
            scalerpc_slice_requests_max: 2 * (1 + SCALERPC_PROCESS_PER_WARMUP as usize),
            reply_timeout_ns: 10_000_000_000,
        }
    }
}

impl ServerConfig {
    pub fn validate(&self) -> Result<(), RpcError> {
        let bad = |what: &str| Err(RpcError::Config(what.to_string()));
        if self.clients_max == 0 || self.clients_max > CLIENTS_MAX_LIMIT {
            return bad("clients_max must be in 1..=CLIENTS_MAX_LIMIT");
        }
        if self.inflight_max == 0 || self.inflight_max > INFLIGHT_MAX_LIMIT {
            return bad("inflight_max must be in 1..=INFLIGHT_MAX_LIMIT");
        }
        if self.request_bytes_max == 0 || self.request_bytes_max > MESSAGE_BYTES_MAX_LIMIT {
            return bad("request_bytes_max must be in 1..=MESSAGE_BYTES_MAX_LIMIT");
        }
        if self.reply_bytes_max > MESSAGE_BYTES_MAX_LIMIT {
            return bad("reply_bytes_max must be at most MESSAGE_BYTES_MAX_LIMIT");
        }
        if self.scalerpc_group_size == 0 || self.scalerpc_slice_requests_max == 0 {
            return bad("ScaleRPC's group size and slice must be at least 1");
        }
        if self.reply_timeout_ns == 0 {
            return bad("reply_timeout_ns must be positive");
        }
        Ok(())
    }
}

/// Errors of the RPC layer: what the caller can match on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RpcError {
    #[error("{design} carries at most {limit_bytes} B per request, got {bytes} B{}", mtu_note(.design))]
    TooLarge {
        design: Design,
        bytes: usize,
        limit_bytes: usize,
    },
    #[error("the handler's reply of {bytes} B exceeds the {limit_bytes} B a reply may carry")]
    ReplyTooLarge { bytes: u64, limit_bytes: usize },
    #[error("{inflight_max} requests are outstanding already; poll for replies first")]
    WindowFull { inflight_max: usize },
    #[error("call() needs no other request outstanding ({outstanding} are)")]
    Outstanding { outstanding: usize },
    #[error("no reply within {timeout_ns} ns")]
    Timeout { timeout_ns: u64 },
    #[error("a work request failed: {opcode:?} completed with {status:?}")]
    Completion { opcode: WcOpcode, status: WcStatus },
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("the server accepts at most {clients_max} clients")]
    ServerFull { clients_max: usize },
    #[error("the server's memory has {got} B, its layout needs {need} B")]
    MemoryTooSmall { need: usize, got: usize },
    #[error("the server thread panicked")]
    ServerPanicked,
}

/// A completion that did not succeed, as the error both ends report.
pub(crate) fn succeeded(wc: &rowankv_fabric::Completion) -> Result<(), RpcError> {
    if wc.status != WcStatus::Success {
        return Err(RpcError::Completion {
            opcode: wc.opcode,
            status: wc.status,
        });
    }
    Ok(())
}

fn mtu_note(design: &Design) -> &'static str {
    if *design == Design::Fasst {
        " (one unreliable-datagram message of at most the 4 KiB MTU, header included)"
    } else {
        ""
    }
}

/// Work requests posted, by kind. A READ is two network messages (request and
/// data), the others one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerbCounts {
    pub send: u64,
    pub write: u64,
    pub write_imm: u64,
    pub read: u64,
}

impl VerbCounts {
    pub fn total(&self) -> u64 {
        self.send + self.write + self.write_imm + self.read
    }

    /// One-way network messages these verbs make (transport ACKs not counted).
    pub fn messages(&self) -> u64 {
        self.send + self.write + self.write_imm + 2 * self.read
    }

    fn add(&mut self, other: &VerbCounts) {
        self.send += other.send;
        self.write += other.write;
        self.write_imm += other.write_imm;
        self.read += other.read;
    }
}

/// A client's counters. None depends on timing: what a timing-dependent retry does
/// (RFP's READ of a result not there yet) is counted apart, in `empty_fetches`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Replies received (error replies included).
    pub calls: u64,
    /// ScaleRPC: calls made in the warm-up pattern.
    pub warmup_calls: u64,
    /// Network round trips on the calls' critical paths: a request and its reply
    /// make one; RFP's request WRITE and result READ two (three with a second READ);
    /// ScaleRPC's warm-up two (the receiver's READ of the data is one).
    pub round_trips: u64,
    /// Verbs the client posted (RFP: READs that found the result).
    pub verbs: VerbCounts,
    /// Payload and header bytes the client moved to the server (SEND, WRITE).
    pub bytes_to_server: u64,
    /// Bytes the client READ from the server (RFP).
    pub bytes_to_client: u64,
    /// RFP: READs that found no result yet (depends on timing).
    pub empty_fetches: u64,
    pub empty_fetch_bytes: u64,
    /// Requests refused before sending (too large).
    pub refused: u64,
}

impl ClientStats {
    pub fn add(&mut self, other: &ClientStats) {
        self.calls += other.calls;
        self.warmup_calls += other.warmup_calls;
        self.round_trips += other.round_trips;
        self.verbs.add(&other.verbs);
        self.bytes_to_server += other.bytes_to_server;
        self.bytes_to_client += other.bytes_to_client;
        self.empty_fetches += other.empty_fetches;
        self.empty_fetch_bytes += other.empty_fetch_bytes;
        self.refused += other.refused;
    }
}

/// The receiver's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests the receiver's CPU took up (parsed, persisted, handled, answered).
    pub requests: u64,
    /// Persist operations the receiver's CPU issued, and the bytes they covered.
    pub persists: u64,
    pub bytes_persisted: u64,
    /// Bytes the receiver's CPU copied out of a receive buffer (DaRPC, FaSST).
    pub bytes_copied: u64,
    /// Verbs the server posted.
    pub verbs: VerbCounts,
    /// Bytes the server READ from clients (ScaleRPC's warm-up).
    pub bytes_to_server: u64,
    /// Bytes the server sent or wrote to clients.
    pub bytes_to_client: u64,
    /// Receive buffers re-posted.
    pub recvs_posted: u64,
    /// Messages refused as malformed (bad length, checksum, unknown sender).
    pub malformed: u64,
    /// Replies refused as too large (answered with an error).
    pub replies_too_large: u64,
    /// ScaleRPC: warm-up requests served, and switches between client groups.
    pub warmups: u64,
    pub group_switches: u64,
    /// Processing delay spent, in total (on the server's clock).
    pub processing_ns: u64,
}

/// Counts of a run, clients and server together, in the terms a benchmark reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub calls: u64,
    pub round_trips: u64,
    /// One-way network messages, both directions (transport ACKs and RFP's empty
    /// fetches not counted).
    pub messages: u64,
    pub client_verbs: VerbCounts,
    pub server_verbs: VerbCounts,
    pub bytes_to_server: u64,
    pub bytes_to_client: u64,
    /// Requests the receiver's CPU took up, and its persists.
    pub receiver_requests: u64,
    pub receiver_persists: u64,
    /// RFP's empty fetches (timing-dependent; reported apart).
    pub empty_fetches: u64,
}

/// [`Totals`] divided by the calls.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerCall {
    pub round_trips: f64,
    pub messages: f64,
    pub verbs: f64,
    pub bytes_to_server: f64,
    pub bytes_to_client: f64,
    pub receiver_requests: f64,
    pub receiver_persists: f64,
    pub empty_fetches: f64,
}

impl Totals {
    pub fn of(clients: &[ClientStats], server: &ServerStats) -> Totals {
        let mut c = ClientStats::default();
        for s in clients {
            c.add(s);
        }
        Totals {
            calls: c.calls,
            round_trips: c.round_trips,
            messages: c.verbs.messages() + server.verbs.messages(),
            client_verbs: c.verbs,
            server_verbs: server.verbs,
            bytes_to_server: c.bytes_to_server + server.bytes_to_server,
            bytes_to_client: c.bytes_to_client + server.bytes_to_client,
            receiver_requests: server.requests,
            receiver_persists: server.persists,
            empty_fetches: c.empty_fetches,
        }
    }

    pub fn per_call(&self) -> PerCall {
        let n = self.calls.max(1) as f64;
        PerCall {
            round_trips: self.round_trips as f64 / n,
            messages: self.messages as f64 / n,
            verbs: (self.client_verbs.total() + self.server_verbs.total()) as f64 / n,
            bytes_to_server: self.bytes_to_server as f64 / n,
            bytes_to_client: self.bytes_to_client as f64 / n,
            receiver_requests: self.receiver_requests as f64 / n,
            receiver_persists: self.receiver_persists as f64 / n,
            empty_fetches: self.empty_fetches as f64 / n,
        }
    }
}

/// Spins of an idle polling loop before it yields its core: the machines this runs
/// on have 2 cores for clients, server and the fabric's engine together.
pub(crate) const IDLE_SPINS_BEFORE_YIELD: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_the_benchmarks() {
        let names: Vec<&str> = Design::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(
            names,
            ["darpc", "farm", "fasst", "l5", "rfp", "octopus", "scalerpc"]
        );
        for d in Design::ALL {
            assert_eq!(Design::from_name(d.name()), Some(d));
        }
        assert_eq!(Design::from_name("sflush"), None);
    }

    #[test]
    fn fasst_is_limited_by_the_mtu_and_the_others_by_the_config() {
        let c = ServerConfig::default();
        assert_eq!(
            Design::Fasst.request_bytes_limit(&c),
            UD_MTU_BYTES - HEADER_BYTES
        );
        assert_eq!(Design::Farm.request_bytes_limit(&c), 64 << 10);
        assert_eq!(Design::DaRpc.family(), VerbFamily::Send);
        assert_eq!(Design::Octopus.family(), VerbFamily::Write);
    }

    #[test]
    fn config_bounds_are_checked() {
        assert!(ServerConfig::default().validate().is_ok());
        let zero = ServerConfig {
            inflight_max: 0,
            ..ServerConfig::default()
        };
        assert!(matches!(zero.validate(), Err(RpcError::Config(_))));
        let huge = ServerConfig {
            request_bytes_max: MESSAGE_BYTES_MAX_LIMIT + 1,
            ..ServerConfig::default()
        };
        assert!(huge.validate().is_err());
    }

    #[test]
    fn totals_count_a_read_as_two_messages() {
        let client = ClientStats {
            calls: 2,
            round_trips: 4,
            verbs: VerbCounts {
                write: 2,
                read: 2,
                ..VerbCounts::default()
            },
            ..ClientStats::default()
        };
        let t = Totals::of(&[client], &ServerStats::default());
        assert_eq!(t.messages, 6);
        assert_eq!(t.per_call().round_trips, 2.0);
        assert_eq!(t.per_call().messages, 3.0);
    }
}
