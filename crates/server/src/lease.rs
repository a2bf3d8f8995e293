//! The lease role of a server (seed 000 §4.5).
//!
//! Every `renew_ns` it asks each CM for a lease (`Lease`). The active CM answers
//! with the highest committed term; the lease then runs `lease_ns` from the
//! moment the request was *sent*, so it ends no later than the CM thinks it
//! does. A standby CM answers `Blocked`. A CM that removed this server answers
//! `NotMember`: the server stops.
//!
//! Every `load_window_ns` it also sends each CM the server's per-shard load
//! of the window (`Load`, seed 000 §4.6: what dynamic resharding plans from);
//! their answers are not awaited.
//!
//! Renewing is its main work, on a connection of its own, so nothing else a
//! server does can hold a renewal up: the control role's promotions walk log
//! segments and install thousands of entries in one step, which took up to 40 ms
//! with 100,000 objects, most of the 50 ms lease of the benchmarks. It keeps
//! time ([`Task::keeps_time`]): the executor gives it a thread of its own, as
//! FaRM gives its lease manager one.

use std::collections::BTreeMap;
use std::sync::Arc;

use rowankv_fabric::Nic;
use rowankv_rpc::directory::Directory;
use rowankv_rpc::endpoint::{Endpoint, Event, PeerId};
use rowankv_types::{NodeId, Term};
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Response};

use crate::control::{expire_pending, forget_peer, Links, CM_PORT};
use crate::runtime::{Periodic, Step, Task};
use crate::server::ServerShared;

/// The lease role of one server.
pub struct LeaseTask<N: Nic> {
    name: String,
    shared: Arc<ServerShared<N>>,
    ep: Endpoint<N>,
    directory: Directory,
    cms: Vec<NodeId>,
    links: Links,
    renew: Periodic,
    report_load: Periodic,
    /// Requests of load reports in flight (their answers are ignored).
    load_requests: std::collections::BTreeSet<u64>,
    next_request: u64,
    /// Outstanding requests: id → (peer, sent at).
    pending: BTreeMap<u64, (PeerId, u64)>,
    events: Vec<Event>,
    data: Vec<u8>,
}

impl<N: Nic> LeaseTask<N> {
    pub fn new(
        shared: Arc<ServerShared<N>>,
        ep: Endpoint<N>,
        directory: Directory,
        cms: Vec<NodeId>,
    ) -> Self {
        LeaseTask {
            name: format!("s{}-lease", shared.node.0),
            renew: Periodic::new(shared.settings.failover.renew_ns),
            report_load: Periodic::new(shared.settings.load_window_ns),
            load_requests: Default::default(),
            ep,
            directory,
            cms,
            links: Links::new(CM_PORT),
            next_request: 1,
            pending: BTreeMap::new(),
            events: Vec::new(),
            data: Vec::new(),
            shared,
        }
    }

    fn renew(&mut self, now_ns: u64) {
        let retry = self.shared.settings.failover.retry_ns;
        expire_pending(
            &mut self.pending,
            &mut self.ep,
            now_ns,
            4 * retry,
            |(p, at)| (*at, *p),
        );
        for (id, peer) in self.request_cms(now_ns, &Body::Lease) {
            self.pending.insert(id, (peer, now_ns));
        }
    }

    /// Send the window's per-shard load to every CM reachable now.
    fn report_load(&mut self, now_ns: u64) {
        let loads = self.shared.load.take();
        let entries = frame::encode_load_entries(&loads);
        let body = Body::Load {
            window_ms: (self.shared.settings.load_window_ns / 1_000_000) as u32,
            entries: &entries,
        };
        // Reports not answered by now never will be.
        self.load_requests.clear();
        for (id, _) in self.request_cms(now_ns, &body) {
            self.load_requests.insert(id);
        }
    }

    /// Send `body` to every CM reachable now; the requests sent: (id, peer).
    fn request_cms(&mut self, now_ns: u64, body: &Body<'_>) -> Vec<(u64, PeerId)> {
        let config = self.shared.config();
        let retry = self.shared.settings.failover.retry_ns;
        let mut sent = Vec::new();
        for cm in self.cms.clone() {
            let Some(peer) = self
                .links
                .peer(&mut self.ep, &self.directory, cm, now_ns, retry)
            else {
                continue;
            };
            let id = self.next_request;
            let env = Envelope {
                cluster_id: config.cluster_id,
                term: config.term,
                request_id: id,
                sender: self.shared.node,
            };
            match self.ep.request(peer, &env, body) {
                Ok(()) => {
                    self.next_request += 1;
                    sent.push((id, peer));
                }
                Err(e) => {
                    tracing::debug!(role = %self.name, error = %e, "request to a CM not sent")
                }
            }
        }
        sent
    }

    fn on_message(&mut self, peer: PeerId, bytes: &[u8]) {
        let Ok(f) = frame::decode(bytes) else {
            tracing::debug!(role = %self.name, "undecodable frame dropped");
            return;
        };
        // Only answers to this role's own requests, on the connection they went out on.
        let Body::Response(r) = f.body else {
            return;
        };
        if self.load_requests.remove(&f.header.request_id) {
            return;
        }
        if self.pending.get(&f.header.request_id).map(|(p, _)| *p) != Some(peer) {
            return;
        }
        let Some((_, sent_ns)) = self.pending.remove(&f.header.request_id) else {
            return;
        };
        match r {
            Response::Ok { version } => {
                let f = &self.shared.settings.failover;
                self.shared.extend_lease(sent_ns + f.lease_ns);
                self.shared.learn_committed(Term(version));
            }
            Response::Error {
                code: ErrorCode::NotMember,
                ..
            } => {
                tracing::warn!(server = %self.shared.node, "removed from the cluster by the CM");
                self.shared.evict();
            }
            // A standby CM, or one not yet sure of its own lease.
            _ => {}
        }
    }
}

impl<N: Nic> Task for LeaseTask<N> {
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
        if self.shared.lease_role_paused(now_ns) {
            return Step::Idle;
        }
        let timeout = 4 * self.shared.settings.failover.retry_ns;
        self.links.progress(&mut self.ep, now_ns, timeout);
        let mut events = std::mem::take(&mut self.events);
        let mut data = std::mem::take(&mut self.data);
        let mut did = matches!(self.ep.poll(&mut events, &mut data), Ok(n) if n > 0);
        for ev in &events {
            match *ev {
                Event::Message { peer, start, len } => {
                    self.on_message(peer, &data[start..start + len])
                }
                Event::SendFailed { peer, .. } => {
                    self.links.drop_peer(&mut self.ep, peer);
                    forget_peer(&mut self.pending, &mut self.ep, peer, |(p, _)| *p);
                }
                Event::Owner(_) => {}
            }
        }
        self.events = events;
        self.data = data;
        if self.renew.due(now_ns) {
            self.renew(now_ns);
            did = true;
        }
        if self.report_load.due(now_ns) {
            self.report_load(now_ns);
            did = true;
        }
        if self.shared.stopped() {
            return Step::Done;
        }
        if did {
            Step::Worked
        } else {
            Step::Idle
        }
    }
}
