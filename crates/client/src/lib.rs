//! The RowanKV client: routes each operation by its key's routing hash to the
//! primary of the key's shard, caches the configuration, refreshes it when a
//! server refuses a request for its term or its shard, and offers synchronous
//! calls and pipelined asynchronous ones with a bound on operations in flight.
//!
//! A client connects to one worker of every server (worker `client_index` modulo
//! the server's worker count, §5.2), through the cluster's [`Directory`]. A
//! connection that fails, is reset and fails again before any answer is given up
//! (the server may have restarted) and dialled anew without blocking: the dial
//! is answered while the client polls, and the operations wait meanwhile.
//!
//! Besides GET, PUT and DEL: conditional writes ([`Client::put_if`],
//! [`Client::delete_if`]: executed only if the key's live version is the one
//! expected) and pages of a shard's keys ([`Client::scan`]).
//!
//! A GET that the target of its shard's migration does not hold yet is
//! answered `AskSource` (seed 000 §4.6) and sent at once to the migration's
//! source as `GetMigrating`, which answers from the index it still holds.
//!
//! Retries: an operation refused with `StaleTerm`, `NotPrimary`, `Busy`,
//! `Blocked` or `NotMember` changed nothing at the server, so it is sent again
//! after refreshing the configuration: at once for a term or routing refusal (up
//! to `retries_max` times), after a growing pause for a server that is blocked or
//! busy (during a failover, until the operation's deadline).
//!
//! Exactly-once writes (RIFL-style): every PUT and DEL carries a request record —
//! this client's id, the operation's sequence number and the lowest sequence
//! number whose outcome the client does not know yet. The server keeps the record
//! in the write's log entry (so it survives failover with the write) and answers
//! a request it already executed with that execution's version instead of
//! executing it again. So a write whose outcome is unknown — no answer within
//! `attempt_timeout`, an `Internal` error, a connection that failed with it
//! outstanding — is sent again, with the same record, until the operation's
//! deadline. Only then is it reported of unknown outcome ([`ClientError::is_unknown`],
//! [`Completed::request`]): the application may send it again later, through
//! this client or another one on a new connection, with [`Client::resubmit`]
//! and the same request id, and it is still executed at most once. The client
//! keeps the sequence numbers of such unresolved writes out of its floor (at most
//! `UNRESOLVED_MAX`, the oldest given up first) so the servers keep their
//! outcomes; see `docs/cluster.md` for the servers' table and its window.
//!
//! Time is read from the configured [`Clock`], so a simulation drives timeouts.
#![forbid(unsafe_code)]

pub mod cm_source;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::Receiver;
use rowankv_fabric::Nic;
use rowankv_rpc::directory::{Accepted, ConnectError, Directory};
use rowankv_rpc::endpoint::{Endpoint, EndpointConfig, Event, PeerId, SendError};
use rowankv_types::{Clock, NodeId, RequestId, RequestRecord, ShardId, SystemClock, Term};
use rowankv_wire::config::{Config, ConfigSource};
pub use rowankv_wire::frame::Expect;
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Response, KEY_BYTES_MAX, KV_BYTES_MAX};

/// Settings of a client.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// An operation not answered within this is reported as timed out.
    pub timeout: Duration,
    /// Operations in flight (submitted, not completed).
    pub inflight_max: usize,
    /// Resends of an operation refused without effect.
    pub retries_max: u32,
    pub connect_timeout: Duration,
    /// Which worker of each server to connect to (modulo its worker count).
    pub worker_hint: usize,
    pub endpoint: EndpointConfig,
    /// First pause before resending to a blocked or busy server (doubling, at
    /// most 32 times this).
    pub backoff: Duration,
    pub clock: Arc<dyn Clock>,
    /// An attempt not answered within this is sent again (same request record:
    /// a write is executed at most once); the operation gives up at `timeout`.
    pub attempt_timeout: Duration,
    /// This client's id in request records; `None`: a random one. Two clients
    /// must never share an id while both submit operations.
    pub client_id: Option<u64>,
    /// Send again, until the deadline, an operation whose attempt went
    /// unanswered for `attempt_timeout`, failed with `Internal` or lost its
    /// connection (writes carry their request records, so they run at most
    /// once). Off: such an operation is reported at once, of unknown outcome
    /// (for callers that watch the servers' own answers, as tests do).
    pub retry_unknown: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: Duration::from_secs(2),
            inflight_max: 32,
            retries_max: 16,
            connect_timeout: Duration::from_secs(5),
            worker_hint: 0,
            endpoint: EndpointConfig::default(),
            backoff: Duration::from_micros(250),
            clock: SystemClock::new(),
            attempt_timeout: Duration::from_millis(500),
            client_id: None,
            retry_unknown: true,
        }
    }
}

/// Errors a client reports.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ClientError {
    #[error("key not found")]
    NotFound,
    #[error("no answer within {0:?}: the outcome is unknown")]
    Timeout(Duration),
    #[error("the cluster's term moved past {ours} and the configuration could not catch up (server at {server})")]
    StaleTerm { ours: Term, server: Term },
    #[error("{what} of {len} B, at most {max} B")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{0} operations in flight, the client's bound")]
    Busy(usize),
    #[error("server refused: {code}: {detail}")]
    Server { code: ErrorCode, detail: String },
    #[error("connecting: {0}")]
    Connect(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("the connection to {0} failed with the operation outstanding: the outcome is unknown")]
    ConnectionLost(NodeId),
    #[error("an earlier attempt may have been applied, and the last one ended with: {0}")]
    Unknown(String),
}

