//! The configuration manager's role (seed 000 §4.5): leases, failure detection
//! and the commit of new configurations, as a task on its own node of the fabric.
//!
//! Several CMs run; one is *active*: it holds the CM lease in the coordination
//! store ([`ConfigManager::acquire_active`]), renews it every quarter of its TTL,
//! and steps down the moment a renewal fails. The others are standbys that try
//! to take the lease over; the one that gets it reloads the configuration and
//! re-runs the prepare/commit round of its term, so that a round the old CM left
//! half done completes (CM failover, as FaRM does it).
//!
//! The active CM:
//! - grants leases: a member's `Lease` request (of this cluster, on the
//!   member's own connection) is answered with the highest committed term; the
//!   CM notes the time it *handled* it, read from the clock then (not the
//!   step's start, which may precede the server's send), and grants only while
//!   its own lease outlives the server's by the lease margin, so that no server
//!   lease it granted survives it;
//! - suspects a member when `lease_ns` passed since its last grant — not
//!   counting time in which the CM itself did not run (a stall of its machine,
//!   `CmTask::discount_stall`) — and confirms the suspicion with a probe
//!   (`CmTask::probe`): a member whose control role answers is alive, and gets
//!   one more lease period to renew by itself; one that does not answer within
//!   a lease, whose connection fails, or that was already given that extra
//!   period without renewing since, is declared failed. The CM then plans
//!   the next configuration ([`plan_failover`]) and stores it with `commit_as`
//!   (phase 1), sends `Prepare` to every member left until each has answered,
//!   waits until the failed servers' leases (and the lease margin) have
//!   expired, records the term committed in the store
//!   ([`ConfigManager::record_committed`]), then sends `Commit`. A member that
//!   refuses a `Prepare` because it holds a later stored term has the round
//!   moved on to that term;
//! - on `Ready` from a shard's primary, in the CM's current term, makes the
//!   joining backup a full one ([`plan_ready`]) through the same round (nothing
//!   to wait for). A `Ready` from anyone else, or in another term, is refused.
//!
//! A CM that starts as standby gives every member a full lease period from the
//! moment it becomes active before it declares anyone failed: the old CM's
//! grants have expired by then, and live servers have had time to renew. It
//! answers leases with the term recorded committed in the store — never the
//! stored configuration's term, which may not be committed — until its own
//! round of the stored term commits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rowankv_fabric::Nic;
use rowankv_rpc::directory::{Acceptor, Directory};
use rowankv_rpc::endpoint::{Endpoint, Event, PeerId, SendError};
use rowankv_server::control::{forget_peer, Links, CONTROL_PORT};
use rowankv_server::events::{EventKind, EventLog};
use rowankv_server::runtime::{Periodic, Step, Task};
use rowankv_server::server::FailoverSettings;
use rowankv_types::{Clock, NodeId, ShardId, Term};
use rowankv_wire::config::Member;
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Response};

use crate::{
    plan_failover, plan_join, plan_migrate, plan_migrated, plan_ready, plan_reshard, server_loads,
    ActiveLease, ConfigManager, ReshardPolicy, ShardLoad,
};

/// A prepare/commit round of one configuration term.
#[derive(Debug)]
struct Round {
    term: Term,
    /// Members that have not answered `Prepare`.
    waiting: BTreeSet<NodeId>,
    /// When `Prepare` last went to each waiting member.
    sent_ns: BTreeMap<NodeId, u64>,
    /// Commit not before this: the failed servers' leases have expired.
    not_before_ns: u64,
}

/// A member whose lease expired, asked whether it is alive.
#[derive(Debug)]
struct Probe {
    /// The `Ping` sent as the probe (`None`: no connection to send it on).
    request: Option<(u64, PeerId)>,
    sent_ns: u64,
    /// Its connection failed: no answer can come.
    failed: bool,
}

/// Counters and gauges of one CM, for its metrics endpoint: read at scrape
/// time, written by the CM's role (relaxed atomics, no lock).
#[derive(Debug, Default)]
pub struct CmStats {
    /// 1 while this CM holds the CM lease (the active one), else 0.
    pub active: AtomicU64,
    /// Times this CM became the active one.
    pub activations: AtomicU64,
    /// The term of the configuration the CM holds, and the highest it knows
    /// committed.
    pub term: AtomicU64,
    pub committed_term: AtomicU64,
    /// Members of that configuration, and joining backups (shard, backup) in it.
    pub members: AtomicU64,
    pub joining_backups: AtomicU64,
    /// Server leases granted.
    pub leases_granted: AtomicU64,
    /// Servers declared failed (lease expired, probe unanswered).
    pub servers_failed: AtomicU64,
    /// Failovers: configurations stored to remove failed servers (their
    /// shards' backups promoted).
    pub failovers: AtomicU64,
    /// Joining backups made full backups once their copy was reported.
    pub backups_promoted: AtomicU64,
    /// Migrations of a shard's primary put in the list (§4.6: by an
    /// operator or the load's detection), and struck once copied.
    pub migrations_started: AtomicU64,
    pub migrations_finished: AtomicU64,
    /// Servers added as members, and removed on request (`rowankv leave`).
    pub joins: AtomicU64,
    pub leaves: AtomicU64,
    /// Configurations stored, and committed (prepare/commit rounds finished).
    pub configs_stored: AtomicU64,
    pub configs_committed: AtomicU64,
}

