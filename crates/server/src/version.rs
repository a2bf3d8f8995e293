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

use std::collections::BTreeSet;

use parking_lot::Mutex;
use rowankv_types::{ShardId, Version};

struct ShardBook {
    next: u64,
    inflight: BTreeSet<u64>,
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
                        inflight: BTreeSet::new(),
                    })
                })
                .collect(),
        }
    }

    /// A new version of `shard`, in flight until [`VersionBook::complete`].
    pub fn allocate(&self, shard: ShardId) -> Option<Version> {
        let mut b = self.shards.get(shard.0 as usize)?.lock();
        let v = b.next;
        if v > Version::MAX.0 {
            return None;
        }
        b.next += 1;
        b.inflight.insert(v);
        Some(Version(v))
    }

    /// The entry of `version` is durable on every replica (or abandoned).
    pub fn complete(&self, shard: ShardId, version: Version) {
        if let Some(b) = self.shards.get(shard.0 as usize) {
            b.lock().inflight.remove(&version.0);
        }
    }

    /// Raise the next version past `version` (a promoted primary, §4.5).
    pub fn raise(&self, shard: ShardId, next: u64) {
        if let Some(b) = self.shards.get(shard.0 as usize) {
            let mut b = b.lock();
            b.next = b.next.max(next);
        }
    }

    /// The shard's CommitVer.
    pub fn commit_version(&self, shard: ShardId) -> u64 {
        self.shards.get(shard.0 as usize).map_or(0, |b| {
            let b = b.lock();
            match b.inflight.first() {
                Some(&f) => f - 1,
                None => b.next - 1,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_version_waits_for_the_oldest_in_flight() {
        let book = VersionBook::new([1, 10]);
        let s = ShardId(0);
        let a = book.allocate(s).unwrap();
        let b = book.allocate(s).unwrap();
        let c = book.allocate(s).unwrap();
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
        assert_eq!(book.allocate(ShardId(1)), Some(Version(100)));
        assert_eq!(book.allocate(ShardId(7)), None, "no such shard");
    }
}
