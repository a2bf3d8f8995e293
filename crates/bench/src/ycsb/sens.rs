//! `rowankv bench sens`: the closed-loop comparison of the replication
//! strategies while one parameter varies — seed 000's sensitivity analysis
//! (§6.4, Figure 13 (a)–(d)), its Table 2 (UP2X and UDB object sizes) and its
//! uniform-versus-Zipfian comparison (§6.3).
//!
//! Every point is one run of [`super::runner::run`]: a fresh cluster per
//! strategy, loaded, then `seconds` of closed-loop load (`clients` × `depth`
//! in flight), exactly as `bench ycsb --compare`. Only the varied parameter
//! changes from point to point; everything else is the base setting (the
//! default of `bench ycsb`, write-intensive YCSB-A with ZippyDB objects, as
//! the paper's §6.4 uses). What varies:
//!
//! - [`Vary::EntrySize`] (Figure 13(a)): fixed-size objects whose log entry
//!   (header, request record, 16 B key, value) is exactly 64 … 1024 B.
//! - [`Vary::Rf`] (Figure 13(b)): replication factor 2 … 5, on five servers
//!   for every point, so that only the factor changes.
//! - [`Vary::Workers`] (Figure 13(c)): worker roles per server.
//! - [`Vary::Dimms`] (Figure 13(d)): modelled DIMMs per server, each at the
//!   scaled media bandwidth: 1 DIMM makes the medium the bottleneck.
//! - [`Vary::Sizes`] (Table 2): UP2X and UDB objects (ZippyDB beside them).
//! - [`Vary::Keys`] (§6.3's uniform keys): Zipfian 0.99 and uniform keys, on
//!   YCSB-A (50 % PUT) and YCSB-B (5 % PUT).
//!
//! With the media timing on (the default) every point is under that timing
//! model, and every line printed, and the plot's caption, says so.

use serde::Serialize;

use rowankv_engine::entry;

use super::runner::{self, YcsbOptions, YcsbResult};
use super::workload::{KeyDist, SizeDist, Workload};

/// Which parameter a run varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vary {
    EntrySize,
    Rf,
    Workers,
    Dimms,
    Sizes,
    Keys,
}

impl Vary {
    pub const ALL: [Vary; 6] = [
        Vary::EntrySize,
        Vary::Rf,
        Vary::Workers,
        Vary::Dimms,
        Vary::Sizes,
        Vary::Keys,
    ];

