//! The coordination store: a small, strongly consistent key-value map with
//! compare-and-put and leases, behind the `CoordStore` trait.
//!
//! The trait follows the shape of etcd's v3 API (a store-wide revision counter,
//! compare on a key's modification revision, keys attached to leases) so that an
//! etcd backend can implement it without changing the configuration manager.
//! `EmbeddedStore` is the single-process backend: the whole state in memory,
//! persisted to one file after every mutation.
//!
//! # Revisions
//! Every successful mutation takes the next value of one store-wide counter, as in
//! etcd. A key's revision is the revision of the last write to it; 0 means "absent".
//! A compare on revision therefore detects any intervening write, including a
//! delete followed by a re-create.
//!
//! # Leases
//! A lease has a time-to-live; a key put with a lease is deleted when the lease
//! expires or is revoked. Expiry is evaluated lazily against the store's `Clock` at
//! the start of every call, so a simulator driving a `ManualClock` sees keys vanish
//! exactly when its time passes the deadline. An expiry that deletes keys is made
//! durable before the call that observed it returns: a reader that was told "the
//! key is gone" must never see it come back after a restart.
//!
//! # The file
//! JSON, written whole on every mutation: to `<path>.tmp`, fsync, rename over
//! `<path>`, fsync the directory. A crash leaves either the old or the new file, and
//! at most a stale `.tmp` that `open` ignores. The state carries a CRC-32C so that a
//! file damaged in a way that still parses is refused rather than trusted. A file
//! that cannot be read as a store is a `Corrupt` error naming it; it is never
//! replaced by an empty store.
//!
//! Lease deadlines are not persisted, only each lease's granted TTL. On reopen every
//! lease restarts its full TTL from the reopening time, because the monotonic clock
//! of a new process is not comparable with the old one's, and a restart that grants
//! more time never expires a live holder early; it can only delay a takeover by at
//! most one TTL.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_types::Clock;
use serde::{Deserialize, Serialize};

/// A store-wide modification counter; 0 means "absent".
pub type Revision = u64;

/// A lease granted by the store. Ids are never reused, also across restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// The longest key the store accepts.
pub const KEY_BYTES_MAX: usize = 4096;
/// The largest value the store accepts (a configuration of thousands of shards is
/// far below this).
pub const VALUE_BYTES_MAX: usize = 8 << 20;
/// The most keys the store holds.
pub const KEYS_MAX: usize = 1 << 16;
/// The most live leases the store holds.
pub const LEASES_MAX: usize = 1 << 16;

/// A guard for `put_if_guarded`: the write happens only if `key` is at `revision`
/// (0: absent). This is etcd's two-key transaction, and is how a CM fences its
/// configuration writes on still holding the active-CM key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub key: String,
    pub revision: Revision,
}

/// The coordination service as the configuration manager needs it.
pub trait CoordStore: Send + Sync {
    /// The value and revision of `key`, or `None` if absent.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, Revision)>, StoreError>;

