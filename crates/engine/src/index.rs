//! The DRAM index of one shard (paper §5.3 "DRAM indexes"): a concurrent bucket hash
//! table mapping a key's 64-bit hash to the PM address of the key's newest log entry.
//!
//! # What it owns, what it never does
//! It owns the bucket array, the overflow-bucket arena and the writer locks of one
//! shard. It never reads PM: every question about the entry behind an address ("is
//! this the searched key?", "what is its version?") is answered by closures the
//! caller passes in (the engine reads the log entry). It depends on nothing above
//! `std`, `parking_lot` and the domain types, so it can be tested against any model
//! of "PM".
//!
//! # Invariants
//! - One item per key: writers of a bucket chain serialise on that chain's lock
//!   stripe and scan the whole chain before inserting, so two racing inserts of the
//!   same key produce one item.
//! - An item's version never decreases: [`ShardIndex::upsert`] replaces an item only
//!   by an entry of strictly greater version; [`ShardIndex::relocate`] replaces it
//!   only by a copy of the same entry, and only if it still points at the original.
//! - Readers are lock-free: an item is a single `AtomicU64`, changed only by one
//!   store, so a reader sees the old or the new address, never a torn one. Items
//!   never move between slots and overflow buckets are never freed or reused, so a
//!   reader walking a chain cannot be sent into freed memory or a cycle.
//!
//! # Memory layout
//! ```text
//! item (u64):  63            48 47                                0
//!              [ tag: 16 bits ][ PM address: 48 bits, 0 = empty    ]
//!              tag = hash >> 48 (the bits the bucket index does not use)
//!
//! bucket (64 B, one cache line, #[repr(align(64))]):
//!              [ item 0 ] ... [ item 6 ][ next: overflow bucket id, 0 = none ]
//!
//! home bucket of a key = hash & (bucket_count - 1), bucket_count a power of two
//! overflow arena: chunk k holds (overflow_chunk_buckets << k) buckets, allocated on
//!              first use; overflow id n >= 1 lives in chunk/offset derived from n - 1
//! writer locks: min(bucket_count, STRIPES_MAX) cache-line-padded mutexes,
//!              stripe = home bucket & (stripes - 1)
//! ```
//! Geometric chunks keep the chunk table a fixed array of `OnceLock`s, so a reader
//! resolves an overflow id with one atomic load and no lock, while the arena still
//! grows without bound known in advance (up to [`OVERFLOW_CHUNKS_MAX`] chunks).
//!
//! # Limits
//! - Addresses are 1..=[`ADDR_MAX`] (a 256 TiB pool); 0 marks an empty slot.
//! - No resizing: `bucket_count` is fixed at creation; excess load lengthens chains.
//! - Removing an item leaves an empty slot that later inserts into the same chain
//!   reuse; chains never shrink and overflow buckets are never returned.
//! - The closures run while the chain's stripe lock is held (except in `get`); they
//!   must not call back into the same index.
//!
//! # The request table (exactly-once retries)
//! [`RequestTable`] is the other per-shard DRAM index: for each client, the
//! outcomes of its writes to this shard (RIFL's completion records, Lee et al.,
//! SOSP 2015). The engine feeds it from every log entry that carries a request
//! record, on every path that indexes one (see `Engine::request_outcome` and
//! `docs/engine.md`, "Exactly-once retries"); it too never reads PM. Per client it
//! holds a *floor* — the highest `first_incomplete` seen: every seq below it was
//! answered to the client — and `seq → version` for the client's writes at or above
//! the floor. Bounded: at most [`REQUEST_CLIENTS_MAX`] clients (the least recently
//! active is evicted to admit a new one) and [`REQUEST_WINDOW`] outcomes per client
//! (the lowest seq is dropped and the floor raised past it). The state reached from
//! a set of records does not depend on their order, except for which client is
//! evicted: so a backup that digests the same entries in another order, or a
//! restart that reads them in log order, answers as the primary did.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::{Mutex, MutexGuard};
// Client ids are random 64-bit numbers: a fast non-keyed hash is enough.
use rowankv_types::{RequestId, RequestRecord, Version};
use rustc_hash::FxHashMap as HashMap;

/// Bits of an item that hold the PM address.
pub const ADDR_BITS: u32 = 48;
/// Largest valid PM address (byte offset into the pool).
pub const ADDR_MAX: u64 = (1 << ADDR_BITS) - 1;
/// Item slots per bucket: 7 items + the `next` link fill one cache line.
pub const BUCKET_SLOTS: usize = 7;
/// Size of one bucket, one cache line.
pub const BUCKET_SIZE_BYTES: usize = 64;
/// Fewest home buckets an index is created with.
pub const BUCKET_COUNT_MIN: usize = 64;
/// Most home buckets an index may be created with (16 TiB of buckets is no shard).
pub const BUCKET_COUNT_MAX: usize = 1 << 38;
/// Items per home bucket `with_capacity` sizes for (load 4 of 7 slots).
pub const ITEMS_PER_BUCKET_TARGET: usize = 4;
/// Most writer lock stripes per index (each a padded cache line).
pub const STRIPES_MAX: usize = 256;
/// Most overflow chunks; chunk k holds `overflow_chunk_buckets << k` buckets.
pub const OVERFLOW_CHUNKS_MAX: usize = 32;
/// Fewest buckets in overflow chunk 0.
pub const OVERFLOW_CHUNK_BUCKETS_MIN: usize = 4;
/// Overflow chunk 0 holds `bucket_count / OVERFLOW_CHUNK_DIVISOR` buckets: with 4
/// items per bucket expected, about 5% of home buckets overflow (Poisson tail > 7).
const OVERFLOW_CHUNK_DIVISOR: usize = 16;

