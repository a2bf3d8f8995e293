//! The deterministic whole-cluster simulation.
//!
//! One seed decides everything: the cluster (servers, two CMs, clients) runs on
//! the loopback fabric and the crash simulator with a manual clock, and one
//! thread steps every role in an order drawn from the seed, advancing time by
//! amounts drawn from the seed (a little while anything is busy, more when all
//! is idle). Faults are drawn from the same generator:
//!
//! | fault | what happens |
//! | --- | --- |
//! | server crash | its NIC leaves the fabric, its roles stop for good; in three crashes of ten, a power failure follows within four leases (mid-failover) |
//! | pause | a server's roles are not stepped for a while — 1.5 to 6 leases, sometimes, so that it resumes believing it is still primary |
//! | link cut | two nodes (servers, CMs, clients) cannot reach each other until healed |
//! | delay | one link delays every operation: up to 8 ms (ACKs held while logs roll and the cleaner runs), 40–300 ms on a client's link (a request arrives after its retry) |
//! | CM crash | the active CM stops; a standby takes over; the crashed one restarts later as a standby |
//! | server restart | in four crashes of ten (when no power failure follows; strategies `rowan` and `rpc`), the crashed server is restarted on its pool within its lease: still a member, at a new NIC whose queue pairs its peers and clients must dial anew. It joins first (a join desk answers, perhaps from a view that lacks it) and decides from its pool's identity record, as `rowankv server` does (`rowankv_deploy::join::Restart`): recovered, unless that record and the answer say the CM removed it |
//! | power failure | every server loses power: pools keep only what was persisted (the crash simulator drops every unpersisted line), the cluster cold-starts from them |
//! | late restart | with [`SimConfig::late_restarts`], a crashed server neither restarted within its lease nor followed by a power failure is restarted 1.5 to 4 leases after its crash: removed by then, it joins again as `rowankv server` does (`crate::rejoin`) — through a join desk whose view of the configuration is reloaded every 50 ms (so it may answer from an older term, as a member that rejoined, and queue nothing), waiting to be a member with `rowankv_deploy::join::MembershipWait` on the simulated clock and asking again when told to — and comes back on its pool as its identity record (stale mark, member term: persisted in the simulated pool as in a real one) and the signs it met decide — formatted, as a joining backup; a run ends only once it is a member again (else it is reported unavailable) |
//! | filled restart | with [`SimConfig::late_restarts`], a server that came back as a joining backup (given a backup to fill by an operator's move if it holds none, once the cluster is whole) is killed as soon as a fill installed entries in it, before the CM promotes it, and restarted at once within its lease: a join desk whose view predates its return may answer that it adds it, which is no news of a removal (its pool's member term is newer), so its pool is recovered and the fill goes on; [`PlantedBug::IgnoreMemberTerm`] formats it, and the CM promotes a replica that lacks what was installed before |
//!
//! | fault site | a seeded `buggify` site inside a role fires (`rowankv_server::buggify`) |
//! | client retry | a write of unknown outcome is sent again by a new client on a new connection, with its request id |
//! | preemption | a role's read of its clock mid-step runs the other roles for up to a few milliseconds before it answers (`crate::preempt`): a thread descheduled between two things it does |
//! | backup move | an operator moves one backup of a shard to another server while a role of the shard's primary is preempted mid-step; the new backup is copied, then audited |
//! | CM partition | a server cannot reach any CM for two to four leases; clients and servers still reach it |
//! | migration | with [`SimConfig::migrations`], an operator moves a shard's primary to a server that holds none of it (dynamic resharding, seed 000 §4.6) once the cluster is settled: hand-over, GETs sent back to the source, copy and finish run among every other fault (crashes and pauses of either end roll it back, a power failure resumes it after the cold start) |
//!
//! Faults that remove a server for good (a crash, a pause or a CM link cut
//! longer than the lease) are limited so that every shard keeps a full replica.
//! The seed also picks the replication strategy (seed mod 5) and, for every other
//! group of five seeds, a small pool (8 KiB segments, a busy cleaner, freed
//! segments reused newest first, padded values).
//!
//! Clients run closed loops of puts, gets and deletes over a few keys and record
//! each operation with its call and return times (simulated), its outcome and the
//! term of the answering configuration. After the operations, every fault is
//! healed and every key is read back, then written once more: a key that takes
//! no write is reported unavailable (a wedge keeps every acknowledged write, so
//! no safety check would see it). The history is checked by [`crate::check`];
//! the cluster itself by `replicas_agree`: every shard's full backups index what
//! its primary indexes, and no replica's request table shows a request executed
//! twice. Whenever a shard gains a full backup during the run (a move or a
//! failover's re-replication done) and is settled, the clients start no new
//! operation on its keys until their last ones finish, and it is audited: the
//! new backup must hold, for every key its primary indexes, that version or a
//! later one — a copy that missed an acknowledged write is reported before a
//! client reads it or a later write hides it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_client::{Client, ClientConfig, ClientError, Completed, Op, Output};
use rowankv_cm::{ConfigManager, CoordStore, EmbeddedStore};
use rowankv_deploy::cluster::CmDesk;
use rowankv_deploy::join::{
    full_replica, Awaited, Decision, MembershipWait, PoolRecord, Restart, Sign,
};
use rowankv_deploy::{build, ClusterConfig, Owner, Parts, Recovered, CLIENT_NODE_BASE};
use rowankv_engine::{Engine, Identity};
use rowankv_fabric::{Fabric, FaultInjector, LoopbackFabric, LoopbackNic};
use rowankv_pmem::{Medium, Pool, PoolOptions, PowerFailure};
use rowankv_server::node::{assemble, roles_on_demand, ServerSpec};
use rowankv_server::{
    EventKind, EventLog, FailoverSettings, Placement, ServerSettings, ServerShared, Step, Strategy,
};
use rowankv_types::{Clock, NodeId, RequestId, SegmentId, ShardId, Term};
use rowankv_wire::config::{Config, Member};

use crate::check::{check, ConfigCommit, Report};
use crate::history::{History, OpKind, Operation, Status};
use crate::preempt::{Interjection, Policy, Roles, SimClock};
use crate::rejoin::{Answer, JoinDesk, Rejoining, ASK_EVERY_NS, DESK_RELOAD_NS, READ_EVERY_NS};

/// A deliberately broken build, to show that the checks catch what they claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedBug {
    /// Servers serve without a valid lease (a paused primary answers after the
    /// CM replaced it).
    ServeWithoutLease,
    /// A full t-log segment is committed at once, although its last entries may
    /// still wait for their ACKs: the cleaner frees them before they are indexed.
    CommitUnsettledTlogSegments,
    /// A write whose replication failed is abandoned at once: CommitVer passes
    /// an entry some replicas lack, a promotion does not gather it and reuses
    /// its version.
    AbandonFailedWrites,
    /// Servers execute every write that arrives, ignoring request records: a
    /// write delayed past its client's retry executes again, later.
    IgnoreRequestIds,
    /// A worker counts a write in flight only at the end of its step, so a
    /// re-replication copy taken while the write is mid-step misses it, and
    /// the write goes only to the old term's backups.
    AnnounceWritesLate,
    /// A restarting server ignores its pool's member term
    /// (`rowankv_deploy::join::Restart::unsafe_ignore_member_term`), as before
    /// it was recorded: a joining backup restarted within its lease, answered
    /// by a join desk whose view lags and lacks it, believes the CM removed
    /// it, marks its pool stale and formats it, while the CM promotes it to a
    /// full replica on its primary's word that its fill completed.
    IgnoreMemberTerm,
}

impl PlantedBug {
    pub const ALL: [PlantedBug; 6] = [
        PlantedBug::ServeWithoutLease,
        PlantedBug::CommitUnsettledTlogSegments,
        PlantedBug::AbandonFailedWrites,
        PlantedBug::IgnoreRequestIds,
        PlantedBug::AnnounceWritesLate,
        PlantedBug::IgnoreMemberTerm,
    ];

    /// The name `rowankv sim --planted` takes.
    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::ServeWithoutLease => "serve-without-lease",
            PlantedBug::CommitUnsettledTlogSegments => "commit-unsettled-tlog-segments",
            PlantedBug::AbandonFailedWrites => "abandon-failed-writes",
            PlantedBug::IgnoreRequestIds => "ignore-request-ids",
            PlantedBug::AnnounceWritesLate => "announce-writes-late",
            PlantedBug::IgnoreMemberTerm => "ignore-member-term",
        }
    }
}

impl std::str::FromStr for PlantedBug {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PlantedBug::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PlantedBug::ALL.iter().map(|p| p.name()).collect();
                format!("unknown planted bug {s:?} (one of {})", names.join(", "))
            })
    }
}

/// What one simulated run does.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Client operations, not counting the final read-back.
    pub ops: usize,
    pub clients: usize,
    pub keys: usize,
    pub servers: usize,
    pub faults: bool,
    /// Every fault is a stall of the whole machine (a test of failure detection).
    pub stalls_only: bool,
    /// Roles are preempted inside their steps now and then (with `faults`).
    pub preempt: bool,
    pub planted: Option<PlantedBug>,
    /// The replication strategy; `None`: drawn from the seed (all six in turn).
    pub strategy: Option<Strategy>,
    /// About a third of PUTs carry an expiry time ([`expiry_of_value`]), far
    /// past the run's end: values never expire, but entries with a request
    /// record and an expiry time (log entry format 7) travel every path —
    /// replication, digest, cleaning, failover, recovery and the index's key
    /// check. Off in [`SimConfig::new`], so that runs pinned to a seed replay
    /// as they were found; `rowankv sim` turns it on.
    pub expiring_puts: bool,
    /// Some crashed servers are restarted only after the CM removed them
    /// (1.5 to 4 leases after the crash): they join again through a join
    /// desk whose view of the configuration may be older than the CM's, wait
    /// to be members (asking again when answered from a stale view, or when
    /// the CM that took the join crashed), and come back as joining backups
    /// on formatted pools (as their pools' identity records decide); such a
    /// backup is then killed mid-fill and restarted within its lease
    /// (`FaultCounts::filled_restarts`). Drawn from a generator of their own, so a seed's
    /// other faults are drawn as without them, but a run with one unfolds
    /// differently from then on; off in [`SimConfig::new`], so that runs
    /// pinned to a seed replay as they were found.
    pub late_restarts: bool,
    /// Now and then (drawn from a generator of its own, like late restarts)
    /// an operator moves a shard's primary to another server: a migration
    /// (`rowankv_cm::plan_migrate`). Off in [`SimConfig::new`], so that runs
    /// pinned to a seed replay as they were found; `rowankv sim` turns it on.
    pub migrations: bool,
}

/// The expiry time a simulated PUT of `value` carries when
/// [`SimConfig::expiring_puts`] is on: ten years past the simulated clock's
/// origin for about a third of values, chosen by the value alone so that a
/// write sent again carries the same time.
pub fn expiry_of_value(value: &str) -> Option<u64> {
    const TEN_YEARS_MS: u64 = 10 * 365 * 24 * 3600 * 1000;
    let h = value
        .bytes()
        .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32));
    (h % 3 == 0).then_some(rowankv_types::MANUAL_CLOCK_UNIX_MS_ORIGIN + TEN_YEARS_MS)
}

