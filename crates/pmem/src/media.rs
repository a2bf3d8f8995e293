//! A model of Optane-like PM media that counts request bytes and media bytes, and so
//! gives device-level write amplification (DLWA), which no counter on this machine
//! can give.
//!
//! # Policy
//! - A write request reaching the DIMMs (a flushed cache line, a non-temporal store,
//!   a NIC's DMA write with DDIO off) is split into 64 B cache lines. A partial cache
//!   line counts as a whole 64 B request, because the memory controller writes whole
//!   lines. `request_bytes += 64` per cache line.
//! - The line belongs to XPLine `offset / xpline_bytes` on DIMM
//!   `(offset / interleave_bytes) % dimm_count`.
//! - Each DIMM has a write-combining buffer (the XPBuffer) of
//!   `wc_buffer_bytes_per_dimm / xpline_bytes` XPLines, organised as sets of
//!   `wc_ways` ways with LRU replacement inside a set. The set of an XPLine is a hash
//!   of its index within its DIMM,
//!   `local_line = (offset / interleave_bytes / dimm_count) * (interleave_bytes /
//!   xpline_bytes) + (offset % interleave_bytes) / xpline_bytes`,
//!   taken modulo the number of sets ([`set_of`]). Hashing matters: with a plain
//!   modulo, logs that start at aligned addresses (1 MiB apart, say) put every
//!   stream's current XPLine in the same set at the same moment, an artefact of
//!   alignment rather than of combining capacity.
//! - A hit marks the XPLine most recently used. A miss in a full set evicts the least
//!   recently used XPLine, which costs a whole XPLine of media write
//!   (`media_bytes += xpline_bytes`) whether it was written fully or partially (a
//!   partial XPLine is a read-modify-write on the medium).
//! - [`MediaModel::flush_buffers`] writes every buffered XPLine to the media and
//!   empties the buffers; call it at the end of an experiment.
//!
//! The default (4-way LRU over hashed sets, 16 KiB per DIMM, 3 DIMMs, 4 KiB interleave) and how it was
//! calibrated against the paper's Figure 2 are recorded in `docs/media-model.md`; it
//! is held fixed for every experiment and never tuned per result.
//!
//! # Timing
//! With [`MediaModelConfig::timing`] set, each DIMM keeps a virtual "busy until" time;
//! every XPLine written to media advances it by `xpline_bytes / bandwidth`, and the
//! thread whose write caused media writes waits until the DIMM has caught up (less a
//! slack: the time to write back one buffer's worth, at least 20 µs — see
//! [`timing_slack_ns`]), so that write amplification costs throughput as it does on
//! Optane.
//!
//! # Concurrency
//! One `parking_lot::Mutex` per DIMM guards that DIMM's buffer and counters; there is
//! no global lock. [`MediaModel::stats`] sums the DIMMs one at a time, so a snapshot
//! taken while writers run is a sum of per-DIMM snapshots, not one instant.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rowankv_types::cpu_model;

use crate::raw::CACHELINE_BYTES;
use crate::PoolError;

/// Least time a writer may run ahead of its DIMM's virtual clock.
const TIMING_SLACK_NS: u64 = 20_000;

/// How far a writer may run ahead of its DIMM's virtual clock: the time the DIMM
/// takes to write back one write-combining buffer's worth of lines (its write
/// queue absorbs that much before a writer stalls), and at least
/// `TIMING_SLACK_NS`. At Optane's ~2 GB/s that is the 20 µs floor; at a bandwidth
/// scaled down for an emulated cluster it grows in proportion, so a single
/// write-back never stalls a writer that is within the bandwidth on average.
pub fn timing_slack_ns(config: &MediaModelConfig, timing: &MediaTiming) -> u64 {
    let buffer_ns = config.wc_buffer_bytes_per_dimm as u64 * 1_000_000_000
        / timing.media_write_bytes_per_sec_per_dimm;
    buffer_ns.max(TIMING_SLACK_NS)
}
/// Spins before a waiting thread starts yielding its core.
const TIMING_SPINS_BEFORE_YIELD: u32 = 1_000;