const _: () = assert!(std::mem::size_of::<Bucket>() == BUCKET_SIZE_BYTES);
const _: () = assert!(std::mem::align_of::<Bucket>() == BUCKET_SIZE_BYTES);
const _: () = assert!(BUCKET_COUNT_MIN.is_power_of_two());
const _: () = assert!(BUCKET_COUNT_MAX.is_power_of_two());
const _: () = assert!(STRIPES_MAX.is_power_of_two());
const _: () = assert!(BUCKET_COUNT_MIN <= STRIPES_MAX);
const _: () = assert!(ITEMS_PER_BUCKET_TARGET < BUCKET_SLOTS);
// The tag takes the hash bits above the address; the bucket index takes low bits,
// so tag and bucket stay independent for every allowed bucket_count.
const _: () = assert!((BUCKET_COUNT_MAX as u64) <= (1 << ADDR_BITS));

/// The tag of a key: the top 16 bits of its hash.
pub fn tag_of(hash: u64) -> u16 {
    (hash >> ADDR_BITS) as u16
}

/// Outcome of [`ShardIndex::upsert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// The key had no item; one now points to the new address.
    Inserted,
    /// The key's item pointed to `old`, whose version was lower; it now points to the
    /// new address.
    Replaced { old: u64 },
    /// The key's item points to `current`, whose version is greater than or equal to
    /// the offered one; nothing changed.
    Stale { current: u64 },
}

fn item_pack(tag: u16, addr: u64) -> u64 {
    (u64::from(tag) << ADDR_BITS) | addr
}

fn item_addr(item: u64) -> u64 {
    item & ADDR_MAX
}

fn item_tag(item: u64) -> u16 {
    (item >> ADDR_BITS) as u16
}

fn assert_addr(addr: u64) {
    assert!(
        addr != 0 && addr <= ADDR_MAX,
        "index address {addr:#x} out of 1..={ADDR_MAX:#x}"
    );
}

#[repr(align(64))]
struct Bucket {
    slots: [AtomicU64; BUCKET_SLOTS],
    /// Overflow bucket id of the next bucket in the chain, 0 = end of chain.
    next: AtomicU64,
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            next: AtomicU64::new(0),
        }
    }
}

/// A writer lock stripe on its own cache line, so neighbouring stripes do not share.
#[repr(align(64))]
struct Stripe(Mutex<()>);

/// The DRAM index of one shard. See the module doc.
pub struct ShardIndex {
    buckets: Box<[Bucket]>,
    bucket_mask: u64,
    stripes: Box<[Stripe]>,
    /// Overflow chunk k holds `overflow_chunk_buckets << k` buckets.
    overflow_chunks: [OnceLock<Box<[Bucket]>>; OVERFLOW_CHUNKS_MAX],
    overflow_chunk_buckets: usize,
    /// Overflow buckets handed out; ids 1..=overflow_count are valid.
    overflow_count: AtomicU64,
    len: AtomicUsize,
}

impl ShardIndex {
    /// An index sized for `items_expected` items at about
    /// [`ITEMS_PER_BUCKET_TARGET`] items per home bucket:
    /// `bucket_count = next_pow2(items_expected / 4)`, at least [`BUCKET_COUNT_MIN`].
    pub fn with_capacity(items_expected: usize) -> ShardIndex {
        let bucket_count = (items_expected / ITEMS_PER_BUCKET_TARGET)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .max(BUCKET_COUNT_MIN);
        assert!(
            bucket_count <= BUCKET_COUNT_MAX,
            "index for {items_expected} items needs {bucket_count} buckets > {BUCKET_COUNT_MAX}"
        );
        let stripe_count = bucket_count.min(STRIPES_MAX);
        ShardIndex {
            buckets: (0..bucket_count).map(|_| Bucket::new()).collect(),
            bucket_mask: bucket_count as u64 - 1,
            stripes: (0..stripe_count).map(|_| Stripe(Mutex::new(()))).collect(),
            overflow_chunks: std::array::from_fn(|_| OnceLock::new()),
            overflow_chunk_buckets: (bucket_count / OVERFLOW_CHUNK_DIVISOR)
                .max(OVERFLOW_CHUNK_BUCKETS_MIN),
            overflow_count: AtomicU64::new(0),
            len: AtomicUsize::new(0),
        }
    }

    /// Lock-free lookup: the address of the item for the key (hash + is_key(addr) confirms a tag match).
    pub fn get(&self, hash: u64, is_key: impl Fn(u64) -> bool) -> Option<u64> {
        let tag = tag_of(hash);
        for bucket in self.chain(hash) {
            for slot in &bucket.slots {
                // Acquire pairs with the writer's Release store, so the entry the
                // writer made visible before publishing the item is visible here.
                let item = slot.load(Ordering::Acquire);
                if item != 0 && item_tag(item) == tag && is_key(item_addr(item)) {
                    return Some(item_addr(item));
                }
            }
        }
        None
    }