impl SimConfig {
    pub fn new(seed: u64, ops: usize) -> SimConfig {
        SimConfig {
            seed,
            ops,
            clients: 4,
            keys: 12,
            servers: 5,
            faults: true,
            stalls_only: false,
            preempt: true,
            planted: None,
            strategy: None,
            expiring_puts: false,
            late_restarts: false,
            migrations: false,
        }
    }

    /// The strategy this run replicates with.
    ///
    /// Drawn from the seed: one seed in six (seed mod 6 = 5) runs `drpc`, the
    /// others the strategy seed mod 5 gave them before `drpc` existed, so that
    /// the seeds the regression tests pin and the seeds that catch the planted
    /// bugs keep their runs.
    pub fn strategy(&self) -> Strategy {
        self.strategy.unwrap_or(if self.seed % 6 == 5 {
            Strategy::Drpc
        } else {
            Strategy::ALL[(self.seed % 5) as usize]
        })
    }

    /// Whether this run uses the small-pool profile: 8 KiB segments in a 1 MiB
    /// pool and a cleaner every millisecond, so t-log and b-log segments fill,
    /// commit, are cleaned and are reused many times while writes wait for ACKs.
    /// Groups of five seeds, as when there were five strategies: the pinned
    /// seeds of the regression tests keep their pool profile.
    pub fn small_segments(&self) -> bool {
        (self.seed / 5) % 2 == 1
    }
}

/// Faults injected in one run, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub crashes: u32,
    pub pauses: u32,
    pub long_pauses: u32,
    pub link_cuts: u32,
    pub delays: u32,
    pub cm_crashes: u32,
    pub power_failures: u32,
    /// The whole machine stopped (no role, no client runs) while time went on.
    pub stalls: u32,
    /// Writes of unknown outcome sent again through a new client's connection.
    pub client_retries: u32,
    /// Roles preempted inside a step while the others ran.
    pub preemptions: u32,
    /// `drpc`: requests the redo rings deferred for want of room in the
    /// b-log (the `redo.no-room` fault site, or a full b-log), counted over
    /// the servers running at the end.
    pub redo_deferrals: u64,
    /// Backups an operator moved to another server (re-replication).
    pub moves: u32,
    /// Crashed servers restarted on their pools within their lease (still
    /// members): their peers must dial their new incarnation.
    pub restarts: u32,
    /// Crashed servers restarted after the CM removed them: they join again
    /// through a join desk (`crate::rejoin`) and come back as joining backups.
    pub rejoins: u32,
    /// Of these, joins asked again by a server still not a member
    /// `rejoin_after` after its join was answered (answered from a stale
    /// view of the configuration, or lost with the CM that took it).
    pub rejoins_asked_again: u32,
    /// Servers that came back as joining backups, killed as a primary
    /// reported one of their fills done (before the CM promoted them) and
    /// restarted at once, within their lease, through a join desk.
    pub filled_restarts: u32,
    /// Migrations of a shard's primary an operator started
    /// ([`SimConfig::migrations`]), and those the CM saw through to the end.
    pub migrations: u32,
    pub migrations_finished: u32,
}

impl FaultCounts {
    pub fn total(&self) -> u32 {
        self.crashes
            + self.pauses
            + self.long_pauses
            + self.link_cuts
            + self.delays
            + self.cm_crashes
            + self.power_failures
            + self.restarts
            + self.rejoins
            + self.filled_restarts
            + self.stalls
            + self.client_retries
            + self.preemptions
            + self.moves
            + self.migrations
    }
}

/// The outcome of one run.
pub struct RunResult {
    pub seed: u64,
    pub history: History,
    pub report: Report,
    pub faults: FaultCounts,
    pub terms: u64,
    pub sim_ns: u64,
    /// A one-line description of what was injected, in order.
    pub fault_log: Vec<String>,
    /// The stored configuration at the end of the run.
    pub config: Option<Arc<Config>>,
}

const LEASE_NS: u64 = 20_000_000;

/// How long a server that joined waits to be a member before it asks the CMs
/// again: what `rowankv server` waits under the simulated lease.
fn rejoin_after() -> Duration {
    rowankv_deploy::server::rejoin_after(LEASE_NS / 1_000_000)
}
/// Faults come at about one per this many client operations.
const OPS_PER_FAULT: f64 = 150.0;
const CLIENT_TIMEOUT: Duration = Duration::from_millis(120);
/// A client sends an unanswered attempt again after this (same request record).
const CLIENT_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(30);
/// The chance that a role's read of its clock mid-step preempts it.
const PREEMPT_PER_READ: f64 = 0.03;
/// The same while a reconfiguration the simulator started is under way, for
/// this long after it started.
/// A planned move waits this long for its primary to be preempted.
const MOVE_WAIT_NS: u64 = 20_000_000;
/// The chance that a read of the clock by a role of that primary preempts it
/// for the move.
const MOVE_PREEMPT_PER_READ: f64 = 0.5;
/// Drains of a server's redo rings at the end of a run before acknowledged
/// requests still waiting in them count as a server that stopped making
/// progress.
const DRAIN_ATTEMPTS: usize = 200;
/// An audit waits at most this long for the cluster to settle.
const AUDIT_WAIT_NS: u64 = 40_000_000;

fn settings(sim: &SimConfig, clock: &Arc<SimClock>) -> ServerSettings {
    let planted = sim.planted;
    let small = sim.small_segments();
    let mut s = ServerSettings {
        workers: 2,
        cleaners: 1,
        inflight_max: 16,
        commit_interval_ns: 2_000_000,
        control_interval_ns: 100_000,
        clean_interval_ns: if small { 1_000_000 } else { 5_000_000 },
        clean_grace_ns: if small { 200_000 } else { 10_000_000 },
        reuse_newest_first: small,
        buggify_seed: Some(sim.seed),
        role_clock: Some(clock.clone()),
        unsafe_commit_unsettled_tlog_segments: planted
            == Some(PlantedBug::CommitUnsettledTlogSegments),
        failover: FailoverSettings {
            lease_ns: LEASE_NS,
            renew_ns: 2_000_000,
            cm_lease_ns: 4 * LEASE_NS,
            retry_ns: 1_000_000,
            lease_margin_ns: None,
            unsafe_serve_without_lease: planted == Some(PlantedBug::ServeWithoutLease),
            unsafe_abandon_failed_writes: planted == Some(PlantedBug::AbandonFailedWrites),
            unsafe_ignore_request_ids: planted == Some(PlantedBug::IgnoreRequestIds),
            unsafe_announce_writes_late: planted == Some(PlantedBug::AnnounceWritesLate),
            startup_grace_ns: 0,
            reshard_auto: false,
            ..FailoverSettings::default()
        },
        ..ServerSettings::default()
    };
    s.blog.posted_segments = 6;
    s.blog.digest_count = 1;
    s.blog.grace_ns = 500_000;
    s
}

fn cluster_config(sim: &SimConfig, clock: &Arc<SimClock>) -> ClusterConfig {
    ClusterConfig {
        cluster_id: 0x5349_4d00 ^ sim.seed,
        servers: sim.servers,
        shards_per_server: 2,
        replication_factor: 3,
        strategy: sim.strategy(),
        settings: settings(sim, clock),
        pool_bytes: if sim.small_segments() {
            // `drpc` holds segments back for its redo rings' replay (all the
            // rings can hold, appended one request to an 8 KiB segment: about
            // 60 of a 1 MiB pool's 100): twice the pool, so that what is left
            // for writes is about what the other strategies have.
            if sim.strategy() == Strategy::Drpc {
                2 << 20
            } else {
                1 << 20
            }
        } else {
            24 << 20
        },
        segment_bytes: if sim.small_segments() {
            8 << 10
        } else {
            256 << 10
        },
        media_model: None,
        crash_sim: true,
        dir: None,
        placement: Placement::Shared { threads: 1 },
        keys_per_shard_expected: 64,
        cms: 2,
        // The simulator builds its fabric itself, on its clock.
        wire_model: None,
    }
}

/// A move's shard, from, to, and whether its configuration was committed.
type MoveOutcome = (ShardId, NodeId, NodeId, Result<(), String>);

/// A client's closed loop.
struct SimClient {
    id: u32,
    client: Client<LoopbackNic>,
    /// The operation in flight: its record so far.
    current: Option<(rowankv_client::OpId, Operation)>,
    next_value: u64,
}

struct Paused {
    node: NodeId,
    until_ns: u64,
}

/// A server that came back as a joining backup, until a primary reports one
/// of its fills done.
struct FillWatch {
    node: NodeId,
    /// Until when an operator moves a backup to it, if it came back joining
    /// no shard (its shards were re-replicated elsewhere while it was down):
    /// rebalancing onto the server that just came back.
    move_until_ns: Option<u64>,
}

/// A whole simulated cluster.
struct World {
    rng: ChaCha8Rng,
    clock: Arc<SimClock>,
    /// The clock as the fabric, the store, the engines and the clients read it
    /// (never preempting).
    plain_clock: Arc<dyn Clock>,
    config: ClusterConfig,
    store: Arc<dyn CoordStore>,
    events: Arc<EventLog>,
    parts: Parts,
    tasks: Roles,
    clients: Vec<SimClient>,
    keys: Vec<String>,
    history: History,
    paused: Vec<Paused>,
    /// Links cut or delayed, and when to heal them.
    links: Vec<(NodeId, NodeId, u64)>,
    removed: usize,
    faults: FaultCounts,
    fault_log: Vec<String>,
    cm_restart_at: Option<(usize, u64)>,
    /// A power failure scheduled while a failover is under way.
    power_failure_at: Option<u64>,
    /// A crashed server to restart on its pool, when, and whether late (after
    /// its lease: [`SimConfig::late_restarts`]).
    restart_at: Option<(NodeId, u64, bool)>,
    /// Per CM (in the order of `parts.cm_crash`): its join desk.
    desks: Vec<JoinDesk>,
    /// A removed server on its way back.
    rejoining: Option<Rejoining>,
    /// [`SimConfig::late_restarts`], and its generator.
    late_restarts: bool,
    late_rng: ChaCha8Rng,
    /// [`SimConfig::migrations`], and its generator.
    migrations: bool,
    migration_rng: ChaCha8Rng,
    /// Rejoins that never made the server a member again.
    rejoin_failures: Vec<String>,
    /// A server that came back as a joining backup, watched until a primary
    /// reports one of its fills done: then it is killed and restarted at once
    /// ([`World::watch_fill`]).
    fill_watch: Option<FillWatch>,
    planted: Option<PlantedBug>,
    next_client_node: u32,
    /// Client ids handed out (request records): never reused in a run.
    next_client_id: u64,
    /// Clients replaced by a new connection, kept so that what they sent is
    /// still delivered (a delayed write arrives after its retry).
    retired: Vec<Client<LoopbackNic>>,
    stalls_only: bool,
    /// Every shard's full backups as last seen in the stored configuration,
    /// and its term: a backup that appears there was just copied.
    seen_backups: (Term, Vec<Vec<NodeId>>),
    /// Shards with a new full backup to audit once no client operation on
    /// them is in flight, and since when.
    audits: Vec<(ShardId, u64)>,
    /// Settled shards waiting for their audit: no new operation on them.
    held: Vec<ShardId>,
    /// What the audits found wrong.
    audit_failures: Vec<String>,
    /// Moves under way: the shard and its new backup. Each counts as a removal
    /// until the new backup is a full one.
    moving: Vec<(ShardId, NodeId)>,
    /// A move planned, waiting for its primary to be preempted: until when.
    pending_move: Option<u64>,
    /// What the planned move's commit gave.
    move_outcome: Arc<std::sync::Mutex<Option<MoveOutcome>>>,
    /// Values padded to up to this many bytes, so that logs fill segments fast
    /// (the small-pool profile) or entries span several blocks (`drpc` runs);
    /// 0: short values.
    value_pad_max: usize,
    /// [`SimConfig::expiring_puts`].
    expiring_puts: bool,
}