    /// The name on the command line and in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Vary::EntrySize => "entry-size",
            Vary::Rf => "rf",
            Vary::Workers => "workers",
            Vary::Dimms => "dimms",
            Vary::Sizes => "sizes",
            Vary::Keys => "keys",
        }
    }

    /// The figure or table of seed 000 it reproduces.
    pub fn figure(self) -> &'static str {
        match self {
            Vary::EntrySize => "Figure 13(a)",
            Vary::Rf => "Figure 13(b)",
            Vary::Workers => "Figure 13(c)",
            Vary::Dimms => "Figure 13(d)",
            Vary::Sizes => "Table 2",
            Vary::Keys => "§6.3, uniform keys",
        }
    }

    /// What the x axis shows.
    pub fn axis(self) -> &'static str {
        match self {
            Vary::EntrySize => "log entry size (B)",
            Vary::Rf => "replication factor (5 servers)",
            Vary::Workers => "worker roles per server",
            Vary::Dimms => "modelled DIMMs per server",
            Vary::Sizes => "object sizes",
            Vary::Keys => "workload / key distribution",
        }
    }

    /// The values of a full run and of a `--quick` one.
    pub fn default_values(self, quick: bool) -> Vec<String> {
        let v: &[&str] = match (self, quick) {
            (Vary::EntrySize, false) => &["64", "128", "256", "512", "1024"],
            (Vary::EntrySize, true) => &["128", "512"],
            (Vary::Rf, false) => &["2", "3", "4", "5"],
            (Vary::Rf, true) => &["2", "3"],
            (Vary::Workers, false) => &["4", "8", "16", "24", "48"],
            (Vary::Workers, true) => &["2", "4"],
            (Vary::Dimms, false) => &["1", "2", "3"],
            (Vary::Dimms, true) => &["1", "3"],
            (Vary::Sizes, false) => &["zippydb", "up2x", "udb"],
            (Vary::Sizes, true) => &["up2x", "udb"],
            (Vary::Keys, false) => &["a/zipfian", "a/uniform", "b/zipfian", "b/uniform"],
            (Vary::Keys, true) => &["a/zipfian", "a/uniform"],
        };
        v.iter().map(|s| s.to_string()).collect()
    }

    /// `base` with this parameter set to `value`, or why `value` is not one.
    pub fn apply(self, base: &YcsbOptions, value: &str) -> Result<YcsbOptions, String> {
        let mut o = base.clone();
        let num = |what: &str| -> Result<usize, String> {
            value
                .parse::<usize>()
                .map_err(|_| format!("{what} {value:?} is not a whole number"))
        };
        match self {
            Vary::EntrySize => o.sizes = fixed_entry_sizes(num("entry size")?)?,
            Vary::Rf => {
                let rf = num("replication factor")?;
                if !(1..=5).contains(&rf) {
                    return Err(format!("replication factor {rf} is not in 1..=5"));
                }
                o.replication_factor = rf as u8;
                o.servers = o.servers.max(5);
            }
            Vary::Workers => {
                let w = num("worker count")?;
                if w == 0 {
                    return Err("a server needs at least one worker".into());
                }
                o.workers = w;
            }
            Vary::Dimms => {
                let d = num("DIMM count")?;
                if !(1..=6).contains(&d) {
                    return Err(format!("DIMM count {d} is not in 1..=6"));
                }
                o.dimms = d;
            }
            Vary::Sizes => o.sizes = value.parse().map_err(|e| format!("{e}"))?,
            Vary::Keys => {
                let (w, k) = value
                    .split_once('/')
                    .ok_or_else(|| format!("{value:?} is not WORKLOAD/KEYS (e.g. a/uniform)"))?;
                o.workload = w.parse::<Workload>().map_err(|e| format!("{e}"))?;
                o.keys = k.parse::<KeyDist>().map_err(|e| format!("{e}"))?;
            }
        }
        Ok(o)
    }
}

impl std::str::FromStr for Vary {
    type Err = String;
    fn from_str(s: &str) -> Result<Vary, String> {
        Vary::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Vary::ALL.iter().map(|v| v.name()).collect();
                format!("unknown parameter {s:?} (one of {})", names.join(", "))
            })
    }
}

/// Key bytes of Figure 13(a)'s objects.
pub const ENTRY_SIZE_KEY_BYTES: usize = 16;

/// Fixed object sizes whose log entry (with its request record) is exactly
/// `entry_bytes`: a 16 B key and the longest value that still fits.
pub fn fixed_entry_sizes(entry_bytes: usize) -> Result<SizeDist, String> {
    let mtu = entry::MTU_BYTES_DEFAULT;
    let len = |v: usize| entry::encoded_len_with_request(ENTRY_SIZE_KEY_BYTES, v, mtu);
    if !entry_bytes.is_multiple_of(64) || entry_bytes > mtu || len(0) > entry_bytes {
        return Err(format!(
            "entry size {entry_bytes} B: give a multiple of 64 from {} to {mtu}",
            len(0).div_ceil(64) * 64
        ));
    }
    let mut v = 0;
    while len(v + 1) <= entry_bytes {
        v += 1;
    }
    if len(v) != entry_bytes {
        return Err(format!(
            "no value makes an entry of exactly {entry_bytes} B"
        ));
    }
    Ok(SizeDist::Fixed {
        key_bytes: ENTRY_SIZE_KEY_BYTES,
        value_bytes: v,
    })
}

/// Options of one `bench sens` run.
#[derive(Clone, Debug)]
pub struct SensOptions {
    pub vary: Vary,
    pub values: Vec<String>,
    /// The setting every point starts from (its strategies are compared).
    pub base: YcsbOptions,
}

