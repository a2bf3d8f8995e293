//! The DLWA experiment (seed 000 §2.4 Figure 2 and §6.2 Figure 8).
//!
//! N remote write streams issue 64 B or 128 B persisted writes to one receiver whose
//! pool carries the media model, either
//! - `write`: each stream appends with one-sided WRITE (+ persistence) to a log of its
//!   own in the receiver's PM — WRITE-enabled replication, one PM stream per sender;
//! - `rowan`: each stream SENDs (+ persistence) into the receiver's Rowan instance,
//!   whose NIC lands all of them in one sequential log;
//!
//! optionally with local sequential PM writers on the receiver (the paper's 18 cores
//! doing 128 B non-temporal appends; Figure 2(c)(d), Figure 8(c)(d)).
//!
//! Schedule. Every stream has one write in flight, as the paper's senders do (WRITE
//! then READ, wait, repeat). Streams are driven by `driver_threads` OS threads (one by
//! default: then the seed alone fixes the order in which writes reach the media
//! model, and DLWA is reproducible whatever the machine's load; with more threads
//! the OS's scheduling mixes their orders); each thread runs its streams in a seeded
//! virtual-time order: a stream's next write is
//! issued one round period after its last, plus exponential jitter of mean
//! `jitter` periods (independent senders drift apart). This schedule is part of the
//! media model's calibration (`docs/media-model.md`) and is held fixed.
//!
//! Measured: request and media bytes from the media model (everything that reached the
//! DIMMs during the run, local writes included, as the DIMM counters of the paper),
//! DLWA = media / request, and the remote writes completed per second.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp1};
use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, Fabric, LoopbackCq, LoopbackFabric, LoopbackNic,
    LoopbackQp, Nic, Op, QueuePair, RegionMemory, RemoteRegion, WcStatus, WorkRequest,
};
use rowankv_pmem::{MediaModelConfig, MediaStats, MediaTiming, Medium, Pool, PoolOptions};
use rowankv_rowan::{ReceiverConfig, RowanReceiver, RowanSender};
use rowankv_types::{Clock, NodeId, SystemClock};
use serde::Serialize;

/// How remote writes reach the receiver's PM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One-sided WRITE into a remote log per sender.
    Write,
    /// SEND into the receiver's Rowan instance.
    Rowan,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Write => "write",
            Mode::Rowan => "rowan",
        })
    }
}

/// The experiment's parameters.
#[derive(Clone, Debug)]
pub struct DlwaOptions {
    pub sender_counts: Vec<usize>,
    pub write_sizes_bytes: Vec<usize>,
    pub modes: Vec<Mode>,
    /// Local writer counts to run (the paper: 0 and 18).
    pub local_writer_counts: Vec<usize>,
    /// Remote writes measured per point.
    pub ops_per_point: usize,
    /// Remote writes issued before the measurement starts, so that DLWA is measured
    /// in steady state (the buffers full, the streams' phases mixed).
    pub warmup_ops: usize,
    pub driver_threads: usize,
    pub jitter: f64,
    pub seed: u64,
    pub media: MediaModelConfig,
    /// Directory for the receiver's pool file (tmpfs for the `emulated` medium).
    pub pool_dir: PathBuf,
    /// Bytes of each per-sender log (`write` mode) and local writer's log.
    pub log_bytes: usize,
    /// Size of one Rowan receive buffer (b-log segment).
    pub rowan_buffer_bytes: usize,
    /// Sender nodes the streams are spread over (the paper used four).
    pub sender_nodes: usize,
}

impl DlwaOptions {
    /// The paper's sweep.
    pub fn full() -> Self {
        DlwaOptions {
            sender_counts: vec![1, 18, 36, 72, 90, 108, 144],
            write_sizes_bytes: vec![64, 128],
            modes: vec![Mode::Write, Mode::Rowan],
            local_writer_counts: vec![0, 18],
            ops_per_point: 1_000_000,
            warmup_ops: 500_000,
            driver_threads: 1,
            jitter: 0.5,
            seed: 42,
            media: MediaModelConfig::default(),
            pool_dir: default_pool_dir(),
            log_bytes: 1 << 20,
            rowan_buffer_bytes: 4 << 20,
            sender_nodes: 4,
        }
    }

    /// Same sweep, fewer operations: seconds, not minutes.
    pub fn quick() -> Self {
        DlwaOptions {
            ops_per_point: 100_000,
            warmup_ops: 50_000,
            ..Self::full()
        }
    }
}

