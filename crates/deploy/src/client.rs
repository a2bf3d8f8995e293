//! A client of a deployed cluster that knows only the CMs' addresses (what
//! `rowankv put|get|del|status --cm ADDR` uses).
//!
//! The client attaches to the `tcp` fabric under a node identity drawn at random
//! from [`CLIENT_NODE_MIN`]`..`[`crate::CM_ALIAS_BASE`]: a client is not a member,
//! its identity only names its queue pairs for as long as it runs, so it asks the
//! CM for none (an identity handed out is recorded in the store for good, which a
//! command run once per key should not do). Two clients drawing the same
//! identity at the same time (about one chance in 2^31 per pair) would see
//! each other's answers misrouted and time out, never wrong values: every
//! answer names its request.
//!
//! Its fabric engine and connection manager listen on the address the kernel
//! would use to reach the first CM (so servers on other hosts reach it back).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rowankv_client::cm_source::CmSource;
use rowankv_client::{Client, ClientConfig};
use rowankv_fabric::tcp::TcpNic;
use rowankv_server::control::CM_PORT;
use rowankv_types::NodeId;
use rowankv_wire::config::{Config, ConfigError, ConfigSource};

use crate::{alias_cms, attach, perr, Attached, ProcessError, CM_ALIAS_BASE};

/// The lowest identity a client draws.
pub const CLIENT_NODE_MIN: u32 = 0x8000_0000;

/// A configuration source that remembers the last configuration it read (the
/// directory finds servers' addresses there without asking the CMs again).
pub struct Remembering {
    inner: CmSource<TcpNic>,
    last: RwLock<Option<Arc<Config>>>,
}

impl Remembering {
    pub fn last(&self) -> Option<Arc<Config>> {
        self.last.read().clone()
    }
}

impl ConfigSource for Remembering {
    fn fetch(&self) -> Result<Arc<Config>, ConfigError> {
        let c = self.inner.fetch()?;
        *self.last.write() = Some(c.clone());
        Ok(c)
    }
}

/// The local address this host uses to reach `address`.
fn local_ip_towards(address: &str) -> Result<IpAddr, ProcessError> {
    let target: SocketAddr = address
        .to_socket_addrs()
        .map_err(perr(&format!("resolving {address}")))?
        .next()
        .ok_or_else(|| ProcessError(format!("{address} resolves to no address")))?;
    if target.ip().is_loopback() {
        return Ok(target.ip());
    }
    let unspecified: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    let s = UdpSocket::bind(unspecified).map_err(perr("a socket"))?;
    s.connect(target)
        .map_err(perr(&format!("a route to {address}")))?;
    Ok(s.local_addr().map_err(perr("a local address"))?.ip())
}

/// A connected client and what keeps it attached.
pub struct Remote {
    pub client: Client<TcpNic>,
    pub source: Arc<Remembering>,
    pub net: Attached,
}

/// Attach a client node and read the configuration from `cms`.
pub fn attach_client(
    cluster_id: u64,
    secret: &[u8],
    cms: &[String],
    timeout: Duration,
) -> Result<(Attached, Arc<Remembering>), ProcessError> {
    let first = cms
        .first()
        .ok_or_else(|| ProcessError("no CM address".into()))?;
    let ip = local_ip_towards(first)?;
    let node = NodeId(rand::Rng::gen_range(
        &mut rand::thread_rng(),
        CLIENT_NODE_MIN..CM_ALIAS_BASE,
    ));
    let any = SocketAddr::new(ip, 0);
    let net = attach(cluster_id, secret, node, any, any, &ip.to_string())?;
    let aliases = alias_cms(&net.directory, cms);
    let source = Arc::new(Remembering {
        inner: CmSource::new(
            net.nic.clone(),
            net.directory.clone(),
            cluster_id,
            aliases.iter().map(|&a| (a, CM_PORT)).collect(),
            timeout,
        )
        .map_err(perr("a configuration source"))?,
        last: RwLock::new(None),
    });
    let s2 = source.clone();
    net.directory.set_resolver(Arc::new(move |n| {
        let c = s2.last()?;
        c.members.iter().find(|m| m.node == n)?.address.clone()
    }));
    source.fetch().map_err(perr("the configuration"))?;
    Ok((net, source))
}

/// A client of the cluster whose CMs are at `cms`.
pub fn connect(
    cluster_id: u64,
    secret: &[u8],
    cms: &[String],
    config: ClientConfig,
) -> Result<Remote, ProcessError> {
    let (net, source) = attach_client(cluster_id, secret, cms, config.connect_timeout)?;
    let client = Client::connect(
        net.nic.clone(),
        net.directory.clone(),
        source.clone() as Arc<dyn ConfigSource>,
        config,
    )
    .map_err(perr("connecting to the servers"))?;
    Ok(Remote {
        client,
        source,
        net,
    })
}

