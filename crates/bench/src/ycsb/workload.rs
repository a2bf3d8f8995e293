//! What `rowankv bench ycsb` asks of the store: the operation mix of each YCSB
//! workload, which record each operation touches, and how long keys and values are.
//!
//! Everything here is a pure function of a seed: no clocks, no I/O, no shared state.
//! A [`Generator`] is one client thread's stream of operations; the harness builds one
//! per thread (cheaply — see [`Zipfian`]) and turns each [`Op`] into a request with
//! [`record_key`] and a value of the drawn length.
//!
//! The choices, their parameters and the means they produce are written down in
//! `docs/workloads.md`; the tests in `tests/ycsb_workload.rs` pin them.
//!
//! - Operation mixes: seed 000 §6.1 (Load = 100% PUT, A = 50% PUT, B = 5% PUT,
//!   C = 100% GET), plus YCSB's D (5% inserts, reads of the latest) and F (50%
//!   read-modify-write).
//! - Key popularity: YCSB's scrambled Zipfian with constant 0.99 (seed 000 §6.1), a
//!   uniform choice, or YCSB's "latest" (Zipfian over recency).
//! - Object sizes: the three RocksDB-at-Facebook workloads of seed 000 §6.1 (ZippyDB,
//!   UP2X, UDB) and the Memcached-at-Facebook pools ETC and SYS of seed 001 §5.2.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// YCSB's default Zipfian constant, the one seed 000 §6.1 uses.
pub const ZIPFIAN_THETA_DEFAULT: f64 = 0.99;

/// Terms of the zeta sum added one by one before the Euler–Maclaurin tail takes over
/// (see [`zeta`]). With 1024 exact terms the first neglected correction term is below
/// 1e-20 of the sum.
pub const ZETA_EXACT_TERMS: u64 = 1024;

/// When a [`Zipfian`] grows by at most this many items, the new terms are added to
/// the sum one by one; a larger jump recomputes the sum with [`zeta`].
pub const ZETA_GROW_INCREMENTAL_MAX: u64 = ZETA_EXACT_TERMS;

/// The fixed prefix of decimal record keys.
pub const RECORD_KEY_PREFIX: &[u8] = b"user";

/// Largest key length `fixed:K:V` accepts: the engine's largest key.
pub const FIXED_KEY_BYTES_MAX: usize = rowankv_engine::entry::KEY_BYTES_MAX;

/// Largest value length `fixed:K:V` accepts (1 MiB), far below what an entry can
/// carry at the default MTU.
pub const FIXED_VALUE_BYTES_MAX: usize = 1 << 20;

/// Largest value the three RocksDB-derived models (ZippyDB, UP2X, UDB) and ETC draw.
pub const MODEL_VALUE_BYTES_CAP: usize = 4096;

/// Largest value SYS draws: seed 001 §5.2's "between 500 and 10,000 bytes".
pub const SYS_VALUE_BYTES_CAP: usize = 10_000;

const _: () = assert!(MODEL_VALUE_BYTES_CAP <= FIXED_VALUE_BYTES_MAX);
const _: () = assert!(SYS_VALUE_BYTES_CAP <= FIXED_VALUE_BYTES_MAX);
const _: () = assert!(RECORD_KEY_PREFIX.len() == 4);
const _: () = assert!(ZETA_EXACT_TERMS >= 2);

/// A string on the command line that names no workload, distribution or size model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unknown workload {0:?} (expected load, a, b, c, d or f)")]
    Workload(String),
    #[error("unknown key distribution {0:?} (expected zipfian, zipfian:THETA with 0 < THETA < 1, uniform or latest)")]
    KeyDist(String),
    #[error(
        "unknown size distribution {0:?} (expected zippydb, up2x, udb, etc, sys or fixed:K:V \
         with 1 <= K <= {FIXED_KEY_BYTES_MAX} and 1 <= V <= {FIXED_VALUE_BYTES_MAX})"
    )]
    SizeDist(String),
}

// ---------------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------------

/// A YCSB operation mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// 100% PUT: every operation inserts a new record (seed 000 "Load A").
    Load,
    /// 50% PUT (update of an existing record), 50% GET.
    A,
    /// 5% PUT, 95% GET.
    B,
    /// 100% GET.
    C,
    /// 5% inserts of new records, 95% GET; reads favour the newest records.
    D,
    /// 50% read-modify-write of one record, 50% GET.
    F,
}

impl Workload {
    pub const ALL: [Workload; 6] = [
        Workload::Load,
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::D,
        Workload::F,
    ];

    /// The fraction of operations that write: PUT, insert or read-modify-write.
    pub fn put_fraction(&self) -> f64 {
        match self {
            Workload::Load => 1.0,
            Workload::A => 0.5,
            Workload::B => 0.05,
            Workload::C => 0.0,
            Workload::D => 0.05,
            Workload::F => 0.5,
        }
    }

