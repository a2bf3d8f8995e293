//! RowanKV as processes (`docs/deployment.md`): one `rowankv cm` process per
//! configuration manager, one `rowankv server` process per pool, and clients —
//! all on the `tcp` fabric, connected at run time through the network connection
//! manager (`rowankv_rpc::netcm`).
//!
//! - [`cm::run`]: the CM's process. It hands out node identities to the servers
//!   that join ([`join`]), commits the first configuration once
//!   `bootstrap.servers` have joined, then runs the CM's role (leases, failover,
//!   re-replication) on the coordination store of its file (embedded, or etcd
//!   for two CMs).
//! - [`server::run`]: a server's process. It opens (or creates) its pool, joins
//!   through a CM under the identity its pool records (or gets one), reads the
//!   configuration from the CMs, recovers its engine when it is still a member,
//!   and runs the server's roles; its replication paths are connected on demand.
//! - [`client`]: a client that knows only the CMs' addresses.
//! - [`metrics`]: the Prometheus endpoint of a server or CM process
//!   (`[metrics] listen`), read from the roles' counters at scrape time.
//! - [`cluster`]: the in-process cluster — servers, the CMs and the embedded
//!   coordination store on one `LoopbackFabric`, run by one executor. It is the
//!   embedded default (`rowankv demo`), the vehicle of the end-to-end tests and
//!   of the simulator (`rowankv-sim` steps its [`Parts`]).
//!
//! Every process's fabric engine listens on a port of its own (by default one
//! the kernel picks on the host of its `listen` address); peers learn it in the
//! connection exchange, so a configuration carries only the connection-manager
//! address of each member.
#![forbid(unsafe_code)]

pub mod admin;
pub mod client;
pub mod cluster;
pub mod cm;
pub mod join;
pub mod local;
pub mod metrics;
pub mod resp;
pub mod server;

use std::net::SocketAddr;

use rowankv_fabric::tcp::{AddressBook, TcpConfig, TcpFabric, TcpNic};
use rowankv_fabric::Fabric;
use rowankv_rpc::directory::Directory;
use rowankv_rpc::netcm::FabricPeers;
use rowankv_types::NodeId;

pub use cluster::{
    build, Cluster, ClusterConfig, ClusterError, Owner, Parts, Recovered, CLIENT_NODE_BASE,
    CM_NODE_BASE,
};

/// The CMs, known by address only, are named `CM_ALIAS_BASE + j` (the `j`-th
/// address of the list) in each process's directory; the connection manager
/// reaches whichever node serves the CM there (`Directory::set_alias`).
pub const CM_ALIAS_BASE: u32 = 0xFFFF_FF00;

/// Errors of running a process.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProcessError(pub String);

pub(crate) fn perr<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> ProcessError + '_ {
    move |e| ProcessError(format!("{what}: {e}"))
}

/// The aliases of `cms` in `directory`.
pub fn alias_cms(directory: &Directory, cms: &[String]) -> Vec<NodeId> {
    cms.iter()
        .enumerate()
        .map(|(j, address)| {
            let alias = NodeId(CM_ALIAS_BASE + j as u32);
            directory.set_alias(alias, address.clone());
            alias
        })
        .collect()
}

/// A process's presence on the network: its node on the `tcp` fabric and the
/// directory that connects its queue pairs.
pub struct Attached {
    pub fabric: TcpFabric,
    pub nic: TcpNic,
    pub directory: Directory,
    /// Where peers reach the fabric engine.
    pub fabric_address: SocketAddr,
}

/// Attach `node` to a `tcp` fabric whose engine binds `fabric_listen`, and
/// start the connection manager on `listen` (port 0: any). `advertise_host`:
/// the host peers use to reach this process (the engine's address they learn).
pub fn attach(
    cluster_id: u64,
    secret: &[u8],
    node: NodeId,
    listen: SocketAddr,
    fabric_listen: SocketAddr,
    advertise_host: &str,
) -> Result<Attached, ProcessError> {
    let book = AddressBook::new();
    let fabric = TcpFabric::with_config(TcpConfig::new(
        cluster_id,
        secret,
        fabric_listen,
        book.clone(),
    ))
    .map_err(perr("the tcp fabric"))?;
    let nic = fabric
        .attach(node)
        .map_err(perr("attaching to the tcp fabric"))?;
    let port = nic.listen_addr().port();
    let fabric_address: SocketAddr = match format!("{advertise_host}:{port}").parse() {
        Ok(a) => a,
        // A host name: peers are told the address it resolves to here.
        Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(advertise_host, port))
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| ProcessError(format!("{advertise_host} resolves to no address")))?,
    };
    let directory = Directory::network(
        cluster_id,
        secret,
        listen,
        Some(FabricPeers {
            own: fabric_address,
            book,
        }),
    )
    .map_err(perr(&format!("the connection manager on {listen}")))?;
    Ok(Attached {
        fabric,
        nic,
        directory,
        fabric_address,
    })
}

/// The host part of `host:port`.
pub fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// `host:0` for the host of `address` (a listener on any free port there).
pub fn any_port(address: SocketAddr) -> SocketAddr {
    SocketAddr::new(address.ip(), 0)
}