    /// Put only if the key's revision is `expect` (0: must be absent). Returns the
    /// new revision; `Err(Conflict { current })` otherwise. With `lease`, the key is
    /// deleted when that lease expires or is revoked.
    fn put_if(
        &self,
        key: &str,
        value: &[u8],
        expect: Revision,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError>;

    /// `put_if`, and atomically also only if `guard.key` is at `guard.revision`.
    /// A failed guard is `Err(Conflict)` naming the guard key.
    fn put_if_guarded(
        &self,
        guard: &Guard,
        key: &str,
        value: &[u8],
        expect: Revision,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError>;

    /// Delete only if the key's revision is `expect`. Deleting an absent key with
    /// `expect == 0` succeeds and changes nothing.
    fn delete_if(&self, key: &str, expect: Revision) -> Result<(), StoreError>;

    /// Keys starting with `prefix`, sorted, with their values and revisions.
    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>, Revision)>, StoreError>;

    /// Grant a lease that expires `ttl_ns` from now unless kept alive. `ttl_ns` must
    /// be positive (a zero ttl is a programmer error).
    fn grant_lease(&self, ttl_ns: u64) -> Result<LeaseId, StoreError>;

    /// Extend a lease by its TTL from now. `Err(LeaseExpired)` if it already expired
    /// or was revoked (its keys are gone); `Err(UnknownLease)` if never granted.
    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError>;

    /// End a lease now and delete its keys. Revoking a lease that is already gone
    /// succeeds; a lease never granted is `Err(UnknownLease)`.
    fn revoke(&self, lease: LeaseId) -> Result<(), StoreError>;
}

/// Why a store call failed. `Conflict`, `LeaseExpired`, `UnknownLease` and
/// `LimitExceeded` mean the call changed nothing. After `Io` or `Unavailable` the
/// embedded store also changed nothing, but a remote backend may not know whether a
/// mutation landed: callers re-read to find out.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("compare failed on key {key:?}: its revision is {current}")]
    Conflict { key: String, current: Revision },
    #[error("lease {0:?} has expired")]
    LeaseExpired(LeaseId),
    #[error("lease {0:?} was never granted by this store")]
    UnknownLease(LeaseId),
    #[error("i/o error on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("coordination store file {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("coordination store unavailable: {0}")]
    Unavailable(String),
    #[error("{what} exceeds the limit of {max}")]
    LimitExceeded { what: &'static str, max: usize },
}

#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    revision: Revision,
    lease: Option<LeaseId>,
}

#[derive(Clone, Copy, Debug)]
struct Lease {
    ttl_ns: u64,
    deadline_ns: u64,
}

#[derive(Clone, Debug)]
struct State {
    revision: Revision,
    /// The id the next granted lease gets; ids below it were granted once.
    next_lease_id: u64,
    keys: BTreeMap<String, Entry>,
    leases: BTreeMap<LeaseId, Lease>,
}

impl State {
    fn new() -> State {
        State {
            revision: 0,
            // Lease 0 is reserved, as in etcd, so that no lease id reads as "none".
            next_lease_id: 1,
            keys: BTreeMap::new(),
            leases: BTreeMap::new(),
        }
    }

    /// Drop every lease whose deadline has passed, with its keys. True if anything
    /// durable changed.
    fn expire(&mut self, now_ns: u64) -> bool {
        let expired: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.deadline_ns <= now_ns)
            .map(|(id, _)| *id)
            .collect();
        if expired.is_empty() {
            return false;
        }
        for id in &expired {
            self.drop_lease(*id);
        }
        true
    }

    /// Remove a lease and the keys attached to it. Deleting keys takes a revision.
    fn drop_lease(&mut self, id: LeaseId) {
        self.leases.remove(&id);
        let before = self.keys.len();
        self.keys.retain(|_, entry| entry.lease != Some(id));
        if self.keys.len() != before {
            self.revision += 1;
        }
    }

    fn key_revision(&self, key: &str) -> Revision {
        self.keys.get(key).map_or(0, |entry| entry.revision)
    }

    fn check_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        if self.leases.contains_key(&lease) {
            Ok(())
        } else if lease.0 != 0 && lease.0 < self.next_lease_id {
            Err(StoreError::LeaseExpired(lease))
        } else {
            Err(StoreError::UnknownLease(lease))
        }
    }

    fn put_if(
        &mut self,
        key: &str,
        value: &[u8],
        expect: Revision,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        if key.len() > KEY_BYTES_MAX {
            return Err(StoreError::LimitExceeded {
                what: "key length",
                max: KEY_BYTES_MAX,
            });
        }
        if value.len() > VALUE_BYTES_MAX {
            return Err(StoreError::LimitExceeded {
                what: "value length",
                max: VALUE_BYTES_MAX,
            });
        }
        let current = self.key_revision(key);
        if current != expect {
            return Err(StoreError::Conflict {
                key: key.to_owned(),
                current,
            });
        }
        if current == 0 && self.keys.len() >= KEYS_MAX {
            return Err(StoreError::LimitExceeded {
                what: "number of keys",
                max: KEYS_MAX,
            });
        }
        if let Some(lease) = lease {
            self.check_lease(lease)?;
        }
        self.revision += 1;
        self.keys.insert(
            key.to_owned(),
            Entry {
                value: value.to_vec(),
                revision: self.revision,
                lease,
            },
        );
        Ok(self.revision)
    }
}