    /// YCSB's key distribution for this workload: `latest` for D, Zipfian 0.99 for
    /// the others.
    pub fn default_key_dist(&self) -> KeyDist {
        match self {
            Workload::D => KeyDist::Latest,
            _ => KeyDist::Zipfian {
                theta: ZIPFIAN_THETA_DEFAULT,
            },
        }
    }
}

impl FromStr for Workload {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "load" => Ok(Workload::Load),
            "a" => Ok(Workload::A),
            "b" => Ok(Workload::B),
            "c" => Ok(Workload::C),
            "d" => Ok(Workload::D),
            "f" => Ok(Workload::F),
            _ => Err(ParseError::Workload(s.to_string())),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Workload::Load => "load",
            Workload::A => "a",
            Workload::B => "b",
            Workload::C => "c",
            Workload::D => "d",
            Workload::F => "f",
        };
        f.write_str(name)
    }
}

// ---------------------------------------------------------------------------------
// Key distributions
// ---------------------------------------------------------------------------------

/// Which record an operation on an existing record touches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyDist {
    /// YCSB's scrambled Zipfian over the loaded records: rank `r` is drawn with
    /// probability about `(r + 1)^-theta / zeta(records, theta)`, then mapped to a
    /// record by a fixed permutation so that the popular records are spread over the
    /// key space (and over the shards).
    Zipfian { theta: f64 },
    /// Every loaded record equally likely.
    Uniform,
    /// YCSB's "latest": Zipfian over recency, over every record including the ones
    /// this run inserted; the newest record is the most popular.
    Latest,
}

impl KeyDist {
    /// The name a run's setting line gives it: `zipfian 0.99`, `uniform`, `latest`.
    pub fn name(self) -> String {
        match self {
            KeyDist::Zipfian { theta } => format!("zipfian {theta}"),
            k => format!("{k:?}").to_lowercase(),
        }
    }
}

impl FromStr for KeyDist {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let err = || ParseError::KeyDist(s.to_string());
        match lower.as_str() {
            "zipfian" => Ok(KeyDist::Zipfian {
                theta: ZIPFIAN_THETA_DEFAULT,
            }),
            "uniform" => Ok(KeyDist::Uniform),
            "latest" => Ok(KeyDist::Latest),
            _ => {
                let theta_text = lower.strip_prefix("zipfian:").ok_or_else(err)?;
                let theta: f64 = theta_text.parse().map_err(|_| err())?;
                if theta > 0.0 && theta < 1.0 {
                    Ok(KeyDist::Zipfian { theta })
                } else {
                    Err(err())
                }
            }
        }
    }
}

impl fmt::Display for KeyDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyDist::Zipfian { theta } if *theta == ZIPFIAN_THETA_DEFAULT => f.write_str("zipfian"),
            KeyDist::Zipfian { theta } => write!(f, "zipfian:{theta}"),
            KeyDist::Uniform => f.write_str("uniform"),
            KeyDist::Latest => f.write_str("latest"),
        }
    }
}

// ---------------------------------------------------------------------------------
// Object sizes
// ---------------------------------------------------------------------------------

/// How long keys and values are. Keys have one fixed length per model (the rounded
/// published average); value lengths are drawn per write.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeDist {
    /// RocksDB at Facebook, ZippyDB: 48 B keys, 90.8 B average object.
    ZippyDb,
    /// RocksDB at Facebook, UP2X: 10 B keys, 57.25 B average object.
    Up2x,
    /// RocksDB at Facebook, UDB: 27 B keys, 153.8 B average object.
    Udb,
    /// Memcached at Facebook, ETC as seed 001 §5.2 describes it: 16 B keys, 90% of
    /// values uniform in 16..=512 B.
    Etc,
    /// Memcached at Facebook, SYS as seed 001 §5.2 describes it: 27 B keys (the mean
    /// of its 16–45 B range), 80% of values in 320..=500 B.
    Sys,
    /// Every key `key_bytes` long, every value `value_bytes` long.
    Fixed {
        key_bytes: usize,
        value_bytes: usize,
    },
}

impl SizeDist {
    /// The five published models (everything but `Fixed`).
    pub const MODELS: [SizeDist; 5] = [
        SizeDist::ZippyDb,
        SizeDist::Up2x,
        SizeDist::Udb,
        SizeDist::Etc,
        SizeDist::Sys,
    ];

    /// The length of every key.
    pub fn key_bytes(&self) -> usize {
        match self {
            SizeDist::ZippyDb => 48,
            SizeDist::Up2x => 10,
            SizeDist::Udb => 27,
            SizeDist::Etc => 16,
            SizeDist::Sys => 27,
            SizeDist::Fixed { key_bytes, .. } => *key_bytes,
        }
    }

    /// The longest value the model draws; a `max_value` at or above this leaves the
    /// distribution untouched.
    pub fn value_bytes_cap(&self) -> usize {
        match self {
            SizeDist::Fixed { value_bytes, .. } => (*value_bytes).max(1),
            model => value_model(*model).cap_bytes,
        }
    }

