//! What a server's roles share: the engine, the backup log, the configuration it
//! caches, versions, segment grants, counters, and the failover state — the
//! server's lease, the highest committed term, which shards it serves.
//!
//! # When a server answers (seed 000 §4.5)
//! A client request is served only while all of these hold ([`ServerShared::admit`]):
//! - the server's lease with the CM is valid, and stays valid for the lease
//!   margin ([`FailoverSettings::lease_margin`]) beyond now: it expires
//!   `lease_ns` after the server *sent* the renewal the CM granted, so it ends
//!   no later than the CM believes, and the CM waits for that (and the margin)
//!   before a new configuration takes effect. A worker checks it on the
//!   server's clock when a request arrives, and a GET again after reading the
//!   value, right before it answers ([`ServerShared::lease_refusal`]);
//! - the configuration it holds is committed (every server acknowledged it);
//!   between adopting a configuration and its commit the server blocks;
//! - the key's shard is served here: a promoted primary serves a shard only once
//!   promotion made every replica agree and built its index.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rowankv_engine::{entry, BackupLog, BackupLogConfig, Engine};
use rowankv_types::SegmentId;
use rowankv_wire::frame::ErrorCode;
use rustc_hash::FxHashSet;

use crate::events::EventLog;
use rowankv_fabric::Nic;
use rowankv_types::{Clock, NodeId, RequestId, ShardId, Term};

/// Stripes of the set of requests in flight (one lock each).
const REQUEST_STRIPES: usize = 64;
use rowankv_rpc::endpoint::EndpointConfig;
use rowankv_wire::config::{Config, ConfigSource};
use rowankv_wire::frame::{self, HEADER_BYTES};

use crate::replication::{BatchConfig, Strategy};
use crate::services::PathKey;
use crate::version::VersionBook;

pub use rowankv_wire::frame::KV_BYTES_MAX;

// The wire's bound fits the entry format's: a key and value the wire accepts,
// with the request record and an expiry time, fit one block of one RPC frame (the wire's record is
// the wider one: u64 fields, narrowed by the entry's 40-bit seq check).
const _: () = assert!(
    KV_BYTES_MAX + entry::HEADER_BYTES + entry::RECORD_BYTES_MAX
        <= (frame::FRAME_BYTES_MAX_DEFAULT - HEADER_BYTES) / entry::STRIDE_BYTES
            * entry::STRIDE_BYTES
);
const _: () = assert!(frame::REQUEST_BYTES >= entry::REQUEST_RECORD_BYTES);

/// A server's thread counts and timers.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub workers: usize,
    pub digests: usize,
    pub cleaners: usize,
    /// PUTs in flight per worker (waiting for backups' ACKs).
    pub inflight_max: usize,
    /// CommitVer dissemination period (§4.4: 15 ms).
    pub commit_interval_ns: u64,
    /// Control role period.
    pub control_interval_ns: u64,
    /// Clean role period.
    pub clean_interval_ns: u64,
    /// Time a cleaned segment waits before it is reused (readers in flight).
    pub clean_grace_ns: u64,
    /// Reuse the most recently freed segment first (`EngineConfig::reuse_newest_first`).
    pub reuse_newest_first: bool,
    /// Seed of the fault sites in the protocol roles ([`crate::buggify`]); set
    /// only by the simulator. `None`: every site is off.
    pub buggify_seed: Option<u64>,
    /// The clock the roles read where they decide on time — a worker admitting
    /// a request or checking its lease before an answer, the CM stamping a
    /// grant — none of them under a lock. `None`: the fabric's clock. Set only
    /// by the simulator, whose clock may preempt the role that reads it there
    /// and run the others meanwhile (a thread descheduled mid-step).
    pub role_clock: Option<Arc<dyn Clock>>,
    /// A deliberately broken engine for testing the simulator: a full t-log
    /// segment is committed at once, while its last entries may still wait for
    /// their ACKs. Never set outside tests.
    pub unsafe_commit_unsettled_tlog_segments: bool,
    pub batch: BatchConfig,
    pub endpoint: EndpointConfig,
    pub blog: BackupLogConfig,
    pub failover: FailoverSettings,
    /// How long a `Replicate` RPC (`rpc` strategy) may go unanswered before the
    /// write it carries fails (the client is told the outcome is unknown).
    /// `None`: twice the lease, by when a dead backup is out of the
    /// configuration. See [`ServerSettings::replicate_timeout`].
    pub replicate_timeout_ns: Option<u64>,
    /// The statistics window of the per-shard load reported to the CM
    /// (seed 000 §4.6: 500 ms).
    pub load_window_ns: u64,
    /// For tests (`drpc`): the redo role does not run, so replicated entries
    /// stay in the redo rings until the server restarts without it (or a
    /// failover walk drains them). A sender's window fills after 32 requests.
    pub test_hold_redo_role: bool,
}

impl ServerSettings {
    /// The bound on an unanswered `Replicate` RPC, in nanoseconds.
    pub fn replicate_timeout(&self) -> u64 {
        self.replicate_timeout_ns
            .unwrap_or(2 * self.failover.lease_ns)
    }

    /// `drpc`: how long the redo role may wait for room in the b-log, with
    /// acknowledged requests in its rings and none executed, before the
    /// server stops (a fail-stop: the rings keep the requests, the next start
    /// re-executes them from the segments held for that, and the failover of
    /// a stopped server moves its shards meanwhile). Twice the replication
    /// timeout: by then its senders have given their paths up.
    pub fn redo_stall_limit(&self) -> u64 {
        2 * self.replicate_timeout()
    }
}