impl CmStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// One configuration manager.
pub struct CmTask<N: Nic> {
    name: String,
    node: NodeId,
    manager: Arc<ConfigManager>,
    settings: FailoverSettings,
    ep: Endpoint<N>,
    acceptor: Acceptor,
    directory: Directory,
    links: Links,
    events: Arc<EventLog>,
    crashed: Arc<AtomicBool>,
    active: Option<ActiveLease>,
    /// Our CM lease is valid until here (from the last successful renewal).
    active_until_ns: u64,
    renew_cm: Periodic,
    /// Looks at the store for configurations an operator stored.
    watch: Periodic,
    /// Members' last lease grants (ns).
    granted: BTreeMap<NodeId, u64>,
    /// When this CM last stepped.
    last_step_ns: Option<u64>,
    /// Members declared failed and removed (never granted again).
    failed: BTreeSet<NodeId>,
    /// Members whose lease expired, being probed.
    suspects: BTreeMap<NodeId, Probe>,
    /// Members a probe found alive that have not renewed since: the next
    /// expiry is final.
    rescued: BTreeSet<NodeId>,
    round: Option<Round>,
    /// The highest term known committed: recorded in the store by whichever
    /// CM committed it, or committed here.
    committed: Term,
    /// Joining backups reported copied: (shard, backup) → the primary that
    /// reported it.
    ready: BTreeMap<(ShardId, NodeId), NodeId>,
    /// The cluster's clock: a lease is stamped when its request is handled.
    clock: Arc<dyn Clock>,
    next_request: u64,
    /// Outstanding `Prepare`s: id → (peer, node, term).
    pending: BTreeMap<u64, (PeerId, NodeId, Term)>,
    evs: Vec<Event>,
    data: Vec<u8>,
    /// Servers that joined and are not members (a process deployment's join
    /// desk fills it): added, one per configuration round.
    joins: Joins,
    /// No join is tried before this (one just failed to be stored).
    join_retry_ns: u64,
    /// Servers to remove on purpose (`rowankv leave`).
    leaves: Leaves,
    /// When the store is next read for servers recorded as having left.
    next_leave_scan_ns: u64,
    /// What the metrics show ([`CmTask::with_stats`]).
    stats: Arc<CmStats>,
    /// Each member's last load report (seed 000 §4.6): when it came, its
    /// window (ns), and per shard (requests, replication writes).
    loads: BTreeMap<NodeId, LoadReport>,
    /// Looks at the load reports for overloaded servers.
    weigh: Periodic,
    /// Members found overloaded at the last look (an `Overloaded` event is
    /// recorded when one becomes so).
    overloaded: BTreeSet<NodeId>,
    /// When [`plan_reshard`] finds a server overloaded.
    reshard: ReshardPolicy,
}

/// One member's load over its last statistics window.
#[derive(Clone, Debug)]
struct LoadReport {
    at_ns: u64,
    window_ns: u64,
    shards: Vec<(ShardId, u64, u64)>,
}

/// How often the active CM reads the store for servers recorded as having left.
const LEAVE_SCAN_NS: u64 = 1_000_000_000;
/// How often the active CM looks at the members' load reports.
pub const WEIGH_NS: u64 = 100_000_000;

/// Servers waiting to be added to the configuration ([`CmTask::with_joins`]).
pub type Joins = Arc<parking_lot::Mutex<Vec<Member>>>;

/// Servers to remove from the configuration on purpose ([`CmTask::with_leaves`]).
pub type Leaves = Arc<parking_lot::Mutex<Vec<NodeId>>>;

impl<N: Nic> CmTask<N> {
    /// Take the servers to add from `joins` (what a CM process's join desk
    /// hears): the active CM adds each, when no round is under way, as a
    /// member and a joining backup of the shards short of replicas.
    pub fn with_joins(mut self, joins: Joins) -> Self {
        self.joins = joins;
        self
    }

    /// Count into `stats` (a CM process's metrics endpoint reads them).
    pub fn with_stats(mut self, stats: Arc<CmStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Take the servers to remove on purpose from `leaves` (what a CM
    /// process's desk hears from `rowankv leave`).
    pub fn with_leaves(mut self, leaves: Leaves) -> Self {
        self.leaves = leaves;
        self
    }

    /// Remove one server that asked to leave, if any and no round is under
    /// way: as a failed server is removed (`plan_failover`: its shards' backups
    /// promoted, it taken out of every replica set), and never granted a lease
    /// again. The configuration is committed once the lease it holds ran out,
    /// as for a failure: until then it may still serve, and nothing it serves
    /// may be lost. It learns of its removal when its lease is refused, and
    /// stops.
    fn admit_leaves(&mut self, now_ns: u64) -> bool {
        if self.round.is_some() || self.active.is_none() {
            return false;
        }
        let config = self.manager.current();
        let queued = self.leaves.lock().pop();
        let Some(node) = queued.or_else(|| self.recorded_leave(&config, now_ns)) else {
            return false;
        };
        if config.member(node).is_none() {
            tracing::info!(cm = %self.name, server = %node, "asked to remove a server that is not a member");
            return false;
        }
        if config.members.len() == 1 {
            tracing::warn!(cm = %self.name, server = %node, "the last server may not leave");
            return false;
        }
        let next = match plan_failover(&config, &[node]) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(cm = %self.name, server = %node, error = %e, "the server may not leave");
                return false;
            }
        };
        let not_before = self.granted.get(&node).copied().unwrap_or(0)
            + self.settings.lease_ns
            + self.settings.lease_margin();
        self.failed.insert(node);
        self.suspects.remove(&node);
        self.rescued.remove(&node);
        let Some(term) = self.store_next(next, not_before.max(now_ns), now_ns, "a leave") else {
            return false;
        };
        CmStats::add(&self.stats.leaves, 1);
        tracing::info!(cm = %self.name, server = %node, %term, "a server leaves the configuration");
        true
    }