    /// The exact mean value length of the model when `max_value` is at least
    /// [`SizeDist::value_bytes_cap`]. Computed from the distribution function (a sum
    /// over every length up to the cap: cheap, but not for a hot path).
    pub fn mean_value_bytes(&self) -> f64 {
        self.truncated_mean_value_bytes(self.value_bytes_cap())
    }

    /// The exact mean value length [`SizeDist::sample_value_len`] produces with this
    /// `max_value`.
    pub fn truncated_mean_value_bytes(&self, max_value: usize) -> f64 {
        assert!(max_value >= 1, "max_value must be at least 1");
        match self {
            SizeDist::Fixed { value_bytes, .. } => (*value_bytes).clamp(1, max_value) as f64,
            model => value_model(*model).truncated_mean(max_value),
        }
    }

    /// The mean key plus value length with no truncation.
    pub fn mean_object_bytes(&self) -> f64 {
        self.key_bytes() as f64 + self.mean_value_bytes()
    }

    /// Draws one value length in `1..=max_value`. A `max_value` below the model's cap
    /// truncates the distribution (draws are conditioned on being at most
    /// `max_value`), which lowers the mean; it never piles draws up at `max_value`.
    pub fn sample_value_len(&self, rng: &mut impl Rng, max_value: usize) -> usize {
        assert!(max_value >= 1, "max_value must be at least 1");
        match self {
            SizeDist::Fixed { value_bytes, .. } => (*value_bytes).clamp(1, max_value),
            model => value_model(*model).sample(rng, max_value),
        }
    }
}

impl FromStr for SizeDist {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let err = || ParseError::SizeDist(s.to_string());
        match lower.as_str() {
            "zippydb" => Ok(SizeDist::ZippyDb),
            "up2x" => Ok(SizeDist::Up2x),
            "udb" => Ok(SizeDist::Udb),
            "etc" => Ok(SizeDist::Etc),
            "sys" => Ok(SizeDist::Sys),
            _ => {
                let rest = lower.strip_prefix("fixed:").ok_or_else(err)?;
                let (key_text, value_text) = rest.split_once(':').ok_or_else(err)?;
                let key_bytes: usize = key_text.parse().map_err(|_| err())?;
                let value_bytes: usize = value_text.parse().map_err(|_| err())?;
                if (1..=FIXED_KEY_BYTES_MAX).contains(&key_bytes)
                    && (1..=FIXED_VALUE_BYTES_MAX).contains(&value_bytes)
                {
                    Ok(SizeDist::Fixed {
                        key_bytes,
                        value_bytes,
                    })
                } else {
                    Err(err())
                }
            }
        }
    }
}

impl fmt::Display for SizeDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeDist::ZippyDb => f.write_str("zippydb"),
            SizeDist::Up2x => f.write_str("up2x"),
            SizeDist::Udb => f.write_str("udb"),
            SizeDist::Etc => f.write_str("etc"),
            SizeDist::Sys => f.write_str("sys"),
            SizeDist::Fixed {
                key_bytes,
                value_bytes,
            } => write!(f, "fixed:{key_bytes}:{value_bytes}"),
        }
    }
}

/// Shape of the Generalized Pareto value model of the three RocksDB workloads: the
/// shape of the value model RocksDB's own workload generator ships for a 48 B-key
/// (ZippyDB-like) workload. The scale is fitted per workload to the published mean.
pub const ROCKSDB_VALUE_GPD_SHAPE: f64 = 0.2615;
/// GPD scale for ZippyDB: mean value 42.8 B (90.8 B object − 48 B key).
pub const ZIPPYDB_VALUE_GPD_SCALE: f64 = 31.24;
/// GPD scale for UP2X: mean value 47.25 B (57.25 B object − 10 B key).
pub const UP2X_VALUE_GPD_SCALE: f64 = 34.53;
/// GPD scale for UDB: mean value 126.8 B (153.8 B object − 27 B key).
pub const UDB_VALUE_GPD_SCALE: f64 = 93.54;
/// The Memcached study's GPD fit of ETC's value sizes (location 0).
pub const ETC_VALUE_GPD_SCALE: f64 = 214.476;
pub const ETC_VALUE_GPD_SHAPE: f64 = 0.348238;

/// How the value length of one piece of a model is spread over `(lo, hi]`.
#[derive(Clone, Copy, Debug)]
enum Spread {
    Uniform,
    /// Density proportional to 1/x: each doubling of length is equally likely.
    LogUniform,
    /// A Generalized Pareto distribution (location 0) conditioned on `(lo, hi]`.
    Gpd {
        scale: f64,
        shape: f64,
    },
}

/// One piece of a value model: with probability `weight`, a length in `(lo, hi]`.
#[derive(Clone, Copy, Debug)]
struct Piece {
    weight: f64,
    lo: f64,
    hi: f64,
    spread: Spread,
}

