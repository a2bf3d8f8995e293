//! The segment chain of a remote log (the WRITE strategies' backup logs).
//!
//! A backup grants segments on request (`GrantSegment`). The sender keeps the
//! segment it fills and one standby; space is reserved from the current segment,
//! and when an entry does not fit in what is left the segment is sealed (the next
//! grant request names it) and the standby takes over. Entries never straddle
//! segments; the tail left is zeros, which ends the segment's log for digest.
//!
//! `rwrite`/`batch` own one chain per (worker, backup); `share` shares one per
//! (server, backup) among the server's workers behind a lock. Both request and
//! install grants through this module.

use std::collections::HashMap;

use rowankv_fabric::Nic;
use rowankv_types::NodeId;
use rowankv_wire::endpoint::{PeerId, SendError};
use rowankv_wire::frame::{Body, Envelope, Response};

use super::ReplCtx;

/// A granted segment as the sender sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    pub segment: u32,
    /// Offset of the segment in the backup's registered data area.
    pub offset: u64,
    pub len_bytes: u64,
}

/// Where a reservation landed.
pub(crate) enum Reserve {
    /// At this offset of the backup's registered data area.
    At(u64),
    /// No segment with room yet: wait for a grant.
    NoSpace,
}

/// One remote log's segments.
#[derive(Default)]
pub(crate) struct SegmentChain {
    current: Option<Granted>,
    cursor: u64,
    standby: Option<Granted>,
    /// Grant requests sent and not answered.
    requested: usize,
    /// A filled segment to seal with the next grant request.
    seal_pending: Option<u32>,
}

impl SegmentChain {
    /// Reserve `len` bytes, sealing the current segment and moving to the standby
    /// when it does not fit.
    pub fn reserve(&mut self, len: u64) -> Result<Reserve, String> {
        loop {
            let Some(cur) = self.current else {
                match self.standby.take() {
                    Some(g) => {
                        self.current = Some(g);
                        self.cursor = 0;
                        continue;
                    }
                    None => return Ok(Reserve::NoSpace),
                }
            };
            if len > cur.len_bytes {
                return Err(format!("{len} B entry larger than a segment"));
            }
            if self.cursor + len > cur.len_bytes {
                self.seal_pending = Some(cur.segment);
                self.current = None;
                continue;
            }
            let at = cur.offset + self.cursor;
            self.cursor += len;
            return Ok(Reserve::At(at));
        }
    }

    /// Whether the chain lacks a segment (or has a seal to send) and no request
    /// is on its way.
    pub fn needs_grant(&self) -> bool {
        (self.current.is_none() || self.standby.is_none() || self.seal_pending.is_some())
            && self.requested == 0
    }

    /// Send grant requests for log `log` on `peer` until the chain has (or will
    /// have) a current segment and a standby; a pending seal rides on the first.
    /// Each request id is recorded in `requests` with `backup`.
    #[allow(clippy::too_many_arguments)]
    pub fn request_grants<N: Nic>(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        peer: PeerId,
        log: u32,
        backup: NodeId,
        next_request: &mut u64,
        requests: &mut HashMap<u64, NodeId>,
    ) {
        let have = self.current.is_some() as usize + self.standby.is_some() as usize;
        let mut want = 2usize.saturating_sub(have + self.requested);
        if self.seal_pending.is_some() && want == 0 && self.requested == 0 {
            want = 1;
        }
        for _ in 0..want {
            let request_id = *next_request;
            let env = Envelope {
                request_id,
                ..cx.env
            };
            let body = Body::GrantSegment {
                log,
                sealed: self.seal_pending,
            };
            match cx.ep.request(peer, &env, &body) {
                Ok(()) => {
                    *next_request += 1;
                    self.requested += 1;
                    self.seal_pending = None;
                    requests.insert(request_id, backup);
                }
                Err(SendError::Busy(..)) => break,
                Err(e) => {
                    tracing::warn!(%backup, error = %e, "segment request failed");
                    break;
                }
            }
        }
    }

    /// The answer to one of this chain's grant requests.
    pub fn on_grant(&mut self, backup: NodeId, response: &Response<'_>) {
        self.requested = self.requested.saturating_sub(1);
        match *response {
            Response::Segment {
                segment,
                offset,
                len_bytes,
            } => {
                let g = Granted {
                    segment,
                    offset,
                    len_bytes,
                };
                if self.current.is_none() {
                    self.current = Some(g);
                    self.cursor = 0;
                } else if self.standby.is_none() {
                    self.standby = Some(g);
                } else {
                    tracing::warn!(%backup, segment, "a segment granted beyond need");
                }
            }
            ref other => {
                tracing::warn!(%backup, response = ?other, "segment request refused");
            }
        }
    }
}

/// Which backup a grant request went to, if `response` came from `peer`, the
/// connection the request went on (a grant from anywhere else is ignored).
pub(crate) fn grant_for(
    requests: &mut HashMap<u64, NodeId>,
    request_id: u64,
    peer: PeerId,
    peer_of: impl Fn(NodeId) -> Option<PeerId>,
) -> Option<NodeId> {
    let &backup = requests.get(&request_id)?;
    if peer_of(backup) != Some(peer) {
        tracing::warn!(
            ?peer,
            request_id,
            "a grant from another connection, ignored"
        );
        return None;
    }
    requests.remove(&request_id);
    Some(backup)
}
