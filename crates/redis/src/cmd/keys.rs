//! Key commands: DEL, EXISTS, the EXPIRE family, TTL, PERSIST, TYPE, SCAN, KEYS,
//! DBSIZE, FLUSHALL.

use rowankv_resp::{errors, Value};

use super::{int_arg, is};
use crate::fail::{fail, fail_bytes, Fail, Reply};
use crate::glob::Glob;
use crate::keyspace::Expect;
use crate::num::parse_cursor;
use crate::rmw::{read_modify_write, Write};
use crate::session::Call;

/// SCAN's COUNT when none is given (Redis's default).
const SCAN_COUNT_DEFAULT: usize = 10;
/// The most keys one SCAN call asks the keyspace for, whatever COUNT says (COUNT
/// is a hint in Redis too), so that one call's work and reply stay bounded.
pub const SCAN_COUNT_MAX: usize = 100_000;
/// How many keys KEYS asks the keyspace for per step.
const KEYS_BATCH: usize = 1_000;
/// The most keys KEYS looks at before it gives up and points to SCAN: KEYS builds
/// its whole reply in memory.
pub const KEYS_SCANNED_MAX: usize = 10_000_000;

/// `DEL key [key ...]` and UNLINK: how many keys were deleted.
pub(crate) fn del(call: &mut Call<'_>) -> Reply {
    let now = call.now_ms();
    let mut deleted = 0;
    for key in &call.argv[1..] {
        if call.keyspace.delete(key, Expect::Any, now)? {
            deleted += 1;
        }
    }
    Ok(Value::Integer(deleted))
}

/// `EXISTS key [key ...]` and TOUCH: how many of the keys exist (a key named
/// twice counts twice).
pub(crate) fn exists(call: &mut Call<'_>) -> Reply {
    let now = call.now_ms();
    let mut found = 0;
    for key in &call.argv[1..] {
        if call.keyspace.get(key, now)?.is_some() {
            found += 1;
        }
    }
    Ok(Value::Integer(found))
}

/// EXPIRE's NX/XX/GT/LT.
#[derive(Clone, Copy, Debug, Default)]
struct ExpireFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

fn parse_expire_flags(args: &[Vec<u8>]) -> Result<ExpireFlags, Fail> {
    let mut flags = ExpireFlags::default();
    for option in args {
        if is(option, "NX") {
            flags.nx = true;
        } else if is(option, "XX") {
            flags.xx = true;
        } else if is(option, "GT") {
            flags.gt = true;
        } else if is(option, "LT") {
            flags.lt = true;
        } else {
            return Err(fail_bytes(&[b"ERR Unsupported option ", option]));
        }
    }
    if flags.nx && (flags.xx || flags.gt || flags.lt) {
        return Err(fail(errors::EXPIRE_NX_WITH_OTHERS));
    }
    if flags.gt && flags.lt {
        return Err(fail(errors::EXPIRE_GT_WITH_LT));
    }
    Ok(flags)
}

impl ExpireFlags {
    /// Whether the flags let `when` replace the key's `current` expiry (none =
    /// an infinite TTL for GT and LT, as in Redis).
    fn allow(self, current: Option<u64>, when: i64) -> bool {
        let current = current.map(|at| i64::try_from(at).unwrap_or(i64::MAX));
        !(self.nx && current.is_some()
            || self.xx && current.is_none()
            || self.gt && current.is_none_or(|at| when <= at)
            || self.lt && current.is_some_and(|at| when >= at))
    }
}

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT `key time [NX|XX|GT|LT]`: 1 if the expiry
/// was set (or the key deleted, for a time already past), 0 if the key does not
/// exist or the flags forbid it. The record is rewritten with its new expiry.
pub(crate) fn expire(call: &mut Call<'_>) -> Reply {
    let command = call.command();
    let flags = parse_expire_flags(&call.argv[3..])?;
    let number = int_arg(&call.argv[2])?;
    let invalid = || Fail::Reply(errors::invalid_expire_time(command));
    let mut when = number;
    if matches!(command, "expire" | "expireat") {
        when = number.checked_mul(1000).ok_or_else(invalid)?;
    }
    let now = call.now_ms();
    if matches!(command, "expire" | "pexpire") {
        let base = i64::try_from(now).map_err(|_| invalid())?;
        when = when.checked_add(base).ok_or_else(invalid)?;
    }
    read_modify_write(call.keyspace, &call.argv[1], now, |current| {
        let Some(record) = current else {
            return Ok((Write::Keep, Value::Integer(0)));
        };
        if !flags.allow(record.expires_at_ms, when) {
            return Ok((Write::Keep, Value::Integer(0)));
        }
        // A time at or before now deletes the key (Redis's checkAlreadyExpired).
        let write = match u64::try_from(when) {
            Ok(at) if at > now => Write::Put {
                value: record.value.clone(),
                expires_at_ms: Some(at),
            },
            _ => Write::Delete,
        };
        Ok((write, Value::Integer(1)))
    })
}

