//! String commands: GET, SET and its relatives, counters, APPEND, ranges.
//!
//! Commands that write from what they read go through
//! [`read_modify_write`](crate::rmw::read_modify_write); plain writes (SET without
//! conditions, MSET, SETEX) are one unconditional write each.

use std::collections::HashMap;

use rowankv_resp::{errors, Value};

use super::{check_length, int_arg, is};
use crate::fail::{fail, Fail, Reply};
use crate::keyspace::{Expect, Keyspace, KeyspaceError, Record};
use crate::num::{format_f64_human, parse_f64, parse_i64};
use crate::rmw::{read_modify_write, store, Write};
use crate::session::Call;

pub(crate) fn get(call: &mut Call<'_>) -> Reply {
    let record = call.keyspace.get(&call.argv[1], call.now_ms())?;
    Ok(bulk_or_null(record.as_ref()))
}

fn bulk_or_null(record: Option<&Record>) -> Value {
    record.map_or(Value::Null, |r| Value::BulkString(r.value.clone()))
}

/// The expiry of a write that keeps the key's TTL.
fn kept_expiry(record: Option<&Record>) -> Option<u64> {
    record.and_then(|r| r.expires_at_ms)
}

/// How an expiry argument is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExpireKind {
    /// Seconds from now.
    Ex,
    /// Milliseconds from now.
    Px,
    /// A Unix time in seconds.
    ExAt,
    /// A Unix time in milliseconds.
    PxAt,
}

/// Which command's options are read: SET's, or GETEX's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OptionsOf {
    Set,
    GetEx,
}

#[derive(Debug, Default)]
struct StringOptions<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    expire: Option<(ExpireKind, &'a [u8])>,
}

/// Reads SET's or GETEX's options as Redis's `parseExtendedStringArgumentsOrReply`
/// does: an option that conflicts with one already given, belongs to the other
/// command, or lacks its argument is a syntax error; a repeated option is not.
fn parse_options(args: &[Vec<u8>], of: OptionsOf) -> Result<StringOptions<'_>, Fail> {
    let mut options = StringOptions::default();
    let set = of == OptionsOf::Set;
    let mut j = 0;
    while j < args.len() {
        let option = &args[j];
        let next = args.get(j + 1);
        let expire_allows = |kind: ExpireKind, o: &StringOptions<'_>| {
            !o.keepttl && !o.persist && o.expire.is_none_or(|(k, _)| k == kind) && next.is_some()
        };
        let expire_kind = [
            ("EX", ExpireKind::Ex),
            ("PX", ExpireKind::Px),
            ("EXAT", ExpireKind::ExAt),
            ("PXAT", ExpireKind::PxAt),
        ]
        .into_iter()
        .find(|(word, _)| is(option, word))
        .map(|(_, kind)| kind);
        if set && is(option, "NX") && !options.xx {
            options.nx = true;
        } else if set && is(option, "XX") && !options.nx {
            options.xx = true;
        } else if set && is(option, "GET") {
            options.get = true;
        } else if set && is(option, "KEEPTTL") && !options.persist && options.expire.is_none() {
            options.keepttl = true;
        } else if !set && is(option, "PERSIST") && options.expire.is_none() && !options.keepttl {
            options.persist = true;
        } else if let Some(kind) = expire_kind.filter(|kind| expire_allows(*kind, &options)) {
            let argument = next.expect("expire_allows checked it");
            options.expire = Some((kind, argument.as_slice()));
            j += 1;
        } else {
            return Err(fail(errors::SYNTAX));
        }
        j += 1;
    }
    Ok(options)
}

