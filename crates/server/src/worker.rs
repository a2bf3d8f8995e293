//! The worker role (seed 000 §4.1, §5.1): network I/O and KV logic in one task.
//!
//! A worker polls its endpoint's completion queue, which carries both RPC messages
//! and its replication completions. A PUT/DEL is appended to the worker's t-log,
//! handed to the replicator for every backup, and *parked*: its context waits in a
//! slot while the worker goes on serving. Each ACK decrements the slot's count;
//! the last one makes the entry visible in the index and answers the client
//! (§4.1: index update after all ACKs, so a GET never returns what a failure could
//! still lose). Worker 0 also disseminates each primary shard's CommitVer every
//! 15 ms through the same replication path (§4.4), for the shards it serves.
//!
//! A write whose replication failed is answered `Internal` (unknown outcome) but
//! stays parked, its version in flight, and is replicated again (`repair`) to the
//! replicas of the current configuration that lack it until all have it (then it
//! is published) or this server no longer leads its shard (then it is dropped:
//! the new primary's gather found it) — unless it is the source of the shard's
//! migration, which keeps replicating it to the backups and publishes it, so
//! that it is in the copy (docs/resharding.md). Exactly once: a write with a request record
//! is marked in flight on the server before the shard's request table is read; a
//! request already executed is answered with its version, one in flight with
//! `Busy`, one below its client's floor with `Duplicate`; the record goes into
//! the log entry and the table is written before the mark is taken off.
//!
//! A conditional write (`PutIf`, `DelIf`) takes its version only if no write of
//! its key is in flight and its condition holds on the published value, both
//! under the shard's version lock (`VersionBook::allocate_if`); otherwise it is
//! answered `Busy` (a write in flight: sent again) or `ConditionFailed`, and
//! nothing changes. A `Scan` is answered with a page of the shard's keys from
//! its index (`Engine::scan_keys`).
//!
//! Every request is checked before anything changes: its frame decodes, its cluster
//! id and term are current, the server's lease is valid and its configuration
//! committed, this server is the shard's primary and serves it (not recovering
//! it) — or, for replication, a backup — and sizes are within bounds. A request that fails a check
//! gets a typed error and changes nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rowankv_engine::entry::{self, Kind};
use rowankv_engine::{hash_key, EngineError, RequestOutcome};
use rowankv_fabric::Nic;
use rowankv_rpc::directory::Acceptor;
use rowankv_rpc::endpoint::{Endpoint, Event, PeerId};
use rowankv_types::{NodeId, RequestRecord, SegmentId, ShardId, Version};
use rowankv_wire::config::Config;
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Expect, Response};

use crate::replication::{BackupSide, Outcomes, ReplCtx, Replicator};
use crate::runtime::{Step, Task};
use crate::server::{ServerShared, ServerStats, KV_BYTES_MAX};
use crate::version::Refusal;

/// A write as a request gives it: kind, key, value, request record, expiry
/// time, condition.
type WriteArgs<'a> = (
    Kind,
    &'a [u8],
    &'a [u8],
    Option<RequestRecord>,
    Option<u64>,
    Option<Expect>,
);

/// Unsealed segments granted to one remote log, at most. A log holds its current
/// segment and a standby, plus segments granted by answers it gave up on and
/// seals still on their way (a `share` log's workers seal on connections of
/// their own); the bound is well above that, and only stops a log that asks
/// without ever sealing from taking the pool.
pub const GRANTED_SEGMENTS_PER_LOG_MAX: usize = 16;

/// Token of a CommitVer record: its ACK needs no answer.
const COMMIT_TOKEN: u64 = (1 << 56) - 1;
/// A write's token: its slot, the index of the replica it went to among the
/// write's targets, and the slot's generation (so an outcome for a slot since
/// reused is recognised and dropped).
const SLOT_BITS: u32 = 24;
const TARGET_BITS: u32 = 4;
const GENERATION_BITS: u32 = 27;
/// Replicas one write goes to, at most (backups and joining backups).
const TARGETS_MAX: usize = 1 << TARGET_BITS;
const _: () = assert!(SLOT_BITS + TARGET_BITS + GENERATION_BITS < 56);
/// A failed write is replicated again after `retry_ns`, doubled per attempt up to
/// this many times.
const REPAIR_BACKOFF_DOUBLINGS_MAX: u32 = 6;
/// Keys one `Scan` page asks for, at most.
const SCAN_COUNT_MAX: usize = 10_000;

fn write_token(slot: u32, target: usize, generation: u32) -> u64 {
    debug_assert!(target < TARGETS_MAX && generation < 1 << GENERATION_BITS);
    ((generation as u64) << (SLOT_BITS + TARGET_BITS))
        | ((target as u64) << SLOT_BITS)
        | slot as u64
}

/// (slot, target index, generation) of a write's token.
fn split_token(token: u64) -> (u32, usize, u32) {
    (
        (token & ((1 << SLOT_BITS) - 1)) as u32,
        ((token >> SLOT_BITS) & ((1 << TARGET_BITS) - 1)) as usize,
        (token >> (SLOT_BITS + TARGET_BITS)) as u32,
    )
}

struct PendingWrite {
    peer: PeerId,
    request_id: u64,
    shard: ShardId,
    key: Vec<u8>,
    addr: u64,
    version: Version,
    len: usize,
    /// The client's request record (carried in the entry).
    request: Option<RequestRecord>,
    /// The term the write was last sent under (its replicas are that term's).
    term: u64,
    /// The replicas it was sent to, and which of them have it durably.
    targets: [NodeId; TARGETS_MAX],
    target_count: usize,
    acked: u16,
    /// Outcomes still to come.
    acks_left: usize,
    failure: Option<String>,
    /// Times it was replicated again (for the back-off).
    repairs: u32,
    /// The client has had its answer (an unknown outcome: replication failed).
    answered: bool,
    /// Its command (`ServerStats::CMD_*`), when it arrived (the start of the
    /// step that read it) and when it was last sent to its replicas: metrics.
    command: usize,
    arrived_ns: u64,
    sent_ns: u64,
    /// Replication failed and is tried again at this time: the entry may be on
    /// some replicas only, so it stays in flight (CommitVer does not pass it, and
    /// a backup's segments holding it stay uncommitted, gathered by any promotion)
    /// until every replica has it or this server no longer leads its shard.
    retry_at_ns: Option<u64>,
}