impl ClientError {
    /// Whether a write that ended with this error may still have been applied.
    pub fn is_unknown(&self) -> bool {
        matches!(
            self,
            ClientError::Timeout(_)
                | ClientError::ConnectionLost(_)
                | ClientError::Unknown(_)
                | ClientError::Server {
                    code: ErrorCode::Internal | ErrorCode::Duplicate,
                    ..
                }
        )
    }
}

/// An operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Get {
        key: Vec<u8>,
    },
    /// Write `value` under `key`; from `expires_at_ms` on (Unix time in
    /// milliseconds, on the primary's clock), if given, the key reads as absent.
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        expires_at_ms: Option<u64>,
    },
    Del {
        key: Vec<u8>,
    },
    /// A PUT executed only if `expect` holds for the key, atomically (else
    /// `ErrorCode::ConditionFailed`, nothing written).
    PutIf {
        key: Vec<u8>,
        value: Vec<u8>,
        expect: Expect,
        expires_at_ms: Option<u64>,
    },
    /// A DEL executed only if `expect` holds for the key.
    DelIf {
        key: Vec<u8>,
        expect: Expect,
    },
    /// A page of the keys of `shard` from `cursor` (`Output::Keys`), asked of
    /// its primary.
    Scan {
        shard: ShardId,
        cursor: u64,
        count: u32,
    },
}

impl Op {
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Get { key }
            | Op::Put { key, .. }
            | Op::Del { key }
            | Op::PutIf { key, .. }
            | Op::DelIf { key, .. } => key,
            Op::Scan { .. } => &[],
        }
    }

    /// Whether it writes (and carries a request record).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Op::Put { .. } | Op::Del { .. } | Op::PutIf { .. } | Op::DelIf { .. }
        )
    }
}

/// What a successful operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// A GET's value, its version and its expiry time (Unix ms).
    Value {
        value: Vec<u8>,
        version: u64,
        expires_at_ms: Option<u64>,
    },
    /// A PUT's or DEL's version.
    Written { version: u64 },
    /// A page of a SCAN: keys, and the cursor to ask from next (0: done).
    Keys { next: u64, keys: Vec<Vec<u8>> },
}

/// A value as [`Client::get_stored`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub value: Vec<u8>,
    pub version: u64,
    /// Unix time in milliseconds from which it reads as absent.
    pub expires_at_ms: Option<u64>,
}

/// Identifies a submitted operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// A completed operation.
#[derive(Clone, Debug)]
pub struct Completed {
    pub id: OpId,
    pub result: Result<Output, ClientError>,
    /// From submission to completion.
    pub latency: Duration,
    /// The term of the configuration the answering server held (0: no answer).
    pub term: Term,
    /// A write's request id: to send it again with [`Client::resubmit`] if its
    /// outcome is unknown.
    pub request: Option<RequestId>,
}

/// Unresolved writes (unknown outcome) whose sequence numbers a client keeps
/// Polls [`Client::execute`] makes, yielding the core between them, before it
/// sleeps between polls.
pub const EXECUTE_SPINS: u32 = 32;
/// [`Client::execute`]'s first sleep between polls; each next one doubles.
pub const EXECUTE_SLEEP_MIN: Duration = Duration::from_micros(20);
/// [`Client::execute`]'s longest sleep between polls: what it adds at most to
/// an operation's latency.
pub const EXECUTE_SLEEP_MAX: Duration = Duration::from_micros(200);

/// below its floor, at most.
pub const UNRESOLVED_MAX: usize = 1024;

struct Pending {
    id: OpId,
    op: Op,
    /// A write's request id (its record's floor is taken when it is sent).
    request: Option<RequestId>,
    /// When the current attempt was sent.
    sent_ns: u64,
    /// An earlier attempt of this write may have been applied (it went
    /// unanswered, or failed with an unknown outcome): a later refusal does not
    /// make the outcome certain.
    maybe_applied: bool,
    submitted_ns: u64,
    /// The operation times out here.
    deadline_ns: u64,
    /// Not resent before this (backing off from a blocked server).
    not_before_ns: u64,
    attempts: u32,
    /// Where the current attempt went.
    sent_to: Option<PeerId>,
    /// A GET the target of its shard's migration sent back (`AskSource`):
    /// the next attempt goes to the migration's source as `GetMigrating`.
    ask_source: bool,
}

/// A connection being made: the peer, the answer to come, when it started.
type Dial = (PeerId, Receiver<Result<Accepted, String>>, u64);

/// A client of one cluster.
pub struct Client<N: Nic> {
    config: ClientConfig,
    node: NodeId,
    source: Arc<dyn ConfigSource>,
    cluster: Arc<Config>,
    directory: Directory,
    ep: Endpoint<N>,
    servers: HashMap<NodeId, PeerId>,
    /// Servers whose connection failed and was reset, with no answer since: a
    /// second failure gives the connection up (see `connection_failed`).
    failed_once: std::collections::HashSet<NodeId>,
    /// Connections being made to servers (after the first ones), without
    /// blocking: the peer, the answer to come, when it started.
    dials: HashMap<NodeId, Dial>,
    next_id: u64,
    next_request: u64,
    /// This client's id in request records.
    client_id: u64,
    next_seq: u64,
    /// Sequence numbers of this client's writes whose outcome it does not know:
    /// in flight, or unresolved (reported unknown, not yet resolved).
    open_seqs: std::collections::BTreeSet<u64>,
    unresolved: VecDeque<u64>,
    /// By request id.
    pending: HashMap<u64, Pending>,
    /// Waiting for a credit or a retry.
    queued: VecDeque<Pending>,
    inflight: usize,
    events: Vec<Event>,
    data: Vec<u8>,
    done: Vec<Completed>,
}

