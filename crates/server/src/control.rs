//! The control role of a server (seed 000 §4.1, §4.5, §4.7).
//!
//! Besides the Rowan receiver's control path (posting segments, finding used
//! ones, committing digested ones every `control_interval_ns`), this role is the
//! server's side of the failover protocol, on its own RPC endpoint
//! ([`CONTROL_PORT`] in the directory):
//! - Leases are renewed by a role of their own ([`crate::lease`]), so that the
//!   long steps of a promotion below cannot hold a renewal up.
//! - **Ping**: the CM's probe of a server whose lease it saw expire; answered
//!   with the term held, changing nothing.
//! - **Prepare / Commit** (phase 1): on `Prepare` it adopts the configuration the
//!   coordination store holds — destroying the connections of removed servers,
//!   blocking — and answers; on `Commit` (or a lease answer with that term) it
//!   unblocks.
//! - **Promotion** (phase 2) of each shard it is newly primary of, and **cold
//!   start** of each shard it is primary of after its pool was recovered: it
//!   gathers from every replica (itself included) the shard's entries in segments
//!   that may not be on every replica (`Gather`, paged), installs the union,
//!   scatters it to every other replica (`Install`) and waits for their answers,
//!   raises the shard's version past every version seen, and only then serves the
//!   shard. The union covers every acknowledged write: an acknowledged write is
//!   durable on every replica of its term, the new primary included.
//! - **Re-replication** (phase 3): for each joining backup of a shard it serves,
//!   once every write that started before the backup joined has finished, it
//!   copies the shard's index entries to it (`Install`) and tells the CM
//!   (`Ready`), which makes it a full backup.
//!
//! Every request it sends is sent again after four `retry_ns` without an answer;
//! `Gather` and `Install` are idempotent (a cursor, answered from one walk kept for
//! the term; version-conditional installation), and an answer is applied only to
//! the cursor or page it was asked for, in the term it was asked in.

use std::collections::BTreeMap;
use std::sync::Arc;

use crossbeam::channel::Receiver;
use rowankv_engine::entry;
use rowankv_fabric::Nic;
use rowankv_rpc::directory::{Acceptor, Directory};
use rowankv_rpc::endpoint::{Endpoint, Event, PeerId};
use rowankv_types::{NodeId, ShardId, Term};
use rowankv_wire::config::Config;
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Response, HEADER_BYTES};

use crate::events::EventKind;
use crate::runtime::{Periodic, Step, Task};
use crate::server::ServerShared;
use crate::services::ReplicationServices;
use crate::worker::{read_frame, Inbound};

/// The directory port of a server's control role (workers use 0..workers).
pub const CONTROL_PORT: u16 = u16::MAX;
/// The directory port of a CM.
pub const CM_PORT: u16 = 0;

/// An outgoing connection of a control endpoint.
pub(crate) enum Link {
    Connecting {
        peer: PeerId,
        reply: Receiver<Result<rowankv_rpc::directory::Accepted, String>>,
        since_ns: u64,
    },
    Up(PeerId),
}

/// Outgoing connections by node, made through the directory and remade after
/// a failure (not more often than every `retry_ns`).
pub struct Links {
    port: u16,
    links: BTreeMap<NodeId, Link>,
    last_attempt: BTreeMap<NodeId, u64>,
}

impl Links {
    /// No connections yet; they go to `port` on each node.
    pub fn new(port: u16) -> Links {
        Links {
            port,
            links: BTreeMap::new(),
            last_attempt: BTreeMap::new(),
        }
    }

    /// The connected peer for `node`, starting a connection if there is none.
    pub fn peer<N: Nic>(
        &mut self,
        ep: &mut Endpoint<N>,
        directory: &Directory,
        node: NodeId,
        now_ns: u64,
        retry_ns: u64,
    ) -> Option<PeerId> {
        match self.links.get(&node) {
            Some(Link::Up(p)) => return Some(*p),
            Some(Link::Connecting { .. }) => return None,
            None => {}
        }
        if self
            .last_attempt
            .get(&node)
            .is_some_and(|&t| now_ns < t + retry_ns)
        {
            return None;
        }
        self.last_attempt.insert(node, now_ns);
        if let Ok((peer, reply)) = directory.connect_async(ep, node, self.port) {
            self.links.insert(
                node,
                Link::Connecting {
                    peer,
                    reply,
                    since_ns: now_ns,
                },
            );
        }
        None
    }

    /// Finish connections whose answer arrived; give up on those that took
    /// longer than `timeout_ns`.
    pub fn progress<N: Nic>(&mut self, ep: &mut Endpoint<N>, now_ns: u64, timeout_ns: u64) {
        let mut done = Vec::new();
        for (&node, link) in &self.links {
            if let Link::Connecting {
                peer,
                reply,
                since_ns,
            } = link
            {
                match reply.try_recv() {
                    Ok(Ok(accepted)) => {
                        let up = ep.connect(*peer, accepted.qp).is_ok();
                        done.push((node, *peer, up));
                    }
                    Ok(Err(_)) => done.push((node, *peer, false)),
                    Err(_) if now_ns >= since_ns + timeout_ns => done.push((node, *peer, false)),
                    Err(_) => {}
                }
            }
        }
        for (node, peer, up) in done {
            if up {
                self.links.insert(node, Link::Up(peer));
            } else {
                // Its slot is free again: a peer that keeps failing costs nothing.
                ep.close(peer);
                self.links.remove(&node);
            }
        }
    }

    /// Forget the connection to whoever is behind `peer` (its send failed),
    /// and close it; a later request connects again.
    pub fn drop_peer<N: Nic>(&mut self, ep: &mut Endpoint<N>, peer: PeerId) {
        let before = self.links.len();
        self.links
            .retain(|_, l| !matches!(l, Link::Up(p) if *p == peer));
        if self.links.len() < before {
            ep.close(peer);
        }
    }
}

/// Drop the outstanding requests (by request id) that went to `peer`, whose
/// connection failed, and give their credits back.
pub fn forget_peer<N: Nic, V>(
    pending: &mut BTreeMap<u64, V>,
    ep: &mut Endpoint<N>,
    peer: PeerId,
    peer_of: impl Fn(&V) -> PeerId,
) {
    pending.retain(|_, v| {
        let lost = peer_of(v) == peer;
        if lost {
            ep.forget(peer);
        }
        !lost
    });
}