impl World {
    fn new(sim: &SimConfig) -> World {
        let clock = SimClock::new(1_000_000);
        let dyn_clock = clock.plain();
        let config = cluster_config(sim, &clock);
        let store: Arc<dyn CoordStore> = Arc::new(EmbeddedStore::in_memory(dyn_clock.clone()));
        let events = Arc::new(EventLog::new());
        let fabric = LoopbackFabric::with_clock(dyn_clock.clone());
        let mut parts = build(&config, fabric, store.clone(), None, events.clone())
            .expect("building the simulated cluster");
        let tasks = Roles::new(std::mem::take(&mut parts.tasks));
        if sim.faults && sim.preempt {
            clock.set_policy(Some(Policy {
                per_read: PREEMPT_PER_READ,
                rng: ChaCha8Rng::seed_from_u64(sim.seed ^ 0x7072_6565_6d70_7421),
            }));
        }
        let keys = (0..sim.keys).map(|k| format!("k{k}")).collect();
        let mut w = World {
            rng: ChaCha8Rng::seed_from_u64(sim.seed),
            clock,
            plain_clock: dyn_clock,
            config,
            store,
            events,
            parts,
            tasks,
            clients: Vec::new(),
            keys,
            history: History { ops: Vec::new() },
            paused: Vec::new(),
            links: Vec::new(),
            removed: 0,
            faults: FaultCounts::default(),
            fault_log: Vec::new(),
            cm_restart_at: None,
            power_failure_at: None,
            restart_at: None,
            desks: Vec::new(),
            rejoining: None,
            late_restarts: sim.late_restarts,
            late_rng: ChaCha8Rng::seed_from_u64(sim.seed ^ 0x6c61_7465_2072_6a6e),
            migrations: sim.migrations,
            migration_rng: ChaCha8Rng::seed_from_u64(sim.seed ^ 0x6d69_6772_6174_6521),
            rejoin_failures: Vec::new(),
            fill_watch: None,
            planted: sim.planted,
            next_client_node: 0,
            next_client_id: 0,
            retired: Vec::new(),
            stalls_only: sim.stalls_only,
            seen_backups: (Term(0), Vec::new()),
            audits: Vec::new(),
            held: Vec::new(),
            audit_failures: Vec::new(),
            moving: Vec::new(),
            pending_move: None,
            move_outcome: Arc::default(),
            value_pad_max: match (sim.strategy() == Strategy::Drpc, sim.small_segments()) {
                // `drpc` runs: values over the 4 KiB MTU, so entries of two
                // and three blocks travel every path — replicated in pieces,
                // appended apart, straddling b-log segments. (The other
                // strategies keep the runs their pinned seeds were found in.)
                (true, true) => 6000,
                (true, false) => 10_000,
                (false, true) => 2400,
                (false, false) => 0,
            },
            expiring_puts: sim.expiring_puts,
        };
        let now = w.clock.now_ns();
        for s in &w.parts.servers {
            s.extend_lease(now + LEASE_NS);
        }
        // Each server's pool records its identity and the term of the first
        // configuration, as `rowankv server` records them when it first comes
        // up as a member.
        let first = w.parts.source.fetch().expect("the first configuration");
        for s in &w.parts.servers {
            let pool = s.engine.pool();
            rowankv_engine::write_identity(pool, w.identity(s.node)).expect("an identity");
            rowankv_engine::record_member_term(pool, first.term.0).expect("a member term");
        }
        w.desks = (0..w.parts.cm_crash.len())
            .map(|_| JoinDesk::new(w.parts.source.as_ref(), now))
            .collect();
        for id in 0..sim.clients as u32 {
            let c = w.connect_client(id);
            w.clients.push(c);
        }
        w
    }

    fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    fn connect_client(&mut self, id: u32) -> SimClient {
        let node = NodeId(CLIENT_NODE_BASE + self.next_client_node);
        self.next_client_node += 1;
        self.next_client_id += 1;
        let client_id = self.next_client_id;
        let nic = self.parts.fabric.attach(node).expect("attaching a client");
        let now = self.now();
        let paused: Vec<NodeId> = self.paused.iter().map(|p| p.node).collect();
        let cells = self
            .tasks
            .cells(|owner| !matches!(owner, Owner::Server(n) if paused.contains(&n)));
        let mut pump = || {
            for cell in &cells {
                crate::preempt::step_cell(cell, now);
            }
        };
        let client = Client::connect_pumped(
            nic,
            self.parts.directory.clone(),
            self.parts.source.clone(),
            ClientConfig {
                timeout: CLIENT_TIMEOUT,
                inflight_max: 1,
                retries_max: 8,
                worker_hint: id as usize,
                backoff: Duration::from_micros(200),
                clock: self.plain_clock.clone(),
                attempt_timeout: CLIENT_ATTEMPT_TIMEOUT,
                // Never reused in a run, across reconnections and cold starts:
                // the servers' request tables outlive a client.
                client_id: Some(client_id),
                ..ClientConfig::default()
            },
            &mut pump,
        )
        .expect("connecting a simulated client");
        SimClient {
            id,
            client,
            current: None,
            next_value: 0,
        }
    }

    fn is_paused(&self, owner: Owner) -> bool {
        matches!(owner, Owner::Server(n) if self.paused.iter().any(|p| p.node == n))
    }

    /// Step every runnable role once, in a random order. Whether any worked.
    /// A role may be preempted mid-step, at a read of its clock, while the
    /// others run on (`crate::preempt`).
    fn step_roles(&mut self) -> bool {
        self.step_rejoin();
        self.watch_fill();
        let now = self.now();
        let paused: Vec<NodeId> = self.paused.iter().map(|p| p.node).collect();
        self.clock.set_runnable(
            self.tasks
                .cells(|owner| !matches!(owner, Owner::Server(n) if paused.contains(&n))),
        );
        let mut order: Vec<usize> = (0..self.tasks.len()).collect();
        order.shuffle(&mut self.rng);
        let mut did = false;
        let mut done = Vec::new();
        for i in order {
            let owner = self.tasks.owner(i);
            if self.is_paused(owner) {
                continue;
            }
            // A role the loop steps is free: none is mid-step between steps.
            match self.clock.step(owner, self.tasks.cell(i), now) {
                Some(Step::Worked) => did = true,
                Some(Step::Done) => done.push(i),
                Some(Step::Idle) | None => {}
            }
        }
        // The clock holds no role between steps: the roles hold the clock (a
        // cycle would keep every pool of the run alive).
        self.clock.set_runnable(Vec::new());
        self.tasks.remove(done);
        did
    }

    /// Clients: collect completions, start new operations while `more`.
    fn step_clients(&mut self, issued: &mut usize, budget: usize) -> bool {
        let now = self.now();
        let held_config = if self.held.is_empty() {
            None
        } else {
            self.parts.source.fetch().ok()
        };
        let mut did = false;
        let mut out = Vec::new();
        // A new client connects to every member at once (as a simulated client
        // must): only while every member runs.
        let reachable = self.members().iter().all(|n| {
            !self.paused.iter().any(|p| p.node == *n)
                && self
                    .parts
                    .servers
                    .iter()
                    .any(|s| s.node == *n && !s.stopped())
        });
        for ci in 0..self.clients.len() {
            out.clear();
            self.clients[ci].client.poll(&mut out);
            let mut retry = None;
            for c in out.drain(..) {
                did = true;
                let sc = &mut self.clients[ci];
                let Some((id, mut op)) = sc.current.take() else {
                    continue;
                };
                debug_assert_eq!(id, c.id);
                // A write of unknown outcome is sent again, as an application
                // would, through a new connection of a new client, with its
                // request id: one operation in the history, from its first call.
                if let (Err(e), Some(request)) = (&c.result, c.request) {
                    if e.is_unknown() && reachable && self.rng.gen_bool(0.5) {
                        retry = Some((op, request));
                        continue;
                    }
                }
                op.ret = now;
                op.term = c.term.0;
                match (&c.result, op.op) {
                    (Ok(Output::Value { value, .. }), OpKind::Get) => {
                        op.status = Status::Ok;
                        op.output = Some(String::from_utf8_lossy(value).into_owned());
                    }
                    (Err(ClientError::NotFound), OpKind::Get) => {
                        op.status = Status::Ok;
                        op.output = None;
                    }
                    (Ok(_), _) => op.status = Status::Ok,
                    (Err(e), _) if e.is_unknown() => op.status = Status::Unknown,
                    (Err(_), _) => op.status = Status::Fail,
                }
                if op.status != Status::Ok {
                    op.term = 0;
                }
                self.history.push(op);
            }
            if let Some((op, request)) = retry {
                self.retry_through_a_new_connection(ci, op, request);
                did = true;
            }
            if self.clients[ci].current.is_none() && *issued < budget {
                let key = self.keys[self.rng.gen_range(0..self.keys.len())].clone();
                if held_config
                    .as_ref()
                    .is_some_and(|c| self.held.contains(&c.shard_for_key(key.as_bytes()).shard))
                {
                    continue;
                }
                let roll: u32 = self.rng.gen_range(0..100);
                let pad = match self.value_pad_max {
                    0 => 0,
                    max => self.rng.gen_range(0..max),
                };
                let expiring = self.expiring_puts;
                let sc = &mut self.clients[ci];
                let (kind, client_op, value) = if roll < 45 {
                    sc.next_value += 1;
                    let v = format!("c{}-{}{}", sc.id, sc.next_value, ".".repeat(pad));
                    (
                        OpKind::Put,
                        Op::Put {
                            expires_at_ms: expiring.then(|| expiry_of_value(&v)).flatten(),
                            key: key.clone().into_bytes(),
                            value: v.clone().into_bytes(),
                        },
                        Some(v),
                    )
                } else if roll < 55 {
                    (
                        OpKind::Del,
                        Op::Del {
                            key: key.clone().into_bytes(),
                        },
                        None,
                    )
                } else {
                    (
                        OpKind::Get,
                        Op::Get {
                            key: key.clone().into_bytes(),
                        },
                        None,
                    )
                };
                if let Ok(id) = sc.client.submit(client_op) {
                    *issued += 1;
                    did = true;
                    sc.current = Some((
                        id,
                        Operation {
                            client: sc.id,
                            op: kind,
                            key,
                            value,
                            output: None,
                            call: now,
                            ret: now,
                            status: Status::Unknown,
                            term: 0,
                            final_read: false,
                        },
                    ));
                }
            }
        }
        did
    }