/// The absolute expiry an EX/PX/EXAT/PXAT argument gives, as Redis's
/// `getExpireMillisecondsOrReply` computes it: the number must be positive and
/// the result must fit, else `invalid expire time in '<command>' command`.
fn expire_at_ms(kind: ExpireKind, text: &[u8], now_ms: u64, command: &str) -> Result<u64, Fail> {
    let invalid = || Fail::Reply(errors::invalid_expire_time(command));
    let number = int_arg(text)?;
    let seconds = matches!(kind, ExpireKind::Ex | ExpireKind::ExAt);
    if number <= 0 || (seconds && number > i64::MAX / 1000) {
        return Err(invalid());
    }
    let milliseconds = if seconds { number * 1000 } else { number };
    let at = match kind {
        ExpireKind::Ex | ExpireKind::Px => {
            let now = i64::try_from(now_ms).map_err(|_| invalid())?;
            milliseconds.checked_add(now).ok_or_else(invalid)?
        }
        ExpireKind::ExAt | ExpireKind::PxAt => milliseconds,
    };
    u64::try_from(at).map_err(|_| invalid())
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL]`.
pub(crate) fn set(call: &mut Call<'_>) -> Reply {
    let (key, value) = (&call.argv[1], &call.argv[2]);
    let options = parse_options(&call.argv[3..], OptionsOf::Set)?;
    let now = call.now_ms();
    let expires = options
        .expire
        .map(|(kind, text)| expire_at_ms(kind, text, now, call.command()))
        .transpose()?;
    check_length(value.len() as u64)?;
    if !options.get && !options.keepttl && !options.xx {
        // No need to read first: one write, conditional for NX.
        let expect = if options.nx {
            Expect::Absent
        } else {
            Expect::Any
        };
        return match store(call.keyspace, key, value, expires, expect, now) {
            Ok(()) => Ok(Value::ok()),
            Err(KeyspaceError::Conflict) if options.nx => Ok(Value::Null),
            Err(error) => Err(error.into()),
        };
    }
    read_modify_write(call.keyspace, key, now, |current| {
        let old = if options.get {
            bulk_or_null(current)
        } else {
            Value::Null
        };
        let blocked = (options.nx && current.is_some()) || (options.xx && current.is_none());
        if blocked {
            return Ok((Write::Keep, old));
        }
        let expires_at_ms = if options.keepttl {
            kept_expiry(current)
        } else {
            expires
        };
        let reply = if options.get { old } else { Value::ok() };
        let write = Write::Put {
            value: value.clone(),
            expires_at_ms,
        };
        Ok((write, reply))
    })
}

/// `SETNX key value`: 1 if set, 0 if the key exists.
pub(crate) fn setnx(call: &mut Call<'_>) -> Reply {
    let (key, value) = (&call.argv[1], &call.argv[2]);
    check_length(value.len() as u64)?;
    match store(
        call.keyspace,
        key,
        value,
        None,
        Expect::Absent,
        call.ctx.now_ms,
    ) {
        Ok(()) => Ok(Value::Integer(1)),
        Err(KeyspaceError::Conflict) => Ok(Value::Integer(0)),
        Err(error) => Err(error.into()),
    }
}

/// `SETEX key seconds value` and `PSETEX key milliseconds value`.
pub(crate) fn setex(call: &mut Call<'_>) -> Reply {
    let (key, ttl, value) = (&call.argv[1], &call.argv[2], &call.argv[3]);
    let kind = if call.command() == "setex" {
        ExpireKind::Ex
    } else {
        ExpireKind::Px
    };
    let now = call.now_ms();
    let expires = expire_at_ms(kind, ttl, now, call.command())?;
    check_length(value.len() as u64)?;
    store(call.keyspace, key, value, Some(expires), Expect::Any, now)?;
    Ok(Value::ok())
}

/// `GETSET key value`: the old value; the new one has no TTL.
pub(crate) fn getset(call: &mut Call<'_>) -> Reply {
    let (key, value) = (&call.argv[1], &call.argv[2]);
    check_length(value.len() as u64)?;
    read_modify_write(call.keyspace, key, call.ctx.now_ms, |current| {
        let write = Write::Put {
            value: value.clone(),
            expires_at_ms: None,
        };
        Ok((write, bulk_or_null(current)))
    })
}

pub(crate) fn getdel(call: &mut Call<'_>) -> Reply {
    read_modify_write(call.keyspace, &call.argv[1], call.ctx.now_ms, |current| {
        let write = if current.is_some() {
            Write::Delete
        } else {
            Write::Keep
        };
        Ok((write, bulk_or_null(current)))
    })
}

/// `GETEX key [EX s|PX ms|EXAT t|PXAT t|PERSIST]`.
pub(crate) fn getex(call: &mut Call<'_>) -> Reply {
    let options = parse_options(&call.argv[2..], OptionsOf::GetEx)?;
    let now = call.now_ms();
    let expires = options
        .expire
        .map(|(kind, text)| expire_at_ms(kind, text, now, call.command()))
        .transpose()?;
    if expires.is_none() && !options.persist {
        return get(call);
    }
    read_modify_write(call.keyspace, &call.argv[1], now, |current| {
        let Some(record) = current else {
            return Ok((Write::Keep, Value::Null));
        };
        let write = if options.persist && record.expires_at_ms.is_none() {
            Write::Keep
        } else {
            Write::Put {
                value: record.value.clone(),
                expires_at_ms: expires,
            }
        };
        Ok((write, Value::BulkString(record.value.clone())))
    })
}

pub(crate) fn mget(call: &mut Call<'_>) -> Reply {
    let now = call.now_ms();
    let mut values = Vec::with_capacity(call.argv.len() - 1);
    for key in &call.argv[1..] {
        values.push(bulk_or_null(call.keyspace.get(key, now)?.as_ref()));
    }
    Ok(Value::Array(values))
}

/// The key/value pairs of MSET/MSETNX, or the arity error for an odd count.
/// A key and its value, as MSET/MSETNX name them.
type Pair<'a> = (&'a [u8], &'a [u8]);

fn pairs<'a>(call: &Call<'a>) -> Result<Vec<Pair<'a>>, Fail> {
    let args = &call.argv[1..];
    if !args.len().is_multiple_of(2) {
        return Err(Fail::Reply(errors::wrong_number_of_arguments(
            call.command(),
        )));
    }
    let pairs: Vec<_> = args
        .chunks_exact(2)
        .map(|pair| (pair[0].as_slice(), pair[1].as_slice()))
        .collect();
    for (_, value) in &pairs {
        check_length(value.len() as u64)?;
    }
    Ok(pairs)
}

/// `MSET k v [k v ...]`: one unconditional write per key, in order (not atomic
/// across keys: a reader may see some of the keys written and not others).
pub(crate) fn mset(call: &mut Call<'_>) -> Reply {
    let now = call.now_ms();
    for (key, value) in pairs(call)? {
        call.keyspace.put(key, value, None, Expect::Any, now)?;
    }
    Ok(Value::ok())
}

/// `MSETNX k v [k v ...]`, best effort: 0 if any key exists; else each key is
/// written on condition that it is still absent, and if one of those writes finds
/// its key taken meanwhile, the keys already written are deleted again (each only
/// if nobody rewrote it since) and the answer is 0.
pub(crate) fn msetnx(call: &mut Call<'_>) -> Reply {
    let now = call.now_ms();
    let pairs = last_value_per_key(pairs(call)?);
    for (key, _) in &pairs {
        if call.keyspace.get(key, now)?.is_some() {
            return Ok(Value::Integer(0));
        }
    }
    let mut written = Vec::with_capacity(pairs.len());
    for (key, value) in &pairs {
        match call.keyspace.put(key, value, None, Expect::Absent, now) {
            Ok(version) => written.push((*key, version)),
            Err(error) => {
                roll_back(call.keyspace, &written, now);
                return match error {
                    KeyspaceError::Conflict => Ok(Value::Integer(0)),
                    other => Err(other.into()),
                };
            }
        }
    }
    Ok(Value::Integer(1))
}

/// Redis sets a key named twice to its last value; so does MSETNX here.
fn last_value_per_key(pairs: Vec<Pair<'_>>) -> Vec<Pair<'_>> {
    let mut index: HashMap<&[u8], usize> = HashMap::with_capacity(pairs.len());
    let mut unique: Vec<Pair<'_>> = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        match index.get(key) {
            Some(&i) => unique[i].1 = value,
            None => {
                index.insert(key, unique.len());
                unique.push((key, value));
            }
        }
    }
    unique
}

/// Deletes keys MSETNX wrote, each only if it still holds MSETNX's version. A
/// failure is left as is: the key then holds a value someone else wrote, or the
/// keyspace is failing and the MSETNX's own error is the answer.
fn roll_back(keyspace: &mut dyn Keyspace, written: &[(&[u8], u64)], now_ms: u64) {
    for (key, version) in written {
        let _ignored = keyspace.delete(key, Expect::Version(*version), now_ms);
    }
}

pub(crate) fn incr(call: &mut Call<'_>) -> Reply {
    add(call, 1)
}

pub(crate) fn decr(call: &mut Call<'_>) -> Reply {
    add(call, -1)
}

pub(crate) fn incrby(call: &mut Call<'_>) -> Reply {
    let delta = int_arg(&call.argv[2])?;
    add(call, delta)
}

pub(crate) fn decrby(call: &mut Call<'_>) -> Reply {
    let delta = int_arg(&call.argv[2])?;
    let negated = delta
        .checked_neg()
        .ok_or_else(|| fail("ERR decrement would overflow"))?;
    add(call, negated)
}

/// Adds `delta` to the integer the key holds (0 if none), keeping its TTL.
fn add(call: &mut Call<'_>, delta: i64) -> Reply {
    read_modify_write(call.keyspace, &call.argv[1], call.ctx.now_ms, |current| {
        let old = match current {
            None => 0,
            Some(record) => parse_i64(&record.value).ok_or_else(|| fail(errors::NOT_AN_INTEGER))?,
        };
        let new = old
            .checked_add(delta)
            .ok_or_else(|| fail(errors::INCR_OVERFLOW))?;
        let write = Write::Put {
            value: new.to_string().into_bytes(),
            expires_at_ms: kept_expiry(current),
        };
        Ok((write, Value::Integer(new)))
    })
}

/// `INCRBYFLOAT key increment`, in `f64` (Redis uses a C `long double`).
pub(crate) fn incrbyfloat(call: &mut Call<'_>) -> Reply {
    let increment = parse_f64(&call.argv[2]).ok_or_else(|| fail(errors::NOT_A_FLOAT))?;
    read_modify_write(call.keyspace, &call.argv[1], call.ctx.now_ms, |current| {
        let old = match current {
            None => 0.0,
            Some(record) => parse_f64(&record.value).ok_or_else(|| fail(errors::NOT_A_FLOAT))?,
        };
        let new = old + increment;
        if !new.is_finite() {
            return Err(fail("ERR increment would produce NaN or Infinity"));
        }
        let text = format_f64_human(new).into_bytes();
        let write = Write::Put {
            value: text.clone(),
            expires_at_ms: kept_expiry(current),
        };
        Ok((write, Value::BulkString(text)))
    })
}

/// `APPEND key value`: the new length; the TTL is kept.
pub(crate) fn append(call: &mut Call<'_>) -> Reply {
    let suffix = &call.argv[2];
    read_modify_write(call.keyspace, &call.argv[1], call.ctx.now_ms, |current| {
        let old = current.map_or(&[][..], |r| r.value.as_slice());
        check_length(old.len() as u64 + suffix.len() as u64)?;
        let value = [old, suffix.as_slice()].concat();
        let length = value.len();
        let write = Write::Put {
            value,
            expires_at_ms: kept_expiry(current),
        };
        Ok((write, Value::Integer(length as i64)))
    })
}

pub(crate) fn strlen(call: &mut Call<'_>) -> Reply {
    let record = call.keyspace.get(&call.argv[1], call.now_ms())?;
    Ok(Value::Integer(record.map_or(0, |r| r.value.len() as i64)))
}

/// `SETRANGE key offset value`: the new length; zero bytes pad a gap.
pub(crate) fn setrange(call: &mut Call<'_>) -> Reply {
    let offset = int_arg(&call.argv[2])?;
    let offset = u64::try_from(offset).map_err(|_| fail("ERR offset is out of range"))?;
    let patch = &call.argv[3];
    read_modify_write(call.keyspace, &call.argv[1], call.ctx.now_ms, |current| {
        let old = current.map_or(&[][..], |r| r.value.as_slice());
        if patch.is_empty() {
            // Nothing to write: Redis neither creates nor touches the key.
            return Ok((Write::Keep, Value::Integer(old.len() as i64)));
        }
        let end = offset + patch.len() as u64;
        check_length(end)?;
        let (start, end) = (offset as usize, end as usize);
        let mut value = old.to_vec();
        if value.len() < end {
            value.resize(end, 0);
        }
        value[start..end].copy_from_slice(patch);
        let length = value.len();
        let write = Write::Put {
            value,
            expires_at_ms: kept_expiry(current),
        };
        Ok((write, Value::Integer(length as i64)))
    })
}

/// `GETRANGE key start end` (and SUBSTR): inclusive, negative indexes count from
/// the end, out-of-range indexes are clamped.
pub(crate) fn getrange(call: &mut Call<'_>) -> Reply {
    let start = int_arg(&call.argv[2])?;
    let end = int_arg(&call.argv[3])?;
    let record = call.keyspace.get(&call.argv[1], call.now_ms())?;
    let value = record.map(|r| r.value).unwrap_or_default();
    Ok(Value::BulkString(substring(&value, start, end).to_vec()))
}

fn substring(value: &[u8], start: i64, end: i64) -> &[u8] {
    if start < 0 && end < 0 && start > end {
        return &[];
    }
    let length = value.len() as i64;
    let from_end = |index: i64| {
        if index < 0 {
            (length + index).max(0)
        } else {
            index
        }
    };
    let (start, end) = (from_end(start), from_end(end).min(length - 1));
    if length == 0 || start > end {
        return &[];
    }
    &value[start as usize..=end as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substrings() {
        let s = b"This is a string";
        assert_eq!(substring(s, 0, 3), b"This");
        assert_eq!(substring(s, -3, -1), b"ing");
        assert_eq!(substring(s, 0, -1), s);
        assert_eq!(substring(s, 10, 100), b"string");
        assert_eq!(substring(s, 5, 3), b"");
        assert_eq!(substring(s, -1, -5), b"");
        assert_eq!(substring(s, -100, 2), b"Thi");
        assert_eq!(substring(b"", 0, -1), b"");
        assert_eq!(substring(s, i64::MIN, i64::MAX), s);
    }

    fn options(words: &[&str], of: OptionsOf) -> Result<String, String> {
        let args: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        match parse_options(&args, of) {
            Ok(o) => Ok(format!(
                "nx={} xx={} get={} keepttl={} persist={} expire={:?}",
                o.nx,
                o.xx,
                o.get,
                o.keepttl,
                o.persist,
                o.expire
                    .map(|(k, t)| (k, String::from_utf8_lossy(t).into_owned()))
            )),
            Err(Fail::Reply(Value::Error(line))) => {
                Err(String::from_utf8_lossy(&line).into_owned())
            }
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn set_options_as_redis() {
        use OptionsOf::*;
        assert!(options(&["NX", "GET", "EX", "10"], Set).is_ok());
        assert!(options(&["nx", "nx"], Set).is_ok());
        assert!(options(&["EX", "1", "EX", "2"], Set)
            .unwrap()
            .contains("\"2\""));
        for bad in [
            &["NX", "XX"][..],
            &["XX", "NX"],
            &["EX"],
            &["EX", "1", "PX", "1"],
            &["KEEPTTL", "EX", "1"],
            &["EX", "1", "KEEPTTL"],
            &["PERSIST"],
            &["FOO"],
        ] {
            assert_eq!(options(bad, Set), Err("ERR syntax error".into()), "{bad:?}");
        }
        assert!(options(&["PERSIST"], GetEx).is_ok());
        assert!(options(&["PXAT", "5"], GetEx).is_ok());
        for bad in [
            &["NX"][..],
            &["GET"],
            &["KEEPTTL"],
            &["PERSIST", "EX", "1"],
            &["EX", "1", "PERSIST"],
        ] {
            assert_eq!(
                options(bad, GetEx),
                Err("ERR syntax error".into()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn expiry_arithmetic() {
        let at = |kind, text: &str| expire_at_ms(kind, text.as_bytes(), 1_000, "set");
        assert_eq!(at(ExpireKind::Ex, "2").ok(), Some(3_000));
        assert_eq!(at(ExpireKind::Px, "2").ok(), Some(1_002));
        assert_eq!(at(ExpireKind::ExAt, "2").ok(), Some(2_000));
        assert_eq!(at(ExpireKind::PxAt, "2").ok(), Some(2));
        for (kind, text) in [
            (ExpireKind::Ex, "0"),
            (ExpireKind::Px, "-1"),
            (ExpireKind::Ex, "9223372036854776"),
            (ExpireKind::Px, "9223372036854775807"),
        ] {
            assert!(
                matches!(at(kind, text), Err(Fail::Reply(Value::Error(line))) if line == b"ERR invalid expire time in 'set' command"),
                "{text}"
            );
        }
        assert!(
            matches!(at(ExpireKind::Ex, "x"), Err(Fail::Reply(Value::Error(line))) if line == errors::NOT_AN_INTEGER.as_bytes())
        );
    }
}
