//! The configuration as a CM serves it over the fabric: how a client or a
//! server in another process — which cannot read the CM's coordination store —
//! learns the cluster's configuration.
//!
//! [`CmSource`] asks a CM for the configuration it stores (`Body::Config`,
//! one page a frame, `Response::Config`), trying the CMs in turn from the one
//! that answered last; a CM that does not answer within the timeout is left
//! for the next. A page of another term than the first means the
//! configuration changed while it was read: the read starts again. What comes
//! back is decoded and validated (`Config::from_json`), and must be of the
//! expected cluster.
//!
//! A fetch blocks its caller until the answer or the timeout, on real time:
//! it is for processes and threads (the CM's role runs elsewhere), not for a
//! simulator that steps every role on one thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rowankv_fabric::{FabricError, Nic};
use rowankv_rpc::directory::Directory;
use rowankv_rpc::endpoint::{Endpoint, EndpointConfig, Event, PeerId};
use rowankv_types::{NodeId, Term};
use rowankv_wire::config::{Config, ConfigError, ConfigSource};
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Response};

/// Reads the configuration from the CMs (see the module's comment).
pub struct CmSource<N: Nic> {
    inner: Mutex<Inner<N>>,
    directory: Directory,
    cluster_id: u64,
    /// The CMs: node and service.
    cms: Vec<(NodeId, u16)>,
    timeout: Duration,
}

struct Inner<N: Nic> {
    ep: Endpoint<N>,
    node: NodeId,
    /// Connected CMs, and the one that answered last.
    links: Vec<Option<PeerId>>,
    last_good: usize,
    next_request: u64,
    events: Vec<Event>,
    data: Vec<u8>,
}

/// Why [`CmSource::reshard`] listed no migration. Either way the configuration
/// is as it was, except when a CM took the request and its answer was lost
/// (`NoActiveCm` with a CM that "did not answer"): the next configuration
/// then shows whether it was stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReshardError {
    /// The active CM refused the move: `reason` is its answer (`plan_migrate`'s
    /// why: the target holds a replica, leads the shard already, a
    /// reconfiguration is under way; or a configuration round in progress),
    /// `all` every CM's.
    #[error("{all}")]
    Refused { reason: String, all: String },
    /// No CM answered as the active one: each was unreachable, did not
    /// answer in time, or is a standby.
    #[error("{0}")]
    NoActiveCm(String),
}

/// Pages a read takes at most before it gives up (a configuration that keeps
/// changing under it, or a CM that sends empty pages).
const PAGES_MAX: usize = 4096;

impl<N: Nic> CmSource<N> {
    /// A source on `nic` asking `cms` (node and service) through `directory`,
    /// for a configuration of `cluster_id`, each answer within `timeout`.
    pub fn new(
        nic: N,
        directory: Directory,
        cluster_id: u64,
        cms: Vec<(NodeId, u16)>,
        timeout: Duration,
    ) -> Result<CmSource<N>, FabricError> {
        let node = nic.node();
        let ep = Endpoint::new(nic, EndpointConfig::default())?;
        Ok(CmSource {
            inner: Mutex::new(Inner {
                ep,
                node,
                links: vec![None; cms.len()],
                last_good: 0,
                next_request: 1,
                events: Vec::new(),
                data: Vec::new(),
            }),
            directory,
            cluster_id,
            cms,
            timeout,
        })
    }

    /// The configuration from CM `i`.
    fn fetch_from(&self, inner: &mut Inner<N>, i: usize) -> Result<Config, String> {
        self.with_cm(inner, i, |this, inner, peer, cm| {
            this.read_pages(inner, peer, cm)
        })
    }

    /// Ask the active CM to move `shard`'s primary to `to` (a migration,
    /// seed 000 §4.6; `rowankv reshard`, and a front end's `CLUSTER SETSLOT`):
    /// the CMs are asked in turn (a standby refuses). Returns the term of the
    /// configuration that lists the migration, or why none does.
    pub fn reshard(&self, shard: rowankv_types::ShardId, to: NodeId) -> Result<Term, ReshardError> {
        let mut inner = self.inner.lock();
        let mut why = Vec::new();
        let mut refused = None;
        for i in 0..self.cms.len() {
            let asked = self.with_cm(&mut inner, i, |this, inner, peer, cm| {
                this.call(inner, peer, cm, &Body::Reshard { shard, to }, |b| match b {
                    Body::Response(Response::Ok { version }) => Ok(Ok(Term(version))),
                    Body::Response(Response::Error { code, detail, .. }) => {
                        Ok(Err((code, format!("{cm}: {code}: {detail}"))))
                    }
                    other => Err(format!("{cm} answered {other:?}")),
                })
            });
            match asked {
                Ok(Ok(term)) => return Ok(term),
                // A standby's refusal says nothing of the move: the active
                // CM may be the next one.
                Ok(Err((ErrorCode::Blocked, said))) => why.push(said),
                Ok(Err((_, said))) => {
                    why.push(said.clone());
                    refused.get_or_insert(said);
                }
                Err(e) => why.push(e),
            }
        }
        let all = if why.is_empty() {
            "no CM to ask".to_string()
        } else {
            why.join("; ")
        };
        Err(match refused {
            Some(reason) => ReshardError::Refused { reason, all },
            None => ReshardError::NoActiveCm(all),
        })
    }

