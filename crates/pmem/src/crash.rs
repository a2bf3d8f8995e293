//! The crash simulator: which cache lines are written but not yet durable, and what a
//! power failure would leave of them.
//!
//! # Semantics
//! - Granularity is the 64 B cache line. A line is *dirty* from the first store to it
//!   after it was last durable until a persist that covers it. For each dirty line the
//!   simulator keeps its last durable contents, captured at that first store.
//! - Two kinds of dirty line, because two different instructions make them durable:
//!   - *cached*: written by ordinary CPU stores (`write`, `write_u64`, CPU CAS/FAA);
//!     only `persist` (flush + drain) makes them durable;
//!   - *streamed*: written past the CPU cache, by non-temporal stores (`nt_copy`) or
//!     by a NIC's DMA (`dma_write`, DMA atomics); `persist`, `drain` and `dma_persist`
//!     make them durable.
//!
//!   A line written both ways stays *cached* until a `persist`: the conservative
//!   choice, since the cached half of it is still in the CPU cache.
//! - A power failure reverts every dropped dirty line to its durable contents and
//!   keeps the current contents of the others. [`PowerFailure::DropAll`] drops every
//!   dirty line; [`PowerFailure::DropSubset`] walks the dirty lines in ascending
//!   order and drops each with `drop_probability`, drawing from a ChaCha8 generator
//!   seeded with `seed`, so that the same seed and the same dirty set give the same
//!   image.
//!
//! # Limits
//! A line is lost or kept whole: the simulator never tears a line or a word, and a
//! subset drawn at random is not an adversarial choice. Real hardware keeps 8-byte
//! stores failure-atomic and may write back any dirty line at any time; both are
//! within what the simulator produces, but it searches that space only at random.
//!
//! Every simulated store takes the simulator's lock, together with the capture of
//! the line's durable contents, so a capture never sees half a store. With the
//! simulator off (the default) none of this runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_fabric::PowerFailure;

use crate::raw::{Mapping, CACHELINE_BYTES};

/// How a store reached the line, which decides what makes it durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// Ordinary CPU store: sits in the CPU cache until flushed.
    Cached,
    /// Non-temporal store or DMA: already past the CPU cache.
    Streamed,
}

/// What a persist operation makes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Flush + drain: every dirty line in the range.
    AllLines,
    /// Drain only (`sfence` after nt stores, or a NIC flush): streamed lines only.
    StreamedLines,
}

#[derive(Clone, Debug)]
struct DirtyLine {
    durable: [u8; CACHELINE_BYTES],
    kind: WriteKind,
}

type PersistHook = Arc<dyn Fn(u64) + Send + Sync>;

/// The crash simulator of one pool. See the module documentation.
pub struct CrashSim {
    map: Arc<Mapping>,
    dirty: Mutex<BTreeMap<usize, DirtyLine>>,
    persist_points: AtomicU64,
    hook: RwLock<Option<PersistHook>>,
}

impl std::fmt::Debug for CrashSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashSim")
            .field("dirty_lines", &self.dirty_lines())
            .field("persist_points", &self.persist_points())
            .finish()
    }
}

impl CrashSim {
    pub(crate) fn new(map: Arc<Mapping>) -> CrashSim {
        assert!(
            map.len_bytes().is_multiple_of(CACHELINE_BYTES),
            "crash simulator needs a pool of whole cache lines"
        );
        CrashSim {
            map,
            dirty: Mutex::new(BTreeMap::new()),
            persist_points: AtomicU64::new(0),
            hook: RwLock::new(None),
        }
    }

    /// Lines written but not yet durable.
    pub fn dirty_lines(&self) -> usize {
        self.dirty.lock().len()
    }

    /// Persist operations (`persist`, `drain`, `dma_persist`) so far.
    pub fn persist_points(&self) -> u64 {
        self.persist_points.load(Ordering::Acquire)
    }

    /// Installs (or removes) a hook called at the start of every persist operation,
    /// before its lines become durable, with the index of that persist point (0, 1,
    /// ...). It runs without any of the simulator's locks held, so it may call
    /// [`CrashSim::image`] to capture the crash image at that instant. It runs on the
    /// persisting thread and must not persist to the same pool itself.
    pub fn set_persist_hook(&self, hook: Option<Box<dyn Fn(u64) + Send + Sync>>) {
        *self.hook.write() = hook.map(PersistHook::from);
    }

