//! The segment chain of a remote log (the WRITE strategies' backup logs).
//!
//! A backup grants segments on request (`GrantSegment`). The sender writes into
//! its current segment and keeps a spare; space is reserved from the current
//! segment, and when an entry does not fit in what is left the segment is retired
//! and a spare takes over. Entries never straddle segments; the tail left is
//! zeros, and so is the place of a WRITE that failed (a hole: digest and gather
//! walk past zeros in a granted segment, which the backup zeroed when it
//! allocated it).
//!
//! A retired segment is *sealed* — named in a grant request, after which the
//! backup digests it once its grace period has passed — only when every WRITE
//! posted into it has completed: a WRITE still held up on its link (WRITEs and
//! grant requests travel on different queue pairs, in no order) must not land
//! after the backup digested, committed and reused the segment.
//!
//! Every grant exchange ends: one request is out at a time, given up on when it
//! is refused, when its connection fails (the endpoint reports it), or when it is
//! not answered within the timeout. A seal it carried is sent again with the next
//! request (the backup ignores the seal of a segment no longer granted to the
//! log, so a seal sent twice is harmless). The segment of an answer that comes
//! after its request was given up on is never written (a seal naming it may
//! already be on its way): it is sealed. A segment granted in an answer that
//! comes in time is one the backup holds for this log now; a seal of it still
//! queued (its first seal was done, the segment since freed and granted again)
//! is dropped.
//!
//! `rwrite`/`batch` own one chain per (worker, backup); `share` shares one per
//! (server, backup) among the server's workers behind a lock (request ids come
//! from the chain, so they are unique among its workers).

use std::collections::{HashMap, VecDeque};

use rowankv_fabric::Nic;
use rowankv_rpc::endpoint::{PeerId, SendError};
use rowankv_types::NodeId;
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
    /// At `offset` of the backup's registered data area, in `segment`. The
    /// WRITE posted there must be reported with [`SegmentChain::write_done`]
    /// (also when posting it failed).
    At { offset: u64, segment: u32 },
    /// No segment with room yet: wait for a grant.
    NoSpace,
}

/// What an answer to a grant request did to the chain.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A segment was granted: entries waiting for space may go.
    Granted,
    /// The backup refused the request.
    Refused(String),
    /// The answer to a request given up on: its segment (if any) is sealed.
    Late,
    /// No request of this chain has this id.
    Unknown,
}

/// The grant request on its way.
struct Request {
    id: u64,
    /// The seal it carries.
    seal: Option<u32>,
}

/// Spare segments a chain asks for beyond its current one, at most (a seal
/// rides on a request only while the chain holds fewer).
const SPARES_MAX: usize = 2;
/// Ids of requests given up on that are remembered (to recognise their late
/// answers); older ones are forgotten.
const GIVEN_UP_MAX: usize = 64;

/// One remote log's segments.
#[derive(Default)]
pub(crate) struct SegmentChain {
    current: Option<Granted>,
    cursor: u64,
    /// Granted segments not written yet, in the order granted.
    spare: VecDeque<Granted>,
    /// WRITEs posted and not completed, per segment.
    writes: HashMap<u32, usize>,
    /// Retired segments with WRITEs still out: sealed when they complete.
    draining: Vec<u32>,
    /// Segments to seal, oldest first: each rides on the next grant request.
    to_seal: VecDeque<u32>,
    request: Option<Request>,
    given_up: VecDeque<u64>,
    next_id: u64,
    /// No request before this time (after a refusal).
    quiet_until_ns: u64,
}

