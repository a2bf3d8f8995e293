//! Test keyspaces: a [`MemKeyspace`] behind a [`Hook`] that sees every call first
//! and may act on the store or fail the call (conflicts, races, routing, outages).

use rowankv_redis::{Expect, Keyspace, KeyspaceError, MemKeyspace, Record, SlotMoveError};

use crate::support::NOW_MS;

/// A keyspace call, as a hook sees it before the store does.
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    Get {
        key: &'a [u8],
    },
    Put {
        key: &'a [u8],
        expect: Expect,
        now_ms: u64,
    },
    Delete {
        key: &'a [u8],
        expect: Expect,
        now_ms: u64,
    },
    Scan,
    Dbsize,
    Flushall,
}

impl Call<'_> {
    /// The key of a get, put or delete.
    pub fn key(&self) -> Option<&[u8]> {
        match *self {
            Call::Get { key } | Call::Put { key, .. } | Call::Delete { key, .. } => Some(key),
            Call::Scan | Call::Dbsize | Call::Flushall => None,
        }
    }

    /// The key, condition and time of a conditional write (a put or delete whose
    /// `Expect` is not `Any`).
    pub fn conditional_write(&self) -> Option<(&[u8], Expect, u64)> {
        match *self {
            Call::Put {
                key,
                expect,
                now_ms,
            }
            | Call::Delete {
                key,
                expect,
                now_ms,
            } if expect != Expect::Any => Some((key, expect, now_ms)),
            _ => None,
        }
    }
}

/// What a test keyspace does before each call reaches the store: `Err` fails the
/// call with that error, and the store is left as the hook leaves it.
pub trait Hook {
    fn before(&mut self, call: Call<'_>, store: &mut MemKeyspace) -> Result<(), KeyspaceError>;

    /// CLUSTER SETSLOT ... NODE's call ([`Keyspace::move_slot`]); by default
    /// refused as a keyspace that cannot move slots.
    fn move_slot(&mut self, slot: u16, node_id: &str) -> Result<(), SlotMoveError> {
        let _ = (slot, node_id);
        Err(SlotMoveError::Unsupported)
    }
}

/// A [`MemKeyspace`] whose calls go through `hook` first.
pub struct Hooked<H> {
    pub inner: MemKeyspace,
    pub hook: H,
}

impl<H: Hook> Hooked<H> {
    pub fn new(hook: H) -> Hooked<H> {
        Hooked {
            inner: MemKeyspace::new(),
            hook,
        }
    }

    /// Writes `key` straight to the store, past the hook: the state a test starts from.
    pub fn seed(&mut self, key: &str, value: &str) {
        self.inner
            .put(key.as_bytes(), value.as_bytes(), None, Expect::Any, NOW_MS)
            .expect("put");
    }
}

impl<H: Hook> Keyspace for Hooked<H> {
    fn get(&mut self, key: &[u8], now_ms: u64) -> Result<Option<Record>, KeyspaceError> {
        self.hook.before(Call::Get { key }, &mut self.inner)?;
        self.inner.get(key, now_ms)
    }
    fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        expect: Expect,
        now_ms: u64,
    ) -> Result<u64, KeyspaceError> {
        let call = Call::Put {
            key,
            expect,
            now_ms,
        };
        self.hook.before(call, &mut self.inner)?;
        self.inner.put(key, value, expires_at_ms, expect, now_ms)
    }
    fn delete(&mut self, key: &[u8], expect: Expect, now_ms: u64) -> Result<bool, KeyspaceError> {
        let call = Call::Delete {
            key,
            expect,
            now_ms,
        };
        self.hook.before(call, &mut self.inner)?;
        self.inner.delete(key, expect, now_ms)
    }
    fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        now_ms: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), KeyspaceError> {
        self.hook.before(Call::Scan, &mut self.inner)?;
        self.inner.scan(cursor, count, now_ms)
    }
    fn dbsize(&mut self, now_ms: u64) -> Result<u64, KeyspaceError> {
        self.hook.before(Call::Dbsize, &mut self.inner)?;
        self.inner.dbsize(now_ms)
    }
    fn flushall(&mut self) -> Result<(), KeyspaceError> {
        self.hook.before(Call::Flushall, &mut self.inner)?;
        self.inner.flushall()
    }
    fn move_slot(&mut self, slot: u16, node_id: &str) -> Result<(), SlotMoveError> {
        self.hook.move_slot(slot, node_id)
    }
}