/// Geometry of the modelled DIMMs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaModelConfig {
    /// Internal write unit of the medium (Optane XPLine: 256 B).
    pub xpline_bytes: usize,
    /// Write-combining buffer per DIMM (Optane XPBuffer: about 16 KiB).
    pub wc_buffer_bytes_per_dimm: usize,
    /// Associativity of the write-combining buffer (ways per set).
    pub wc_ways: usize,
    /// DIMMs the pool is interleaved over.
    pub dimm_count: usize,
    /// Interleave granularity across DIMMs.
    pub interleave_bytes: usize,
    /// Media bandwidth model; `None` counts bytes only and never slows a writer.
    pub timing: Option<MediaTiming>,
}

impl Default for MediaModelConfig {
    fn default() -> Self {
        MediaModelConfig {
            xpline_bytes: 256,
            wc_buffer_bytes_per_dimm: 16 * 1024,
            wc_ways: 4,
            dimm_count: 3,
            interleave_bytes: 4096,
            timing: None,
        }
    }
}

impl MediaModelConfig {
    /// XPLines held by one DIMM's write-combining buffer.
    pub fn wc_lines_per_dimm(&self) -> usize {
        self.wc_buffer_bytes_per_dimm / self.xpline_bytes
    }

    /// Sets per DIMM's write-combining buffer.
    pub fn wc_sets_per_dimm(&self) -> usize {
        self.wc_lines_per_dimm() / self.wc_ways
    }

    /// Checks the relations between the sizes.
    pub fn validate(&self) -> Result<(), PoolError> {
        let bad = |why: String| Err(PoolError::InvalidConfig(format!("media model: {why}")));
        if self.xpline_bytes == 0 || !self.xpline_bytes.is_multiple_of(CACHELINE_BYTES) {
            return bad(format!(
                "xpline_bytes {} must be a non-zero multiple of {CACHELINE_BYTES}",
                self.xpline_bytes
            ));
        }
        if self.interleave_bytes == 0 || !self.interleave_bytes.is_multiple_of(self.xpline_bytes) {
            return bad(format!(
                "interleave_bytes {} must be a non-zero multiple of xpline_bytes {}",
                self.interleave_bytes, self.xpline_bytes
            ));
        }
        if self.dimm_count == 0 {
            return bad("dimm_count must be at least 1".into());
        }
        if self.wc_buffer_bytes_per_dimm == 0
            || !self
                .wc_buffer_bytes_per_dimm
                .is_multiple_of(self.xpline_bytes)
        {
            return bad(format!(
                "wc_buffer_bytes_per_dimm {} must be a non-zero multiple of xpline_bytes {}",
                self.wc_buffer_bytes_per_dimm, self.xpline_bytes
            ));
        }
        if self.wc_ways == 0 || !self.wc_lines_per_dimm().is_multiple_of(self.wc_ways) {
            return bad(format!(
                "wc_ways {} must be non-zero and divide the {} lines of a buffer",
                self.wc_ways,
                self.wc_lines_per_dimm()
            ));
        }
        if let Some(t) = &self.timing {
            if t.media_write_bytes_per_sec_per_dimm == 0 {
                return bad("timing.media_write_bytes_per_sec_per_dimm must be non-zero".into());
            }
        }
        Ok(())
    }
}

/// Media bandwidth, for the timing mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaTiming {
    /// Bytes per second one DIMM writes to its media.
    pub media_write_bytes_per_sec_per_dimm: u64,
}

impl Default for MediaTiming {
    fn default() -> Self {
        MediaTiming {
            media_write_bytes_per_sec_per_dimm: 2_000_000_000,
        }
    }
}

/// Counters of the media model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MediaStats {
    /// Bytes requested of the DIMMs (64 per cache line written).
    pub request_bytes: u64,
    /// Bytes written to the media (one XPLine per buffer eviction or flush).
    pub media_bytes: u64,
}