impl<N: Nic> Client<N> {
    /// A client on `nic` with the configuration from `source`, connected to no
    /// server yet.
    fn unconnected(
        nic: N,
        directory: Directory,
        source: Arc<dyn ConfigSource>,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        let cluster = source
            .fetch()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let node = nic.node();
        let ep = Endpoint::new(nic, config.endpoint.clone())
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        let client_id = config.client_id.unwrap_or_else(random_client_id);
        if client_id == RequestId::NO_CLIENT {
            return Err(ClientError::Config("client id 0 is reserved".into()));
        }
        Ok(Client {
            client_id,
            next_seq: 1,
            open_seqs: Default::default(),
            unresolved: VecDeque::new(),
            config,
            node,
            source,
            cluster,
            directory,
            ep,
            servers: HashMap::new(),
            failed_once: Default::default(),
            dials: HashMap::new(),
            next_id: 1,
            next_request: 1,
            pending: HashMap::new(),
            queued: VecDeque::new(),
            inflight: 0,
            events: Vec::new(),
            data: Vec::new(),
            done: Vec::new(),
        })
    }

    /// A client on `nic`, fetching the configuration from `source`.
    pub fn connect(
        nic: N,
        directory: Directory,
        source: Arc<dyn ConfigSource>,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        let mut c = Self::unconnected(nic, directory, source, config)?;
        let members: Vec<NodeId> = c.cluster.members.iter().map(|m| m.node).collect();
        // A server that cannot be reached now (it failed, and the CM has not
        // removed it yet) is connected to when an operation is routed to it.
        let mut first_error = None;
        for m in members {
            if let Err(e) = c.connect_server(m) {
                tracing::warn!(server = %m, error = %e, "not connected at start");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) if c.servers.is_empty() => Err(e),
            _ => Ok(c),
        }
    }

    /// As [`Client::connect`], for a caller that runs the servers itself (the
    /// simulator, on one thread): `pump` is called while waiting for each
    /// server to accept, and must make the servers progress.
    pub fn connect_pumped(
        nic: N,
        directory: Directory,
        source: Arc<dyn ConfigSource>,
        config: ClientConfig,
        pump: &mut dyn FnMut(),
    ) -> Result<Self, ClientError> {
        let mut c = Self::unconnected(nic, directory, source, config)?;
        let members: Vec<(NodeId, u16)> = c
            .cluster
            .members
            .iter()
            .map(|m| {
                (
                    m.node,
                    (c.config.worker_hint % m.workers.max(1) as usize) as u16,
                )
            })
            .collect();
        for (node, worker) in members {
            let (peer, reply) = c
                .directory
                .connect_async(&mut c.ep, node, worker)
                .map_err(|e| ClientError::Connect(e.to_string()))?;
            let mut rounds = 0u32;
            let addr = loop {
                if let Ok(r) = reply.try_recv() {
                    break r.map_err(ClientError::Connect)?;
                }
                rounds += 1;
                if rounds > 1_000_000 {
                    return Err(ClientError::Connect(format!("{node} never accepted")));
                }
                pump();
            };
            c.ep.connect(peer, addr.qp)
                .map_err(|e| ClientError::Connect(e.to_string()))?;
            c.servers.insert(node, peer);
        }
        Ok(c)
    }

    /// The connection to `node`, or a dial started (answered in `poll`): an
    /// operation that finds none is sent again after a pause. Never blocks,
    /// so a caller that runs the servers itself (the simulator) can use it.
    fn reach_server(&mut self, node: NodeId) -> Result<PeerId, ClientError> {
        if let Some(&p) = self.servers.get(&node) {
            return Ok(p);
        }
        if self.dials.contains_key(&node) {
            return Err(ClientError::Connect(format!("connecting to {node}")));
        }
        let workers = self
            .cluster
            .member(node)
            .map_or(1, |m| m.workers.max(1) as usize);
        let worker = (self.config.worker_hint % workers) as u16;
        let (peer, answer) = self
            .directory
            .connect_async(&mut self.ep, node, worker)
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        let now = self.config.clock.now_ns();
        self.dials.insert(node, (peer, answer, now));
        Err(ClientError::Connect(format!("connecting to {node}")))
    }

    /// Finish the dials that were answered, drop those that failed or took
    /// longer than the connect timeout.
    fn poll_dials(&mut self) {
        if self.dials.is_empty() {
            return;
        }
        let now = self.config.clock.now_ns();
        let timeout = self.config.connect_timeout.as_nanos() as u64;
        let nodes: Vec<NodeId> = self.dials.keys().copied().collect();
        for node in nodes {
            let (peer, answer, started) = &self.dials[&node];
            let (peer, started) = (*peer, *started);
            let outcome = match answer.try_recv() {
                Ok(Ok(a)) => Some(self.ep.connect(peer, a.qp).map_err(|e| e.to_string())),
                Ok(Err(why)) => Some(Err(why)),
                Err(_) if now.saturating_sub(started) > timeout => {
                    Some(Err("no answer in time".to_string()))
                }
                Err(_) => None,
            };
            match outcome {
                None => {}
                Some(Ok(())) => {
                    self.dials.remove(&node);
                    tracing::debug!(server = %node, "connected again");
                    self.servers.insert(node, peer);
                }
                Some(Err(why)) => {
                    self.dials.remove(&node);
                    tracing::debug!(server = %node, why, "a connection was not made");
                    self.ep.close(peer);
                }
            }
        }
    }