    /// A member whose record says it left, looked for in the store now and then:
    /// a leave handed to a CM that was not active, or to one that restarted
    /// before it removed the server, is carried out by whichever CM is active.
    fn recorded_leave(
        &mut self,
        config: &rowankv_wire::config::Config,
        now_ns: u64,
    ) -> Option<NodeId> {
        if now_ns < self.next_leave_scan_ns {
            return None;
        }
        self.next_leave_scan_ns = now_ns + LEAVE_SCAN_NS;
        let records = crate::node_records(self.manager.store().as_ref()).ok()?;
        records
            .into_iter()
            .find(|(n, r)| r.left && config.member(*n).is_some() && !self.failed.contains(n))
            .map(|(n, _)| n)
    }

    /// Add one server that joined, if any is waiting and no round is.
    fn admit_joins(&mut self, now_ns: u64) -> bool {
        if self.round.is_some() || now_ns < self.join_retry_ns {
            return false;
        }
        let Some(_) = &self.active else {
            return false;
        };
        let Some(member) = self.joins.lock().pop() else {
            return false;
        };
        let config = self.manager.current();
        let node = member.node;
        // A server that left since it asked (`rowankv leave`) never joins
        // again, whatever is queued for it.
        if crate::node_record(self.manager.store().as_ref(), node)
            .ok()
            .flatten()
            .is_some_and(|r| r.left)
        {
            tracing::info!(cm = %self.name, server = %node, "a queued join of a server that left: dropped");
            return false;
        }
        let Some(next) = plan_join(&config, member.clone()) else {
            // Already a member (it asked twice), or no valid configuration
            // holds it: nothing to do.
            return false;
        };
        let Some(term) = self.store_next(next, now_ns, now_ns, "a join") else {
            // Not stored (the store failed, or this CM lost its activity):
            // the join waits for the next try, unless the server asked again.
            let mut joins = self.joins.lock();
            if !joins.iter().any(|m| m.node == node) {
                joins.insert(0, member);
            }
            self.join_retry_ns = now_ns + self.settings.retry_ns;
            return false;
        };
        CmStats::add(&self.stats.joins, 1);
        tracing::info!(cm = %self.name, server = %node, %term, "a server joined the configuration");
        self.failed.remove(&node);
        self.rescued.remove(&node);
        self.granted.insert(node, now_ns);
        true
    }

    /// Store `next` as the active CM and start its prepare/commit round, not
    /// committed before `not_before_ns`; its term, or `None` (logged, naming
    /// `what`) if it could not be stored.
    fn store_next(
        &mut self,
        next: rowankv_wire::config::Config,
        not_before_ns: u64,
        now_ns: u64,
        what: &str,
    ) -> Option<Term> {
        let active = self.active.as_ref()?;
        match self.manager.commit_as(active, next) {
            Ok(c) => {
                CmStats::add(&self.stats.configs_stored, 1);
                self.events
                    .record(now_ns, EventKind::ConfigStored { term: c.term });
                self.start_round(c.term, not_before_ns);
                Some(c.term)
            }
            Err(e) => {
                tracing::warn!(cm = %self.name, error = %e, "storing {what}");
                None
            }
        }
    }