/// Give up the outstanding requests (by request id) sent `limit_ns` or longer
/// ago and give their credits back, so that a peer that died or lost them does
/// not hold credits forever; whoever sent them asks again. `sent` gives a
/// request's send time and peer.
pub(crate) fn expire_pending<N: Nic, V>(
    pending: &mut BTreeMap<u64, V>,
    ep: &mut Endpoint<N>,
    now_ns: u64,
    limit_ns: u64,
    sent: impl Fn(&V) -> (u64, PeerId),
) {
    pending.retain(|_, v| {
        let (at, peer) = sent(v);
        let lost = now_ns >= at + limit_ns;
        if lost {
            ep.forget(peer);
        }
        !lost
    });
}

/// Split concatenated encoded entries.
pub(crate) fn split_entries(mut bytes: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let e = entry::parse_entry(bytes).map_err(|e| e.to_string())?;
        let (one, rest) = bytes.split_at(e.encoded_len);
        out.push(one);
        bytes = rest;
    }
    Ok(out)
}

/// Pack entries into pages of at most `max` bytes (every entry fits one page).
fn pack<'a>(entries: impl Iterator<Item = &'a [u8]>, max: usize) -> Vec<Vec<u8>> {
    let mut pages: Vec<Vec<u8>> = Vec::new();
    for e in entries {
        match pages.last_mut() {
            Some(p) if p.len() + e.len() <= max => p.extend_from_slice(e),
            _ => pages.push(e.to_vec()),
        }
    }
    pages
}

/// Encoded entries by shard (one walk of the segments for several shards).
type EntriesByShard = BTreeMap<ShardId, Vec<Vec<u8>>>;

/// What an outstanding request of the control role was for.
#[derive(Clone, Debug)]
enum Pending {
    /// `term`: the jobs term it was sent in; an answer to an earlier term's
    /// recovery must not move the current one's cursors.
    Gather {
        shard: ShardId,
        from: NodeId,
        term: Term,
        cursor: u32,
    },
    Install {
        shard: ShardId,
        to: NodeId,
        page: usize,
        term: Term,
    },
    Ready,
    /// A page of a migration's hand-over (§4.6).
    Migrate {
        shard: ShardId,
        to: NodeId,
        page: usize,
    },
}

/// Gathering from one replica.
#[derive(Clone, Debug, Default)]
struct Source {
    cursor: u32,
    done: bool,
    asked_ns: Option<u64>,
}

/// Sending pages to one replica.
#[derive(Clone, Debug, Default)]
struct Target {
    next_page: usize,
    asked_ns: Option<u64>,
}

/// Promotion or cold start of one shard.
struct Recovery {
    sources: BTreeMap<NodeId, Source>,
    /// The union, by version.
    entries: BTreeMap<u64, Vec<u8>>,
    /// After gathering: the pages and who still needs them.
    pages: Vec<Vec<u8>>,
    targets: BTreeMap<NodeId, Target>,
    scattering: bool,
    /// Installing the union here failed: tried again from this time.
    install_retry_at_ns: Option<u64>,
    /// Failed attempts to install the union here (for tests and logs).
    install_failures: u32,
}

/// Re-replication of one shard to one joining backup, or the copy of a
/// migration this server is the source of (§4.6).
struct Copy {
    pages: Option<Vec<Vec<u8>>>,
    entries: u64,
    target: Target,
    ready_sent_ns: Option<u64>,
    /// A migration's copy: the hand-over goes before the entries.
    migration: bool,
    /// Taken with the pages (a migration's copy only).
    handover: Option<Handover>,
}

impl Copy {
    fn new(migration: bool) -> Copy {
        Copy {
            pages: None,
            entries: 0,
            target: Target::default(),
            ready_sent_ns: None,
            migration,
            handover: None,
        }
    }
}

/// What a migration's source hands its target before the entries: the
/// shard's next version and its request outcomes, in pages.
struct Handover {
    next_version: u64,
    /// Encoded outcomes ([`frame::encode_outcomes`]), one page a frame; at
    /// least one (the last says the hand-over is complete).
    pages: Vec<Vec<u8>>,
    target: Target,
}

/// A shard this server is the target of a migration of, as handed over so far.
struct Incoming {
    from: NodeId,
    next_version: u64,
    /// The source's request outcomes, recorded here when the shard is taken
    /// over — after the entries below `next_version` (and their outcomes)
    /// are dropped.
    outcomes: Vec<(rowankv_types::RequestRecord, rowankv_types::Version)>,
    /// The last page arrived: every outcome is recorded.
    complete: bool,
}

/// The control role of one server.
pub struct ControlTask<N: Nic> {
    name: String,
    shared: Arc<ServerShared<N>>,
    rowan: Periodic,
    ep: Endpoint<N>,
    acceptor: Acceptor,
    /// The server's replication paths' receiving side (`crate::services`).
    services: ReplicationServices<N>,
    directory: Directory,
    /// The CMs, told when a joining backup is ready.
    cms: Vec<NodeId>,
    cm_links: Links,
    peer_links: Links,
    /// Gives up unanswered requests.
    expiry: Periodic,
    next_request: u64,
    /// Outstanding requests: id → (peer, sent at, what for).
    pending: BTreeMap<u64, (PeerId, u64, Pending)>,
    /// The jobs of this configuration term.
    jobs_term: Term,
    jobs_epoch: u64,
    recoveries: BTreeMap<ShardId, Recovery>,
    copies: BTreeMap<(ShardId, NodeId), Copy>,
    /// Migrations to this server, as handed over (this term's jobs).
    incoming: BTreeMap<ShardId, Incoming>,
    /// Shards migrating here whose recovery (promotion or cold start) is done:
    /// they are served once handed over.
    recovered: std::collections::BTreeSet<ShardId>,
    /// Gather answers being paged out, per asking primary: taken in one walk of
    /// the segments for every shard it is recovering (they take no new writes
    /// until recovered), in the term they were taken.
    gathered: BTreeMap<NodeId, (Term, EntriesByShard)>,
    /// This server's own entries of the shards it is recovering, in one walk.
    own: Option<(Term, EntriesByShard)>,
    events: Vec<Event>,
    data: Vec<u8>,
}

impl<N: Nic> ControlTask<N> {
    pub fn new(
        shared: Arc<ServerShared<N>>,
        ep: Endpoint<N>,
        acceptor: Acceptor,
        directory: Directory,
        cms: Vec<NodeId>,
        services: ReplicationServices<N>,
    ) -> Self {
        let f = &shared.settings.failover;
        ControlTask {
            services,
            name: format!("s{}-control", shared.node.0),
            rowan: Periodic::new(shared.settings.control_interval_ns),
            expiry: Periodic::new(f.renew_ns),
            ep,
            acceptor,
            directory,
            cms,
            cm_links: Links::new(CM_PORT),
            peer_links: Links::new(CONTROL_PORT),
            next_request: 1,
            pending: BTreeMap::new(),
            jobs_term: Term(0),
            jobs_epoch: u64::MAX,
            recoveries: BTreeMap::new(),
            copies: BTreeMap::new(),
            incoming: BTreeMap::new(),
            recovered: Default::default(),
            gathered: BTreeMap::new(),
            own: None,
            events: Vec::new(),
            data: Vec::new(),
            shared,
        }
    }