    /// Client `ci`'s write `op` ended with an unknown outcome: replace the client
    /// by a new one on a new connection (the old one is kept, so what it sent
    /// still arrives) and send the write again with `request`.
    fn retry_through_a_new_connection(&mut self, ci: usize, op: Operation, request: RequestId) {
        let id = self.clients[ci].id;
        let fresh = self.connect_client(id);
        let old = std::mem::replace(&mut self.clients[ci].client, fresh.client);
        self.retired.push(old);
        let client_op = match op.op {
            OpKind::Put => Op::Put {
                expires_at_ms: op
                    .value
                    .as_deref()
                    .filter(|_| self.expiring_puts)
                    .and_then(expiry_of_value),
                key: op.key.clone().into_bytes(),
                value: op.value.clone().unwrap_or_default().into_bytes(),
            },
            _ => Op::Del {
                key: op.key.clone().into_bytes(),
            },
        };
        self.faults.client_retries += 1;
        let sc = &mut self.clients[ci];
        match sc.client.resubmit(client_op, request) {
            Ok(new_id) => sc.current = Some((new_id, op)),
            Err(e) => {
                // Not sent again (a programming error in the simulator): its
                // outcome stays unknown.
                self.fault_log
                    .push(format!("a retry was not submitted: {e}"));
                let mut op = op;
                op.ret = self.clock.now_ns();
                op.status = Status::Unknown;
                op.term = 0;
                self.history.push(op);
            }
        }
    }

    fn advance(&mut self, busy: bool) {
        let d = if busy {
            self.rng.gen_range(1_000..20_000)
        } else {
            self.rng.gen_range(50_000..500_000)
        };
        self.clock.advance_ns(d);
    }

    fn members(&self) -> Vec<NodeId> {
        self.parts
            .source
            .fetch()
            .map(|c| c.members.iter().map(|m| m.node).collect())
            .unwrap_or_default()
    }

    fn may_remove(&self) -> bool {
        // Five servers, RF 3: two removals leave every shard a full replica.
        self.removed < self.config.servers.saturating_sub(3) && self.members().len() > 3
    }

    fn log(&mut self, what: String) {
        let at = self.now();
        self.fault_log
            .push(format!("{:.3} ms: {what}", at as f64 / 1e6));
    }

    fn inject(&mut self) {
        let now = self.now();
        let members = self.members();
        let servers: Vec<NodeId> = members
            .iter()
            .copied()
            .filter(|n| !self.paused.iter().any(|p| p.node == *n))
            .collect();
        if servers.is_empty() {
            return;
        }
        let pick = |rng: &mut ChaCha8Rng, v: &[NodeId]| v[rng.gen_range(0..v.len())];
        if self.migrations && self.migration_rng.gen_bool(0.25) {
            self.start_migration();
        }
        let roll = if self.stalls_only {
            93
        } else {
            self.rng.gen_range(0..100u32)
        };
        match roll {
            0..=14 if self.may_remove() => {
                let n = pick(&mut self.rng, &servers);
                self.crash_server(n);
                self.removed += 1;
                self.faults.crashes += 1;
                self.log(format!("crash {n}"));
                // Sometimes the whole cluster loses power while it fails over:
                // before the CM notices, while it prepares, or mid-promotion.
                if self.power_failure_at.is_none() && self.rng.gen_bool(0.3) {
                    let at = now + self.rng.gen_range(0..4 * LEASE_NS);
                    self.power_failure_at = Some(at);
                } else if self.restart_at.is_none() && self.rng.gen_bool(0.4) {
                    // Or it is restarted on its pool soon enough that the CM
                    // may not have noticed: still a member, at a new NIC.
                    let at = now + self.rng.gen_range(LEASE_NS / 20..LEASE_NS / 2);
                    self.restart_at = Some((n, at, false));
                } else if self.late_restarts
                    && self.restart_at.is_none()
                    && self.rejoining.is_none()
                {
                    // Or late, as the CM removes it or after: it joins again.
                    let at = now + self.late_rng.gen_range(3 * LEASE_NS / 2..4 * LEASE_NS);
                    self.restart_at = Some((n, at, true));
                }
            }
            15..=34 => {
                let n = pick(&mut self.rng, &servers);
                let long = self.may_remove() && self.rng.gen_bool(0.5);
                let d = if long {
                    self.rng.gen_range(3 * LEASE_NS / 2..6 * LEASE_NS)
                } else {
                    self.rng.gen_range(LEASE_NS / 20..LEASE_NS / 3)
                };
                if long {
                    self.removed += 1;
                    self.faults.long_pauses += 1;
                } else {
                    self.faults.pauses += 1;
                }
                self.paused.push(Paused {
                    node: n,
                    until_ns: now + d,
                });
                self.log(format!("pause {n} for {:.1} ms", d as f64 / 1e6));
            }
            35..=44 => {
                let mut nodes: Vec<NodeId> = servers.clone();
                nodes.extend(self.parts.cm_crash.iter().map(|(n, _)| *n));
                nodes.extend(self.clients.iter().map(|c| c.client.node()));
                let a = pick(&mut self.rng, &nodes);
                let b = pick(&mut self.rng, &nodes);
                if a == b {
                    return;
                }
                let cm_link = [a, b]
                    .iter()
                    .any(|n| self.parts.cm_crash.iter().any(|(c, _)| c == n));
                // A cut between a server and a CM longer than the lease removes it.
                let long_ok = !cm_link || self.may_remove();
                let d = if long_ok && self.rng.gen_bool(0.4) {
                    if cm_link {
                        self.removed += 1;
                    }
                    self.rng.gen_range(2 * LEASE_NS..4 * LEASE_NS)
                } else {
                    self.rng.gen_range(LEASE_NS / 20..LEASE_NS / 3)
                };
                self.parts.fabric.cut_link(a, b);
                self.links.push((a, b, now + d));
                self.faults.link_cuts += 1;
                self.log(format!("cut {a}-{b} for {:.1} ms", d as f64 / 1e6));
            }
            55..=69 => {
                let a = pick(&mut self.rng, &servers);
                let b = if self.rng.gen_bool(0.5) {
                    pick(&mut self.rng, &servers)
                } else {
                    self.clients[self.rng.gen_range(0..self.clients.len())]
                        .client
                        .node()
                };
                if a == b {
                    return;
                }
                let to_client = b.0 >= CLIENT_NODE_BASE;
                // Some delays hold ACKs for longer than t-log segments take to
                // fill and be cleaned (the small-pool profile); some hold a
                // client's request past its retry, which then overtakes it.
                let delay = if to_client && self.rng.gen_bool(0.3) {
                    self.rng.gen_range(40_000_000..300_000_000)
                } else if self.rng.gen_bool(0.3) {
                    self.rng.gen_range(2_000_000..8_000_000)
                } else {
                    self.rng.gen_range(20_000..2_000_000)
                };
                let d = self.rng.gen_range(LEASE_NS / 10..LEASE_NS);
                self.parts.fabric.set_delay_ns(a, b, delay);
                self.links.push((a, b, now + d));
                self.faults.delays += 1;
                self.log(format!(
                    "delay {a}-{b} by {:.2} ms for {:.1} ms",
                    delay as f64 / 1e6,
                    d as f64 / 1e6
                ));
            }
            70..=79 if self.cm_restart_at.is_none() => {
                // Crash the active CM (the one holding the lease), restart later.
                let active = self
                    .events
                    .snapshot()
                    .iter()
                    .rev()
                    .find_map(|e| match e.kind {
                        EventKind::CmActive { cm, .. } => Some(cm),
                        _ => None,
                    });
                let Some(cm) = active else { return };
                let Some(j) = self.parts.cm_crash.iter().position(|(n, _)| *n == cm) else {
                    return;
                };
                self.parts.cm_crash[j].1.store(true, Ordering::Release);
                self.parts.fabric.crash_node(cm);
                self.parts.directory.unregister_node(cm);
                self.cm_restart_at = Some((j, now + 10 * LEASE_NS));
                self.faults.cm_crashes += 1;
                self.log(format!("crash CM {cm}"));
            }
            45..=49 if self.may_remove() => {
                // A server cut off from every CM (the coordination side of a
                // partition) while clients and the other servers still reach
                // it: it must stop answering when its lease ends, before the
                // CM's replacement serves.
                let n = pick(&mut self.rng, &servers);
                let d = self.rng.gen_range(2 * LEASE_NS..4 * LEASE_NS);
                let cms: Vec<NodeId> = self.parts.cm_crash.iter().map(|(c, _)| *c).collect();
                for cm in cms {
                    self.parts.fabric.cut_link(n, cm);
                    self.links.push((n, cm, now + d));
                }
                self.removed += 1;
                self.faults.link_cuts += 1;
                self.log(format!(
                    "cut {n} from every CM for {:.1} ms",
                    d as f64 / 1e6
                ));
            }
            50..=54 | 80..=84 | 97..=99 if self.may_remove() => self.move_backup(),
            85..=92 => {
                self.power_failure();
                self.faults.power_failures += 1;
                self.log("power failure of every server".into());
            }
            93..=96 => {
                // A stall of the virtual machine: nothing runs, time goes on. No
                // server failed, so none may be removed for it.
                let d = self.rng.gen_range(2 * LEASE_NS..5 * LEASE_NS);
                self.clock.advance_ns(d);
                self.faults.stalls += 1;
                self.log(format!("stall everything for {:.1} ms", d as f64 / 1e6));
            }
            _ => {}
        }
    }

    fn crash_server(&mut self, n: NodeId) {
        self.parts.fabric.crash_node(n);
        self.parts.directory.unregister_node(n);
        if let Some(s) = self.parts.servers.iter().find(|s| s.node == n) {
            s.stop();
        }
        self.paused.retain(|p| p.node != n);
    }

    /// Restart crashed server `n` on its pool, as `rowankv server` on the same
    /// file would: a process crash loses nothing it wrote (only a power failure
    /// drops unpersisted lines), the engine is recovered from the pool, and the
    /// server is attached to the fabric anew (new queue pairs: its peers' old
    /// connections fail, and they dial the new ones). Still a member, it serves
    /// its shards after their replicas agree. Removed meanwhile, it joins
    /// again ([`World::step_rejoin`]): through a join desk, waiting to be a
    /// member, then on a formatted pool as a joining backup.
    fn restart_server(&mut self, n: NodeId, late: bool) {
        let Some(i) = self.parts.servers.iter().position(|s| s.node == n) else {
            return;
        };
        let Ok(config) = self.parts.source.fetch() else {
            return;
        };
        if self.power_failure_at.is_some() {
            return;
        }
        if config.member(n).is_none() {
            if self.rejoining.is_some() {
                return;
            }
            let now = self.now();
            self.rejoining = Some(Rejoining {
                node: n,
                restart: self.restart_of(i),
                wait: None,
                asking: true,
                next_ns: now,
                since_ns: now,
                answered: 0,
            });
            self.faults.rejoins += 1;
            self.log(format!(
                "restart {n}, removed by the CM ({}): it joins again",
                config.term
            ));
            // It asks a CM at once.
            self.step_rejoin();
            return;
        }
        // Still a member: as `rowankv server`, it joins (a CM's join desk
        // answers, perhaps from a view that lags the configuration and lacks
        // it), reads the configuration (which holds it) and decides from its
        // pool's identity record what becomes of its pool: recovered, unless
        // the record and the signs it met say the CM removed it while it was
        // down. No CM answering (both crashed), it goes on without an answer.
        let mut restart = self.restart_of(i);
        let how = match self.ask_to_join(n) {
            Some(a) => {
                let sign = restart.answered(a.added, a.term);
                self.on_sign(i, sign, &a.how);
                a.how
            }
            None => "no CM answered its join".to_string(),
        };
        let sign = restart.read(config.term.0, true);
        self.on_sign(i, sign, "");
        let decision = self.come_back(i, &restart, config);
        self.faults.restarts += 1;
        let pool = describe(decision);
        if late {
            self.log(format!(
                "restart {n} on its pool, still a member ({how}): {pool}"
            ));
        } else {
            self.log(format!(
                "restart {n} on its pool, within its lease ({how}): {pool}"
            ));
        }
    }

