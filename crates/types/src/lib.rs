//! Domain newtypes shared by every RowanKV layer.
//!
//! This crate owns the names of the things RowanKV talks about — nodes, shards,
//! terms, versions, remote keys, client request ids — and the time seam (`Clock`).
//! It depends on nothing of RowanKV's and never will: every other crate may depend
//! on it.
//!
//! Invariant: a domain number never travels as a bare integer across a crate
//! boundary; it is wrapped in one of these newtypes so that a `ShardId` cannot be
//! passed where a `NodeId` is expected.
#![forbid(unsafe_code)]

pub mod cpu_model;

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$m])*
        #[derive(
            Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
        )]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    };
}

newtype!(
    /// A machine (server, client or CM) attached to the fabric.
    NodeId(u32),
    "n"
);
newtype!(
    /// A shard: a contiguous range of the 64-bit hashed key space.
    ShardId(u16),
    "shard"
);
newtype!(
    /// The configuration term; a request with an older term is refused.
    Term(u64),
    "t"
);
newtype!(
    /// A 48-bit per-shard version stamped on every log entry.
    Version(u64),
    "v"
);
newtype!(
    /// A segment of a persistent-memory pool.
    SegmentId(u32),
    "seg"
);
newtype!(
    /// The remote key of a registered memory region.
    Rkey(u32),
    "rkey"
);
newtype!(
    /// A queue pair number, unique within one node.
    QpNum(u32),
    "qp"
);

impl Version {
    /// Versions are 48 bits wide on media (seed 000 §4.2.2).
    pub const MAX: Version = Version((1 << 48) - 1);
}

/// The identity of one client request, for exactly-once retries (RIFL, Lee et al.,
/// SOSP 2015): the client that sent it and the sequence number the client gave it.
///
/// - `client` names a client *incarnation*, unique in the cluster for as long as
///   its requests may be retried (the client library draws or is assigned it).
///   **`client` 0 is reserved: it means "no request id"** and is never a valid
///   id — an entry, a request table or a wire frame refuses it
///   ([`RequestId::is_valid`]).
/// - `seq` is the client's sequence number of the request: a new request takes a
///   new (larger) number; a retry of a request reuses its id unchanged, through
///   any connection and to any server. **`seq` is below [`RequestId::SEQ_LIMIT`]**
///   (2^40, the log entry stores 40 bits): a client that reaches it starts a new
///   incarnation (a new `client`) — at a million requests a second, after 12 days.
///
/// Travels with a [`RequestRecord`], which adds the client's acknowledgement
/// floor (`first_incomplete`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId {
    pub client: u64,
    pub seq: u64,
}

impl RequestId {
    /// The reserved client number: "no request id".
    pub const NO_CLIENT: u64 = 0;

    /// Every `seq` is below this: a log entry stores 40 bits of it.
    pub const SEQ_LIMIT: u64 = 1 << 40;

    /// Whether this id names a client (`client != 0`) with a `seq` below
    /// [`RequestId::SEQ_LIMIT`].
    pub fn is_valid(&self) -> bool {
        self.client != Self::NO_CLIENT && self.seq < Self::SEQ_LIMIT
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}#{}", self.client, self.seq)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What a write carries for exactly-once retries, and what its log entry records
/// (`docs/format/log-entry.md`, format version 2): the request's [`RequestId`] and
/// the client's `first_incomplete`.
///
/// `first_incomplete` is RIFL's acknowledgement: the client has received the
/// answer of every one of its requests with a sequence number below it (it is the
/// smallest `seq` of the client still waiting for an answer, this request's own or
/// an older one). So a server may forget those requests' outcomes, and must treat
/// any of them arriving again (a delayed packet, a stale retry) as already answered:
/// never execute it again. Valid records have `first_incomplete <= id.seq` (this
/// request is itself incomplete when it is sent) and a valid `id`
/// ([`RequestRecord::is_valid`]). A client sends a non-decreasing `first_incomplete`.
///
/// A log entry stores the floor as its distance below `seq` in one byte
/// ([`RequestRecord::FLOOR_GAP_MAX`]); a floor further below is stored as "no
/// floor" (`first_incomplete` 0). Lowering a floor is always safe: the server
/// forgets fewer outcomes (each client's are bounded by the request table's
/// window anyway). [`RequestRecord::as_logged`] is the record as every replica
/// reads it back; the client sends, and the primary records, that form.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: RequestId,
    pub first_incomplete: u64,
}

