//! Pools: a mapped file (or anonymous memory) with the persist function of its medium,
//! the media model and the crash simulator on top.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rowankv_fabric::{PowerFailure, RegionMemory};

use crate::crash::{CrashSim, Durability, WriteKind};
use crate::media::{MediaModel, MediaModelConfig};
use crate::raw::{self, FileMapping, Mapping, CACHELINE_BYTES};

/// What the pool's bytes live on, which decides its persist function and what a
/// persisted byte survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// A file on a DAX file system mapped with `MAP_SYNC`: real PM. Persist is
    /// `clwb` + `sfence`; persisted bytes survive power loss.
    Dax,
    /// Any file (normally tmpfs) or anonymous memory, standing in for PM in ADR mode.
    /// Persist is `clwb` + `sfence`, as on PM; the bytes survive a process crash, not
    /// a machine's power loss. Power loss is what the crash simulator models.
    Emulated,
    /// A disk-backed file. Persist is `msync(MS_SYNC)` of the covering pages;
    /// persisted bytes survive power loss, at disk latency.
    Msync,
}

impl fmt::Display for Medium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Medium::Dax => "dax",
            Medium::Emulated => "emulated",
            Medium::Msync => "msync",
        })
    }
}

/// A medium name that is none of `dax`, `emulated`, `msync`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown medium {0:?}: expected one of dax, emulated, msync")]
pub struct ParseMediumError(pub String);

impl FromStr for Medium {
    type Err = ParseMediumError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dax" => Ok(Medium::Dax),
            "emulated" => Ok(Medium::Emulated),
            "msync" => Ok(Medium::Msync),
            other => Err(ParseMediumError(other.to_string())),
        }
    }
}

/// How to create or open a pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolOptions {
    /// The medium asked for. See [`Pool::medium`] for the one in effect.
    pub medium: Medium,
    /// Pool size; a multiple of 64. For [`Pool::open`], 0 takes the file's size.
    pub size_bytes: usize,
    /// If `Dax` is refused because the file system has no DAX, fall back to
    /// `Emulated` instead of failing.
    pub dax_fallback: bool,
    /// Attach a media model with this geometry.
    pub media_model: Option<MediaModelConfig>,
    /// Attach a crash simulator (tests only: every store takes its lock).
    pub crash_sim: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            medium: Medium::Emulated,
            size_bytes: 0,
            dax_fallback: false,
            media_model: None,
            crash_sim: false,
        }
    }
}

impl PoolOptions {
    /// Options for `medium` and `size_bytes`, no instruments, no fallback.
    pub fn new(medium: Medium, size_bytes: usize) -> PoolOptions {
        PoolOptions {
            medium,
            size_bytes,
            ..PoolOptions::default()
        }
    }
}

/// Errors from creating or opening a pool: things that come from outside.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A file or mapping operation failed.
    #[error("pool {path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `Medium::Dax` was asked for on a file system without DAX.
    #[error(
        "pool {path}: MAP_SYNC/DAX is not available on this file system ({detail}); \
         use medium Emulated, or set dax_fallback = true to fall back to Emulated",
        path = path.display()
    )]
    DaxUnsupported { path: PathBuf, detail: String },
    /// The file's size is not the size asked for.
    #[error(
        "pool {path}: file is {actual_bytes} bytes but {expected_bytes} bytes were asked for",
        path = path.display()
    )]
    SizeMismatch {
        path: PathBuf,
        expected_bytes: usize,
        actual_bytes: usize,
    },
    /// The options are inconsistent.
    #[error("invalid pool configuration: {0}")]
    InvalidConfig(String),
}

/// A persistent-memory pool. Always shared as `Arc<Pool>`.
///
/// Stores are visible to loads at once and durable only after the matching persist:
/// `write`/`write_u64`/CAS/FAA after `persist`, `nt_copy` after `drain` (or
/// `persist`), a NIC's `dma_write` after `dma_persist` (or `persist`). The only
/// failure-atomic unit is an aligned 8-byte store.
pub struct Pool {
    map: Arc<Mapping>,
    medium: Medium,
    path: Option<PathBuf>,
    media: Option<MediaModel>,
    crash: Option<CrashSim>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("medium", &self.medium)
            .field("path", &self.path)
            .field("len_bytes", &self.map.len_bytes())
            .field("media", &self.media.is_some())
            .field("crash", &self.crash)
            .finish()
    }
}

