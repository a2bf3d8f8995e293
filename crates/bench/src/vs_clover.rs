//! Seed 000 Figure 16: Rowan-KV against Clover, on the same fabric, media and
//! timing models.
//!
//! Both run in this process on the `loopback` fabric with the wire model on
//! (`WireModel::CONNECTX5`) and every byte of persistent memory in pools with
//! the Optane media model, its timing on at the same bandwidth per DIMM
//! (`docs/media-model.md`), so a write amplified at the DIMMs costs both the
//! same. Time is wall time for both: Rowan-KV's servers are threads of an
//! executor, Clover's clients are stepped by one driver thread and its memory
//! nodes have no thread at all (their NICs, the fabric's engine, do the work).
//!
//! The same replication factor (each Clover memory node holds a replica of
//! every key, node 0 the primary that orders the versions), the same number of
//! blocking clients (Rowan-KV's with one operation in flight each), the same
//! key distribution (YCSB's scrambled Zipfian, θ 0.99) and object sizes
//! (ZippyDB's, and 4 KiB values), write-intensive (YCSB-A, 50 % PUT) and
//! read-intensive (YCSB-B, 5 % PUT). Reported per point: throughput, DLWA
//! (media bytes over the bytes the DIMMs were asked to write, all pools) and
//! the bytes behind it, and each system's ratio.
//!
//! Clover is run natively (no interposer), as the paper compares it.

use rowankv_clover::bench::{self as clover, Timing, Workload as CloverWorkload};
use rowankv_clover::cluster::Memory;
use rowankv_fabric::WireModel;
use rowankv_pmem::{MediaModelConfig, MediaTiming};
use rowankv_server::Strategy;
use serde::Serialize;

use crate::ycsb::runner::{YcsbOptions, SCALED_MEDIA_BANDWIDTH};
use crate::ycsb::workload::{Generator, KeyDist, Op, SizeDist, Workload};

/// What a run compares.
#[derive(Clone, Debug)]
pub struct VsOptions {
    pub records: u64,
    pub clients: usize,
    /// Rowan-KV's measured phase.
    pub seconds: f64,
    /// Clover's measured operations.
    pub clover_ops: u64,
    pub replication_factor: u8,
    /// Rowan-KV's servers.
    pub servers: usize,
    pub workers: usize,
    /// Media write bandwidth per DIMM (both systems).
    pub media_bandwidth: u64,
    pub dimms: usize,
    pub workloads: Vec<Workload>,
    pub sizes: Vec<SizeDist>,
    pub seed: u64,
}

/// 4 KiB values (Figure 16's second object size), ZippyDB's 48 B keys.
pub const FOUR_KIB: SizeDist = SizeDist::Fixed {
    key_bytes: 48,
    value_bytes: 4096,
};

impl Default for VsOptions {
    fn default() -> Self {
        VsOptions {
            records: 20_000,
            clients: 32,
            seconds: 10.0,
            clover_ops: 200_000,
            replication_factor: 3,
            servers: 3,
            workers: 8,
            media_bandwidth: SCALED_MEDIA_BANDWIDTH,
            dimms: MediaModelConfig::default().dimm_count,
            workloads: vec![Workload::A, Workload::B],
            sizes: vec![SizeDist::ZippyDb, FOUR_KIB],
            seed: 42,
        }
    }
}

impl VsOptions {
    /// A run of seconds (CI's smoke run): fewer records, operations, clients.
    pub fn quick() -> Self {
        VsOptions {
            records: 2_000,
            clients: 8,
            seconds: 2.0,
            clover_ops: 10_000,
            workers: 4,
            ..VsOptions::default()
        }
    }
}

/// One system's run of one workload and object size.
#[derive(Clone, Debug, Serialize)]
pub struct VsPoint {
    /// "rowan-kv" or "clover".
    pub system: String,
    /// YCSB's name: "a" (50 % PUT), "b" (5 % PUT).
    pub workload: String,
    pub sizes: String,
    pub clients: usize,
    pub ops: u64,
    pub ops_per_sec: f64,
    /// Media bytes over requested bytes, every pool of the system.
    pub dlwa: f64,
    pub request_bytes_per_op: f64,
    pub media_bytes_per_op: f64,
    pub errors: u64,
    /// The timing models, as every line says them.
    pub timing: String,
}

/// The timing words of every point: both models, and wall time.
fn timing_label(bandwidth: u64) -> String {
    format!(
        "{}; media timing on ({} MB/s per DIMM); wall time",
        WireModel::CONNECTX5.label(),
        bandwidth / 1_000_000
    )
}

