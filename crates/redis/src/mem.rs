//! [`MemKeyspace`]: the keyspace in a `BTreeMap`, for tests and a standalone demo.

use std::collections::BTreeMap;

use crate::keyspace::{Expect, Keyspace, KeyspaceError, Record};

/// An in-memory [`Keyspace`]: versions, expiry and conditional writes (it is used
/// from one thread, so every call is atomic).
///
/// Keys are ordered by a 64-bit hash of the key, then the key, and a SCAN cursor is
/// the hash to resume from. So a cursor stays valid while keys come and go (a key
/// live for the whole scan is returned once: the cursor never passes over the hash
/// of a key not yet returned), without a table of cursors. Keys that share a hash
/// are never split across two batches.
///
/// Expired records are dropped when met (a read, a write, a scan, DBSIZE); nothing
/// runs in the background.
#[derive(Clone, Debug, Default)]
pub struct MemKeyspace {
    records: BTreeMap<(u64, Vec<u8>), Record>,
    /// The version the next write gets; versions start at 1.
    version_next: u64,
}

impl MemKeyspace {
    pub fn new() -> MemKeyspace {
        MemKeyspace::default()
    }

    /// Every record, live or not yet dropped, for tests that look inside.
    pub fn records(&self) -> impl Iterator<Item = (&[u8], &Record)> {
        self.records
            .iter()
            .map(|((_, key), record)| (key.as_slice(), record))
    }

    /// The live record of `key`, dropping it first if it has expired.
    fn live(&mut self, key: &[u8], now_ms: u64) -> Option<&Record> {
        let slot = (key_hash(key), key.to_vec());
        if self.records.get(&slot).is_some_and(|r| !r.is_live(now_ms)) {
            self.records.remove(&slot);
        }
        self.records.get(&slot)
    }

    fn next_version(&mut self) -> u64 {
        self.version_next = self.version_next.max(1);
        let version = self.version_next;
        self.version_next += 1;
        version
    }
}

/// FNV-1a, 64 bits: stable across runs and platforms, so cursors are too.
fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in key {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

impl Keyspace for MemKeyspace {
    fn get(&mut self, key: &[u8], now_ms: u64) -> Result<Option<Record>, KeyspaceError> {
        Ok(self.live(key, now_ms).cloned())
    }

    fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        expect: Expect,
        now_ms: u64,
    ) -> Result<u64, KeyspaceError> {
        if !expect.holds(self.live(key, now_ms)) {
            return Err(KeyspaceError::Conflict);
        }
        let version = self.next_version();
        let record = Record {
            value: value.to_vec(),
            expires_at_ms,
            version,
        };
        self.records.insert((key_hash(key), key.to_vec()), record);
        Ok(version)
    }

    fn delete(&mut self, key: &[u8], expect: Expect, now_ms: u64) -> Result<bool, KeyspaceError> {
        if !expect.holds(self.live(key, now_ms)) {
            return Err(KeyspaceError::Conflict);
        }
        let removed = self.records.remove(&(key_hash(key), key.to_vec()));
        Ok(removed.is_some())
    }

    fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        now_ms: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), KeyspaceError> {
        let count = count.max(1);
        let mut keys = Vec::new();
        let mut expired = Vec::new();
        let mut next_cursor = 0;
        for ((hash, key), record) in self.records.range((cursor, Vec::new())..) {
            if keys.len() >= count && keys.last().map(|(h, _)| *h) != Some(*hash) {
                // Resume at this hash. It is above the hash of a key already
                // returned, so it is not 0, which would mean "done".
                next_cursor = *hash;
                break;
            }
            if record.is_live(now_ms) {
                keys.push((*hash, key.clone()));
            } else {
                expired.push((*hash, key.clone()));
            }
        }
        for slot in expired {
            self.records.remove(&slot);
        }
        let keys = keys.into_iter().map(|(_, key)| key).collect();
        Ok((next_cursor, keys))
    }

    fn dbsize(&mut self, now_ms: u64) -> Result<u64, KeyspaceError> {
        self.records.retain(|_, record| record.is_live(now_ms));
        Ok(self.records.len() as u64)
    }

    fn flushall(&mut self) -> Result<(), KeyspaceError> {
        self.records.clear();
        Ok(())
    }
}