/// A Generalized Pareto survival function, `P(X > x)`.
fn gpd_survival(x: f64, scale: f64, shape: f64) -> f64 {
    (1.0 + shape * x / scale).powf(-1.0 / shape)
}

impl Piece {
    /// `P(X <= x | X in piece)`.
    fn cdf(&self, x: f64) -> f64 {
        let x = x.clamp(self.lo, self.hi);
        match self.spread {
            Spread::Uniform => (x - self.lo) / (self.hi - self.lo),
            Spread::LogUniform => (x / self.lo).ln() / (self.hi / self.lo).ln(),
            Spread::Gpd { scale, shape } => {
                let s_lo = gpd_survival(self.lo, scale, shape);
                let s_hi = gpd_survival(self.hi, scale, shape);
                (s_lo - gpd_survival(x, scale, shape)) / (s_lo - s_hi)
            }
        }
    }

    /// The inverse of [`Piece::cdf`]: `v` in `[0, 1)` to a length in `[lo, hi)`.
    fn inverse(&self, v: f64) -> f64 {
        match self.spread {
            Spread::Uniform => self.lo + v * (self.hi - self.lo),
            Spread::LogUniform => self.lo * (self.hi / self.lo).powf(v),
            Spread::Gpd { scale, shape } => {
                let s_lo = gpd_survival(self.lo, scale, shape);
                let s_hi = gpd_survival(self.hi, scale, shape);
                let s = s_lo - v * (s_lo - s_hi);
                scale / shape * (s.powf(-shape) - 1.0)
            }
        }
    }
}

/// A value-length distribution: a continuous mixture over disjoint, ascending pieces
/// covering `(0, cap_bytes]`; a draw `x` becomes the length `ceil(x)`.
#[derive(Clone, Debug)]
struct ValueModel {
    pieces: Vec<Piece>,
    cap_bytes: usize,
}

impl ValueModel {
    fn new(pieces: Vec<Piece>, cap_bytes: usize) -> ValueModel {
        assert!(!pieces.is_empty());
        assert_eq!(pieces[0].lo, 0.0);
        assert_eq!(pieces[pieces.len() - 1].hi, cap_bytes as f64);
        for pair in pieces.windows(2) {
            assert_eq!(pair[0].hi, pair[1].lo, "pieces must be contiguous");
        }
        let weight_sum: f64 = pieces.iter().map(|p| p.weight).sum();
        assert!(
            (weight_sum - 1.0).abs() < 1e-12,
            "weights sum to {weight_sum}"
        );
        ValueModel { pieces, cap_bytes }
    }

    /// `P(X <= x)`.
    fn cdf(&self, x: f64) -> f64 {
        let mut below = 0.0;
        for piece in &self.pieces {
            if x <= piece.hi {
                return below + piece.weight * piece.cdf(x);
            }
            below += piece.weight;
        }
        1.0
    }

    /// The inverse of [`ValueModel::cdf`] for `u` in `[0, 1)`.
    fn inverse(&self, u: f64) -> f64 {
        let mut below = 0.0;
        for (i, piece) in self.pieces.iter().enumerate() {
            let last = i + 1 == self.pieces.len();
            if u < below + piece.weight || last {
                let v = ((u - below) / piece.weight).clamp(0.0, 1.0);
                return piece.inverse(v);
            }
            below += piece.weight;
        }
        unreachable!("the last piece always matches")
    }

    fn sample(&self, rng: &mut impl Rng, max_value: usize) -> usize {
        let limit = max_value.min(self.cap_bytes);
        // Conditioning on `ceil(X) <= limit` is conditioning on `X <= limit`: draw the
        // probability from `[0, F(limit))`.
        let u_max = if limit == self.cap_bytes {
            1.0
        } else {
            self.cdf(limit as f64)
        };
        let u = rng.gen::<f64>() * u_max;
        let len = self.inverse(u).ceil() as usize;
        len.clamp(1, limit)
    }

    /// `E[ceil(X) | X <= limit] = sum over j in 0..limit of P(X > j | X <= limit)`.
    fn truncated_mean(&self, max_value: usize) -> f64 {
        let limit = max_value.min(self.cap_bytes);
        let f_limit = self.cdf(limit as f64);
        (0..limit)
            .map(|j| 1.0 - self.cdf(j as f64) / f_limit)
            .sum::<f64>()
    }
}

fn gpd_model(scale: f64, shape: f64, cap_bytes: usize) -> ValueModel {
    ValueModel::new(
        vec![Piece {
            weight: 1.0,
            lo: 0.0,
            hi: cap_bytes as f64,
            spread: Spread::Gpd { scale, shape },
        }],
        cap_bytes,
    )
}