    fn envelope(&self, request_id: u64) -> Envelope {
        let c = self.shared.config();
        Envelope {
            cluster_id: c.cluster_id,
            term: c.term,
            request_id,
            sender: self.shared.node,
        }
    }

    fn request(&mut self, peer: PeerId, body: &Body<'_>, what: Pending, now_ns: u64) -> bool {
        let id = self.next_request;
        let env = self.envelope(id);
        match self.ep.request(peer, &env, body) {
            Ok(()) => {
                self.next_request += 1;
                self.pending.insert(id, (peer, now_ns, what));
                true
            }
            Err(e) => {
                tracing::debug!(role = %self.name, error = %e, "control request not sent");
                false
            }
        }
    }

    /// What `rowankv status` shows of this server (`Body::Stats`): its term,
    /// how long its lease still runs (negative: expired), its segments by
    /// owner and state, DLWA since start when its pool has a media model, and
    /// its request counters.
    fn stats_json(&self) -> Vec<u8> {
        let s = &self.shared;
        let now = s.now_ns();
        let lease_ms = (s.lease_until_ns() as i128 - now as i128) as f64 / 1e6;
        let segments: serde_json::Map<String, serde_json::Value> = s
            .engine
            .segment_census()
            .into_iter()
            .map(|((owner, state), n)| {
                (
                    format!("{owner:?}/{state:?}").to_lowercase(),
                    serde_json::Value::from(n),
                )
            })
            .collect();
        let dlwa = s.engine.pool().media().map(|m| m.stats().dlwa());
        let st = &s.stats;
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        serde_json::json!({
            "node": s.node.0,
            "term": s.term().0,
            "strategy": s.strategy.name(),
            "lease_remaining_ms": lease_ms,
            "free_segments": s.engine.free_segments(),
            "segments": segments,
            "dlwa": dlwa,
            "puts": n(&st.puts),
            "gets": n(&st.gets),
            "dels": n(&st.dels),
            "replicated_in": n(&st.replicated_in),
            "installed": n(&st.installed),
            "rejected_blocked": n(&st.rejected_blocked),
            "rejected_stale_term": n(&st.rejected_stale_term),
        })
        .to_string()
        .into_bytes()
    }

    fn respond(&mut self, peer: PeerId, request_id: u64, r: Response<'_>) {
        let env = self.envelope(request_id);
        if let Err(e) = self.ep.respond(peer, &env, &Body::Response(r)) {
            tracing::debug!(role = %self.name, error = %e, "control response not sent");
        }
    }

    fn reject(&mut self, peer: PeerId, request_id: u64, code: ErrorCode, detail: &str) {
        let term = self.shared.term();
        self.respond(peer, request_id, Response::Error { code, term, detail });
    }

    fn handle_request(&mut self, peer: PeerId, bytes: &[u8], now_ns: u64) {
        let f = match read_frame(&self.ep, peer, bytes) {
            Inbound::Frame(f) => f,
            Inbound::Refuse {
                request_id,
                code,
                detail,
            } => {
                self.reject(peer, request_id, code, &detail);
                return;
            }
            Inbound::Drop(why) => {
                tracing::debug!(role = %self.name, why, "frame dropped");
                return;
            }
        };
        let h = f.header;
        if let Body::Response(r) = f.body {
            self.on_response(h.request_id, &r, now_ns);
            return;
        }
        let config = self.shared.config();
        if h.cluster_id != config.cluster_id {
            self.reject(
                peer,
                h.request_id,
                ErrorCode::WrongCluster,
                "another cluster",
            );
            return;
        }
        // Only a CM prepares, commits or probes (`read_frame` made sure the
        // header's sender is the node the connection comes from): one of the
        // CMs' nodes, or, in a process that knows the CMs by address only,
        // a node that answered this process at a CM's address.
        if matches!(
            f.body,
            Body::Prepare { .. } | Body::Commit { .. } | Body::Ping
        ) && !self.cms.contains(&h.sender)
            && !self.directory.is_behind_alias(h.sender)
        {
            let detail = format!("{} is not a CM of this cluster", h.sender);
            self.reject(peer, h.request_id, ErrorCode::NotMember, &detail);
            return;
        }
        match f.body {
            Body::Prepare { term } | Body::Commit { term }
                if term < self.shared.term() || h.term < self.shared.term() =>
            {
                // A deposed CM's round, or one delayed on the way: the server
                // already adopted a later configuration. Refused before anything
                // is fetched or unblocked. (A CM's header carries the term of
                // the round too.)
                let detail = format!(
                    "{:?} of term {term} (header term {}), this server holds {}",
                    f.body.msg_type(),
                    h.term,
                    self.shared.term()
                );
                self.reject(peer, h.request_id, ErrorCode::StaleTerm, &detail);
            }
            Body::Prepare { term } => {
                let held = self.shared.refresh_config().term;
                if held >= term {
                    self.respond(peer, h.request_id, Response::Ok { version: held.0 });
                } else {
                    let detail = format!("the store holds {held:?}, not {term:?}");
                    self.reject(peer, h.request_id, ErrorCode::StaleTerm, &detail);
                }
            }
            Body::Commit { term } => {
                self.shared.learn_committed(term);
                let held = self.shared.term();
                self.respond(peer, h.request_id, Response::Ok { version: held.0 });
            }
            // The CM asks whether a server whose lease it saw expire is alive;
            // answering changes nothing here, so any term will do: a CM that
            // just took over may hold a term this server has not adopted yet.
            Body::Ping => {
                let held = self.shared.term();
                self.respond(peer, h.request_id, Response::Ok { version: held.0 });
            }
            // Anyone connected (they proved the cluster's secret) may ask.
            Body::Stats => {
                let json = self.stats_json();
                let term = self.shared.term();
                self.respond(
                    peer,
                    h.request_id,
                    Response::Value {
                        version: term.0,
                        value: &json,
                        expires_at_ms: None,
                    },
                );
            }
            Body::Gather { shard, cursor } => self.handle_gather(peer, &h, shard, cursor),
            Body::Install { shard, entries } => self.handle_install(peer, &h, shard, entries),
            Body::Migrate {
                shard,
                next_version,
                last,
                outcomes,
            } => self.handle_migrate(peer, &h, shard, next_version, last, outcomes),
            _ => {
                let detail = format!("{:?} is not for a server's control role", f.body.msg_type());
                self.reject(peer, h.request_id, ErrorCode::UnknownType, &detail);
            }
        }
    }

