//! The configuration manager: the one writer of the cluster's configuration.
//!
//! The configuration lives in the coordination store under [`CONFIG_KEY`], as the
//! JSON of `rowankv_wire::config::Config`. A `ConfigManager` caches the last
//! configuration it read or wrote together with the store revision it was at, and
//! commits the next term with a compare-and-put on that revision. The term is the
//! fence between configurations: each term is committed at most once, because two
//! managers that both read revision r can both try to write term t+1, but only the
//! first compare-and-put on r succeeds.
//!
//! Which manager is the active one is decided by [`CM_LEASE_KEY`], a key attached to
//! a store lease ([`ConfigManager::acquire_active`]). Only the active manager should
//! commit; [`ConfigManager::commit_as`] makes that a store-checked condition, so a
//! manager whose lease expired without it noticing cannot commit even if nobody
//! else has committed since.

use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_types::{NodeId, Term};
use rowankv_wire::config::{Config, ConfigError, ConfigSource};

use crate::store::{CoordStore, Guard, LeaseId, Revision, StoreError};

/// Where the configuration is stored.
pub const CONFIG_KEY: &str = "/rowankv/config";
/// The key the active configuration manager holds with its lease.
pub const CM_LEASE_KEY: &str = "/rowankv/cm/active";
/// The highest term known committed (every member of it prepared it, and the
/// servers it removed lost their leases), as the decimal term. Written by the
/// CM that commits, before it sends `Commit`; a CM that starts or takes over
/// reads what is committed here, never the term under [`CONFIG_KEY`], which may
/// be stored and not yet committed.
pub const COMMITTED_KEY: &str = "/rowankv/committed";

/// The next node identity the CM hands out ([`ConfigManager::allocate_node`]), as
/// a decimal number.
pub const NEXT_NODE_KEY: &str = "/rowankv/nodes/next";
/// Prefix of the record of every identity handed out: `/rowankv/nodes/id/<n>`
/// holds what asked for it ([`NodeRecord`], JSON).
pub const NODE_RECORD_PREFIX: &str = "/rowankv/nodes/id/";
/// The first identity the CM hands out. Below it: the members of a cluster
/// bootstrapped with fixed identities, and the in-process conventions (CMs from
/// 900, clients from 1000).
pub const ALLOCATED_NODE_BASE: u32 = 10_000;

/// What a node identity was handed out for ([`ConfigManager::allocate_node`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeRecord {
    /// `server`, `client` or `cm`.
    pub kind: String,
    /// Where the node said it can be reached (`host:port`; empty for a client
    /// that accepts no connections).
    pub address: String,
    /// A server's worker count (0 for others).
    #[serde(default)]
    pub workers: u16,
    /// A server's Redis front end (`host:port`), if it runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resp: Option<String>,
    /// A server removed on purpose (`rowankv leave`): its identity never joins
    /// again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub left: bool,
}

/// Every identity handed out, with its record, in identity order.
pub fn node_records(store: &dyn CoordStore) -> Result<Vec<(NodeId, NodeRecord)>, CmError> {
    let mut out = Vec::new();
    for (key, bytes, _) in store.list(NODE_RECORD_PREFIX)? {
        let n: u32 = key[NODE_RECORD_PREFIX.len()..]
            .parse()
            .map_err(|_| CmError::Invalid(format!("{key} names no node")))?;
        let record =
            serde_json::from_slice(&bytes).map_err(|e| CmError::Invalid(format!("{key}: {e}")))?;
        out.push((NodeId(n), record));
    }
    out.sort_by_key(|(n, _)| *n);
    Ok(out)
}