/// ETC per seed 001 §5.2: 90% of values uniform in 16..=512 B. The other 10% follow
/// the Memcached study's GPD fit outside that band, split between "shorter" (1..=15 B)
/// and "longer" (513..=cap B) in the proportion that fit puts there.
fn etc_model() -> ValueModel {
    let (scale, shape) = (ETC_VALUE_GPD_SCALE, ETC_VALUE_GPD_SHAPE);
    let cap = MODEL_VALUE_BYTES_CAP as f64;
    let band_lo = 15.0;
    let band_hi = 512.0;
    let band_weight = 0.9;
    let mass_short = 1.0 - gpd_survival(band_lo, scale, shape);
    let mass_long = gpd_survival(band_hi, scale, shape) - gpd_survival(cap, scale, shape);
    let weight_short = (1.0 - band_weight) * mass_short / (mass_short + mass_long);
    let weight_long = (1.0 - band_weight) - weight_short;
    ValueModel::new(
        vec![
            Piece {
                weight: weight_short,
                lo: 0.0,
                hi: band_lo,
                spread: Spread::Gpd { scale, shape },
            },
            Piece {
                weight: band_weight,
                lo: band_lo,
                hi: band_hi,
                spread: Spread::Uniform,
            },
            Piece {
                weight: weight_long,
                lo: band_hi,
                hi: cap,
                spread: Spread::Gpd { scale, shape },
            },
        ],
        MODEL_VALUE_BYTES_CAP,
    )
}

/// SYS per seed 001 §5.2: 80% of values in 320..=500 B, 8% shorter (uniform in
/// 1..=319 B), 12% in 501..=10,000 B. Within that last range the seed gives no shape;
/// we spread it log-uniformly, the scale-free choice for a long tail.
fn sys_model() -> ValueModel {
    ValueModel::new(
        vec![
            Piece {
                weight: 0.08,
                lo: 0.0,
                hi: 319.0,
                spread: Spread::Uniform,
            },
            Piece {
                weight: 0.80,
                lo: 319.0,
                hi: 500.0,
                spread: Spread::Uniform,
            },
            Piece {
                weight: 0.12,
                lo: 500.0,
                hi: SYS_VALUE_BYTES_CAP as f64,
                spread: Spread::LogUniform,
            },
        ],
        SYS_VALUE_BYTES_CAP,
    )
}

/// The value model of one of the five published size models, built once per process.
fn value_model(sizes: SizeDist) -> &'static ValueModel {
    static MODELS: OnceLock<[ValueModel; 5]> = OnceLock::new();
    let models = MODELS.get_or_init(|| {
        let shape = ROCKSDB_VALUE_GPD_SHAPE;
        [
            gpd_model(ZIPPYDB_VALUE_GPD_SCALE, shape, MODEL_VALUE_BYTES_CAP),
            gpd_model(UP2X_VALUE_GPD_SCALE, shape, MODEL_VALUE_BYTES_CAP),
            gpd_model(UDB_VALUE_GPD_SCALE, shape, MODEL_VALUE_BYTES_CAP),
            etc_model(),
            sys_model(),
        ]
    });
    match sizes {
        SizeDist::ZippyDb => &models[0],
        SizeDist::Up2x => &models[1],
        SizeDist::Udb => &models[2],
        SizeDist::Etc => &models[3],
        SizeDist::Sys => &models[4],
        SizeDist::Fixed { .. } => unreachable!("fixed sizes have no value model"),
    }
}

// ---------------------------------------------------------------------------------
// Record keys
// ---------------------------------------------------------------------------------

/// How many distinct records [`record_key`] can name with `key_bytes`-byte keys
/// (`u64::MAX as u128 + 1` means every `u64`).
pub fn record_keys_max(key_bytes: usize) -> u128 {
    assert!(key_bytes >= 1, "keys are at least one byte long");
    let all = u64::MAX as u128 + 1;
    let decimal = if key_bytes >= RECORD_KEY_PREFIX.len() {
        10u128.checked_pow((key_bytes - RECORD_KEY_PREFIX.len()) as u32)
    } else {
        Some(0)
    };
    // Binary keys: a first byte from 255 values (never the prefix's first byte), then
    // `key_bytes - 1` free bytes.
    let binary = 256u128
        .checked_pow((key_bytes - 1) as u32)
        .and_then(|rest| rest.checked_mul(255));
    match (decimal, binary) {
        (Some(d), Some(b)) => (d + b).min(all),
        _ => all,
    }
}