    fn connect_server(&mut self, node: NodeId) -> Result<PeerId, ClientError> {
        if let Some(&p) = self.servers.get(&node) {
            return Ok(p);
        }
        let workers = self
            .cluster
            .member(node)
            .map_or(1, |m| m.workers.max(1) as usize);
        let worker = (self.config.worker_hint % workers) as u16;
        let peer = self
            .directory
            .connect(&mut self.ep, node, worker, self.config.connect_timeout)
            .map_err(|e: ConnectError| ClientError::Connect(e.to_string()))?;
        self.servers.insert(node, peer);
        Ok(peer)
    }

    /// The configuration the client routes by.
    pub fn cluster_config(&self) -> &Arc<Config> {
        &self.cluster
    }

    pub fn term(&self) -> Term {
        self.cluster.term
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Operations submitted and not yet completed.
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// Re-read the configuration from the CM; adopts it if newer.
    pub fn refresh(&mut self) -> Result<(), ClientError> {
        let c = self
            .source
            .fetch()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        if c.term > self.cluster.term {
            self.cluster = c;
        }
        Ok(())
    }

    fn check(op: &Op) -> Result<(), ClientError> {
        if let Op::Scan { .. } = op {
            return Ok(()); // no key
        }
        let key = op.key();
        if key.is_empty() {
            return Err(ClientError::TooLarge {
                what: "empty key",
                len: 0,
                max: KEY_BYTES_MAX,
            });
        }
        if key.len() > KEY_BYTES_MAX {
            return Err(ClientError::TooLarge {
                what: "key",
                len: key.len(),
                max: KEY_BYTES_MAX,
            });
        }
        if let Op::Put { key, value, .. } | Op::PutIf { key, value, .. } = op {
            if key.len() + value.len() > KV_BYTES_MAX {
                return Err(ClientError::TooLarge {
                    what: "key + value",
                    len: key.len() + value.len(),
                    max: KV_BYTES_MAX,
                });
            }
        }
        Ok(())
    }

    /// Start an operation; its outcome comes from [`Client::poll`].
    pub fn submit(&mut self, op: Op) -> Result<OpId, ClientError> {
        Self::check(&op)?;
        if self.inflight >= self.config.inflight_max {
            return Err(ClientError::Busy(self.inflight));
        }
        let request = op.is_write().then(|| {
            new_request_id(
                &mut self.client_id,
                &mut self.next_seq,
                &mut self.open_seqs,
                random_client_id,
            )
        });
        Ok(self.start(op, request))
    }

    /// Send again a write whose outcome was reported unknown, with its request
    /// id (from [`Completed::request`], of this client or of another one, on
    /// another connection): it is executed at most once over all its attempts.
    pub fn resubmit(&mut self, op: Op, request: RequestId) -> Result<OpId, ClientError> {
        Self::check(&op)?;
        if !op.is_write() || !request.is_valid() {
            return Err(ClientError::Config(format!(
                "resubmit takes a write and the request id it was sent with, not {request:?}"
            )));
        }
        if self.inflight >= self.config.inflight_max {
            return Err(ClientError::Busy(self.inflight));
        }
        Ok(self.start_as(op, Some(request), true))
    }

    /// This client's id in request records.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    fn start(&mut self, op: Op, request: Option<RequestId>) -> OpId {
        self.start_as(op, request, false)
    }

    /// `maybe_applied`: an earlier submission of this write may have been
    /// applied (a resubmit), so no refusal makes its outcome certain.
    fn start_as(&mut self, op: Op, request: Option<RequestId>, maybe_applied: bool) -> OpId {
        let id = OpId(self.next_id);
        self.next_id += 1;
        let now = self.config.clock.now_ns();
        self.inflight += 1;
        let p = Pending {
            id,
            op,
            request,
            sent_ns: now,
            maybe_applied,
            submitted_ns: now,
            deadline_ns: now + self.config.timeout.as_nanos() as u64,
            not_before_ns: 0,
            attempts: 0,
            sent_to: None,
            ask_source: false,
        };
        if self.queued.is_empty() {
            self.send(p);
        } else {
            self.queued.push_back(p);
        }
        id
    }

    /// The record a write is sent with now: its floor is the lowest sequence
    /// number of this client whose outcome it does not know (a write of another
    /// client's id, resubmitted here, raises no floor), in the form the log
    /// stores (a floor far below the seq is sent as none).
    fn record(&self, id: RequestId) -> RequestRecord {
        let first_incomplete = if id.client == self.client_id {
            self.open_seqs
                .first()
                .copied()
                .unwrap_or(id.seq)
                .min(id.seq)
        } else {
            0
        };
        RequestRecord {
            id,
            first_incomplete,
        }
        .as_logged()
    }

