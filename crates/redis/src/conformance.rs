//! The keyspace conformance suite: what every [`Keyspace`] must do for the command
//! layer to be correct over it, written against the trait only.
//!
//! A backend runs it from a test with a factory of empty keyspaces:
//!
//! ```
//! rowankv_redis::conformance::run_all(rowankv_redis::MemKeyspace::new);
//! ```
//!
//! Each case is a `pub fn` that panics, naming the case, on the first departure
//! from the contract in [`crate::keyspace`]. The suite is compiled always (not
//! only under `cfg(test)`) so that the server crate's tests can run it against the
//! keyspace it implements over the cluster.

use crate::keyspace::{Expect, Keyspace, KeyspaceError};

/// The time the cases run at (any time far from 0 and from `u64::MAX`).
const NOW_MS: u64 = 1_700_000_000_000;

/// Runs every case, each on a fresh keyspace from `make`.
pub fn run_all<K: Keyspace>(mut make: impl FnMut() -> K) {
    conditional_writes(&mut make());
    versions_change_on_every_write(&mut make());
    expiry(&mut make());
    scan_returns_every_live_key(&mut make());
    dbsize_and_flushall(&mut make());
}

/// `Expect::Absent` and `Expect::Version` hold exactly when they should; a
/// condition that does not hold is `Conflict` and changes nothing.
pub fn conditional_writes(keyspace: &mut dyn Keyspace) {
    let case = "conditional_writes";
    let v1 = keyspace
        .put(b"k", b"1", None, Expect::Absent, NOW_MS)
        .unwrap_or_else(|e| panic!("{case}: put on absent key: {e}"));
    assert_eq!(
        keyspace.put(b"k", b"2", None, Expect::Absent, NOW_MS),
        Err(KeyspaceError::Conflict),
        "{case}: Absent on a present key"
    );
    assert_eq!(
        keyspace.put(b"k", b"2", None, Expect::Version(v1 + 1000), NOW_MS),
        Err(KeyspaceError::Conflict),
        "{case}: a wrong version"
    );
    let record = keyspace.get(b"k", NOW_MS).expect("get").expect("present");
    assert_eq!(
        (record.value.as_slice(), record.version),
        (&b"1"[..], v1),
        "{case}: unchanged"
    );
    let v2 = keyspace
        .put(
            b"k",
            b"2",
            Some(NOW_MS + 60_000),
            Expect::Version(v1),
            NOW_MS,
        )
        .unwrap_or_else(|e| panic!("{case}: put on the right version: {e}"));
    assert_eq!(
        keyspace.delete(b"k", Expect::Version(v1), NOW_MS),
        Err(KeyspaceError::Conflict),
        "{case}: delete on a stale version"
    );
    assert_eq!(
        keyspace.delete(b"k", Expect::Version(v2), NOW_MS),
        Ok(true),
        "{case}"
    );
    assert_eq!(keyspace.get(b"k", NOW_MS), Ok(None), "{case}: deleted");
    assert_eq!(
        keyspace.delete(b"k", Expect::Version(v2), NOW_MS),
        Err(KeyspaceError::Conflict),
        "{case}: Version on an absent key"
    );
    assert_eq!(
        keyspace.delete(b"k", Expect::Absent, NOW_MS),
        Ok(false),
        "{case}"
    );
    assert_eq!(
        keyspace.delete(b"k", Expect::Any, NOW_MS),
        Ok(false),
        "{case}"
    );
}

/// Every write gives a version unlike any the key had, even after a delete.
pub fn versions_change_on_every_write(keyspace: &mut dyn Keyspace) {
    let case = "versions_change_on_every_write";
    let mut seen = Vec::new();
    for round in 0..4u8 {
        let version = keyspace
            .put(b"k", &[round], None, Expect::Any, NOW_MS)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(!seen.contains(&version), "{case}: version {version} reused");
        seen.push(version);
        if round == 2 {
            keyspace.delete(b"k", Expect::Any, NOW_MS).expect("delete");
        }
    }
}

/// A record is live up to and including its expiry time and gone after it, for
/// reads, conditions, scans and sizes.
pub fn expiry(keyspace: &mut dyn Keyspace) {
    let case = "expiry";
    let at = NOW_MS + 1_000;
    keyspace
        .put(b"e", b"v", Some(at), Expect::Any, NOW_MS)
        .expect("put");
    let record = keyspace.get(b"e", at).expect("get");
    assert_eq!(
        record.map(|r| r.expires_at_ms),
        Some(Some(at)),
        "{case}: live at its expiry"
    );
    assert_eq!(
        keyspace.get(b"e", at + 1),
        Ok(None),
        "{case}: gone after it"
    );
    assert_eq!(keyspace.dbsize(at + 1), Ok(0), "{case}: not counted");
    let (_, keys) = keyspace.scan(0, 10, at + 1).expect("scan");
    assert!(keys.is_empty(), "{case}: not scanned");
    keyspace
        .put(b"e", b"w", None, Expect::Absent, at + 1)
        .unwrap_or_else(|e| panic!("{case}: an expired key counts as absent: {e}"));
}

/// Scanning from cursor 0 to cursor 0 returns every key live throughout, while
/// other keys are written and deleted between the calls.
pub fn scan_returns_every_live_key(keyspace: &mut dyn Keyspace) {
    let case = "scan_returns_every_live_key";
    let stable: Vec<Vec<u8>> = (0..500u32)
        .map(|i| format!("stable:{i}").into_bytes())
        .collect();
    for key in &stable {
        keyspace
            .put(key, b"v", None, Expect::Any, NOW_MS)
            .expect("put");
    }
    let mut returned = std::collections::HashSet::new();
    let mut cursor = 0;
    let mut finished = false;
    for step in 0..10_000u32 {
        let (next, keys) = keyspace.scan(cursor, 7, NOW_MS).expect("scan");
        returned.extend(keys);
        // Churn between calls.
        let churn = format!("churn:{step}").into_bytes();
        keyspace
            .put(&churn, b"x", None, Expect::Any, NOW_MS)
            .expect("put");
        if step % 2 == 1 {
            let old = format!("churn:{}", step - 1).into_bytes();
            keyspace.delete(&old, Expect::Any, NOW_MS).expect("delete");
        }
        if next == 0 {
            finished = true;
            break;
        }
        cursor = next;
    }
    assert!(finished, "{case}: the scan did not end within 10,000 calls");
    for key in &stable {
        assert!(
            returned.contains(key),
            "{case}: {} missed",
            String::from_utf8_lossy(key)
        );
    }
}

/// DBSIZE counts live keys; FLUSHALL removes them all.
pub fn dbsize_and_flushall(keyspace: &mut dyn Keyspace) {
    let case = "dbsize_and_flushall";
    for i in 0..10u8 {
        keyspace
            .put(&[i], b"v", None, Expect::Any, NOW_MS)
            .expect("put");
    }
    assert_eq!(keyspace.dbsize(NOW_MS), Ok(10), "{case}");
    keyspace.flushall().expect("flushall");
    assert_eq!(keyspace.dbsize(NOW_MS), Ok(0), "{case}");
    assert_eq!(keyspace.get(&[3], NOW_MS), Ok(None), "{case}");
}
