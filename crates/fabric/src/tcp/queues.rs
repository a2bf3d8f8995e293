//! Completion queues and shared receive queues of the tcp backend. They live in the
//! node's process; the NIC engine's threads fill them (receive completions and
//! landed messages from the inbound connections, send completions from the queue
//! pairs' response readers), the application polls and posts.
//!
//! The semantics are those of `loopback` (bounded and ring CQs, multi-packet
//! striding, posting order), which defines them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::srq::{claim, post, SrqState};
use crate::verbs::*;

pub(crate) use crate::srq::{LandError, Landing};

pub(crate) struct CqEntry {
    pub(crate) wc: Completion,
    /// For send completions: the queue pair's retired counter and the request's
    /// sequence number; polling the entry retires every slot up to it.
    pub(crate) retire: Option<(Arc<AtomicU64>, u64)>,
}

struct CqState {
    entries: VecDeque<CqEntry>,
    overflowed: bool,
    overwritten: u64,
}

pub(crate) struct CqInner {
    kind: CqKind,
    state: Mutex<CqState>,
}

/// Outcome of pushing a completion.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Ok,
    /// A bounded CQ overflowed: the queue pair that pushed enters the error state.
    Overflow,
}

impl CqInner {
    pub(crate) fn new(kind: CqKind) -> Result<Self, FabricError> {
        let capacity = match kind {
            CqKind::Bounded { capacity } | CqKind::Ring { capacity } => capacity,
        };
        if capacity == 0 {
            return Err(FabricError::Invalid("completion queue capacity 0".into()));
        }
        Ok(CqInner {
            kind,
            state: Mutex::new(CqState {
                entries: VecDeque::with_capacity(capacity.min(1 << 16)),
                overflowed: false,
                overwritten: 0,
            }),
        })
    }

    pub(crate) fn push(&self, entry: CqEntry) -> Pushed {
        let mut s = self.state.lock();
        match self.kind {
            CqKind::Bounded { capacity } => {
                if s.overflowed || s.entries.len() >= capacity {
                    s.overflowed = true;
                    return Pushed::Overflow;
                }
                s.entries.push_back(entry);
            }
            CqKind::Ring { capacity } => {
                if s.entries.len() >= capacity {
                    // The NIC overwrites the oldest entry of the ring.
                    s.entries.pop_front();
                    s.overwritten += 1;
                }
                s.entries.push_back(entry);
            }
        }
        Pushed::Ok
    }
}

/// A completion queue on the tcp fabric.
#[derive(Clone)]
pub struct TcpCq {
    pub(crate) inner: Arc<CqInner>,
}

impl CompletionQueue for TcpCq {
    fn poll(&self, out: &mut [Completion]) -> Result<usize, FabricError> {
        let mut s = self.inner.state.lock();
        if s.overflowed {
            if let CqKind::Bounded { capacity } = self.inner.kind {
                return Err(FabricError::CqOverflow { capacity });
            }
        }
        let n = out.len().min(s.entries.len());
        for slot in out.iter_mut().take(n) {
            let e = s.entries.pop_front().expect("counted above");
            if let Some((retired, seq)) = e.retire {
                retired.fetch_max(seq + 1, Ordering::AcqRel);
            }
            *slot = e.wc;
        }
        Ok(n)
    }

    fn overwritten(&self) -> u64 {
        self.inner.state.lock().overwritten
    }
}

// ---------------------------------------------------------------------------
// Shared receive queues

pub(crate) struct SrqInner {
    config: SrqConfig,
    /// Held while a message is claimed and landed (see [`SrqInner::claim_and_land`]).
    state: Mutex<SrqState>,
}

impl SrqInner {
    pub(crate) fn new(config: SrqConfig) -> Result<Self, FabricError> {
        if config.buffers_max == 0 || config.stride_bytes == Some(0) {
            return Err(FabricError::Invalid(format!("bad SRQ config {config:?}")));
        }
        Ok(SrqInner {
            config,
            state: Mutex::new(SrqState::new()),
        })
    }

    /// Claim the place of a `len`-byte message and run `land` on it before any
    /// later message can claim one, so that messages land whole and in the order
    /// they were claimed (as a NIC lands them). `open` is asked under the lock.
    pub(crate) fn claim_and_land(
        &self,
        len: usize,
        open: impl FnOnce() -> bool,
        land: impl FnOnce(&Landing),
    ) -> Result<Landing, LandError> {
        let mut s = self.state.lock();
        if !open() {
            return Err(LandError::Closed);
        }
        let landing = claim(&mut s, &self.config, len)?;
        land(&landing);
        Ok(landing)
    }
}

/// A shared receive queue on the tcp fabric.
#[derive(Clone)]
pub struct TcpSrq {
    pub(crate) inner: Arc<SrqInner>,
}

impl SharedReceiveQueue for TcpSrq {
    fn post_recv(&self, buffers: &[RecvBuffer]) -> Result<(), FabricError> {
        post(&mut self.inner.state.lock(), &self.inner.config, buffers)
    }

    fn posted(&self) -> usize {
        self.inner.state.lock().buffers.len()
    }
}