impl MediaStats {
    /// Device-level write amplification: media bytes / request bytes (1.0 when
    /// nothing was requested).
    pub fn dlwa(&self) -> f64 {
        if self.request_bytes == 0 {
            1.0
        } else {
            self.media_bytes as f64 / self.request_bytes as f64
        }
    }

    /// The counts since `earlier` (a snapshot of the same model taken before).
    pub fn delta(&self, earlier: &MediaStats) -> MediaStats {
        MediaStats {
            request_bytes: self.request_bytes.saturating_sub(earlier.request_bytes),
            media_bytes: self.media_bytes.saturating_sub(earlier.media_bytes),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Way {
    xpline: u64,
    last_use: u64,
}

#[derive(Debug)]
struct Dimm {
    /// `sets[s]` holds at most `wc_ways` ways.
    sets: Vec<Vec<Way>>,
    use_clock: u64,
    request_bytes: u64,
    media_bytes: u64,
    busy_until_ns: u64,
    /// The same on modelled time (a cluster whose roles are charged to
    /// modelled cores: `rowankv_types::cpu_model`), kept apart from the real
    /// clock's.
    modelled_busy_until_ns: u64,
}

impl Dimm {
    fn new(sets: usize, ways: usize) -> Dimm {
        Dimm {
            sets: (0..sets).map(|_| Vec::with_capacity(ways)).collect(),
            use_clock: 0,
            request_bytes: 0,
            media_bytes: 0,
            busy_until_ns: 0,
            modelled_busy_until_ns: 0,
        }
    }

    /// One 64 B request to `xpline` in `set`; returns whether an XPLine was written
    /// to media.
    fn request(&mut self, set: usize, xpline: u64, ways: usize, xpline_bytes: usize) -> bool {
        self.request_bytes += CACHELINE_BYTES as u64;
        self.use_clock += 1;
        let now = self.use_clock;
        let set = &mut self.sets[set];
        if let Some(way) = set.iter_mut().find(|w| w.xpline == xpline) {
            way.last_use = now;
            return false;
        }
        let mut evicted = false;
        if set.len() == ways {
            let lru = set
                .iter()
                .enumerate()
                .min_by_key(|(_, w)| w.last_use)
                .map(|(i, _)| i)
                .expect("a full set is not empty");
            set.swap_remove(lru);
            self.media_bytes += xpline_bytes as u64;
            evicted = true;
        }
        set.push(Way {
            xpline,
            last_use: now,
        });
        evicted
    }

    fn flush(&mut self, xpline_bytes: usize) {
        for set in &mut self.sets {
            self.media_bytes += (set.len() * xpline_bytes) as u64;
            set.clear();
        }
    }
}

/// The write-combining set of an XPLine with index `local_xpline` within its DIMM:
/// a Fibonacci hash, so that aligned streams spread over the sets.
pub fn set_of(local_xpline: u64, sets: usize) -> usize {
    let h = local_xpline.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h >> 32) % sets as u64) as usize
}

/// The Optane-like media model. See the module documentation for the policy.
#[derive(Debug)]
pub struct MediaModel {
    config: MediaModelConfig,
    sets_per_dimm: usize,
    dimms: Vec<Mutex<Dimm>>,
}

impl MediaModel {
    /// A model with empty buffers and zero counters.
    pub fn new(config: MediaModelConfig) -> Result<MediaModel, PoolError> {
        config.validate()?;
        let sets_per_dimm = config.wc_sets_per_dimm();
        let dimms = (0..config.dimm_count)
            .map(|_| Mutex::new(Dimm::new(sets_per_dimm, config.wc_ways)))
            .collect();
        Ok(MediaModel {
            config,
            sets_per_dimm,
            dimms,
        })
    }

    /// The geometry this model was built with.
    pub fn config(&self) -> &MediaModelConfig {
        &self.config
    }