impl RequestRecord {
    /// The largest `seq − first_incomplete` a log entry stores; a larger one is
    /// stored as no floor.
    pub const FLOOR_GAP_MAX: u64 = 254;

    /// An invalid id (client 0, `seq` at or above the limit) is invalid, and so is
    /// `first_incomplete > id.seq`.
    pub fn is_valid(&self) -> bool {
        self.id.is_valid() && self.first_incomplete <= self.id.seq
    }

    /// The record as a log entry stores it: the same, with the floor lowered to 0
    /// when it lies more than [`RequestRecord::FLOOR_GAP_MAX`] below `seq`.
    pub fn as_logged(&self) -> RequestRecord {
        if self.id.seq - self.first_incomplete.min(self.id.seq) > Self::FLOOR_GAP_MAX {
            RequestRecord {
                first_incomplete: 0,
                ..*self
            }
        } else {
            *self
        }
    }
}

impl fmt::Debug for RequestRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}(first_incomplete {})",
            self.id, self.first_incomplete
        )
    }
}

/// The time seam: everything that reads time goes through a `Clock`, so that a
/// simulator can drive time from a seed.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Nanoseconds since an arbitrary fixed origin; never goes backwards.
    fn now_ns(&self) -> u64;

    /// Calendar time, milliseconds since the Unix epoch: what expiry times
    /// (Redis's EX, PX, EXAT, PXAT) are measured against. Unlike `now_ns` it
    /// may jump (the host's clock is set); nothing but expiry reads it.
    fn unix_ms(&self) -> u64;
}

/// The calendar time a [`ManualClock`] reads at its origin (2026-01-01T00:00Z):
/// expiry times in tests and in the simulator look like real ones.
pub const MANUAL_CLOCK_UNIX_MS_ORIGIN: u64 = 1_767_225_600_000;

/// Wall-clock time from `std::time::Instant`.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Arc<Self> {
        Arc::new(SystemClock {
            origin: Instant::now(),
        })
    }
}

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn unix_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock whose calendar time can be stepped, as an operator's `date -s` or
/// an NTP step sets a host's clock: [`Clock::unix_ms`] is the inner clock's
/// plus an offset, [`Clock::now_ns`] (leases, timeouts: the monotonic clock,
/// which no one sets) is the inner clock's, untouched. A server process runs
/// on one so that a chaos run can step it (`rowankv clock-step`).
#[derive(Debug)]
pub struct SteppedClock {
    inner: Arc<dyn Clock>,
    offset_ms: AtomicI64,
}

/// The largest step [`SteppedClock::step`] takes, either way: ten years.
pub const CLOCK_STEP_MS_MAX: i64 = 10 * 366 * 24 * 3600 * 1000;

impl SteppedClock {
    pub fn new(inner: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(SteppedClock {
            inner,
            offset_ms: AtomicI64::new(0),
        })
    }

    /// Step the calendar time by `delta_ms`; the offset from the inner clock
    /// after it. A step larger than [`CLOCK_STEP_MS_MAX`], or one that would
    /// put the offset beyond it, is refused.
    pub fn step(&self, delta_ms: i64) -> Result<i64, String> {
        if delta_ms.unsigned_abs() > CLOCK_STEP_MS_MAX as u64 {
            return Err(format!(
                "a step of {delta_ms} ms: at most {CLOCK_STEP_MS_MAX} ms either way"
            ));
        }
        self.offset_ms
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                let n = o + delta_ms;
                (n.unsigned_abs() <= CLOCK_STEP_MS_MAX as u64).then_some(n)
            })
            .map(|o| o + delta_ms)
            .map_err(|o| format!("the offset {o} ms stepped by {delta_ms} ms is out of range"))
    }

    /// The calendar offset from the inner clock.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Acquire)
    }
}