/// The statistics window of seed 000 §4.6.
pub const LOAD_WINDOW_NS: u64 = 500_000_000;

/// Leases and failover timers.
///
/// The paper uses 10 ms leases on RDMA with one pinned core per role. Here every
/// role of three servers, the clients and the CMs share two cores, and a test or
/// a benchmark that recovers pool images on the same cores starves them for
/// 100 ms and more; a lease shorter than that evicts live servers. So the
/// default lease is 200 ms, renewed every 20 ms: nine renewals can be late
/// before a live server is declared failed. Failover time grows with the lease
/// (detection plus the wait for the failed server's lease); the failover
/// benchmark sets its own.
#[derive(Clone, Debug)]
pub struct FailoverSettings {
    /// A server's lease with the CM.
    pub lease_ns: u64,
    /// How often a server renews it.
    pub renew_ns: u64,
    /// The CM's lease in the coordination store (renewed every quarter of it).
    pub cm_lease_ns: u64,
    /// Resend period of unanswered control messages (prepare, gather, install).
    pub retry_ns: u64,
    /// How long before its lease ends a server stops answering, and how much
    /// longer than a lease the CM counts on a grant (`None`: a tenth of
    /// `lease_ns`; see [`FailoverSettings::lease_margin`]). It must stay below
    /// `lease_ns`.
    pub lease_margin_ns: Option<u64>,
    /// A deliberately broken server for testing the checker: it serves without
    /// a valid lease. Never set outside tests.
    pub unsafe_serve_without_lease: bool,
    /// A deliberately broken server for testing the simulator: it executes every
    /// write that arrives, ignoring request records (no exactly-once retries).
    /// Never set outside tests.
    pub unsafe_ignore_request_ids: bool,
    /// A deliberately broken server for testing the simulator: a write whose
    /// replication failed is abandoned at once (its version completed, so
    /// CommitVer passes an entry some replicas lack). Never set outside tests.
    pub unsafe_abandon_failed_writes: bool,
    /// A deliberately broken server for testing the simulator: a worker counts
    /// a write in flight only at the end of its step, not before it reads the
    /// configuration the write uses, so a re-replication copy may be taken
    /// while the write is mid-step and miss it. Never set outside tests.
    pub unsafe_announce_writes_late: bool,
    /// When a CM becomes active, it counts every member as granted a lease
    /// this much later than now: servers that are still starting (a process
    /// formatting its pool) are not failed before they could ask. Safe: a
    /// later grant only makes a failover wait longer. 0 in one process.
    pub startup_grace_ns: u64,
    /// Dynamic resharding (seed 000 §4.6): the active CM commits the moves
    /// its load detection plans (`rowankv_cm::plan_reshard`). Off by
    /// default: the CM then only detects and reports an overload, and
    /// operators move shards with `rowankv reshard`.
    pub reshard_auto: bool,
    /// A server is overloaded above `(1 + reshard_overload) ×` the average
    /// load (paper: 0.30).
    pub reshard_overload: f64,
    /// A plan moves shards until every server is within `(1 +
    /// reshard_within) ×` the average (paper: 0.05), or no move helps.
    pub reshard_within: f64,
}

impl FailoverSettings {
    /// The lease margin, in nanoseconds (`docs/failover.md`, "Leases"). A server
    /// stops answering this long before its lease ends on its own clock, and
    /// the CM counts a grant as live this long after the lease ends on its
    /// clock, and grants only leases that end this long before its own CM lease
    /// does. It absorbs what the lease arithmetic does not see: the two clocks
    /// running at different rates (a drift rate bound of ρ needs a margin of
    /// about ρ × `lease_ns` on each side; the default tenth of the lease
    /// allows 10 %, far beyond the 200 ppm of ordinary crystals), and the time
    /// between a role reading its clock and acting on it.
    pub fn lease_margin(&self) -> u64 {
        self.lease_margin_ns.unwrap_or(self.lease_ns / 10)
    }
}

impl Default for FailoverSettings {
    fn default() -> Self {
        FailoverSettings {
            lease_ns: 200_000_000,
            renew_ns: 20_000_000,
            cm_lease_ns: 800_000_000,
            retry_ns: 5_000_000,
            lease_margin_ns: None,
            unsafe_serve_without_lease: false,
            unsafe_abandon_failed_writes: false,
            unsafe_ignore_request_ids: false,
            unsafe_announce_writes_late: false,
            startup_grace_ns: 0,
            reshard_auto: false,
            reshard_overload: 0.30,
            reshard_within: 0.05,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            workers: 4,
            digests: 2,
            cleaners: 1,
            inflight_max: 64,
            commit_interval_ns: 15_000_000,
            control_interval_ns: 100_000,
            clean_interval_ns: 20_000_000,
            clean_grace_ns: 10_000_000,
            reuse_newest_first: false,
            buggify_seed: None,
            role_clock: None,
            unsafe_commit_unsettled_tlog_segments: false,
            batch: BatchConfig::default(),
            endpoint: EndpointConfig::default(),
            blog: BackupLogConfig::default(),
            failover: FailoverSettings::default(),
            replicate_timeout_ns: None,
            load_window_ns: LOAD_WINDOW_NS,
            test_hold_redo_role: false,
        }
    }
}

/// Exponential latency buckets of [`LatencyHistogram`]: bucket `i` counts
/// observations of at most `1 µs · 2^i` (1 µs to 8.4 s), the last one the rest.
pub const LATENCY_BUCKETS: usize = 24;

