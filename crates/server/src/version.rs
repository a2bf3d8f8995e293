//! Versions a primary hands out, and its CommitVer per shard (seed 000 §4.4).
//!
//! Every PUT/DEL of a shard takes the shard's next version when its entry is
//! created and holds it *in flight* until every backup has the entry. The shard's
//! CommitVer is the largest version v such that every version ≤ v is no longer in
//! flight: every entry up to it is durable on every replica, or was refused
//! before it was appended. A write whose replication failed stays in flight while
//! it is replicated again (the worker's `repair`), and is completed unpublished
//! only when this server no longer leads its shard, whose new primary gathered it.
//! Allocation and the in-flight set share one lock per shard, so a version is
//! never handed out without being in flight.
//!
//! The book also knows which keys (by hash) have a write in flight, so that a
//! conditional write ([`VersionBook::allocate_if`]) is atomic per key: it takes a
//! version only if no write of its key is in flight and its condition holds on
//! the published value, both checked under the shard's lock; every later write
//! of the key then takes a later version. A conditional write that finds its
//! key in flight is answered Busy, and its client sends it again after a
//! pause; two keys of one hash only make that happen more often.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use rowankv_types::{ShardId, Version};

struct ShardBook {
    next: u64,
    /// Versions in flight and the hash of their key.
    inflight: BTreeMap<u64, u64>,
    /// Writes in flight per key hash.
    keys: HashMap<u64, u32>,
}

/// Why a conditional write took no version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Another write of the key is in flight.
    InFlight,
    /// The condition does not hold on the key's published value.
    Condition,
    /// The shard's versions are used up.
    Exhausted,
    /// The published value could not be read to check the condition.
    ReadFailed,
}

/// Version allocation and CommitVer of every shard of one server.
pub struct VersionBook {
    shards: Vec<Mutex<ShardBook>>,
}

impl VersionBook {
    /// `next[s]`: the first version shard `s` may hand out (from recovery).
    pub fn new(next: impl IntoIterator<Item = u64>) -> VersionBook {
        VersionBook {
            shards: next
                .into_iter()
                .map(|n| {
                    Mutex::new(ShardBook {
                        next: n.max(1),
                        inflight: BTreeMap::new(),
                        keys: HashMap::new(),
                    })
                })
                .collect(),
        }
    }

    /// A new version of `shard` for a write of the key of hash `key`, in
    /// flight until [`VersionBook::complete`].
    pub fn allocate(&self, shard: ShardId, key: u64) -> Option<Version> {
        let mut b = self.shards.get(shard.0 as usize)?.lock();
        b.take(key)
    }

    /// As [`VersionBook::allocate`], for a conditional write: only if no write
    /// of the key is in flight and `holds()` (the condition, read on the
    /// published value; `Err`: it could not be read) is true, both under the
    /// shard's lock.
    pub fn allocate_if(
        &self,
        shard: ShardId,
        key: u64,
        holds: impl FnOnce() -> Result<bool, ()>,
    ) -> Result<Version, Refusal> {
        let mut b = self
            .shards
            .get(shard.0 as usize)
            .ok_or(Refusal::Exhausted)?
            .lock();
        if b.keys.contains_key(&key) {
            return Err(Refusal::InFlight);
        }
        if !holds().map_err(|()| Refusal::ReadFailed)? {
            return Err(Refusal::Condition);
        }
        b.take(key).ok_or(Refusal::Exhausted)
    }

    /// The entry of `version` is durable on every replica (or abandoned).
    pub fn complete(&self, shard: ShardId, version: Version) {
        if let Some(b) = self.shards.get(shard.0 as usize) {
            let mut b = b.lock();
            if let Some(key) = b.inflight.remove(&version.0) {
                if let Some(n) = b.keys.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        b.keys.remove(&key);
                    }
                }
            }
        }
    }

    /// Raise the next version past `version` (a promoted primary, §4.5).
    pub fn raise(&self, shard: ShardId, next: u64) {
        if let Some(b) = self.shards.get(shard.0 as usize) {
            let mut b = b.lock();
            b.next = b.next.max(next);
        }
    }

    /// The next version `shard` hands out.
    pub fn next(&self, shard: ShardId) -> u64 {
        self.shards
            .get(shard.0 as usize)
            .map_or(0, |b| b.lock().next)
    }

    /// Whether no version of `shard` is in flight (a migration's source hands
    /// the shard over only then, §4.6).
    pub fn idle(&self, shard: ShardId) -> bool {
        self.shards
            .get(shard.0 as usize)
            .is_none_or(|b| b.lock().inflight.is_empty())
    }

    /// The shard's CommitVer.
    pub fn commit_version(&self, shard: ShardId) -> u64 {
        self.shards.get(shard.0 as usize).map_or(0, |b| {
            let b = b.lock();
            match b.inflight.first_key_value() {
                Some((&f, _)) => f - 1,
                None => b.next - 1,
            }
        })
    }
}

impl ShardBook {
    fn take(&mut self, key: u64) -> Option<Version> {
        let v = self.next;
        if v > Version::MAX.0 {
            return None;
        }
        self.next += 1;
        self.inflight.insert(v, key);
        *self.keys.entry(key).or_default() += 1;
        Some(Version(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_version_waits_for_the_oldest_in_flight() {
        let book = VersionBook::new([1, 10]);
        let s = ShardId(0);
        let a = book.allocate(s, 1).unwrap();
        let b = book.allocate(s, 2).unwrap();
        let c = book.allocate(s, 1).unwrap();
        assert_eq!((a.0, b.0, c.0), (1, 2, 3));
        assert_eq!(book.commit_version(s), 0);
        book.complete(s, b);
        assert_eq!(book.commit_version(s), 0, "1 still in flight");
        book.complete(s, a);
        assert_eq!(book.commit_version(s), 2);
        book.complete(s, c);
        assert_eq!(book.commit_version(s), 3);
        assert_eq!(book.commit_version(ShardId(1)), 9);
        book.raise(ShardId(1), 100);
        assert_eq!(book.allocate(ShardId(1), 1), Some(Version(100)));
        assert_eq!(book.allocate(ShardId(7), 1), None, "no such shard");
    }

    #[test]
    fn a_conditional_write_waits_for_every_write_of_its_key() {
        let book = VersionBook::new([1]);
        let s = ShardId(0);
        let a = book.allocate(s, 7).unwrap();
        let b = book.allocate(s, 7).unwrap();
        assert_eq!(book.allocate_if(s, 7, || Ok(true)), Err(Refusal::InFlight));
        assert_eq!(
            book.allocate_if(s, 8, || Ok(false)),
            Err(Refusal::Condition)
        );
        let other = book.allocate_if(s, 8, || Ok(true)).unwrap();
        assert_eq!(other, Version(3));
        assert_eq!(book.allocate_if(s, 8, || Ok(true)), Err(Refusal::InFlight));
        book.complete(s, a);
        assert_eq!(
            book.allocate_if(s, 7, || Ok(true)),
            Err(Refusal::InFlight),
            "b"
        );
        book.complete(s, b);
        let mut checked = false;
        let c = book.allocate_if(s, 7, || {
            checked = true;
            Ok(true)
        });
        assert_eq!(c, Ok(Version(4)));
        assert!(checked);
        book.complete(s, other);
        book.complete(s, c.unwrap());
        assert_eq!(book.commit_version(s), 4);
        assert_eq!(book.allocate_if(s, 9, || Err(())), Err(Refusal::ReadFailed));
        assert_eq!(book.allocate_if(s, 7, || Ok(true)), Ok(Version(5)));
    }
}