struct Slot {
    generation: u32,
    write: Option<PendingWrite>,
}

/// What an incoming message is, once checked.
pub(crate) enum Inbound<'a> {
    /// A well-formed frame from the node its connection comes from.
    Frame(frame::Frame<'a>),
    /// A bad request: answer it with this error.
    Refuse {
        request_id: u64,
        code: ErrorCode,
        detail: String,
    },
    /// A bad response, or a response that claims another sender: nobody to tell.
    Drop(String),
}

/// Decode a message from `peer` and check that its header's sender is the node
/// the connection comes from (the queue pair's remote node, as an RC connection
/// authenticates it), not just what the header claims.
pub(crate) fn read_frame<'a, N: Nic>(
    ep: &Endpoint<N>,
    peer: PeerId,
    bytes: &'a [u8],
) -> Inbound<'a> {
    let f = match frame::decode(bytes) {
        Ok(f) => f,
        Err(e) => {
            return match frame::decode_header(bytes) {
                Ok(h) if h.msg_type == frame::MsgType::Response as u8 => {
                    Inbound::Drop(format!("malformed response: {e}"))
                }
                Ok(h) => Inbound::Refuse {
                    request_id: h.request_id,
                    code: e.code(),
                    detail: e.to_string(),
                },
                Err(_) => Inbound::Refuse {
                    request_id: 0,
                    code: e.code(),
                    detail: e.to_string(),
                },
            };
        }
    };
    let from = ep.remote(peer).map(|a| a.node);
    if from == Some(f.header.sender) {
        return Inbound::Frame(f);
    }
    let detail = format!(
        "header names sender {} on a connection from {from:?}",
        f.header.sender
    );
    if matches!(f.body, Body::Response(_)) {
        Inbound::Drop(detail)
    } else {
        Inbound::Refuse {
            request_id: f.header.request_id,
            code: ErrorCode::Malformed,
            detail,
        }
    }
}

/// One worker of one server.
pub struct Worker<N: Nic> {
    name: String,
    shared: Arc<ServerShared<N>>,
    index: usize,
    ep: Endpoint<N>,
    acceptor: Acceptor,
    repl: Box<dyn Replicator<N>>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    inflight: usize,
    /// Writes waiting to be replicated again (`PendingWrite::retry_at_ns`).
    repairs: usize,
    events: Vec<Event>,
    data: Vec<u8>,
    outcomes: Outcomes,
    entry_buf: Vec<u8>,
    value_buf: Vec<u8>,
    last_commit_ns: u64,
    commit_sent: Vec<u64>,
    /// The server's configuration as of `config_epoch` (refreshed once per step).
    config: Arc<Config>,
    config_epoch: u64,
    /// The request being handled: its command (`ServerStats::CMD_*`, for the
    /// error counters) and when it arrived (the start of the step that read it).
    command: usize,
    arrived_ns: u64,
}

impl<N: Nic> Worker<N> {
    pub(crate) fn new(
        shared: Arc<ServerShared<N>>,
        index: usize,
        ep: Endpoint<N>,
        acceptor: Acceptor,
        repl: Box<dyn Replicator<N>>,
    ) -> Self {
        let shards = shared.engine.config().shard_count as usize;
        let config_epoch = shared.config_epoch();
        let config = shared.config();
        Worker {
            name: format!("s{}-worker-{index}", shared.node.0),
            shared,
            index,
            ep,
            acceptor,
            repl,
            slots: Vec::new(),
            free: Vec::new(),
            inflight: 0,
            repairs: 0,
            events: Vec::with_capacity(64),
            data: Vec::with_capacity(64 * 1024),
            outcomes: Outcomes::default(),
            entry_buf: Vec::with_capacity(frame::FRAME_BYTES_MAX_DEFAULT),
            value_buf: Vec::with_capacity(frame::FRAME_BYTES_MAX_DEFAULT),
            last_commit_ns: 0,
            commit_sent: vec![0; shards],
            config_epoch,
            config,
            command: ServerStats::CMD_OTHER,
            arrived_ns: 0,
        }
    }

    /// The time for the metrics' latencies: the engine's view of the clock,
    /// which never preempts the role in the simulator (not a decision point).
    fn metrics_now_ns(&self) -> u64 {
        self.shared.engine.config().clock.now_ns()
    }

    /// Take the server's configuration if it was replaced.
    fn sync_config(&mut self) {
        let epoch = self.shared.config_epoch();
        if epoch != self.config_epoch {
            self.config_epoch = epoch;
            self.config = self.shared.config();
        }
    }

    fn envelope(&self, request_id: u64) -> Envelope {
        Envelope {
            cluster_id: self.config.cluster_id,
            term: self.config.term,
            request_id,
            sender: self.shared.node,
        }
    }

    fn respond(&mut self, peer: PeerId, request_id: u64, response: Response<'_>) {
        let env = self.envelope(request_id);
        if let Err(e) = self.ep.respond(peer, &env, &Body::Response(response)) {
            tracing::debug!(worker = %self.name, error = %e, "response not sent");
        }
    }