    /// A write request of `len` bytes at `offset` reaching the DIMMs. Waits in timing
    /// mode if it caused media writes on a DIMM that is behind.
    pub fn record_write(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        let c = &self.config;
        let first_line = offset / CACHELINE_BYTES;
        let end_line = (offset + len).div_ceil(CACHELINE_BYTES);
        let lines_per_chunk = c.interleave_bytes / CACHELINE_BYTES;
        let xplines_per_chunk = c.interleave_bytes / c.xpline_bytes;
        let mut wait_until_ns = 0u64;
        let mut slack_ns = 0u64;
        // Inside a modelled step the write is placed on modelled time and a
        // wait becomes a stall charged to the step, not a spin.
        let modelled_now = c.timing.as_ref().and(cpu_model::modelled_now_ns());
        let mut line = first_line;
        // One interleave chunk lives on one DIMM: take its lock once per chunk.
        while line < end_line {
            let chunk = line / lines_per_chunk;
            let chunk_end_line = ((chunk + 1) * lines_per_chunk).min(end_line);
            let dimm_index = chunk % c.dimm_count;
            let chunk_local = chunk / c.dimm_count;
            let mut dimm = self.dimms[dimm_index].lock();
            let mut media_writes = 0u64;
            while line < chunk_end_line {
                let line_offset = line * CACHELINE_BYTES;
                let xpline = (line_offset / c.xpline_bytes) as u64;
                let local_xpline = chunk_local * xplines_per_chunk
                    + (line_offset % c.interleave_bytes) / c.xpline_bytes;
                let set = set_of(local_xpline as u64, self.sets_per_dimm);
                if dimm.request(set, xpline, c.wc_ways, c.xpline_bytes) {
                    media_writes += 1;
                }
                line += 1;
            }
            if media_writes > 0 {
                if let Some(t) = &c.timing {
                    let cost_ns = media_writes * c.xpline_bytes as u64 * 1_000_000_000
                        / t.media_write_bytes_per_sec_per_dimm;
                    let busy = match modelled_now {
                        Some(now) => {
                            dimm.modelled_busy_until_ns =
                                dimm.modelled_busy_until_ns.max(now) + cost_ns;
                            dimm.modelled_busy_until_ns
                        }
                        None => {
                            dimm.busy_until_ns = dimm.busy_until_ns.max(now_ns()) + cost_ns;
                            dimm.busy_until_ns
                        }
                    };
                    wait_until_ns = wait_until_ns.max(busy);
                    slack_ns = timing_slack_ns(c, t);
                }
            }
        }
        if wait_until_ns > 0 {
            match modelled_now {
                Some(now) => cpu_model::add_media_stall_ns(
                    wait_until_ns.saturating_sub(slack_ns).saturating_sub(now),
                ),
                None => wait_for(wait_until_ns.saturating_sub(slack_ns)),
            }
        }
    }

    /// Writes every buffered XPLine to media and empties the buffers.
    pub fn flush_buffers(&self) {
        for dimm in &self.dimms {
            dimm.lock().flush(self.config.xpline_bytes);
        }
    }

    /// The counters summed over the DIMMs.
    pub fn stats(&self) -> MediaStats {
        self.dimms.iter().fold(MediaStats::default(), |acc, dimm| {
            let d = dimm.lock();
            MediaStats {
                request_bytes: acc.request_bytes + d.request_bytes,
                media_bytes: acc.media_bytes + d.media_bytes,
            }
        })
    }