    /// Terms must match: a newer one is fetched first; an older one is refused.
    fn same_term(&mut self, peer: PeerId, h: &frame::Header) -> Option<Arc<Config>> {
        if h.term > self.shared.term() {
            self.shared.refresh_config();
        }
        let config = self.shared.config();
        if h.term != config.term {
            let detail = format!("request term {}, server term {}", h.term, config.term);
            self.reject(peer, h.request_id, ErrorCode::StaleTerm, &detail);
            return None;
        }
        Some(config)
    }

    fn handle_gather(&mut self, peer: PeerId, h: &frame::Header, shard: ShardId, cursor: u32) {
        let Some(config) = self.same_term(peer, h) else {
            return;
        };
        let Some(assignment) = config.shard(shard) else {
            let detail = format!("{shard} is not in term {}", config.term);
            self.reject(peer, h.request_id, ErrorCode::NotPrimary, &detail);
            return;
        };
        if assignment.primary != h.sender {
            let detail = format!("{} is not the primary of {shard}", h.sender);
            self.reject(peer, h.request_id, ErrorCode::NotPrimary, &detail);
            return;
        }
        if !assignment.write_targets().any(|b| b == self.shared.node) {
            let detail = format!(
                "{} does not replicate {shard} in term {}",
                self.shared.node, config.term
            );
            self.reject(peer, h.request_id, ErrorCode::NotMember, &detail);
            return;
        }
        let fresh = self
            .gathered
            .get(&h.sender)
            .is_some_and(|(t, m)| *t == config.term && m.contains_key(&shard));
        if !fresh {
            // Every shard the asker is primary of and this server replicates, in one
            // walk, kept for the term: the asker resends a page it has not had an
            // answer to, and must get the same list again, not a fresh walk (a
            // walk can take longer than its resend interval). A shard asked again
            // after its list was dropped (on the asker's Install) is walked alone.
            let asked_before = self
                .gathered
                .get(&h.sender)
                .is_some_and(|(t, _)| *t == config.term);
            let shards: Vec<ShardId> = if asked_before {
                vec![shard]
            } else {
                config
                    .shards
                    .iter()
                    .filter(|s| {
                        s.primary == h.sender && s.write_targets().any(|b| b == self.shared.node)
                    })
                    .map(|s| s.shard)
                    .collect()
            };
            if let Err(why) = self.shared.drain_redo() {
                // Acknowledged entries wait in the redo rings for room in the
                // b-log: the walk would miss them. The asker retries.
                self.reject(peer, h.request_id, ErrorCode::Busy, &why);
                return;
            }
            match self
                .shared
                .engine
                .uncommitted_entries_of(&shards, &self.shared.recovered_open)
            {
                Ok(mut found) => {
                    let entry = self
                        .gathered
                        .entry(h.sender)
                        .or_insert_with(|| (config.term, BTreeMap::new()));
                    if entry.0 != config.term {
                        *entry = (config.term, BTreeMap::new());
                    }
                    for s in shards {
                        entry.1.insert(s, found.remove(&s).unwrap_or_default());
                    }
                }
                Err(e) => {
                    self.reject(peer, h.request_id, ErrorCode::Internal, &e.to_string());
                    return;
                }
            }
        }
        let list = &self.gathered[&h.sender].1[&shard];
        let max = self.ep.config().frame_bytes_max - HEADER_BYTES - 6;
        let mut page = Vec::new();
        let mut next = cursor as usize;
        while next < list.len() && page.len() + list[next].len() <= max {
            page.extend_from_slice(&list[next]);
            next += 1;
        }
        let more = next < list.len();
        self.respond(
            peer,
            h.request_id,
            Response::Entries {
                next: next as u32,
                more,
                entries: &page,
            },
        );
    }

    fn handle_install(&mut self, peer: PeerId, h: &frame::Header, shard: ShardId, entries: &[u8]) {
        let Some(config) = self.same_term(peer, h) else {
            return;
        };
        let ok = config.shard(shard).is_some_and(|s| {
            s.primary == h.sender && s.write_targets().any(|b| b == self.shared.node)
        });
        let me = self.shared.node;
        let migrating_here = config
            .migration(shard)
            .is_some_and(|m| m.from == h.sender && m.to == me);
        if migrating_here && !self.shared.shard_ready(shard) {
            // The copy goes in only after the hand-over (which drops what
            // an earlier time here left of the shard): the source hands over
            // again when told so.
            let detail = format!("{shard} is not handed over here yet");
            self.reject(peer, h.request_id, ErrorCode::Blocked, &detail);
            return;
        }
        if !ok && !migrating_here {
            let detail = format!("{} may not install {shard} here", h.sender);
            self.reject(peer, h.request_id, ErrorCode::NotPrimary, &detail);
            return;
        }
        // The asker has gathered this shard: its list here is no longer needed.
        if let Some((t, m)) = self.gathered.get_mut(&h.sender) {
            if *t == config.term {
                m.remove(&shard);
            }
        }
        let foreign = split_entries(entries).map(|list| {
            list.iter()
                .any(|e| entry::parse_entry(e).is_ok_and(|p| p.shard != shard))
        });
        match foreign {
            Ok(false) => {}
            Ok(true) => {
                self.reject(
                    peer,
                    h.request_id,
                    ErrorCode::Malformed,
                    "an entry of another shard",
                );
                return;
            }
            Err(e) => {
                self.reject(peer, h.request_id, ErrorCode::Malformed, &e);
                return;
            }
        }
        match self.shared.engine.install_entries(0, entries) {
            Ok(r) => {
                for seg in r.sealed {
                    self.shared.blog.enqueue_used(seg);
                }
                self.shared
                    .stats
                    .installed
                    .fetch_add(r.installed as u64, std::sync::atomic::Ordering::Relaxed);
                self.respond(peer, h.request_id, Response::Ok { version: 0 });
            }
            Err(e) => self.reject(peer, h.request_id, ErrorCode::Internal, &e.to_string()),
        }
    }