const ANONYMOUS: &str = "<anonymous>";

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PoolError + '_ {
    move |source| PoolError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn check_size(size_bytes: usize) -> Result<(), PoolError> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(CACHELINE_BYTES) {
        return Err(PoolError::InvalidConfig(format!(
            "pool size {size_bytes} bytes must be a non-zero multiple of {CACHELINE_BYTES}"
        )));
    }
    Ok(())
}

impl Pool {
    /// Creates (or truncates) the file at `path`, sizes it to `opts.size_bytes`
    /// (zero-filled) and maps it.
    pub fn create(path: &Path, opts: PoolOptions) -> Result<Arc<Pool>, PoolError> {
        check_size(opts.size_bytes)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(io_err(path))?;
        file.set_len(opts.size_bytes as u64).map_err(io_err(path))?;
        if opts.medium == Medium::Msync {
            file.sync_all().map_err(io_err(path))?;
        }
        Self::map_file(path, &file, opts.size_bytes, opts)
    }

    /// Opens the existing file at `path`. `opts.size_bytes` 0 takes the file's size;
    /// any other value must equal it.
    pub fn open(path: &Path, opts: PoolOptions) -> Result<Arc<Pool>, PoolError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        let file_bytes = file.metadata().map_err(io_err(path))?.len();
        let actual_bytes = usize::try_from(file_bytes).map_err(|_| {
            PoolError::InvalidConfig(format!("{}: file too large to map", path.display()))
        })?;
        if opts.size_bytes != 0 && opts.size_bytes != actual_bytes {
            return Err(PoolError::SizeMismatch {
                path: path.to_path_buf(),
                expected_bytes: opts.size_bytes,
                actual_bytes,
            });
        }
        check_size(actual_bytes)?;
        Self::map_file(path, &file, actual_bytes, opts)
    }

    /// An anonymous shared mapping of `size_bytes`, zero-filled. It behaves as
    /// `Emulated` whatever `opts.medium` says; `opts.size_bytes` is ignored.
    pub fn anonymous(size_bytes: usize, opts: PoolOptions) -> Result<Arc<Pool>, PoolError> {
        check_size(size_bytes)?;
        let map = Mapping::map_anonymous(size_bytes).map_err(io_err(Path::new(ANONYMOUS)))?;
        Self::assemble(map, Medium::Emulated, None, &opts)
    }

    /// An anonymous pool holding `image`, every byte durable (for recovery from a
    /// crash image).
    pub fn from_image(image: &[u8], opts: PoolOptions) -> Result<Arc<Pool>, PoolError> {
        check_size(image.len())?;
        let map = Mapping::map_anonymous(image.len()).map_err(io_err(Path::new(ANONYMOUS)))?;
        map.store(0, image);
        raw::release_fence();
        Self::assemble(map, Medium::Emulated, None, &opts)
    }

    fn map_file(
        path: &Path,
        file: &File,
        size_bytes: usize,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        let (map, medium) = match opts.medium {
            Medium::Dax => match Mapping::map_file(file, size_bytes, FileMapping::SharedSync) {
                Ok(map) => (map, Medium::Dax),
                Err(e) if is_dax_refusal(&e) => {
                    if !opts.dax_fallback {
                        return Err(PoolError::DaxUnsupported {
                            path: path.to_path_buf(),
                            detail: format!("mmap(MAP_SHARED_VALIDATE | MAP_SYNC) failed: {e}"),
                        });
                    }
                    let map = Mapping::map_file(file, size_bytes, FileMapping::Shared)
                        .map_err(io_err(path))?;
                    (map, Medium::Emulated)
                }
                Err(e) => return Err(io_err(path)(e)),
            },
            Medium::Emulated | Medium::Msync => {
                let map = Mapping::map_file(file, size_bytes, FileMapping::Shared)
                    .map_err(io_err(path))?;
                (map, opts.medium)
            }
        };
        Self::assemble(map, medium, Some(path.to_path_buf()), &opts)
    }

    fn assemble(
        map: Mapping,
        medium: Medium,
        path: Option<PathBuf>,
        opts: &PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        let media = opts.media_model.clone().map(MediaModel::new).transpose()?;
        let map = Arc::new(map);
        let crash = opts.crash_sim.then(|| CrashSim::new(Arc::clone(&map)));
        Ok(Arc::new(Pool {
            map,
            medium,
            path,
            media,
            crash,
        }))
    }

    /// The medium in effect (after any DAX fallback).
    pub fn medium(&self) -> Medium {
        self.medium
    }

    /// The file behind the pool, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Pool size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.map.len_bytes()
    }

    /// The media model, if attached.
    pub fn media(&self) -> Option<&MediaModel> {
        self.media.as_ref()
    }

    /// The crash simulator, if attached.
    pub fn crash(&self) -> Option<&CrashSim> {
        self.crash.as_ref()
    }

    /// Loads `out.len()` bytes at `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        raw::acquire_fence();
        self.map.load(offset, out);
    }

    /// 8-byte atomic load at an 8-byte aligned offset.
    pub fn read_u64(&self, offset: usize) -> u64 {
        self.map.word(offset).load(Ordering::Acquire)
    }

    /// Ordinary cached stores: visible at once, durable only after a `persist`
    /// covering them. Not counted by the media model until persisted.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.map.check(offset, data.len());
        self.tracked(offset, data.len(), WriteKind::Cached, || {
            self.map.store(offset, data)
        });
        raw::release_fence();
    }

    /// 8-byte atomic store at an 8-byte aligned offset: the medium's only
    /// failure-atomic unit. Durable only after a `persist` covering it.
    pub fn write_u64(&self, offset: usize, v: u64) {
        let word = self.map.word(offset);
        self.tracked(offset, 8, WriteKind::Cached, || {
            word.store(v, Ordering::Release)
        });
    }

    /// 8-byte compare-and-swap at an 8-byte aligned offset (a CPU store: durable
    /// only after `persist`); returns the old value.
    pub fn compare_swap_u64(&self, offset: usize, expect: u64, new: u64) -> u64 {
        let word = self.map.word(offset);
        self.tracked(offset, 8, WriteKind::Cached, || {
            match word.compare_exchange(expect, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(old) | Err(old) => old,
            }
        })
    }

    /// 8-byte fetch-and-add at an 8-byte aligned offset (a CPU store: durable only
    /// after `persist`); returns the old value.
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> u64 {
        let word = self.map.word(offset);
        self.tracked(offset, 8, WriteKind::Cached, || {
            word.fetch_add(add, Ordering::AcqRel)
        })
    }

    /// Makes `[offset, offset + len)` durable: `clwb` of every 64 B line + `sfence`
    /// (Dax, Emulated), or `msync` of the covering pages (Msync). Every line of the
    /// range is counted by the media model as a 64 B request.
    ///
    /// # Panics
    /// If `msync` fails: durability can no longer be promised, so the pool fails
    /// stop rather than acknowledge a write it may lose.
    pub fn persist(&self, offset: usize, len: usize) {
        self.map.check(offset, len);
        if let Some(crash) = &self.crash {
            crash.begin_persist();
        }
        match self.medium {
            Medium::Dax | Medium::Emulated => {
                self.map.flush_lines(offset, len);
                raw::sfence();
            }
            Medium::Msync => self.msync(offset, len),
        }
        if let Some(media) = &self.media {
            media.record_write(offset, len);
        }
        if let Some(crash) = &self.crash {
            crash.make_durable(offset, len, Durability::AllLines);
        }
    }

    /// Non-temporal stores: they bypass the CPU cache (the media model counts them
    /// at once) and are durable only after a `drain` covering them.
    pub fn nt_copy(&self, offset: usize, data: &[u8]) {
        self.map.check(offset, data.len());
        self.tracked(offset, data.len(), WriteKind::Streamed, || {
            self.map.nt_store(offset, data)
        });
        if let Some(media) = &self.media {
            media.record_write(offset, data.len());
        }
    }

    /// `sfence` (and `msync` for Msync): makes the non-temporal stores in
    /// `[offset, offset + len)` durable. Ordinary stores still need `persist`.
    pub fn drain(&self, offset: usize, len: usize) {
        self.map.check(offset, len);
        if let Some(crash) = &self.crash {
            crash.begin_persist();
        }
        raw::sfence();
        if self.medium == Medium::Msync {
            self.msync(offset, len);
        }
        if let Some(crash) = &self.crash {
            crash.make_durable(offset, len, Durability::StreamedLines);
        }
    }

    /// `nt_copy` then `drain` of the same range.
    pub fn nt_copy_persist(&self, offset: usize, data: &[u8]) {
        self.nt_copy(offset, data);
        self.drain(offset, data.len());
    }

    fn msync(&self, offset: usize, len: usize) {
        if let Err(e) = self.map.msync(offset, len) {
            panic!(
                "msync of pool {} offset {offset} len {len} failed: {e}; durability is lost",
                self.path
                    .as_deref()
                    .unwrap_or(Path::new(ANONYMOUS))
                    .display()
            );
        }
    }

    /// Runs a store under the crash simulator when it is on; directly otherwise.
    #[inline]
    fn tracked<R>(
        &self,
        offset: usize,
        len: usize,
        kind: WriteKind,
        store: impl FnOnce() -> R,
    ) -> R {
        match &self.crash {
            None => store(),
            Some(crash) => crash.on_write(offset, len, kind, store),
        }
    }
}