    /// A server that came back as a joining backup is killed as soon as a
    /// primary's fill installed entries in it, while the stored
    /// configuration still counts it as joining (before the CM promotes it:
    /// mid-fill, or with the fill done and reported), and restarted at once
    /// on its pool, within its lease ([`World::restart_server`]). It was
    /// added less than a desk's reload ago, or not much more, so a join desk
    /// may answer it from a view that lacks it: no news of a removal (the
    /// view is no newer than its pool's member term), unless the member term
    /// is ignored — then it marks its pool stale and formats it, the fill
    /// goes on from the page it reached (or is done), and the CM promotes a
    /// replica without the entries installed before the crash. Draws
    /// nothing from the run's generators.
    fn watch_fill(&mut self) {
        self.move_to_newcomer();
        let Some(w) = &self.fill_watch else {
            return;
        };
        let node = w.node;
        let Some(s) = self.live(node) else {
            self.fill_watch = None;
            return;
        };
        let installed = s.stats.installed.load(Ordering::Relaxed);
        if installed == 0 {
            return;
        }
        self.fill_watch = None;
        let Ok(config) = self.parts.source.fetch() else {
            return;
        };
        let joining: Vec<String> = config
            .shards
            .iter()
            .filter(|a| a.joining.contains(&node))
            .map(|a| a.shard.to_string())
            .collect();
        if joining.is_empty() || self.power_failure_at.is_some() {
            // Promoted already, or about to lose power: the moment is gone.
            return;
        }
        self.crash_server(node);
        self.faults.filled_restarts += 1;
        self.log(format!(
            "crash {node}, a joining backup of {} being filled ({installed} entries installed, {})",
            joining.join(", "),
            config.term
        ));
        self.restart_server(node, false);
    }

    /// The server that came back as a member joining no shard is given one:
    /// an operator moves a shard's backup to it (rebalancing onto it, as
    /// [`World::move_backup`] does elsewhere) once the cluster is settled,
    /// within half a desk's reload of its return, so that it is filled while
    /// a join desk may still answer from a view that lacks it. Only while a
    /// removal is allowed, or the cluster is whole ([`World::healthy`]): the
    /// shard has a full backup fewer until the copy is done; and no move is
    /// under way. Draws from the late restarts' generator only.
    fn move_to_newcomer(&mut self) {
        let Some(w) = &self.fill_watch else {
            return;
        };
        let (node, until) = match w.move_until_ns {
            Some(until) => (w.node, until),
            None => return,
        };
        let give_up = |w: &mut World| {
            if let Some(f) = &mut w.fill_watch {
                f.move_until_ns = None;
            }
        };
        let Ok(c) = self.parts.source.fetch() else {
            return;
        };
        if c.shards.iter().any(|a| a.joining.contains(&node)) || self.now() > until {
            // Filled already, or too late to be answered from a lagging view.
            give_up(self);
            return;
        }
        let settled = self
            .parts
            .servers
            .iter()
            .filter(|s| !s.stopped() && c.member(s.node).is_some())
            .all(|s| s.committed_term() >= c.term);
        if !settled
            || self.pending_move.is_some()
            || !(self.may_remove() || self.healthy(&c))
            || self.live(node).is_none()
            || c.shards.iter().any(|a| !a.joining.is_empty())
        {
            return;
        }
        let candidates: Vec<(ShardId, NodeId)> = c
            .shards
            .iter()
            .filter(|a| !a.is_replica(node) && self.live(a.primary).is_some())
            .flat_map(|a| a.backups.iter().map(move |&from| (a.shard, from)))
            .collect();
        let Some(&(shard, from)) = candidates.choose(&mut self.late_rng) else {
            give_up(self);
            return;
        };
        give_up(self);
        let result = ConfigManager::open(self.store.clone())
            .map_err(|e| e.to_string())
            .and_then(|m| {
                let next = rowankv_cm::plan_move(&m.current(), shard, from, node)
                    .ok_or_else(|| "the configuration changed".to_string())?;
                m.commit(next).map(|_| ()).map_err(|e| e.to_string())
            });
        match result {
            Ok(()) => {
                self.removed += 1;
                self.moving.push((shard, node));
                self.faults.moves += 1;
                self.log(format!(
                    "move {shard}'s backup {from} to {node}, which just came back"
                ));
            }
            Err(e) => self.log(format!("no move of {shard} to {node}: {e}")),
        }
    }

    /// Whether nothing is missing or about to be: every shard has all its
    /// full replicas, every member runs unpaused, no link is cut or delayed,
    /// and no restart or power failure is due. A move then leaves every
    /// shard a full backup, as a single removal does, whatever removals the
    /// run already had (they were all repaired).
    fn healthy(&self, c: &Config) -> bool {
        let rf = usize::from(self.config.replication_factor);
        c.shards
            .iter()
            .all(|a| a.joining.is_empty() && a.backups.len() + 1 == rf)
            && c.members.iter().all(|m| {
                self.live(m.node).is_some() && !self.paused.iter().any(|p| p.node == m.node)
            })
            && self.links.is_empty()
            && self.power_failure_at.is_none()
            && self.restart_at.is_none()
            && self.rejoining.is_none()
    }

    /// The identity `rowankv server` records in `n`'s pool.
    fn identity(&self, n: NodeId) -> Identity {
        Identity {
            cluster_id: self.config.cluster_id,
            node: n,
        }
    }

    /// What server `i` reads of its pool's identity record as its process
    /// starts (the pool of its last incarnation, crashed: a process crash
    /// loses nothing it persisted), as `rowankv server` reads it.
    fn restart_of(&self, i: usize) -> Restart {
        let pool = self.parts.servers[i].engine.pool();
        let read = |e: rowankv_engine::EngineError| -> ! {
            panic!("reading a simulated pool's identity: {e}")
        };
        let record = rowankv_engine::read_identity(pool)
            .unwrap_or_else(|e| read(e))
            .map(|_| PoolRecord {
                marked: rowankv_engine::marked_stale(pool).unwrap_or_else(|e| read(e)),
                member_term: rowankv_engine::member_term(pool).unwrap_or_else(|e| read(e)),
            });
        let restart = Restart::new(record);
        if self.planted == Some(PlantedBug::IgnoreMemberTerm) {
            restart.unsafe_ignore_member_term()
        } else {
            restart
        }
    }

    /// A sign of a removal server `i` met on its way back (`what`): a mark it
    /// calls for is persisted in the pool at once, as `rowankv server` does.
    fn on_sign(&mut self, i: usize, sign: Sign, what: &str) {
        let n = self.parts.servers[i].node;
        match sign {
            Sign::News { mark: true } => {
                rowankv_engine::mark_stale(self.parts.servers[i].engine.pool())
                    .expect("marking a simulated pool stale");
                self.log(format!("{n}'s pool marked stale: {what}"));
            }
            Sign::Lagging => self.log(format!(
                "{n}: {what}: a view no newer than its pool's member term, no news of a removal"
            )),
            Sign::News { mark: false } | Sign::None => {}
        }
    }

    /// Server `i`, a member of `config` now, comes back as `restart` decides
    /// (`rowankv_deploy::join::restart_decision`, as `rowankv server` takes
    /// it): its pool as its crashed process left it recovered (the stale mark
    /// cleared first, when told), or formatted and its identity recorded
    /// anew; then the configuration's term recorded as its member term,
    /// before it serves or is filled; then it runs.
    fn come_back(&mut self, i: usize, restart: &Restart, config: Arc<Config>) -> Decision {
        let n = self.parts.servers[i].node;
        let added = config.member(n).map_or(0, |m| m.added);
        let decision = restart.decide(full_replica(&config, n), added);
        let identity = self.identity(n);
        if decision == (Decision::Recover { clear_mark: true }) {
            rowankv_engine::write_identity(self.parts.servers[i].engine.pool(), identity)
                .expect("clearing the stale mark");
        }
        let (engine, closed) = if decision.recovers() {
            let (engine, closed) = self.recover_pool(i);
            (engine, Some(closed))
        } else {
            let ec = self.parts.servers[i].engine.config().clone();
            let engine = self.formatted_pool(&ec);
            rowankv_engine::write_identity(engine.pool(), identity)
                .expect("recording the identity");
            (engine, None)
        };
        rowankv_engine::record_member_term(engine.pool(), config.term.0)
            .expect("recording the member term");
        self.start_server(i, engine, closed, config);
        decision
    }

    /// Server `i`'s pool after its process crashed (nothing it wrote lost),
    /// recovered.
    fn recover_pool(&self, i: usize) -> (Engine, Vec<SegmentId>) {
        let old = &self.parts.servers[i];
        let keep_all = PowerFailure::DropSubset {
            seed: 0,
            drop_probability: 0.0,
        };
        let image = old
            .engine
            .pool()
            .crash()
            .expect("simulated pools track persistence")
            .image(keep_all);
        let mut opts = PoolOptions::new(Medium::Emulated, image.len());
        opts.crash_sim = true;
        let pool = Pool::from_image(&image, opts).expect("a pool from the image");
        let (engine, report) =
            Engine::open_replica(pool, old.engine.config().clone()).expect("recovering a pool");
        (engine, report.closed_segments)
    }

    /// A formatted pool for a server: what `rowankv server` makes of the pool
    /// of a server the CM removed while it was down.
    fn formatted_pool(&self, engine_config: &rowankv_engine::EngineConfig) -> Engine {
        let mut opts = PoolOptions::new(Medium::Emulated, self.config.pool_bytes);
        opts.crash_sim = true;
        let pool = Pool::anonymous(self.config.pool_bytes, opts).expect("a pool");
        Engine::create(pool, engine_config.clone()).expect("formatting a pool")
    }

    /// Run server `i` anew on `engine` (its pool recovered: `closed`, the
    /// segments recovery closed; formatted: `None`), attached to the fabric
    /// anew, under `config`.
    fn start_server(
        &mut self,
        i: usize,
        engine: Engine,
        closed: Option<Vec<SegmentId>>,
        config: Arc<Config>,
    ) {
        let n = self.parts.servers[i].node;
        let nic = self.parts.fabric.attach(n).expect("attaching again");
        let spec = ServerSpec {
            node: n,
            nic,
            engine: Arc::new(engine),
            strategy: self.config.strategy,
            settings: self.config.settings.clone(),
            config,
            source: self.parts.source.clone(),
            recovered: closed,
            events: self.events.clone(),
            clock: self.parts.fabric.clock(),
        };
        let assembled = assemble(spec, &self.parts.directory).expect("assembling a server");
        let shared = assembled.shared.clone();
        let nic = assembled.nic.clone();
        let cms: Vec<NodeId> = self.parts.cm_crash.iter().map(|(c, _)| *c).collect();
        let tasks =
            roles_on_demand(assembled, &self.parts.directory, &cms).expect("a server's roles");
        for t in tasks {
            self.tasks.push(Owner::Server(n), t);
        }
        self.parts.servers[i] = shared;
        self.parts.nics[i] = nic;
    }