/// Rowan-KV's run of `workload` with `sizes`.
fn rowan(opts: &VsOptions, workload: Workload, sizes: SizeDist) -> Result<VsPoint, String> {
    let y = YcsbOptions {
        workload,
        sizes,
        records: opts.records,
        seconds: opts.seconds,
        servers: opts.servers,
        replication_factor: opts.replication_factor,
        workers: opts.workers,
        shards_per_server: 8,
        clients: opts.clients,
        depth: 1,
        strategies: vec![Strategy::Rowan],
        media_bandwidth: Some(opts.media_bandwidth),
        pool_bytes: 1 << 30,
        seed: opts.seed,
        progress: false,
        stream_per_client: true,
        dimms: opts.dimms,
        wire_model: Some(WireModel::CONNECTX5),
        ..YcsbOptions::default()
    };
    let r = crate::ycsb::run(&y)?
        .pop()
        .ok_or("Rowan-KV's run returned nothing")?;
    Ok(VsPoint {
        system: "rowan-kv".into(),
        workload: workload.to_string(),
        sizes: sizes.to_string(),
        clients: opts.clients,
        ops: r.ops,
        ops_per_sec: r.ops_per_sec,
        dlwa: if r.request_bytes_per_op > 0.0 {
            r.media_bytes_per_op / r.request_bytes_per_op
        } else {
            1.0
        },
        request_bytes_per_op: r.request_bytes_per_op,
        media_bytes_per_op: r.media_bytes_per_op,
        errors: r.errors + r.timeouts,
        timing: timing_label(opts.media_bandwidth),
    })
}

/// Clover's run of `workload` with `sizes`: the same generator draws its keys
/// (by rank) and value lengths.
fn clover(opts: &VsOptions, workload: Workload, sizes: SizeDist) -> Result<VsPoint, String> {
    let value_max = sizes.value_bytes_cap();
    let media = MediaModelConfig {
        timing: Some(MediaTiming {
            media_write_bytes_per_sec_per_dimm: opts.media_bandwidth,
        }),
        dimm_count: opts.dimms,
        ..MediaModelConfig::default()
    };
    let w = CloverWorkload {
        keys: opts.records as usize,
        key_bytes: sizes.key_bytes(),
        value_bytes_max: value_max,
        preload_value_bytes: sizes.mean_value_bytes().round().max(1.0) as usize,
        clients: opts.clients,
        ops: opts.clover_ops,
        replicas: opts.replication_factor as usize,
        memory: Memory::PmMedia(media),
        model: WireModel::CONNECTX5,
        timing: Timing::Wall,
        interposed: false,
        seed: opts.seed,
    };
    let mut gen = Generator::new(
        workload,
        KeyDist::Zipfian { theta: 0.99 },
        sizes,
        opts.records,
        value_max,
        opts.seed,
    );
    let r = clover::run_workload(&w, |_rng: &mut rand_chacha::ChaCha8Rng| {
        match gen.next_op() {
            Op::Get { record } => (record as usize, None),
            Op::Put { record, value_len }
            | Op::ReadModifyWrite { record, value_len }
            | Op::Insert { record, value_len } => (record as usize, Some(value_len)),
        }
    })
    .map_err(|e| format!("Clover: {e}"))?;
    Ok(VsPoint {
        system: "clover".into(),
        workload: workload.to_string(),
        sizes: sizes.to_string(),
        clients: opts.clients,
        ops: r.ops,
        ops_per_sec: r.ops_per_sec,
        dlwa: r.dlwa.unwrap_or(1.0),
        request_bytes_per_op: r.request_bytes_per_op,
        media_bytes_per_op: r.media_bytes_per_op,
        errors: 0,
        timing: timing_label(opts.media_bandwidth),
    })
}