/// `/dev/shm` where it exists (tmpfs: the `emulated` medium), else the temp dir.
pub fn default_pool_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct DlwaPoint {
    pub mode: Mode,
    pub write_size_bytes: usize,
    pub senders: usize,
    pub local_writers: bool,
    pub local_writer_count: usize,
    pub dlwa: f64,
    pub ops_per_sec: f64,
    pub local_ops_per_sec: f64,
    pub request_bytes: u64,
    pub media_bytes: u64,
    pub remote_ops: u64,
    pub local_ops: u64,
    /// True when the media model's timing mode charged media bytes against an
    /// emulated media bandwidth (throughputs are then not raw loopback rates).
    pub media_timing: bool,
    /// That bandwidth per DIMM when `media_timing` is on.
    pub media_write_bytes_per_sec_per_dimm: Option<u64>,
}

/// Errors of the experiment (setup failures; a failed write is a bug and panics).
#[derive(Debug, thiserror::Error)]
pub enum DlwaError {
    #[error("pool: {0}")]
    Pool(#[from] rowankv_pmem::PoolError),
    #[error("fabric: {0}")]
    Fabric(#[from] rowankv_fabric::FabricError),
    #[error("rowan: {0}")]
    Rowan(#[from] rowankv_rowan::RowanError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid options: {0}")]
    Invalid(String),
}

/// Run every point of the sweep, calling `progress` after each.
pub fn run(
    opts: &DlwaOptions,
    mut progress: impl FnMut(&DlwaPoint),
) -> Result<Vec<DlwaPoint>, DlwaError> {
    let mut points = Vec::new();
    for &local in &opts.local_writer_counts {
        for &size in &opts.write_sizes_bytes {
            for &mode in &opts.modes {
                for &n in &opts.sender_counts {
                    let p = run_point(opts, mode, size, n, local)?;
                    progress(&p);
                    points.push(p);
                }
            }
        }
    }
    Ok(points)
}

/// A write stream as its driver sees it.
struct Stream {
    kind: StreamKind,
    /// Bytes written so far (position in its log).
    written: usize,
    seq: u64,
}

enum StreamKind {
    /// One-sided WRITE into a log of its own at the receiver.
    Write {
        qp: LoopbackQp,
        cq: LoopbackCq,
        log: RemoteRegion,
        log_offset: u64,
    },
    /// SEND into the receiver's Rowan instance.
    Rowan {
        sender: RowanSender<LoopbackQp>,
        cq: LoopbackCq,
    },
    Local {
        offset: usize,
    },
}

/// Everything one measured point needs, torn down at its end.
struct Rig {
    pool: Arc<Pool>,
    receiver: Option<Arc<Mutex<RowanReceiver<LoopbackNic>>>>,
    streams: Vec<Stream>,
    /// Keeps receiver-side queue pairs (write mode) alive.
    _targets: Vec<LoopbackQp>,
    /// The network itself: queue pairs hold it only weakly.
    _fabric: LoopbackFabric,
    _dir: tempfile::TempDir,
}

fn check(opts: &DlwaOptions, size: usize) -> Result<(), DlwaError> {
    if size == 0 || !size.is_multiple_of(64) || size > 4096 {
        return Err(DlwaError::Invalid(format!(
            "write size {size} B: must be a multiple of 64 B up to 4 KiB"
        )));
    }
    if opts.driver_threads == 0 || opts.sender_nodes == 0 || opts.ops_per_point == 0 {
        return Err(DlwaError::Invalid(
            "driver_threads, sender_nodes and ops_per_point must be positive".into(),
        ));
    }
    opts.media
        .validate()
        .map_err(|e| DlwaError::Invalid(e.to_string()))?;
    Ok(())
}

fn build(opts: &DlwaOptions, mode: Mode, senders: usize, locals: usize) -> Result<Rig, DlwaError> {
    let fabric = LoopbackFabric::new();
    let receiver_nic = fabric.attach(NodeId(0))?;
    let sender_nics: Vec<LoopbackNic> = (1..=opts.sender_nodes)
        .map(|i| fabric.attach(NodeId(i as u32)))
        .collect::<Result<_, _>>()?;

    // Pool layout: [remote area][local writers' logs].
    let rowan_buffers = 16usize;
    let remote_bytes = match mode {
        Mode::Write => senders * opts.log_bytes,
        Mode::Rowan => rowan_buffers * opts.rowan_buffer_bytes,
    };
    let pool_bytes = remote_bytes + locals.max(1) * opts.log_bytes;
    let dir = tempfile::tempdir_in(&opts.pool_dir)?;
    let pool = Pool::create(
        &dir.path().join("receiver.pool"),
        PoolOptions {
            medium: Medium::Emulated,
            size_bytes: pool_bytes,
            dax_fallback: false,
            media_model: Some(opts.media.clone()),
            crash_sim: false,
        },
    )?;
    let memory: Arc<dyn RegionMemory> = pool.clone();
    let remote_mr = receiver_nic.register(memory, 0, remote_bytes, Access::REMOTE_WRITE)?;

    // One completion queue per (driver, sender node): a driver polls only its own.
    let cqs: Vec<Vec<LoopbackCq>> = (0..opts.driver_threads)
        .map(|_| {
            sender_nics
                .iter()
                .map(|n| n.create_cq(CqKind::Bounded { capacity: 1024 }))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let target_cq = receiver_nic.create_cq(CqKind::Ring { capacity: 4096 })?;

    let mut receiver = match mode {
        Mode::Rowan => {
            let mut r = RowanReceiver::new(
                receiver_nic.clone(),
                remote_mr.clone(),
                ReceiverConfig {
                    buffer_bytes: opts.rowan_buffer_bytes,
                    posted_max: rowan_buffers,
                    ..ReceiverConfig::default()
                },
            )?;
            let half: Vec<usize> = (0..rowan_buffers / 2)
                .map(|i| i * opts.rowan_buffer_bytes)
                .collect();
            r.post(&half)?;
            Some(r)
        }
        Mode::Write => None,
    };

    let mut streams = Vec::with_capacity(senders + locals);
    let mut targets = Vec::new();
    for s in 0..senders {
        let node = s % opts.sender_nodes;
        let cq = cqs[s % opts.driver_threads][node].clone();
        let qp = sender_nics[node].create_qp(&cq, &cq, None, 64)?;
        let kind = match receiver.as_mut() {
            Some(r) => {
                let addr = r.accept(qp.addr())?;
                qp.connect(addr)?;
                StreamKind::Rowan {
                    sender: RowanSender::new(qp, 4096),
                    cq,
                }
            }
            None => {
                let target = receiver_nic.create_qp(&target_cq, &target_cq, None, 16)?;
                target.connect(qp.addr())?;
                qp.connect(target.addr())?;
                targets.push(target);
                StreamKind::Write {
                    qp,
                    cq,
                    log: remote_mr.remote(),
                    log_offset: (s * opts.log_bytes) as u64,
                }
            }
        };
        streams.push(Stream {
            kind,
            written: 0,
            seq: 0,
        });
    }
    for l in 0..locals {
        streams.push(Stream {
            kind: StreamKind::Local {
                offset: remote_bytes + l * opts.log_bytes,
            },
            written: 0,
            seq: 0,
        });
    }
    // The setup's own writes (zeroed buffer headers) are not part of the measurement.
    let media = pool.media().expect("media model enabled");
    media.reset();
    Ok(Rig {
        pool,
        receiver: receiver.map(|r| Arc::new(Mutex::new(r))),
        streams,
        _targets: targets,
        _fabric: fabric,
        _dir: dir,
    })
}

/// Measure one point.
pub fn run_point(
    opts: &DlwaOptions,
    mode: Mode,
    size: usize,
    senders: usize,
    locals: usize,
) -> Result<DlwaPoint, DlwaError> {
    check(opts, size)?;
    let rig = build(opts, mode, senders, locals)?;
    let clock = SystemClock::new();
    let drivers = opts.driver_threads;
    // Partition streams over drivers: remote stream s and local writer l to s % D.
    let mut parts: Vec<Vec<Stream>> = (0..drivers).map(|_| Vec::new()).collect();
    for (i, s) in rig.streams.into_iter().enumerate() {
        let d = if i < senders {
            i % drivers
        } else {
            (i - senders) % drivers
        };
        parts[d].push(s);
    }
    let ops_each = opts.ops_per_point.div_ceil(drivers);
    let warmup_each = opts.warmup_ops.div_ceil(drivers);
    let media = rig.pool.media().expect("media model enabled");
    let barrier = Barrier::new(drivers);
    let measured_from: Mutex<Option<(Instant, MediaStats)>> = Mutex::new(None);
    let (barrier, measured_from) = (&barrier, &measured_from);
    let results: Vec<(u64, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(d, streams)| {
                let receiver = rig.receiver.clone();
                let pool = rig.pool.clone();
                let clock = clock.clone();
                let seed = opts.seed ^ ((d as u64) << 32) ^ (senders as u64) << 8 ^ size as u64;
                scope.spawn(move || {
                    drive(
                        streams,
                        DriveCtx {
                            pool: &pool,
                            receiver: receiver.as_deref(),
                            clock: &*clock,
                            size,
                            log_bytes: opts.log_bytes,
                            warmup_ops: warmup_each as u64,
                            remote_ops: ops_each as u64,
                            barrier,
                            measured_from,
                            jitter: opts.jitter,
                            seed,
                            is_controller: d == 0,
                        },
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("driver panicked"))
            .collect()
    });
    media.flush_buffers();
    let (start, before) = measured_from
        .lock()
        .take()
        .expect("a driver marks the start");
    let elapsed = start.elapsed().as_secs_f64();
    let stats: MediaStats = media.stats().delta(&before);
    let remote_ops: u64 = results.iter().map(|r| r.0).sum();
    let local_ops: u64 = results.iter().map(|r| r.1).sum();
    Ok(DlwaPoint {
        mode,
        write_size_bytes: size,
        senders,
        local_writers: locals > 0,
        local_writer_count: locals,
        dlwa: stats.dlwa(),
        ops_per_sec: remote_ops as f64 / elapsed,
        local_ops_per_sec: local_ops as f64 / elapsed,
        request_bytes: stats.request_bytes,
        media_bytes: stats.media_bytes,
        remote_ops,
        local_ops,
        media_timing: opts.media.timing.is_some(),
        media_write_bytes_per_sec_per_dimm: opts
            .media
            .timing
            .as_ref()
            .map(|t| t.media_write_bytes_per_sec_per_dimm),
    })
}

struct DriveCtx<'a> {
    pool: &'a Arc<Pool>,
    receiver: Option<&'a Mutex<RowanReceiver<LoopbackNic>>>,
    clock: &'a dyn Clock,
    size: usize,
    log_bytes: usize,
    warmup_ops: u64,
    remote_ops: u64,
    /// All drivers meet here after the warm-up; driver 0 snapshots the media
    /// counters and the clock in between.
    barrier: &'a Barrier,
    measured_from: &'a Mutex<Option<(Instant, MediaStats)>>,
    jitter: f64,
    seed: u64,
    is_controller: bool,
}

/// Bound on retries of one write that hit "no receive buffer" while the control
/// path catches up.
const RNR_RETRIES_MAX: u32 = 100_000;
/// Remote writes between two steps of the Rowan control loop.
const CONTROL_EVERY_OPS: u64 = 256;

/// Run this driver's streams for `warmup_ops` remote writes, meet the other drivers,
/// then for `remote_ops` measured ones. Returns the measured (remote, local) writes.
fn drive(mut streams: Vec<Stream>, ctx: DriveCtx<'_>) -> (u64, u64) {
    let remote_count = streams
        .iter()
        .filter(|s| !matches!(s.kind, StreamKind::Local { .. }))
        .count();
    if remote_count == 0 {
        // Nothing to drive, but the others must not wait for us at the barrier.
        mark(&ctx);
        return (0, 0);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(ctx.seed);
    // Virtual time in units of 1/1024 round period, as integers for the heap.
    const PERIOD: u64 = 1024;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = streams
        .iter()
        .enumerate()
        .map(|(i, _)| Reverse((rng.gen_range(0..PERIOD), i)))
        .collect();
    let mut payload = vec![0u8; ctx.size.max(128)];
    let mut wc = [Completion::BLANK; 4];
    let (mut remote_done, mut local_done) = (0u64, 0u64);
    let mut measuring = ctx.warmup_ops == 0;
    if measuring {
        mark(&ctx);
    }
    loop {
        if !measuring && remote_done >= ctx.warmup_ops {
            mark(&ctx);
            measuring = true;
            remote_done = 0;
            local_done = 0;
        }
        if measuring && remote_done >= ctx.remote_ops {
            break;
        }
        let Reverse((t, i)) = heap.pop().expect("streams are never removed");
        let jitter: f64 = Exp1.sample(&mut rng);
        heap.push(Reverse((
            t + PERIOD + (ctx.jitter * jitter * PERIOD as f64) as u64,
            i,
        )));
        let s = &mut streams[i];
        s.seq += 1;
        // A non-zero first word: Rowan finds started buffers by it.
        payload[..8].copy_from_slice(&(((i as u64) << 40) | s.seq).to_le_bytes());
        match &mut s.kind {
            StreamKind::Local { offset } => {
                let at = *offset + s.written % ctx.log_bytes;
                ctx.pool.nt_copy_persist(at, &payload[..128]);
                s.written += 128;
                local_done += 1;
                continue;
            }
            StreamKind::Write {
                qp,
                cq,
                log,
                log_offset,
            } => {
                let at = *log_offset + (s.written % ctx.log_bytes) as u64;
                let wr = WorkRequest::new(
                    s.seq,
                    Op::Write {
                        data: &payload[..ctx.size],
                        remote: log.at(at),
                        imm: None,
                    },
                )
                .persisted();
                qp.post_send(&[wr]).expect("post WRITE");
                wait_one(cq, &mut wc, "WRITE");
            }
            StreamKind::Rowan { sender, cq } => {
                let mut retries = 0;
                loop {
                    sender
                        .write(s.seq, &payload[..ctx.size])
                        .expect("post SEND");
                    let c = wait_any(cq, &mut wc);
                    if c.status == WcStatus::Success {
                        break;
                    }
                    assert_eq!(
                        c.status,
                        WcStatus::RnrRetryExceeded,
                        "Rowan write failed: {c:?}"
                    );
                    // The receiver ran out of posted buffers: let the control path
                    // recycle, then reconnect and retry (what an RC sender does after
                    // an RNR error).
                    retries += 1;
                    assert!(retries < RNR_RETRIES_MAX, "receiver never caught up");
                    if let Some(r) = ctx.receiver {
                        control_step(r, ctx.clock);
                    }
                    std::thread::yield_now();
                    sender.qp().reset().expect("reset after RNR");
                }
            }
        }
        s.written += ctx.size;
        remote_done += 1;
        if ctx.is_controller && remote_done % CONTROL_EVERY_OPS == 0 {
            if let Some(r) = ctx.receiver {
                control_step(r, ctx.clock);
            }
        }
    }
    (remote_done, local_done)
}

/// Meet the other drivers at the start of the measurement; one of them snapshots the
/// media counters and the clock while the others wait.
fn mark(ctx: &DriveCtx<'_>) {
    if ctx.barrier.wait().is_leader() {
        // Lines the warm-up left in the write-combining buffers are written out and
        // charged to the warm-up, so the window counts exactly its own bytes.
        let media = ctx.pool.media().expect("media model enabled");
        media.flush_buffers();
        *ctx.measured_from.lock() = Some((Instant::now(), media.stats()));
    }
    ctx.barrier.wait();
}

/// One step of the receiver's control loop: recycle used buffers by re-posting them
/// (the experiment has no digest; the data is not needed after it landed).
fn control_step(receiver: &Mutex<RowanReceiver<LoopbackNic>>, clock: &dyn Clock) {
    let Some(mut r) = receiver.try_lock() else {
        return;
    };
    let used = r.tick(clock.now_ns());
    if !used.is_empty() {
        r.post(&used).expect("re-post used buffers");
    }
}

fn wait_any(cq: &LoopbackCq, wc: &mut [Completion; 4]) -> Completion {
    loop {
        let n = cq.poll(&mut wc[..1]).expect("poll");
        if n == 1 {
            return wc[0];
        }
        std::hint::spin_loop();
    }
}

fn wait_one(cq: &LoopbackCq, wc: &mut [Completion; 4], what: &str) {
    let c = wait_any(cq, wc);
    assert_eq!(c.status, WcStatus::Success, "{what} failed: {c:?}");
}

/// Render points as the experiment's table.
pub fn table(points: &[DlwaPoint]) -> String {
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.mode.to_string(),
                p.write_size_bytes.to_string(),
                p.senders.to_string(),
                p.local_writer_count.to_string(),
                format!("{:.3}", p.dlwa),
                format!("{:.1}", p.request_bytes as f64 / (1 << 20) as f64),
                format!("{:.1}", p.media_bytes as f64 / (1 << 20) as f64),
                format!("{:.3}", p.ops_per_sec / 1e6),
                format!("{:.3}", p.local_ops_per_sec / 1e6),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "mode",
            "size_B",
            "senders",
            "local",
            "DLWA",
            "request_MiB",
            "media_MiB",
            "remote_Mops/s",
            "local_Mops/s",
        ],
        &rows,
    )
}

/// The media model's timing defaults, for `--media-timing`.
pub fn default_timing() -> MediaTiming {
    MediaTiming {
        media_write_bytes_per_sec_per_dimm: 2_000_000_000,
    }
}
