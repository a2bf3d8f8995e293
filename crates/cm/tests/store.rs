//! The coordination store: one conformance suite run against every backend — the
//! embedded store in memory, the embedded store on a file, and a real etcd that
//! each test starts for itself — then the file backend's persistence, crash-safety
//! and corruption handling.
//!
//! Every conformance test is a function of a `Backend`: the store, and the way time
//! passes for its leases (a `ManualClock` for the embedded store; real time for
//! etcd, whose TTLs are whole seconds and whose expiry lags the deadline by up to
//! about half a second). `conformance!` makes one `#[test]` per backend of each. An
//! etcd test whose machine has no etcd prints why and passes without running (see
//! `etcd_process`).

mod etcd_process;

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_cm::store::{CoordStore, EmbeddedStore, Guard, LeaseId, StoreError};
use rowankv_cm::EtcdStore;
use rowankv_types::ManualClock;

use etcd_process::EtcdProcess;

/// The embedded store's lease TTL in these tests (its clock is manual).
const TTL_NS: u64 = 10_000_000;
/// etcd's: 2 s, so that a check 1 s after a grant or renewal has a whole second of
/// margin on a loaded machine (etcd's granularity is 1 s).
const ETCD_TTL_NS: u64 = 2_000_000_000;
const ETCD_SAFE_NS: u64 = 1_000_000_000;
/// How long etcd may take past a lease's deadline to delete it (it checks every
/// 500 ms and deletes through raft): generous, as the machine may be loaded.
const ETCD_EXPIRY_SLACK: Duration = Duration::from_secs(10);
/// A lease that outlives any test.
const LONG_TTL_NS: u64 = 600_000_000_000;

/// A store backend under test, with the way time passes for its leases.
trait Backend {
    fn name(&self) -> &str;
    fn store(&self) -> &dyn CoordStore;
    /// The TTL the tests grant leases with.
    fn ttl_ns(&self) -> u64;
    /// How long after a grant or keep-alive its lease is certainly still alive.
    fn safe_ns(&self) -> u64;
    /// Let `ns` of time pass.
    fn pass_ns(&self, ns: u64);
    /// Let a full TTL pass after `lease` was granted or last renewed, and wait
    /// until the store has acted on its expiry.
    fn expire(&self, lease: LeaseId);
    /// Make the store unreachable, or reachable again with its state intact.
    fn set_available(&self, available: bool);
}

struct Embedded {
    name: &'static str,
    store: EmbeddedStore,
    clock: Arc<ManualClock>,
    _dir: Option<tempfile::TempDir>,
}

impl Embedded {
    fn in_memory() -> Embedded {
        let clock = ManualClock::new();
        Embedded {
            name: "embedded in memory",
            store: EmbeddedStore::in_memory(clock.clone()),
            clock,
            _dir: None,
        }
    }

    fn on_file() -> Embedded {
        let clock = ManualClock::new();
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("coord.json"), clock.clone()).unwrap();
        Embedded {
            name: "embedded on a file",
            store,
            clock,
            _dir: Some(dir),
        }
    }
}

impl Backend for Embedded {
    fn name(&self) -> &str {
        self.name
    }
    fn store(&self) -> &dyn CoordStore {
        &self.store
    }
    fn ttl_ns(&self) -> u64 {
        TTL_NS
    }
    fn safe_ns(&self) -> u64 {
        TTL_NS - 1
    }
    fn pass_ns(&self, ns: u64) {
        self.clock.advance_ns(ns);
    }
    fn expire(&self, _lease: LeaseId) {
        self.clock.advance_ns(TTL_NS);
    }
    fn set_available(&self, available: bool) {
        self.store.set_available(available);
    }
}

struct Etcd {
    process: RefCell<EtcdProcess>,
    store: EtcdStore,
}

impl Etcd {
    /// A fresh etcd with a store on it; `None` if etcd is not installed.
    fn start() -> Option<Etcd> {
        let process = EtcdProcess::start()?;
        let store = process.store("/rowankv/conformance/");
        Some(Etcd {
            process: RefCell::new(process),
            store,
        })
    }
}

