//! An in-process Clover deployment on the `loopback` fabric: memory nodes on PM
//! pools (optionally with the crash simulator) or DRAM, the MS, one switch, and
//! clients that are either native or behind the switch. The simulator, the tests
//! and the benchmark build on it.

use std::collections::HashSet;
use std::sync::Arc;

use rowankv_fabric::{
    DramMemory, Fabric, FaultInjector, LoopbackFabric, LoopbackNic, PowerFailure, RegionMemory,
};
use rowankv_pmem::{MediaModelConfig, MediaStats, Medium, Pool, PoolOptions};
use rowankv_types::NodeId;

use crate::client::{Client, ClientStats, Outcome, Request};
use crate::memnode::MemoryNode;
use crate::ms::MetadataServer;
use crate::switch::{InterposedNic, Switch, SwitchConfig};
use crate::{CloverError, Config};

/// First node id of the memory nodes; the MS and the clients follow.
pub const MEMORY_NODE_ID_BASE: u32 = 1;
pub const MS_NODE_ID: u32 = 100;
pub const CLIENT_NODE_ID_BASE: u32 = 1000;
/// Bound on the clients of one cluster.
pub const CLIENTS_MAX: u32 = 4096;

/// What the memory nodes are made of.
#[derive(Clone, Debug, PartialEq)]
pub enum Memory {
    /// Anonymous PM pools; `crash_sim` attaches the crash simulator.
    Pm { crash_sim: bool },
    /// Anonymous PM pools with the Optane media model (`docs/media-model.md`):
    /// it counts what reaches the DIMMs (DLWA) and, with its timing on, makes
    /// writes wait for the DIMMs' bandwidth. For benchmarks.
    PmMedia(MediaModelConfig),
    /// DRAM (persistence is a no-op; for benchmarks of the wire model only).
    Dram,
}

pub type NativeClient = Client<LoopbackFabric, LoopbackNic>;
pub type SwitchedClient = Client<LoopbackFabric, InterposedNic<LoopbackNic>>;

/// A client of either kind.
pub enum AnyClient {
    Native(NativeClient),
    Interposed(SwitchedClient),
}

impl AnyClient {
    pub fn start(&mut self, req: Request) -> Option<Outcome> {
        match self {
            AnyClient::Native(c) => c.start(req),
            AnyClient::Interposed(c) => c.start(req),
        }
    }
    pub fn poll(&mut self) -> Option<Outcome> {
        match self {
            AnyClient::Native(c) => c.poll(),
            AnyClient::Interposed(c) => c.poll(),
        }
    }
    pub fn is_idle(&self) -> bool {
        match self {
            AnyClient::Native(c) => c.is_idle(),
            AnyClient::Interposed(c) => c.is_idle(),
        }
    }
    pub fn stats(&self) -> ClientStats {
        match self {
            AnyClient::Native(c) => c.stats(),
            AnyClient::Interposed(c) => c.stats(),
        }
    }
    pub fn prefetch_keys(&mut self, keys: &[Vec<u8>]) {
        match self {
            AnyClient::Native(c) => c.prefetch_keys(keys),
            AnyClient::Interposed(c) => c.prefetch_keys(keys),
        }
    }
    pub fn posts_on_next_poll(&self) -> bool {
        match self {
            AnyClient::Native(c) => c.posts_on_next_poll(),
            AnyClient::Interposed(c) => c.posts_on_next_poll(),
        }
    }
    pub fn is_interposed(&self) -> bool {
        matches!(self, AnyClient::Interposed(_))
    }
}

/// The deployment. See the module documentation.
pub struct Cluster {
    pub fabric: LoopbackFabric,
    pub config: Config,
    pub nodes: Vec<Arc<MemoryNode<LoopbackFabric>>>,
    pub ms: Arc<MetadataServer<LoopbackFabric>>,
    pub switch: Arc<Switch>,
    /// The memory nodes' pools (none on DRAM), in node order.
    pub pools: Vec<Arc<Pool>>,
    next_client: u32,
}

impl Cluster {
    /// Build it on `fabric`. The switch interposes on the primary only.
    pub fn new(
        fabric: LoopbackFabric,
        config: Config,
        memory: Memory,
        mut switch: SwitchConfig,
    ) -> Result<Cluster, CloverError> {
        config.check()?;
        let mut nodes = Vec::with_capacity(config.replicas);
        let mut pools = Vec::new();
        for i in 0..config.replicas {
            let pool = |crash_sim: bool, media: Option<MediaModelConfig>| {
                let mut opts = PoolOptions::new(Medium::Emulated, config.region_bytes());
                opts.crash_sim = crash_sim;
                opts.media_model = media;
                Pool::anonymous(config.region_bytes(), opts).map_err(|e| CloverError::Corrupt {
                    offset: 0,
                    detail: format!("creating a pool: {e}"),
                })
            };
            let mem: Arc<dyn RegionMemory> = match &memory {
                Memory::Pm { crash_sim } => {
                    let p = pool(*crash_sim, None)?;
                    pools.push(p.clone());
                    p
                }
                Memory::PmMedia(media) => {
                    let p = pool(false, Some(media.clone()))?;
                    pools.push(p.clone());
                    p
                }
                Memory::Dram => Arc::new(DramMemory::new(config.region_bytes())),
            };
            nodes.push(MemoryNode::start(
                fabric.clone(),
                NodeId(MEMORY_NODE_ID_BASE + i as u32),
                mem,
            )?);
        }
        let ms_nic = fabric.attach(NodeId(MS_NODE_ID))?;
        let ms = MetadataServer::new(config.clone(), ms_nic, nodes.clone())?;
        switch.targets = Some(HashSet::from([nodes[0].id()]));
        Ok(Cluster {
            fabric,
            config,
            nodes,
            ms,
            switch: Switch::new(switch),
            pools,
            next_client: 0,
        })
    }

    /// A new client, behind the switch if `interposed`.
    pub fn client(&mut self, interposed: bool) -> Result<AnyClient, CloverError> {
        if self.next_client >= CLIENTS_MAX {
            return Err(CloverError::Limit("clients of a cluster"));
        }
        let id = NodeId(CLIENT_NODE_ID_BASE + self.next_client);
        self.next_client += 1;
        let nic = self.fabric.attach(id)?;
        Ok(if interposed {
            AnyClient::Interposed(Client::new(
                InterposedNic::new(nic, self.switch.clone()),
                self.nodes.clone(),
                self.ms.clone(),
            )?)
        } else {
            AnyClient::Native(Client::new(nic, self.nodes.clone(), self.ms.clone())?)
        })
    }

    /// Power-fail memory node `i` (its pool loses what `policy` says).
    pub fn crash(&self, i: usize, policy: PowerFailure) {
        self.fabric.power_fail(self.nodes[i].id(), policy);
        self.nodes[i].mark_crashed();
    }

    pub fn restart(&self, i: usize) -> Result<(), CloverError> {
        self.nodes[i].restart()
    }

    /// What reached the DIMMs of every memory node's pool, summed (the
    /// media model's counts; `None` without it).
    pub fn media_stats(&self) -> Option<MediaStats> {
        let mut sum: Option<MediaStats> = None;
        for p in &self.pools {
            let s = p.media()?.stats();
            let t = sum.get_or_insert_with(MediaStats::default);
            t.request_bytes += s.request_bytes;
            t.media_bytes += s.media_bytes;
        }
        sum
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].incarnation().is_some()
    }
}