/// One strategy at one value of the varied parameter.
#[derive(Clone, Debug, Serialize)]
pub struct SensPoint {
    pub figure: &'static str,
    pub vary: &'static str,
    pub value: String,
    /// What the value means in the run (`fixed:16:20` for a 128 B entry, …).
    pub setting: String,
    pub strategy: String,
    pub ops_per_sec: f64,
    pub put_p50_us: f64,
    pub put_p99_us: f64,
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    pub dlwa_max: f64,
    pub media_bytes_per_op: f64,
    pub cleaner_bytes_per_op: f64,
    pub cpu_us_per_op: f64,
    pub errors: u64,
    pub servers: usize,
    pub replication_factor: u8,
    pub workers: usize,
    pub dimms: usize,
    pub media_timing: bool,
    pub media_write_bytes_per_sec_per_dimm: Option<u64>,
}

impl SensPoint {
    fn of(vary: Vary, value: &str, o: &YcsbOptions, r: &YcsbResult) -> SensPoint {
        SensPoint {
            figure: vary.figure(),
            vary: vary.name(),
            value: value.to_string(),
            setting: format!(
                "YCSB-{} {} keys, {} sizes",
                o.workload,
                o.keys.name(),
                o.sizes
            ),
            strategy: r.strategy.clone(),
            ops_per_sec: r.ops_per_sec,
            put_p50_us: r.put_p50_us,
            put_p99_us: r.put_p99_us,
            get_p50_us: r.get_p50_us,
            get_p99_us: r.get_p99_us,
            dlwa_max: r.dlwa_max,
            media_bytes_per_op: r.media_bytes_per_op,
            cleaner_bytes_per_op: r.cleaner_bytes_per_op,
            cpu_us_per_op: r.cpu_us_per_op,
            errors: r.errors + r.timeouts,
            servers: r.servers,
            replication_factor: r.replication_factor,
            workers: r.workers,
            dimms: o.dimms,
            media_timing: r.media_timing,
            media_write_bytes_per_sec_per_dimm: r.media_write_bytes_per_sec_per_dimm,
        }
    }

    /// The timing model the point ran under, as every printed line names it.
    pub fn timing(&self) -> String {
        super::sweep::media_timing_label(
            super::FabricKind::Loopback,
            self.media_timing,
            self.media_write_bytes_per_sec_per_dimm,
        )
    }
}

/// Run every value, every strategy; `progress` gets each point as it is done.
pub fn run(
    opts: &SensOptions,
    mut progress: impl FnMut(&SensPoint),
) -> Result<Vec<SensPoint>, String> {
    if opts.values.is_empty() {
        return Err("no values to run".into());
    }
    let settings: Vec<YcsbOptions> = opts
        .values
        .iter()
        .map(|v| opts.vary.apply(&opts.base, v))
        .collect::<Result<_, _>>()?;
    let mut points = Vec::new();
    for (value, o) in opts.values.iter().zip(&settings) {
        let results = runner::run(o).map_err(|e| format!("{} = {value}: {e}", opts.vary.name()))?;
        for r in &results {
            let p = SensPoint::of(opts.vary, value, o, r);
            progress(&p);
            points.push(p);
        }
    }
    Ok(points)
}

/// One line per point, for the progress of a run.
pub fn line(p: &SensPoint) -> String {
    format!(
        "  {} {}={:<10} {:<6} {:>8.0} ops/s  PUT p50/p99 {:.0}/{:.0} µs  GET p50 {:.0} µs  DLWA {:.3}  media {:.0} B/op  cleaned {:.0} B/op  errors {}  [{}]",
        p.figure,
        p.vary,
        p.value,
        p.strategy,
        p.ops_per_sec,
        p.put_p50_us,
        p.put_p99_us,
        p.get_p50_us,
        p.dlwa_max,
        p.media_bytes_per_op,
        p.cleaner_bytes_per_op,
        p.errors,
        p.timing()
    )
}