    /// Zeroes the counters and empties the buffers (without counting media writes).
    pub fn reset(&self) {
        for dimm in &self.dimms {
            *dimm.lock() = Dimm::new(self.sets_per_dimm, self.config.wc_ways);
        }
    }
}

fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn wait_for(deadline_ns: u64) {
    let mut spins = 0u32;
    while now_ns() < deadline_ns {
        if spins < TIMING_SPINS_BEFORE_YIELD {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// How long the timing mode would make a writer wait for `media_bytes` on one idle
/// DIMM (for documentation and tests).
pub fn media_write_duration(timing: &MediaTiming, media_bytes: u64) -> Duration {
    Duration::from_nanos(media_bytes * 1_000_000_000 / timing.media_write_bytes_per_sec_per_dimm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn model() -> MediaModel {
        MediaModel::new(MediaModelConfig::default()).unwrap()
    }

    #[test]
    fn default_geometry_is_64_lines_in_8_sets() {
        let c = MediaModelConfig::default();
        c.validate().unwrap();
        assert_eq!(c.wc_lines_per_dimm(), 64);
        assert_eq!(c.wc_sets_per_dimm(), 16);
    }

    #[test]
    fn sequential_stream_has_no_amplification() {
        let m = model();
        for i in 0..100_000 {
            m.record_write(i * 64, 64);
        }
        m.flush_buffers();
        let s = m.stats();
        assert_eq!(s.request_bytes, 100_000 * 64);
        assert_eq!(s.dlwa(), 1.0);
    }

    #[test]
    fn many_round_robin_streams_thrash_to_four() {
        let m = model();
        // 1000 streams: about 21 per set of every DIMM, far beyond its 4 ways.
        let streams = 1000usize;
        let log_bytes = 1 << 20;
        for step in 0..400usize {
            for s in 0..streams {
                m.record_write(s * log_bytes + step * 64, 64);
            }
        }
        m.flush_buffers();
        let dlwa = m.stats().dlwa();
        assert!((3.9..=4.0).contains(&dlwa), "dlwa {dlwa}");
    }

    /// Offsets (on DIMM 0, default geometry) of `n` distinct XPLines that share the
    /// write-combining set of DIMM 0's local line 0.
    fn same_set_offsets(n: usize) -> Vec<usize> {
        let c = MediaModelConfig::default();
        let sets = c.wc_sets_per_dimm();
        let per_chunk = c.interleave_bytes / c.xpline_bytes;
        let target = set_of(0, sets);
        (0u64..)
            .filter(|&l| set_of(l, sets) == target)
            .take(n)
            .map(|l| {
                let l = l as usize;
                (l / per_chunk) * c.dimm_count * c.interleave_bytes
                    + (l % per_chunk) * c.xpline_bytes
            })
            .collect()
    }

    #[test]
    fn evicted_partial_xpline_costs_a_whole_xpline() {
        let m = model();
        let ways = MediaModelConfig::default().wc_ways;
        // One 64 B write to an XPLine, then `ways` other XPLines of the same set push
        // it out.
        let offsets = same_set_offsets(ways + 1);
        assert_eq!(offsets[0], 0);
        for &o in &offsets {
            m.record_write(o, 64);
        }
        let s = m.stats();
        assert_eq!(s.request_bytes, (ways as u64 + 1) * 64);
        assert_eq!(
            s.media_bytes, 256,
            "the LRU line, written 64 B, costs 256 B"
        );
    }

    #[test]
    fn four_round_robin_sequential_streams_combine_fully() {
        // With 4 ways, a stream's current XPLine is never the LRU of its set while
        // fewer than 4 other streams write between its writes.
        let m = model();
        for i in 0..20_000usize {
            for t in 0..4usize {
                m.record_write((t << 24) + i * 64, 64);
            }
        }
        m.flush_buffers();
        let s = m.stats();
        assert_eq!(s.request_bytes, 4 * 20_000 * 64);
        assert_eq!(s.media_bytes, s.request_bytes);
    }

    #[test]
    fn partial_cacheline_counts_as_whole_request() {
        let m = model();
        m.record_write(10, 1);
        assert_eq!(m.stats().request_bytes, 64);
        m.record_write(60, 8); // straddles two lines
        assert_eq!(m.stats().request_bytes, 64 * 3);
        m.record_write(0, 0);
        assert_eq!(m.stats().request_bytes, 64 * 3);
    }

    #[test]
    fn writes_split_across_dimms() {
        let m = model();
        m.record_write(4096 - 64, 128); // last line of DIMM 0's chunk, first of DIMM 1's
        let per_dimm: Vec<u64> = m.dimms.iter().map(|d| d.lock().request_bytes).collect();
        assert_eq!(per_dimm, vec![64, 64, 0]);
    }

    #[test]
    fn stats_sum_across_threads_and_reset() {
        let m = Arc::new(model());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    for i in 0..10_000usize {
                        m.record_write((t << 24) + i * 64, 64);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let before = m.stats();
        assert_eq!(before.request_bytes, 4 * 10_000 * 64);
        m.flush_buffers();
        let after = m.stats();
        // How well concurrent streams combine depends on the interleaving; the
        // counters must still be consistent: whole XPLines, at least every byte.
        assert!(after.media_bytes >= after.request_bytes);
        assert_eq!(after.media_bytes % 256, 0);
        assert_eq!(after.delta(&before).request_bytes, 0);
        m.reset();
        assert_eq!(m.stats(), MediaStats::default());
        assert_eq!(MediaStats::default().dlwa(), 1.0);
    }

    #[test]
    fn invalid_geometry_is_refused() {
        let c = MediaModelConfig {
            wc_ways: 7,
            ..MediaModelConfig::default()
        };
        assert!(matches!(c.validate(), Err(PoolError::InvalidConfig(_))));
        let c = MediaModelConfig {
            xpline_bytes: 100,
            ..MediaModelConfig::default()
        };
        assert!(MediaModel::new(c).is_err());
    }

    #[test]
    fn timing_mode_slows_amplified_writes() {
        let timing = MediaTiming {
            media_write_bytes_per_sec_per_dimm: 256_000_000, // 1 µs per XPLine
        };
        let m = MediaModel::new(MediaModelConfig {
            timing: Some(timing.clone()),
            ..MediaModelConfig::default()
        })
        .unwrap();
        // Thrash one set of one DIMM: every write after the first `ways` evicts.
        let evictions = 200u64;
        let ways = MediaModelConfig::default().wc_ways;
        let offsets = same_set_offsets(ways + evictions as usize);
        let start = Instant::now();
        for &offset in &offsets {
            m.record_write(offset, 64);
        }
        assert_eq!(m.stats().media_bytes, evictions * 256);
        // The writer may run ahead only by the slack.
        let slack = timing_slack_ns(&MediaModelConfig::default(), &timing);
        let floor = media_write_duration(&timing, evictions * 256) - Duration::from_nanos(slack);
        assert!(
            start.elapsed() >= floor,
            "elapsed {:?} < {floor:?}",
            start.elapsed()
        );
    }

    /// Inside a modelled step a DIMM that is behind stalls the step on
    /// modelled time: the wait is charged, not spun.
    #[test]
    fn on_modelled_time_a_wait_is_a_charged_stall() {
        let timing = MediaTiming {
            media_write_bytes_per_sec_per_dimm: 256_000, // 1 ms per XPLine
        };
        let m = MediaModel::new(MediaModelConfig {
            timing: Some(timing.clone()),
            ..MediaModelConfig::default()
        })
        .unwrap();
        let evictions = 200u64;
        let ways = MediaModelConfig::default().wc_ways;
        let offsets = same_set_offsets(ways + evictions as usize);
        let start = Instant::now();
        cpu_model::begin_step(5_000);
        for &offset in &offsets {
            m.record_write(offset, 64);
        }
        let charge = cpu_model::end_step();
        // 200 ms of media writes on modelled time, in far less real time.
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        let slack = timing_slack_ns(&MediaModelConfig::default(), &timing);
        let floor = media_write_duration(&timing, evictions * 256).as_nanos() as u64 - slack;
        // The step's own time runs on the modelled clock too.
        assert!(
            charge.stall_ns + charge.wall_ns >= floor,
            "{charge:?} < {floor}"
        );
        assert!(charge.stall_ns <= floor + 2_000_000, "{charge:?}");
        // The real clock's DIMM was not touched: a write outside a step does
        // not wait for the modelled backlog.
        let start = Instant::now();
        m.record_write(offsets[0] + (1 << 20), 64);
        assert!(start.elapsed() < Duration::from_millis(50));
    }
}
