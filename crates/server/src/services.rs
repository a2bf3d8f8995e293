//! The receiving side of the replication paths, as connection-manager services
//! (after `rdma_cm`: a sender resolves a service by node and number, sends its
//! queue pair's address, and gets the receiver's back, or a refusal).
//!
//! - [`ROWAN_SERVICE`] (`rowan`): the sender's queue pair is connected to the
//!   server's Rowan receiver, so its SENDs land in the server's one b-log
//!   through the shared receive queue, without the server's CPU.
//! - [`REMOTE_LOG_SERVICE`] (`rwrite`, `batch`, `share`): the server opens a
//!   passive queue pair on its passive completion queue, connects it to the
//!   sender's, and hands it to the backup log (which destroys it when the
//!   sender leaves the configuration: the fence against a removed primary's
//!   WRITEs). The answer's private data is the descriptor of the server's
//!   registered data area ([`encode_region`]), where the sender WRITEs.
//!
//! The requests arrive through the [`Directory`](rowankv_rpc::directory::Directory)
//! — on channels in one process, through the network connection manager from
//! another — and are answered by the server's control role each step; the
//! in-process cluster answers them while it builds, before any role runs.

use std::sync::Arc;

use rowankv_fabric::{Nic, QpAddr, QueuePair, RemoteRegion};
use rowankv_rpc::directory::{Accepted, Acceptor};
use rowankv_types::{NodeId, Rkey};

use crate::server::ServerShared;

/// The Rowan receiver of a server.
pub const ROWAN_SERVICE: u16 = u16::MAX - 1;
/// The passive remote log of a server (the WRITE strategies).
pub const REMOTE_LOG_SERVICE: u16 = u16::MAX - 2;

/// Bytes of an encoded region descriptor.
pub const REGION_BYTES: usize = 16;

/// A region descriptor as private data: node, rkey (u32 each) and length
/// (u64), little-endian.
pub fn encode_region(r: &RemoteRegion) -> Vec<u8> {
    let mut out = Vec::with_capacity(REGION_BYTES);
    out.extend_from_slice(&r.node.0.to_le_bytes());
    out.extend_from_slice(&r.rkey.0.to_le_bytes());
    out.extend_from_slice(&(r.len_bytes as u64).to_le_bytes());
    out
}

/// A region descriptor from private data sent by `from`: it must be exactly
/// [`REGION_BYTES`] long and name `from`'s node.
pub fn decode_region(bytes: &[u8], from: NodeId) -> Result<RemoteRegion, String> {
    if bytes.len() != REGION_BYTES {
        return Err(format!(
            "a region descriptor of {} bytes, not {REGION_BYTES}",
            bytes.len()
        ));
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let node = NodeId(u32_at(0));
    if node != from {
        return Err(format!("a region descriptor of {node}, sent by {from}"));
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    Ok(RemoteRegion {
        node,
        rkey: Rkey(u32_at(4)),
        len_bytes: usize::try_from(len).map_err(|_| format!("a region of {len} bytes"))?,
    })
}

/// A server's passive remote log: the completion queue its passive queue
/// pairs use and the descriptor of its registered data area.
pub struct RemoteLog<N: Nic> {
    pub cq: N::Cq,
    pub region: RemoteRegion,
}

/// The replication services of one server, on its NIC.
pub struct ReplicationServices<N: Nic> {
    server: Arc<ServerShared<N>>,
    nic: N,
    rowan: Option<Acceptor>,
    remote_log: Option<(Acceptor, RemoteLog<N>)>,
}

impl<N: Nic> ReplicationServices<N> {
    /// `rowan`: the acceptor of [`ROWAN_SERVICE`] (Rowan strategy);
    /// `remote_log`: that of [`REMOTE_LOG_SERVICE`] with the log it offers
    /// (WRITE strategies).
    pub fn new(
        server: Arc<ServerShared<N>>,
        nic: N,
        rowan: Option<Acceptor>,
        remote_log: Option<(Acceptor, RemoteLog<N>)>,
    ) -> Self {
        ReplicationServices {
            server,
            nic,
            rowan,
            remote_log,
        }
    }

    /// Answer every pending request; whether any was.
    pub fn serve(&mut self) -> bool {
        let mut served = 0;
        let server = &self.server;
        if let Some(a) = &self.rowan {
            served += a.serve_pending(|from, private| {
                server.with_config(|config| {
                    let key = admit(server, config, from, private)?;
                    server
                        .blog
                        .accept_as(from, key)
                        .map(|qp| Accepted {
                            qp,
                            private: Vec::new(),
                        })
                        .map_err(|e| format!("Rowan receiver: {e}"))
                })
            });
        }
        if let Some((a, log)) = &self.remote_log {
            let nic = &self.nic;
            served += a.serve_pending(|from: QpAddr, private| {
                server.with_config(|config| {
                    let key = admit(server, config, from, private)?;
                    let target = nic
                        .create_qp(&log.cq, &log.cq, None, 16)
                        .map_err(|e| format!("passive queue pair: {e}"))?;
                    target
                        .connect(from)
                        .map_err(|e| format!("connecting the passive queue pair: {e}"))?;
                    let qp = target.addr();
                    server.blog.accept_writer_as(target, key);
                    Ok(Accepted {
                        qp,
                        private: encode_region(&log.region),
                    })
                })
            });
        }
        served > 0
    }
}

/// Bytes of a replication path's request: the sending worker's index (u16,
/// little-endian), its key at this server.
pub const PATH_REQUEST_BYTES: usize = 2;

/// The private data of a replication path's request from `worker`.
pub fn encode_path_request(worker: u16) -> Vec<u8> {
    worker.to_le_bytes().to_vec()
}

/// Whether a replication path from `from` may be accepted, and its key: the
/// sender must be another member of the configuration this server holds (a
/// removed server is fenced: `BackupLog::disconnect` closed its paths, and it
/// may not open new ones), and name its worker. `config`: the server's, held
/// until the path is accepted ([`ServerShared::with_config`]).
fn admit<N: Nic>(
    server: &ServerShared<N>,
    config: &rowankv_wire::config::Config,
    from: QpAddr,
    private: &[u8],
) -> Result<u16, String> {
    let key: [u8; PATH_REQUEST_BYTES] = private.try_into().map_err(|_| {
        format!(
            "a replication path request of {} bytes, not {PATH_REQUEST_BYTES}",
            private.len()
        )
    })?;
    if from.node == server.node || config.member(from.node).is_none() {
        return Err(format!(
            "{} is not a peer server in the configuration of {}",
            from.node, config.term
        ));
    }
    Ok(u16::from_le_bytes(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_descriptor_round_trips_and_bad_ones_are_refused() {
        let r = RemoteRegion {
            node: NodeId(7),
            rkey: Rkey(0xdead_beef),
            len_bytes: 3 << 30,
        };
        let bytes = encode_region(&r);
        assert_eq!(bytes.len(), REGION_BYTES);
        assert_eq!(decode_region(&bytes, NodeId(7)), Ok(r));
        let e = decode_region(&bytes, NodeId(8)).unwrap_err();
        assert!(e.contains("sent by n8"), "{e}");
        let e = decode_region(&bytes[..15], NodeId(7)).unwrap_err();
        assert!(e.contains("15 bytes"), "{e}");
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_region(&long, NodeId(7)).is_err());
    }
}