/// Hand out a node identity from `store` ([`ConfigManager::allocate_node`]),
/// none below `members_above`: what a CM does before any configuration is
/// stored (for itself, and for the servers that join to form the first one).
pub fn allocate_node(
    store: &dyn CoordStore,
    record: &NodeRecord,
    members_above: u32,
) -> Result<NodeId, CmError> {
    if !matches!(record.kind.as_str(), "server" | "client" | "cm") {
        return Err(CmError::Invalid(format!(
            "a node is a server, a client or a cm, not {:?}",
            record.kind
        )));
    }
    for _ in 0..ALLOCATE_ATTEMPTS_MAX {
        let (stored, revision) = match store.get(NEXT_NODE_KEY)? {
            Some((bytes, revision)) => {
                let text = std::str::from_utf8(&bytes).unwrap_or("");
                let next: u32 = text.parse().map_err(|_| {
                    CmError::Invalid(format!("{NEXT_NODE_KEY} holds {text:?}, not a number"))
                })?;
                (next, revision)
            }
            None => (0, 0),
        };
        let id = stored.max(members_above).max(ALLOCATED_NODE_BASE);
        let Some(next) = id.checked_add(1) else {
            return Err(CmError::Invalid("every node identity is used".into()));
        };
        match store.put_if(NEXT_NODE_KEY, next.to_string().as_bytes(), revision, None) {
            Ok(_) => {
                let key = format!("{NODE_RECORD_PREFIX}{id}");
                let json = serde_json::to_vec(record).expect("a record serializes");
                store.put_if(&key, &json, 0, None)?;
                return Ok(NodeId(id));
            }
            // Another CM handed one out meanwhile: read again.
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CmError::Conflict(format!(
        "{NEXT_NODE_KEY} kept changing while allocating a node identity"
    )))
}

/// Replace the record of an identity handed out before (a server that rejoins
/// from another address).
pub fn update_node_record(
    store: &dyn CoordStore,
    node: NodeId,
    record: &NodeRecord,
) -> Result<(), CmError> {
    let key = format!("{NODE_RECORD_PREFIX}{}", node.0);
    let Some((_, revision)) = store.get(&key)? else {
        return Err(CmError::Invalid(format!(
            "{node} was never handed out by this cluster's CMs"
        )));
    };
    let json = serde_json::to_vec(record).expect("a record serializes");
    store.put_if(&key, &json, revision, None)?;
    Ok(())
}

/// The record of an identity handed out before, `None` if it never was.
pub fn node_record(store: &dyn CoordStore, node: NodeId) -> Result<Option<NodeRecord>, CmError> {
    let key = format!("{NODE_RECORD_PREFIX}{}", node.0);
    match store.get(&key)? {
        None => Ok(None),
        Some((bytes, _)) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| CmError::Invalid(format!("{key}: {e}"))),
    }
}

/// How many times `bootstrap` and `acquire_active` re-read after losing a race to
/// another manager before giving up: one re-read always settles a race in which
/// nobody deletes the key in between.
const RACE_ATTEMPTS_MAX: usize = 3;
/// How many times `allocate_node` re-reads after another CM handed out an
/// identity first (each retry means another allocation succeeded).
const ALLOCATE_ATTEMPTS_MAX: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum CmError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no configuration is stored under {CONFIG_KEY}")]
    NoConfig,
    #[error("the stored configuration belongs to cluster {stored}, not {given}")]
    WrongCluster { stored: u64, given: u64 },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("the next configuration must have term {current:?} + 1, not {given:?}")]
    TermNotNext { current: Term, given: Term },
    #[error("lost a race to another writer: {0}")]
    Conflict(String),
    #[error("another configuration manager is active: {holder:?}")]
    ActiveHeld { holder: String },
    #[error("the active-CM lease of {holder:?} has expired")]
    LeaseLost { holder: String },
}

/// The configuration as last read or written, and the store revision of that.
#[derive(Clone)]
struct Cached {
    config: Arc<Config>,
    revision: Revision,
}

/// The configuration manager (static part: bootstrap, commit of the next term, the
/// active-CM lease). Failure detection of servers and the failover protocol build on
/// `commit_as` and `ActiveLease`.
pub struct ConfigManager {
    store: Arc<dyn CoordStore>,
    cached: Mutex<Cached>,
    /// Serializes this manager's commits and reloads, so the cache only moves
    /// forward; `current()` does not wait for it.
    writer: Mutex<()>,
}

impl std::fmt::Debug for ConfigManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached = self.cached.lock();
        f.debug_struct("ConfigManager")
            .field("cluster_id", &cached.config.cluster_id)
            .field("term", &cached.config.term)
            .field("revision", &cached.revision)
            .finish_non_exhaustive()
    }
}

fn decode_stored(bytes: &[u8]) -> Result<Config, CmError> {
    Config::from_json(bytes)
        .map_err(|e| CmError::Invalid(format!("the configuration stored under {CONFIG_KEY}: {e}")))
}

fn invalid(e: ConfigError) -> CmError {
    CmError::Invalid(e.to_string())
}

impl ConfigManager {
    fn with(store: Arc<dyn CoordStore>, config: Config, revision: Revision) -> ConfigManager {
        ConfigManager {
            store,
            cached: Mutex::new(Cached {
                config: Arc::new(config),
                revision,
            }),
            writer: Mutex::new(()),
        }
    }