impl Backend for Etcd {
    fn name(&self) -> &str {
        "etcd"
    }
    fn store(&self) -> &dyn CoordStore {
        &self.store
    }
    fn ttl_ns(&self) -> u64 {
        ETCD_TTL_NS
    }
    fn safe_ns(&self) -> u64 {
        ETCD_SAFE_NS
    }
    fn pass_ns(&self, ns: u64) {
        std::thread::sleep(Duration::from_nanos(ns));
    }
    fn expire(&self, lease: LeaseId) {
        std::thread::sleep(Duration::from_nanos(ETCD_TTL_NS));
        // Once etcd no longer holds the lease, its keys are gone: etcd deletes them
        // in the same step that drops the lease.
        let deadline = Instant::now() + ETCD_EXPIRY_SLACK;
        while self.store.lease_ttl(lease).unwrap().is_some() {
            assert!(
                Instant::now() < deadline,
                "etcd still holds lease {lease:?} {ETCD_EXPIRY_SLACK:?} after its TTL"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn set_available(&self, available: bool) {
        if available {
            self.process.borrow_mut().restart();
        } else {
            self.process.borrow_mut().kill();
        }
    }
}

/// One `#[test]` per backend for each conformance test.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod embedded_in_memory {
            $( #[test] fn $test() { super::$test(&super::Embedded::in_memory()); } )*
        }
        mod embedded_file {
            $( #[test] fn $test() { super::$test(&super::Embedded::on_file()); } )*
        }
        mod etcd {
            $(
                #[test]
                fn $test() {
                    if let Some(backend) = super::Etcd::start() {
                        super::$test(&backend);
                    }
                }
            )*
        }
    };
}

conformance!(
    put_if_absent_then_compare_on_revision,
    revisions_are_one_store_wide_counter,
    delete_if_compares_on_revision,
    list_by_prefix_is_sorted,
    guarded_put_checks_both_keys,
    lease_expiry_deletes_its_keys,
    keep_alive_before_expiry_extends_by_the_ttl,
    revoke_deletes_keys_now_and_is_idempotent,
    unknown_leases_are_refused,
    putting_without_a_lease_detaches_the_key,
    unavailable_store_fails_every_call_and_changes_nothing,
    oversized_values_are_refused,
    concurrent_compare_and_put_admits_one_winner_per_revision,
);

fn conflict_current(result: Result<impl std::fmt::Debug, StoreError>) -> (String, u64) {
    match result {
        Err(StoreError::Conflict { key, current }) => (key, current),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

fn put_if_absent_then_compare_on_revision(b: &dyn Backend) {
    let s = b.store();
    assert_eq!(s.get("a").unwrap(), None, "{}", b.name());
    let r1 = s.put_if("a", b"one", 0, None).unwrap();
    assert!(r1 > 0);
    assert_eq!(s.get("a").unwrap(), Some((b"one".to_vec(), r1)));

    // Must-be-absent fails now, reporting the current revision.
    assert_eq!(
        conflict_current(s.put_if("a", b"x", 0, None)),
        ("a".to_owned(), r1)
    );
    // A stale revision fails too.
    let r2 = s.put_if("a", b"two", r1, None).unwrap();
    assert!(r2 > r1);
    assert_eq!(conflict_current(s.put_if("a", b"x", r1, None)).1, r2);
    // A revision from the future, and one no store can reach, fail as well.
    assert_eq!(conflict_current(s.put_if("a", b"x", r2 + 1, None)).1, r2);
    assert_eq!(conflict_current(s.put_if("a", b"x", u64::MAX, None)).1, r2);
    assert_eq!(s.get("a").unwrap(), Some((b"two".to_vec(), r2)));
}

fn revisions_are_one_store_wide_counter(b: &dyn Backend) {
    let s = b.store();
    let ra = s.put_if("a", b"", 0, None).unwrap();
    let rb = s.put_if("b", b"", 0, None).unwrap();
    assert!(rb > ra, "{}", b.name());
    // A failed compare takes no revision.
    conflict_current(s.put_if("b", b"", ra, None));
    assert_eq!(s.put_if("c", b"", 0, None).unwrap(), rb + 1);
    // A delete and re-create gives a key a revision it never had before, so a
    // compare on the old revision fails.
    s.delete_if("a", ra).unwrap();
    let ra2 = s.put_if("a", b"", 0, None).unwrap();
    assert!(ra2 > rb);
    assert_eq!(conflict_current(s.put_if("a", b"", ra, None)).1, ra2);
}

fn delete_if_compares_on_revision(b: &dyn Backend) {
    let s = b.store();
    let r = s.put_if("k", b"v", 0, None).unwrap();
    assert_eq!(
        conflict_current(s.delete_if("k", r + 100)),
        ("k".to_owned(), r)
    );
    assert_eq!(conflict_current(s.delete_if("k", 0)).1, r);
    assert!(s.get("k").unwrap().is_some(), "{}", b.name());
    s.delete_if("k", r).unwrap();
    assert_eq!(s.get("k").unwrap(), None);
    // Deleting an absent key: expect 0 is a no-op, anything else a conflict.
    s.delete_if("k", 0).unwrap();
    assert_eq!(conflict_current(s.delete_if("k", r)).1, 0);
    // The no-op took no revision.
    let next = s.put_if("other", b"", 0, None).unwrap();
    let after = s.put_if("other2", b"", 0, None).unwrap();
    assert_eq!(after, next + 1);
}

fn list_by_prefix_is_sorted(b: &dyn Backend) {
    let s = b.store();
    for key in ["/x/c", "/x/a", "/y/a", "/x/b", "/x", "/w/z"] {
        s.put_if(key, key.as_bytes(), 0, None).unwrap();
    }
    let listed: Vec<String> = s
        .list("/x/")
        .unwrap()
        .into_iter()
        .map(|(k, _, _)| k)
        .collect();
    assert_eq!(listed, ["/x/a", "/x/b", "/x/c"], "{}", b.name());
    let all = s.list("").unwrap();
    assert_eq!(all.len(), 6);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
    for (key, value, revision) in &all {
        assert_eq!(value, key.as_bytes());
        assert_eq!(s.get(key).unwrap().unwrap().1, *revision);
    }
    assert!(s.list("/nothing").unwrap().is_empty());
}

fn guarded_put_checks_both_keys(b: &dyn Backend) {
    let s = b.store();
    let g = s.put_if("guard", b"me", 0, None).unwrap();
    let guard = Guard {
        key: "guard".to_owned(),
        revision: g,
    };
    let r = s.put_if_guarded(&guard, "k", b"1", 0, None).unwrap();
    assert!(r > g);
    // The guard moves: the guarded write fails and names the guard key.
    let g2 = s.put_if("guard", b"other", g, None).unwrap();
    assert_eq!(
        conflict_current(s.put_if_guarded(&guard, "k", b"2", r, None)),
        ("guard".to_owned(), g2),
        "{}",
        b.name()
    );
    assert_eq!(s.get("k").unwrap(), Some((b"1".to_vec(), r)));
    // A good guard with a stale key revision fails on the key.
    let guard2 = Guard {
        key: "guard".to_owned(),
        revision: g2,
    };
    assert_eq!(
        conflict_current(s.put_if_guarded(&guard2, "k", b"2", 0, None)),
        ("k".to_owned(), r)
    );
    // Both wrong: the guard is reported.
    assert_eq!(
        conflict_current(s.put_if_guarded(&guard, "k", b"2", 0, None)).0,
        "guard"
    );
    // A guard on an absent key is revision 0.
    let absent = Guard {
        key: "nobody".to_owned(),
        revision: 0,
    };
    let r2 = s.put_if_guarded(&absent, "k", b"3", r, None).unwrap();
    assert_eq!(s.get("k").unwrap(), Some((b"3".to_vec(), r2)));
}

fn lease_expiry_deletes_its_keys(b: &dyn Backend) {
    let s = b.store();
    let lease = s.grant_lease(b.ttl_ns()).unwrap();
    let r = s.put_if("held", b"x", 0, Some(lease)).unwrap();
    s.put_if("free", b"y", 0, None).unwrap();

    b.pass_ns(b.safe_ns());
    assert_eq!(
        s.get("held").unwrap(),
        Some((b"x".to_vec(), r)),
        "{}",
        b.name()
    );
    b.expire(lease);
    assert_eq!(s.get("held").unwrap(), None, "{}", b.name());
    assert!(s.get("free").unwrap().is_some());
    assert!(matches!(s.keep_alive(lease), Err(StoreError::LeaseExpired(l)) if l == lease));
    // A key cannot be attached to an expired lease.
    assert!(matches!(
        s.put_if("held", b"x", 0, Some(lease)),
        Err(StoreError::LeaseExpired(_))
    ));
    assert_eq!(s.get("held").unwrap(), None);
    // The key is absent again, so a new holder can create it.
    let lease2 = s.grant_lease(b.ttl_ns()).unwrap();
    assert_ne!(lease2, lease);
    assert!(s.put_if("held", b"z", 0, Some(lease2)).unwrap() > r);
}

/// The embedded store's expiry is exact: alive 1 ns before the deadline, gone at
/// it. (etcd's TTLs are whole seconds and its expiry lags: not a conformance rule.)
#[test]
fn embedded_lease_expires_exactly_at_its_deadline() {
    for b in [Embedded::in_memory(), Embedded::on_file()] {
        let s = &b.store;
        let lease = s.grant_lease(TTL_NS).unwrap();
        s.put_if("held", b"x", 0, Some(lease)).unwrap();
        b.clock.advance_ns(TTL_NS - 1);
        assert!(s.get("held").unwrap().is_some(), "{}", b.name);
        b.clock.advance_ns(1);
        assert_eq!(s.get("held").unwrap(), None, "{}", b.name);
    }
}

fn keep_alive_before_expiry_extends_by_the_ttl(b: &dyn Backend) {
    let s = b.store();
    let lease = s.grant_lease(b.ttl_ns()).unwrap();
    s.put_if("held", b"x", 0, Some(lease)).unwrap();
    // Five renewals span more than two TTLs.
    for _ in 0..5 {
        b.pass_ns(b.safe_ns());
        s.keep_alive(lease).unwrap();
    }
    assert!(5 * b.safe_ns() > 2 * b.ttl_ns());
    assert!(s.get("held").unwrap().is_some(), "{}", b.name());
    b.expire(lease);
    assert_eq!(s.get("held").unwrap(), None, "{}", b.name());
}

fn revoke_deletes_keys_now_and_is_idempotent(b: &dyn Backend) {
    let s = b.store();
    let lease = s.grant_lease(LONG_TTL_NS).unwrap();
    let other = s.grant_lease(LONG_TTL_NS).unwrap();
    s.put_if("a", b"", 0, Some(lease)).unwrap();
    s.put_if("b", b"", 0, Some(lease)).unwrap();
    s.put_if("c", b"", 0, Some(other)).unwrap();
    s.revoke(lease).unwrap();
    let left: Vec<String> = s.list("").unwrap().into_iter().map(|(k, _, _)| k).collect();
    assert_eq!(left, ["c"], "{}", b.name());
    s.revoke(lease).unwrap();
    assert!(matches!(
        s.keep_alive(lease),
        Err(StoreError::LeaseExpired(_))
    ));
    s.keep_alive(other).unwrap();
}

fn unknown_leases_are_refused(b: &dyn Backend) {
    let s = b.store();
    let never = LeaseId(999);
    assert!(matches!(s.keep_alive(never), Err(StoreError::UnknownLease(l)) if l == never));
    assert!(matches!(s.revoke(never), Err(StoreError::UnknownLease(_))));
    assert!(matches!(
        s.revoke(LeaseId(0)),
        Err(StoreError::UnknownLease(_))
    ));
    assert!(matches!(
        s.keep_alive(LeaseId(0)),
        Err(StoreError::UnknownLease(_))
    ));
    assert!(matches!(
        s.put_if("k", b"", 0, Some(never)),
        Err(StoreError::UnknownLease(_))
    ));
    // Lease 0 is no lease (etcd's "none"), never a silent "no lease".
    assert!(matches!(
        s.put_if("k", b"", 0, Some(LeaseId(0))),
        Err(StoreError::UnknownLease(_))
    ));
    assert!(matches!(
        s.put_if("k", b"", 0, Some(LeaseId(u64::MAX))),
        Err(StoreError::UnknownLease(_))
    ));
    assert_eq!(s.get("k").unwrap(), None, "{}", b.name());
}

fn putting_without_a_lease_detaches_the_key(b: &dyn Backend) {
    let s = b.store();
    let lease = s.grant_lease(b.ttl_ns()).unwrap();
    let r = s.put_if("k", b"1", 0, Some(lease)).unwrap();
    s.put_if("k", b"2", r, None).unwrap();
    let r2 = s.put_if("j", b"3", 0, Some(lease)).unwrap();
    b.expire(lease);
    assert_eq!(s.get("k").unwrap().unwrap().0, b"2", "{}", b.name());
    assert_eq!(s.get("j").unwrap(), None);
    // Re-attaching to another lease moves the key to that lease.
    let lease2 = s.grant_lease(b.ttl_ns()).unwrap();
    let long = s.grant_lease(LONG_TTL_NS).unwrap();
    let rj = s.put_if("j", b"4", 0, Some(lease2)).unwrap();
    assert!(rj > r2);
    s.put_if("j", b"5", rj, Some(long)).unwrap();
    b.expire(lease2);
    assert_eq!(s.get("j").unwrap().unwrap().0, b"5", "{}", b.name());
}

fn unavailable_store_fails_every_call_and_changes_nothing(b: &dyn Backend) {
    let s = b.store();
    // Long enough to outlive an etcd restart.
    let lease = s.grant_lease(LONG_TTL_NS).unwrap();
    let r = s.put_if("k", b"v", 0, None).unwrap();
    b.set_available(false);
    let unavailable = |e: StoreError| match e {
        StoreError::Unavailable(message) => {
            assert!(!message.is_empty());
            true
        }
        _ => false,
    };
    assert!(unavailable(s.get("k").unwrap_err()));
    assert!(unavailable(s.put_if("k", b"w", r, None).unwrap_err()));
    let guard = Guard {
        key: "k".to_owned(),
        revision: r,
    };
    assert!(unavailable(
        s.put_if_guarded(&guard, "j", b"", 0, None).unwrap_err()
    ));
    assert!(unavailable(s.delete_if("k", r).unwrap_err()));
    assert!(unavailable(s.list("").unwrap_err()));
    assert!(unavailable(s.grant_lease(b.ttl_ns()).unwrap_err()));
    assert!(unavailable(s.keep_alive(lease).unwrap_err()));
    assert!(unavailable(s.revoke(lease).unwrap_err()));
    b.set_available(true);
    assert_eq!(
        s.get("k").unwrap(),
        Some((b"v".to_vec(), r)),
        "{}",
        b.name()
    );
    assert_eq!(s.get("j").unwrap(), None);
    s.keep_alive(lease).unwrap();
    assert!(s.put_if("k", b"w", r, None).unwrap() > r);
}

fn oversized_values_are_refused(b: &dyn Backend) {
    let s = b.store();
    let big = vec![0u8; rowankv_cm::store::VALUE_BYTES_MAX + 1];
    assert!(matches!(
        s.put_if("k", &big, 0, None),
        Err(StoreError::LimitExceeded { .. })
    ));
    let long_key = "k".repeat(rowankv_cm::store::KEY_BYTES_MAX + 1);
    assert!(matches!(
        s.put_if(&long_key, b"", 0, None),
        Err(StoreError::LimitExceeded { .. })
    ));
    let guard = Guard {
        key: "g".to_owned(),
        revision: 0,
    };
    assert!(matches!(
        s.put_if_guarded(&guard, "k", &big, 0, None),
        Err(StoreError::LimitExceeded { .. })
    ));
    assert!(s.list("").unwrap().is_empty(), "{}", b.name());
    // The largest key is accepted.
    let longest = "k".repeat(rowankv_cm::store::KEY_BYTES_MAX);
    let r = s.put_if(&longest, b"v", 0, None).unwrap();
    assert_eq!(s.get(&longest).unwrap(), Some((b"v".to_vec(), r)));
}

fn concurrent_compare_and_put_admits_one_winner_per_revision(b: &dyn Backend) {
    let store = b.store();
    // Nothing else writes while the threads run, so every win moves the store's
    // revision by exactly one and every refused compare by none.
    let base = store.put_if("counter", b"start", 0, None).unwrap();
    let threads_count = 8;
    let rounds_count = 50;
    let wins: u32 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads_count)
            .map(|t| {
                scope.spawn(move || {
                    let mut wins = 0u32;
                    for _ in 0..rounds_count {
                        let expect = store.get("counter").unwrap().map_or(0, |(_, r)| r);
                        match store.put_if("counter", &[t], expect, None) {
                            Ok(_) => wins += 1,
                            Err(StoreError::Conflict { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    wins
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(wins >= 1);
    assert_eq!(
        store.get("counter").unwrap().unwrap().1,
        base + u64::from(wins),
        "{}",
        b.name()
    );
}

// ---- The file backend ----------------------------------------------------------

fn store_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("coord.json")
}

fn corrupt_path(result: Result<EmbeddedStore, StoreError>) -> (PathBuf, String) {
    match result {
        Err(StoreError::Corrupt { path, detail }) => (path, detail),
        Err(other) => panic!("expected Corrupt, got {other:?}"),
        Ok(_) => panic!("expected Corrupt, the file opened"),
    }
}

#[test]
fn open_creates_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let store = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    assert!(path.exists());
    assert_eq!(store.path(), Some(path.as_path()));
    assert!(store.list("").unwrap().is_empty());
}

#[test]
fn reopen_finds_every_key_and_revision() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let clock = ManualClock::new();
    let (before, last) = {
        let s = EmbeddedStore::open(&path, clock.clone()).unwrap();
        let r = s.put_if("/a", &[0, 1, 2, 255], 0, None).unwrap();
        s.put_if("/a", b"binary\x00\xff", r, None).unwrap();
        s.put_if("/b", b"", 0, None).unwrap();
        let rc = s.put_if("/c", "ünïcode".as_bytes(), 0, None).unwrap();
        s.delete_if("/c", rc).unwrap();
        let last = s.put_if("/d", b"last", 0, None).unwrap();
        (s.list("").unwrap(), last)
    };
    let s = EmbeddedStore::open(&path, clock).unwrap();
    assert_eq!(s.list("").unwrap(), before);
    // The revision counter carries on from where it was.
    assert!(s.put_if("/e", b"", 0, None).unwrap() > last);
}

#[test]
fn reopen_restarts_every_lease_with_its_full_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let old_clock = ManualClock::new();
    let lease = {
        let s = EmbeddedStore::open(&path, old_clock.clone()).unwrap();
        let lease = s.grant_lease(TTL_NS).unwrap();
        s.put_if("held", b"x", 0, Some(lease)).unwrap();
        old_clock.advance_ns(TTL_NS - 1);
        lease
    };
    // A new process with a clock that starts again from zero: the lease is not
    // expired early, it runs a full ttl from the reopening.
    let clock = ManualClock::new();
    let s = EmbeddedStore::open(&path, clock.clone()).unwrap();
    clock.advance_ns(TTL_NS - 1);
    assert!(s.get("held").unwrap().is_some());
    s.keep_alive(lease).unwrap();
    clock.advance_ns(TTL_NS);
    assert_eq!(s.get("held").unwrap(), None);
    // Lease ids are never reused across a restart.
    assert!(s.grant_lease(TTL_NS).unwrap() > lease);
}

#[test]
fn an_observed_expiry_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let clock = ManualClock::new();
    let lease = {
        let s = EmbeddedStore::open(&path, clock.clone()).unwrap();
        let lease = s.grant_lease(TTL_NS).unwrap();
        s.put_if("held", b"x", 0, Some(lease)).unwrap();
        clock.advance_ns(TTL_NS);
        // A read observes the expiry; the expiry must be durable.
        assert_eq!(s.get("held").unwrap(), None);
        lease
    };
    let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    assert_eq!(s.get("held").unwrap(), None);
    assert!(matches!(
        s.keep_alive(lease),
        Err(StoreError::LeaseExpired(_))
    ));
}

#[test]
fn a_leftover_tmp_file_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let r = {
        let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
        s.put_if("k", b"v", 0, None).unwrap()
    };
    // A crash between writing the temporary file and renaming it.
    let tmp = dir.path().join("coord.json.tmp");
    fs::write(&tmp, b"{\"half\": written").unwrap();
    let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    assert_eq!(s.get("k").unwrap(), Some((b"v".to_vec(), r)));
    // The next write replaces it and the store stays readable.
    s.put_if("k", b"w", r, None).unwrap();
    drop(s);
    let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    assert_eq!(s.get("k").unwrap().unwrap().0, b"w");
}

#[test]
fn a_crash_before_the_first_rename_leaves_a_fresh_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    fs::write(dir.path().join("coord.json.tmp"), b"garbage").unwrap();
    let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    assert!(s.list("").unwrap().is_empty());
}

fn assert_refused_and_untouched(path: &Path, contents: &[u8]) {
    fs::write(path, contents).unwrap();
    let (named, detail) = corrupt_path(EmbeddedStore::open(path, ManualClock::new()));
    assert_eq!(named, path);
    assert!(!detail.is_empty());
    assert_eq!(
        fs::read(path).unwrap(),
        contents,
        "the corrupt file was modified"
    );
}

fn valid_file(dir: &tempfile::TempDir) -> Vec<u8> {
    let path = dir.path().join("valid.json");
    let clock = ManualClock::new();
    let s = EmbeddedStore::open(&path, clock).unwrap();
    let lease = s.grant_lease(TTL_NS).unwrap();
    s.put_if("/rowankv/a", b"alpha", 0, Some(lease)).unwrap();
    s.put_if("/rowankv/b", b"beta", 0, None).unwrap();
    drop(s);
    fs::read(&path).unwrap()
}

#[test]
fn garbage_and_truncated_files_are_corrupt_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let valid = valid_file(&dir);
    assert_refused_and_untouched(&path, b"");
    assert_refused_and_untouched(&path, b"\x00\x01\x02 not json at all \xff");
    assert_refused_and_untouched(&path, b"[]");
    assert_refused_and_untouched(&path, b"{}");
    for cut in [1, valid.len() / 3, valid.len() / 2, valid.len() - 3] {
        assert_refused_and_untouched(&path, &valid[..cut]);
    }
}

#[test]
fn a_file_that_parses_but_was_altered_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let valid = String::from_utf8(valid_file(&dir)).unwrap();
    // "alpha" in hex is 616c706861: alter one digit of the value.
    assert!(valid.contains("616c706861"));
    assert_refused_and_untouched(&path, valid.replace("616c706861", "616c706862").as_bytes());
    // Another format tag or version.
    assert_refused_and_untouched(
        &path,
        valid
            .replace("rowankv-coord-store", "something-else")
            .as_bytes(),
    );
    assert_refused_and_untouched(
        &path,
        valid.replace("\"version\": 1", "\"version\": 2").as_bytes(),
    );
    // An unknown field.
    assert_refused_and_untouched(&path, valid.replacen('{', "{\"extra\": 0,", 1).as_bytes());
}

#[test]
fn a_file_with_inconsistent_state_is_corrupt() {
    // Hand-written states with a correct checksum but broken invariants.
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let cases = [
        // A key newer than the store's revision counter.
        r#"{"revision":1,"next_lease_id":1,"leases":[],"keys":[{"key":"k","value_hex":"","revision":2,"lease":null}]}"#,
        // A key attached to a lease that does not exist.
        r#"{"revision":1,"next_lease_id":1,"leases":[],"keys":[{"key":"k","value_hex":"","revision":1,"lease":3}]}"#,
        // A lease id that was never handed out.
        r#"{"revision":0,"next_lease_id":2,"leases":[{"id":5,"ttl_ns":10}],"keys":[]}"#,
        // A value that is not hex.
        r#"{"revision":1,"next_lease_id":1,"leases":[],"keys":[{"key":"k","value_hex":"xyz","revision":1,"lease":null}]}"#,
        // The same key twice.
        r#"{"revision":2,"next_lease_id":1,"leases":[],"keys":[{"key":"k","value_hex":"","revision":1,"lease":null},{"key":"k","value_hex":"","revision":2,"lease":null}]}"#,
    ];
    for state in cases {
        let crc = crc32c::crc32c(state.as_bytes());
        let file = format!(
            r#"{{"format":"rowankv-coord-store","version":1,"crc32c":{crc},"state":{state}}}"#
        );
        assert_refused_and_untouched(&path, file.as_bytes());
    }
    // The same construction with a consistent state opens: the cases above fail on
    // their invariants, not on the construction.
    let state = r#"{"revision":1,"next_lease_id":2,"leases":[{"id":1,"ttl_ns":10}],"keys":[{"key":"k","value_hex":"00ff","revision":1,"lease":1}]}"#;
    let crc = crc32c::crc32c(state.as_bytes());
    let file =
        format!(r#"{{"format":"rowankv-coord-store","version":1,"crc32c":{crc},"state":{state}}}"#);
    fs::write(&path, file).unwrap();
    let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    assert_eq!(s.get("k").unwrap(), Some((vec![0, 255], 1)));
}

#[test]
fn a_failed_write_leaves_the_store_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    let r = s.put_if("k", b"v", 0, None).unwrap();
    // Make the temporary file impossible to create: a directory in its place.
    fs::create_dir(dir.path().join("coord.json.tmp")).unwrap();
    assert!(matches!(
        s.put_if("k", b"w", r, None),
        Err(StoreError::Io { .. })
    ));
    assert_eq!(s.get("k").unwrap(), Some((b"v".to_vec(), r)));
    fs::remove_dir(dir.path().join("coord.json.tmp")).unwrap();
    let r2 = s.put_if("k", b"w", r, None).unwrap();
    drop(s);
    let s = EmbeddedStore::open(&path, ManualClock::new()).unwrap();
    assert_eq!(s.get("k").unwrap(), Some((b"w".to_vec(), r2)));
}