/// Every workload and size, Rowan-KV then Clover; `progress` sees each point.
pub fn run(opts: &VsOptions, mut progress: impl FnMut(&VsPoint)) -> Result<Vec<VsPoint>, String> {
    for w in &opts.workloads {
        if !matches!(w, Workload::A | Workload::B | Workload::C) {
            return Err(format!(
                "workload {w}: Figure 16 compares updates and reads of loaded records (a, b or c)"
            ));
        }
    }
    if opts.records == 0 || opts.clients == 0 {
        return Err("a comparison needs records and clients".into());
    }
    let mut out = Vec::new();
    for &sizes in &opts.sizes {
        for &workload in &opts.workloads {
            for p in [
                rowan(opts, workload, sizes)?,
                clover(opts, workload, sizes)?,
            ] {
                progress(&p);
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Rowan-KV's throughput over Clover's at each workload and size.
pub fn ratios(points: &[VsPoint]) -> Vec<(String, String, f64, f64)> {
    let mut out = Vec::new();
    for r in points.iter().filter(|p| p.system == "rowan-kv") {
        if let Some(c) = points
            .iter()
            .find(|p| p.system == "clover" && p.workload == r.workload && p.sizes == r.sizes)
        {
            out.push((
                r.workload.clone(),
                r.sizes.clone(),
                r.ops_per_sec / c.ops_per_sec.max(1e-9),
                c.dlwa / r.dlwa.max(1e-9),
            ));
        }
    }
    out
}

/// One line per point, with its timing models.
pub fn line(p: &VsPoint) -> String {
    format!(
        "vs-clover | {:8} | YCSB-{} {:>13} | {:3} clients | {:9.0} ops/s | DLWA {:.3} (requested {:.0} B/op, media {:.0} B/op) | errors {} | {}",
        p.system,
        p.workload.to_uppercase(),
        p.sizes,
        p.clients,
        p.ops_per_sec,
        p.dlwa,
        p.request_bytes_per_op,
        p.media_bytes_per_op,
        p.errors,
        p.timing
    )
}

/// The table, and Rowan-KV's ratios over Clover.
pub fn table(points: &[VsPoint]) -> String {
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.system.clone(),
                format!("YCSB-{}", p.workload.to_uppercase()),
                p.sizes.clone(),
                format!("{:.0}", p.ops_per_sec),
                format!("{:.3}", p.dlwa),
                format!("{:.0}", p.request_bytes_per_op),
                format!("{:.0}", p.media_bytes_per_op),
                p.errors.to_string(),
            ]
        })
        .collect();
    let mut out = crate::table::render(
        &[
            "system",
            "workload",
            "sizes",
            "ops/s",
            "DLWA",
            "requested B/op",
            "media B/op",
            "errors",
        ],
        &rows,
    );
    let timing = points.first().map_or(String::new(), |p| p.timing.clone());
    for (w, s, throughput, dlwa) in ratios(points) {
        out.push_str(&format!(
            "rowan-kv / clover | YCSB-{} {s} | throughput {throughput:.2}x | Clover's DLWA / Rowan-KV's {dlwa:.2}x | {timing}\n",
            w.to_uppercase()
        ));
    }
    out
}

/// The share of writes in `n` operations of the generator (a test of the mix).
#[cfg(test)]
fn put_share(workload: Workload, n: usize) -> f64 {
    let mut gen = Generator::new(
        workload,
        KeyDist::Zipfian { theta: 0.99 },
        SizeDist::ZippyDb,
        1_000,
        4096,
        7,
    );
    let puts = (0..n).filter(|_| gen.next_op().is_write()).count();
    puts as f64 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_comparison_runs_both_systems_on_every_point_with_its_labels() {
        let opts = VsOptions {
            records: 500,
            clients: 4,
            seconds: 0.5,
            clover_ops: 2_000,
            workers: 2,
            sizes: vec![SizeDist::ZippyDb],
            workloads: vec![Workload::A],
            ..VsOptions::quick()
        };
        let points = run(&opts, |_| {}).unwrap();
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].system, "rowan-kv");
        assert_eq!(points[1].system, "clover");
        for p in &points {
            assert!(p.ops > 0 && p.ops_per_sec > 0.0, "{p:?}");
            // Both wrote to media-modelled pools, and DLWA is at least 1.
            assert!(p.request_bytes_per_op > 0.0, "{p:?}");
            assert!(p.dlwa >= 0.99, "{p:?}");
            assert_eq!(p.errors, 0, "{p:?}");
            assert!(line(p).contains("wire model on") && line(p).contains("media timing on"));
        }
        assert_eq!(ratios(&points).len(), 1);
        assert!(table(&points).contains("rowan-kv / clover"));
    }

    #[test]
    fn workloads_that_insert_are_refused_and_the_mixes_are_ycsbs() {
        let opts = VsOptions {
            workloads: vec![Workload::Load],
            ..VsOptions::quick()
        };
        assert!(run(&opts, |_| {}).unwrap_err().contains("Figure 16"));
        assert!((put_share(Workload::A, 20_000) - 0.5).abs() < 0.02);
        assert!((put_share(Workload::B, 20_000) - 0.05).abs() < 0.01);
    }
}
