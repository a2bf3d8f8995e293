//! The seam between a NIC and the memory it reaches: DRAM or a persistent-memory pool.
//!
//! A NIC lands bytes with DMA, independent of the CPU. `RegionMemory` is what a
//! backend calls to do so. The persistent-memory crate implements it for its pools, so
//! that a write landed by the fabric is seen by the media model and by the crash
//! simulator exactly as a real RNIC's DMA would be seen by the DIMMs; this crate
//! implements it for plain DRAM (`DramMemory`).
//!
//! Contract (the DMA-lifetime contract of real verbs, written down):
//! - offsets are bytes from the start of the memory; the caller (the backend) has
//!   already checked them against the registered region, so an implementation may
//!   assert on out-of-range offsets;
//! - `dma_write` makes the bytes visible to loads at once but not durable; only a
//!   `dma_persist` that covers them makes them durable (this is the WRITE followed by
//!   READ of seed 000 §2.2, or IBTA FLUSH);
//! - the 8-byte atomics act on 8-byte aligned words and are atomic with respect to
//!   each other and to CPU atomics on the same word;
//! - concurrent DMA and CPU access to the same bytes is allowed, as on hardware: the
//!   reader sees old or new bytes, never a fault. Upper layers use checksums and
//!   versions, not locks, to tell complete data from incomplete.
//!
//! Hardware assumption (written down because the language does not grant it):
//! `dma_write`/`dma_read` are plain raw-pointer copies, and they may race with the
//! 8-byte atomics and with other copies on the same bytes. In Rust's abstract
//! memory model a non-atomic access racing any other access to the same byte is a
//! data race, hence undefined behaviour (Miri would report it). We rely instead on
//! the hardware model of the targets we build for (x86-64, AArch64), where such a
//! race yields, for each byte, its old or its new value, an aligned 8-byte store
//! is never torn, and nothing else happens — exactly what a NIC's DMA racing a CPU
//! gives. The copies are out-of-line calls (`copy_nonoverlapping` on buffers the
//! compiler cannot see into), so no load is elided or invented across them. The
//! alternative — copying word by word with relaxed atomics — is sound in the
//! language model but stops the compiler from vectorising the copy of a 4 MiB
//! segment; it is the fallback should a target without these guarantees be added.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a power failure does to the lines that were written but not yet persisted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PowerFailure {
    /// Every unpersisted line is lost (reverts to its last durable contents).
    DropAll,
    /// A subset of the unpersisted lines is lost, chosen from `seed` so that the same
    /// seed drops the same lines; each line is dropped with `drop_probability`.
    DropSubset { seed: u64, drop_probability: f64 },
}

/// Memory a NIC may DMA into. See the module documentation for the contract.
pub trait RegionMemory: Send + Sync + 'static {
    /// Total size in bytes.
    fn len_bytes(&self) -> usize;
    /// DMA store: visible at once, durable only after `dma_persist`.
    fn dma_write(&self, offset: usize, data: &[u8]);
    /// DMA load.
    fn dma_read(&self, offset: usize, out: &mut [u8]);
    /// Make `[offset, offset + len)` durable.
    fn dma_persist(&self, offset: usize, len: usize);
    /// 8-byte compare-and-swap at an 8-byte aligned offset; returns the old value.
    fn dma_compare_swap(&self, offset: usize, expect: u64, swap: u64) -> u64;
    /// 8-byte fetch-and-add at an 8-byte aligned offset; returns the old value.
    fn dma_fetch_add(&self, offset: usize, add: u64) -> u64;
    /// An ATOMIC WRITE: `value` stored at 8-byte aligned `offset` in one piece,
    /// atomic with respect to the other atomics. By default a compare-and-swap
    /// loop over [`RegionMemory::dma_compare_swap`], so a memory that tracks its
    /// atomics (the crash simulator's) sees it as one.
    fn dma_atomic_write(&self, offset: usize, value: u64) {
        let mut current = [0u8; 8];
        self.dma_read(offset, &mut current);
        let mut expect = u64::from_le_bytes(current);
        loop {
            let old = self.dma_compare_swap(offset, expect, value);
            if old == expect {
                return;
            }
            expect = old;
        }
    }
    /// The owning node lost power. Volatile memory loses everything; persistent
    /// memory loses its unpersisted lines as `policy` says.
    fn power_fail(&self, policy: PowerFailure);
}