    /// Run `f` on a connection to CM `i`, made if there is none and
    /// forgotten if `f` fails (the CM may have restarted).
    fn with_cm<T>(
        &self,
        inner: &mut Inner<N>,
        i: usize,
        f: impl FnOnce(&Self, &mut Inner<N>, PeerId, NodeId) -> Result<T, String>,
    ) -> Result<T, String> {
        let (cm, service) = self.cms[i];
        let peer = match inner.links[i] {
            Some(p) => p,
            None => {
                let p = self
                    .directory
                    .connect(&mut inner.ep, cm, service, self.timeout)
                    .map_err(|e| format!("connecting to {cm}: {e}"))?;
                inner.links[i] = Some(p);
                p
            }
        };
        let result = f(self, inner, peer, cm);
        if result.is_err() {
            // Connect afresh next time (the CM may have restarted).
            inner.ep.forget(peer);
            inner.links[i] = None;
        }
        result
    }

    fn read_pages(&self, inner: &mut Inner<N>, peer: PeerId, cm: NodeId) -> Result<Config, String> {
        let mut json = Vec::new();
        let mut term: Option<Term> = None;
        for _ in 0..PAGES_MAX {
            let (t, total, chunk) = self.page(inner, peer, cm, json.len() as u32)?;
            if term.is_some_and(|first| first != t) {
                // Changed while read: start again.
                json.clear();
                term = None;
                continue;
            }
            term = Some(t);
            if chunk.is_empty() && json.len() < total as usize {
                return Err(format!(
                    "{cm} sent an empty page at {} of {total}",
                    json.len()
                ));
            }
            json.extend_from_slice(&chunk);
            if json.len() > total as usize {
                return Err(format!("{cm} sent {} bytes of {total}", json.len()));
            }
            if json.len() == total as usize {
                let config = Config::from_json(&json).map_err(|e| format!("{cm}: {e}"))?;
                if config.cluster_id != self.cluster_id {
                    return Err(format!(
                        "{cm} serves cluster {:#x}, not {:#x}",
                        config.cluster_id, self.cluster_id
                    ));
                }
                return Ok(config);
            }
        }
        Err(format!("{cm}: no whole configuration in {PAGES_MAX} pages"))
    }

    /// One page from `offset`: term, total and the bytes.
    fn page(
        &self,
        inner: &mut Inner<N>,
        peer: PeerId,
        cm: NodeId,
        offset: u32,
    ) -> Result<(Term, u32, Vec<u8>), String> {
        self.call(inner, peer, cm, &Body::Config { offset }, |b| match b {
            Body::Response(Response::Config { term, total, chunk }) => {
                Ok((term, total, chunk.to_vec()))
            }
            Body::Response(Response::Error { code, detail, .. }) => {
                Err(format!("{cm} refused: {code:?}: {detail}"))
            }
            other => Err(format!("{cm} answered {other:?}")),
        })
    }

    /// Send `body` to `cm` and wait (at most the timeout) for its answer,
    /// taken by `answer`.
    fn call<T>(
        &self,
        inner: &mut Inner<N>,
        peer: PeerId,
        cm: NodeId,
        body: &Body<'_>,
        answer: impl FnOnce(Body<'_>) -> Result<T, String>,
    ) -> Result<T, String> {
        let request_id = inner.next_request;
        inner.next_request += 1;
        let env = Envelope {
            cluster_id: self.cluster_id,
            term: Term(0),
            request_id,
            sender: inner.node,
        };
        inner
            .ep
            .request(peer, &env, body)
            .map_err(|e| format!("asking {cm}: {e}"))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let Inner {
                ep, events, data, ..
            } = inner;
            ep.poll(events, data).map_err(|e| format!("polling: {e}"))?;
            for e in events.iter() {
                match *e {
                    Event::Message {
                        peer: p,
                        start,
                        len,
                    } if p == peer => {
                        let Ok(f) = frame::decode(&data[start..start + len]) else {
                            continue;
                        };
                        if f.header.request_id != request_id {
                            continue;
                        }
                        return answer(f.body);
                    }
                    Event::SendFailed { peer: p, status } if p == peer => {
                        return Err(format!("the connection to {cm} failed: {status:?}"));
                    }
                    _ => {}
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("{cm} did not answer within {:?}", self.timeout));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl<N: Nic> ConfigSource for CmSource<N> {
    fn fetch(&self) -> Result<Arc<Config>, ConfigError> {
        let mut inner = self.inner.lock();
        let n = self.cms.len();
        let mut why = Vec::new();
        for k in 0..n {
            let i = (inner.last_good + k) % n;
            match self.fetch_from(&mut inner, i) {
                Ok(c) => {
                    inner.last_good = i;
                    return Ok(Arc::new(c));
                }
                Err(e) => why.push(e),
            }
        }
        Err(ConfigError::Unavailable(if why.is_empty() {
            "no CM to ask".into()
        } else {
            why.join("; ")
        }))
    }
}