    /// The join desks reload their views; a removed server on its way back
    /// asks the CMs to join, or reads the configuration and, told to, asks
    /// again, or, a member, runs. Draws nothing from the run's generator.
    fn step_rejoin(&mut self) {
        let now = self.now();
        for (j, desk) in self.desks.iter_mut().enumerate() {
            if !self.parts.cm_crash[j].1.load(Ordering::Acquire) {
                desk.tick(self.parts.source.as_ref(), now);
            }
        }
        let Some(mut r) = self.rejoining.take() else {
            return;
        };
        if now < r.next_ns {
            self.rejoining = Some(r);
            return;
        }
        let Some(i) = self.parts.servers.iter().position(|s| s.node == r.node) else {
            return;
        };
        if r.asking {
            match self.ask_to_join(r.node) {
                Some(a) => {
                    r.answered += 1;
                    r.asking = false;
                    r.next_ns = now;
                    let sign = r.restart.answered(a.added, a.term);
                    match &mut r.wait {
                        None => {
                            r.wait = Some(
                                MembershipWait::new(r.node, rejoin_after(), now)
                                    .not_before(r.restart.not_before()),
                            )
                        }
                        Some(w) => w.asked(now),
                    }
                    self.log(format!("join of {}: {}", r.node, a.how));
                    self.on_sign(i, sign, &a.how);
                }
                None => r.next_ns = now + ASK_EVERY_NS,
            }
            self.rejoining = Some(r);
            return;
        }
        r.next_ns = now + READ_EVERY_NS;
        let Ok(config) = self.parts.source.fetch() else {
            self.rejoining = Some(r);
            return;
        };
        let sign = r
            .restart
            .read(config.term.0, config.member(r.node).is_some());
        self.on_sign(
            i,
            sign,
            &format!("the configuration of {} does not hold it", config.term),
        );
        let wait = r.wait.as_mut().expect("a join answered");
        match wait.read(&config, now) {
            Awaited::Wait => self.rejoining = Some(r),
            Awaited::AskAgain => {
                self.faults.rejoins_asked_again += 1;
                self.log(format!(
                    "{} still not a member ({}): it asks the CMs again",
                    r.node, config.term
                ));
                r.asking = true;
                r.next_ns = now;
                self.rejoining = Some(r);
            }
            Awaited::Member { .. } => {
                // As `rowankv server`: its pool was marked stale when it met
                // news that the CM removed it while it was down (or its
                // membership is newer than its pool's), so it is formatted
                // unless the configuration counts it as a full replica of
                // some shard (`rowankv_deploy::join::restart_decision`).
                let term = config.term;
                let decision = self.come_back(i, &r.restart, config);
                self.log(format!(
                    "{} a member again ({term}), {:.1} ms after its restart, {}",
                    r.node,
                    (now - r.since_ns) as f64 / 1e6,
                    describe(decision)
                ));
                if !decision.recovers() && self.late_restarts {
                    self.fill_watch = Some(FillWatch {
                        node: r.node,
                        move_until_ns: Some(now + DESK_RELOAD_NS / 2),
                    });
                }
            }
        }
    }

    /// Server `n` asks the CMs to join, each in turn, as
    /// `rowankv_deploy::join::join` does: a crashed CM does not answer, a
    /// standby's desk answers a join that adds a member `standby` (the next
    /// CM is asked), and the active CM's desk queues it to its role. A desk
    /// whose view holds `n` answers it as a member that rejoined and queues
    /// nothing. The answer (`added` and `term` as the desk's
    /// `rowankv_deploy::join::JoinAnswer` carries them), or `None` if no CM
    /// answered.
    fn ask_to_join(&mut self, n: NodeId) -> Option<Answer> {
        let current = self.parts.source.fetch().ok().map(|c| c.term);
        for (j, (cm, crashed)) in self.parts.cm_crash.iter().enumerate() {
            if crashed.load(Ordering::Acquire) {
                continue;
            }
            let desk = &self.parts.cm_desks[j];
            let view = self.desks[j].view();
            let term = view.map_or(Term(0), |c| c.term);
            if !rowankv_deploy::cm::adds_a_member(view, Some(n)) {
                let stale = if current.is_some_and(|t| t > term) {
                    format!(
                        ", stale: the configuration is {}",
                        current.unwrap_or(Term(0))
                    )
                } else {
                    String::new()
                };
                return Some(Answer {
                    added: false,
                    term: term.0,
                    how: format!(
                        "CM {cm} answered it as a member that rejoined (its desk's view, {term}, holds it{stale})"
                    ),
                });
            }
            if desk.stats.active.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut joins = desk.joins.lock();
            joins.retain(|m| m.node != n);
            joins.push(Member {
                added: 0,
                node: n,
                workers: self.config.settings.workers as u16,
                address: None,
                resp: None,
            });
            let stale = match current {
                Some(t) if t > term => format!(", stale: the configuration is {t}"),
                _ => String::new(),
            };
            return Some(Answer {
                added: true,
                term: term.0,
                how: format!(
                    "CM {cm} added it and queued it to its role (its desk's view, {term}, lacks it{stale})"
                ),
            });
        }
        None
    }

    /// Power failure of every server, and cold start (§4.7): the pools keep what
    /// was persisted; the CMs and clients restart too.
    fn power_failure(&mut self) {
        let Ok(config) = self.parts.source.fetch() else {
            return;
        };
        let mut recovered = Vec::new();
        // A removed server on its way back and not added yet is gone. Every
        // member restarts as `rowankv server` does on a cold start (the CMs
        // answer from the stored configuration, which holds it): its pool
        // keeps what was persisted, its identity record included, and is
        // recovered or formatted as that record decides — a server added
        // again but not yet running formats the pool it crashed with.
        if let Some(r) = self.rejoining.take() {
            if config.member(r.node).is_none() {
                self.log(format!(
                    "{}, on its way back, is gone with the power failure",
                    r.node
                ));
            }
        }
        self.fill_watch = None;
        for i in 0..self.parts.servers.len() {
            let s = &self.parts.servers[i];
            let Some(member) = config.member(s.node) else {
                continue;
            };
            let mut restart = self.restart_of(i);
            let _ = restart.answered(false, config.term.0);
            let _ = restart.read(config.term.0, true);
            let decision = restart.decide(full_replica(&config, s.node), member.added);
            let image = s
                .engine
                .pool()
                .crash()
                .expect("simulated pools track persistence")
                .image(PowerFailure::DropAll);
            let mut opts = PoolOptions::new(Medium::Emulated, image.len());
            opts.crash_sim = true;
            let pool = Pool::from_image(&image, opts).expect("a pool from the image");
            let identity = self.identity(s.node);
            let (engine, closed_segments) = if decision.recovers() {
                if decision == (Decision::Recover { clear_mark: true }) {
                    rowankv_engine::write_identity(&pool, identity)
                        .expect("clearing the stale mark");
                }
                let (engine, report) = Engine::open_replica(pool, s.engine.config().clone())
                    .expect("recovering a pool");
                (engine, report.closed_segments)
            } else {
                let engine = self.formatted_pool(s.engine.config());
                rowankv_engine::write_identity(engine.pool(), identity)
                    .expect("recording the identity");
                (engine, Vec::new())
            };
            rowankv_engine::record_member_term(engine.pool(), config.term.0)
                .expect("recording the member term");
            recovered.push(Recovered {
                node: s.node,
                engine: Arc::new(engine),
                closed_segments,
            });
        }
        for s in &self.parts.servers {
            s.stop();
        }
        for (_, c) in &self.parts.cm_crash {
            c.store(true, Ordering::Release);
        }
        self.tasks.clear();
        self.paused.clear();
        self.links.clear();
        self.cm_restart_at = None;
        self.power_failure_at = None;
        self.restart_at = None;
        // Keep the client-side view: every operation in flight is of unknown outcome.
        let now = self.now();
        for sc in &mut self.clients {
            if let Some((_, mut op)) = sc.current.take() {
                op.ret = now;
                op.status = Status::Unknown;
                op.term = 0;
                self.history.push(op);
            }
        }
        let fabric = LoopbackFabric::with_clock(self.plain_clock.clone());
        let mut parts = build(
            &self.config,
            fabric,
            self.store.clone(),
            Some(recovered),
            self.events.clone(),
        )
        .expect("cold start");
        self.tasks = Roles::new(std::mem::take(&mut parts.tasks));
        self.parts = parts;
        let now = self.now();
        self.desks = (0..self.parts.cm_crash.len())
            .map(|_| JoinDesk::new(self.parts.source.as_ref(), now))
            .collect();
        self.next_client_node = 0;
        self.retired.clear();
        let ids: Vec<u32> = self.clients.iter().map(|c| c.id).collect();
        let mut clients = Vec::new();
        for id in ids {
            let mut c = self.connect_client(id);
            c.next_value = self.clients[id as usize].next_value;
            clients.push(c);
        }
        self.clients = clients;
    }

    fn heal_due(&mut self, all: bool) {
        let now = self.now();
        let (due, keep): (Vec<_>, Vec<_>) = self
            .links
            .drain(..)
            .partition(|&(_, _, until)| all || now >= until);
        self.links = keep;
        for (a, b, _) in due {
            self.parts.fabric.heal_link(a, b);
            self.parts.fabric.set_delay_ns(a, b, 0);
        }
        self.paused.retain(|p| !all && now < p.until_ns);
        if let Some((j, at)) = self.cm_restart_at {
            if all || now >= at {
                self.restart_cm(j);
                self.cm_restart_at = None;
            }
        }
    }

    fn restart_cm(&mut self, j: usize) {
        let (node, _) = self.parts.cm_crash[j];
        let nic = self.parts.fabric.attach(node).expect("re-attaching a CM");
        // A new process: the joins its desk queued before the crash are lost.
        let desk = CmDesk::default();
        let (task, crashed) =
            rowankv_deploy::cluster::cm_task(node, nic, &self.parts, &self.config.settings, &desk)
                .expect("restarting a CM");
        self.parts.cm_crash[j].1 = crashed;
        self.parts.cm_desks[j] = desk;
        self.desks[j] = JoinDesk::new(self.parts.source.as_ref(), self.now());
        self.tasks.push(Owner::Cm(node), task);
    }

    fn run_ops(&mut self, budget: usize, faults: bool) {
        let mut issued = 0;
        let mut ticks = 0u64;
        while issued < budget || self.clients.iter().any(|c| c.current.is_some()) {
            self.heal_due(false);
            if self.power_failure_at.is_some_and(|t| self.now() >= t) {
                self.power_failure();
                self.faults.power_failures += 1;
                self.log("power failure of every server, during a failover".into());
            }
            if let Some((n, at, late)) = self.restart_at {
                if self.now() >= at {
                    self.restart_at = None;
                    self.restart_server(n, late);
                }
            }
            let a = self.step_roles();
            self.settle_move();
            self.watch_backups();
            let before = issued;
            // No new operation while an audit waits for the clients to finish.
            // No new operation on a settled shard whose audit waits for the
            // clients to finish theirs on it.
            self.held = self
                .audits
                .iter()
                .map(|&(shard, _)| shard)
                .filter(|&shard| self.settled(shard).is_some())
                .collect();
            let b = self.step_clients(&mut issued, budget);
            if !self.audits.is_empty() {
                self.run_audits();
            }
            // About one fault per `OPS_PER_FAULT` operations, at random moments.
            for _ in before..issued {
                if faults && self.rng.gen_bool(1.0 / OPS_PER_FAULT) {
                    self.inject();
                }
            }
            self.advance(a || b);
            ticks += 1;
            assert!(ticks < 50_000_000, "the simulation made no progress");
        }
    }