/// The single-process coordination store: in memory, optionally persisted to one
/// file. Thread-safe; every call is atomic with respect to every other. One file is
/// opened by one `EmbeddedStore` at a time (nothing locks the file: two would
/// overwrite each other's state).
pub struct EmbeddedStore {
    clock: Arc<dyn Clock>,
    /// `None`: in memory only.
    path: Option<PathBuf>,
    available: AtomicBool,
    state: Mutex<State>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.path)
            .field("available", &self.available.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// A store that lives only as long as this value.
    pub fn in_memory(clock: Arc<dyn Clock>) -> EmbeddedStore {
        EmbeddedStore {
            clock,
            path: None,
            available: AtomicBool::new(true),
            state: Mutex::new(State::new()),
        }
    }

    /// Open the store persisted at `path`, creating an empty one if the file does
    /// not exist. A leftover `<path>.tmp` from an interrupted write is ignored.
    pub fn open(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<EmbeddedStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let state = match fs::read(&path) {
            Ok(bytes) => decode_file(&path, &bytes, clock.now_ns())?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let state = State::new();
                persist(&path, &state)?;
                state
            }
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        Ok(EmbeddedStore {
            clock,
            path: Some(path),
            available: AtomicBool::new(true),
            state: Mutex::new(state),
        })
    }

    /// The file this store persists to, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// While unavailable, every call fails with `Unavailable` and changes nothing,
    /// and time does not expire leases on its behalf: a test stand-in for a
    /// partitioned or crashed coordination service.
    pub fn set_available(&self, available: bool) {
        self.available.store(available, Ordering::SeqCst);
    }

    fn check_available(&self) -> Result<(), StoreError> {
        if self.available.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(StoreError::Unavailable(
                "embedded store switched off".to_owned(),
            ))
        }
    }

    fn persist(&self, state: &State) -> Result<(), StoreError> {
        match &self.path {
            Some(path) => persist(path, state),
            None => Ok(()),
        }
    }

    /// Lock, expire leases (persisting the expiry), and run `read` on the state.
    fn read<R>(&self, read: impl FnOnce(&State) -> R) -> Result<R, StoreError> {
        self.check_available()?;
        let mut state = self.state.lock();
        self.expire(&mut state)?;
        Ok(read(&state))
    }

    /// Lock, expire leases, and run `mutate` on a copy of the state; if it succeeds,
    /// persist the copy and only then install it. A failed mutation or a failed
    /// write leaves the store as it was (apart from the expiry, already durable).
    fn mutate<R>(
        &self,
        mutate: impl FnOnce(&mut State, u64) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.check_available()?;
        let mut state = self.state.lock();
        let now_ns = self.expire(&mut state)?;
        let mut next = state.clone();
        let result = mutate(&mut next, now_ns)?;
        self.persist(&next)?;
        *state = next;
        Ok(result)
    }

    /// Expire due leases; returns the time it used.
    fn expire(&self, state: &mut State) -> Result<u64, StoreError> {
        let now_ns = self.clock.now_ns();
        if state
            .leases
            .values()
            .any(|lease| lease.deadline_ns <= now_ns)
        {
            let mut next = state.clone();
            next.expire(now_ns);
            self.persist(&next)?;
            *state = next;
        }
        Ok(now_ns)
    }
}