/// The key of record `i` when every key is `key_bytes` long, written into `out`
/// (cleared first).
///
/// Records below `10^(key_bytes - 4)` get `"user"` and the record number in decimal,
/// zero-padded to fill the key (`user000000000042`) — readable, and what YCSB's keys
/// look like. Records past that, and every record when the key is shorter than five
/// bytes, get a binary key: `i - 10^(key_bytes - 4)` in big-endian base 256 whose
/// first byte skips the value `b'u'`. Decimal keys start with `u`, binary keys never
/// do, and each form is one-to-one, so distinct records always get distinct keys.
///
/// Panics if `i >= record_keys_max(key_bytes)`.
pub fn record_key(i: u64, key_bytes: usize, out: &mut Vec<u8>) {
    assert!(key_bytes >= 1, "keys are at least one byte long");
    out.clear();
    out.resize(key_bytes, 0);
    let prefix = RECORD_KEY_PREFIX;
    let decimal_records: u128 = if key_bytes >= prefix.len() {
        10u128
            .checked_pow((key_bytes - prefix.len()) as u32)
            .unwrap_or(u128::MAX)
    } else {
        0
    };
    if (i as u128) < decimal_records {
        out[..prefix.len()].copy_from_slice(prefix);
        let mut rest = i;
        for byte in out[prefix.len()..].iter_mut().rev() {
            *byte = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        debug_assert_eq!(rest, 0);
        return;
    }
    assert!(
        (i as u128) < record_keys_max(key_bytes),
        "record {i} has no distinct {key_bytes}-byte key"
    );
    let mut rest = i as u128 - decimal_records;
    for byte in out[1..].iter_mut().rev() {
        *byte = (rest % 256) as u8;
        rest /= 256;
    }
    assert!(rest < 255);
    let first = rest as u8;
    out[0] = if first >= prefix[0] { first + 1 } else { first };
}

// ---------------------------------------------------------------------------------
// Zipfian
// ---------------------------------------------------------------------------------

/// `zeta(n, theta) = sum over i in 1..=n of i^-theta`, for `0 < theta < 1`.
///
/// The first [`ZETA_EXACT_TERMS`] terms are added one by one; the rest of the sum is
/// the Euler–Maclaurin formula (integral, endpoint average, and the B2 and B4
/// derivative corrections). The first neglected term is of order
/// `theta^5 * ZETA_EXACT_TERMS^(-theta - 5) / 30240`, below 1e-20, so the result
/// matches the plain O(n) sum to floating-point rounding, at a cost independent of
/// `n` (about a thousand `powf`s, microseconds even for 10^10 items).
pub fn zeta(n: u64, theta: f64) -> f64 {
    assert!(theta > 0.0 && theta < 1.0, "theta {theta} outside (0, 1)");
    if n <= ZETA_EXACT_TERMS {
        return (1..=n).map(|i| (i as f64).powf(-theta)).sum();
    }
    let m = ZETA_EXACT_TERMS as f64;
    let nf = n as f64;
    let head: f64 = (1..ZETA_EXACT_TERMS).map(|i| (i as f64).powf(-theta)).sum();
    let f = |x: f64| x.powf(-theta);
    let d1 = |x: f64| -theta * x.powf(-theta - 1.0);
    let d3 = |x: f64| -theta * (theta + 1.0) * (theta + 2.0) * x.powf(-theta - 3.0);
    // Integral of x^-theta over [m, n], written so that theta near 1 loses no digits.
    let one_minus_theta = 1.0 - theta;
    let integral =
        m.powf(one_minus_theta) * (one_minus_theta * (nf / m).ln()).exp_m1() / one_minus_theta;
    let tail = integral + (f(m) + f(nf)) / 2.0 + (d1(nf) - d1(m)) / 12.0 - (d3(nf) - d3(m)) / 720.0;
    head + tail
}

/// The Zipfian generator of Gray et al. ("Quickly generating billion-record synthetic
/// databases", SIGMOD 1994), as YCSB uses it: ranks `0..items`, rank `r` with
/// probability close to `(r + 1)^-theta / zeta(items, theta)` — exactly that for ranks
/// 0 and 1, an approximation past them.
///
/// Construction costs one [`zeta`] (microseconds whatever `items` is), so each client
/// thread builds its own; there is nothing to share. Growing by a few items (YCSB's
/// "latest", as inserts arrive) adds the new terms one by one.
#[derive(Clone, Debug, PartialEq)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    zetan: f64,
    alpha: f64,
    /// `1 + 0.5^theta`: the probability mass of ranks 0 and 1, times `zetan`.
    zeta2: f64,
    eta: f64,
}

impl Zipfian {
    pub fn new(items: u64, theta: f64) -> Zipfian {
        assert!(items >= 1, "a Zipfian needs at least one item");
        assert!(theta > 0.0 && theta < 1.0, "theta {theta} outside (0, 1)");
        let mut z = Zipfian {
            items,
            theta,
            zetan: zeta(items, theta),
            alpha: 1.0 / (1.0 - theta),
            zeta2: 1.0 + 0.5f64.powf(theta),
            eta: 0.0,
        };
        z.update_eta();
        z
    }

    pub fn items(&self) -> u64 {
        self.items
    }

    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// `zeta(items, theta)`.
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The probability of rank 0, the most popular: `1 / zeta(items, theta)`.
    pub fn top_probability(&self) -> f64 {
        1.0 / self.zetan
    }

    /// Extends the ranks to `0..items`; `items` never shrinks.
    pub fn grow_to(&mut self, items: u64) {
        assert!(items >= self.items, "a Zipfian never shrinks");
        if items - self.items <= ZETA_GROW_INCREMENTAL_MAX {
            for i in self.items + 1..=items {
                self.zetan += (i as f64).powf(-self.theta);
            }
        } else {
            self.zetan = zeta(items, self.theta);
        }
        self.items = items;
        self.update_eta();
    }