    /// Load the configuration from the store, or store `initial` if there is none.
    /// A stored configuration wins over `initial` (it may be many terms ahead); one
    /// of another cluster is `WrongCluster`. `initial` is validated either way.
    pub fn bootstrap(
        store: Arc<dyn CoordStore>,
        initial: Config,
    ) -> Result<ConfigManager, CmError> {
        initial.validate().map_err(invalid)?;
        for _ in 0..RACE_ATTEMPTS_MAX {
            if let Some((bytes, revision)) = store.get(CONFIG_KEY)? {
                let stored = decode_stored(&bytes)?;
                if stored.cluster_id != initial.cluster_id {
                    return Err(CmError::WrongCluster {
                        stored: stored.cluster_id,
                        given: initial.cluster_id,
                    });
                }
                return Ok(ConfigManager::with(store, stored, revision));
            }
            match store.put_if(CONFIG_KEY, &initial.to_json(), 0, None) {
                Ok(revision) => {
                    // The first configuration is committed by definition: every
                    // server starts with it.
                    let manager = ConfigManager::with(store, initial, revision);
                    manager.raise_committed(manager.current().term, None)?;
                    return Ok(manager);
                }
                // Another manager bootstrapped first: read what it stored.
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CmError::Conflict(format!(
            "{CONFIG_KEY} kept changing during bootstrap"
        )))
    }

    /// Load an existing configuration; `NoConfig` if the store has none.
    pub fn open(store: Arc<dyn CoordStore>) -> Result<ConfigManager, CmError> {
        let (bytes, revision) = store.get(CONFIG_KEY)?.ok_or(CmError::NoConfig)?;
        let config = decode_stored(&bytes)?;
        Ok(ConfigManager::with(store, config, revision))
    }

    /// Hand out a node identity that no node of this cluster has had: not a
    /// member of the stored configuration, never handed out before, whichever CM
    /// hands it out (a compare-and-put on [`NEXT_NODE_KEY`]; two CMs racing get
    /// different identities). The identity's [`NodeRecord`] is kept under
    /// [`NODE_RECORD_PREFIX`]. A node keeps its identity for life (a server
    /// stores it with its pool and rejoins under it after a restart); it asks
    /// again only when it starts on a new, empty pool.
    pub fn allocate_node(&self, record: &NodeRecord) -> Result<NodeId, CmError> {
        let members_above = self
            .current()
            .members
            .iter()
            .map(|m| m.node.0.saturating_add(1))
            .max()
            .unwrap_or(0);
        allocate_node(self.store.as_ref(), record, members_above)
    }

    /// The record of node identity `node` handed out by [`ConfigManager::allocate_node`].
    pub fn node_record(&self, node: NodeId) -> Result<Option<NodeRecord>, CmError> {
        node_record(self.store.as_ref(), node)
    }

    /// The cached configuration.
    pub fn current(&self) -> Arc<Config> {
        self.cached.lock().config.clone()
    }

    /// The store revision of the cached configuration.
    pub fn revision(&self) -> Revision {
        self.cached.lock().revision
    }

    /// Commit `next`: its term must be exactly the current term + 1, it must
    /// validate and keep the cluster id. Written with a compare-and-put on the
    /// revision the cache was read at, so two managers cannot both commit term t+1;
    /// the loser gets `Conflict` and should `reload`. On success the cache moves to
    /// `next`.
    ///
    /// After a store error other than a conflict the outcome may be unknown (with a
    /// remote store, the write may have landed): `reload` tells.
    pub fn commit(&self, next: Config) -> Result<Arc<Config>, CmError> {
        self.commit_inner(next, None)
    }

    /// `commit`, and only while `active` still holds [`CM_LEASE_KEY`]: the store
    /// checks it in the same atomic step, so a manager deposed without knowing it
    /// cannot commit. A failed check is `LeaseLost`.
    pub fn commit_as(&self, active: &ActiveLease, next: Config) -> Result<Arc<Config>, CmError> {
        self.commit_inner(next, Some(active))
    }

    fn commit_inner(
        &self,
        next: Config,
        fence: Option<&ActiveLease>,
    ) -> Result<Arc<Config>, CmError> {
        let _writer = self.writer.lock();
        let Cached { config, revision } = self.cached.lock().clone();
        if next.cluster_id != config.cluster_id {
            return Err(CmError::WrongCluster {
                stored: config.cluster_id,
                given: next.cluster_id,
            });
        }
        if next.term != Term(config.term.0 + 1) {
            return Err(CmError::TermNotNext {
                current: config.term,
                given: next.term,
            });
        }
        next.validate().map_err(invalid)?;
        let bytes = next.to_json();
        let written = match fence {
            None => self.store.put_if(CONFIG_KEY, &bytes, revision, None),
            Some(active) => {
                let guard = Guard {
                    key: CM_LEASE_KEY.to_owned(),
                    revision: active.revision,
                };
                self.store
                    .put_if_guarded(&guard, CONFIG_KEY, &bytes, revision, None)
            }
        };
        let new_revision = match (written, fence) {
            (Ok(r), _) => r,
            (Err(StoreError::Conflict { key, .. }), Some(active)) if key == CM_LEASE_KEY => {
                return Err(CmError::LeaseLost {
                    holder: active.holder.clone(),
                })
            }
            (Err(StoreError::Conflict { current, .. }), _) => {
                return Err(CmError::Conflict(format!(
                    "{CONFIG_KEY} is at revision {current}, not {revision}: another manager \
                     committed after term {:?}",
                    config.term
                )))
            }
            (Err(e), _) => return Err(e.into()),
        };
        let next = Arc::new(next);
        *self.cached.lock() = Cached {
            config: next.clone(),
            revision: new_revision,
        };
        Ok(next)
    }

    /// Re-read the configuration from the store (a standby taking over, or after a
    /// conflict). The stored configuration must be of the same cluster and not of an
    /// older term than the cache: a store that went back in time is refused rather
    /// than followed.
    pub fn reload(&self) -> Result<Arc<Config>, CmError> {
        let _writer = self.writer.lock();
        let (bytes, revision) = self.store.get(CONFIG_KEY)?.ok_or(CmError::NoConfig)?;
        let stored = decode_stored(&bytes)?;
        let cached = self.cached.lock().config.clone();
        if stored.cluster_id != cached.cluster_id {
            return Err(CmError::WrongCluster {
                stored: stored.cluster_id,
                given: cached.cluster_id,
            });
        }
        if stored.term < cached.term {
            return Err(CmError::Invalid(format!(
                "the stored configuration has term {:?}, older than the {:?} already seen",
                stored.term, cached.term
            )));
        }
        let stored = Arc::new(stored);
        *self.cached.lock() = Cached {
            config: stored.clone(),
            revision,
        };
        Ok(stored)
    }

    /// The highest term recorded committed under [`COMMITTED_KEY`] (`Term(0)`:
    /// none recorded — a store written before the key existed).
    pub fn committed_term(&self) -> Result<Term, CmError> {
        Ok(self.read_committed()?.0)
    }

    fn read_committed(&self) -> Result<(Term, Revision), CmError> {
        match self.store.get(COMMITTED_KEY)? {
            None => Ok((Term(0), 0)),
            Some((bytes, revision)) => {
                let term = std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok())
                    .ok_or_else(|| {
                        CmError::Invalid(format!("the term stored under {COMMITTED_KEY}"))
                    })?;
                Ok((Term(term), revision))
            }
        }
    }