    /// A CM on `ep` (its NIC is the CM's node), registered in the directory as
    /// `acceptor`. `crashed`: set it to crash this CM (it stops at its next step
    /// and never renews its lease again).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: NodeId,
        manager: Arc<ConfigManager>,
        settings: FailoverSettings,
        ep: Endpoint<N>,
        acceptor: Acceptor,
        directory: Directory,
        events: Arc<EventLog>,
        crashed: Arc<AtomicBool>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        // Not `manager.current().term`: the stored configuration may be one
        // whose round a crashed CM left unfinished.
        let committed = manager.committed_term().unwrap_or(Term(0));
        let reshard = ReshardPolicy {
            overload: settings.reshard_overload,
            within: settings.reshard_within,
        };
        CmTask {
            name: format!("cm{}", node.0),
            node,
            renew_cm: Periodic::new(settings.cm_lease_ns / 4),
            watch: Periodic::new(settings.renew_ns),
            manager,
            settings,
            ep,
            acceptor,
            directory,
            links: Links::new(CONTROL_PORT),
            events,
            crashed,
            active: None,
            active_until_ns: 0,
            granted: BTreeMap::new(),
            last_step_ns: None,
            failed: BTreeSet::new(),
            suspects: BTreeMap::new(),
            rescued: BTreeSet::new(),
            round: None,
            committed,
            ready: BTreeMap::new(),
            clock,
            next_request: 1,
            pending: BTreeMap::new(),
            evs: Vec::new(),
            data: Vec::new(),
            joins: Joins::default(),
            join_retry_ns: 0,
            leaves: Leaves::default(),
            next_leave_scan_ns: 0,
            stats: Arc::default(),
            loads: BTreeMap::new(),
            weigh: Periodic::new(crate::role::WEIGH_NS),
            overloaded: BTreeSet::new(),
            reshard,
        }
    }

    fn envelope(&self, request_id: u64) -> Envelope {
        let c = self.manager.current();
        Envelope {
            cluster_id: c.cluster_id,
            term: c.term,
            request_id,
            sender: self.node,
        }
    }

    fn respond(&mut self, peer: PeerId, request_id: u64, r: Response<'_>) {
        let env = self.envelope(request_id);
        let _ = self.ep.respond(peer, &env, &Body::Response(r));
    }

    /// Hold, renew or try to take the CM lease.
    fn lead(&mut self, now_ns: u64) -> bool {
        if !self.renew_cm.due(now_ns) {
            return false;
        }
        if let Some(lease) = &self.active {
            match lease.renew() {
                Ok(()) => self.active_until_ns = now_ns + self.settings.cm_lease_ns,
                Err(e) => {
                    tracing::warn!(cm = %self.name, error = %e, "lost the CM lease: standing by");
                    self.active = None;
                    self.round = None;
                    self.pending.clear();
                }
            }
            return false;
        }
        let Ok(lease) = self
            .manager
            .acquire_active(&self.name, self.settings.cm_lease_ns)
        else {
            return false;
        };
        let Ok(config) = self.manager.reload() else {
            let _ = lease.release();
            return false;
        };
        // What the previous CMs committed meanwhile (a failed read keeps ours:
        // it only ever lags behind the truth).
        if let Ok(t) = self.manager.committed_term() {
            self.committed = self.committed.max(t);
        }
        self.active = Some(lease);
        self.active_until_ns = now_ns + self.settings.cm_lease_ns;
        let grace = self.settings.startup_grace_ns;
        self.granted = config
            .members
            .iter()
            .map(|m| (m.node, now_ns + grace))
            .collect();
        self.failed.clear();
        self.suspects.clear();
        self.rescued.clear();
        CmStats::add(&self.stats.activations, 1);
        self.events.record(
            now_ns,
            EventKind::CmActive {
                cm: self.node,
                term: config.term,
            },
        );
        // Finish whatever round the previous CM left: prepare and commit again.
        self.start_round(config.term, now_ns);
        true
    }

    fn start_round(&mut self, term: Term, not_before_ns: u64) {
        let config = self.manager.current();
        self.round = Some(Round {
            term,
            waiting: config.members.iter().map(|m| m.node).collect(),
            sent_ns: BTreeMap::new(),
            not_before_ns,
        });
    }

    /// Time this CM did not run at all — its machine stalled, or it was
    /// descheduled, for more than half a lease — is not counted against the
    /// members' leases: the renewals they sent meanwhile may not have been read,
    /// and theirs may not have been sent, since a machine-wide stall stops the
    /// servers' lease roles too. Only delays detection, which is always safe: a
    /// server's own lease runs from when it asked, so it stops serving on time
    /// whatever the CM counts. (The virtual machines here stall for up to 65 ms
    /// under load, every thread at once; without this, each such stall evicted a
    /// live server under a 50 ms lease.)
    fn discount_stall(&mut self, now_ns: u64) {
        if let Some(last) = self.last_step_ns {
            let gap = now_ns.saturating_sub(last);
            if gap > self.settings.lease_ns / 2 {
                for g in self.granted.values_mut() {
                    *g += gap;
                }
                for p in self.suspects.values_mut() {
                    p.sent_ns += gap;
                }
                tracing::info!(cm = %self.name, stalled_ms = gap / 1_000_000, "leases extended over a stall");
            }
        }
        self.last_step_ns = Some(now_ns);
    }

    /// Ask a member whose lease expired whether it is alive: a `Ping` on its
    /// control connection, which a live server answers and which changes
    /// nothing there. Its lease role may be what stalled — a thread not
    /// scheduled for longer than a lease, on a loaded machine — while the
    /// server is otherwise fine; evicting it would cost a replica for good.
    fn probe(&mut self, node: NodeId, now_ns: u64) {
        let retry = self.settings.retry_ns;
        let mut request = None;
        let mut failed = false;
        if let Some(peer) = self
            .links
            .peer(&mut self.ep, &self.directory, node, now_ns, retry)
        {
            let id = self.next_request;
            let env = self.envelope(id);
            match self.ep.request(peer, &env, &Body::Ping) {
                Ok(()) => {
                    self.next_request += 1;
                    request = Some((id, peer));
                }
                // Out of credit: no answer is owed yet; the probe times out.
                Err(SendError::Busy(..)) => {}
                // A connection that cannot take a message: the node is gone.
                Err(_) => failed = true,
            }
        }
        tracing::info!(cm = %self.name, server = %node, "lease expired: probing the server");
        self.suspects.insert(
            node,
            Probe {
                request,
                sent_ns: now_ns,
                failed,
            },
        );
    }

    /// Which members whose lease expired are failed: probe the new suspects,
    /// and return those whose probe failed or timed out, or that were rescued
    /// by a probe before and have not renewed since.
    fn confirm(&mut self, expired: Vec<NodeId>, now_ns: u64) -> Vec<NodeId> {
        let wait = self.settings.lease_ns;
        let mut dead = Vec::new();
        for n in expired {
            if self.rescued.contains(&n) {
                dead.push(n);
                continue;
            }
            match self.suspects.get(&n) {
                None => self.probe(n, now_ns),
                Some(p) if p.failed || now_ns >= p.sent_ns + wait => dead.push(n),
                Some(_) => {}
            }
        }
        dead
    }

    /// Declare members whose lease expired, and whom a probe did not find
    /// alive, failed, and store the next configuration.
    fn detect(&mut self, now_ns: u64) -> bool {
        if self.active.is_none() {
            return false;
        }
        let config = self.manager.current();
        let lease = self.settings.lease_ns;
        let expired: Vec<NodeId> = config
            .members
            .iter()
            .map(|m| m.node)
            .filter(|n| self.granted.get(n).is_none_or(|&t| now_ns > t + lease))
            .collect();
        // Suspicions that a renewal (or a probe's answer) lifted.
        self.suspects.retain(|n, _| expired.contains(n));
        if expired.is_empty() {
            return false;
        }
        let dead = self.confirm(expired, now_ns);
        if dead.is_empty() {
            return false;
        }
        let Some(_) = &self.active else {
            return false;
        };
        // Leave at least one server: with every server gone there is nothing
        // to fail over to (a cold start is the way back).
        if dead.len() == config.members.len() {
            return false;
        }
        let next = match plan_failover(&config, &dead) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(cm = %self.name, error = %e, "no failover possible");
                return false;
            }
        };
        for &d in &dead {
            if let Some(Probe {
                request: Some((_, peer)),
                failed: false,
                ..
            }) = self.suspects.remove(&d)
            {
                // Its answer will not come: give the credit back.
                self.ep.forget(peer);
            }
            self.rescued.remove(&d);
            let since_ms = self
                .granted
                .get(&d)
                .map(|&t| now_ns.saturating_sub(t) as f64 / 1e6);
            tracing::warn!(cm = %self.name, server = %d, ?since_ms, "lease expired: declaring the server failed");
            CmStats::add(&self.stats.servers_failed, 1);
            self.events
                .record(now_ns, EventKind::ServerFailed { node: d });
            self.failed.insert(d);
        }
        let margin = self.settings.lease_margin();
        let not_before = dead
            .iter()
            .map(|d| self.granted.get(d).copied().unwrap_or(0) + lease + margin)
            .max()
            .unwrap_or(now_ns)
            .max(self.round.as_ref().map_or(0, |r| r.not_before_ns));
        let stored = self
            .store_next(next, not_before, now_ns, "the next configuration")
            .is_some();
        if stored {
            CmStats::add(&self.stats.failovers, 1);
        }
        stored
    }

    /// A configuration an operator stored (a term beyond what this CM committed)
    /// is prepared and committed like one of ours.
    fn watch_store(&mut self, now_ns: u64) -> bool {
        if self.round.is_some() || !self.watch.due(now_ns) {
            return false;
        }
        match self.manager.reload() {
            Ok(c) if c.term > self.committed => {
                self.start_round(c.term, now_ns);
                true
            }
            _ => false,
        }
    }

    /// Turn one joining backup that finished copying into a backup.
    fn promote_ready(&mut self, now_ns: u64) -> bool {
        if self.round.is_some() {
            return false;
        }
        let Some(_) = &self.active else {
            return false;
        };
        while let Some(((shard, node), primary)) = self.ready.pop_first() {
            let config = self.manager.current();
            // A migration's copy is complete: the task is struck (§4.6), and
            // its source frees the shard's index when it adopts that.
            if config
                .migration(shard)
                .is_some_and(|m| m.from == primary && m.to == node)
            {
                let Some(next) = plan_migrated(&config, shard) else {
                    continue;
                };
                let stored = self
                    .store_next(next, now_ns, now_ns, "a finished migration")
                    .is_some();
                if stored {
                    CmStats::add(&self.stats.migrations_finished, 1);
                    self.events.record(
                        now_ns,
                        EventKind::MigrationFinished {
                            shard,
                            from: primary,
                            to: node,
                        },
                    );
                }
                return stored;
            }
            // The copy is the primary's: a shard that changed primary since
            // needs the new one's report.
            if config.shard(shard).map(|s| s.primary) != Some(primary) {
                continue;
            }
            let Some(next) = plan_ready(&config, shard, node) else {
                continue;
            };
            let stored = self
                .store_next(next, now_ns, now_ns, "a ready backup")
                .is_some();
            if stored {
                CmStats::add(&self.stats.backups_promoted, 1);
            }
            return stored;
        }
        false
    }

    /// Send `Prepare` to members that have not answered; commit once all have.
    fn drive_round(&mut self, now_ns: u64) -> bool {
        let retry = self.settings.retry_ns;
        let Some(round) = &self.round else {
            return false;
        };
        let term = round.term;
        let due: Vec<NodeId> = round
            .waiting
            .iter()
            .copied()
            .filter(|n| round.sent_ns.get(n).is_none_or(|&t| now_ns >= t + retry))
            .collect();
        let mut did = false;
        for node in due {
            let Some(peer) = self
                .links
                .peer(&mut self.ep, &self.directory, node, now_ns, retry)
            else {
                continue;
            };
            let id = self.next_request;
            let env = self.envelope(id);
            if self.ep.request(peer, &env, &Body::Prepare { term }).is_ok() {
                self.next_request += 1;
                self.pending.insert(id, (peer, node, term));
                if let Some(r) = &mut self.round {
                    r.sent_ns.insert(node, now_ns);
                }
                did = true;
            }
        }
        let round = self.round.as_ref().expect("checked");
        if round.waiting.is_empty() && now_ns >= round.not_before_ns {
            // Recorded first: a CM that takes over must find it committed only
            // once it is, and every commit sent is recorded.
            let Some(active) = &self.active else {
                return did;
            };
            if let Err(e) = self.manager.record_committed(active, term) {
                tracing::warn!(cm = %self.name, error = %e, %term, "recording the commit");
                return did;
            }
            let config = self.manager.current();
            for m in &config.members {
                if let Some(peer) =
                    self.links
                        .peer(&mut self.ep, &self.directory, m.node, now_ns, retry)
                {
                    let env = self.envelope(0);
                    // Fire and forget: a server that misses it learns the committed
                    // term from its next lease renewal.
                    let _ = self.ep.respond(peer, &env, &Body::Commit { term });
                }
            }
            self.committed = self.committed.max(term);
            CmStats::add(&self.stats.configs_committed, 1);
            self.events
                .record(now_ns, EventKind::ConfigCommitted { term });
            self.round = None;
            did = true;
        }
        did
    }

    fn handle(&mut self, peer: PeerId, bytes: &[u8], now_ns: u64) {
        let Ok(f) = frame::decode(bytes) else {
            return;
        };
        let h = f.header;
        // The header's sender must be the node the connection comes from (the
        // queue pair's remote node, as an RC connection authenticates it).
        if self.ep.remote(peer).map(|a| a.node) != Some(h.sender) {
            return;
        }
        let cluster_id = self.manager.current().cluster_id;
        if h.cluster_id != cluster_id && !matches!(f.body, Body::Response(_)) {
            let term = self.manager.current().term;
            self.respond(
                peer,
                h.request_id,
                Response::Error {
                    code: ErrorCode::WrongCluster,
                    term,
                    detail: "another cluster",
                },
            );
            return;
        }
        match f.body {
            // A lease request's term is not checked: a server that missed a
            // configuration learns the committed term from the answer.
            Body::Lease => {
                let config = self.manager.current();
                let Some(_) = &self.active else {
                    let term = config.term;
                    self.respond(
                        peer,
                        h.request_id,
                        Response::Error {
                            code: ErrorCode::Blocked,
                            term,
                            detail: "a standby CM",
                        },
                    );
                    return;
                };
                if config.member(h.sender).is_none() || self.failed.contains(&h.sender) {
                    let term = config.term;
                    self.respond(
                        peer,
                        h.request_id,
                        Response::Error {
                            code: ErrorCode::NotMember,
                            term,
                            detail: "removed from the configuration",
                        },
                    );
                    return;
                }
                // Stamped now, on the clock: the step began before this request
                // was read, perhaps before it was sent, and the server's lease
                // runs from its send. Granted only if it ends, with the margin,
                // before our own lease does.
                let now = self.clock.now_ns().max(now_ns);
                let margin = self.settings.lease_margin();
                if now + self.settings.lease_ns + margin > self.active_until_ns {
                    return;
                }
                self.granted.insert(h.sender, now);
                self.rescued.remove(&h.sender);
                CmStats::add(&self.stats.leases_granted, 1);
                let committed = self.committed.0;
                self.respond(peer, h.request_id, Response::Ok { version: committed });
            }
            // A member's load over its last window (§4.6): kept for `weigh`.
            Body::Load { window_ms, entries } => {
                let config = self.manager.current();
                if self.active.is_some() && config.member(h.sender).is_some() && window_ms > 0 {
                    self.loads.insert(
                        h.sender,
                        LoadReport {
                            at_ns: now_ns,
                            window_ns: u64::from(window_ms) * 1_000_000,
                            shards: rowankv_wire::frame::load_entries(entries).collect(),
                        },
                    );
                }
                let term = config.term;
                self.respond(peer, h.request_id, Response::Ok { version: term.0 });
            }
            Body::Ready { shard, node } => {
                let config = self.manager.current();
                let refusal = if self.active.is_none() {
                    Some((ErrorCode::Blocked, "a standby CM"))
                } else if h.term != config.term {
                    Some((ErrorCode::StaleTerm, "copied in another term than the CM's"))
                } else if config.shard(shard).map(|s| s.primary) != Some(h.sender)
                    && !config
                        .migration(shard)
                        .is_some_and(|m| m.from == h.sender && m.to == node)
                {
                    Some((
                        ErrorCode::NotPrimary,
                        "only the shard's primary, or its migration's source, reports a copy",
                    ))
                } else {
                    None
                };
                if let Some((code, detail)) = refusal {
                    let term = config.term;
                    self.respond(peer, h.request_id, Response::Error { code, term, detail });
                    return;
                }
                self.ready.insert((shard, node), h.sender);
                self.respond(peer, h.request_id, Response::Ok { version: 0 });
            }
            // An operator's move of a shard's primary (`rowankv reshard`).
            Body::Reshard { shard, to } => {
                let config = self.manager.current();
                let planned = if self.active.is_none() {
                    Err((ErrorCode::Blocked, "a standby CM".to_string()))
                } else if self.round.is_some() {
                    Err((
                        ErrorCode::Busy,
                        "a configuration round is under way: ask again".to_string(),
                    ))
                } else {
                    plan_migrate(&config, shard, to)
                        .map_err(|why| (ErrorCode::ConditionFailed, why))
                };
                let stored = planned.and_then(|next| {
                    let term = next.term;
                    self.store_next(next, now_ns, now_ns, "an operator's migration")
                        .map(|_| term)
                        .ok_or((
                            ErrorCode::Internal,
                            "the configuration could not be stored".into(),
                        ))
                });
                match stored {
                    Ok(term) => {
                        tracing::info!(cm = %self.name, %shard, %to, %term, "migration requested");
                        CmStats::add(&self.stats.migrations_started, 1);
                        self.respond(peer, h.request_id, Response::Ok { version: term.0 });
                    }
                    Err((code, detail)) => {
                        let term = config.term;
                        let detail = detail.as_str();
                        self.respond(peer, h.request_id, Response::Error { code, term, detail });
                    }
                }
            }
            Body::Response(r) => {
                let probed = self
                    .suspects
                    .iter()
                    .find_map(|(&n, p)| (p.request == Some((h.request_id, peer))).then_some(n));
                if let Some(node) = probed {
                    if let Response::Ok { .. } = r {
                        // Alive: one more lease period to renew by itself. The
                        // grant time only moves later, so a commit that waits
                        // for this server's lease waits longer, never shorter.
                        tracing::info!(cm = %self.name, server = %node, "the probed server is alive");
                        self.suspects.remove(&node);
                        self.granted.insert(node, now_ns);
                        self.rescued.insert(node);
                    }
                    return;
                }
                // Only on the connection the Prepare went out on.
                if self.pending.get(&h.request_id).map(|(p, ..)| *p) != Some(peer) {
                    return;
                }
                let Some((_, node, term)) = self.pending.remove(&h.request_id) else {
                    return;
                };
                let Some(round) = &mut self.round else {
                    return;
                };
                match r {
                    Response::Ok { version } if round.term == term && version >= term.0 => {
                        round.waiting.remove(&node);
                    }
                    // The member holds a later configuration than this round's
                    // (stored since, by an operator or another CM) and refuses to
                    // prepare an older one: prepare and commit the stored one
                    // instead, still waiting as long as this round had to.
                    Response::Error {
                        code: ErrorCode::StaleTerm,
                        term: held,
                        ..
                    } if round.term == term && held > term => {
                        let not_before = round.not_before_ns;
                        match self.manager.reload() {
                            Ok(c) if c.term > term => self.start_round(c.term, not_before),
                            _ => {}
                        }
                    }
                    _ => {}
                }
            }
            // Any node of the cluster may read the configuration (a server or a
            // client in another process, which cannot read the store), a page
            // a frame; a reader that sees the term change between pages starts
            // again.
            Body::Config { offset } => {
                // A standby's cache is not kept current: the store is read
                // again for the first page (later pages of another term make
                // the reader start again).
                let config = match offset {
                    0 => self
                        .manager
                        .reload()
                        .unwrap_or_else(|_| self.manager.current()),
                    _ => self.manager.current(),
                };
                let json = config.to_json();
                let page = self
                    .ep
                    .config()
                    .frame_bytes_max
                    .saturating_sub(frame::HEADER_BYTES + frame::CONFIG_RESPONSE_FIXED_BYTES);
                let start = (offset as usize).min(json.len());
                let end = (start + page).min(json.len());
                self.respond(
                    peer,
                    h.request_id,
                    Response::Config {
                        term: config.term,
                        total: json.len() as u32,
                        chunk: &json[start..end],
                    },
                );
            }
            _ => {
                let term = self.manager.current().term;
                self.respond(
                    peer,
                    h.request_id,
                    Response::Error {
                        code: ErrorCode::UnknownType,
                        term,
                        detail: "not a CM request",
                    },
                );
            }
        }
    }
}

