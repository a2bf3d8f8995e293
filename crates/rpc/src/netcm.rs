//! The network connection manager: connection set-up between processes, after
//! `rdma_cm`. A process listens on one TCP address; a peer that wants a queue pair
//! connected to one of its services (a worker, the control role, the CM) sends its
//! own queue pair's address there and gets the service's back, or a refusal. The
//! queue pairs themselves then talk over the fabric; this connection only carries
//! the exchange and is closed after it.
//!
//! Only a peer that proves the cluster id and the shared secret is served: the
//! listener sends a fresh 32-byte nonce, the caller answers with
//! HMAC-SHA256(secret, nonce ‖ request) and the listener checks it in constant time.
//! A wrong or missing proof, another cluster's id, a malformed or oversized frame:
//! the request is refused with a reason, logged, and nothing else happens.
//!
//! Wire format: `docs/format/connection-manager.md`. Every frame is a 4-byte
//! little-endian length and that many bytes of JSON, at most [`FRAME_BYTES_MAX`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use hmac::{Hmac, Mac};
use parking_lot::RwLock;
use rowankv_fabric::tcp::AddressBook;
use rowankv_fabric::QpAddr;
use rowankv_types::{NodeId, QpNum};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::directory::{check_private, Accepted, ConnectRequest};

/// Largest frame of the exchange.
pub const FRAME_BYTES_MAX: usize = 4096;
/// Version of the exchange; a listener refuses another.
pub const PROTOCOL_VERSION: u32 = 5;
/// How long either side waits for the other's next frame.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the listener waits for the service to accept.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

type HmacSha256 = Hmac<Sha256>;

/// The listener's first frame.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    version: u32,
    /// 32 random bytes.
    nonce: Vec<u8>,
}

/// The caller's request.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Request {
    version: u32,
    cluster_id: u64,
    /// The service asked for: (node, service number).
    to_node: u32,
    service: u16,
    /// The caller's queue pair.
    from_node: u32,
    from_qpn: u32,
    /// What the caller tells the service (`directory::PRIVATE_BYTES_MAX` at most).
    #[serde(default)]
    private: Vec<u8>,
    /// Where the caller's fabric engine listens (`host:port`), when it has one:
    /// the service's side connects its queue pair there.
    #[serde(default)]
    from_fabric: Option<String>,
    /// HMAC-SHA256(secret, nonce ‖ the fields above).
    proof: Vec<u8>,
}

/// The listener's answer.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    /// The service's queue pair, connected to the caller's; or why not.
    qp: Option<(u32, u32)>,
    /// What the service tells the caller.
    #[serde(default)]
    private: Vec<u8>,
    /// Where the answering process's fabric engine listens, when it has one.
    #[serde(default)]
    fabric: Option<String>,
    error: Option<String>,
}

fn mac(secret: &[u8], nonce: &[u8], r: &Request) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    m.update(b"rowankv-connect-v3");
    m.update(nonce);
    m.update(&r.version.to_le_bytes());
    m.update(&r.cluster_id.to_le_bytes());
    m.update(&r.to_node.to_le_bytes());
    m.update(&r.service.to_le_bytes());
    m.update(&r.from_node.to_le_bytes());
    m.update(&r.from_qpn.to_le_bytes());
    m.update(&(r.private.len() as u32).to_le_bytes());
    m.update(&r.private);
    let fabric = r.from_fabric.as_deref().unwrap_or("");
    m.update(&(fabric.len() as u32).to_le_bytes());
    m.update(fabric.as_bytes());
    m
}

fn write_frame<T: Serialize>(s: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(value).expect("frames serialize");
    debug_assert!(body.len() <= FRAME_BYTES_MAX);
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    s.write_all(&out)
}