/// Plain DRAM: volatile, so persistence is a no-op and a power failure zeroes it.
pub struct DramMemory {
    words: Box<[UnsafeCell<u64>]>,
    len_bytes: usize,
}

// SAFETY: all access to `words` goes through raw-pointer copies or atomics on
// 8-byte aligned words (see `RegionMemory`'s contract: racing DMA and CPU access sees
// old or new bytes, as on hardware). No reference to the contents ever escapes.
unsafe impl Sync for DramMemory {}
// SAFETY: the buffer is owned; moving it between threads is fine.
unsafe impl Send for DramMemory {}

impl DramMemory {
    /// Zeroed memory of `len_bytes` (rounded up to 8 bytes internally).
    pub fn new(len_bytes: usize) -> Self {
        let words = len_bytes.div_ceil(8);
        DramMemory {
            words: (0..words).map(|_| UnsafeCell::new(0)).collect(),
            len_bytes,
        }
    }

    fn base(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= self.len_bytes),
            "DMA outside DRAM memory: offset {offset} len {len} size {}",
            self.len_bytes
        );
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8),
            "atomic at unaligned offset {offset}"
        );
        self.check(offset, 8);
        // SAFETY: the offset is 8-byte aligned and in bounds; `UnsafeCell<u64>` has
        // the layout of `u64`, which `AtomicU64` shares.
        unsafe { &*(self.words[offset / 8].get() as *const AtomicU64) }
    }

    /// CPU store (for the owner's own threads).
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.dma_write(offset, data)
    }

    /// CPU load (for the owner's own threads).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.dma_read(offset, out)
    }

    /// 8-byte atomic load at an aligned offset.
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.word(offset).load(Ordering::Acquire)
    }
}

impl RegionMemory for DramMemory {
    fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    fn dma_write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: in bounds (checked); the source is a distinct caller buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base().add(offset), data.len()) }
        std::sync::atomic::fence(Ordering::Release);
    }

    fn dma_read(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: in bounds (checked); the destination is a distinct caller buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base().add(offset), out.as_mut_ptr(), out.len())
        }
    }

    fn dma_persist(&self, offset: usize, len: usize) {
        self.check(offset, len);
    }

    fn dma_compare_swap(&self, offset: usize, expect: u64, swap: u64) -> u64 {
        match self
            .word(offset)
            .compare_exchange(expect, swap, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(old) | Err(old) => old,
        }
    }

    fn dma_fetch_add(&self, offset: usize, add: u64) -> u64 {
        self.word(offset).fetch_add(add, Ordering::AcqRel)
    }

    fn power_fail(&self, _policy: PowerFailure) {
        for w in 0..self.words.len() {
            self.word(w * 8).store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dram_round_trip_and_atomics() {
        let m = DramMemory::new(64);
        m.dma_write(3, b"hello");
        let mut out = [0u8; 5];
        m.dma_read(3, &mut out);
        assert_eq!(&out, b"hello");
        assert_eq!(m.dma_fetch_add(8, 5), 0);
        assert_eq!(m.dma_compare_swap(8, 5, 9), 5);
        assert_eq!(
            m.dma_compare_swap(8, 5, 1),
            9,
            "failed CAS returns current value"
        );
        assert_eq!(m.load_u64(8), 9);
        m.power_fail(PowerFailure::DropAll);
        assert_eq!(m.load_u64(8), 0, "DRAM is volatile");
    }

    #[test]
    #[should_panic(expected = "outside DRAM")]
    fn dram_rejects_out_of_range() {
        DramMemory::new(16).dma_write(10, &[0u8; 8]);
    }
}