    /// The bytes the pool would hold after a power failure right now: the current
    /// contents with the dropped dirty lines reverted to their durable contents. The
    /// live pool is untouched.
    pub fn image(&self, policy: PowerFailure) -> Vec<u8> {
        let dirty = self.dirty.lock();
        let mut image = vec![0u8; self.map.len_bytes()];
        self.map.load(0, &mut image);
        for_each_dropped(&dirty, policy, |line, d| {
            let at = line * CACHELINE_BYTES;
            image[at..at + CACHELINE_BYTES].copy_from_slice(&d.durable);
        });
        image
    }

    /// Applies a power failure to the live pool: the dropped dirty lines revert to
    /// their durable contents, and every byte is durable afterwards.
    pub fn power_fail(&self, policy: PowerFailure) {
        let mut dirty = self.dirty.lock();
        for_each_dropped(&dirty, policy, |line, d| {
            self.map.store(line * CACHELINE_BYTES, &d.durable);
        });
        dirty.clear();
        crate::raw::release_fence();
    }

    /// Runs `store` (which writes `[offset, offset + len)`) under the simulator's lock,
    /// after capturing the durable contents of the lines it makes dirty.
    pub(crate) fn on_write<R>(
        &self,
        offset: usize,
        len: usize,
        kind: WriteKind,
        store: impl FnOnce() -> R,
    ) -> R {
        let mut dirty = self.dirty.lock();
        for line in lines(offset, len) {
            dirty
                .entry(line)
                .and_modify(|d| {
                    if kind == WriteKind::Cached {
                        d.kind = WriteKind::Cached;
                    }
                })
                .or_insert_with(|| {
                    let mut durable = [0u8; CACHELINE_BYTES];
                    self.map.load(line * CACHELINE_BYTES, &mut durable);
                    DirtyLine { durable, kind }
                });
        }
        store()
    }

    /// Counts a persist point and calls the hook; no lock is held during the call.
    pub(crate) fn begin_persist(&self) {
        let index = self.persist_points.fetch_add(1, Ordering::AcqRel);
        let hook = self.hook.read().clone();
        if let Some(hook) = hook {
            hook(index);
        }
    }

    /// Marks the lines of `[offset, offset + len)` durable as `durability` says.
    pub(crate) fn make_durable(&self, offset: usize, len: usize, durability: Durability) {
        let mut dirty = self.dirty.lock();
        if dirty.is_empty() {
            return;
        }
        let range = lines(offset, len);
        match durability {
            Durability::AllLines => {
                let covered: Vec<usize> = dirty.range(range).map(|(line, _)| *line).collect();
                for line in covered {
                    dirty.remove(&line);
                }
            }
            Durability::StreamedLines => {
                let covered: Vec<usize> = dirty
                    .range(range)
                    .filter(|(_, d)| d.kind == WriteKind::Streamed)
                    .map(|(line, _)| *line)
                    .collect();
                for line in covered {
                    dirty.remove(&line);
                }
            }
        }
    }
}

/// The cache lines intersecting `[offset, offset + len)`.
fn lines(offset: usize, len: usize) -> std::ops::Range<usize> {
    if len == 0 {
        return 0..0;
    }
    offset / CACHELINE_BYTES..(offset + len).div_ceil(CACHELINE_BYTES)
}

fn for_each_dropped(
    dirty: &BTreeMap<usize, DirtyLine>,
    policy: PowerFailure,
    mut f: impl FnMut(usize, &DirtyLine),
) {
    match policy {
        PowerFailure::DropAll => {
            for (line, d) in dirty {
                f(*line, d);
            }
        }
        PowerFailure::DropSubset {
            seed,
            drop_probability,
        } => {
            assert!(
                (0.0..=1.0).contains(&drop_probability),
                "drop_probability {drop_probability} is not in [0, 1]"
            );
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for (line, d) in dirty {
                if rng.gen_bool(drop_probability) {
                    f(*line, d);
                }
            }
        }
    }
}