    /// Version-conditional insert or update: if an item for this key exists and version_of(existing) >= version, nothing changes (Stale, equal versions included); otherwise the item points to `addr`.
    pub fn upsert(
        &self,
        hash: u64,
        addr: u64,
        version: u64,
        is_key: impl Fn(u64) -> bool,
        version_of: impl Fn(u64) -> u64,
    ) -> Upsert {
        assert_addr(addr);
        let tag = tag_of(hash);
        let item_new = item_pack(tag, addr);
        let _guard = self.lock(hash);
        // The whole chain is scanned before inserting: the key may sit behind an
        // empty slot left by a removal.
        let mut slot_empty: Option<&AtomicU64> = None;
        let mut tail = self.home(hash);
        for bucket in self.chain(hash) {
            tail = bucket;
            for slot in &bucket.slots {
                let item = slot.load(Ordering::Acquire);
                if item == 0 {
                    slot_empty = slot_empty.or(Some(slot));
                    continue;
                }
                if item_tag(item) != tag || !is_key(item_addr(item)) {
                    continue;
                }
                let current = item_addr(item);
                if version_of(current) >= version {
                    return Upsert::Stale { current };
                }
                slot.store(item_new, Ordering::Release);
                return Upsert::Replaced { old: current };
            }
        }
        match slot_empty {
            Some(slot) => slot.store(item_new, Ordering::Release),
            None => {
                // A fresh overflow bucket is all zeros and unreachable until `next`
                // is published, so filling it first and linking it second (Release)
                // lets readers see it complete.
                let id = self.overflow_allocate();
                self.overflow_bucket(id).slots[0].store(item_new, Ordering::Release);
                tail.next.store(id, Ordering::Release);
            }
        }
        self.len.fetch_add(1, Ordering::Relaxed);
        Upsert::Inserted
    }

    /// Cleaning moved an entry: replace the item whose address is exactly `old` by `new` (same key); false if the item no longer points to `old` (a newer write won the race).
    pub fn relocate(&self, hash: u64, old: u64, new: u64) -> bool {
        assert_addr(old);
        assert_addr(new);
        let tag = tag_of(hash);
        let _guard = self.lock(hash);
        match self.find_exact(hash, item_pack(tag, old)) {
            Some(slot) => {
                slot.store(item_pack(tag, new), Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Remove the item whose address is exactly `addr` (e.g. dropping a tombstone); false if not found.
    pub fn remove_exact(&self, hash: u64, addr: u64) -> bool {
        assert_addr(addr);
        let _guard = self.lock(hash);
        match self.find_exact(hash, item_pack(tag_of(hash), addr)) {
            Some(slot) => {
                slot.store(0, Ordering::Release);
                let len_before = self.len.fetch_sub(1, Ordering::Relaxed);
                assert!(len_before > 0, "index len underflow");
                true
            }
            None => false,
        }
    }

    /// Number of items (relaxed counter).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the index holds no item (relaxed counter).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Visit the addresses of the items in home bucket `home`'s chain (weakly
    /// consistent under concurrent writes); `home` must be below
    /// [`ShardIndex::bucket_count`].
    pub fn for_each_in(&self, home: u64, mut f: impl FnMut(u64)) {
        debug_assert!(home < self.bucket_count() as u64);
        for bucket in self.chain(home) {
            for slot in &bucket.slots {
                let item = slot.load(Ordering::Acquire);
                if item != 0 {
                    f(item_addr(item));
                }
            }
        }
    }

    /// Visit every item's address (weakly consistent under concurrent writes).
    pub fn for_each(&self, mut f: impl FnMut(u64)) {
        for home in 0..self.buckets.len() as u64 {
            for bucket in self.chain(home) {
                for slot in &bucket.slots {
                    let item = slot.load(Ordering::Acquire);
                    if item != 0 {
                        f(item_addr(item));
                    }
                }
            }
        }
    }

    /// DRAM bytes used (buckets + overflow), for reports.
    pub fn memory_bytes(&self) -> usize {
        let overflow_buckets: usize = self
            .overflow_chunks
            .iter()
            .filter_map(OnceLock::get)
            .map(|chunk| chunk.len())
            .sum();
        std::mem::size_of::<ShardIndex>()
            + (self.buckets.len() + overflow_buckets) * BUCKET_SIZE_BYTES
            + self.stripes.len() * std::mem::size_of::<Stripe>()
    }

    /// Home buckets (fixed at creation).
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Overflow buckets linked into chains so far.
    pub fn overflow_bucket_count(&self) -> u64 {
        self.overflow_count.load(Ordering::Relaxed)
    }

    fn home(&self, hash: u64) -> &Bucket {
        &self.buckets[(hash & self.bucket_mask) as usize]
    }

    fn lock(&self, hash: u64) -> MutexGuard<'_, ()> {
        let stripe = (hash & self.bucket_mask) as usize & (self.stripes.len() - 1);
        self.stripes[stripe].0.lock()
    }

    fn chain(&self, hash: u64) -> Chain<'_> {
        Chain {
            index: self,
            bucket: Some(self.home(hash)),
            hops: 0,
        }
    }

    /// The slot holding exactly `item`. Caller holds the chain's stripe lock.
    fn find_exact(&self, hash: u64, item: u64) -> Option<&AtomicU64> {
        self.chain(hash)
            .flat_map(|bucket| bucket.slots.iter())
            .find(|slot| slot.load(Ordering::Acquire) == item)
    }

    /// Chunk and offset of overflow bucket `id` (ids start at 1).
    fn overflow_position(&self, id: u64) -> (usize, usize) {
        assert!(id != 0, "overflow id 0 is the end-of-chain mark");
        let base = self.overflow_chunk_buckets as u64;
        let n = id - 1;
        // Chunks 0..k hold base * (2^k - 1) buckets, so chunk k = floor(log2(n/base + 1)).
        let chunk = (63 - (n / base + 1).leading_zeros()) as usize;
        assert!(
            chunk < OVERFLOW_CHUNKS_MAX,
            "overflow arena exhausted: id {id}"
        );
        let chunk_start = base * ((1u64 << chunk) - 1);
        (chunk, (n - chunk_start) as usize)
    }

    fn overflow_bucket(&self, id: u64) -> &Bucket {
        let (chunk, offset) = self.overflow_position(id);
        let buckets = self.overflow_chunks[chunk]
            .get()
            .expect("a linked overflow bucket lies in an allocated chunk");
        &buckets[offset]
    }

    /// Hand out a fresh, all-empty overflow bucket. Caller holds a stripe lock; other
    /// stripes may allocate at the same time, hence the atomic counter.
    fn overflow_allocate(&self) -> u64 {
        let id = self.overflow_count.fetch_add(1, Ordering::AcqRel) + 1;
        let (chunk, _) = self.overflow_position(id);
        let chunk_buckets = self.overflow_chunk_buckets << chunk;
        self.overflow_chunks[chunk]
            .get_or_init(|| (0..chunk_buckets).map(|_| Bucket::new()).collect());
        id
    }
}

impl fmt::Debug for ShardIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardIndex")
            .field("bucket_count", &self.bucket_count())
            .field("overflow_bucket_count", &self.overflow_bucket_count())
            .field("len", &self.len())
            .finish()
    }
}