    fn update_eta(&mut self) {
        // With one or two items the first two branches of `rank` always decide, and
        // the formula would divide by zero.
        self.eta = if self.items <= 2 {
            0.0
        } else {
            (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2 / self.zetan)
        };
    }

    /// The rank for a uniform draw `u` in `[0, 1)`.
    pub fn rank(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < self.zeta2 {
            return 1;
        }
        let r = self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha);
        (r as u64).min(self.items - 1)
    }

    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        self.rank(rng.gen::<f64>())
    }
}

// ---------------------------------------------------------------------------------
// Permutations
// ---------------------------------------------------------------------------------

/// Fixed key of the permutation that spreads popular Zipfian ranks over the records.
/// The same in every generator, whatever its seed, so all client threads agree on
/// which records are hot — as in YCSB, whose scrambling hash is fixed too.
const POPULARITY_SCRAMBLE_KEY: u64 = 0x526f_7761_6e4b_5631; // "RowanKV1"
/// Fixed key of the permutation that orders the load phase; fixed so that clients
/// loading disjoint strides of it together load every record exactly once.
const LOAD_ORDER_KEY: u64 = 0x4c6f_6164_4f72_6472; // "LoadOrdr"
/// Rounds of the Feistel network; four rounds of a strong mixer make the permutation
/// look random enough for spreading keys (nothing here needs cryptographic strength).
const FEISTEL_ROUNDS: u64 = 4;

/// A 64-bit mixer (the SplitMix64 finaliser): every input bit affects every output bit.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A keyed bijection of `0..n`: a balanced Feistel network over the smallest
/// even-width power of two at least `n`, with cycle-walking to stay inside `0..n`.
/// Unlike YCSB's `hash(rank) % n`, no two ranks land on one record, so each record's
/// popularity is exactly its rank's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    key: u64,
}