impl<N: Nic> CmTask<N> {
    /// Dynamic resharding's detection (§4.6): from the members' latest load
    /// reports (each at most two of its windows old), each member's load per
    /// second; a member more than `reshard.overload` above the average is
    /// overloaded, and when one becomes so the CM records an `Overloaded`
    /// event with the move [`plan_reshard`] makes first; with
    /// `FailoverSettings::reshard_auto` the plan is committed
    /// (docs/resharding.md).
    fn weigh(&mut self, now_ns: u64) {
        let config = self.manager.current();
        self.loads.retain(|n, r| {
            config.member(*n).is_some() && now_ns.saturating_sub(r.at_ns) <= 2 * r.window_ns
        });
        if self.loads.len() < config.members.len() {
            self.overloaded.clear();
            return;
        }
        // Per second, so that members with other windows weigh alike.
        let mut per_shard: BTreeMap<ShardId, ShardLoad> = BTreeMap::new();
        for r in self.loads.values() {
            for &(shard, requests, writes) in &r.shards {
                let per_s = |n: u64| (n as u128 * 1_000_000_000 / r.window_ns as u128) as u64;
                let e = per_shard.entry(shard).or_default();
                e.requests += per_s(requests);
                e.replication_writes += per_s(writes);
            }
        }
        let loads = server_loads(&config, &per_shard);
        let total: u64 = loads.values().sum();
        let average = total / loads.len().max(1) as u64;
        let over: BTreeSet<NodeId> = loads
            .iter()
            .filter(|(_, &l)| {
                total > 0 && l as f64 > average as f64 * (1.0 + self.reshard.overload)
            })
            .map(|(n, _)| *n)
            .collect();
        let plan = if over.iter().any(|n| !self.overloaded.contains(n)) {
            plan_reshard(&config, &per_shard, self.reshard)
        } else {
            None
        };
        // Dynamic resharding, when enabled: the plan is committed like any
        // configuration (one reconfiguration at a time: `plan_reshard` plans
        // nothing while a migration or a joining backup is under way).
        if let Some(next) = plan
            .as_ref()
            .filter(|_| self.settings.reshard_auto && self.round.is_none())
        {
            let moves = next.migrations.len() as u64;
            if self
                .store_next(next.clone(), now_ns, now_ns, "a resharding plan")
                .is_some()
            {
                CmStats::add(&self.stats.migrations_started, moves);
            }
        }
        for &node in over.difference(&self.overloaded) {
            let first = plan
                .as_ref()
                .and_then(|p| p.migrations.iter().find(|m| m.from == node));
            tracing::info!(
                cm = %self.name, %node, load_per_s = loads[&node], average_per_s = average,
                plan = ?plan.as_ref().map(|p| &p.migrations),
                "a server is overloaded"
            );
            if let Some(m) = first {
                self.events.record(
                    now_ns,
                    EventKind::Overloaded {
                        node,
                        load_per_s: loads[&node],
                        average_per_s: average,
                        shard: m.shard,
                        to: m.to,
                    },
                );
            }
        }
        self.overloaded = over;
    }