/// A server's state (`Body::Stats` to its control role): the JSON object it
/// answers, or why there is none (it did not answer within `timeout`).
pub fn server_stats(
    net: &Attached,
    cluster_id: u64,
    node: rowankv_types::NodeId,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    use rowankv_fabric::Nic;
    use rowankv_rpc::endpoint::{Endpoint, EndpointConfig, Event};
    use rowankv_server::control::CONTROL_PORT;
    use rowankv_types::Term;
    use rowankv_wire::frame::{self, Body, Envelope, Response};
    let mut ep =
        Endpoint::new(net.nic.clone(), EndpointConfig::default()).map_err(|e| e.to_string())?;
    let peer = net
        .directory
        .connect(&mut ep, node, CONTROL_PORT, timeout)
        .map_err(|e| e.to_string())?;
    let env = Envelope {
        cluster_id,
        term: Term(0),
        request_id: 1,
        sender: net.nic.node(),
    };
    ep.request(peer, &env, &Body::Stats)
        .map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + timeout;
    let (mut events, mut data) = (Vec::new(), Vec::new());
    while std::time::Instant::now() < deadline {
        ep.poll(&mut events, &mut data).map_err(|e| e.to_string())?;
        for e in &events {
            if let Event::Message { start, len, .. } = *e {
                let f = frame::decode(&data[start..start + len]).map_err(|e| e.to_string())?;
                return match f.body {
                    Body::Response(Response::Value { value, .. }) => {
                        serde_json::from_slice(value).map_err(|e| e.to_string())
                    }
                    Body::Response(other) => Err(format!("answered {other:?}")),
                    other => Err(format!("sent {:?}", other.msg_type())),
                };
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(format!("no answer within {timeout:?}"))
}

/// Remove server `node` from the cluster on purpose (`rowankv leave`): ask every
/// CM at `cms` ([`crate::join::leave`]), then wait up to `timeout` for a
/// configuration without it. Returns that configuration's term and member
/// count.
/// Attach a client ([`attach_client`]) and read the configuration the CMs
/// serve, which must hold `node`: what a command aimed at one server starts
/// with. The configuration read is returned with the attachment.
pub fn attach_for_member(
    cluster_id: u64,
    secret: &[u8],
    cms: &[String],
    node: NodeId,
    timeout: Duration,
) -> Result<(Attached, Arc<Remembering>, Arc<Config>), ProcessError> {
    let (net, source) = attach_client(cluster_id, secret, cms, timeout)?;
    let config = source
        .last()
        .ok_or_else(|| ProcessError("the CMs served no configuration".into()))?;
    if config.member(node).is_none() {
        return Err(ProcessError(format!(
            "{node} is not a member of the configuration of {}",
            config.term
        )));
    }
    Ok((net, source, config))
}

/// Move `shard`'s primary to `to` (dynamic resharding, seed 000 §4.6;
/// `rowankv reshard`): the active CM lists the migration, and with `wait`
/// this waits (up to `timeout`) until it is finished — struck from the list
/// with `to` the shard's primary. Returns the term that listed it and, when
/// waited for, the term that finished it.
pub fn reshard(
    cluster_id: u64,
    secret: &[u8],
    cms: &[String],
    shard: rowankv_types::ShardId,
    to: NodeId,
    wait: bool,
    timeout: Duration,
) -> Result<(rowankv_types::Term, Option<rowankv_types::Term>), ProcessError> {
    let (_net, source) = attach_client(cluster_id, secret, cms, timeout)?;
    let listed = source
        .inner
        .reshard(shard, to)
        .map_err(|why| ProcessError(format!("moving {shard} to {to}: {why}")))?;
    if !wait {
        return Ok((listed, None));
    }
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(c) = source.fetch() {
            if c.term > listed && c.migration(shard).is_none() {
                let primary = c.shard(shard).map(|s| s.primary);
                if primary != Some(to) {
                    return Err(ProcessError(format!(
                        "the migration of {shard} was rolled back at {} (a failure of one of its ends): its primary is {primary:?}",
                        c.term
                    )));
                }
                return Ok((listed, Some(c.term)));
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(ProcessError(format!(
                "{shard} is migrating to {to} (listed at {listed}), not finished within {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn leave_server(
    cluster_id: u64,
    secret: &[u8],
    cms: &[String],
    node: rowankv_types::NodeId,
    timeout: Duration,
) -> Result<(rowankv_types::Term, usize), ProcessError> {
    use rowankv_fabric::Nic;
    let (net, source, _) = attach_for_member(cluster_id, secret, cms, node, timeout)?;
    let aliases = alias_cms(&net.directory, cms);
    crate::join::leave(&net.directory, &aliases, net.nic.node(), node)?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(c) = source.fetch() {
            if c.member(node).is_none() {
                return Ok((c.term, c.members.len()));
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(ProcessError(format!(
                "the CMs took the request, but no configuration without {node} within {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