    /// Why `key` cannot be read: its shard and what its primary thinks.
    fn unavailable(&self, key: &str) -> String {
        let Ok(config) = self.parts.source.fetch() else {
            return "no configuration".into();
        };
        let s = config.shard_for_key(key.as_bytes());
        let census: Vec<String> = self
            .parts
            .servers
            .iter()
            .map(|x| format!("{}: {:?}", x.node, x.engine.segment_census()))
            .collect();
        let detail = match self.parts.servers.iter().find(|x| x.node == s.primary) {
            Some(p) => format!(
                "{} (term {}) primary {} backups {:?} joining {:?}: served {}, server term {}, committed {}, lease {} ns left, stopped {}",
                s.shard,
                config.term,
                s.primary,
                s.backups,
                s.joining,
                p.shard_ready(s.shard),
                p.term(),
                p.committed_term(),
                p.lease_until_ns() as i64 - self.now() as i64,
                p.stopped()
            ),
            None => format!("{} primary {} is not running", s.shard, s.primary),
        };
        format!("{detail}; segments {}", census.join("; "))
    }

    /// Run `op` from the first client until it completes: when it was called,
    /// and its completion.
    fn final_call(&mut self, op: Op) -> (u64, Completed) {
        let call = self.now();
        let id = self.clients[0]
            .client
            .submit(op)
            .expect("a final operation");
        let mut out = Vec::new();
        let c = loop {
            self.step_roles();
            self.clients[0].client.poll(&mut out);
            if let Some(c) = out.pop() {
                break c;
            }
            self.advance(true);
        };
        debug_assert_eq!(c.id, id);
        (call, c)
    }

    /// Let the cluster run a hundred steps before a final operation is tried again.
    fn settle_a_while(&mut self) {
        for _ in 0..100 {
            let busy = self.step_roles();
            self.advance(busy);
        }
    }

    /// Heal everything, let the cluster settle, read every key back.
    fn read_back(&mut self) {
        self.heal_due(true);
        self.finish_rejoin();
        let settle_until = self.now() + 10 * LEASE_NS;
        while self.now() < settle_until {
            let busy = self.step_roles();
            self.advance(busy);
        }
        self.final_pass(OpKind::Get);
    }

    /// A removed server on its way back is healed too: the cluster runs until
    /// it is a member again and no shard has a joining backup left (it is
    /// filled), for at most three `rejoin_after` from its last join. A server
    /// still not a member then is reported: the cluster stays a replica short
    /// for good, as a process that waits forever for a join nobody carries out.
    fn finish_rejoin(&mut self) {
        if let Some((n, _, true)) = self.restart_at {
            self.restart_at = None;
            self.restart_server(n, true);
        }
        if self.rejoining.is_none() {
            return;
        }
        let deadline = self.now() + 3 * rejoin_after().as_nanos() as u64;
        while self.now() < deadline {
            let filled = self.rejoining.is_none()
                && self
                    .parts
                    .source
                    .fetch()
                    .is_ok_and(|c| c.shards.iter().all(|a| a.joining.is_empty()));
            if filled {
                return;
            }
            let busy = self.step_roles();
            self.advance(busy);
        }
        if let Some(r) = &self.rejoining {
            let term = self.parts.source.fetch().map(|c| c.term).unwrap_or(Term(0));
            let what = format!(
                "{} restarted after the CM removed it is not a member again {:.0} ms later \
                 ({term}, {} join(s) answered)",
                r.node,
                (self.now() - r.since_ns) as f64 / 1e6,
                r.answered
            );
            self.log(what.clone());
            self.rejoin_failures.push(what);
        }
    }
}

impl World {
    /// After the read-back, every key must take a write: a cluster that keeps
    /// every acknowledged write but can take no new one for a key (a
    /// replication path that never recovers, a shard left blocked) is wedged,
    /// which no safety check sees. Each attempt writes a value of its own; a
    /// key that takes none within 20 attempts is reported.
    fn write_back(&mut self) {
        self.final_pass(OpKind::Put);
    }

    /// One final operation of `kind` (a read, or a write of a value of its
    /// own) on every key, from the first client, until it succeeds — at most
    /// 20 attempts, each recorded in the history; a key on which none
    /// succeeds is logged as "final read/write of KEY never succeeded".
    fn final_pass(&mut self, kind: OpKind) {
        let keys = self.keys.clone();
        for key in keys {
            let mut done = false;
            let mut last_error = String::new();
            for attempt in 0..20 {
                let value = (kind == OpKind::Put).then(|| format!("final-{attempt}"));
                let op = match &value {
                    Some(v) => Op::Put {
                        expires_at_ms: None,
                        key: key.clone().into_bytes(),
                        value: v.clone().into_bytes(),
                    },
                    None => Op::Get {
                        key: key.clone().into_bytes(),
                    },
                };
                let (call, c) = self.final_call(op);
                last_error = format!("{:?}", c.result);
                let (status, output) = match (&c.result, kind) {
                    (Ok(Output::Value { value, .. }), _) => (
                        Status::Ok,
                        Some(String::from_utf8_lossy(value).into_owned()),
                    ),
                    (Err(ClientError::NotFound), OpKind::Get) => (Status::Ok, None),
                    (Ok(_), OpKind::Put) => (Status::Ok, None),
                    (Err(e), OpKind::Put) if e.is_unknown() => (Status::Unknown, None),
                    _ => (Status::Fail, None),
                };
                self.history.push(Operation {
                    client: 0,
                    op: kind,
                    key: key.clone(),
                    value,
                    output,
                    call,
                    ret: self.now(),
                    status,
                    term: if status == Status::Ok { c.term.0 } else { 0 },
                    final_read: kind == OpKind::Get,
                });
                if status == Status::Ok {
                    done = true;
                    break;
                }
                self.settle_a_while();
            }
            if !done {
                let what = if kind == OpKind::Get { "read" } else { "write" };
                let detail = self.unavailable(&key);
                self.fault_log.push(format!(
                    "final {what} of {key} never succeeded: last answer {last_error}; {detail}"
                ));
            }
        }
    }

    /// The server running as `n`, unless it stopped.
    fn live(&self, n: NodeId) -> Option<&Arc<ServerShared<LoopbackNic>>> {
        self.parts
            .servers
            .iter()
            .find(|s| s.node == n && !s.stopped())
    }

    /// Digest everything landed at `n`, as a quiescent backup does: segments
    /// still being filled are not digested in normal operation.
    ///
    /// `drpc`: an error says acknowledged requests wait in `n`'s redo rings
    /// for room in its b-log (nothing is digested then).
    fn digest_all(&self, n: NodeId) -> Result<(), String> {
        use rowankv_engine::{Owner, SegmentState};
        let Some(s) = self.live(n) else { return Ok(()) };
        // `drpc`: what the redo rings hold goes to the b-log first.
        s.drain_redo()?;
        let segs = s.engine.segments_in(
            &[Owner::Control, Owner::Backup],
            &[SegmentState::Using, SegmentState::Used],
        );
        for seg in segs {
            let _ = s.blog.digest_now(seg);
        }
        Ok(())
    }

    /// What `n` indexes of `shard`: key → (version, value or `<deleted>`).
    fn index_of(&self, n: NodeId, shard: ShardId) -> Option<Index> {
        use rowankv_engine::entry;
        let s = self.live(n)?;
        let mut index = Index::new();
        s.engine
            .for_each_indexed_entry(shard, |bytes| {
                if let Ok(e) = entry::parse_entry(bytes) {
                    let value = match e.kind {
                        entry::Kind::Put => e.value.to_vec(),
                        _ => DELETED.to_vec(),
                    };
                    index.insert(e.key.to_vec(), (e.version.0, value));
                }
            })
            .ok()?;
        Some(index)
    }

    /// An operator moves one backup of a shard to a server outside it (as
    /// rebalancing does), at a moment when a role of the shard's primary is
    /// preempted mid-step (`preempt::Interjection`): a worker that read its
    /// configuration before the move may be in the middle of a write while the
    /// move is prepared, committed and the copy taken. The shard has one full
    /// backup fewer until the new one is copied, so a move counts as a removal
    /// from when it is planned. Only when no reconfiguration is under way.
    /// An operator moves a shard's primary to a server holding none of it
    /// (a migration, §4.6), once the cluster is settled: the configuration
    /// is stored as `rowankv reshard` has the CM store it, and the CM
    /// prepares and commits it like any operator's configuration.
    fn start_migration(&mut self) {
        let Ok(c) = self.parts.source.fetch() else {
            return;
        };
        let settled = self
            .parts
            .servers
            .iter()
            .filter(|s| !s.stopped() && c.members.iter().any(|m| m.node == s.node))
            .all(|s| s.committed_term() >= c.term);
        if !settled || !c.migrations.is_empty() || c.shards.iter().any(|a| !a.joining.is_empty()) {
            return;
        }
        let runnable: Vec<NodeId> = c
            .members
            .iter()
            .map(|m| m.node)
            .filter(|n| self.live(*n).is_some() && !self.paused.iter().any(|p| p.node == *n))
            .collect();
        let candidates: Vec<(ShardId, NodeId)> = c
            .shards
            .iter()
            .filter(|a| runnable.contains(&a.primary))
            .flat_map(|a| {
                runnable
                    .iter()
                    .copied()
                    .filter(|n| !a.is_replica(*n))
                    .map(move |t| (a.shard, t))
                    .collect::<Vec<_>>()
            })
            .collect();
        let Some(&(shard, to)) = candidates.choose(&mut self.migration_rng) else {
            return;
        };
        let result = ConfigManager::open(self.store.clone())
            .map_err(|e| e.to_string())
            .and_then(|m| {
                let next = rowankv_cm::plan_migrate(&m.current(), shard, to)?;
                m.commit(next).map(|_| ()).map_err(|e| e.to_string())
            });
        match result {
            Ok(()) => {
                self.faults.migrations += 1;
                self.log(format!("migrate {shard}'s primary to {to}"));
            }
            Err(e) => self.log(format!("no migration of {shard}: {e}")),
        }
    }

    fn move_backup(&mut self) {
        if self.pending_move.is_some() {
            return;
        }
        let Ok(c) = self.parts.source.fetch() else {
            return;
        };
        let settled = self
            .parts
            .servers
            .iter()
            .filter(|s| !s.stopped() && c.members.iter().any(|m| m.node == s.node))
            .all(|s| s.committed_term() >= c.term);
        if !settled || c.shards.iter().any(|a| !a.joining.is_empty()) {
            return;
        }
        let runnable: Vec<NodeId> = c
            .members
            .iter()
            .map(|m| m.node)
            .filter(|n| self.live(*n).is_some() && !self.paused.iter().any(|p| p.node == *n))
            .collect();
        let candidates: Vec<(ShardId, NodeId, NodeId, NodeId)> = c
            .shards
            .iter()
            .filter(|a| runnable.contains(&a.primary))
            .flat_map(|a| {
                let to: Vec<NodeId> = runnable
                    .iter()
                    .copied()
                    .filter(|n| !a.is_replica(*n))
                    .collect();
                a.backups.iter().flat_map(move |&from| {
                    to.clone()
                        .into_iter()
                        .map(move |t| (a.shard, a.primary, from, t))
                })
            })
            .collect();
        let Some(&(shard, primary, from, to)) = candidates.choose(&mut self.rng) else {
            return;
        };
        self.removed += 1;
        self.pending_move = Some(self.now() + MOVE_WAIT_NS);
        let (store, outcome) = (self.store.clone(), self.move_outcome.clone());
        self.clock.interject(Interjection {
            owner: Owner::Server(primary),
            per_read: MOVE_PREEMPT_PER_READ,
            action: Box::new(move || {
                let result = ConfigManager::open(store)
                    .map_err(|e| e.to_string())
                    .and_then(|m| {
                        let next = rowankv_cm::plan_move(&m.current(), shard, from, to)
                            .ok_or_else(|| "the configuration changed".to_string())?;
                        m.commit(next).map(|_| ()).map_err(|e| e.to_string())
                    });
                *outcome.lock().expect("the move's outcome") = Some((shard, from, to, result));
            }),
        });
    }

