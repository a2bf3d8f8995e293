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
//!   registered data area, where the sender WRITEs, and the [`LogEpoch`] of
//!   the log the path writes into ([`encode_log_answer`]).
//!   A path that replaces an earlier one of the same sender ends the log the
//!   sender wrote through the old one ([`ServerShared::accept_writer`]): its
//!   segments are sealed once nothing more can land in them, so they are
//!   digested and reused instead of held for good, and its id is refused from
//!   then on.
//!
//! - [`DRPC_SERVICE`] (`drpc`): the server's redo rings accept the sender's
//!   durable-RPC queue pair on the connection of its worker (released first if
//!   it had one: what landed on it is executed), and answer with the ring's
//!   offer ([`crate::replication::redo::encode_offer`]).
//!
//! Every request names its sender's worker and process ([`PathKey`]).
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
/// The redo rings of a server (`drpc`).
pub const DRPC_SERVICE: u16 = u16::MAX - 3;

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

/// The remote log a path writes into at a backup: the backup's process and
/// the id it gave the log ([`ServerShared::accept_writer`]). The sender names
/// the id in its segment requests; the backup refuses one it has ended
/// (`UnknownLog`). A `share` sender's workers share one log while the backup
/// answers their paths with the same epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogEpoch {
    pub backup: u64,
    pub log: u32,
}

/// Bytes of a remote log's answer: a region descriptor and a [`LogEpoch`].
pub const LOG_ANSWER_BYTES: usize = REGION_BYTES + 16;

/// A remote log's answer as private data: the descriptor of its data area
/// ([`encode_region`]), then the epoch: the backup's incarnation (u64), the
/// log id (u32) and 4 zero bytes, little-endian.
pub fn encode_log_answer(region: &RemoteRegion, epoch: LogEpoch) -> Vec<u8> {
    let mut out = encode_region(region);
    out.extend_from_slice(&epoch.backup.to_le_bytes());
    out.extend_from_slice(&epoch.log.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out
}

/// A remote log's answer sent by `from`: exactly [`LOG_ANSWER_BYTES`], its
/// region naming `from`, its reserved bytes zero.
pub fn decode_log_answer(bytes: &[u8], from: NodeId) -> Result<(RemoteRegion, LogEpoch), String> {
    if bytes.len() != LOG_ANSWER_BYTES {
        return Err(format!(
            "a remote log's answer of {} bytes, not {LOG_ANSWER_BYTES}",
            bytes.len()
        ));
    }
    let region = decode_region(&bytes[..REGION_BYTES], from)?;
    let at = REGION_BYTES;
    if bytes[at + 12..] != [0; 4] {
        return Err("a remote log's answer with non-zero reserved bytes".into());
    }
    let epoch = LogEpoch {
        backup: u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")),
        log: u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes")),
    };
    Ok((region, epoch))
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
    redo: Option<Acceptor>,
}

impl<N: Nic> ReplicationServices<N> {
    /// The acceptor of [`DRPC_SERVICE`] (`drpc`: the server's redo rings are
    /// in [`ServerShared::redo`]).
    pub fn with_redo(mut self, redo: Acceptor) -> Self {
        self.redo = Some(redo);
        self
    }

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
            redo: None,
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
                        .accept_as(from, key.worker)
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
                    let epoch = LogEpoch {
                        backup: server.incarnation,
                        log: server.accept_writer(target, from.node, key),
                    };
                    Ok(Accepted {
                        qp,
                        private: encode_log_answer(&log.region, epoch),
                    })
                })
            });
        }
        if let (Some(a), Some(rings)) = (&self.redo, server.redo.get()) {
            served += a.serve_pending(|from: QpAddr, private| {
                server.with_config(|config| {
                    let key = admit(server, config, from, private)?;
                    let offer = rings.lock().accept(from, key)?;
                    Ok(Accepted {
                        qp: offer.qp,
                        private: crate::replication::redo::encode_offer(&offer),
                    })
                })
            });
        }
        served > 0
    }
}

/// Bytes of a replication path's request: the sending worker's index (u16) —
/// its key at this server — and the sending process's incarnation (u64), both
/// little-endian.
pub const PATH_REQUEST_BYTES: usize = 10;

/// What a replication path's request says about its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathKey {
    /// The sending worker: a path from the same node and worker replaces the
    /// one accepted before (the sender dialled anew).
    pub worker: u16,
    /// The sending server process ([`ServerShared::incarnation`]): a new one
    /// means the sender restarted, and nothing it set up here before is used
    /// again.
    pub incarnation: u64,
}

/// The private data of a replication path's request.
pub fn encode_path_request(key: PathKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(PATH_REQUEST_BYTES);
    out.extend_from_slice(&key.worker.to_le_bytes());
    out.extend_from_slice(&key.incarnation.to_le_bytes());
    out
}

/// Whether a replication path from `from` may be accepted, and its key: the
/// sender must be another member of the configuration this server holds (a
/// removed server is fenced: `BackupLog::disconnect` closed its paths, and it
/// may not open new ones), and name its worker and incarnation. `config`: the
/// server's, held until the path is accepted ([`ServerShared::with_config`]).
fn admit<N: Nic>(
    server: &ServerShared<N>,
    config: &rowankv_wire::config::Config,
    from: QpAddr,
    private: &[u8],
) -> Result<PathKey, String> {
    if private.len() != PATH_REQUEST_BYTES {
        return Err(format!(
            "a replication path request of {} bytes, not {PATH_REQUEST_BYTES}",
            private.len()
        ));
    }
    if from.node == server.node || config.member(from.node).is_none() {
        return Err(format!(
            "{} is not a peer server in the configuration of {}",
            from.node, config.term
        ));
    }
    Ok(PathKey {
        worker: u16::from_le_bytes([private[0], private[1]]),
        incarnation: u64::from_le_bytes(private[2..].try_into().expect("8 bytes")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_answer_and_a_path_request_round_trip_and_bad_ones_are_refused() {
        let r = RemoteRegion {
            node: NodeId(3),
            rkey: Rkey(9),
            len_bytes: 1 << 20,
        };
        let epoch = LogEpoch {
            backup: 0x0123_4567_89ab_cdef,
            log: 7,
        };
        let bytes = encode_log_answer(&r, epoch);
        assert_eq!(bytes.len(), LOG_ANSWER_BYTES);
        assert_eq!(decode_log_answer(&bytes, NodeId(3)), Ok((r, epoch)));
        let e = decode_log_answer(&bytes[..REGION_BYTES], NodeId(3)).unwrap_err();
        assert!(e.contains("of 16 bytes, not 32"), "{e}");
        assert!(decode_log_answer(&bytes, NodeId(4)).is_err());
        let mut reserved = bytes.clone();
        reserved[LOG_ANSWER_BYTES - 1] = 1;
        let e = decode_log_answer(&reserved, NodeId(3)).unwrap_err();
        assert!(e.contains("reserved"), "{e}");
        let key = PathKey {
            worker: 513,
            incarnation: u64::MAX - 1,
        };
        let private = encode_path_request(key);
        assert_eq!(private.len(), PATH_REQUEST_BYTES);
        assert_eq!(private[..2], 513u16.to_le_bytes());
        assert_eq!(private[2..], (u64::MAX - 1).to_le_bytes());
    }

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