/// `TTL key` / `PTTL key`: -2 no key, -1 no expiry, else the time left (TTL
/// rounds to the nearest second, as Redis does).
pub(crate) fn ttl(call: &mut Call<'_>) -> Reply {
    let now = call.now_ms();
    let Some(record) = call.keyspace.get(&call.argv[1], now)? else {
        return Ok(Value::Integer(-2));
    };
    let Some(at) = record.expires_at_ms else {
        return Ok(Value::Integer(-1));
    };
    let left_ms = i64::try_from(at.saturating_sub(now)).unwrap_or(i64::MAX);
    Ok(Value::Integer(if call.command() == "pttl" {
        left_ms
    } else {
        left_ms.saturating_add(500) / 1000
    }))
}

/// `EXPIRETIME key` / `PEXPIRETIME key`: -2 no key, -1 no expiry, else the Unix
/// time of expiry.
pub(crate) fn expiretime(call: &mut Call<'_>) -> Reply {
    let Some(record) = call.keyspace.get(&call.argv[1], call.ctx.now_ms)? else {
        return Ok(Value::Integer(-2));
    };
    let Some(at) = record.expires_at_ms else {
        return Ok(Value::Integer(-1));
    };
    let at = if call.command() == "pexpiretime" {
        at
    } else {
        at / 1000
    };
    Ok(Value::Integer(i64::try_from(at).unwrap_or(i64::MAX)))
}

/// `PERSIST key`: 1 if an expiry was removed.
pub(crate) fn persist(call: &mut Call<'_>) -> Reply {
    read_modify_write(
        call.keyspace,
        &call.argv[1],
        call.ctx.now_ms,
        |current| match current {
            Some(record) if record.expires_at_ms.is_some() => {
                let write = Write::Put {
                    value: record.value.clone(),
                    expires_at_ms: None,
                };
                Ok((write, Value::Integer(1)))
            }
            _ => Ok((Write::Keep, Value::Integer(0))),
        },
    )
}