    /// A page of the hand-over of a shard migrating here (§4.6): its request
    /// outcomes are kept, to be recorded when the shard is taken over (a
    /// retry of a request the source executed is answered, never executed
    /// again); the last page completes the hand-over, and the shard is served
    /// once it is also recovered ([`ControlTask::run_takeovers`]).
    fn handle_migrate(
        &mut self,
        peer: PeerId,
        h: &frame::Header,
        shard: ShardId,
        next_version: u64,
        last: bool,
        outcomes: &[u8],
    ) {
        let Some(config) = self.same_term(peer, h) else {
            return;
        };
        let me = self.shared.node;
        if !config
            .migration(shard)
            .is_some_and(|m| m.from == h.sender && m.to == me)
        {
            let detail = format!("{shard} does not migrate from {} to {me}", h.sender);
            self.reject(peer, h.request_id, ErrorCode::NotPrimary, &detail);
            return;
        }
        let list = frame::outcomes_in(outcomes).map(|(r, v)| (r, rowankv_types::Version(v)));
        let taken = self.shared.shard_ready(shard);
        if taken {
            // Taken over already (the source handed over again after a
            // restart of its own): the outcomes are recorded at once.
            if let Err(e) = self.shared.engine.note_outcomes(shard, list) {
                self.reject(peer, h.request_id, ErrorCode::Internal, &e.to_string());
                return;
            }
        }
        let i = self.incoming.entry(shard).or_insert(Incoming {
            from: h.sender,
            next_version,
            outcomes: Vec::new(),
            complete: false,
        });
        if !taken {
            if i.complete || i.next_version != next_version {
                // A new hand-over (the source started over): from its first page.
                i.outcomes.clear();
                i.complete = false;
            }
            // Bounded by the source's table (REQUEST_CLIENTS_MAX × REQUEST_WINDOW).
            i.outcomes
                .extend(frame::outcomes_in(outcomes).map(|(r, v)| (r, rowankv_types::Version(v))));
        }
        i.next_version = next_version;
        i.complete |= last;
        self.respond(peer, h.request_id, Response::Ok { version: 0 });
    }

    /// Serve each shard migrating here that is handed over and recovered:
    /// first drop what an earlier time here left of it (entries below the
    /// source's next version: every one of them is the source's to copy, and
    /// may be stale here), then raise its versions past the source's, so
    /// every write here wins over the copy's.
    fn run_takeovers(&mut self, now_ns: u64) -> bool {
        let config = self.shared.config();
        let me = self.shared.node;
        let due: Vec<(ShardId, NodeId, u64)> = self
            .incoming
            .iter()
            .filter(|(s, i)| {
                i.complete
                    && self.recovered.contains(s)
                    && !self.shared.shard_ready(**s)
                    && config
                        .migration(**s)
                        .is_some_and(|m| m.from == i.from && m.to == me)
            })
            .map(|(s, i)| (*s, i.from, i.next_version))
            .collect();
        for &(shard, from, next_version) in &due {
            match self
                .shared
                .engine
                .forget_below(shard, rowankv_types::Version(next_version))
            {
                Ok(dropped) => {
                    tracing::info!(role = %self.name, %shard, %from, next_version, dropped, "taking a migrating shard over");
                }
                Err(e) => {
                    tracing::error!(role = %self.name, %shard, error = %e, "dropping a migrating shard's old entries");
                    continue;
                }
            }
            let outcomes = self
                .incoming
                .get_mut(&shard)
                .map(|i| std::mem::take(&mut i.outcomes))
                .unwrap_or_default();
            if let Err(e) = self.shared.engine.note_outcomes(shard, outcomes) {
                tracing::error!(role = %self.name, %shard, error = %e, "recording a migrating shard's outcomes");
                continue;
            }
            self.shared.versions.raise(shard, next_version);
            self.shared.set_shard_ready(shard);
            self.shared.events.record(
                now_ns,
                EventKind::MigrationServed {
                    shard,
                    from,
                    to: me,
                },
            );
        }
        !due.is_empty()
    }

    fn on_response(&mut self, request_id: u64, r: &Response<'_>, now_ns: u64) {
        let Some((_, _, what)) = self.pending.remove(&request_id) else {
            return;
        };
        match what {
            Pending::Gather {
                shard,
                from,
                term,
                cursor,
            } => {
                let Some(rec) = self
                    .recoveries
                    .get_mut(&shard)
                    .filter(|_| term == self.jobs_term)
                else {
                    return;
                };
                // Only the answer for the page asked for now: a late answer to a
                // resent ask must not move the cursor back.
                let Some(src) = rec
                    .sources
                    .get_mut(&from)
                    .filter(|s| !s.done && s.cursor == cursor)
                else {
                    return;
                };
                src.asked_ns = None;
                if let Response::Entries {
                    next,
                    more,
                    entries,
                } = *r
                {
                    match split_entries(entries) {
                        Ok(list) => {
                            for e in list {
                                if let Ok(p) = entry::parse_entry(e) {
                                    if p.shard == shard {
                                        rec.entries
                                            .entry(p.version.0)
                                            .or_insert_with(|| e.to_vec());
                                    }
                                }
                            }
                            src.cursor = next;
                            src.done = !more;
                        }
                        Err(e) => {
                            tracing::warn!(role = %self.name, %from, error = %e, "bad gather page");
                            src.cursor = 0;
                        }
                    }
                } else {
                    // Refused (a term not yet adopted there): ask again later.
                    src.asked_ns = Some(now_ns);
                }
            }
            Pending::Install {
                shard,
                to,
                page,
                term,
            } => {
                let ok = matches!(r, Response::Ok { .. });
                // Copies carry over terms; recoveries start over.
                let recovery = self
                    .recoveries
                    .get_mut(&shard)
                    .filter(|_| term == self.jobs_term);
                if let Some(c) = self
                    .copies
                    .get_mut(&(shard, to))
                    .filter(|c| c.migration && recovery.is_none())
                {
                    // The target has not taken the shard over (it restarted,
                    // or is still recovering): hand over again, then copy.
                    if matches!(
                        r,
                        Response::Error {
                            code: ErrorCode::Blocked,
                            ..
                        }
                    ) {
                        if let Some(h) = c.handover.as_mut() {
                            h.target = Target::default();
                        }
                        c.target = Target::default();
                        c.target.asked_ns = Some(now_ns);
                        return;
                    }
                }
                let target = if let Some(rec) = recovery {
                    rec.targets.get_mut(&to)
                } else if let Some(c) = self.copies.get_mut(&(shard, to)) {
                    Some(&mut c.target)
                } else {
                    None
                };
                if let Some(t) = target {
                    if ok && t.next_page == page {
                        t.next_page += 1;
                        t.asked_ns = None;
                    } else if !ok {
                        t.asked_ns = Some(now_ns);
                    }
                }
            }
            Pending::Ready => {}
            Pending::Migrate { shard, to, page } => {
                let ok = matches!(r, Response::Ok { .. });
                let Some(h) = self
                    .copies
                    .get_mut(&(shard, to))
                    .and_then(|c| c.handover.as_mut())
                else {
                    return;
                };
                if ok && h.target.next_page == page {
                    h.target.next_page += 1;
                    h.target.asked_ns = None;
                } else if !ok {
                    h.target.asked_ns = Some(now_ns);
                }
            }
        }
    }