impl SegmentChain {
    /// Reserve `len` bytes, retiring the current segment and moving to a spare
    /// when it does not fit.
    pub fn reserve(&mut self, len: u64) -> Result<Reserve, String> {
        loop {
            let Some(cur) = self.current else {
                match self.spare.pop_front() {
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
                self.retire(cur.segment);
                self.current = None;
                continue;
            }
            let offset = cur.offset + self.cursor;
            self.cursor += len;
            *self.writes.entry(cur.segment).or_default() += 1;
            return Ok(Reserve::At {
                offset,
                segment: cur.segment,
            });
        }
    }

    /// A filled segment: sealed once its WRITEs are done.
    fn retire(&mut self, segment: u32) {
        if self.writes.get(&segment).is_some_and(|&n| n > 0) {
            self.draining.push(segment);
        } else {
            self.to_seal.push_back(segment);
        }
    }

    /// A WRITE into `segment` completed (or was never posted).
    pub fn write_done(&mut self, segment: u32) {
        let Some(n) = self.writes.get_mut(&segment) else {
            return;
        };
        *n -= 1;
        if *n > 0 {
            return;
        }
        self.writes.remove(&segment);
        if let Some(i) = self.draining.iter().position(|&s| s == segment) {
            self.draining.swap_remove(i);
            self.to_seal.push_back(segment);
        }
    }

    /// Whether the chain should send a grant request now: none is out, none was
    /// refused lately, and it has no spare or has a seal to send.
    pub fn needs_grant(&self, now_ns: u64) -> bool {
        self.request.is_none()
            && now_ns >= self.quiet_until_ns
            && (self.spare.is_empty()
                || (!self.to_seal.is_empty() && self.spare.len() < SPARES_MAX))
    }

    /// Start a grant request: its id and the seal it carries. Report the send
    /// with [`SegmentChain::unsend`] if it did not go.
    pub fn start_request(&mut self) -> (u64, Option<u32>) {
        debug_assert!(self.request.is_none());
        self.next_id += 1;
        let id = self.next_id;
        let seal = self.to_seal.pop_front();
        self.request = Some(Request { id, seal });
        (id, seal)
    }

    /// Request `id` was not sent after all.
    pub fn unsend(&mut self, id: u64) {
        if self.request.as_ref().is_some_and(|r| r.id == id) {
            let r = self.request.take().expect("checked");
            if let Some(s) = r.seal {
                self.to_seal.push_front(s);
            }
        }
    }

    /// Give up on request `id` (timed out, or its connection failed): its seal
    /// goes with the next request, sent no earlier than `quiet_until_ns`; an
    /// answer that still comes is `Late`.
    pub fn give_up(&mut self, id: u64, quiet_until_ns: u64) {
        if self.request.as_ref().is_some_and(|r| r.id == id) {
            self.quiet_until_ns = self.quiet_until_ns.max(quiet_until_ns);
            let r = self.request.take().expect("checked");
            if let Some(s) = r.seal {
                self.to_seal.push_front(s);
            }
            if self.given_up.len() == GIVEN_UP_MAX {
                self.given_up.pop_front();
            }
            self.given_up.push_back(id);
        }
    }

    /// The answer to request `id`. After a refusal the chain sends no request
    /// before `now_ns + pause_ns`.
    pub fn on_answer(
        &mut self,
        id: u64,
        response: &Response<'_>,
        now_ns: u64,
        pause_ns: u64,
    ) -> Answer {
        let granted = match *response {
            Response::Segment {
                segment,
                offset,
                len_bytes,
            } => Some(Granted {
                segment,
                offset,
                len_bytes,
            }),
            _ => None,
        };
        if self.request.as_ref().is_some_and(|r| r.id == id) {
            let r = self.request.take().expect("checked");
            return match granted {
                Some(g) => {
                    // Held for this log now: whatever seal of it is queued was
                    // done before the backup could grant it again.
                    self.to_seal.retain(|&s| s != g.segment);
                    self.spare.push_back(g);
                    Answer::Granted
                }
                None => {
                    if let Some(s) = r.seal {
                        self.to_seal.push_front(s);
                    }
                    self.quiet_until_ns = now_ns.saturating_add(pause_ns);
                    Answer::Refused(format!("{response:?}"))
                }
            };
        }
        if let Some(i) = self.given_up.iter().position(|&x| x == id) {
            self.given_up.remove(i);
            if let Some(g) = granted {
                if !self.to_seal.contains(&g.segment) {
                    self.to_seal.push_back(g.segment);
                }
            }
            return Answer::Late;
        }
        Answer::Unknown
    }

    /// Retired segments whose WRITEs are all done, to be sealed, for tests.
    #[cfg(test)]
    pub fn sealable(&self) -> Vec<u32> {
        self.to_seal.iter().copied().collect()
    }

    /// Segments granted and not sealed yet (current, spares, retired), for tests.
    #[cfg(test)]
    pub fn unsealed(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.current.iter().map(|g| g.segment).collect();
        v.extend(self.spare.iter().map(|g| g.segment));
        v.extend(self.draining.iter().copied());
        v.extend(self.to_seal.iter().copied());
        v
    }
}

/// The grant requests one worker sent and has no answer to: (backup, request
/// id) → (connection, sent at).
#[derive(Default)]
pub(crate) struct SentGrants(HashMap<(NodeId, u64), (PeerId, u64)>);

impl SentGrants {
    /// Send `chain`'s next grant request for log `log` of `backup` on `peer`.
    /// Returns whether it went.
    pub fn send<N: Nic>(
        &mut self,
        chain: &mut SegmentChain,
        cx: &mut ReplCtx<'_, N>,
        peer: PeerId,
        log: u32,
        backup: NodeId,
    ) -> bool {
        let (id, sealed) = chain.start_request();
        let env = Envelope {
            request_id: id,
            ..cx.env
        };
        match cx
            .ep
            .request(peer, &env, &Body::GrantSegment { log, sealed })
        {
            Ok(()) => {
                self.0.insert((backup, id), (peer, cx.now_ns));
                true
            }
            Err(e) => {
                if !matches!(e, SendError::Busy(..)) {
                    tracing::warn!(%backup, error = %e, "segment request not sent");
                }
                chain.unsend(id);
                false
            }
        }
    }

