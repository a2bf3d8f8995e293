//! Every `unsafe` block of the crate: the mapping, raw copies, 8-byte atomics over the
//! mapping, cache-line write-back (`clwb`), store fences (`sfence`) and non-temporal
//! stores.
//!
//! The contract kept here, so that the rest of the crate is safe code:
//! - a [`Mapping`] owns one `mmap`ed range; it is unmapped only when the last `Arc`
//!   to it drops, and every access goes through its methods, which assert that the
//!   range is inside the mapping before touching it;
//! - the mapped bytes are shared between threads without locks, as DRAM and PM are
//!   between CPUs and a NIC: copies are raw-pointer copies and never form references
//!   to the contents, and 8-byte words are accessed as `AtomicU64`. A reader racing a
//!   writer sees old or new bytes (upper layers tell them apart with checksums and
//!   versions, as on hardware);
//! - flushes and fences do not change memory contents; they only order and write
//!   back, so they are sound on any in-bounds address.
//!
//! Hardware assumption: a raw copy may race with an 8-byte atomic or another copy
//! on the same bytes (a NIC landing a write while a digest thread reads, a reader
//! racing the cleaner). The language's memory model calls that a data race; this
//! crate relies on the hardware model of x86-64 and AArch64 instead — each byte
//! reads as its old or new value, aligned 8-byte stores are not torn — which is
//! what DMA racing a CPU gives on real PM. See `rowankv_fabric::memory` for the
//! same assumption on the NIC side and the word-by-word atomic fallback.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes in a CPU cache line: the unit of `clwb` and of the crash simulator.
pub const CACHELINE_BYTES: usize = 64;

/// How a file is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileMapping {
    /// `MAP_SHARED`: stores reach the page cache (tmpfs or a disk file).
    Shared,
    /// `MAP_SHARED_VALIDATE | MAP_SYNC`: stores reach the DAX medium directly, so
    /// `clwb` + `sfence` make them durable. The kernel refuses it (EOPNOTSUPP) on a
    /// file system without DAX.
    SharedSync,
}

/// One `mmap`ed range, unmapped on drop.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: the mapping is plain shared memory; it is accessed only through raw-pointer
// copies and atomics (see the module contract), never through references that could
// alias mutably, so sharing and sending it between threads is as sound as it is for
// DRAM that a NIC writes concurrently.
unsafe impl Send for Mapping {}
// SAFETY: see `Send` above.
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("base", &self.base)
            .field("len_bytes", &self.len_bytes)
            .finish()
    }
}

impl Mapping {
    /// Maps `len_bytes` of `file` read-write, shared.
    pub(crate) fn map_file(file: &File, len_bytes: usize, how: FileMapping) -> io::Result<Mapping> {
        assert!(len_bytes > 0, "cannot map an empty file");
        let flags = match how {
            FileMapping::Shared => libc::MAP_SHARED,
            FileMapping::SharedSync => map_sync_flags()?,
        };
        // SAFETY: a fresh mapping chosen by the kernel (address null), of a file we
        // hold open; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        Self::from_mmap(ptr, len_bytes)
    }

    /// An anonymous shared mapping of `len_bytes`, zero-filled.
    pub(crate) fn map_anonymous(len_bytes: usize) -> io::Result<Mapping> {
        assert!(len_bytes > 0, "cannot map zero bytes");
        // SAFETY: a fresh anonymous mapping chosen by the kernel; checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Self::from_mmap(ptr, len_bytes)
    }

    fn from_mmap(ptr: *mut libc::c_void, len_bytes: usize) -> io::Result<Mapping> {
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(ptr as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { base, len_bytes })
    }