    /// Plan promotions, cold-start recoveries and copies for the configuration
    /// held, once it is committed. True when the jobs are those of the held term.
    fn plan(&mut self) -> bool {
        let epoch = self.shared.config_epoch();
        let config = self.shared.config();
        if self.shared.committed_term() < config.term {
            return false; // blocked: wait for the commit
        }
        if epoch == self.jobs_epoch && self.jobs_term == config.term {
            return true;
        }
        self.jobs_epoch = epoch;
        if self.jobs_term != config.term {
            // Replicas changed: recoveries start over against the new replicas. A
            // copy to a backup that is still joining a shard this server still
            // leads stays valid (every write since it joined went to it too).
            self.recoveries.clear();
            self.recovered.clear();
            let me = self.shared.node;
            let mut ended = Vec::new();
            self.copies.retain(|(shard, to), c| {
                let keep = if c.migration {
                    config
                        .migration(*shard)
                        .is_some_and(|m| m.from == me && m.to == *to)
                } else {
                    config
                        .shard(*shard)
                        .is_some_and(|s| s.primary == me && s.joining.contains(to))
                };
                if !keep && c.migration {
                    ended.push(*shard);
                }
                keep
            });
            // A migration from here ended (finished, or rolled back by a
            // failover): a shard this server holds no replica of any more has
            // its index freed (§4.6); its entries go with cleaning.
            for shard in ended {
                if config.shard(shard).is_some_and(|s| !s.is_replica(me)) {
                    match self
                        .shared
                        .engine
                        .forget_below(shard, rowankv_types::Version(u64::MAX))
                    {
                        Ok(n) => {
                            tracing::info!(role = %self.name, %shard, freed = n, "a migrated shard's index freed")
                        }
                        Err(e) => {
                            tracing::error!(role = %self.name, %shard, error = %e, "freeing a migrated shard's index")
                        }
                    }
                }
            }
            self.incoming.retain(|shard, i| {
                config
                    .migration(*shard)
                    .is_some_and(|m| m.from == i.from && m.to == me)
            });
            self.jobs_term = config.term;
        }
        for m in config
            .migrations
            .iter()
            .filter(|m| m.from == self.shared.node)
        {
            self.copies
                .entry((m.shard, m.to))
                .or_insert_with(|| Copy::new(true));
        }
        let me = self.shared.node;
        for s in config.primary_shards(me) {
            if !self.shared.shard_ready(s.shard) {
                self.recoveries.entry(s.shard).or_insert_with(|| Recovery {
                    sources: s.write_targets().map(|b| (b, Source::default())).collect(),
                    entries: BTreeMap::new(),
                    pages: Vec::new(),
                    targets: BTreeMap::new(),
                    scattering: false,
                    install_retry_at_ns: None,
                    install_failures: 0,
                });
            } else {
                for j in &s.joining {
                    self.copies
                        .entry((s.shard, *j))
                        .or_insert_with(|| Copy::new(false));
                }
            }
        }
        true
    }

    /// How long an unanswered `Gather` or `Install` waits before it is sent
    /// again: as long as it is kept pending (a walk or an installation can take
    /// longer than `retry_ns`, and every resent one is answered too).
    fn resend_ns(&self) -> u64 {
        4 * self.shared.settings.failover.retry_ns
    }

    /// Send page `page` of `shard` (a recovery's union, or a copy) to `to`.
    fn send_install(
        &mut self,
        peer: PeerId,
        shard: ShardId,
        to: NodeId,
        page: usize,
        entries: &[u8],
        now_ns: u64,
    ) -> bool {
        let what = Pending::Install {
            shard,
            to,
            page,
            term: self.jobs_term,
        };
        self.request(peer, &Body::Install { shard, entries }, what, now_ns)
    }

    fn page_bytes_max(&self) -> usize {
        self.ep.config().frame_bytes_max - HEADER_BYTES - 2
    }