    /// Send one attempt, or queue it: for want of the server's credit (returns
    /// true), or to retry after a pause.
    fn send(&mut self, mut p: Pending) -> bool {
        let primary = match &p.op {
            Op::Scan { shard, .. } => match self.cluster.shard(*shard) {
                Some(s) => s.primary,
                None => {
                    let e =
                        ClientError::Config(format!("no {shard} in term {}", self.cluster.term));
                    self.complete(p, Err(e), Term(0));
                    return false;
                }
            },
            op => {
                let s = self.cluster.shard_for_key(op.key());
                // Sent back by a migration's target: to the source, while the
                // configuration still lists the migration.
                match self.cluster.migration(s.shard).filter(|_| p.ask_source) {
                    Some(m) => m.from,
                    None => {
                        p.ask_source = false;
                        s.primary
                    }
                }
            }
        };
        let peer = match self.reach_server(primary) {
            Ok(peer) => peer,
            // Not sent: certainly not applied. The primary may have failed;
            // until the operation's deadline, look for a newer configuration
            // and try again after a pause.
            Err(e) if self.config.clock.now_ns() >= p.deadline_ns => {
                self.complete(p, Err(e), Term(0));
                return false;
            }
            Err(e) => {
                tracing::debug!(server = %primary, error = %e, "not connected");
                self.retry_later(p);
                return false;
            }
        };
        let request_id = self.next_request;
        let env = Envelope {
            cluster_id: self.cluster.cluster_id,
            term: self.cluster.term,
            request_id,
            sender: self.node,
        };
        let request = p.request.map(|r| self.record(r));
        let body = match &p.op {
            Op::Get { key } if p.ask_source => Body::GetMigrating { key },
            Op::Get { key } => Body::Get { key },
            Op::Put {
                key,
                value,
                expires_at_ms,
            } => Body::Put {
                key,
                value,
                request,
                expires_at_ms: *expires_at_ms,
            },
            Op::Del { key } => Body::Del { key, request },
            Op::PutIf {
                key,
                value,
                expect,
                expires_at_ms,
            } => Body::PutIf {
                key,
                value,
                request,
                expires_at_ms: *expires_at_ms,
                expect: *expect,
            },
            Op::DelIf { key, expect } => Body::DelIf {
                key,
                request,
                expect: *expect,
            },
            Op::Scan {
                shard,
                cursor,
                count,
            } => Body::Scan {
                shard: *shard,
                cursor: *cursor,
                count: *count,
            },
        };
        match self.ep.request(peer, &env, &body) {
            Ok(()) => {
                self.next_request += 1;
                p.sent_to = Some(peer);
                p.sent_ns = self.config.clock.now_ns();
                self.pending.insert(request_id, p);
                false
            }
            Err(SendError::Busy(..)) => {
                self.queued.push_front(p);
                true
            }
            // Not sent: certainly not applied; try again after a pause (the
            // connection is being re-established, or the configuration moves).
            Err(e) => {
                tracing::debug!(error = %e, "request not sent");
                self.retry_later(p);
                false
            }
        }
    }

    /// An attempt that was not sent: refresh the configuration and queue it
    /// again after a growing pause.
    fn retry_later(&mut self, mut p: Pending) {
        let _ = self.refresh();
        p.attempts += 1;
        p.not_before_ns = self.config.clock.now_ns() + self.backoff_ns(p.attempts);
        self.queued.push_back(p);
    }

    fn complete(&mut self, p: Pending, result: Result<Output, ClientError>, term: Term) {
        self.inflight -= 1;
        let result = match result {
            Err(e) if p.maybe_applied && !e.is_unknown() && p.op.is_write() => {
                Err(ClientError::Unknown(e.to_string()))
            }
            r => r,
        };
        let now = self.config.clock.now_ns();
        if let Some(r) = p.request.filter(|r| r.client == self.client_id) {
            let unknown = result.as_ref().is_err_and(|e| e.is_unknown());
            if unknown {
                // Kept out of the floor so the servers keep its outcome for a
                // resubmit; the oldest unresolved write is given up past the bound.
                if !self.unresolved.contains(&r.seq) {
                    self.unresolved.push_back(r.seq);
                }
                if self.unresolved.len() > UNRESOLVED_MAX {
                    if let Some(old) = self.unresolved.pop_front() {
                        self.open_seqs.remove(&old);
                    }
                }
            } else {
                self.open_seqs.remove(&r.seq);
                self.unresolved.retain(|&s| s != r.seq);
            }
        }
        self.done.push(Completed {
            id: p.id,
            result,
            latency: Duration::from_nanos(now.saturating_sub(p.submitted_ns)),
            term,
            request: p.request,
        });
    }

    /// Give up on knowing the outcome of this client's write `request` (reported
    /// unknown): its sequence number no longer holds the floor down.
    pub fn resolve(&mut self, request: RequestId) {
        if request.client == self.client_id {
            self.unresolved.retain(|&s| s != request.seq);
            self.open_seqs.remove(&request.seq);
        }
    }