impl CoordStore for EmbeddedStore {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, Revision)>, StoreError> {
        self.read(|state| {
            state
                .keys
                .get(key)
                .map(|entry| (entry.value.clone(), entry.revision))
        })
    }

    fn put_if(
        &self,
        key: &str,
        value: &[u8],
        expect: Revision,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        self.mutate(|state, _| state.put_if(key, value, expect, lease))
    }

    fn put_if_guarded(
        &self,
        guard: &Guard,
        key: &str,
        value: &[u8],
        expect: Revision,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        self.mutate(|state, _| {
            let current = state.key_revision(&guard.key);
            if current != guard.revision {
                return Err(StoreError::Conflict {
                    key: guard.key.clone(),
                    current,
                });
            }
            state.put_if(key, value, expect, lease)
        })
    }

    fn delete_if(&self, key: &str, expect: Revision) -> Result<(), StoreError> {
        // An absent key deleted with expect 0 is a no-op: skip the write.
        if self.read(|state| state.key_revision(key))? == 0 && expect == 0 {
            return Ok(());
        }
        self.mutate(|state, _| {
            let current = state.key_revision(key);
            if current != expect {
                return Err(StoreError::Conflict {
                    key: key.to_owned(),
                    current,
                });
            }
            if current != 0 {
                state.keys.remove(key);
                state.revision += 1;
            }
            Ok(())
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>, Revision)>, StoreError> {
        self.read(|state| {
            state
                .keys
                .range::<str, _>((
                    std::ops::Bound::Included(prefix),
                    std::ops::Bound::Unbounded,
                ))
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(key, entry)| (key.clone(), entry.value.clone(), entry.revision))
                .collect()
        })
    }

    fn grant_lease(&self, ttl_ns: u64) -> Result<LeaseId, StoreError> {
        assert!(ttl_ns > 0, "a lease needs a positive time-to-live");
        self.mutate(|state, now_ns| {
            if state.leases.len() >= LEASES_MAX {
                return Err(StoreError::LimitExceeded {
                    what: "number of leases",
                    max: LEASES_MAX,
                });
            }
            let id = LeaseId(state.next_lease_id);
            state.next_lease_id += 1;
            state.leases.insert(
                id,
                Lease {
                    ttl_ns,
                    deadline_ns: now_ns.saturating_add(ttl_ns),
                },
            );
            Ok(id)
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        // Deadlines are not persisted (see the module doc), so a renewal is a
        // change in memory only, with no file write.
        self.check_available()?;
        let mut state = self.state.lock();
        let now_ns = self.expire(&mut state)?;
        state.check_lease(lease)?;
        let entry = state
            .leases
            .get_mut(&lease)
            .expect("check_lease found the lease");
        entry.deadline_ns = now_ns.saturating_add(entry.ttl_ns);
        Ok(())
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.mutate(|state, _| match state.check_lease(lease) {
            Ok(()) => {
                state.drop_lease(lease);
                Ok(())
            }
            Err(StoreError::LeaseExpired(_)) => Ok(()),
            Err(e) => Err(e),
        })
    }
}

// ---- The file ----------------------------------------------------------------

const FILE_FORMAT: &str = "rowankv-coord-store";
const FILE_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileImage {
    format: String,
    version: u32,
    /// CRC-32C of the compact JSON encoding of `state`.
    crc32c: u32,
    state: StateImage,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateImage {
    revision: u64,
    next_lease_id: u64,
    leases: Vec<LeaseImage>,
    keys: Vec<KeyImage>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseImage {
    id: u64,
    ttl_ns: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyImage {
    key: String,
    value_hex: String,
    revision: u64,
    lease: Option<u64>,
}

fn state_image(state: &State) -> StateImage {
    StateImage {
        revision: state.revision,
        next_lease_id: state.next_lease_id,
        leases: state
            .leases
            .iter()
            .map(|(id, lease)| LeaseImage {
                id: id.0,
                ttl_ns: lease.ttl_ns,
            })
            .collect(),
        keys: state
            .keys
            .iter()
            .map(|(key, entry)| KeyImage {
                key: key.clone(),
                value_hex: hex_encode(&entry.value),
                revision: entry.revision,
                lease: entry.lease.map(|id| id.0),
            })
            .collect(),
    }
}

fn state_crc(image: &StateImage) -> u32 {
    // Serializing a typed value is deterministic, so the checksum can be recomputed
    // from the parsed state on load without keeping the original bytes.
    let bytes = serde_json::to_vec(image).expect("a state image always serializes");
    crc32c::crc32c(&bytes)
}

fn encode_file(state: &State) -> Vec<u8> {
    let image = state_image(state);
    let file = FileImage {
        format: FILE_FORMAT.to_owned(),
        version: FILE_VERSION,
        crc32c: state_crc(&image),
        state: image,
    };
    let mut bytes = serde_json::to_vec_pretty(&file).expect("a file image always serializes");
    bytes.push(b'\n');
    bytes
}

/// Decode a store file. Every lease restarts its full TTL at `now_ns`.
fn decode_file(path: &Path, bytes: &[u8], now_ns: u64) -> Result<State, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let file: FileImage =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a store file: {e}")))?;
    if file.format != FILE_FORMAT {
        return Err(corrupt(format!("format is {:?}", file.format)));
    }
    if file.version != FILE_VERSION {
        return Err(corrupt(format!("unsupported version {}", file.version)));
    }
    let crc = state_crc(&file.state);
    if crc != file.crc32c {
        return Err(corrupt(format!(
            "checksum mismatch: stored {:#010x}, computed {crc:#010x}",
            file.crc32c
        )));
    }
    let image = file.state;
    if image.next_lease_id == 0 {
        return Err(corrupt("next_lease_id is 0".to_owned()));
    }
    if image.leases.len() > LEASES_MAX || image.keys.len() > KEYS_MAX {
        return Err(corrupt("more leases or keys than the limits".to_owned()));
    }
    let mut state = State {
        revision: image.revision,
        next_lease_id: image.next_lease_id,
        keys: BTreeMap::new(),
        leases: BTreeMap::new(),
    };
    for lease in image.leases {
        if lease.id == 0 || lease.id >= image.next_lease_id {
            return Err(corrupt(format!("lease id {} out of range", lease.id)));
        }
        if lease.ttl_ns == 0 {
            return Err(corrupt(format!("lease {} has a zero ttl", lease.id)));
        }
        let restarted = Lease {
            ttl_ns: lease.ttl_ns,
            deadline_ns: now_ns.saturating_add(lease.ttl_ns),
        };
        if state.leases.insert(LeaseId(lease.id), restarted).is_some() {
            return Err(corrupt(format!("lease {} appears twice", lease.id)));
        }
    }
    for key in image.keys {
        if key.key.len() > KEY_BYTES_MAX {
            return Err(corrupt("a key exceeds the key length limit".to_owned()));
        }
        if key.revision == 0 || key.revision > image.revision {
            return Err(corrupt(format!(
                "key {:?} has revision {} outside 1..={}",
                key.key, key.revision, image.revision
            )));
        }
        let lease = key.lease.map(LeaseId);
        if let Some(lease) = lease {
            if !state.leases.contains_key(&lease) {
                return Err(corrupt(format!(
                    "key {:?} is attached to unknown lease {}",
                    key.key, lease.0
                )));
            }
        }
        let value = hex_decode(&key.value_hex)
            .ok_or_else(|| corrupt(format!("key {:?} has a malformed value", key.key)))?;
        if value.len() > VALUE_BYTES_MAX {
            return Err(corrupt("a value exceeds the value length limit".to_owned()));
        }
        let entry = Entry {
            value,
            revision: key.revision,
            lease,
        };
        if state.keys.insert(key.key.clone(), entry).is_some() {
            return Err(corrupt(format!("key {:?} appears twice", key.key)));
        }
    }
    Ok(state)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Replace the file at `path` with `state`, atomically and durably.
fn persist(path: &Path, state: &State) -> Result<(), StoreError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { path, source }
    };
    let bytes = encode_file(state);
    let tmp = tmp_path(path);
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        file.write_all(&bytes).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
    }
    fs::rename(&tmp, path).map_err(io_err(path))?;
    // The rename is durable only once the directory entry is.
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(())
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_junk() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_decode(&hex_encode(&bytes)).unwrap(), bytes);
        assert_eq!(hex_decode(""), Some(vec![]));
        assert_eq!(hex_decode("abc"), None);
        assert_eq!(hex_decode("zz"), None);
        assert_eq!(hex_decode("AB"), None);
    }

    #[test]
    fn tmp_path_appends_a_suffix() {
        assert_eq!(
            tmp_path(Path::new("/a/b/store.json")),
            PathBuf::from("/a/b/store.json.tmp")
        );
    }
}