/// The benchmark baseline: `copy_nonoverlapping` into the mapping + `clwb` of every
/// line + `sfence`, through the same low-level functions as [`Pool::persist`] but
/// without any pool bookkeeping (no crash simulator, no media model). Other crates'
/// benchmarks compare their persistence path against this.
pub fn raw_store_persist(pool: &Pool, offset: usize, data: &[u8]) {
    raw::store_flush_fence(&pool.map, offset, data);
}

fn is_dax_refusal(e: &io::Error) -> bool {
    // EOPNOTSUPP: the file system does not support MAP_SYNC. EINVAL: a kernel too old
    // to know MAP_SHARED_VALIDATE. Unsupported: not Linux.
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
    ) || e.kind() == io::ErrorKind::Unsupported
}

impl RegionMemory for Pool {
    fn len_bytes(&self) -> usize {
        self.map.len_bytes()
    }

    /// A NIC's DMA write: it reaches the DIMMs as it lands (DDIO off), so the media
    /// model counts it now; durable after `dma_persist`.
    fn dma_write(&self, offset: usize, data: &[u8]) {
        self.map.check(offset, data.len());
        // A NIC with DDIO off writes to the memory controller, not the CPU cache:
        // non-temporal stores are the CPU's equivalent, in cost and in effect.
        self.tracked(offset, data.len(), WriteKind::Streamed, || {
            self.map.nt_store(offset, data)
        });
        raw::release_fence();
        if let Some(media) = &self.media {
            media.record_write(offset, data.len());
        }
    }