fn read_frame<T: for<'de> Deserialize<'de>>(s: &mut TcpStream) -> Result<T, String> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)
        .map_err(|e| format!("reading a frame's length: {e}"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(format!(
            "a frame of {len} bytes, more than {FRAME_BYTES_MAX}"
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .map_err(|e| format!("reading a frame of {len} bytes: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| format!("a malformed frame: {e}"))
}

/// `to_node` of a request for whichever node of the listening process offers
/// the service (how a process that knows only a CM's address reaches it: the
/// answer's queue pair names the node).
pub const ANY_NODE: u32 = u32::MAX;

/// Where a process's fabric engine listens and where it records the engines of
/// the peers it exchanges with (`rowankv_fabric::tcp::AddressBook`): each
/// exchange carries both sides' fabric addresses, so that the queue pairs it
/// connects can reach each other.
#[derive(Clone)]
pub struct FabricPeers {
    pub own: SocketAddr,
    pub book: AddressBook,
}

/// Finds the connection-manager address of a node the book does not hold
/// (a server process: the members of its current configuration).
pub type Resolver = Arc<dyn Fn(NodeId) -> Option<String> + Send + Sync>;

/// A node's connection-manager address; `any`: it is an alias for whichever
/// node of that process offers the service ([`ANY_NODE`]).
#[derive(Clone)]
struct Entry {
    address: String,
    any: bool,
}

/// This process's side: the listener and the address book.
pub(crate) struct Network {
    cluster_id: u64,
    secret: Vec<u8>,
    local: SocketAddr,
    book: RwLock<HashMap<NodeId, Entry>>,
    /// The real nodes found behind aliases (answers to requests sent to one).
    behind_aliases: Arc<RwLock<std::collections::HashSet<NodeId>>>,
    resolver: RwLock<Option<Resolver>>,
    fabric: Option<FabricPeers>,
    stop: Arc<AtomicBool>,
}

/// Record a peer's fabric address that an exchange carried.
fn learn(fabric: &Option<FabricPeers>, node: NodeId, address: Option<&str>) -> Result<(), String> {
    let (Some(f), Some(a)) = (fabric, address) else {
        return Ok(());
    };
    let addr: SocketAddr = a
        .parse()
        .map_err(|_| format!("fabric address {a:?} of {node} is not ip:port"))?;
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err(format!("fabric address {a:?} of {node} cannot be reached"));
    }
    f.book.insert(node, addr);
    Ok(())
}

impl Drop for Network {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Where a listener hands requests: the acceptors of this process's services.
/// `None` for the node: any node of this process that offers the service.
pub(crate) type Route =
    Arc<dyn Fn(Option<NodeId>, u16) -> Option<Sender<ConnectRequest>> + Send + Sync>;

impl Network {
    /// Listen on `listen` and serve requests through `route`.
    pub(crate) fn start(
        cluster_id: u64,
        secret: Vec<u8>,
        listen: SocketAddr,
        route: Route,
        fabric: Option<FabricPeers>,
    ) -> std::io::Result<Network> {
        let listener = TcpListener::bind(listen)?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, secret2, fabric2) = (stop.clone(), secret.clone(), fabric.clone());
        std::thread::Builder::new()
            .name(format!("rowankv-cm-listen-{}", local.port()))
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            let (secret, route) = (secret2.clone(), route.clone());
                            let fabric = fabric2.clone();
                            let _ = std::thread::Builder::new()
                                .name("rowankv-cm-serve".into())
                                .spawn(move || {
                                    serve(stream, peer, cluster_id, &secret, &route, &fabric)
                                });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "connection manager: accept failed");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })?;
        Ok(Network {
            cluster_id,
            secret,
            local,
            book: RwLock::new(HashMap::new()),
            behind_aliases: Arc::default(),
            resolver: RwLock::new(None),
            fabric,
            stop,
        })
    }

    pub(crate) fn local_address(&self) -> SocketAddr {
        self.local
    }

    pub(crate) fn set_address(&self, node: NodeId, address: String, any: bool) {
        self.book.write().insert(node, Entry { address, any });
    }

    pub(crate) fn set_resolver(&self, resolver: Resolver) {
        *self.resolver.write() = Some(resolver);
    }

    /// `node`'s connection-manager address, and whether it is an alias.
    fn entry(&self, node: NodeId) -> Option<Entry> {
        if let Some(e) = self.book.read().get(&node) {
            return Some(e.clone());
        }
        let resolver = self.resolver.read().clone()?;
        resolver(node).map(|address| Entry {
            address,
            any: false,
        })
    }

    pub(crate) fn address(&self, node: NodeId) -> Option<String> {
        self.entry(node).map(|e| e.address)
    }

    /// Whether `node` answered a request sent to an alias.
    pub(crate) fn is_behind_alias(&self, node: NodeId) -> bool {
        self.behind_aliases.read().contains(&node)
    }

    /// Ask `node`'s process, at `address`, to connect `service` to `from`; the
    /// answer arrives on the returned channel (from a thread of its own, so the
    /// caller does not block).
    pub(crate) fn request(
        &self,
        node: NodeId,
        service: u16,
        from: QpAddr,
        private: Vec<u8>,
    ) -> Option<Receiver<Result<Accepted, String>>> {
        let entry = self.entry(node)?;
        let (tx, rx) = channel::bounded(1);
        let request = Request {
            version: PROTOCOL_VERSION,
            cluster_id: self.cluster_id,
            to_node: if entry.any { ANY_NODE } else { node.0 },
            service,
            from_node: from.node.0,
            from_qpn: from.qpn.0,
            private,
            from_fabric: self.fabric.as_ref().map(|f| f.own.to_string()),
            proof: Vec::new(),
        };
        let secret = self.secret.clone();
        let fabric = self.fabric.clone();
        let behind = entry.any.then(|| self.behind_aliases.clone());
        let _ = std::thread::Builder::new()
            .name("rowankv-cm-connect".into())
            .spawn(move || {
                let answer = exchange(&entry.address, request, &secret, &fabric);
                if let (Some(behind), Ok(a)) = (&behind, &answer) {
                    behind.write().insert(a.qp.node);
                }
                let _ = tx.send(answer);
            });
        Some(rx)
    }
}

/// The caller's side of one exchange.
fn exchange(
    address: &str,
    mut request: Request,
    secret: &[u8],
    fabric: &Option<FabricPeers>,
) -> Result<Accepted, String> {
    let target = address
        .to_socket_addrs()
        .map_err(|e| format!("resolving {address}: {e}"))?
        .next()
        .ok_or_else(|| format!("{address} resolves to no address"))?;
    let mut s = TcpStream::connect_timeout(&target, IO_TIMEOUT)
        .map_err(|e| format!("connecting to {address}: {e}"))?;
    s.set_read_timeout(Some(IO_TIMEOUT + ACCEPT_TIMEOUT)).ok();
    s.set_write_timeout(Some(IO_TIMEOUT)).ok();
    s.set_nodelay(true).ok();
    let hello: Hello = read_frame(&mut s).map_err(|e| format!("{address}: {e}"))?;
    if hello.version != PROTOCOL_VERSION {
        return Err(format!(
            "{address} speaks connection protocol {}, not {PROTOCOL_VERSION}",
            hello.version
        ));
    }
    if hello.nonce.len() != 32 {
        return Err(format!("{address} sent a malformed nonce"));
    }
    request.proof = mac(secret, &hello.nonce, &request)
        .finalize()
        .into_bytes()
        .to_vec();
    write_frame(&mut s, &request).map_err(|e| format!("{address}: {e}"))?;
    let reply: Reply = read_frame(&mut s).map_err(|e| format!("{address}: {e}"))?;
    match (reply.qp, reply.error) {
        (Some((node, qpn)), None) => {
            check_private(&reply.private).map_err(|e| format!("{address}'s answer: {e}"))?;
            // Before the caller connects its queue pair: the engine it talks to.
            learn(fabric, NodeId(node), reply.fabric.as_deref())
                .map_err(|e| format!("{address}'s answer: {e}"))?;
            Ok(Accepted {
                qp: QpAddr {
                    node: NodeId(node),
                    qpn: QpNum(qpn),
                },
                private: reply.private,
            })
        }
        (None, Some(why)) => Err(why),
        _ => Err(format!("{address} sent a malformed reply")),
    }
}

/// The listener's side of one exchange.
fn serve(
    mut s: TcpStream,
    peer: SocketAddr,
    cluster_id: u64,
    secret: &[u8],
    route: &Route,
    fabric: &Option<FabricPeers>,
) {
    s.set_nonblocking(false).ok();
    s.set_read_timeout(Some(IO_TIMEOUT)).ok();
    s.set_write_timeout(Some(IO_TIMEOUT)).ok();
    s.set_nodelay(true).ok();
    let nonce: [u8; 32] = rand::random();
    let hello = Hello {
        version: PROTOCOL_VERSION,
        nonce: nonce.to_vec(),
    };
    if write_frame(&mut s, &hello).is_err() {
        return;
    }
    let outcome = read_frame::<Request>(&mut s).and_then(|r| {
        if r.version != PROTOCOL_VERSION {
            return Err(format!(
                "connection protocol {} refused (this is {PROTOCOL_VERSION})",
                r.version
            ));
        }
        mac(secret, &nonce, &r)
            .verify_slice(&r.proof)
            .map_err(|_| "refused: the cluster secret was not proven".to_string())?;
        if r.cluster_id != cluster_id {
            return Err(format!(
                "refused: cluster {:#x}, this is {cluster_id:#x}",
                r.cluster_id
            ));
        }
        check_private(&r.private).map_err(|e| format!("refused: {e}"))?;
        let node = NodeId(r.to_node);
        let acceptor =
            route((r.to_node != ANY_NODE).then_some(node), r.service).ok_or_else(|| {
                match r.to_node {
                    ANY_NODE => format!("no service {} here", r.service),
                    _ => format!("no service {} on {node} here", r.service),
                }
            })?;
        // Before the service connects its queue pair to the caller's.
        learn(fabric, NodeId(r.from_node), r.from_fabric.as_deref())
            .map_err(|e| format!("refused: {e}"))?;
        let (reply_tx, reply_rx) = channel::bounded(1);
        let from = QpAddr {
            node: NodeId(r.from_node),
            qpn: QpNum(r.from_qpn),
        };
        acceptor
            .send(ConnectRequest {
                from,
                private: r.private,
                reply: reply_tx,
            })
            .map_err(|_| format!("service {} on {node} is gone", r.service))?;
        reply_rx
            .recv_timeout(ACCEPT_TIMEOUT)
            .map_err(|_| format!("service {} on {node} did not accept in time", r.service))?
    });
    let reply = match outcome {
        Ok(a) => Reply {
            qp: Some((a.qp.node.0, a.qp.qpn.0)),
            private: a.private,
            fabric: fabric.as_ref().map(|f| f.own.to_string()),
            error: None,
        },
        Err(why) => {
            tracing::warn!(%peer, why, "connection request refused");
            Reply {
                qp: None,
                private: Vec::new(),
                fabric: None,
                error: Some(why),
            }
        }
    };
    let _ = write_frame(&mut s, &reply);
}