/// `TYPE key`: `string` or `none` (RowanKV stores strings only).
pub(crate) fn type_of(call: &mut Call<'_>) -> Reply {
    let found = call.keyspace.get(&call.argv[1], call.now_ms())?.is_some();
    Ok(Value::simple(if found { "string" } else { "none" }))
}

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]`, over this node's part
/// of the keyspace. MATCH and TYPE filter the batch the keyspace returned, so a
/// call may return fewer keys than COUNT, or none, with a cursor to go on.
pub(crate) fn scan(call: &mut Call<'_>) -> Reply {
    let cursor = parse_cursor(&call.argv[1]).ok_or_else(|| fail(errors::INVALID_CURSOR))?;
    let mut count = SCAN_COUNT_DEFAULT;
    let mut pattern = None;
    let mut strings_wanted = true;
    let args = &call.argv[2..];
    let mut i = 0;
    while i < args.len() {
        let (option, value) = (&args[i], args.get(i + 1));
        match value {
            Some(value) if is(option, "COUNT") => {
                let wanted = int_arg(value)?;
                if wanted < 1 {
                    return Err(fail(errors::SYNTAX));
                }
                count = usize::try_from(wanted).unwrap_or(usize::MAX);
            }
            Some(value) if is(option, "MATCH") => pattern = Some(Glob::new(value)),
            // Keys are strings: any other type name (known or not, as Redis 7)
            // matches nothing.
            Some(value) if is(option, "TYPE") => strings_wanted = is(value, "string"),
            _ => return Err(fail(errors::SYNTAX)),
        }
        i += 2;
    }
    let (next, mut keys) =
        call.keyspace
            .scan(cursor, count.min(SCAN_COUNT_MAX), call.ctx.now_ms)?;
    let pattern = pattern.filter(|glob| !glob.matches_everything());
    keys.retain(|key| strings_wanted && pattern.as_ref().is_none_or(|glob| glob.matches(key)));
    Ok(Value::Array(vec![
        Value::bulk(next.to_string()),
        Value::Array(keys.into_iter().map(Value::BulkString).collect()),
    ]))
}

/// `KEYS pattern`: every key of this node's part of the keyspace that matches,
/// found by scanning it all (O(keys)); refused beyond [`KEYS_SCANNED_MAX`].
pub(crate) fn keys(call: &mut Call<'_>) -> Reply {
    let glob = Glob::new(&call.argv[1]);
    let mut matched = Vec::new();
    let mut cursor = 0;
    let mut scanned = 0;
    loop {
        let (next, batch) = call.keyspace.scan(cursor, KEYS_BATCH, call.ctx.now_ms)?;
        scanned += batch.len().max(1);
        matched.extend(
            batch
                .into_iter()
                .filter(|key| glob.matches(key))
                .map(Value::BulkString),
        );
        if next == 0 {
            return Ok(Value::Array(matched));
        }
        if scanned > KEYS_SCANNED_MAX {
            return Err(fail(&format!(
                "ERR KEYS gave up after {KEYS_SCANNED_MAX} keys: use SCAN to iterate a keyspace this large"
            )));
        }
        cursor = next;
    }
}

pub(crate) fn dbsize(call: &mut Call<'_>) -> Reply {
    let size = call.keyspace.dbsize(call.ctx.now_ms)?;
    Ok(Value::Integer(i64::try_from(size).unwrap_or(i64::MAX)))
}

/// `FLUSHALL [ASYNC|SYNC]` and FLUSHDB: refused unless the server enables them.
pub(crate) fn flushall(call: &mut Call<'_>) -> Reply {
    match call.argv {
        [_] => {}
        [_, mode] if is(mode, "ASYNC") || is(mode, "SYNC") => {}
        _ => return Err(fail(errors::SYNTAX)),
    }
    if !call.ctx.flushall_enabled {
        return Err(fail(&format!(
            "ERR {} is disabled on this RowanKV server (flushall_enabled is off)",
            call.command().to_ascii_uppercase()
        )));
    }
    call.keyspace.flushall()?;
    Ok(Value::ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(words: &[&str]) -> Result<ExpireFlags, String> {
        let args: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        parse_expire_flags(&args).map_err(|fail| match fail {
            Fail::Reply(Value::Error(line)) => String::from_utf8_lossy(&line).into_owned(),
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn expire_flags() {
        assert!(flags(&["nx"]).is_ok());
        assert!(flags(&["XX", "GT"]).is_ok());
        assert!(flags(&["gt", "gt"]).is_ok());
        assert_eq!(
            flags(&["NX", "XX"]).err().as_deref(),
            Some(errors::EXPIRE_NX_WITH_OTHERS)
        );
        assert_eq!(
            flags(&["LT", "NX"]).err().as_deref(),
            Some(errors::EXPIRE_NX_WITH_OTHERS)
        );
        assert_eq!(
            flags(&["GT", "LT"]).err().as_deref(),
            Some(errors::EXPIRE_GT_WITH_LT)
        );
        assert_eq!(
            flags(&["foo"]).err().as_deref(),
            Some("ERR Unsupported option foo")
        );
    }

    #[test]
    fn expire_flag_rules() {
        let f = |words: &[&str]| flags(words).expect("valid");
        assert!(f(&["NX"]).allow(None, 5));
        assert!(!f(&["NX"]).allow(Some(1), 5));
        assert!(!f(&["XX"]).allow(None, 5));
        assert!(f(&["XX"]).allow(Some(1), 5));
        assert!(!f(&["GT"]).allow(None, 5));
        assert!(f(&["GT"]).allow(Some(4), 5));
        assert!(!f(&["GT"]).allow(Some(5), 5));
        assert!(f(&["LT"]).allow(None, 5));
        assert!(f(&["LT"]).allow(Some(6), 5));
        assert!(!f(&["LT"]).allow(Some(5), 5));
    }
}