    fn reject(&mut self, peer: PeerId, request_id: u64, code: ErrorCode, detail: &str) {
        let stats = &self.shared.stats;
        let counter = match code {
            ErrorCode::StaleTerm => &stats.rejected_stale_term,
            ErrorCode::NotPrimary => &stats.rejected_not_primary,
            ErrorCode::Malformed | ErrorCode::UnknownType => &stats.rejected_malformed,
            ErrorCode::TooLarge => &stats.rejected_too_large,
            ErrorCode::Blocked | ErrorCode::NotMember => &stats.rejected_blocked,
            _ => &stats.rejected_other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        stats.count_error(self.command, code);
        let term = self.config.term;
        self.respond(peer, request_id, Response::Error { code, term, detail });
    }

    fn handle_message(&mut self, peer: PeerId, bytes: &[u8], now_ns: u64) {
        self.command = ServerStats::CMD_OTHER;
        self.arrived_ns = now_ns;
        let f = match read_frame(&self.ep, peer, bytes) {
            Inbound::Frame(f) => f,
            Inbound::Refuse {
                request_id,
                code,
                detail,
            } => {
                self.shared.stats.count_request(ServerStats::CMD_OTHER);
                self.reject(peer, request_id, code, &detail);
                return;
            }
            Inbound::Drop(why) => {
                tracing::warn!(worker = %self.name, why, "frame dropped");
                return;
            }
        };
        let h = f.header;
        if let Body::Response(r) = f.body {
            let mut cx = ReplCtx {
                env: self.envelope(0),
                ep: &mut self.ep,
                now_ns,
            };
            self.repl
                .on_response(&mut cx, peer, h.request_id, &r, &mut self.outcomes);
            return;
        }
        self.command = ServerStats::command_of(f.body.msg_type());
        self.shared.stats.count_request(self.command);
        if h.cluster_id != self.config.cluster_id {
            let detail = format!(
                "cluster {:#x}, this server belongs to {:#x}",
                h.cluster_id, self.config.cluster_id
            );
            self.reject(peer, h.request_id, ErrorCode::WrongCluster, &detail);
            return;
        }
        // A write is counted in flight under the term it may use before the
        // configuration is read again (`ServerShared::note_write_started`), so a
        // re-replication copy either waits for it or it goes to the new backup.
        if f.body.is_write() && !self.shared.settings.failover.unsafe_announce_writes_late {
            self.shared
                .note_write_started(self.index, self.config.term.0);
        }
        // The server may have adopted a newer term since this step began.
        self.sync_config();
        if h.term > self.config.term {
            self.shared.refresh_config();
            self.sync_config();
        }
        if h.term != self.config.term {
            let detail = format!("request term {}, server term {}", h.term, self.config.term);
            self.reject(peer, h.request_id, ErrorCode::StaleTerm, &detail);
            return;
        }
        if matches!(
            f.body,
            Body::Get { .. } | Body::GetMigrating { .. } | Body::Scan { .. }
        ) || f.body.is_write()
        {
            // A write is admitted on the clock now, not at the step's start:
            // earlier messages of this step may have taken a while. A GET is
            // admitted on the step's time, an early refusal only: it is checked
            // on the clock again right before its answer (`handle_get`).
            let now = match f.body {
                Body::Get { .. } | Body::GetMigrating { .. } => now_ns,
                _ => self.shared.now_ns(),
            };
            if let Some((code, why)) = self.shared.admit(now, self.config.term) {
                self.reject(peer, h.request_id, code, why);
                return;
            }
        }
        match f.body {
            Body::Get { key } => self.handle_get(peer, h.request_id, key, false),
            Body::GetMigrating { key } => self.handle_get(peer, h.request_id, key, true),
            Body::Put {
                key,
                value,
                request,
                expires_at_ms,
            } => {
                let w = (Kind::Put, key, value, request, expires_at_ms, None);
                self.handle_write(peer, h.request_id, w, now_ns)
            }
            Body::Del { key, request } => {
                let w = (Kind::Del, key, &[][..], request, None, None);
                self.handle_write(peer, h.request_id, w, now_ns)
            }
            Body::PutIf {
                key,
                value,
                request,
                expires_at_ms,
                expect,
            } => {
                let w = (Kind::Put, key, value, request, expires_at_ms, Some(expect));
                self.handle_write(peer, h.request_id, w, now_ns)
            }
            Body::DelIf {
                key,
                request,
                expect,
            } => {
                let w = (Kind::Del, key, &[][..], request, None, Some(expect));
                self.handle_write(peer, h.request_id, w, now_ns)
            }
            Body::Scan {
                shard,
                cursor,
                count,
            } => self.handle_scan(peer, h.request_id, shard, cursor, count),
            Body::Replicate { entries } => {
                self.handle_replicate(peer, h.request_id, h.sender, entries)
            }
            Body::GrantSegment { log, sealed } => {
                self.handle_grant(peer, h.request_id, h.sender, log, sealed, now_ns)
            }
            Body::Ping => self.respond(peer, h.request_id, Response::Ok { version: 0 }),
            Body::Lease
            | Body::Prepare { .. }
            | Body::Commit { .. }
            | Body::Gather { .. }
            | Body::Install { .. }
            | Body::Ready { .. }
            | Body::Config { .. }
            | Body::Load { .. }
            | Body::Migrate { .. }
            | Body::Reshard { .. }
            | Body::Stats => {
                let detail = format!("{:?} goes to a server's control role", f.body.msg_type());
                self.reject(peer, h.request_id, ErrorCode::UnknownType, &detail);
            }
            Body::Response(_) => unreachable!("handled above"),
        }
    }

    /// The shard of `key` if this server is its primary.
    fn primary_shard(&mut self, peer: PeerId, request_id: u64, key: &[u8]) -> Option<ShardId> {
        let s = self.config.shard_for_key(key);
        if s.primary != self.shared.node {
            let detail = format!(
                "{} is primary of {} in term {}",
                s.primary, s.shard, self.config.term
            );
            self.reject(peer, request_id, ErrorCode::NotPrimary, &detail);
            return None;
        }
        if !self.shared.shard_ready(s.shard) {
            let detail = format!("{} is being recovered here", s.shard);
            self.reject(peer, request_id, ErrorCode::Blocked, &detail);
            return None;
        }
        self.shared.load.note_request(s.shard);
        Some(s.shard)
    }

    /// A page of the keys of `shard`, if this server is its primary.
    fn handle_scan(
        &mut self,
        peer: PeerId,
        request_id: u64,
        shard: ShardId,
        cursor: u64,
        count: u32,
    ) {
        let primary = self.config.shard(shard).map(|s| s.primary);
        if primary != Some(self.shared.node) {
            let detail = format!(
                "{shard} has primary {primary:?} in term {}",
                self.config.term
            );
            self.reject(peer, request_id, ErrorCode::NotPrimary, &detail);
            return;
        }
        if !self.shared.shard_ready(shard) {
            let detail = format!("{shard} is being recovered here");
            self.reject(peer, request_id, ErrorCode::Blocked, &detail);
            return;
        }
        // Keys not copied here yet would be missed: a scan waits for the end
        // of the migration.
        if let Some(source) = self.migrating_from(shard) {
            let detail = format!("{shard} is migrating here from {source}");
            self.reject(peer, request_id, ErrorCode::Blocked, &detail);
            return;
        }
        // What a response frame holds after its fixed fields.
        let budget = frame::value_response_bytes_max(self.ep.config().frame_bytes_max);
        let mut keys = Vec::new();
        let count = (count as usize).clamp(1, SCAN_COUNT_MAX);
        let scanned = self
            .shared
            .engine
            .scan_keys(shard, cursor, count, budget, |k| {
                frame::put_key(&mut keys, k)
            });
        match scanned {
            Ok(next) => {
                let took_ns = self.metrics_now_ns().saturating_sub(self.arrived_ns);
                self.shared.stats.latency[ServerStats::CMD_SCAN].observe_ns(took_ns);
                self.respond(peer, request_id, Response::Keys { next, keys: &keys })
            }
            Err(e) => self.reject(peer, request_id, ErrorCode::Internal, &e.to_string()),
        }
    }

    /// The shard of `key` if this server is the source of its migration
    /// (seed 000 §4.6): the index it still holds answers a GET its target
    /// sent back, until the migration ends.
    fn migration_source_shard(
        &mut self,
        peer: PeerId,
        request_id: u64,
        key: &[u8],
    ) -> Option<ShardId> {
        let shard = self.config.shard_for_key(key).shard;
        if self
            .config
            .migration(shard)
            .is_some_and(|m| m.from == self.shared.node)
        {
            return Some(shard);
        }
        let detail = format!(
            "{shard} does not migrate from {} in term {}",
            self.shared.node, self.config.term
        );
        self.reject(peer, request_id, ErrorCode::NotPrimary, &detail);
        None
    }

    /// The source of `shard`'s migration here, if it is migrating to this
    /// server: keys it does not hold yet are read there.
    fn migrating_from(&self, shard: ShardId) -> Option<rowankv_types::NodeId> {
        self.config
            .migration(shard)
            .filter(|m| m.to == self.shared.node)
            .map(|m| m.from)
    }

    /// A GET (`from_target`: a `GetMigrating`, answered by a migration's
    /// source). At a migration's target, a key it holds no entry of (value or
    /// tombstone) is not copied yet: the client is told to read it from the
    /// source (`AskSource`), which holds its latest acknowledged write.
    fn handle_get(&mut self, peer: PeerId, request_id: u64, key: &[u8], from_target: bool) {
        let shard = if from_target {
            self.migration_source_shard(peer, request_id, key)
        } else {
            self.primary_shard(peer, request_id, key)
        };
        let Some(shard) = shard else {
            return;
        };
        self.shared.stats.gets.fetch_add(1, Ordering::Relaxed);
        if from_target {
            self.shared
                .stats
                .migration_reads
                .fetch_add(1, Ordering::Relaxed);
        }
        let mut value = std::mem::take(&mut self.value_buf);
        // At a migration's target: whether the key has an entry here, read
        // before the value (the copy may install it in between, and a miss
        // must then not read as absent).
        let ask = !from_target
            && self.migrating_from(shard).is_some()
            && !self.shared.engine.is_indexed(shard, key).unwrap_or(false);
        // An expired value reads as absent here, the primary, on its clock.
        let read = self.shared.engine.get_stored_into(shard, key, &mut value);
        // The value was read under a lease only if the lease (and its margin)
        // still holds now, after the read: checked on the clock right before
        // answering, so no delay since admission goes unaccounted.
        let answer_ns = self.shared.now_ns();
        if let Some((code, why)) = self.shared.lease_refusal(answer_ns) {
            self.value_buf = value;
            self.reject(peer, request_id, code, why);
            return;
        }
        let took_ns = answer_ns.saturating_sub(self.arrived_ns);
        match read {
            Ok(Some(stored)) => {
                if value.len() > frame::value_response_bytes_max(self.ep.config().frame_bytes_max) {
                    self.reject(
                        peer,
                        request_id,
                        ErrorCode::TooLarge,
                        "value larger than a response",
                    );
                } else {
                    self.shared.stats.latency[ServerStats::CMD_GET].observe_ns(took_ns);
                    self.respond(
                        peer,
                        request_id,
                        Response::Value {
                            version: stored.version.0,
                            value: &value,
                            expires_at_ms: stored.expires_at_ms,
                        },
                    );
                }
            }
            Ok(None) if ask => {
                let detail = format!("{shard} is migrating here and the key is not copied yet");
                self.reject(peer, request_id, ErrorCode::AskSource, &detail);
            }
            Ok(None) => {
                self.shared.stats.latency[ServerStats::CMD_GET].observe_ns(took_ns);
                self.respond(peer, request_id, Response::NotFound)
            }
            Err(e) => self.reject(peer, request_id, ErrorCode::Internal, &e.to_string()),
        }
        self.value_buf = value;
    }

    /// A PUT or DEL (`w`: kind, key, value, request record, condition).
    fn handle_write(&mut self, peer: PeerId, request_id: u64, w: WriteArgs<'_>, now_ns: u64) {
        let (kind, key, value, request, expires_at_ms, expect) = w;
        let Some(shard) = self.primary_shard(peer, request_id, key) else {
            return;
        };
        // A cheap handle on this step's configuration: the backups are read from it.
        let config = Arc::clone(&self.config);
        let assignment = config.shard(shard).expect("a validated configuration");
        if key.is_empty() {
            self.reject(peer, request_id, ErrorCode::Malformed, "empty key");
            return;
        }
        if key.len() + value.len() > KV_BYTES_MAX {
            let detail = format!(
                "key + value of {} B, at most {KV_BYTES_MAX} B",
                key.len() + value.len()
            );
            self.reject(peer, request_id, ErrorCode::TooLarge, &detail);
            return;
        }
        if self.inflight >= self.shared.settings.inflight_max {
            self.reject(
                peer,
                request_id,
                ErrorCode::Busy,
                "too many writes in flight",
            );
            return;
        }
        // Exactly once: a request already executed is answered with its outcome,
        // one in flight here is answered Busy (its client asks again later).
        let request = request.filter(|_| !self.shared.settings.failover.unsafe_ignore_request_ids);
        if let Some(r) = request {
            // Marked in flight before the table is read: a duplicate on another
            // worker then either finds it in flight or, once it is published (the
            // table is written before the mark is taken off), finds it done.
            if !self.shared.start_request(shard, r.id) {
                self.reject(
                    peer,
                    request_id,
                    ErrorCode::Busy,
                    "the same request is in flight",
                );
                return;
            }
            let refused = match self.shared.engine.request_outcome(shard, r.id) {
                Ok(RequestOutcome::Unknown) => None,
                Ok(RequestOutcome::Done(version)) => {
                    self.respond(peer, request_id, Response::Ok { version: version.0 });
                    Some(())
                }
                Ok(RequestOutcome::Stale) => {
                    let detail = format!(
                        "request {} of client {:#x} was answered before (below the client's floor)",
                        r.id.seq, r.id.client
                    );
                    self.reject(peer, request_id, ErrorCode::Duplicate, &detail);
                    Some(())
                }
                Err(e) => {
                    self.reject(peer, request_id, ErrorCode::Internal, &e.to_string());
                    Some(())
                }
            };
            if refused.is_some() {
                self.shared.end_request(shard, r.id);
                return;
            }
        }
        // A condition on a key not copied here yet cannot be checked here
        // (it would read as absent): the client asks again after a pause.
        if expect.is_some()
            && self.migrating_from(shard).is_some()
            && !self.shared.engine.is_indexed(shard, key).unwrap_or(false)
        {
            let why = "the key is not migrated here yet";
            let to = (peer, request_id);
            self.refuse_write(shard, None, request, to, ErrorCode::Blocked, why);
            return;
        }
        let key_hash = hash_key(key);
        let allocated = match expect {
            None => self
                .shared
                .versions
                .allocate(shard, key_hash)
                .ok_or(Refusal::Exhausted),
            Some(e) => {
                let engine = &self.shared.engine;
                let buf = &mut self.value_buf;
                self.shared.versions.allocate_if(shard, key_hash, || {
                    match engine.get_into(shard, key, buf) {
                        // A read that fails is no answer: never "absent".
                        Err(_) => Err(()),
                        Ok(live) => Ok(match e {
                            Expect::Absent => live.is_none(),
                            Expect::Version(v) => live == Some(Version(v)),
                        }),
                    }
                })
            }
        };
        let version = match allocated {
            Ok(v) => v,
            Err(refusal) => {
                let (code, why) = match refusal {
                    Refusal::Exhausted => (ErrorCode::Internal, "shard versions exhausted"),
                    Refusal::ReadFailed => (
                        ErrorCode::Internal,
                        "the key's value could not be read to check the condition",
                    ),
                    // Not a verdict on the condition: the client sends it again
                    // after a pause, when the write in flight has finished.
                    Refusal::InFlight => (ErrorCode::Busy, "another write of the key is in flight"),
                    Refusal::Condition => (
                        ErrorCode::ConditionFailed,
                        "the key's value is not the one expected",
                    ),
                };
                self.refuse_write(shard, None, request, (peer, request_id), code, why);
                return;
            }
        };
        let mtu = self.shared.engine.config().mtu_bytes;
        let encoded = entry::encode_inner(
            &mut self.entry_buf,
            kind,
            shard,
            version,
            key,
            value,
            request,
            expires_at_ms,
            mtu,
        );
        if let Err(e) = encoded {
            let to = (peer, request_id);
            self.refuse_write(
                shard,
                Some(version),
                request,
                to,
                ErrorCode::Malformed,
                &e.to_string(),
            );
            return;
        }
        let addr = match self
            .shared
            .engine
            .append_encoded(self.index, &self.entry_buf)
        {
            Ok(a) => a,
            Err(e) => {
                let code = match e {
                    EngineError::OutOfSpace => ErrorCode::OutOfSpace,
                    _ => ErrorCode::Internal,
                };
                let to = (peer, request_id);
                self.refuse_write(shard, Some(version), request, to, code, &e.to_string());
                return;
            }
        };
        match kind {
            Kind::Del => self.shared.stats.dels.fetch_add(1, Ordering::Relaxed),
            _ => self.shared.stats.puts.fetch_add(1, Ordering::Relaxed),
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    write: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let generation = self.slots[slot as usize].generation;
        let sent_ns = self.metrics_now_ns();
        let mut targets = [NodeId(0); TARGETS_MAX];
        let target_count = assignment.write_target_count();
        assert!(
            target_count <= TARGETS_MAX,
            "{target_count} replicas of {shard}"
        );
        for (t, b) in targets.iter_mut().zip(assignment.write_targets()) {
            *t = b;
        }
        self.slots[slot as usize].write = Some(PendingWrite {
            peer,
            request_id,
            shard,
            key: key.to_vec(),
            addr,
            version,
            len: self.entry_buf.len(),
            request,
            term: config.term.0,
            targets,
            target_count,
            acked: 0,
            acks_left: target_count,
            failure: None,
            repairs: 0,
            answered: false,
            retry_at_ns: None,
            command: self.command,
            arrived_ns: self.arrived_ns,
            sent_ns,
        });
        self.inflight += 1;
        self.shared
            .load
            .note_replication(shard, target_count as u64);
        if target_count == 0 {
            self.finish(slot, now_ns);
            return;
        }
        let mut cx = ReplCtx {
            env: self.envelope(0),
            ep: &mut self.ep,
            now_ns,
        };
        for (i, &b) in targets[..target_count].iter().enumerate() {
            let token = write_token(slot, i, generation);
            self.repl.replicate(&mut cx, b, &self.entry_buf, token);
        }
    }

    /// An ACK (or failure) of `token`.
    fn on_outcome(&mut self, token: u64, failure: Option<String>, now_ns: u64) {
        if token == COMMIT_TOKEN {
            if let Some(why) = failure {
                tracing::debug!(worker = %self.name, why, "CommitVer record not replicated");
            }
            return;
        }
        let (slot, target, generation) = split_token(token);
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if s.generation != generation {
            return;
        }
        let Some(w) = s.write.as_mut() else {
            return;
        };
        assert!(
            target < w.target_count,
            "an outcome for target {target} of {}",
            w.target_count
        );
        match failure {
            Some(why) => {
                tracing::debug!(worker = %self.name, why, version = %w.version, "replication failed");
                self.shared
                    .stats
                    .replication_failures
                    .fetch_add(1, Ordering::Relaxed);
                w.failure.get_or_insert(why);
            }
            None => {
                w.acked |= 1 << target;
                let now = self.shared.engine.config().clock.now_ns();
                let took_ns = now.saturating_sub(w.sent_ns);
                self.shared.stats.replication_ack.observe_ns(took_ns);
            }
        }
        assert!(
            w.acks_left > 0,
            "an outcome of a write with no replication out"
        );
        w.acks_left -= 1;
        if w.acks_left == 0 {
            self.finish(slot, now_ns);
        }
    }

    /// Every replication of the write in `slot` has an outcome.
    fn finish(&mut self, slot: u32, now_ns: u64) {
        let s = &mut self.slots[slot as usize];
        let Some(w) = s.write.as_mut() else {
            return;
        };
        assert_eq!(w.acks_left, 0, "finished with replications out");
        self.command = w.command;
        if w.failure.is_some() && self.shared.settings.failover.unsafe_abandon_failed_writes {
            let w = self.drop_write(slot);
            let detail = format!("replication failed: {}", w.failure.unwrap_or_default());
            self.reject(w.peer, w.request_id, ErrorCode::Internal, &detail);
            return;
        }
        if let Some(why) = w.failure.take() {
            // The outcome is unknown to the client: some replicas may hold it. It
            // is not abandoned (see `retry_at_ns`): a promoted backup that gathered
            // it from a replica must learn its version, and a replica that has it
            // must not commit it past the others.
            if !w.answered {
                w.answered = true;
                let (peer, request_id) = (w.peer, w.request_id);
                let detail = format!("replication failed: {why}");
                self.reject(peer, request_id, ErrorCode::Internal, &detail);
            }
            let w = self.slots[slot as usize].write.as_mut().expect("checked");
            let pause = self.shared.settings.failover.retry_ns
                << w.repairs.min(REPAIR_BACKOFF_DOUBLINGS_MAX);
            w.retry_at_ns = Some(now_ns + pause);
            self.repairs += 1;
            return;
        }
        let w = s.write.take().expect("checked");
        self.release_slot(slot);
        let published = self
            .shared
            .engine
            .publish_with_request(w.shard, &w.key, w.addr, w.version, w.len, w.request);
        self.shared.versions.complete(w.shard, w.version);
        // After the table has its outcome (see `handle_write`).
        if let Some(r) = w.request {
            self.shared.end_request(w.shard, r.id);
        }
        if w.answered {
            return; // repaired: its client was told the outcome is unknown
        }
        match published {
            Ok(_) => {
                let took_ns = self.metrics_now_ns().saturating_sub(w.arrived_ns);
                self.shared.stats.latency[w.command].observe_ns(took_ns);
                self.respond(
                    w.peer,
                    w.request_id,
                    Response::Ok {
                        version: w.version.0,
                    },
                )
            }
            Err(e) => self.reject(w.peer, w.request_id, ErrorCode::Internal, &e.to_string()),
        }
    }

    /// A write refused before it was appended: its version (if it took one) and
    /// its request are given back, and its client told why (`to`: peer, request).
    fn refuse_write(
        &mut self,
        shard: ShardId,
        version: Option<Version>,
        request: Option<RequestRecord>,
        to: (PeerId, u64),
        code: ErrorCode,
        detail: &str,
    ) {
        if let Some(v) = version {
            self.shared.versions.complete(shard, v);
        }
        if let Some(r) = request {
            self.shared.end_request(shard, r.id);
        }
        self.reject(to.0, to.1, code, detail);
    }

    /// Take the write in `slot` out for good, unpublished: its t-log entry is
    /// abandoned, its version completed and its request no longer in flight here.
    fn drop_write(&mut self, slot: u32) -> PendingWrite {
        let w = self.slots[slot as usize]
            .write
            .take()
            .expect("a write in the slot");
        self.release_slot(slot);
        self.shared.engine.abandon(w.addr);
        self.shared.versions.complete(w.shard, w.version);
        if let Some(r) = w.request {
            self.shared.end_request(w.shard, r.id);
        }
        w
    }

    fn release_slot(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        assert!(s.write.is_none(), "slot {slot} released while in use");
        s.generation = (s.generation + 1) & ((1 << GENERATION_BITS) - 1);
        self.free.push(slot);
        self.inflight -= 1;
    }

    /// Replicate again the writes whose replication failed, to every write target
    /// of the current configuration that does not have them yet, once their pause
    /// is over; a write of a shard this server no longer leads is abandoned (the
    /// new primary's promotion gathers it from the replicas that have it). Returns
    /// whether it did anything.
    fn repair(&mut self, now_ns: u64) -> bool {
        if self.repairs == 0 {
            return false;
        }
        let config = Arc::clone(&self.config);
        let mut did = false;
        for slot in 0..self.slots.len() as u32 {
            let due = self.slots[slot as usize]
                .write
                .as_ref()
                .is_some_and(|w| w.retry_at_ns.is_some_and(|t| now_ns >= t));
            if !due {
                continue;
            }
            did = true;
            self.repairs -= 1;
            let w = self.slots[slot as usize].write.as_mut().expect("due");
            w.retry_at_ns = None;
            let (shard, addr, len) = (w.shard, w.addr, w.len);
            // A migration's source goes on replicating it to the shard's
            // backups (a migration keeps them): published here once they all
            // have it, it is in the copy, and the hand-over waits for it. (A
            // shard that changed primary otherwise was promoted from a
            // replica, whose gather found it.)
            let me = self.shared.node;
            let Some(assignment) = config.shard(shard).filter(|a| {
                a.primary == me || config.migration(shard).is_some_and(|m| m.from == me)
            }) else {
                self.drop_write(slot);
                continue;
            };
            // The replicas of the current configuration, and which already have it.
            let had: Vec<NodeId> = (0..w.target_count)
                .filter(|&i| w.acked & (1 << i) != 0)
                .map(|i| w.targets[i])
                .collect();
            let count = assignment.write_target_count();
            assert!(count <= TARGETS_MAX, "{count} replicas of {shard}");
            w.target_count = count;
            w.acked = 0;
            for (i, b) in assignment.write_targets().enumerate() {
                w.targets[i] = b;
                if had.contains(&b) {
                    w.acked |= 1 << i;
                }
            }
            let missing: Vec<(usize, NodeId)> = (0..count)
                .filter(|&i| w.acked & (1 << i) == 0)
                .map(|i| (i, w.targets[i]))
                .collect();
            w.acks_left = missing.len();
            w.term = config.term.0;
            w.repairs += 1;
            w.sent_ns = self.shared.engine.config().clock.now_ns();
            tracing::debug!(worker = %self.name, %shard, version = %w.version, ?missing, "replicating a failed write again");
            if missing.is_empty() {
                self.finish(slot, now_ns);
                continue;
            }
            self.shared
                .engine
                .read_appended(addr, len, &mut self.entry_buf);
            let generation = self.slots[slot as usize].generation;
            let mut cx = ReplCtx {
                env: self.envelope(0),
                ep: &mut self.ep,
                now_ns,
            };
            for (i, b) in missing {
                let token = write_token(slot, i, generation);
                self.repl.replicate(&mut cx, b, &self.entry_buf, token);
            }
        }
        did
    }

    fn handle_replicate(&mut self, peer: PeerId, request_id: u64, sender: NodeId, entries: &[u8]) {
        if self.shared.strategy.backup_side() != BackupSide::Appender {
            let detail = format!("this cluster replicates by {}", self.shared.strategy);
            self.reject(peer, request_id, ErrorCode::Malformed, &detail);
            return;
        }
        // Every block must verify and belong to a shard this server backs up for
        // the sender — as a backup or a joining one, which takes every new write
        // too — before anything is appended. The source of the shard's
        // migration counts as its primary here: it completes the writes it
        // had in flight at the hand-over (`repair`).
        let config = Arc::clone(&self.config);
        let mut at = 0;
        while at < entries.len() {
            match entry::parse_block(&entries[at..]) {
                Ok((h, _)) => {
                    let ok = config.shard(h.shard).is_some_and(|s| {
                        (s.primary == sender
                            || config.migration(h.shard).is_some_and(|m| m.from == sender))
                            && s.write_targets().any(|b| b == self.shared.node)
                    });
                    if !ok {
                        let detail = format!("{} is not backed up here for {sender}", h.shard);
                        self.reject(peer, request_id, ErrorCode::NotPrimary, &detail);
                        return;
                    }
                    at += h.padded_len();
                }
                Err(e) => {
                    let detail = format!("entry at byte {at}: {e}");
                    self.reject(peer, request_id, ErrorCode::Malformed, &detail);
                    return;
                }
            }
        }
        match self.shared.engine.append_backup(self.index, entries) {
            Ok(sealed) => {
                if let Some(seg) = sealed {
                    self.shared.blog.enqueue_used(seg);
                }
                self.shared
                    .stats
                    .replicated_in
                    .fetch_add(1, Ordering::Relaxed);
                self.respond(peer, request_id, Response::Ok { version: 0 });
            }
            Err(e) => {
                let code = match e {
                    EngineError::OutOfSpace => ErrorCode::OutOfSpace,
                    _ => ErrorCode::Internal,
                };
                self.reject(peer, request_id, code, &e.to_string());
            }
        }
    }

    fn handle_grant(
        &mut self,
        peer: PeerId,
        request_id: u64,
        sender: NodeId,
        log: u32,
        sealed: Option<u32>,
        now_ns: u64,
    ) {
        if self.shared.strategy.backup_side() != BackupSide::RemoteLog {
            let detail = format!("this cluster replicates by {}", self.shared.strategy);
            self.reject(peer, request_id, ErrorCode::Malformed, &detail);
            return;
        }
        let config = Arc::clone(&self.config);
        if config.member(sender).is_none() || sender == self.shared.node {
            let detail = format!("{sender} is not a peer server");
            self.reject(peer, request_id, ErrorCode::Malformed, &detail);
            return;
        }
        if !self.shared.holds_log(sender, log) {
            // A log this server ended (another path of the sender arrived), or
            // a request to an earlier process of it: the sender dials anew.
            let detail = format!("no remote log {log} of {sender} here");
            self.reject(peer, request_id, ErrorCode::UnknownLog, &detail);
            return;
        }
        if let Some(seg) = sealed {
            // A segment not granted to this log (any more) was sealed before: a
            // sender sends a seal again when it lost the answer to the first.
            // Sealing is refused to anyone else.
            if self.shared.seal_grant(seg, sender, log) {
                self.shared.blog.enqueue_sealed(SegmentId(seg), now_ns);
            } else {
                tracing::debug!(worker = %self.name, seg, %sender, log, "a seal of a segment not granted to the log, ignored");
            }
        }
        // A log asking for segments without sealing them would take the pool
        // segment by segment (see `GRANTED_SEGMENTS_PER_LOG_MAX`).
        let held = self.shared.granted_to(sender, log);
        if held >= GRANTED_SEGMENTS_PER_LOG_MAX {
            let detail = format!(
                "log {log} of {sender} holds {held} unsealed segments, at most {GRANTED_SEGMENTS_PER_LOG_MAX}"
            );
            self.reject(peer, request_id, ErrorCode::Busy, &detail);
            return;
        }
        match self.shared.engine.alloc_remote_segment() {
            Ok((seg, offset)) => {
                if !self.shared.grant(seg.0, sender, log) {
                    // The log ended since it was checked: the segment was
                    // never written, and is digested (empty) and freed.
                    self.shared.blog.enqueue_sealed(seg, now_ns);
                    let detail = format!("remote log {log} of {sender} ended");
                    self.reject(peer, request_id, ErrorCode::UnknownLog, &detail);
                    return;
                }
                let len_bytes = self.shared.engine.config().segment_size_bytes as u64;
                self.respond(
                    peer,
                    request_id,
                    Response::Segment {
                        segment: seg.0,
                        offset: offset as u64,
                        len_bytes,
                    },
                );
            }
            Err(e) => self.reject(peer, request_id, ErrorCode::OutOfSpace, &e.to_string()),
        }
    }

    /// Worker 0: replicate ⟨shard, CommitVer⟩ of every primary shard whose
    /// CommitVer moved (§4.4).
    fn disseminate_commit_versions(&mut self, now_ns: u64) -> bool {
        if self.index != 0 || now_ns < self.last_commit_ns + self.shared.settings.commit_interval_ns
        {
            return false;
        }
        self.last_commit_ns = now_ns;
        let config = Arc::clone(&self.config);
        let mtu = self.shared.engine.config().mtu_bytes;
        let mut did = false;
        for s in config.primary_shards(self.shared.node) {
            // A shard being promoted or cold-started is not served yet: its
            // replicas' segments must stay uncommitted until its gather has read
            // them, so no CommitVer of it goes out (nor is noted here) before then.
            if !self.shared.shard_ready(s.shard) {
                continue;
            }
            let cv = self.shared.versions.commit_version(s.shard);
            // This server's own logs hold entries of the shard too.
            self.shared.blog.note_commit_version(s.shard, cv);
            let sent = &mut self.commit_sent[s.shard.0 as usize];
            if cv <= *sent {
                continue;
            }
            *sent = cv;
            if entry::encode(
                &mut self.entry_buf,
                Kind::Commit,
                s.shard,
                Version(cv),
                &[],
                &[],
                mtu,
            )
            .is_err()
            {
                continue;
            }
            let mut cx = ReplCtx {
                env: Envelope {
                    cluster_id: config.cluster_id,
                    term: config.term,
                    request_id: 0,
                    sender: self.shared.node,
                },
                ep: &mut self.ep,
                now_ns,
            };
            for b in s.write_targets() {
                self.repl
                    .replicate(&mut cx, b, &self.entry_buf, COMMIT_TOKEN);
            }
            did = true;
        }
        did
    }
}

impl<N: Nic> Task for Worker<N> {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, now_ns: u64) -> Step {
        if self.shared.stopped() {
            return Step::Done;
        }
        self.sync_config();
        let mut did = !self.acceptor.accept_pending(&mut self.ep).is_empty();
        let mut events = std::mem::take(&mut self.events);
        let mut data = std::mem::take(&mut self.data);
        match self.ep.poll(&mut events, &mut data) {
            Ok(n) => did |= n > 0,
            Err(e) => tracing::error!(worker = %self.name, error = %e, "polling"),
        }
        for ev in &events {
            match *ev {
                Event::Message { peer, start, len } => {
                    self.handle_message(peer, &data[start..start + len], now_ns)
                }
                Event::Owner(c) => {
                    let mut cx = ReplCtx {
                        env: self.envelope(0),
                        ep: &mut self.ep,
                        now_ns,
                    };
                    self.repl.on_completion(&mut cx, &c, &mut self.outcomes);
                }
                Event::SendFailed { peer, status } => {
                    tracing::debug!(worker = %self.name, ?peer, ?status, "send failed");
                    // Requests outstanding on that connection will not be answered.
                    let mut cx = ReplCtx {
                        env: self.envelope(0),
                        ep: &mut self.ep,
                        now_ns,
                    };
                    self.repl.on_send_failed(&mut cx, peer, &mut self.outcomes);
                }
            }
        }
        self.events = events;
        self.data = data;
        {
            let mut cx = ReplCtx {
                env: self.envelope(0),
                ep: &mut self.ep,
                now_ns,
            };
            did |= self.repl.tick(&mut cx, &mut self.outcomes);
        }
        did |= self.disseminate_commit_versions(now_ns);
        if self.shared.buggify("worker.defer-outcomes") {
            // ACKs and failures wait for a later step (slow ACK processing).
            return Step::Worked;
        }
        let acked = std::mem::take(&mut self.outcomes.acked);
        let failed = std::mem::take(&mut self.outcomes.failed);
        did |= !acked.is_empty() || !failed.is_empty();
        for t in &acked {
            self.on_outcome(*t, None, now_ns);
        }
        for (t, why) in failed {
            self.on_outcome(t, Some(why), now_ns);
        }
        did |= self.repair(now_ns);
        let mut acked = acked;
        acked.clear();
        self.outcomes.acked = acked;
        let oldest = if self.inflight == 0 {
            u64::MAX
        } else {
            self.slots
                .iter()
                .filter_map(|s| s.write.as_ref().map(|w| w.term))
                .min()
                .unwrap_or(u64::MAX)
        };
        self.shared.set_worker_oldest_term(self.index, oldest);
        if did {
            Step::Worked
        } else {
            Step::Idle
        }
    }
}