    fn dma_read(&self, offset: usize, out: &mut [u8]) {
        self.read(offset, out);
    }

    /// The bytes already reached the DIMMs (counted at `dma_write`), so this only
    /// makes them durable: the non-temporal stores drain (`sfence`), the crash
    /// simulator forgets them, and an Msync pool `msync`s the pages.
    fn dma_persist(&self, offset: usize, len: usize) {
        self.map.check(offset, len);
        if let Some(crash) = &self.crash {
            crash.begin_persist();
        }
        // The READ after a WRITE (or FLUSH) waits until the landed bytes are in the
        // persistence domain: here, until the non-temporal stores have drained.
        raw::sfence();
        if self.medium == Medium::Msync {
            self.msync(offset, len);
        }
        if let Some(crash) = &self.crash {
            crash.make_durable(offset, len, Durability::StreamedLines);
        }
    }

    fn dma_compare_swap(&self, offset: usize, expect: u64, swap: u64) -> u64 {
        let word = self.map.word(offset);
        let old = self.tracked(offset, 8, WriteKind::Streamed, || {
            match word.compare_exchange(expect, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(old) | Err(old) => old,
            }
        });
        if let Some(media) = &self.media {
            media.record_write(offset, 8);
        }
        old
    }

    fn dma_fetch_add(&self, offset: usize, add: u64) -> u64 {
        let word = self.map.word(offset);
        let old = self.tracked(offset, 8, WriteKind::Streamed, || {
            word.fetch_add(add, Ordering::AcqRel)
        });
        if let Some(media) = &self.media {
            media.record_write(offset, 8);
        }
        old
    }

    /// With the crash simulator, applies `policy` to the unpersisted lines. Without
    /// it this is a no-op: an emulated pool without the simulator models ADR after
    /// all data drained, i.e. a power failure that loses nothing that was written.
    fn power_fail(&self, policy: PowerFailure) {
        if let Some(crash) = &self.crash {
            crash.power_fail(policy);
        }
    }
}