    /// The gauges of [`CmStats`], as of the end of this step.
    fn publish_gauges(&self) {
        let config = self.manager.current();
        let st = &self.stats;
        let set = |g: &AtomicU64, v: u64| g.store(v, Ordering::Relaxed);
        set(&st.active, u64::from(self.active.is_some()));
        set(&st.term, config.term.0);
        set(&st.committed_term, self.committed.0);
        set(&st.members, config.members.len() as u64);
        let joining: usize = config.shards.iter().map(|s| s.joining.len()).sum();
        set(&st.joining_backups, joining as u64);
    }
}

impl<N: Nic> Task for CmTask<N> {
    fn name(&self) -> &str {
        &self.name
    }

    fn keeps_time(&self) -> bool {
        true
    }

    fn step(&mut self, now_ns: u64) -> Step {
        if self.crashed.load(Ordering::Acquire) {
            self.stats.active.store(0, Ordering::Relaxed);
            return Step::Done;
        }
        self.discount_stall(now_ns);
        let mut did = !self.acceptor.accept_pending(&mut self.ep).is_empty();
        self.links
            .progress(&mut self.ep, now_ns, 4 * self.settings.retry_ns);
        let mut evs = std::mem::take(&mut self.evs);
        let mut data = std::mem::take(&mut self.data);
        if let Ok(n) = self.ep.poll(&mut evs, &mut data) {
            did |= n > 0;
        }
        for ev in &evs {
            match *ev {
                Event::Message { peer, start, len } => {
                    self.handle(peer, &data[start..start + len], now_ns)
                }
                Event::SendFailed { peer, .. } => {
                    self.links.drop_peer(&mut self.ep, peer);
                    forget_peer(&mut self.pending, &mut self.ep, peer, |(p, _, _)| *p);
                    for p in self.suspects.values_mut() {
                        if p.request.is_some_and(|(_, q)| q == peer) {
                            p.failed = true;
                        }
                    }
                }
                Event::Owner(_) => {}
            }
        }
        self.evs = evs;
        self.data = data;
        did |= self.lead(now_ns);
        if self.active.is_some() {
            did |= self.detect(now_ns);
            did |= self.drive_round(now_ns);
            did |= self.promote_ready(now_ns);
            did |= self.admit_joins(now_ns);
            did |= self.admit_leaves(now_ns);
            did |= self.watch_store(now_ns);
            if self.weigh.due(now_ns) {
                self.weigh(now_ns);
            }
        }
        self.publish_gauges();
        if did {
            Step::Worked
        } else {
            Step::Idle
        }
    }
}