    /// Drive promotions and cold-start recoveries.
    fn run_recoveries(&mut self, now_ns: u64) -> bool {
        let retry = self.shared.settings.failover.retry_ns;
        let resend = self.resend_ns();
        let mut did = false;
        let shards: Vec<ShardId> = self.recoveries.keys().copied().collect();
        for shard in shards {
            // Ask every source that is not done and not waiting.
            let asks: Vec<(NodeId, u32)> = self.recoveries[&shard]
                .sources
                .iter()
                .filter(|(_, s)| !s.done && s.asked_ns.is_none_or(|t| now_ns >= t + resend))
                .map(|(n, s)| (*n, s.cursor))
                .collect();
            for (node, cursor) in asks {
                let Some(peer) =
                    self.peer_links
                        .peer(&mut self.ep, &self.directory, node, now_ns, retry)
                else {
                    continue;
                };
                if self.request(
                    peer,
                    &Body::Gather { shard, cursor },
                    Pending::Gather {
                        shard,
                        from: node,
                        term: self.jobs_term,
                        cursor,
                    },
                    now_ns,
                ) {
                    let rec = self.recoveries.get_mut(&shard).expect("listed");
                    rec.sources.get_mut(&node).expect("listed").asked_ns = Some(now_ns);
                    did = true;
                }
            }
            let gathered = {
                let rec = &self.recoveries[&shard];
                !rec.scattering && rec.sources.values().all(|s| s.done)
            };
            if gathered {
                // Own entries (one walk for every shard recovering in this term),
                // then install the union here.
                if self.own.as_ref().is_none_or(|(t, _)| *t != self.jobs_term) {
                    let shards: Vec<ShardId> = self.recoveries.keys().copied().collect();
                    if let Err(why) = self.shared.drain_redo() {
                        tracing::warn!(role = %self.name, why, "gathering own entries waits for the redo rings");
                        continue;
                    }
                    match self
                        .shared
                        .engine
                        .uncommitted_entries_of(&shards, &self.shared.recovered_open)
                    {
                        Ok(found) => self.own = Some((self.jobs_term, found)),
                        Err(e) => {
                            tracing::error!(role = %self.name, error = %e, "gathering own entries");
                            continue;
                        }
                    }
                }
                let rec = self.recoveries.get_mut(&shard).expect("listed");
                let own = self
                    .own
                    .as_mut()
                    .and_then(|(_, m)| m.remove(&shard))
                    .unwrap_or_default();
                {
                    {
                        for e in own {
                            if let Ok(p) = entry::parse_entry(&e) {
                                let v = p.version.0;
                                rec.entries.entry(v).or_insert(e);
                            }
                        }
                    }
                }
                if rec.install_retry_at_ns.is_some_and(|t| now_ns < t) {
                    continue;
                }
                let max = self.ep.config().frame_bytes_max - HEADER_BYTES - 2;
                rec.pages = pack(rec.entries.values().map(|e| e.as_slice()), max);
                let mut failed = None;
                // At most one injected failure per attempt, so a promotion of many
                // pages is delayed, never starved.
                let mut inject = self.shared.buggify("control.install-fails");
                let injected = inject;
                for page in &rec.pages {
                    let installed = if std::mem::take(&mut inject) {
                        Err(rowankv_engine::EngineError::OutOfSpace)
                    } else {
                        self.shared.engine.install_entries(0, page)
                    };
                    match installed {
                        Ok(r) => {
                            for seg in r.sealed {
                                self.shared.blog.enqueue_used(seg);
                            }
                        }
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                if let Some(e) = failed {
                    // The union is not all here: this server may not serve the
                    // shard, nor send it on. Installing is idempotent (versions
                    // decide), so it is tried again, whole, after a pause; the
                    // shard stays unserved until it succeeds.
                    if injected {
                        tracing::debug!(role = %self.name, %shard, "installing the union failed (fault site); trying again");
                    } else {
                        tracing::error!(role = %self.name, %shard, error = %e, "installing the union; trying again");
                    }
                    rec.install_retry_at_ns = Some(now_ns + retry);
                    rec.install_failures += 1;
                    did = true;
                    continue;
                }
                rec.install_retry_at_ns = None;
                rec.targets = rec
                    .sources
                    .keys()
                    .map(|n| (*n, Target::default()))
                    .collect();
                rec.scattering = true;
                did = true;
            }
            if self.recoveries[&shard].scattering {
                did |= self.scatter(shard, now_ns);
                let rec = &self.recoveries[&shard];
                if rec.targets.values().all(|t| t.next_page >= rec.pages.len()) {
                    let top = self.shared.engine.highest_version(shard).unwrap_or(0);
                    self.shared.versions.raise(shard, top + 1);
                    self.recoveries.remove(&shard);
                    let me = self.shared.node;
                    if self
                        .shared
                        .config()
                        .migration(shard)
                        .is_some_and(|m| m.to == me)
                    {
                        // Served once handed over (`run_takeovers`).
                        self.recovered.insert(shard);
                        did = true;
                        continue;
                    }
                    self.shared.set_shard_ready(shard);
                    self.shared
                        .stats
                        .shards_served
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.shared.events.record(
                        now_ns,
                        EventKind::ShardServed {
                            node: self.shared.node,
                            shard,
                            term: self.jobs_term,
                        },
                    );
                    // Its joining backups are copied next.
                    self.jobs_epoch = u64::MAX;
                    did = true;
                }
            }
        }
        did
    }

    /// Send the next page of a recovery's union to every target that needs it.
    fn scatter(&mut self, shard: ShardId, now_ns: u64) -> bool {
        let retry = self.shared.settings.failover.retry_ns;
        let resend = self.resend_ns();
        let rec = &self.recoveries[&shard];
        let sends: Vec<(NodeId, usize)> = rec
            .targets
            .iter()
            .filter(|(_, t)| t.next_page < rec.pages.len())
            .filter(|(_, t)| t.asked_ns.is_none_or(|a| now_ns >= a + resend))
            .map(|(n, t)| (*n, t.next_page))
            .collect();
        let mut did = false;
        for (node, page) in sends {
            let Some(peer) =
                self.peer_links
                    .peer(&mut self.ep, &self.directory, node, now_ns, retry)
            else {
                continue;
            };
            let bytes =
                std::mem::take(&mut self.recoveries.get_mut(&shard).expect("listed").pages[page]);
            let sent = self.send_install(peer, shard, node, page, &bytes, now_ns);
            let rec = self.recoveries.get_mut(&shard).expect("listed");
            rec.pages[page] = bytes;
            if sent {
                rec.targets.get_mut(&node).expect("listed").asked_ns = Some(now_ns);
                did = true;
            }
        }
        did
    }

    /// Drive re-replication to joining backups.
    fn run_copies(&mut self, now_ns: u64) -> bool {
        let retry = self.shared.settings.failover.retry_ns;
        let resend = self.resend_ns();
        let mut did = false;
        let keys: Vec<(ShardId, NodeId)> = self.copies.keys().copied().collect();
        for (shard, to) in keys {
            if self.copies[&(shard, to)].pages.is_none() {
                // Writes that started before `to` joined did not go to it.
                if !self.shared.writes_since(self.jobs_term) {
                    continue;
                }
                let migration = self.copies[&(shard, to)].migration;
                // A migration's source hands over once no write of the
                // shard is in flight here: every one was published (and is
                // in the index, so in the copy) or given up.
                if migration && !self.shared.versions.idle(shard) {
                    continue;
                }
                if migration {
                    let next_version = self.shared.versions.next(shard);
                    let outcomes = match self.shared.engine.request_outcomes(shard) {
                        Ok(o) => o,
                        Err(e) => {
                            tracing::error!(role = %self.name, %shard, error = %e, "reading the shard's outcomes");
                            continue;
                        }
                    };
                    let per_page = (self.ep.config().frame_bytes_max
                        - HEADER_BYTES
                        - frame::MIGRATE_FIXED_BYTES)
                        / frame::MIGRATE_OUTCOME_BYTES;
                    assert!(per_page > 0, "a frame holds no request outcome");
                    let records: Vec<_> = outcomes.into_iter().map(|(r, v)| (r, v.0)).collect();
                    let mut pages: Vec<Vec<u8>> = records
                        .chunks(per_page)
                        .map(frame::encode_outcomes)
                        .collect();
                    if pages.is_empty() {
                        pages.push(Vec::new());
                    }
                    self.copies.get_mut(&(shard, to)).expect("listed").handover = Some(Handover {
                        next_version,
                        pages,
                        target: Target::default(),
                    });
                }
                let mut list: Vec<Vec<u8>> = Vec::new();
                let counted = self
                    .shared
                    .engine
                    .for_each_indexed_entry(shard, |e| list.push(e.to_vec()));
                if let Err(e) = counted {
                    tracing::error!(role = %self.name, %shard, error = %e, "reading the shard");
                    continue;
                }
                let max = self.page_bytes_max();
                let c = self.copies.get_mut(&(shard, to)).expect("listed");
                c.entries = list.len() as u64;
                c.pages = Some(pack(list.iter().map(|e| e.as_slice()), max));
                did = true;
            }
            // A migration: the hand-over, page by page, before any entry.
            if let Some(h) = self.copies[&(shard, to)]
                .handover
                .as_ref()
                .filter(|h| h.target.next_page < h.pages.len())
            {
                if h.target.asked_ns.is_some_and(|a| now_ns < a + resend) {
                    continue;
                }
                let page = h.target.next_page;
                let next_version = h.next_version;
                let last = page + 1 == h.pages.len();
                let Some(peer) =
                    self.peer_links
                        .peer(&mut self.ep, &self.directory, to, now_ns, retry)
                else {
                    continue;
                };
                let outcomes = std::mem::take(
                    &mut self
                        .copies
                        .get_mut(&(shard, to))
                        .and_then(|c| c.handover.as_mut())
                        .expect("listed")
                        .pages[page],
                );
                let body = Body::Migrate {
                    shard,
                    next_version,
                    last,
                    outcomes: &outcomes,
                };
                let sent = self.request(peer, &body, Pending::Migrate { shard, to, page }, now_ns);
                let h = self
                    .copies
                    .get_mut(&(shard, to))
                    .and_then(|c| c.handover.as_mut())
                    .expect("listed");
                h.pages[page] = outcomes;
                if sent {
                    h.target.asked_ns = Some(now_ns);
                    did = true;
                }
                continue;
            }
            let c = &self.copies[&(shard, to)];
            if c.migration && self.shared.migration_copy_held() {
                continue;
            }
            let pages = c.pages.as_ref().expect("set above");
            if c.target.next_page < pages.len() {
                if c.target.asked_ns.is_some_and(|a| now_ns < a + resend) {
                    continue;
                }
                let Some(peer) =
                    self.peer_links
                        .peer(&mut self.ep, &self.directory, to, now_ns, retry)
                else {
                    continue;
                };
                let page = c.target.next_page;
                let bytes = std::mem::take(
                    &mut self
                        .copies
                        .get_mut(&(shard, to))
                        .expect("listed")
                        .pages
                        .as_mut()
                        .expect("set")[page],
                );
                let sent = self.send_install(peer, shard, to, page, &bytes, now_ns);
                let c = self.copies.get_mut(&(shard, to)).expect("listed");
                c.pages.as_mut().expect("set")[page] = bytes;
                if sent {
                    c.target.asked_ns = Some(now_ns);
                    did = true;
                }
                continue;
            }
            // Copied: tell the CMs (again, if no new configuration came).
            if c.ready_sent_ns.is_some_and(|t| now_ns < t + 10 * retry) {
                continue;
            }
            if c.ready_sent_ns.is_none() {
                let stats = &self.shared.stats;
                stats
                    .copies_done
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                stats
                    .copy_entries_done
                    .fetch_add(c.entries, std::sync::atomic::Ordering::Relaxed);
                let kind = if c.migration {
                    EventKind::MigrationCopied {
                        shard,
                        to,
                        entries: c.entries,
                    }
                } else {
                    EventKind::ReplicaCopied {
                        shard,
                        to,
                        entries: c.entries,
                    }
                };
                self.shared.events.record(now_ns, kind);
            }
            self.copies
                .get_mut(&(shard, to))
                .expect("listed")
                .ready_sent_ns = Some(now_ns);
            for cm in self.cms.clone() {
                if let Some(peer) =
                    self.cm_links
                        .peer(&mut self.ep, &self.directory, cm, now_ns, retry)
                {
                    self.request(
                        peer,
                        &Body::Ready { shard, node: to },
                        Pending::Ready,
                        now_ns,
                    );
                }
            }
            did = true;
        }
        did
    }

    /// Requests unanswered for the resend interval are given up; the jobs ask
    /// again.
    fn expire(&mut self, now_ns: u64) {
        let limit = self.resend_ns();
        expire_pending(
            &mut self.pending,
            &mut self.ep,
            now_ns,
            limit,
            |(p, at, _)| (*at, *p),
        );
    }

    /// Forget everything outstanding on `peer` (its connection failed).
    fn drop_pending(&mut self, peer: PeerId) {
        forget_peer(&mut self.pending, &mut self.ep, peer, |(p, _, _)| *p);
    }
}

impl<N: Nic> Task for ControlTask<N> {
    fn name(&self) -> &str {
        &self.name
    }

    fn keeps_time(&self) -> bool {
        true
    }

    fn step(&mut self, now_ns: u64) -> Step {
        if self.shared.stopped() {
            return Step::Done;
        }
        if self.shared.buggify("control.skip-step") {
            return Step::Idle;
        }
        let mut did = false;
        if self.rowan.due(now_ns) {
            match self.shared.blog.control_step(now_ns) {
                Ok(r) => did |= r.segments_used > 0 || r.segments_posted > 0,
                Err(e) => tracing::error!(role = %self.name, error = %e, "control step"),
            }
            did |= self.shared.blog.try_commit() > 0;
        }
        did |= !self.acceptor.accept_pending(&mut self.ep).is_empty();
        did |= self.services.serve();
        let timeout = 4 * self.shared.settings.failover.retry_ns;
        self.cm_links.progress(&mut self.ep, now_ns, timeout);
        self.peer_links.progress(&mut self.ep, now_ns, timeout);
        let mut events = std::mem::take(&mut self.events);
        let mut data = std::mem::take(&mut self.data);
        if let Ok(n) = self.ep.poll(&mut events, &mut data) {
            did |= n > 0;
        }
        for ev in &events {
            match *ev {
                Event::Message { peer, start, len } => {
                    self.handle_request(peer, &data[start..start + len], now_ns)
                }
                Event::SendFailed { peer, .. } => {
                    self.cm_links.drop_peer(&mut self.ep, peer);
                    self.peer_links.drop_peer(&mut self.ep, peer);
                    // Its requests will not be answered: give their credits back.
                    self.drop_pending(peer);
                }
                Event::Owner(_) => {}
            }
        }
        self.events = events;
        self.data = data;
        if self.expiry.due(now_ns) {
            self.expire(now_ns);
        }
        if self.shared.stopped() {
            return Step::Done;
        }
        // Jobs planned for an earlier term wait until the held term is committed
        // and planned: their sources and targets may no longer be replicas.
        if self.plan() {
            did |= self.run_recoveries(now_ns);
            did |= self.run_copies(now_ns);
            did |= self.run_takeovers(now_ns);
        }
        // Gauges of the metrics: recoveries and copies under way.
        let stats = &self.shared.stats;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        stats
            .recoveries_in_progress
            .store(self.recoveries.len() as u64, relaxed);
        let copying = self.copies.values().filter(|c| c.ready_sent_ns.is_none());
        let (copies, pages) = copying.fold((0u64, 0u64), |(n, p), c| {
            let left = c.pages.as_ref().map_or(0, |pages| {
                pages.len().saturating_sub(c.target.next_page) as u64
            });
            (n + 1, p + left)
        });
        stats.copies_in_progress.store(copies, relaxed);
        stats.copy_pages_remaining.store(pages, relaxed);
        if did {
            Step::Worked
        } else {
            Step::Idle
        }
    }
}