    /// Record `term` as committed, while `active` still holds [`CM_LEASE_KEY`]
    /// (checked by the store in the same step, as for `commit_as`). The record
    /// only moves forward: an older term changes nothing.
    pub fn record_committed(&self, active: &ActiveLease, term: Term) -> Result<(), CmError> {
        self.raise_committed(term, Some(active))
    }

    fn raise_committed(&self, term: Term, fence: Option<&ActiveLease>) -> Result<(), CmError> {
        for _ in 0..RACE_ATTEMPTS_MAX {
            let (stored, revision) = self.read_committed()?;
            if stored >= term {
                return Ok(());
            }
            let value = term.0.to_string();
            let written = match fence {
                None => self
                    .store
                    .put_if(COMMITTED_KEY, value.as_bytes(), revision, None),
                Some(active) => {
                    let guard = Guard {
                        key: CM_LEASE_KEY.to_owned(),
                        revision: active.revision,
                    };
                    self.store.put_if_guarded(
                        &guard,
                        COMMITTED_KEY,
                        value.as_bytes(),
                        revision,
                        None,
                    )
                }
            };
            match (written, fence) {
                (Ok(_), _) => return Ok(()),
                (Err(StoreError::Conflict { key, .. }), Some(active)) if key == CM_LEASE_KEY => {
                    return Err(CmError::LeaseLost {
                        holder: active.holder.clone(),
                    })
                }
                // Another writer moved the record: read it again.
                (Err(StoreError::Conflict { .. }), _) => continue,
                (Err(e), _) => return Err(e.into()),
            }
        }
        Err(CmError::Conflict(format!(
            "{COMMITTED_KEY} kept changing while raising it"
        )))
    }