    pub(crate) fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Asserts that `[offset, offset + len)` lies inside the mapping.
    #[inline]
    pub(crate) fn check(&self, offset: usize, len: usize) {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= self.len_bytes),
            "pool access out of range: offset {offset} len {len} pool size {} bytes",
            self.len_bytes
        );
    }

    #[inline]
    fn ptr(&self, offset: usize) -> *mut u8 {
        // SAFETY: callers checked `offset <= len_bytes`, so the result stays inside
        // (or one past the end of) the mapping.
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// Copies bytes out of the mapping.
    #[inline]
    pub(crate) fn load(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: the source range is in bounds (checked); `out` is a caller-owned
        // buffer that cannot overlap the mapping's contents as it is a `&mut`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(offset), out.as_mut_ptr(), out.len()) }
    }

    /// Copies bytes into the mapping with ordinary (cached) stores.
    #[inline]
    pub(crate) fn store(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: the destination range is in bounds (checked). `data` may point into
        // the mapping itself only if a caller read a slice out of it, which no API of
        // this crate hands out, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(offset), data.len()) }
    }

    /// The 8-byte word at an 8-byte aligned offset, as an atomic.
    #[inline]
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8),
            "8-byte atomic at unaligned pool offset {offset}"
        );
        self.check(offset, 8);
        // SAFETY: in bounds (checked) and 8-byte aligned (the mapping is page
        // aligned and the offset is a multiple of 8); `AtomicU64` has the size and
        // alignment of `u64`, and the word lives as long as `&self` (the mapping).
        unsafe { &*(self.ptr(offset) as *const AtomicU64) }
    }

    /// Writes back (without necessarily invalidating) every cache line that
    /// intersects `[offset, offset + len)`. Not ordered: follow with [`sfence`].
    #[inline]
    pub(crate) fn flush_lines(&self, offset: usize, len: usize) {
        self.check(offset, len);
        if len == 0 {
            return;
        }
        let first = offset / CACHELINE_BYTES;
        let last = (offset + len - 1) / CACHELINE_BYTES;
        for line in first..=last {
            flush_line(self.ptr(line * CACHELINE_BYTES));
        }
    }

    /// `msync(MS_SYNC)` of the pages covering `[offset, offset + len)`.
    pub(crate) fn msync(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len);
        if len == 0 {
            return Ok(());
        }
        let page = page_size_bytes();
        let start = offset / page * page;
        let end = offset + len;
        // SAFETY: `[start, end)` lies inside the mapping (start rounds down to a page
        // boundary, and the mapping starts on one); msync does not touch contents.
        let rc = unsafe {
            libc::msync(
                self.ptr(start) as *mut libc::c_void,
                end - start,
                libc::MS_SYNC,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Copies `data` to `offset` with non-temporal stores for the 8-byte aligned part
    /// and ordinary stores followed by a cache-line write-back for the unaligned
    /// edges. Like a real `ntstore` sequence it is not ordered: only a following
    /// [`sfence`] makes it durable.
    pub(crate) fn nt_store(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        nt_copy_impl(self, offset, data);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and nothing can refer to it any more (the last
        // `Arc` is dropping and all accessors borrow `self`).
        let rc = unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len_bytes) };
        debug_assert_eq!(rc, 0, "munmap failed: {}", io::Error::last_os_error());
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn map_sync_flags() -> io::Result<libc::c_int> {
    Ok(libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn map_sync_flags() -> io::Result<libc::c_int> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

fn page_size_bytes() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            page as usize
        } else {
            4096
        }
    })
}

/// Orders every earlier store, flush and non-temporal store before later stores:
/// the "drain" half of persist = flush + drain.
#[inline]
pub fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders stores; it reads and writes no memory operand.
    // The asm is not `nomem`, so the compiler also keeps memory accesses around it.
    unsafe {
        std::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// The cache-line write-back instruction this CPU has, detected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushInstruction {
    /// `clwb`: write back, keep the line cached.
    Clwb,
    /// `clflushopt`: write back and invalidate, weakly ordered.
    Clflushopt,
    /// `clflush`: write back and invalidate, strongly ordered.
    Clflush,
    /// Not x86_64: a compiler fence only (no persistence instruction is modelled).
    CompilerFence,
}

/// The flush instruction chosen for this CPU (cpuid, detected once per process).
pub fn flush_instruction() -> FlushInstruction {
    static CHOSEN: std::sync::OnceLock<FlushInstruction> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(detect_flush_instruction)
}

#[cfg(target_arch = "x86_64")]
fn detect_flush_instruction() -> FlushInstruction {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // cpuid leaf 7 sub-leaf 0, EBX: bit 24 CLWB, bit 23 CLFLUSHOPT (Intel SDM vol. 2A).
    // The intrinsics are safe since Rust 1.87 and unsafe before (MSRV 1.80).
    #[allow(unused_unsafe)]
    // SAFETY: cpuid exists on every x86_64 CPU and only reads identification leaves.
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf >= 7 {
        #[allow(unused_unsafe)]
        // SAFETY: leaf 7 exists (checked against the maximum leaf above).
        let ebx = unsafe { __cpuid_count(7, 0) }.ebx;
        if ebx & (1 << 24) != 0 {
            return FlushInstruction::Clwb;
        }
        if ebx & (1 << 23) != 0 {
            return FlushInstruction::Clflushopt;
        }
    }
    // CLFLUSH (cpuid leaf 1, EDX bit 19) is present on every x86_64 CPU.
    FlushInstruction::Clflush
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_flush_instruction() -> FlushInstruction {
    FlushInstruction::CompilerFence
}

#[inline]
fn flush_line(p: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    match flush_instruction() {
        // SAFETY: `p` points into the mapping (callers check the range); a cache-line
        // write-back does not change memory contents. Not `nomem`: the compiler must
        // not move earlier stores to the line past the flush.
        FlushInstruction::Clwb => unsafe {
            std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags));
        },
        // SAFETY: as for `clwb`; invalidating also leaves contents unchanged.
        FlushInstruction::Clflushopt => unsafe {
            std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags));
        },
        // SAFETY: as for `clwb`.
        FlushInstruction::Clflush | FlushInstruction::CompilerFence => unsafe {
            std::arch::asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags));
        },
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
}