    /// Make progress: read answers, resend refused operations, expire timed-out
    /// ones. Completed operations are appended to `out`; returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completed>) -> usize {
        let mut events = std::mem::take(&mut self.events);
        let mut data = std::mem::take(&mut self.data);
        let _ = self.ep.poll(&mut events, &mut data);
        self.poll_dials();
        for ev in &events {
            match *ev {
                Event::Message { peer, start, len } => {
                    self.on_message(peer, &data[start..start + len])
                }
                Event::SendFailed { peer, .. } => self.connection_failed(peer),
                Event::Owner(_) => {}
            }
        }
        self.events = events;
        self.data = data;
        let now = self.config.clock.now_ns();
        // Queued attempts that are due, as credits allow.
        let mut n = self.queued.len();
        while n > 0 {
            n -= 1;
            let Some(p) = self.queued.pop_front() else {
                break;
            };
            if p.not_before_ns > now && p.deadline_ns > now {
                self.queued.push_back(p);
                continue;
            }
            if self.send(p) {
                break; // still no credit
            }
        }
        // Attempts unanswered for `attempt_timeout`: sent again (a write with
        // its request record, so it is executed at most once), after looking
        // for a newer configuration (the server may have been replaced).
        let attempt_ns = self.config.attempt_timeout.as_nanos() as u64;
        let retry_unknown = self.config.retry_unknown;
        let mut stale: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                retry_unknown && now < p.deadline_ns && now >= p.sent_ns.saturating_add(attempt_ns)
            })
            .map(|(&r, _)| r)
            .collect();
        if !stale.is_empty() {
            stale.sort_unstable();
            let _ = self.refresh();
            for r in stale {
                let mut p = self.pending.remove(&r).expect("listed");
                if let Some(peer) = p.sent_to.take() {
                    self.ep.forget(peer);
                }
                p.attempts += 1;
                p.not_before_ns = 0;
                p.maybe_applied = true;
                self.queued.push_back(p);
            }
        }
        // Timeouts.
        if self.pending.values().any(|p| now >= p.deadline_ns)
            || self.queued.iter().any(|p| now >= p.deadline_ns)
        {
            let mut expired: Vec<u64> = self
                .pending
                .iter()
                .filter(|(_, p)| now >= p.deadline_ns)
                .map(|(&r, _)| r)
                .collect();
            expired.sort_unstable();
            for r in expired {
                let p = self.pending.remove(&r).expect("listed");
                if let Some(peer) = p.sent_to {
                    self.ep.forget(peer);
                }
                let t = self.config.timeout;
                self.complete(p, Err(ClientError::Timeout(t)), Term(0));
            }
            // The server may be gone (removed from the cluster): look again
            // before routing the next operations.
            let _ = self.refresh();
            let (expired, keep): (Vec<Pending>, Vec<Pending>) =
                self.queued.drain(..).partition(|p| now >= p.deadline_ns);
            self.queued = keep.into();
            for p in expired {
                // Waiting to be sent again: an earlier attempt may have been
                // applied, so the outcome is reported unknown (a timeout).
                let t = self.config.timeout;
                self.complete(p, Err(ClientError::Timeout(t)), Term(0));
            }
        }
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }

    fn backoff_ns(&self, attempts: u32) -> u64 {
        (self.config.backoff.as_nanos() as u64) << attempts.min(5)
    }

    /// The connection behind `peer` failed: its operations' outcomes are unknown.
    fn connection_failed(&mut self, peer: PeerId) {
        let Some(node) = self
            .servers
            .iter()
            .find(|(_, p)| **p == peer)
            .map(|(n, _)| *n)
        else {
            return;
        };
        let mut lost: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.sent_to == Some(peer))
            .map(|(&r, _)| r)
            .collect();
        lost.sort_unstable();
        let _ = self.refresh();
        let now = self.config.clock.now_ns();
        for r in lost {
            let mut p = self.pending.remove(&r).expect("listed");
            self.ep.forget(peer);
            // Sent again until its deadline: a read changes nothing, a write
            // carries its request record and is executed at most once.
            if now < p.deadline_ns && self.config.retry_unknown {
                p.sent_to = None;
                p.maybe_applied = true;
                self.retry_later(p);
            } else {
                self.complete(p, Err(ClientError::ConnectionLost(node)), Term(0));
            }
        }
        // The endpoint reset the connection, which is enough after a cut link.
        // A second failure before any answer gives it up: the server may have
        // restarted (a new process that knows nothing of it), and the next
        // operation for it dials anew.
        if !self.failed_once.insert(node) {
            self.failed_once.remove(&node);
            self.servers.remove(&node);
            self.ep.close(peer);
            tracing::debug!(server = %node, "a connection failed again: dialling anew");
        }
    }

    /// An answer from `peer`. Taken only if it comes from the node the request
    /// was sent to, on the connection it was sent on: the header's sender must
    /// be the connection's remote node (as an RC connection authenticates it),
    /// and that connection the request's. Anything else is dropped, and the
    /// request waits for its real answer.
    fn on_message(&mut self, peer: PeerId, bytes: &[u8]) {
        let Ok(f) = frame::decode(bytes) else {
            return;
        };
        let Body::Response(r) = f.body else {
            return;
        };
        let term = f.header.term;
        let from = self.ep.remote(peer).map(|a| a.node);
        if from != Some(f.header.sender) {
            tracing::debug!(sender = %f.header.sender, ?from, "an answer in another node's name, dropped");
            return;
        }
        match self.pending.get(&f.header.request_id) {
            None => return, // late answer to an operation that timed out
            Some(p) if p.sent_to != Some(peer) => {
                tracing::debug!(sender = %f.header.sender, "an answer from a node not asked, dropped");
                return;
            }
            Some(_) => {}
        }
        let Some(mut p) = self.pending.remove(&f.header.request_id) else {
            return;
        };
        if !self.failed_once.is_empty() {
            self.failed_once.remove(&f.header.sender);
        }
        let result = match r {
            Response::Ok { version } => Ok(Output::Written { version }),
            Response::Value {
                version,
                value,
                expires_at_ms,
            } => Ok(Output::Value {
                value: value.to_vec(),
                version,
                expires_at_ms,
            }),
            Response::NotFound => Err(ClientError::NotFound),
            Response::Keys { next, keys } => Ok(Output::Keys {
                next,
                keys: frame::keys_in(keys).map(<[u8]>::to_vec).collect(),
            }),
            Response::Segment { .. } | Response::Entries { .. } | Response::Config { .. } => {
                Err(ClientError::Server {
                    code: ErrorCode::Malformed,
                    detail: "unexpected answer to a client request".into(),
                })
            }
            Response::Error { code, term, detail } => {
                // The target of the key's migration does not hold it yet: read
                // it at the source (a GET only), at once.
                let ask = code == ErrorCode::AskSource && matches!(p.op, Op::Get { .. });
                p.ask_source = ask;
                let routing = ask || matches!(code, ErrorCode::StaleTerm | ErrorCode::NotPrimary);
                // An internal error leaves a write's outcome unknown: with its
                // request record it is asked again, and answered with the
                // outcome once the server knows it.
                let waiting = matches!(
                    code,
                    ErrorCode::Busy | ErrorCode::Blocked | ErrorCode::NotMember
                ) || (code == ErrorCode::Internal
                    && p.request.is_some()
                    && self.config.retry_unknown);
                let now = self.config.clock.now_ns();
                if (routing && p.attempts < self.config.retries_max)
                    || (waiting && now < p.deadline_ns)
                {
                    p.attempts += 1;
                    p.maybe_applied |= code == ErrorCode::Internal;
                    // A busy server is not a configuration matter, nor is a
                    // migration's target sending a GET to the source (both
                    // hold the client's term).
                    if !matches!(code, ErrorCode::Busy | ErrorCode::AskSource) {
                        let _ = self.refresh();
                    }
                    p.sent_to = None;
                    p.not_before_ns = if waiting {
                        now + self.backoff_ns(p.attempts)
                    } else {
                        0
                    };
                    self.queued.push_back(p);
                    return;
                }
                Err(match code {
                    ErrorCode::StaleTerm => ClientError::StaleTerm {
                        ours: self.cluster.term,
                        server: term,
                    },
                    ErrorCode::TooLarge => ClientError::TooLarge {
                        what: "request",
                        len: p.op.key().len(),
                        max: KV_BYTES_MAX,
                    },
                    code => ClientError::Server {
                        code,
                        detail: detail.to_string(),
                    },
                })
            }
        };
        self.complete(p, result, term);
    }

    /// Run one operation to completion, on the calling thread.
    ///
    /// The thread polls while the answer is near ([`EXECUTE_SPINS`] polls, each
    /// yielding the core), then sleeps between polls, from
    /// [`EXECUTE_SLEEP_MIN`] doubling up to [`EXECUTE_SLEEP_MAX`]: many blocked
    /// callers (a Redis front end's connections) would otherwise keep the cores
    /// busy yielding to each other and starve the servers that answer them. A
    /// caller that needs every microsecond drives [`Client::submit`] and
    /// [`Client::poll`] itself, as the benchmarks and the simulator do.
    pub fn execute(&mut self, op: Op) -> Result<Output, ClientError> {
        let id = self.submit(op)?;
        let mut out = Vec::new();
        let mut idle = 0u32;
        loop {
            self.poll(&mut out);
            if let Some(i) = out.iter().position(|c| c.id == id) {
                let c = out.swap_remove(i);
                // Others completed meanwhile stay for the next poll.
                self.done.append(&mut out);
                return c.result;
            }
            if idle < EXECUTE_SPINS {
                std::thread::yield_now();
            } else {
                let doublings = (idle - EXECUTE_SPINS).min(16);
                std::thread::sleep((EXECUTE_SLEEP_MIN * (1 << doublings)).min(EXECUTE_SLEEP_MAX));
            }
            idle = idle.saturating_add(1);
        }
    }

    /// The value of `key` (`NotFound` if absent or deleted).
    pub fn get(&mut self, key: &[u8]) -> Result<Vec<u8>, ClientError> {
        match self.execute(Op::Get { key: key.to_vec() })? {
            Output::Value { value, .. } => Ok(value),
            _ => Err(ClientError::Server {
                code: ErrorCode::Malformed,
                detail: "a write acknowledgement answered a GET".into(),
            }),
        }
    }

    /// Store `value` under `key`; returns its version. Durable on every replica
    /// when it returns.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<u64, ClientError> {
        match self.execute(Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            expires_at_ms: None,
        })? {
            Output::Written { version } => Ok(version),
            _ => Err(ClientError::Server {
                code: ErrorCode::Malformed,
                detail: "a value answered a PUT".into(),
            }),
        }
    }

    /// Delete `key`; returns the tombstone's version.
    pub fn delete(&mut self, key: &[u8]) -> Result<u64, ClientError> {
        match self.execute(Op::Del { key: key.to_vec() })? {
            Output::Written { version } => Ok(version),
            _ => Err(ClientError::Server {
                code: ErrorCode::Malformed,
                detail: "a value answered a DEL".into(),
            }),
        }
    }

    /// The value of `key` and its version (`None` if absent or deleted).
    pub fn get_versioned(&mut self, key: &[u8]) -> Result<Option<(Vec<u8>, u64)>, ClientError> {
        match self.execute(Op::Get { key: key.to_vec() }) {
            Ok(Output::Value { value, version, .. }) => Ok(Some((value, version))),
            Ok(_) => Err(ClientError::Server {
                code: ErrorCode::Malformed,
                detail: "a write acknowledgement answered a GET".into(),
            }),
            Err(ClientError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Store `value` under `key` if `expect` holds for the key's live value, as
    /// one atomic step at the key's primary; returns the new version. A
    /// condition that does not hold (or another write of the key in flight) is
    /// `ClientError::Server` with `ErrorCode::ConditionFailed`: read again and
    /// decide again.
    pub fn put_if(&mut self, key: &[u8], value: &[u8], expect: Expect) -> Result<u64, ClientError> {
        let op = Op::PutIf {
            key: key.to_vec(),
            value: value.to_vec(),
            expect,
            expires_at_ms: None,
        };
        self.written(op, "PUT")
    }

    /// The value of `key` with its version and expiry time (`None` if absent,
    /// deleted or expired).
    pub fn get_stored(&mut self, key: &[u8]) -> Result<Option<Stored>, ClientError> {
        match self.execute(Op::Get { key: key.to_vec() }) {
            Ok(Output::Value {
                value,
                version,
                expires_at_ms,
            }) => Ok(Some(Stored {
                value,
                version,
                expires_at_ms,
            })),
            Ok(_) => Err(ClientError::Server {
                code: ErrorCode::Malformed,
                detail: "a write acknowledgement answered a GET".into(),
            }),
            Err(ClientError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The general PUT: `value` under `key`, only if `expect` holds (when
    /// given, as [`Client::put_if`]), reading as absent from `expires_at_ms`
    /// (Unix ms, on the primary's clock) when given. Returns the version.
    pub fn put_with(
        &mut self,
        key: &[u8],
        value: &[u8],
        expect: Option<Expect>,
        expires_at_ms: Option<u64>,
    ) -> Result<u64, ClientError> {
        let (key, value) = (key.to_vec(), value.to_vec());
        let op = match expect {
            None => Op::Put {
                key,
                value,
                expires_at_ms,
            },
            Some(expect) => Op::PutIf {
                key,
                value,
                expect,
                expires_at_ms,
            },
        };
        self.written(op, "PUT")
    }

    /// Delete `key` if `expect` holds for its live value ([`Client::put_if`]).
    pub fn delete_if(&mut self, key: &[u8], expect: Expect) -> Result<u64, ClientError> {
        let op = Op::DelIf {
            key: key.to_vec(),
            expect,
        };
        self.written(op, "DEL")
    }

    fn written(&mut self, op: Op, what: &str) -> Result<u64, ClientError> {
        match self.execute(op)? {
            Output::Written { version } => Ok(version),
            _ => Err(ClientError::Server {
                code: ErrorCode::Malformed,
                detail: format!("no write acknowledgement answered a {what}"),
            }),
        }
    }

    /// Keys of `shard` with a live value, from `cursor` (0: the start), about
    /// `count` of them, and the cursor to ask from next (0: the shard is done),
    /// from its primary. A key live for the whole scan is returned at least
    /// once; keys written or deleted meanwhile may or may not be.
    pub fn scan(
        &mut self,
        shard: ShardId,
        cursor: u64,
        count: u32,
    ) -> Result<(u64, Vec<Vec<u8>>), ClientError> {
        match self.execute(Op::Scan {
            shard,
            cursor,
            count,
        })? {
            Output::Keys { next, keys } => Ok((next, keys)),
            _ => Err(ClientError::Server {
                code: ErrorCode::Malformed,
                detail: "no keys answered a SCAN".into(),
            }),
        }
    }

    /// The endpoint (tests send raw frames through it).
    pub fn endpoint_mut(&mut self) -> &mut Endpoint<N> {
        &mut self.ep
    }

    /// The peer of `server`'s worker this client talks to.
    pub fn server_peer(&self, server: NodeId) -> Option<PeerId> {
        self.servers.get(&server).copied()
    }
}

/// A client id no other client is likely to hold: 64 bits from the standard
/// library's randomly keyed hasher (seeded from the operating system), mixed
/// with the time and a process-wide counter. Never 0.
/// The id of a new request of this client: the next seq of its incarnation.
/// An incarnation whose seqs reach [`RequestId::SEQ_LIMIT`] (what a log entry
/// stores) is over: the client continues as a new incarnation, with a new
/// client id from `draw` and seqs from 1. Requests of the old one keep their ids
/// (their retries are still recognised); they raise no floor of the new one.
fn new_request_id(
    client_id: &mut u64,
    next_seq: &mut u64,
    open_seqs: &mut std::collections::BTreeSet<u64>,
    draw: impl Fn() -> u64,
) -> RequestId {
    if *next_seq >= RequestId::SEQ_LIMIT {
        let old = *client_id;
        *client_id = std::iter::repeat_with(draw)
            .find(|&c| c != old && c != RequestId::NO_CLIENT)
            .expect("an endless draw");
        *next_seq = 1;
        open_seqs.clear();
        tracing::info!(
            old,
            new = *client_id,
            "request seqs exhausted: new client incarnation"
        );
    }
    let seq = *next_seq;
    *next_seq += 1;
    open_seqs.insert(seq);
    RequestId {
        client: *client_id,
        seq,
    }
}

fn random_client_id() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_whose_seqs_reach_the_limit_continues_as_a_new_incarnation() {
        let (mut client, mut next, mut open) = (7u64, RequestId::SEQ_LIMIT - 1, Default::default());
        let last = new_request_id(&mut client, &mut next, &mut open, || 7);
        assert_eq!(
            last,
            RequestId {
                client: 7,
                seq: RequestId::SEQ_LIMIT - 1
            }
        );
        assert!(last.is_valid());
        // The draw gives the old id first, then 0, then a new one: both refused.
        let draws = std::cell::Cell::new(0u64);
        let draw = || {
            let d = draws.get();
            draws.set(d + 1);
            [7, 0, 11][d as usize]
        };
        let first = new_request_id(&mut client, &mut next, &mut open, draw);
        assert_eq!(first, RequestId { client: 11, seq: 1 });
        assert!(first.is_valid());
        // The old incarnation's open seq raises no floor of the new one.
        assert_eq!(open.iter().copied().collect::<Vec<_>>(), vec![1]);
    }
}