    /// The coordination store this manager writes to.
    pub fn store(&self) -> &Arc<dyn CoordStore> {
        &self.store
    }

    /// Become the active manager: put [`CM_LEASE_KEY`] = `holder` attached to a new
    /// lease of `ttl_ns`, only if no one holds it. `ActiveHeld` names the holder
    /// otherwise; the key frees itself when the holder's lease expires. A holder of
    /// the same name (a restarted process) must also wait for the old lease: the old
    /// process may still be running.
    pub fn acquire_active(&self, holder: &str, ttl_ns: u64) -> Result<ActiveLease, CmError> {
        for _ in 0..RACE_ATTEMPTS_MAX {
            if let Some((bytes, _)) = self.store.get(CM_LEASE_KEY)? {
                return Err(CmError::ActiveHeld {
                    holder: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            let lease = self.store.grant_lease(ttl_ns)?;
            match self
                .store
                .put_if(CM_LEASE_KEY, holder.as_bytes(), 0, Some(lease))
            {
                Ok(revision) => {
                    return Ok(ActiveLease {
                        store: self.store.clone(),
                        holder: holder.to_owned(),
                        lease,
                        revision,
                        ttl_ns,
                    })
                }
                Err(StoreError::Conflict { .. }) => {
                    // Lost the race: give the unused lease back and look again. A
                    // failed revoke only leaves a lease with no keys to expire.
                    let _ = self.store.revoke(lease);
                }
                Err(e) => {
                    let _ = self.store.revoke(lease);
                    return Err(e.into());
                }
            }
        }
        Err(CmError::Conflict(format!(
            "{CM_LEASE_KEY} kept changing while acquiring it"
        )))
    }
}

impl ConfigSource for ConfigManager {
    /// The cached configuration: the manager is the only writer, so its cache is
    /// the latest committed configuration while it is active.
    fn fetch(&self) -> Result<Arc<Config>, ConfigError> {
        Ok(self.current())
    }
}

/// The configuration as the coordination store holds it, read afresh on every
/// fetch: what servers and clients consult, whichever CM is active.
pub struct StoreSource {
    store: Arc<dyn CoordStore>,
}

impl StoreSource {
    pub fn new(store: Arc<dyn CoordStore>) -> StoreSource {
        StoreSource { store }
    }
}

impl ConfigSource for StoreSource {
    fn fetch(&self) -> Result<Arc<Config>, ConfigError> {
        match self.store.get(CONFIG_KEY) {
            Ok(Some((bytes, _))) => Config::from_json(&bytes).map(Arc::new),
            Ok(None) => Err(ConfigError::Decode(format!(
                "no configuration under {CONFIG_KEY}"
            ))),
            Err(e) => Err(ConfigError::Decode(format!("reading {CONFIG_KEY}: {e}"))),
        }
    }
}

/// The active-CM lease: while it is alive, [`CM_LEASE_KEY`] names this holder.
/// The holder must `renew` well within `ttl_ns` and stop acting as the CM as soon as
/// a renewal fails.
pub struct ActiveLease {
    store: Arc<dyn CoordStore>,
    holder: String,
    lease: LeaseId,
    /// The revision of `CM_LEASE_KEY` this holder wrote: the fence `commit_as` checks.
    revision: Revision,
    ttl_ns: u64,
}

impl std::fmt::Debug for ActiveLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveLease")
            .field("holder", &self.holder)
            .field("lease", &self.lease)
            .field("revision", &self.revision)
            .field("ttl_ns", &self.ttl_ns)
            .finish()
    }
}

impl ActiveLease {
    /// Extend the lease by its TTL from now. `LeaseLost` if it already expired: the
    /// key is gone and another manager may be active.
    pub fn renew(&self) -> Result<(), CmError> {
        match self.store.keep_alive(self.lease) {
            Ok(()) => Ok(()),
            Err(StoreError::LeaseExpired(_)) => Err(CmError::LeaseLost {
                holder: self.holder.clone(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Step down now, freeing the key for a standby without waiting for expiry.
    pub fn release(self) -> Result<(), CmError> {
        self.store.revoke(self.lease)?;
        Ok(())
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    pub fn lease_id(&self) -> LeaseId {
        self.lease
    }

    /// The revision of [`CM_LEASE_KEY`] this holder wrote.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    pub fn ttl_ns(&self) -> u64 {
        self.ttl_ns
    }
}