impl Permutation {
    pub fn new(n: u64, key: u64) -> Permutation {
        let bits = if n <= 1 {
            0
        } else {
            64 - (n - 1).leading_zeros()
        };
        let half_bits = bits.div_ceil(2).max(1);
        Permutation { n, half_bits, key }
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The image of `x`, for `x < n`.
    pub fn apply(&self, x: u64) -> u64 {
        assert!(x < self.n, "{x} outside 0..{}", self.n);
        // The domain is under 4n, so a walk takes fewer than four steps on average;
        // it ends because `x` lies on a cycle of the bijection that returns to `x`,
        // which is inside `0..n`.
        let mut y = x;
        loop {
            y = self.feistel(y);
            if y < self.n {
                return y;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut left = x >> self.half_bits;
        let mut right = x & mask;
        for round in 0..FEISTEL_ROUNDS {
            let round_key = mix64(self.key ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let f = mix64(right ^ round_key) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

// ---------------------------------------------------------------------------------
// Operations and the generator
// ---------------------------------------------------------------------------------

/// One request of a YCSB client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get {
        record: u64,
    },
    /// Overwrite an existing record.
    Put {
        record: u64,
        value_len: usize,
    },
    /// F: read then write the same record.
    ReadModifyWrite {
        record: u64,
        value_len: usize,
    },
    /// D/Load: a new record.
    Insert {
        record: u64,
        value_len: usize,
    },
}

impl Op {
    pub fn record(&self) -> u64 {
        match *self {
            Op::Get { record }
            | Op::Put { record, .. }
            | Op::ReadModifyWrite { record, .. }
            | Op::Insert { record, .. } => record,
        }
    }

    /// Whether the operation writes (everything but `Get`).
    pub fn is_write(&self) -> bool {
        !matches!(self, Op::Get { .. })
    }
}

/// How a generator picks the record of an operation on an existing record.
#[derive(Clone, Debug)]
enum Chooser {
    Zipfian {
        zipfian: Zipfian,
        scramble: Permutation,
    },
    Uniform,
    Latest {
        zipfian: Zipfian,
    },
}

/// One client thread's stream of operations.
///
/// Records are numbered: `0..records` were loaded before the run; a run's inserts
/// (Load, D) number new records from `records` upwards. Clients sharing a run take
/// disjoint strides of both numberings (see [`Generator::with_client`]).
#[derive(Clone, Debug)]
pub struct Generator {
    workload: Workload,
    keys: KeyDist,
    sizes: SizeDist,
    records: u64,
    max_value: usize,
    rng: ChaCha8Rng,
    chooser: Chooser,
    client: u64,
    clients: u64,
    /// Inserts this generator has issued.
    inserted: u64,
    /// Load-phase positions this generator has issued.
    loaded: u64,
    load_order: Permutation,
}

impl Generator {
    /// `records`: records loaded before the run (at least one unless `workload` is
    /// `Load`). `max_value`: the longest value to draw. `seed`: everything is a
    /// function of it; give each client thread its own.
    pub fn new(
        workload: Workload,
        keys: KeyDist,
        sizes: SizeDist,
        records: u64,
        max_value: usize,
        seed: u64,
    ) -> Generator {
        assert!(
            records >= 1 || workload == Workload::Load,
            "workload {workload} reads records, so it needs at least one loaded"
        );
        assert!(max_value >= 1, "max_value must be at least 1");
        assert!(
            (records as u128) <= record_keys_max(sizes.key_bytes()),
            "{records} records do not fit in {}-byte keys",
            sizes.key_bytes()
        );
        let items = records.max(1);
        let chooser = match keys {
            KeyDist::Zipfian { theta } => Chooser::Zipfian {
                zipfian: Zipfian::new(items, theta),
                scramble: Permutation::new(items, POPULARITY_SCRAMBLE_KEY),
            },
            KeyDist::Uniform => Chooser::Uniform,
            KeyDist::Latest => Chooser::Latest {
                zipfian: Zipfian::new(items, ZIPFIAN_THETA_DEFAULT),
            },
        };
        Generator {
            workload,
            keys,
            sizes,
            records,
            max_value,
            rng: ChaCha8Rng::seed_from_u64(seed),
            chooser,
            client: 0,
            clients: 1,
            inserted: 0,
            loaded: 0,
            load_order: Permutation::new(records, LOAD_ORDER_KEY),
        }
    }

    /// Makes this generator client `client` of `clients` sharing one run: its inserts
    /// number records `records + client + k * clients`, and its load phase issues
    /// load positions `client + k * clients`, so the clients together insert distinct
    /// records and load each record once. "Latest" assumes the clients insert at
    /// about the same rate: it counts `records + inserts * clients` records as
    /// existing, so a read may name a record another client has not inserted yet
    /// (the harness counts it as a miss).
    pub fn with_client(mut self, client: u64, clients: u64) -> Generator {
        assert!(
            clients >= 1 && client < clients,
            "client {client} of {clients}"
        );
        assert_eq!(self.inserted + self.loaded, 0, "set the client before use");
        self.client = client;
        self.clients = clients;
        self
    }

    pub fn workload(&self) -> Workload {
        self.workload
    }

    pub fn key_dist(&self) -> KeyDist {
        self.keys
    }

    pub fn size_dist(&self) -> SizeDist {
        self.sizes
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    /// Records this generator takes to exist: the loaded ones plus the run's inserts
    /// so far (all clients' under the equal-rate assumption of `with_client`).
    pub fn records_known(&self) -> u64 {
        self.records + self.inserted * self.clients
    }

    pub fn next_op(&mut self) -> Op {
        let write = self.rng.gen::<f64>() < self.workload.put_fraction();
        match self.workload {
            Workload::Load => self.insert(),
            Workload::A | Workload::B => {
                let record = self.choose();
                if write {
                    Op::Put {
                        record,
                        value_len: self.value_len(),
                    }
                } else {
                    Op::Get { record }
                }
            }
            Workload::C => Op::Get {
                record: self.choose(),
            },
            Workload::D => {
                if write {
                    self.insert()
                } else {
                    Op::Get {
                        record: self.choose(),
                    }
                }
            }
            Workload::F => {
                let record = self.choose();
                if write {
                    Op::ReadModifyWrite {
                        record,
                        value_len: self.value_len(),
                    }
                } else {
                    Op::Get { record }
                }
            }
        }
    }

    /// Load phase: every record `0..records` once, in a scrambled order, as `Insert`
    /// (this client's stride of it, after `with_client`); then `None`.
    pub fn load_op(&mut self) -> Option<Op> {
        let position = self.client + self.loaded * self.clients;
        if position >= self.records {
            return None;
        }
        self.loaded += 1;
        Some(Op::Insert {
            record: self.load_order.apply(position),
            value_len: self.value_len(),
        })
    }

    fn value_len(&mut self) -> usize {
        self.sizes.sample_value_len(&mut self.rng, self.max_value)
    }

    fn insert(&mut self) -> Op {
        let record = self.records + self.client + self.inserted * self.clients;
        self.inserted += 1;
        if let Chooser::Latest { zipfian } = &mut self.chooser {
            zipfian.grow_to((self.records + self.inserted * self.clients).max(1));
        }
        Op::Insert {
            record,
            value_len: self.value_len(),
        }
    }

    /// The record of an operation on an existing record.
    fn choose(&mut self) -> u64 {
        match &self.chooser {
            Chooser::Zipfian { zipfian, scramble } => {
                let rank = zipfian.sample(&mut self.rng);
                scramble.apply(rank)
            }
            Chooser::Uniform => self.rng.gen_range(0..self.records),
            Chooser::Latest { zipfian } => {
                let newest = zipfian.items() - 1;
                newest - zipfian.sample(&mut self.rng)
            }
        }
    }
}