/// The result table: a row per value, a column of ops/s per strategy, then
/// each strategy's throughput relative to Rowan's (when Rowan ran).
pub fn table(points: &[SensPoint]) -> String {
    let strategies = strategies(points);
    let values = values(points);
    let find = |v: &str, s: &str| points.iter().find(|p| p.value == v && p.strategy == s);
    let mut header: Vec<String> = vec![points.first().map_or("value", |p| p.vary).to_string()];
    header.extend(strategies.iter().map(|s| format!("{s} ops/s")));
    let rowan = strategies.iter().any(|s| s == "rowan");
    if rowan {
        header.extend(
            strategies
                .iter()
                .filter(|s| *s != "rowan")
                .map(|s| format!("rowan/{s}")),
        );
    }
    header.extend(strategies.iter().map(|s| format!("{s} DLWA")));
    header.push("timing model".into());
    let rows: Vec<Vec<String>> = values
        .iter()
        .map(|v| {
            let mut row = vec![v.clone()];
            for s in &strategies {
                row.push(find(v, s).map_or("-".into(), |p| format!("{:.0}", p.ops_per_sec)));
            }
            if rowan {
                let r = find(v, "rowan").map(|p| p.ops_per_sec);
                for s in strategies.iter().filter(|s| *s != "rowan") {
                    row.push(match (r, find(v, s)) {
                        (Some(r), Some(p)) if p.ops_per_sec > 0.0 => {
                            format!("{:.2}x", r / p.ops_per_sec)
                        }
                        _ => "-".into(),
                    });
                }
            }
            for s in &strategies {
                row.push(find(v, s).map_or("-".into(), |p| format!("{:.3}", p.dlwa_max)));
            }
            row.push(
                points
                    .iter()
                    .find(|p| &p.value == v)
                    .map_or(String::new(), |p| p.timing()),
            );
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    crate::table::render(&header, &rows)
}

/// The strategies of `points` in the order they ran.
pub fn strategies(points: &[SensPoint]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in points {
        if !out.contains(&p.strategy) {
            out.push(p.strategy.clone());
        }
    }
    out
}

/// The values of `points` in the order they ran.
pub fn values(points: &[SensPoint]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in points {
        if !out.contains(&p.value) {
            out.push(p.value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_sizes_are_exact_and_bad_ones_are_refused() {
        for e in [128, 256, 512, 1024] {
            let SizeDist::Fixed {
                key_bytes,
                value_bytes,
            } = fixed_entry_sizes(e).unwrap()
            else {
                panic!("not fixed")
            };
            let mtu = entry::MTU_BYTES_DEFAULT;
            assert_eq!(
                entry::encoded_len_with_request(key_bytes, value_bytes, mtu),
                e
            );
            // One more value byte crosses into the next stride.
            assert!(entry::encoded_len_with_request(key_bytes, value_bytes + 1, mtu) > e);
        }
        assert!(fixed_entry_sizes(100).is_err());
        assert!(fixed_entry_sizes(1 << 20).is_err());
    }

    #[test]
    fn each_parameter_changes_only_its_own_setting() {
        let base = YcsbOptions::default();
        let o = Vary::Rf.apply(&base, "4").unwrap();
        assert_eq!((o.replication_factor, o.servers), (4, 5));
        assert!(Vary::Rf.apply(&base, "9").is_err());
        assert_eq!(Vary::Workers.apply(&base, "8").unwrap().workers, 8);
        assert!(Vary::Workers.apply(&base, "x").is_err());
        assert_eq!(Vary::Dimms.apply(&base, "1").unwrap().dimms, 1);
        let o = Vary::Keys.apply(&base, "b/uniform").unwrap();
        assert_eq!(o.workload, Workload::B);
        assert_eq!(o.keys, KeyDist::Uniform);
        assert_eq!(o.sizes, base.sizes);
        assert!(Vary::Keys.apply(&base, "uniform").is_err());
        assert_eq!(
            Vary::Sizes.apply(&base, "up2x").unwrap().sizes,
            SizeDist::Up2x
        );
        assert!("dimm".parse::<Vary>().is_err());
        for v in Vary::ALL {
            assert_eq!(v.name().parse::<Vary>().unwrap(), v);
            for q in [false, true] {
                for value in v.default_values(q) {
                    v.apply(&base, &value).unwrap();
                }
            }
        }
    }
}