impl Clock for SteppedClock {
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }

    fn unix_ms(&self) -> u64 {
        self.inner
            .unix_ms()
            .saturating_add_signed(self.offset_ms.load(Ordering::Acquire))
    }
}

/// A clock that only moves when told to: the simulator's and the tests' clock.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: AtomicU64,
}

impl ManualClock {
    pub fn new() -> Arc<Self> {
        Arc::new(ManualClock::default())
    }

    pub fn advance_ns(&self, delta_ns: u64) {
        self.now_ns.fetch_add(delta_ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }

    /// [`MANUAL_CLOCK_UNIX_MS_ORIGIN`] plus the time advanced.
    fn unix_ms(&self) -> u64 {
        MANUAL_CLOCK_UNIX_MS_ORIGIN + self.now_ns() / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stepped_clock_steps_calendar_time_only_and_refuses_huge_steps() {
        let inner = ManualClock::new();
        let clock = SteppedClock::new(inner.clone());
        inner.advance_ns(7_000_000);
        let (ns, ms) = (clock.now_ns(), clock.unix_ms());
        assert_eq!(clock.step(3_600_000), Ok(3_600_000));
        assert_eq!(clock.unix_ms(), ms + 3_600_000);
        assert_eq!(clock.now_ns(), ns, "the monotonic clock is never stepped");
        assert_eq!(clock.step(-7_200_000), Ok(-3_600_000));
        assert_eq!(clock.unix_ms(), ms - 3_600_000);
        assert!(clock.step(CLOCK_STEP_MS_MAX + 1).is_err());
        assert!(clock.step(i64::MIN).is_err());
        assert!(
            clock.step(-CLOCK_STEP_MS_MAX).is_err(),
            "the offset would pass the bound"
        );
        assert_eq!(
            clock.offset_ms(),
            -3_600_000,
            "a refused step changes nothing"
        );
        assert_eq!(clock.step(3_600_000), Ok(0));
        assert_eq!(clock.unix_ms(), ms);
    }

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::new();
        assert_eq!(clock.now_ns(), 0);
        clock.advance_ns(1_500);
        assert_eq!(clock.now_ns(), 1_500);
    }

    #[test]
    fn newtypes_print_with_their_prefix() {
        assert_eq!(format!("{}", NodeId(3)), "n3");
        assert_eq!(format!("{:?}", Rkey(7)), "rkey7");
        assert_eq!(Version::MAX.0, 0xFFFF_FFFF_FFFF);
    }

    #[test]
    fn request_ids_need_a_client_and_records_an_incomplete_seq() {
        let id = RequestId { client: 9, seq: 5 };
        assert!(id.is_valid());
        assert_eq!(format!("{id}"), "c9#5");
        assert!(!RequestId { client: 0, seq: 5 }.is_valid());
        assert!(RequestId {
            client: 9,
            seq: RequestId::SEQ_LIMIT - 1
        }
        .is_valid());
        assert!(!RequestId {
            client: 9,
            seq: RequestId::SEQ_LIMIT
        }
        .is_valid());
        let ok = RequestRecord {
            id,
            first_incomplete: 5,
        };
        assert!(ok.is_valid());
        assert!(!RequestRecord {
            first_incomplete: 6,
            ..ok
        }
        .is_valid());
        assert!(!RequestRecord {
            id: RequestId { client: 0, seq: 5 },
            first_incomplete: 0,
        }
        .is_valid());
    }

    #[test]
    fn a_floor_too_far_below_its_seq_is_logged_as_no_floor() {
        let near = RequestRecord {
            id: RequestId {
                client: 9,
                seq: 1000,
            },
            first_incomplete: 1000 - RequestRecord::FLOOR_GAP_MAX,
        };
        assert_eq!(near.as_logged(), near);
        let far = RequestRecord {
            first_incomplete: near.first_incomplete - 1,
            ..near
        };
        assert_eq!(far.as_logged().first_incomplete, 0);
        assert_eq!(far.as_logged().id, far.id);
    }
}