#[cfg(target_arch = "x86_64")]
fn nt_copy_impl(map: &Mapping, offset: usize, data: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128, _mm_stream_si64};

    let len = data.len();
    if len == 0 {
        return;
    }
    let end = offset + len;
    // Unaligned edges: ordinary stores written back with a flush, so that one sfence
    // orders them with the streamed middle.
    let mid_start = offset.next_multiple_of(8).min(end);
    let mid_end = (end / 8 * 8).max(mid_start);
    if mid_start > offset {
        map.store(offset, &data[..mid_start - offset]);
        map.flush_lines(offset, mid_start - offset);
    }
    let mut at = mid_start;
    // 8-byte stream up to a 16-byte boundary, then 16-byte streams, then a last
    // 8-byte stream.
    if !at.is_multiple_of(16) && at + 8 <= mid_end {
        stream8(map, at, &data[at - offset..at - offset + 8]);
        at += 8;
    }
    while at + 16 <= mid_end {
        let src = &data[at - offset..at - offset + 16];
        // SAFETY: `at` is 16-byte aligned (page-aligned base, offset multiple of 16)
        // and `[at, at + 16)` is inside the mapping (the whole range was checked by
        // the caller); the source is read unaligned from a live 16-byte slice.
        unsafe {
            let v = _mm_loadu_si128(src.as_ptr() as *const __m128i);
            _mm_stream_si128(map.ptr(at) as *mut __m128i, v);
        }
        at += 16;
    }
    if at + 8 <= mid_end {
        stream8(map, at, &data[at - offset..at - offset + 8]);
        at += 8;
    }
    debug_assert_eq!(at, mid_end);
    if end > mid_end {
        map.store(mid_end, &data[mid_end - offset..]);
        map.flush_lines(mid_end, end - mid_end);
    }

    fn stream8(map: &Mapping, at: usize, src: &[u8]) {
        let v = i64::from_ne_bytes(src.try_into().expect("8-byte chunk"));
        // SAFETY: `at` is 8-byte aligned and `[at, at + 8)` is inside the mapping
        // (the whole range was checked by the caller).
        unsafe { _mm_stream_si64(map.ptr(at) as *mut i64, v) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn nt_copy_impl(map: &Mapping, offset: usize, data: &[u8]) {
    map.store(offset, data);
}

/// The benchmark baseline: copy + flush + sfence, with no pool bookkeeping.
#[inline]
pub(crate) fn store_flush_fence(map: &Mapping, offset: usize, data: &[u8]) {
    map.store(offset, data);
    map.flush_lines(offset, data.len());
    sfence();
}

/// Release fence after CPU or DMA stores, acquire fence before loads, so that the
/// raw copies order like the atomics around them.
#[inline]
pub(crate) fn release_fence() {
    std::sync::atomic::fence(Ordering::Release);
}

#[inline]
pub(crate) fn acquire_fence() {
    std::sync::atomic::fence(Ordering::Acquire);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nt_store_copies_every_alignment() {
        let map = Mapping::map_anonymous(4096).unwrap();
        for start in 0..40 {
            for len in 0..100 {
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(7).wrapping_add(start as u8 + 1))
                    .collect();
                map.store(start, &vec![0u8; len]);
                map.nt_store(start, &data);
                sfence();
                let mut out = vec![0u8; len];
                map.load(start, &mut out);
                assert_eq!(out, data, "start {start} len {len}");
            }
        }
    }

    #[test]
    fn flush_instruction_is_detected() {
        let chosen = flush_instruction();
        #[cfg(target_arch = "x86_64")]
        assert_ne!(chosen, FlushInstruction::CompilerFence);
        let map = Mapping::map_anonymous(4096).unwrap();
        map.store(100, b"abc");
        map.flush_lines(0, 4096);
        sfence();
        let mut out = [0u8; 3];
        map.load(100, &mut out);
        assert_eq!(&out, b"abc");
    }
}