/// The buckets of one chain, home bucket first. Lock-free: follows `next` links with
/// Acquire loads.
struct Chain<'a> {
    index: &'a ShardIndex,
    bucket: Option<&'a Bucket>,
    hops: u64,
}

impl<'a> Iterator for Chain<'a> {
    type Item = &'a Bucket;

    fn next(&mut self) -> Option<&'a Bucket> {
        let bucket = self.bucket.take()?;
        let next = bucket.next.load(Ordering::Acquire);
        if next != 0 {
            self.hops += 1;
            // Bound on the walk: a chain cannot hold more overflow buckets than
            // exist. The counter was raised before the link was published.
            assert!(
                self.hops <= self.index.overflow_count.load(Ordering::Acquire),
                "index chain longer than the overflow arena: corrupt link"
            );
            self.bucket = Some(self.index.overflow_bucket(next));
        }
        Some(bucket)
    }
}

/// Most clients one shard's [`RequestTable`] holds; admitting one more evicts the
/// least recently active (counted in [`RequestStats::clients_evicted`]).
pub const REQUEST_CLIENTS_MAX: usize = 1024;
/// Most outcomes one client keeps in one shard's [`RequestTable`]: with one more,
/// the lowest seq is dropped and the client's floor raised past it (counted in
/// [`RequestStats::outcomes_evicted`]). A client must keep fewer requests to one
/// shard unanswered (`seq − first_incomplete`) than this, or its oldest ones may
/// read as [`RequestOutcome::Stale`] before it learned their outcome.
pub const REQUEST_WINDOW: usize = 128;

// Worst case per shard: 1024 clients × 128 outcomes × 16 B = 2 MiB.
const _: () = assert!(REQUEST_CLIENTS_MAX * REQUEST_WINDOW * 16 <= 2 << 20);

/// What a shard knows of a client request ([`RequestTable::outcome`],
/// `Engine::request_outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// It was executed: its log entry has this version (durable and indexed on
    /// this replica). Answer the retry with it; do not execute it again.
    Done(Version),
    /// Its seq is below the client's floor: the client has had the answer of every
    /// request below it (or the window dropped it). Must not be executed again;
    /// its outcome is no longer kept.
    Stale,
    /// Not known here: never executed, still in flight (appended, not yet
    /// published), or forgotten (see the documented window).
    Unknown,
}

/// Counters of one shard's [`RequestTable`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestStats {
    /// Clients held now.
    pub clients: usize,
    /// Outcomes held now, over every client.
    pub outcomes: usize,
    /// Clients evicted (least recently active) to admit another, since start.
    pub clients_evicted: u64,
    /// Outcomes dropped because a client had more than [`REQUEST_WINDOW`] above
    /// its floor, since start.
    pub outcomes_evicted: u64,
    /// Requests recorded with two different versions since start (both seen
    /// while the seq was at or above its client's floor): executed twice.
    /// Exactly-once retries keep it at zero (outside the documented window); the
    /// simulator checks it.
    pub executed_twice: u64,
}

/// One client's part of a [`RequestTable`].
#[derive(Debug)]
struct ClientRequests {
    /// Every seq below it is answered (the highest `first_incomplete` seen, or
    /// one past a seq the window dropped).
    floor: u64,
    /// `(seq, version)` of its writes with `seq >= floor`, sorted by seq; at most
    /// `REQUEST_WINDOW`.
    done: VecDeque<(u64, Version)>,
    /// The table's activity tick of its last record.
    active: u64,
}

/// The outcomes of client requests written to one shard (RIFL completion
/// records), fed with every request record the shard indexes. See the module
/// doc, "The request table", and `docs/engine.md`.
#[derive(Debug, Default)]
pub struct RequestTable {
    clients: HashMap<u64, ClientRequests>,
    /// Activity ticks: a client's `active` is the tick of its last record. The
    /// least recently active is found by a scan when a client must be evicted
    /// (rare: the table is full), so a record costs no ordered-map update.
    tick: u64,
    outcomes: usize,
    clients_evicted: u64,
    outcomes_evicted: u64,
    executed_twice: u64,
    /// Where the cleaner keeps a dead entry for its record
    /// ([`RequestTable::keep`]): request → (address, length).
    kept: HashMap<RequestId, (u64, u64)>,
    /// Kept copies whose outcome was forgotten since
    /// [`RequestTable::take_released`]: their bytes are no longer live.
    released: Vec<(u64, u64)>,
}