    /// A planned move done, failed, or given up (its primary never preempted
    /// in time).
    fn settle_move(&mut self) {
        let Some(deadline) = self.pending_move else {
            return;
        };
        let done = self.move_outcome.lock().expect("the move's outcome").take();
        match done {
            Some((shard, from, to, Ok(()))) => {
                self.pending_move = None;
                self.moving.push((shard, to));
                self.faults.moves += 1;
                self.log(format!(
                    "move {shard}'s backup {from} to {to}, its primary preempted mid-step"
                ));
            }
            Some((shard, _, _, Err(e))) => {
                self.pending_move = None;
                self.removed -= 1;
                self.log(format!("no move of {shard}: {e}"));
            }
            None if self.now() >= deadline && self.clock.withdraw() => {
                self.pending_move = None;
                self.removed -= 1;
            }
            None => {}
        }
    }

    /// Note every shard whose full backups gained a server since the stored
    /// configuration was last seen: it is audited once the clients are idle.
    fn watch_backups(&mut self) {
        let Ok(c) = self.parts.source.fetch() else {
            return;
        };
        if c.term == self.seen_backups.0 {
            return;
        }
        let now = self.now();
        for a in &c.shards {
            let before = self.seen_backups.1.get(a.shard.0 as usize);
            let gained = a
                .backups
                .iter()
                .any(|b| before.is_some_and(|old| !old.contains(b)));
            if gained && !self.audits.iter().any(|(s, _)| *s == a.shard) {
                self.audits.push((a.shard, now));
            }
            let before = self.moving.len();
            self.moving
                .retain(|(s, to)| !(*s == a.shard && a.backups.contains(to)));
            // A move done: the shard has all its full replicas again.
            self.removed -= before - self.moving.len();
        }
        self.seen_backups = (c.term, c.shards.iter().map(|a| a.backups.clone()).collect());
    }

    /// Audit the shards waiting for it once they are settled and no client
    /// operation on them is in flight: each full backup holds, for every key its primary indexes, that
    /// version or a later one. A backup copied without a write the primary
    /// acknowledged is a failover away from losing it, although no client has
    /// seen it yet. A shard not settled (its term committed by its replicas,
    /// none paused, its primary serving it) waits, up to `AUDIT_WAIT_NS`, and
    /// holds no client back meanwhile; a settled one holds back new operations
    /// on its keys only.
    fn run_audits(&mut self) {
        let now = self.now();
        let pending = std::mem::take(&mut self.audits);
        for (shard, since) in pending {
            match self.settled(shard) {
                Some(c)
                    if !self.clients.iter().any(|sc| {
                        sc.current.as_ref().is_some_and(|(_, op)| {
                            c.shard_for_key(op.key.as_bytes()).shard == shard
                        })
                    }) =>
                {
                    let failures = self.audit(shard).unwrap_or_default();
                    self.audit_failures.extend(failures);
                }
                Some(_) => self.audits.push((shard, since)),
                None if now.saturating_sub(since) < AUDIT_WAIT_NS => {
                    self.audits.push((shard, since))
                }
                None => {}
            }
        }
    }

    /// The configuration, if `shard` is settled in it.
    fn settled(&self, shard: ShardId) -> Option<Arc<rowankv_wire::config::Config>> {
        let c = self.parts.source.fetch().ok()?;
        let a = c.shard(shard)?;
        let settled = |n: NodeId| {
            self.live(n).is_some_and(|s| s.committed_term() >= c.term)
                && !self.paused.iter().any(|p| p.node == n)
        };
        let ok = settled(a.primary)
            && a.backups.iter().all(|&b| settled(b))
            && self.live(a.primary)?.shard_ready(shard);
        ok.then_some(c)
    }

    /// One settled shard's audit: what is wrong.
    fn audit(&self, shard: ShardId) -> Option<Vec<String>> {
        let c = self.settled(shard)?;
        let a = c.shard(shard)?;
        for n in std::iter::once(a.primary).chain(a.backups.iter().copied()) {
            // Requests waiting in a redo ring for room: not settled yet.
            self.digest_all(n).ok()?;
        }
        let want = self.index_of(a.primary, shard)?;
        let mut out = Vec::new();
        for &b in &a.backups {
            let got = self.index_of(b, shard)?;
            for (k, (v, val)) in &want {
                let behind = match got.get(k) {
                    None => val.as_slice() != DELETED,
                    Some((gv, gval)) => gv < v || (gv == v && gval != val),
                };
                if behind {
                    out.push(format!(
                        "audit after {b} became a backup of {shard} (term {}): key {:?}: primary {} has {}, backup {b} has {}",
                        c.term,
                        String::from_utf8_lossy(k),
                        a.primary,
                        show(Some(&(*v, val.clone()))),
                        show(got.get(k)),
                    ));
                    break;
                }
            }
        }
        Some(out)
    }

    /// Every shard's full replicas against its primary, once every fault is
    /// healed and the cluster settled: the same keys at the same versions with
    /// the same bytes. Divergence is a failover away from a lost or resurrected
    /// write, so it is reported even when no client read has shown it yet.
    fn replicas_agree(&self) -> Vec<String> {
        let Ok(config) = self.parts.source.fetch() else {
            return vec!["no configuration at the end of the run".into()];
        };
        let mut stuck = Vec::new();
        for n in config.members.iter().map(|m| m.node) {
            // The `redo.no-room` fault site stays armed: each drain executes
            // up to a deferred request, so a few go through all of it.
            let mut drained = self.digest_all(n);
            for _ in 0..DRAIN_ATTEMPTS {
                if drained.is_ok() {
                    break;
                }
                drained = self.digest_all(n);
            }
            if let Err(why) = drained {
                // Healed and settled, yet acknowledged requests still wait for
                // room in a b-log: a server that has stopped making progress.
                stuck.push(format!("{n}: its redo rings cannot be drained: {why}"));
            }
        }
        if !stuck.is_empty() {
            return stuck;
        }
        let live = |n: NodeId| self.live(n);
        let index_of = |n: NodeId, shard| self.index_of(n, shard);
        let mut out = Vec::new();
        // No request executed twice, on any replica (each would have recorded it
        // with two versions).
        for n in config.members.iter().map(|m| m.node) {
            let Some(s) = live(n) else { continue };
            for a in &config.shards {
                let twice = s
                    .engine
                    .request_stats(a.shard)
                    .map_or(0, |st| st.executed_twice);
                if twice > 0 {
                    out.push(format!(
                        "{}: {twice} request(s) executed twice, as {n}'s log shows",
                        a.shard
                    ));
                }
            }
        }
        for a in &config.shards {
            let Some(p) = live(a.primary) else { continue };
            if !p.shard_ready(a.shard) {
                continue; // reported by the final reads if it matters
            }
            let Some(want) = index_of(a.primary, a.shard) else {
                continue;
            };
            for &b in &a.backups {
                let Some(got) = index_of(b, a.shard) else {
                    continue;
                };
                let keys: std::collections::BTreeSet<&Vec<u8>> =
                    want.keys().chain(got.keys()).collect();
                for k in keys {
                    let (w, g) = (want.get(k), got.get(k));
                    if w != g {
                        out.push(format!(
                            "{} key {:?}: primary {} has {}, backup {b} has {}",
                            a.shard,
                            String::from_utf8_lossy(k),
                            a.primary,
                            show(w),
                            show(g)
                        ));
                        break;
                    }
                }
            }
        }
        out
    }
}

/// What became of a restarted server's pool, for the run's log.
fn describe(d: Decision) -> &'static str {
    match d {
        Decision::New => "on a new pool",
        Decision::Recover { clear_mark: false } => "its pool recovered",
        Decision::Recover { clear_mark: true } => {
            "its pool, marked stale, recovered as a full replica's (the mark cleared)"
        }
        Decision::Format { .. } => "on its formatted pool",
    }
}

/// A shard's index as the checks read it: key → (version, value).
type Index = std::collections::BTreeMap<Vec<u8>, (u64, Vec<u8>)>;

/// A deleted key's value in an [`Index`].
const DELETED: &[u8] = b"<deleted>";

fn show(x: Option<&(u64, Vec<u8>)>) -> String {
    x.map_or("absent".to_string(), |(v, val)| {
        format!("v{v} {:?}", String::from_utf8_lossy(val))
    })
}

/// Run one seed.
pub fn run(sim: &SimConfig) -> RunResult {
    let mut w = World::new(sim);
    w.run_ops(sim.ops, sim.faults);
    w.read_back();
    w.write_back();
    let mut diverged = w.replicas_agree();
    diverged.append(&mut w.audit_failures);
    let commits: Vec<ConfigCommit> = w
        .events
        .commits()
        .into_iter()
        .map(|(term, at)| ConfigCommit { term: term.0, at })
        .collect();
    let mut report = check(&w.history, &commits);
    let unread = w
        .fault_log
        .iter()
        .filter(|l| l.starts_with("final read"))
        .cloned()
        .collect::<Vec<_>>();
    for u in unread {
        report.violations.push(crate::check::Violation {
            kind: crate::check::ViolationKind::LostWrite,
            key: None,
            detail: u,
        });
    }
    let unwritten: Vec<String> = w
        .fault_log
        .iter()
        .filter(|l| l.starts_with("final write"))
        .cloned()
        .collect();
    for u in unwritten {
        report.violations.push(crate::check::Violation {
            kind: crate::check::ViolationKind::Unavailable,
            key: None,
            detail: u,
        });
    }
    for u in std::mem::take(&mut w.rejoin_failures) {
        report.violations.push(crate::check::Violation {
            kind: crate::check::ViolationKind::Unavailable,
            key: None,
            detail: u,
        });
    }
    for d in diverged {
        report.violations.push(crate::check::Violation {
            kind: crate::check::ViolationKind::ReplicasDiverge,
            key: None,
            detail: d,
        });
    }
    let config = w.parts.source.fetch().ok();
    let terms = config.as_ref().map_or(0, |c| c.term.0);
    w.faults.redo_deferrals = w
        .parts
        .servers
        .iter()
        .filter_map(|s| s.redo.get().map(|r| r.lock().deferred()))
        .sum();
    w.faults.migrations_finished = w
        .events
        .snapshot()
        .iter()
        .filter(|e| matches!(e.kind, EventKind::MigrationFinished { .. }))
        .count() as u32;
    for s in &w.parts.servers {
        s.stop();
    }
    w.faults.preemptions = w.clock.preemptions() as u32;
    // Nothing the clock holds outlives the run (a move's action holds the store,
    // which reads the clock).
    w.clock.withdraw();
    w.clock.set_policy(None);
    RunResult {
        seed: sim.seed,
        history: w.history,
        report,
        faults: w.faults,
        terms,
        sim_ns: w.clock.now_ns(),
        fault_log: w.fault_log,
        config,
    }
}