/// A latency histogram that the hot path fills with two relaxed atomic adds:
/// no lock, no allocation (prometheus-client's `Histogram` takes a lock per
/// observation). Read at scrape time; the count is the sum of the buckets.
#[derive(Default, Debug)]
pub struct LatencyHistogram {
    /// Observations per bucket ([`LATENCY_BUCKETS`]), then those above the last bound.
    buckets: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_ns: AtomicU64,
}

impl LatencyHistogram {
    /// Record one observation of `ns` nanoseconds.
    pub fn observe_ns(&self, ns: u64) {
        self.buckets[Self::bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The smallest `i` with `ns <= 1000 · 2^i`, or [`LATENCY_BUCKETS`].
    pub fn bucket_of(ns: u64) -> usize {
        let us = ns.div_ceil(1000);
        let i = if us <= 1 {
            0
        } else {
            (u64::BITS - (us - 1).leading_zeros()) as usize
        };
        i.min(LATENCY_BUCKETS)
    }

    /// The upper bound of bucket `i` in seconds (`+Inf` for the last).
    pub fn bound_seconds(i: usize) -> f64 {
        if i >= LATENCY_BUCKETS {
            f64::INFINITY
        } else {
            1e-6 * (1u64 << i) as f64
        }
    }

    /// (upper bound in seconds, observations in that bucket alone) for every
    /// bucket, the last `+Inf`; and the sum of the observations in seconds.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, f64) {
        let buckets = (0..=LATENCY_BUCKETS)
            .map(|i| {
                (
                    Self::bound_seconds(i),
                    self.buckets[i].load(Ordering::Relaxed),
                )
            })
            .collect();
        (buckets, self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9)
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
}

/// Error codes counted per command: the wire's codes are below this (a code
/// at or above it is counted in the last slot).
pub const ERROR_CODE_SLOTS: usize = 32;

/// Per-shard load of the current statistics window (seed 000 §4.6): the
/// client requests received as the shard's primary, and the replication
/// writes sent for it (one per entry per backup: a backup's CPU may never see
/// them, so the primary counts them for it). The lease role reports and
/// resets them every `ServerSettings::load_window_ns`.
#[derive(Debug)]
pub struct ShardLoads {
    counts: Vec<[AtomicU64; 2]>,
}

impl ShardLoads {
    pub fn new(shards: u16) -> ShardLoads {
        ShardLoads {
            counts: (0..shards)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
        }
    }

    pub fn note_request(&self, shard: ShardId) {
        if let Some(c) = self.counts.get(shard.0 as usize) {
            c[0].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn note_replication(&self, shard: ShardId, writes: u64) {
        if let Some(c) = self.counts.get(shard.0 as usize) {
            c[1].fetch_add(writes, Ordering::Relaxed);
        }
    }

    /// The window's counts of the shards that had any, reset to zero.
    pub fn take(&self) -> Vec<(ShardId, u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let r = c[0].swap(0, Ordering::Relaxed);
                let w = c[1].swap(0, Ordering::Relaxed);
                (r + w > 0).then_some((ShardId(i as u16), r, w))
            })
            .collect()
    }
}

/// Counters of one server. The per-command arrays are indexed by the
/// `ServerStats::CMD_*` constants; their label names are [`ServerStats::COMMANDS`].
#[derive(Default, Debug)]
pub struct ServerStats {
    pub puts: AtomicU64,
    pub dels: AtomicU64,
    pub gets: AtomicU64,
    pub replicated_in: AtomicU64,
    pub grants: AtomicU64,
    /// Requests answered with an error, by reason.
    pub rejected_stale_term: AtomicU64,
    pub rejected_not_primary: AtomicU64,
    pub rejected_malformed: AtomicU64,
    pub rejected_too_large: AtomicU64,
    pub rejected_other: AtomicU64,
    pub replication_failures: AtomicU64,
    pub rejected_blocked: AtomicU64,
    /// Entries installed by promotion, re-replication and cold start.
    pub installed: AtomicU64,
    /// Requests a worker received, by command (decoded or not).
    pub requests: [AtomicU64; ServerStats::COMMANDS.len()],
    /// Error answers of the workers, by command and error code (`code as u8`).
    pub errors: [[AtomicU64; ERROR_CODE_SLOTS]; ServerStats::COMMANDS.len()],
    /// Client requests from their arrival at a worker (the start of the step
    /// that read them) to their answer, by command; a write's answer comes
    /// after its last replica's ACK. Only successful answers are timed.
    pub latency: [LatencyHistogram; ServerStats::COMMANDS.len()],
    /// From replicating a write to one backup to that backup's durable ACK.
    pub replication_ack: LatencyHistogram,
    /// Shards this server started to serve after a promotion or a cold start
    /// (their replicas made to agree first).
    pub shards_served: AtomicU64,
    /// Promotions and cold starts of shards under way here (a gauge).
    pub recoveries_in_progress: AtomicU64,
    /// Re-replication to joining backups: copies under way (a gauge), their
    /// pages still to be acknowledged (a gauge), copies finished and the
    /// entries they carried.
    pub copies_in_progress: AtomicU64,
    pub copy_pages_remaining: AtomicU64,
    pub copies_done: AtomicU64,
    pub copy_entries_done: AtomicU64,
    /// GETs a migration's target sent back that this server, the source,
    /// answered from the index it still holds (§4.6).
    pub migration_reads: AtomicU64,
    /// The cleaners' passes: segments cleaned, entries and bytes moved, and
    /// segments freed (the bytes freed are these times the segment size).
    pub cleaner_segments_cleaned: AtomicU64,
    pub cleaner_entries_moved: AtomicU64,
    pub cleaner_bytes_moved: AtomicU64,
    pub cleaner_segments_freed: AtomicU64,
}

impl ServerStats {
    /// Label values of the per-command counters, in index order.
    pub const COMMANDS: [&'static str; 9] = [
        "get",
        "put",
        "del",
        "put_if",
        "del_if",
        "scan",
        "replicate",
        "grant",
        "other",
    ];
    pub const CMD_GET: usize = 0;
    pub const CMD_PUT: usize = 1;
    pub const CMD_DEL: usize = 2;
    pub const CMD_PUT_IF: usize = 3;
    pub const CMD_DEL_IF: usize = 4;
    pub const CMD_SCAN: usize = 5;
    pub const CMD_REPLICATE: usize = 6;
    pub const CMD_GRANT: usize = 7;
    /// Ping, a frame that did not decode, a message for the control role.
    pub const CMD_OTHER: usize = 8;

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// The command index of a request of `msg_type` (a wire `MsgType` byte).
    pub fn command_of(msg_type: frame::MsgType) -> usize {
        use frame::MsgType as M;
        match msg_type {
            M::Get => Self::CMD_GET,
            M::Put => Self::CMD_PUT,
            M::Del => Self::CMD_DEL,
            M::PutIf => Self::CMD_PUT_IF,
            M::DelIf => Self::CMD_DEL_IF,
            M::Scan => Self::CMD_SCAN,
            M::Replicate => Self::CMD_REPLICATE,
            M::GrantSegment => Self::CMD_GRANT,
            _ => Self::CMD_OTHER,
        }
    }

    /// Count a request of command `command`.
    pub fn count_request(&self, command: usize) {
        self.requests[command].fetch_add(1, Ordering::Relaxed);
    }

    /// Count an error answer `code` to a request of command `command`.
    pub fn count_error(&self, command: usize, code: ErrorCode) {
        let slot = (code as usize).min(ERROR_CODE_SLOTS - 1);
        self.errors[command][slot].fetch_add(1, Ordering::Relaxed);
    }

    /// The label value of error code slot `slot` (snake case of the wire's
    /// name), or `None` for a slot no code has.
    pub fn error_code_name(slot: usize) -> Option<String> {
        let code = ErrorCode::from_u8(u8::try_from(slot).ok()?)?;
        let mut name = String::new();
        for (i, ch) in format!("{code:?}").chars().enumerate() {
            if ch.is_ascii_uppercase() && i > 0 {
                name.push('_');
            }
            name.push(ch.to_ascii_lowercase());
        }
        Some(name)
    }

    /// Add up what one clean pass did.
    pub fn count_clean(&self, r: &rowankv_engine::CleanReport) {
        self.cleaner_segments_cleaned
            .fetch_add(r.segments_cleaned as u64, Ordering::Relaxed);
        self.cleaner_entries_moved
            .fetch_add(r.entries_moved, Ordering::Relaxed);
        self.cleaner_bytes_moved
            .fetch_add(r.bytes_moved, Ordering::Relaxed);
        self.cleaner_segments_freed
            .fetch_add(r.segments_freed as u64, Ordering::Relaxed);
    }
}

/// What every role of one server shares.
pub struct ServerShared<N: Nic> {
    pub node: NodeId,
    pub engine: Arc<Engine>,
    pub blog: Arc<BackupLog<N>>,
    pub strategy: Strategy,
    pub settings: ServerSettings,
    pub versions: VersionBook,
    pub stats: ServerStats,
    /// This statistics window's per-shard load ([`ShardLoads`]).
    pub load: ShardLoads,
    config: RwLock<Arc<Config>>,
    /// Bumped whenever `config` is replaced, so roles can cache it and check one
    /// atomic instead of taking the lock per request.
    config_epoch: AtomicU64,
    cm: Arc<dyn ConfigSource>,
    /// Segments granted to remote logs: segment → (sender, log id).
    grants: Mutex<HashMap<u32, (NodeId, u32)>>,
    /// The remote logs other servers hold here ([`Self::accept_writer`]).
    /// Locked before `grants`.
    remote_logs: Mutex<RemoteLogs>,
    /// This server process, told to the backups it dials: random, so a
    /// restarted server is told apart from the one before it.
    pub incarnation: u64,
    stopped: AtomicBool,
    /// Why the server stopped itself ([`ServerShared::fail_stop`]).
    fail_stopped: Mutex<Option<String>>,
    /// Fault sites: random in the simulator, forced by tests, else off.
    pub buggify: crate::buggify::Buggify,
    /// `drpc`: the redo rings other servers' entries land in (set once, when
    /// the server is assembled; see `replication::redo`).
    pub redo: std::sync::OnceLock<Mutex<crate::replication::RedoRings<N>>>,
    /// Writes with a request record in flight here (appended, not yet published
    /// or abandoned), striped by hash: a duplicate that arrives meanwhile is
    /// answered `Busy` and retried by its client, never executed a second time.
    requests_in_flight: Vec<Mutex<FxHashSet<(ShardId, RequestId)>>>,
    /// The server's lease ends here (ns on the cluster's clock).
    lease_until_ns: AtomicU64,
    /// Fault injection: the lease role does nothing until here (a thread that
    /// is not scheduled), while the other roles run.
    lease_role_paused_until_ns: AtomicU64,
    /// Fault injection: a migration from here hands over but copies nothing
    /// while set (`hold_migration_copy`).
    migration_copy_held: AtomicBool,
    /// The highest term known committed (every server acknowledged it).
    committed_term: AtomicU64,
    /// The CM removed this server: it never serves again.
    evicted: AtomicBool,
    /// Per shard: served here (false while a promotion or cold start is
    /// gathering the shard).
    shard_ready: Vec<AtomicBool>,
    /// Per worker: the oldest term under which one of its writes in flight
    /// started (`u64::MAX`: none). Re-replication waits for older writes.
    worker_oldest_term: Vec<AtomicU64>,
    /// t-log and per-thread b-log segments that were being filled when the pool
    /// was last recovered: their entries may be missing on other replicas.
    pub recovered_open: Vec<SegmentId>,
    pub events: Arc<EventLog>,
    /// The cluster's clock (the one the roles are stepped on): leases are
    /// checked against it when a request is answered.
    clock: Arc<dyn Clock>,
}

impl<N: Nic> ServerShared<N> {
    /// A server starting with `config` (committed). `recovered`: the pool was
    /// recovered after a crash (cold start) — its primary shards are served only
    /// after their replicas agree again; `open` lists the segments that were
    /// being filled at the crash.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: NodeId,
        engine: Arc<Engine>,
        blog: Arc<BackupLog<N>>,
        strategy: Strategy,
        settings: ServerSettings,
        config: Arc<Config>,
        cm: Arc<dyn ConfigSource>,
        recovered: Option<Vec<SegmentId>>,
        events: Arc<EventLog>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let shards = engine.config().shard_count;
        let versions = VersionBook::new(
            (0..shards).map(|s| engine.next_version(ShardId(s)).map_or(1, |v| v.0)),
        );
        let shard_ready = (0..shards)
            .map(|s| {
                let primary = config.shard(ShardId(s)).is_some_and(|a| a.primary == node);
                AtomicBool::new(!(recovered.is_some() && primary))
            })
            .collect();
        let buggify = match settings.buggify_seed {
            Some(seed) => crate::buggify::Buggify::new(seed, node),
            None => crate::buggify::Buggify::off(),
        };
        let worker_oldest_term = (0..settings.workers)
            .map(|_| AtomicU64::new(u64::MAX))
            .collect();
        let committed_term = AtomicU64::new(config.term.0);
        let incarnation = rand::random();
        ServerShared {
            lease_until_ns: AtomicU64::new(0),
            lease_role_paused_until_ns: AtomicU64::new(0),
            migration_copy_held: AtomicBool::new(false),
            committed_term,
            evicted: AtomicBool::new(false),
            shard_ready,
            worker_oldest_term,
            recovered_open: recovered.unwrap_or_default(),
            events,
            clock,
            node,
            engine,
            blog,
            strategy,
            settings,
            versions,
            stats: ServerStats::default(),
            load: ShardLoads::new(shards),
            config: RwLock::new(config),
            config_epoch: AtomicU64::new(0),
            cm,
            grants: Mutex::new(HashMap::new()),
            remote_logs: Mutex::new(RemoteLogs::new(incarnation)),
            incarnation,
            stopped: AtomicBool::new(false),
            fail_stopped: Mutex::new(None),
            buggify,
            redo: std::sync::OnceLock::new(),
            requests_in_flight: (0..REQUEST_STRIPES)
                .map(|_| Mutex::new(FxHashSet::default()))
                .collect(),
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.read().clone()
    }

    /// Run `f` on the configuration while no other can be adopted: what `f`
    /// decides from it stays true until it returns (a replication path is
    /// accepted only from a member, and `adopt` destroys a removed member's
    /// paths under the same lock, so none is accepted after its fence).
    pub fn with_config<T>(&self, f: impl FnOnce(&Config) -> T) -> T {
        f(&self.config.read())
    }

    /// Changes whenever the configuration is replaced.
    pub fn config_epoch(&self) -> u64 {
        // Sequentially consistent: see `note_write_started`.
        self.config_epoch.load(Ordering::SeqCst)
    }

    pub fn term(&self) -> Term {
        self.config.read().term
    }

    /// Fetch the configuration from the coordination store and adopt it if it is
    /// newer.
    pub fn refresh_config(&self) -> Arc<Config> {
        if let Ok(c) = self.cm.fetch() {
            self.adopt(c);
        }
        self.config()
    }

    /// Adopt `next` if it is newer (seed 000 §4.5 phase 1): destroy the
    /// connections of removed servers, so that nothing they still send lands here;
    /// stop serving shards this server is newly primary of until promotion; block
    /// until the configuration is committed. Returns whether it was adopted.
    pub fn adopt(&self, next: Arc<Config>) -> bool {
        let mut cur = self.config.write();
        if next.term <= cur.term {
            return false;
        }
        // The engine's shard count is fixed when its pool is formatted (resharding
        // moves ranges, never adds shards to an engine): a configuration with
        // another count cannot be served here, and adopting it would index past
        // every per-shard table.
        let engine_shards = self.shard_ready.len();
        if next.shards.len() != engine_shards {
            tracing::error!(
                server = %self.node,
                term = %next.term,
                shards = next.shards.len(),
                engine_shards,
                "refusing a configuration whose shard count differs from the engine's"
            );
            return false;
        }
        for m in &cur.members {
            if next.member(m.node).is_none() && m.node != self.node {
                let (closed, sealed) = self.end_remote_logs_of(m.node);
                let rings = self.redo.get().map_or(0, |r| r.lock().disconnect(m.node));
                tracing::info!(server = %self.node, removed = %m.node, closed, sealed, rings, "connections destroyed");
            }
        }
        for s in &next.shards {
            let was = cur.shard(s.shard).is_some_and(|o| o.primary == self.node);
            if s.primary == self.node && !was {
                self.shard_ready[s.shard.0 as usize].store(false, Ordering::Release);
            }
        }
        *cur = next;
        self.config_epoch.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// The time now on the cluster's clock, read where a role decides on it
    /// (never under a lock: the simulator's role clock may preempt the
    /// reader here, see [`ServerSettings::role_clock`]).
    pub fn now_ns(&self) -> u64 {
        self.settings
            .role_clock
            .as_ref()
            .unwrap_or(&self.clock)
            .now_ns()
    }

    /// Why a client request must not be served at `now_ns`, if it must not.
    pub fn admit(&self, now_ns: u64, term: Term) -> Option<(ErrorCode, &'static str)> {
        if self.evicted.load(Ordering::Acquire) {
            return Some((
                ErrorCode::NotMember,
                "this server was removed from the cluster",
            ));
        }
        if let Some(why) = self.lease_refusal(now_ns) {
            return Some(why);
        }
        if self.committed_term.load(Ordering::Acquire) < term.0 {
            return Some((ErrorCode::Blocked, "configuration not committed yet"));
        }
        None
    }

    /// Why nothing may be answered at `now_ns` for want of a lease, if so: the
    /// lease has ended, or ends within the margin
    /// ([`FailoverSettings::lease_margin`]).
    pub fn lease_refusal(&self, now_ns: u64) -> Option<(ErrorCode, &'static str)> {
        let f = &self.settings.failover;
        if f.unsafe_serve_without_lease {
            return None;
        }
        let until = self.lease_until_ns.load(Ordering::Acquire);
        if now_ns >= until {
            return Some((ErrorCode::Blocked, "lease expired"));
        }
        if now_ns + f.lease_margin() >= until {
            return Some((ErrorCode::Blocked, "lease ends within the margin"));
        }
        None
    }

    /// Whether `shard` is served here (not gathering after promotion or a crash).
    pub fn shard_ready(&self, shard: ShardId) -> bool {
        self.shard_ready
            .get(shard.0 as usize)
            .is_some_and(|r| r.load(Ordering::Acquire))
    }

    pub(crate) fn set_shard_ready(&self, shard: ShardId) {
        if let Some(r) = self.shard_ready.get(shard.0 as usize) {
            r.store(true, Ordering::Release);
        }
    }

    /// Extend the lease to `until_ns` (never shortens it).
    pub fn extend_lease(&self, until_ns: u64) {
        self.lease_until_ns.fetch_max(until_ns, Ordering::AcqRel);
    }

    /// Fault injection: hold the lease role still until `until_ns` — as a
    /// thread of it that is not scheduled — while every other role runs.
    pub fn pause_lease_role(&self, until_ns: u64) {
        self.lease_role_paused_until_ns
            .store(until_ns, Ordering::Release);
    }

    /// Fault injection (tests): while `hold` is set, a migration from this
    /// server hands its shard over and copies none of its entries, so the
    /// target serves the shard with none of them (its GETs go to the source).
    pub fn hold_migration_copy(&self, hold: bool) {
        self.migration_copy_held.store(hold, Ordering::Release);
    }

    pub(crate) fn migration_copy_held(&self) -> bool {
        self.migration_copy_held.load(Ordering::Acquire)
    }

    pub(crate) fn lease_role_paused(&self, now_ns: u64) -> bool {
        now_ns < self.lease_role_paused_until_ns.load(Ordering::Acquire)
    }

    pub fn lease_until_ns(&self) -> u64 {
        self.lease_until_ns.load(Ordering::Acquire)
    }

    pub fn committed_term(&self) -> Term {
        Term(self.committed_term.load(Ordering::Acquire))
    }

    /// Every server acknowledged `term`: unblock.
    pub fn commit_term(&self, term: Term) {
        self.committed_term.fetch_max(term.0, Ordering::AcqRel);
    }

    /// The CM says `committed` is committed (a `Commit`, or a lease answer):
    /// fetch a newer configuration first. Only a term this server holds can be
    /// committed here: one it could not fetch yet stays blocked.
    pub fn learn_committed(&self, committed: Term) {
        if committed > self.term() {
            self.refresh_config();
        }
        self.commit_term(committed.min(self.term()));
    }

    /// The CM removed this server: stop serving for good, and stop every role.
    pub fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.stop();
    }

    pub fn evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    pub(crate) fn set_worker_oldest_term(&self, worker: usize, term: u64) {
        if let Some(t) = self.worker_oldest_term.get(worker) {
            t.store(term, Ordering::Release);
        }
    }

    /// A worker is about to start a write under a configuration of `term` or
    /// later: counted among its writes in flight before it reads the
    /// configuration the write will use. With `writes_since` this is a Dekker
    /// pair (sequentially consistent on both sides, with the configuration epoch
    /// between): either the worker's fresh read of the configuration sees the
    /// term a copy waits for — and the write goes to the joining backup too — or
    /// the copy sees this announcement and waits for the write.
    pub(crate) fn note_write_started(&self, worker: usize, term: u64) {
        if let Some(t) = self.worker_oldest_term.get(worker) {
            t.fetch_min(term, Ordering::SeqCst);
        }
    }

    /// Whether every write in flight started under `term` or later.
    pub(crate) fn writes_since(&self, term: Term) -> bool {
        self.worker_oldest_term
            .iter()
            .all(|t| t.load(Ordering::SeqCst) >= term.0)
    }

    /// Stop every role (a clean stop, or a crash in tests).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Stop because going on would be unsafe or hopeless (a fail-stop): every
    /// role stops as in [`ServerShared::stop`], and `why` is kept for whoever
    /// runs the server (a process exits with it).
    pub fn fail_stop(&self, why: String) {
        tracing::error!(node = %self.node, why, "stopping this server");
        self.fail_stopped.lock().get_or_insert(why);
        self.stop();
    }

    /// Why the server stopped itself, if it did.
    pub fn fail_stopped(&self) -> Option<String> {
        self.fail_stopped.lock().clone()
    }

    fn request_stripe(
        &self,
        shard: ShardId,
        id: RequestId,
    ) -> &Mutex<FxHashSet<(ShardId, RequestId)>> {
        let h = id
            .client
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(id.seq)
            .wrapping_add(u64::from(shard.0) << 48);
        &self.requests_in_flight[(h % REQUEST_STRIPES as u64) as usize]
    }

    /// Mark request `id` of `shard` in flight here; false if it already is.
    pub(crate) fn start_request(&self, shard: ShardId, id: RequestId) -> bool {
        self.request_stripe(shard, id).lock().insert((shard, id))
    }

    /// Request `id` of `shard` is published or abandoned here.
    pub(crate) fn end_request(&self, shard: ShardId, id: RequestId) {
        let removed = self.request_stripe(shard, id).lock().remove(&(shard, id));
        assert!(removed, "{id:?} of {shard} ended without being started");
    }

    /// Whether fault site `site` fires now (always false outside the simulator).
    pub fn buggify(&self, site: &'static str) -> bool {
        self.buggify.fire(site)
    }

    /// Grant `segment` to `sender`'s remote log `log`; `false` (nothing
    /// granted) if that log is not one the sender holds here, or no longer
    /// (checked under the lock that ends logs, so no segment is granted to a
    /// log after its segments were sealed).
    pub(crate) fn grant(&self, segment: u32, sender: NodeId, log: u32) -> bool {
        let logs = self.remote_logs.lock();
        if !logs.holds(sender, log) {
            return false;
        }
        self.grants.lock().insert(segment, (sender, log));
        self.stats.grants.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// `drpc`: execute everything that has landed in the redo rings, so that
    /// the b-logs hold every entry a ring acknowledged. Called before a walk of
    /// the b-logs looks for a shard's uncommitted entries (promotion, cold
    /// start, a new primary's gather). Returns how many requests it executed,
    /// or why some wait (the b-log is out of room): the walk must wait too.
    pub fn drain_redo(&self) -> Result<usize, String> {
        self.redo.get().map_or(Ok(0), |r| r.lock().drain())
    }

    /// The ids of the remote logs `sender` holds here, in order.
    pub fn remote_logs_of(&self, sender: NodeId) -> Vec<u32> {
        let logs = self.remote_logs.lock();
        let mut ids: Vec<u32> = logs
            .senders
            .get(&sender)
            .map(|s| s.logs.values().copied().collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Whether `log` is a remote log `sender` holds here.
    pub(crate) fn holds_log(&self, sender: NodeId, log: u32) -> bool {
        self.remote_logs.lock().holds(sender, log)
    }

    /// Take back a grant being sealed; `false` if `segment` was not granted to
    /// (`sender`, `log`).
    pub(crate) fn seal_grant(&self, segment: u32, sender: NodeId, log: u32) -> bool {
        let mut g = self.grants.lock();
        if g.get(&segment) == Some(&(sender, log)) {
            g.remove(&segment);
            true
        } else {
            false
        }
    }

    /// End every remote log of `sender` — a server just removed — and close
    /// its paths here, so nothing more lands in them; then seal the segments
    /// granted to them, so that they are digested, committed once their
    /// entries are, and reused, instead of being held for good. Returns how
    /// many paths were closed and segments sealed.
    fn end_remote_logs_of(&self, sender: NodeId) -> (usize, usize) {
        let mut logs = self.remote_logs.lock();
        logs.senders.remove(&sender);
        let closed = self.blog.disconnect(sender);
        (closed, self.seal_grants(|s, _| s == sender))
    }

    /// Seal the segments granted to the logs `which` (sender, log id) names.
    fn seal_grants(&self, which: impl Fn(NodeId, u32) -> bool) -> usize {
        let now = self.clock.now_ns();
        let mut grants = self.grants.lock();
        let mut theirs: Vec<u32> = grants
            .iter()
            .filter(|(_, &(s, l))| which(s, l))
            .map(|(&seg, _)| seg)
            .collect();
        theirs.sort_unstable();
        for &seg in &theirs {
            grants.remove(&seg);
            self.blog.enqueue_sealed(SegmentId(seg), now);
        }
        theirs.len()
    }

    /// Keep `qp`, a passive queue pair just connected to worker `key.worker` of
    /// `sender`, which WRITEs through it into the segments granted to a remote
    /// log. Returns the id of that log, which the answer carries
    /// ([`crate::services::encode_log_answer`]) and the sender names in its
    /// segment requests.
    ///
    /// A sender dials again when its path failed twice (it may have been this
    /// server that restarted), when it restarted itself, or when this server
    /// refused a log it had ended (`UnknownLog`). What it wrote through the
    /// path it replaces is over: that log is ended — its id refused from now
    /// on, so a seal or grant request still on its way from the old path can
    /// touch nothing of the new one — and its segments sealed, after every
    /// path that could still land a WRITE in them is closed (WRITEs already
    /// under way there fail):
    /// - `rwrite`, `batch` (a log per worker): that worker's log, its old path
    ///   closed; the worker gets a log with a new id;
    /// - `share` (one log all the sender's workers write): the shared log,
    ///   every path of the sender closed; its workers each dial again (their
    ///   WRITEs fail, their segment requests are refused) and share a new one;
    /// - another process of the sender (a restarted sender, or a stale request
    ///   of an earlier one): every path and every log of the process before.
    pub(crate) fn accept_writer(&self, qp: N::Qp, sender: NodeId, key: PathKey) -> u32 {
        let share = self.strategy == Strategy::Share;
        let mut logs = self.remote_logs.lock();
        let RemoteLogs { senders, next } = &mut *logs;
        let mut new_log = || {
            let id = *next;
            *next = next.wrapping_add(1);
            id
        };
        let theirs = senders.entry(sender).or_insert_with(|| SenderLogs {
            incarnation: key.incarnation,
            logs: HashMap::new(),
        });
        let restarted = theirs.incarnation != key.incarnation;
        let replaced = theirs.logs.contains_key(&key.worker);
        let mut ended: Vec<u32> = Vec::new();
        if restarted || (share && replaced) {
            let closed = self.blog.disconnect(sender);
            ended.extend(theirs.logs.values().copied());
            theirs.logs.clear();
            theirs.incarnation = key.incarnation;
            tracing::info!(%sender, worker = key.worker, restarted, closed, "every replication path of the server closed: its remote logs here end");
        }
        // Closes the path this worker had (`rwrite`, `batch`).
        self.blog.accept_writer_as(qp, key.worker);
        let log = if share {
            let shared = theirs.logs.values().next().copied();
            let log = shared.unwrap_or_else(&mut new_log);
            theirs.logs.insert(key.worker, log);
            log
        } else {
            let log = new_log();
            ended.extend(theirs.logs.insert(key.worker, log));
            log
        };
        ended.sort_unstable();
        ended.dedup();
        let sealed = if restarted {
            self.seal_grants(|s, _| s == sender)
        } else {
            self.seal_grants(|s, l| s == sender && ended.binary_search(&l).is_ok())
        };
        if sealed > 0 {
            tracing::info!(%sender, worker = key.worker, sealed, "segments of an ended remote log sealed");
        }
        log
    }

    /// Segments granted to remote logs and not sealed (being filled now).
    /// Segments granted to (`sender`, `log`) and not sealed yet.
    pub(crate) fn granted_to(&self, sender: NodeId, log: u32) -> usize {
        self.grants
            .lock()
            .values()
            .filter(|&&(s, l)| s == sender && l == log)
            .count()
    }

    pub fn granted_segments(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.grants.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }
}

/// The remote logs other servers hold at this one (the WRITE strategies):
/// which ids are live, so that a segment request naming an ended one is
/// refused ([`ServerShared::accept_writer`]).
struct RemoteLogs {
    senders: HashMap<NodeId, SenderLogs>,
    /// The id the next log gets. Ids start from this process's incarnation,
    /// so a request still on its way to an earlier process of this server is
    /// unlikely to name a log of this one (and the logs it names are refused).
    next: u32,
}

/// One sender's remote logs here.
struct SenderLogs {
    /// Its process ([`PathKey::incarnation`]).
    incarnation: u64,
    /// The log each of its workers writes into: its own (`rwrite`, `batch`),
    /// or the one they share (`share`).
    logs: HashMap<u16, u32>,
}

impl RemoteLogs {
    fn new(incarnation: u64) -> Self {
        RemoteLogs {
            senders: HashMap::new(),
            next: (incarnation >> 32) as u32,
        }
    }

    fn holds(&self, sender: NodeId, log: u32) -> bool {
        self.senders
            .get(&sender)
            .is_some_and(|s| s.logs.values().any(|&l| l == log))
    }
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    #[test]
    fn latencies_fall_in_the_smallest_bucket_that_holds_them() {
        assert_eq!(LatencyHistogram::bucket_of(0), 0);
        assert_eq!(LatencyHistogram::bucket_of(1000), 0);
        assert_eq!(LatencyHistogram::bucket_of(1001), 1);
        assert_eq!(LatencyHistogram::bucket_of(2000), 1);
        assert_eq!(LatencyHistogram::bucket_of(2001), 2);
        assert_eq!(LatencyHistogram::bucket_of(1_000_000), 10);
        assert_eq!(LatencyHistogram::bucket_of(u64::MAX), LATENCY_BUCKETS);
        for ns in [1u64, 999, 1500, 4096, 70_000, 3_000_000, 9_000_000_000] {
            let i = LatencyHistogram::bucket_of(ns);
            let s = ns as f64 / 1e9;
            assert!(s <= LatencyHistogram::bound_seconds(i), "{ns} in {i}");
            assert!(
                i == 0 || s > LatencyHistogram::bound_seconds(i - 1),
                "{ns} in {i}"
            );
        }
        let h = LatencyHistogram::default();
        h.observe_ns(1500);
        h.observe_ns(u64::MAX / 2);
        assert_eq!(h.count(), 2);
        let (b, _) = h.snapshot();
        assert_eq!(b.len(), LATENCY_BUCKETS + 1);
        assert_eq!(b[1].1, 1);
        assert_eq!(b[LATENCY_BUCKETS], (f64::INFINITY, 1));
    }

    #[test]
    fn error_codes_have_snake_case_names() {
        assert_eq!(
            ServerStats::error_code_name(ErrorCode::StaleTerm as usize).as_deref(),
            Some("stale_term")
        );
        assert_eq!(ServerStats::error_code_name(0), None);
        let s = ServerStats::default();
        s.count_error(ServerStats::CMD_PUT, ErrorCode::Busy);
        assert_eq!(ServerStats::get(&s.errors[1][ErrorCode::Busy as usize]), 1);
    }
}