/// The outcome of `client`'s `seq` is forgotten: a copy kept for it is released.
fn release(
    kept: &mut HashMap<RequestId, (u64, u64)>,
    released: &mut Vec<(u64, u64)>,
    client: u64,
    seq: u64,
) {
    if kept.is_empty() {
        return;
    }
    if let Some(at) = kept.remove(&RequestId { client, seq }) {
        released.push(at);
    }
}

impl RequestTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The write of `request` has an entry of `version` in this shard (whether or
    /// not that entry is its key's latest: the write happened). Raises the client's
    /// floor to `request.first_incomplete`, forgetting outcomes below it, and keeps
    /// `seq → version` if the seq is not below the floor. Seen twice (the same
    /// entry from two paths, or a request that executed twice), the lower version
    /// is kept, so the result does not depend on the order records arrive in. An
    /// invalid record (client 0) is ignored: decoders refuse it before.
    pub fn record(&mut self, request: &RequestRecord, version: Version) {
        if !request.is_valid() {
            return;
        }
        let client = request.id.client;
        let tick = self.tick;
        self.tick += 1;
        if let Some(c) = self.clients.get_mut(&client) {
            c.active = tick;
        } else {
            if self.clients.len() >= REQUEST_CLIENTS_MAX {
                let evicted = self
                    .clients
                    .iter()
                    .min_by_key(|(_, c)| c.active)
                    .map(|(&id, _)| id);
                if let Some((id, gone)) =
                    evicted.and_then(|id| self.clients.remove(&id).map(|g| (id, g)))
                {
                    self.outcomes -= gone.done.len();
                    self.clients_evicted += 1;
                    for &(seq, _) in &gone.done {
                        release(&mut self.kept, &mut self.released, id, seq);
                    }
                }
            }
            self.clients.insert(
                client,
                ClientRequests {
                    floor: 0,
                    done: VecDeque::new(),
                    active: tick,
                },
            );
        }
        let c = self.clients.get_mut(&client).expect("inserted above");
        c.floor = c.floor.max(request.first_incomplete);
        while c.done.front().is_some_and(|&(seq, _)| seq < c.floor) {
            let (seq, _) = c.done.pop_front().expect("checked");
            self.outcomes -= 1;
            release(&mut self.kept, &mut self.released, client, seq);
        }
        let seq = request.id.seq;
        if seq < c.floor {
            return;
        }
        // Seqs mostly arrive in order: above the newest, the search is skipped.
        let at = if c.done.back().is_none_or(|&(last, _)| last < seq) {
            Err(c.done.len())
        } else {
            c.done.binary_search_by_key(&seq, |&(s, _)| s)
        };
        match at {
            Ok(at) => {
                if c.done[at].1 != version {
                    self.executed_twice += 1;
                }
                c.done[at].1 = c.done[at].1.min(version);
            }
            Err(at) => {
                c.done.insert(at, (seq, version));
                self.outcomes += 1;
                if c.done.len() > REQUEST_WINDOW {
                    let (lowest, _) = c.done.pop_front().expect("over the window");
                    c.floor = lowest + 1;
                    self.outcomes -= 1;
                    self.outcomes_evicted += 1;
                    release(&mut self.kept, &mut self.released, client, lowest);
                }
            }
        }
    }

    /// The cleaner copied the dead entry of request `id` to `addr` (`len`
    /// bytes) to keep its record: when the table forgets the outcome, the copy
    /// is released ([`Self::take_released`]). The cleaner keeps one copy per
    /// request: it replaces only the copy it is moving ([`Self::kept_at`]).
    pub fn keep(&mut self, id: RequestId, addr: u64, len: u64) {
        self.kept.insert(id, (addr, len));
    }

    /// Where the copy kept for request `id`'s record is, if one is.
    pub fn kept_at(&self, id: RequestId) -> Option<u64> {
        self.kept.get(&id).map(|&(addr, _)| addr)
    }

    /// The cleaner dropped the copy of `id` at `addr` (no longer needed).
    pub fn unkeep(&mut self, id: RequestId, addr: u64) {
        if self.kept.get(&id).is_some_and(|&(a, _)| a == addr) {
            self.kept.remove(&id);
        }
    }

    /// Whether kept copies were released since the last [`Self::take_released`].
    pub fn has_released(&self) -> bool {
        !self.released.is_empty()
    }

    /// The (address, length) of the kept copies released since the last call.
    pub fn take_released(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.released)
    }

    /// Copies kept for their records now.
    pub fn kept_count(&self) -> usize {
        self.kept.len()
    }

    /// Forget every outcome of a version below `floor` (the entries they
    /// answer for were dropped from the index: `Engine::forget_below`); the
    /// clients' floors stay. Returns how many were forgotten.
    pub fn forget_below(&mut self, floor: Version) -> usize {
        let mut forgotten = 0;
        for (&client, c) in &mut self.clients {
            let before = c.done.len();
            let (kept, released) = (&mut self.kept, &mut self.released);
            c.done.retain(|&(seq, v)| {
                let keep = v >= floor;
                if !keep {
                    release(kept, released, client, seq);
                }
                keep
            });
            forgotten += before - c.done.len();
        }
        self.outcomes -= forgotten;
        forgotten
    }

    /// Every outcome held, as `(record, version)`: the client's floor as the
    /// record's `first_incomplete` (so [`RequestTable::record`] of the list in
    /// any order rebuilds the same floors and outcomes elsewhere).
    pub fn outcomes(&self) -> Vec<(RequestRecord, Version)> {
        let mut out = Vec::with_capacity(self.outcomes);
        for (&client, c) in &self.clients {
            for &(seq, version) in &c.done {
                out.push((
                    RequestRecord {
                        id: RequestId { client, seq },
                        first_incomplete: c.floor,
                    },
                    version,
                ));
            }
        }
        out
    }

    /// What this shard knows of request `id`.
    pub fn outcome(&self, id: RequestId) -> RequestOutcome {
        let Some(c) = self.clients.get(&id.client) else {
            return RequestOutcome::Unknown;
        };
        if id.seq < c.floor {
            return RequestOutcome::Stale;
        }
        match c.done.binary_search_by_key(&id.seq, |&(s, _)| s) {
            Ok(at) => RequestOutcome::Done(c.done[at].1),
            Err(_) => RequestOutcome::Unknown,
        }
    }

    pub fn stats(&self) -> RequestStats {
        RequestStats {
            clients: self.clients.len(),
            outcomes: self.outcomes,
            clients_evicted: self.clients_evicted,
            outcomes_evicted: self.outcomes_evicted,
            executed_twice: self.executed_twice,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_recorded_with_two_versions_counts_as_executed_twice() {
        let mut t = RequestTable::new();
        let r = RequestRecord {
            id: RequestId { client: 3, seq: 9 },
            first_incomplete: 9,
        };
        t.record(&r, Version(40));
        t.record(&r, Version(40)); // the same entry read twice
        assert_eq!(t.stats().executed_twice, 0);
        t.record(&r, Version(41)); // the same request executed again
        assert_eq!(t.stats().executed_twice, 1);
        assert_eq!(t.outcome(r.id), RequestOutcome::Done(Version(40)));
    }
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// Model "PM": records (hash, version) addressed by index + 1.
    #[derive(Default)]
    struct Pm {
        records: RefCell<Vec<(u64, u64)>>,
    }

    impl Pm {
        fn append(&self, hash: u64, version: u64) -> u64 {
            let mut records = self.records.borrow_mut();
            records.push((hash, version));
            records.len() as u64
        }
        fn hash(&self, addr: u64) -> u64 {
            self.records.borrow()[addr as usize - 1].0
        }
        fn version(&self, addr: u64) -> u64 {
            self.records.borrow()[addr as usize - 1].1
        }
        fn put(&self, index: &ShardIndex, hash: u64, version: u64) -> (u64, Upsert) {
            let addr = self.append(hash, version);
            let outcome = index.upsert(
                hash,
                addr,
                version,
                |a| self.hash(a) == hash,
                |a| self.version(a),
            );
            (addr, outcome)
        }
        fn get(&self, index: &ShardIndex, hash: u64) -> Option<u64> {
            index.get(hash, |a| self.hash(a) == hash)
        }
    }

    const H1: u64 = 0x1234_5678_9abc_def0;
    const H2: u64 = 0x4321_8765_cba9_0fed;

    #[test]
    fn index_insert_get_update_stale() {
        let pm = Pm::default();
        let index = ShardIndex::with_capacity(1000);
        assert!(index.is_empty());
        assert_eq!(pm.get(&index, H1), None);

        let (a1, outcome) = pm.put(&index, H1, 10);
        assert_eq!(outcome, Upsert::Inserted);
        assert_eq!(pm.get(&index, H1), Some(a1));
        assert_eq!(pm.get(&index, H2), None);
        assert_eq!(index.len(), 1);

        let (a2, outcome) = pm.put(&index, H1, 11);
        assert_eq!(outcome, Upsert::Replaced { old: a1 });
        assert_eq!(pm.get(&index, H1), Some(a2));

        // Lower and equal versions are ignored.
        let (_, outcome) = pm.put(&index, H1, 5);
        assert_eq!(outcome, Upsert::Stale { current: a2 });
        let (_, outcome) = pm.put(&index, H1, 11);
        assert_eq!(outcome, Upsert::Stale { current: a2 });
        assert_eq!(pm.get(&index, H1), Some(a2));
        assert_eq!(index.len(), 1);

        let (b1, outcome) = pm.put(&index, H2, 1);
        assert_eq!(outcome, Upsert::Inserted);
        assert_eq!(pm.get(&index, H2), Some(b1));
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn index_relocate_and_remove_exact() {
        let pm = Pm::default();
        let index = ShardIndex::with_capacity(0);
        let (a1, _) = pm.put(&index, H1, 1);
        let copy = pm.append(H1, 1);
        assert!(index.relocate(H1, a1, copy));
        assert_eq!(pm.get(&index, H1), Some(copy));
        // The item no longer points to a1: a second relocation of a1 fails.
        assert!(!index.relocate(H1, a1, pm.append(H1, 1)));
        assert_eq!(pm.get(&index, H1), Some(copy));

        // A newer write wins over a relocation of the older copy.
        let (a2, _) = pm.put(&index, H1, 2);
        assert!(!index.relocate(H1, copy, pm.append(H1, 1)));
        assert_eq!(pm.get(&index, H1), Some(a2));
        // Relocating a key that has no item fails.
        assert!(!index.relocate(H2, a2, 99));

        assert!(!index.remove_exact(H1, copy));
        assert_eq!(index.len(), 1);
        assert!(index.remove_exact(H1, a2));
        assert_eq!(pm.get(&index, H1), None);
        assert!(index.is_empty());
        assert!(!index.remove_exact(H1, a2));

        // Reinsert after removal reuses the emptied slot.
        let (a3, outcome) = pm.put(&index, H1, 3);
        assert_eq!(outcome, Upsert::Inserted);
        assert_eq!(pm.get(&index, H1), Some(a3));
        assert_eq!(index.overflow_bucket_count(), 0);
    }

    #[test]
    fn index_same_tag_same_bucket_told_apart_by_is_key() {
        let pm = Pm::default();
        let index = ShardIndex::with_capacity(0);
        // Same tag (0xabcd), same home bucket (low bits 0x05), different keys.
        let h1 = 0xabcd_0000_0000_0105;
        let h2 = 0xabcd_0000_0000_0205;
        assert_eq!(tag_of(h1), tag_of(h2));
        let (a1, _) = pm.put(&index, h1, 1);
        let (a2, outcome) = pm.put(&index, h2, 1);
        assert_eq!(outcome, Upsert::Inserted);
        assert_eq!(pm.get(&index, h1), Some(a1));
        assert_eq!(pm.get(&index, h2), Some(a2));
        let (a3, outcome) = pm.put(&index, h2, 2);
        assert_eq!(outcome, Upsert::Replaced { old: a2 });
        assert_eq!(pm.get(&index, h1), Some(a1));
        assert_eq!(pm.get(&index, h2), Some(a3));
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn index_overflow_chain_holds_100_keys_in_one_bucket() {
        let pm = Pm::default();
        let index = ShardIndex::with_capacity(0);
        let mask = index.bucket_count() as u64 - 1;
        // All keys land in home bucket 7; tags repeat every 10 keys, so both distinct
        // and equal tags share the chain.
        let hashes: Vec<u64> = (0..100u64)
            .map(|i| ((i % 10) << ADDR_BITS) | ((i + 1) << 20) | 7)
            .collect();
        assert!(hashes.iter().all(|h| h & mask == 7));
        let addrs: Vec<u64> = hashes
            .iter()
            .map(|&h| {
                let (addr, outcome) = pm.put(&index, h, 1);
                assert_eq!(outcome, Upsert::Inserted);
                addr
            })
            .collect();
        assert_eq!(index.len(), 100);
        assert!(index.overflow_bucket_count() >= (100 / BUCKET_SLOTS) as u64);
        for (&h, &addr) in hashes.iter().zip(&addrs) {
            assert_eq!(pm.get(&index, h), Some(addr));
        }
        // Updates deep in the chain stay in place, no second item.
        for &h in &hashes {
            let (_, outcome) = pm.put(&index, h, 2);
            assert!(matches!(outcome, Upsert::Replaced { .. }));
        }
        assert_eq!(index.len(), 100);
        // Other buckets are untouched.
        assert_eq!(pm.get(&index, 0xffff_0000_0000_0008), None);
        let mut seen = 0;
        index.for_each(|a| {
            assert_eq!(pm.version(a), 2);
            seen += 1;
        });
        assert_eq!(seen, 100);
        assert!(index.memory_bytes() > index.bucket_count() * BUCKET_SIZE_BYTES);
    }

    #[test]
    fn index_overflow_positions_cover_ids_without_gaps() {
        let index = ShardIndex::with_capacity(0);
        let base = index.overflow_chunk_buckets;
        let mut expected = (0usize, 0usize);
        for id in 1..=(base as u64 * 100) {
            assert_eq!(index.overflow_position(id), expected, "id {id}");
            expected.1 += 1;
            if expected.1 == base << expected.0 {
                expected = (expected.0 + 1, 0);
            }
        }
    }

    #[test]
    fn index_sizing() {
        assert_eq!(
            ShardIndex::with_capacity(0).bucket_count(),
            BUCKET_COUNT_MIN
        );
        assert_eq!(ShardIndex::with_capacity(1000).bucket_count(), 256);
        assert_eq!(ShardIndex::with_capacity(1 << 20).bucket_count(), 1 << 18);
    }

    #[test]
    #[should_panic(expected = "out of 1..=")]
    fn index_rejects_address_zero() {
        ShardIndex::with_capacity(0).upsert(H1, 0, 1, |_| true, |_| 0);
    }

    #[test]
    #[should_panic(expected = "out of 1..=")]
    fn index_rejects_address_above_max() {
        ShardIndex::with_capacity(0).upsert(H1, ADDR_MAX + 1, 1, |_| true, |_| 0);
    }

    /// Model test: random upserts, relocations and removals against a HashMap of
    /// key -> (address, version), with few buckets and few tags to force chains and
    /// tag collisions.
    #[test]
    fn index_matches_model_under_random_operations() {
        const SEED: u64 = 0x5eed_1dec;
        const KEYS: u64 = 300;
        const OPS: usize = 20_000;
        let mut rng = ChaCha8Rng::seed_from_u64(SEED);
        let pm = Pm::default();
        let index = ShardIndex::with_capacity(0);
        let mut model: HashMap<u64, (u64, u64)> = HashMap::default();
        let hash_of = |key: u64| ((key % 3) << ADDR_BITS) | (key << 8) | (key % 5);
        for op in 0..OPS {
            let key = rng.gen_range(0..KEYS);
            let hash = hash_of(key);
            match rng.gen_range(0..10) {
                0..=5 => {
                    let version = rng.gen_range(1..50);
                    let (addr, outcome) = pm.put(&index, hash, version);
                    match model.get(&key).copied() {
                        None => {
                            assert_eq!(outcome, Upsert::Inserted, "seed {SEED} op {op}");
                            model.insert(key, (addr, version));
                        }
                        Some((current, v)) if v >= version => {
                            assert_eq!(outcome, Upsert::Stale { current }, "seed {SEED} op {op}");
                        }
                        Some((old, _)) => {
                            assert_eq!(outcome, Upsert::Replaced { old }, "seed {SEED} op {op}");
                            model.insert(key, (addr, version));
                        }
                    }
                }
                6..=7 => {
                    let stale = rng.gen_bool(0.3);
                    let old = match model.get(&key) {
                        Some(&(addr, _)) if !stale => addr,
                        _ => pm.append(hash, 0),
                    };
                    let new = pm.append(hash, model.get(&key).map_or(0, |e| e.1));
                    let moved = index.relocate(hash, old, new);
                    let expected = model.get(&key).is_some_and(|e| e.0 == old);
                    assert_eq!(moved, expected, "seed {SEED} op {op}");
                    if moved {
                        model.get_mut(&key).expect("present").0 = new;
                    }
                }
                _ => {
                    let addr = match model.get(&key) {
                        Some(&(addr, _)) if rng.gen_bool(0.8) => addr,
                        _ => pm.append(hash, 0),
                    };
                    let removed = index.remove_exact(hash, addr);
                    assert_eq!(removed, model.get(&key).is_some_and(|e| e.0 == addr));
                    if removed {
                        model.remove(&key);
                    }
                }
            }
            assert_eq!(index.len(), model.len(), "seed {SEED} op {op}");
        }
        for key in 0..KEYS {
            assert_eq!(
                pm.get(&index, hash_of(key)),
                model.get(&key).map(|e| e.0),
                "seed {SEED} key {key}"
            );
        }
        let mut addrs = Vec::new();
        index.for_each(|a| addrs.push(a));
        addrs.sort_unstable();
        let mut expected: Vec<u64> = model.values().map(|e| e.0).collect();
        expected.sort_unstable();
        assert_eq!(addrs, expected, "seed {SEED}");
    }

    fn record(table: &mut RequestTable, client: u64, seq: u64, first_incomplete: u64, v: u64) {
        let r = RequestRecord {
            id: RequestId { client, seq },
            first_incomplete,
        };
        table.record(&r, Version(v));
    }

    #[test]
    fn request_table_answers_the_same_whatever_the_order_of_records() {
        // A backup digests a primary's entries in another order than it wrote them.
        let mut rng = ChaCha8Rng::seed_from_u64(0x0dd_0de5);
        let mut records = Vec::new();
        for client in 1..=20u64 {
            let mut first_incomplete = 0;
            for seq in 0..2 * REQUEST_WINDOW as u64 {
                if rng.gen_bool(0.1) {
                    first_incomplete = rng.gen_range(first_incomplete..=seq);
                }
                let version = 1 + records.len() as u64;
                records.push((client, seq, first_incomplete, version));
                if rng.gen_bool(0.05) {
                    // The same request executed twice (a duplicate in the window).
                    records.push((client, seq, first_incomplete, version + 1_000_000));
                }
            }
        }
        let mut in_order = RequestTable::new();
        for &(c, q, f, v) in &records {
            record(&mut in_order, c, q, f, v);
        }
        for _ in 0..4 {
            let mut shuffled = records.clone();
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, rng.gen_range(0..=i));
            }
            let mut table = RequestTable::new();
            for &(c, q, f, v) in &shuffled {
                record(&mut table, c, q, f, v);
            }
            // Whether a duplicate is counted depends on whether it arrives before
            // its seq falls below the floor; everything else is order-free.
            let no_count = |s: RequestStats| RequestStats {
                executed_twice: 0,
                ..s
            };
            assert_eq!(no_count(table.stats()), no_count(in_order.stats()));
            assert!(table.stats().executed_twice > 0);
            for client in 0..=21u64 {
                for seq in 0..2 * REQUEST_WINDOW as u64 + 2 {
                    let id = RequestId { client, seq };
                    assert_eq!(table.outcome(id), in_order.outcome(id), "{id:?}");
                }
            }
        }
        // Each client is past the window: only its newest REQUEST_WINDOW are kept,
        // the first of the duplicates' versions is the answer.
        let stats = in_order.stats();
        assert_eq!(stats.clients, 20);
        assert!(stats.outcomes <= 20 * REQUEST_WINDOW);
        let last = 2 * REQUEST_WINDOW as u64 - 1;
        let (_, _, _, v) = records
            .iter()
            .find(|r| r.0 == 1 && r.1 == last)
            .expect("recorded");
        assert_eq!(
            in_order.outcome(RequestId {
                client: 1,
                seq: last
            }),
            RequestOutcome::Done(Version(*v))
        );
        assert_eq!(
            in_order.outcome(RequestId { client: 1, seq: 0 }),
            RequestOutcome::Stale
        );
        // Client 0 is no client: its records are ignored.
        record(&mut in_order, 0, 5, 0, 9);
        assert_eq!(in_order.stats(), stats);
    }
}