    /// An answer to request `id` came from `backup`: it is no longer out.
    pub fn answered(&mut self, backup: NodeId, id: u64) {
        self.0.remove(&(backup, id));
    }

    /// Requests sent `timeout_ns` ago or longer: given up on (`give_up` with the
    /// backup and id of each), their credits given back. Returns whether there
    /// were any.
    pub fn expire<N: Nic>(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        timeout_ns: u64,
        mut give_up: impl FnMut(NodeId, u64),
    ) -> bool {
        let now = cx.now_ns;
        let overdue: Vec<(NodeId, u64)> = self
            .0
            .iter()
            .filter(|(_, &(_, sent))| now >= sent.saturating_add(timeout_ns))
            .map(|(&k, _)| k)
            .collect();
        for (backup, id) in &overdue {
            let (peer, _) = self.0.remove(&(*backup, *id)).expect("listed");
            cx.ep.forget(peer);
            tracing::debug!(%backup, id, "segment request not answered in time");
            give_up(*backup, *id);
        }
        !overdue.is_empty()
    }

    /// Forget the requests sent to `backup` (its path was given up), calling
    /// `give_up` with the id of each.
    pub fn forget(&mut self, backup: NodeId, mut give_up: impl FnMut(u64)) {
        self.0.retain(|&(b, id), _| {
            if b == backup {
                give_up(id);
            }
            b != backup
        });
    }

    /// `peer`'s connection failed: requests sent on it are given up on (`give_up`
    /// with the backup and id of each; the endpoint gave their credits back).
    pub fn connection_failed(&mut self, peer: PeerId, mut give_up: impl FnMut(NodeId, u64)) {
        let lost: Vec<(NodeId, u64)> = self
            .0
            .iter()
            .filter(|(_, &(p, _))| p == peer)
            .map(|(&k, _)| k)
            .collect();
        for (backup, id) in lost {
            self.0.remove(&(backup, id));
            give_up(backup, id);
        }
    }
}

/// How long a chain sends no grant request after one was refused: a fraction of
/// the replication timeout.
pub(crate) fn refusal_pause_ns(timeout_ns: u64) -> u64 {
    timeout_ns / 16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(segment: u32) -> Response<'static> {
        Response::Segment {
            segment,
            offset: u64::from(segment) * 1024,
            len_bytes: 1024,
        }
    }

