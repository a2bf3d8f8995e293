//! Read-modify-write: how commands that read a key and write it from what they
//! read (INCR, APPEND, SET NX/XX/GET/KEEPTTL, GETDEL, EXPIRE, ...) stay atomic per
//! key over a keyspace that offers only reads and conditional writes.
//!
//! Each attempt reads the key's live record, decides the write from it, and writes
//! with `Expect::Version(v)` of the record read (or `Expect::Absent` if there was
//! none). If another write reached the key in between, the keyspace refuses with
//! `Conflict` and the attempt starts over from a fresh read. A write that lands was
//! therefore decided from the key's state just before it: the command is atomic
//! for that key, given a keyspace whose conditional write is atomic. After
//! [`RMW_ATTEMPTS_MAX`] lost attempts the command gives up with an error.

use crate::fail::{Fail, Reply};
use crate::keyspace::{Expect, Keyspace, KeyspaceError, Record};
use rowankv_resp::Value;

/// Attempts of one read-modify-write before it answers that the key is contended.
pub const RMW_ATTEMPTS_MAX: usize = 64;

/// What an attempt writes, decided from the record it read.
#[derive(Debug)]
pub(crate) enum Write {
    /// Nothing.
    Keep,
    /// This value with this expiry (an expiry already past deletes the key, as
    /// Redis deletes a key given an expiry in the past).
    Put {
        value: Vec<u8>,
        expires_at_ms: Option<u64>,
    },
    /// Delete the key.
    Delete,
}

/// Runs `decide` on the key's live record and applies its write conditioned on
/// that record, retrying on conflict; returns `decide`'s reply. `decide` may run
/// several times and must have no effect but its return value. A `decide` error
/// stops at once, without a write.
pub(crate) fn read_modify_write(
    keyspace: &mut dyn Keyspace,
    key: &[u8],
    now_ms: u64,
    mut decide: impl FnMut(Option<&Record>) -> Result<(Write, Value), Fail>,
) -> Reply {
    for _ in 0..RMW_ATTEMPTS_MAX {
        let current = keyspace.get(key, now_ms)?;
        let expect = match &current {
            Some(record) => Expect::Version(record.version),
            None => Expect::Absent,
        };
        let (write, reply) = decide(current.as_ref())?;
        let result = match write {
            Write::Keep => Ok(()),
            Write::Delete if current.is_none() => Ok(()),
            Write::Delete => keyspace.delete(key, expect, now_ms).map(drop),
            Write::Put {
                value,
                expires_at_ms,
            } => store(keyspace, key, &value, expires_at_ms, expect, now_ms),
        };
        match result {
            Ok(()) => return Ok(reply),
            Err(KeyspaceError::Conflict) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(Fail::Reply(crate::fail::contended()))
}

/// Writes `value` with `expires_at_ms` under `expect`, or deletes the key under
/// `expect` if that expiry has already passed (Redis never stores a key that is
/// born expired).
pub(crate) fn store(
    keyspace: &mut dyn Keyspace,
    key: &[u8],
    value: &[u8],
    expires_at_ms: Option<u64>,
    expect: Expect,
    now_ms: u64,
) -> Result<(), KeyspaceError> {
    if expires_at_ms.is_some_and(|at| at <= now_ms) {
        keyspace.delete(key, expect, now_ms).map(drop)
    } else {
        keyspace
            .put(key, value, expires_at_ms, expect, now_ms)
            .map(drop)
    }
}
