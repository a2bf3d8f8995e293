//! What a server's roles share: the engine, the backup log, the configuration it
//! caches, versions, segment grants, counters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rowankv_engine::{entry, BackupLog, BackupLogConfig, Engine};
use rowankv_fabric::Nic;
use rowankv_types::{NodeId, ShardId, Term};
use rowankv_wire::config::{Config, ConfigSource};
use rowankv_wire::endpoint::EndpointConfig;
use rowankv_wire::frame::{self, HEADER_BYTES};

use crate::replication::{BatchConfig, Strategy};
use crate::version::VersionBook;

pub use rowankv_wire::frame::KV_BYTES_MAX;

// The wire's bound is the entry format's: one block of one RPC frame.
const _: () = assert!(
    KV_BYTES_MAX
        == (frame::FRAME_BYTES_MAX_DEFAULT - HEADER_BYTES) / entry::STRIDE_BYTES
            * entry::STRIDE_BYTES
            - entry::HEADER_BYTES
);

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
    pub batch: BatchConfig,
    pub endpoint: EndpointConfig,
    pub blog: BackupLogConfig,
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
            batch: BatchConfig::default(),
            endpoint: EndpointConfig::default(),
            blog: BackupLogConfig::default(),
        }
    }
}

/// Counters of one server.
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
}

impl ServerStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
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
    config: RwLock<Arc<Config>>,
    /// Bumped whenever `config` is replaced, so roles can cache it and check one
    /// atomic instead of taking the lock per request.
    config_epoch: AtomicU64,
    cm: Arc<dyn ConfigSource>,
    /// Segments granted to remote logs: segment → (sender, log id).
    grants: Mutex<HashMap<u32, (NodeId, u32)>>,
    stopped: AtomicBool,
}

impl<N: Nic> ServerShared<N> {
    pub fn new(
        node: NodeId,
        engine: Arc<Engine>,
        blog: Arc<BackupLog<N>>,
        strategy: Strategy,
        settings: ServerSettings,
        config: Arc<Config>,
        cm: Arc<dyn ConfigSource>,
    ) -> Self {
        let shards = engine.config().shard_count;
        let versions = VersionBook::new(
            (0..shards).map(|s| engine.next_version(ShardId(s)).map_or(1, |v| v.0)),
        );
        ServerShared {
            node,
            engine,
            blog,
            strategy,
            settings,
            versions,
            stats: ServerStats::default(),
            config: RwLock::new(config),
            config_epoch: AtomicU64::new(0),
            cm,
            grants: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.read().clone()
    }

    /// Changes whenever the configuration is replaced.
    pub fn config_epoch(&self) -> u64 {
        self.config_epoch.load(Ordering::Acquire)
    }

    pub fn term(&self) -> Term {
        self.config.read().term
    }

    /// Fetch the configuration from the CM and adopt it if it is newer.
    pub fn refresh_config(&self) -> Arc<Config> {
        if let Ok(c) = self.cm.fetch() {
            let mut cur = self.config.write();
            if c.term > cur.term {
                *cur = c;
                self.config_epoch.fetch_add(1, Ordering::Release);
            }
        }
        self.config()
    }

    /// Stop every role (a clean stop, or a crash in tests).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    pub(crate) fn grant(&self, segment: u32, sender: NodeId, log: u32) {
        self.grants.lock().insert(segment, (sender, log));
        self.stats.grants.fetch_add(1, Ordering::Relaxed);
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

    /// Segments granted to remote logs and not sealed (being filled now).
    pub fn granted_segments(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.grants.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }
}