    fn granted(chain: &mut SegmentChain, seg: u32) {
        let (id, _) = chain.start_request();
        assert_eq!(chain.on_answer(id, &segment(seg), 0, 0), Answer::Granted);
    }

    #[test]
    fn a_filled_segment_is_sealed_only_after_its_writes_complete() {
        let mut c = SegmentChain::default();
        granted(&mut c, 1);
        granted(&mut c, 2);
        let Ok(Reserve::At { segment: 1, .. }) = c.reserve(1000) else {
            panic!("room in segment 1")
        };
        // Does not fit: segment 1 retires, its WRITE still out.
        let Ok(Reserve::At { segment: 2, .. }) = c.reserve(100) else {
            panic!("room in segment 2")
        };
        assert!(c.needs_grant(0), "no spare left");
        let (id, seal) = c.start_request();
        assert_eq!(seal, None, "segment 1 sealed with a WRITE still out");
        assert_eq!(c.on_answer(id, &segment(3), 0, 0), Answer::Granted);
        c.write_done(1);
        assert!(c.needs_grant(0), "a seal to send");
        let (_, seal) = c.start_request();
        assert_eq!(seal, Some(1));
    }

    #[test]
    fn a_seal_whose_request_was_given_up_on_is_sent_again() {
        let mut c = SegmentChain::default();
        granted(&mut c, 1);
        granted(&mut c, 2);
        let _ = c.reserve(1000).unwrap();
        c.write_done(1);
        let _ = c.reserve(1000).unwrap(); // segment 1 retires
        let (id, seal) = c.start_request();
        assert_eq!(seal, Some(1));
        assert!(!c.needs_grant(0), "one request out at a time");
        c.give_up(id, 0);
        let (id2, seal) = c.start_request();
        assert_eq!(seal, Some(1), "the seal rides on the next request");
        // The late answer's segment is never written: it is sealed.
        assert_eq!(c.on_answer(id, &segment(7), 200, 0), Answer::Late);
        assert_eq!(c.on_answer(id2, &segment(8), 200, 0), Answer::Granted);
        let (_, seal) = c.start_request();
        assert_eq!(seal, Some(7));
    }

    #[test]
    fn a_refused_request_keeps_its_seal_and_pauses_the_chain() {
        let mut c = SegmentChain::default();
        let (id, _) = c.start_request();
        let refused = Response::Error {
            code: rowankv_wire::frame::ErrorCode::OutOfSpace,
            term: rowankv_types::Term(1),
            detail: "full",
        };
        assert!(matches!(
            c.on_answer(id, &refused, 5, 100),
            Answer::Refused(_)
        ));
        assert!(!c.needs_grant(104));
        assert!(c.needs_grant(105));
        assert_eq!(c.on_answer(id, &segment(1), 5, 0), Answer::Unknown);
    }

    #[test]
    fn a_segment_granted_again_is_not_sealed_again() {
        let mut c = SegmentChain::default();
        granted(&mut c, 1);
        let _ = c.reserve(1000).unwrap();
        c.write_done(1);
        granted(&mut c, 2);
        let _ = c.reserve(1000).unwrap(); // segment 1 retires
        let (id, seal) = c.start_request();
        assert_eq!(seal, Some(1));
        c.give_up(id, 0); // seal 1 queued again: it may or may not have been done
        let (id, seal) = c.start_request();
        assert_eq!(seal, Some(1));
        c.unsend(id);
        // An answer in time grants segment 1 anew: its seal was done.
        let (id, _) = c.start_request();
        assert_eq!(c.on_answer(id, &segment(1), 0, 0), Answer::Granted);
        assert!(!c.to_seal.contains(&1));
        assert_eq!(c.unsealed(), vec![2, 1]);
    }
}
