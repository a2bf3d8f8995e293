//! Read-modify-write under conflicts: injected ones, and real ones from a
//! concurrent writer that gets in between a command's read and its write.

use rowankv_redis::{Expect, Keyspace, KeyspaceError, MemKeyspace, RMW_ATTEMPTS_MAX};
use rowankv_resp::Value;

use crate::keyspaces::{Call, Hook, Hooked};
use crate::support::*;

/// Refuses the first `conflicts_left` conditional writes with `Conflict`.
struct Conflicting {
    conflicts_left: usize,
    conditional_writes: usize,
}

fn conflicting(conflicts: usize) -> Hooked<Conflicting> {
    Hooked::new(Conflicting {
        conflicts_left: conflicts,
        conditional_writes: 0,
    })
}

impl Hook for Conflicting {
    fn before(&mut self, call: Call<'_>, _: &mut MemKeyspace) -> Result<(), KeyspaceError> {
        if call.conditional_write().is_none() {
            return Ok(());
        }
        self.conditional_writes += 1;
        if self.conflicts_left > 0 {
            self.conflicts_left -= 1;
            return Err(KeyspaceError::Conflict);
        }
        Ok(())
    }
}

#[test]
fn retries_until_the_write_lands() {
    for conflicts in [0, 1, 5, RMW_ATTEMPTS_MAX - 1] {
        let mut h = Harness::with(conflicting(conflicts));
        assert_eq!(h.run(&["INCR", "n"]), int(1), "{conflicts} conflicts");
        assert_eq!(h.keyspace.hook.conditional_writes, conflicts + 1);
        assert_eq!(h.run(&["GET", "n"]), bulk("1"));
    }
}

#[test]
fn gives_up_after_the_bound() {
    let mut h = Harness::with(conflicting(RMW_ATTEMPTS_MAX));
    h.keyspace.seed("n", "10");
    let reply = h.run(&["INCR", "n"]);
    assert!(
        is_error_starting(&reply, "ERR key is contended"),
        "{reply:?}"
    );
    assert_eq!(h.keyspace.hook.conditional_writes, RMW_ATTEMPTS_MAX);
    assert_eq!(h.run(&["GET", "n"]), bulk("10"), "nothing written");
    // The bound is per command: the next one succeeds.
    assert_eq!(h.run(&["INCR", "n"]), int(11));
}

#[test]
fn every_rmw_command_retries() {
    let commands: &[(&[&str], Value)] = &[
        (&["SET", "k", "v", "GET"], bulk("0")),
        (&["SET", "k", "v", "XX"], ok()),
        (&["SET", "k", "v", "KEEPTTL"], ok()),
        (&["GETSET", "k", "v"], bulk("0")),
        (&["GETDEL", "k"], bulk("0")),
        (&["GETEX", "k", "EX", "100"], bulk("0")),
        (&["INCRBY", "k", "5"], int(5)),
        (&["DECRBY", "k", "5"], int(-5)),
        (&["INCRBYFLOAT", "k", "1.5"], bulk("1.5")),
        (&["APPEND", "k", "x"], int(2)),
        (&["SETRANGE", "k", "0", "ab"], int(2)),
        (&["EXPIRE", "k", "100"], int(1)),
        (&["PEXPIREAT", "k", "1"], int(1)),
    ];
    for (words, expected) in commands {
        let mut h = Harness::with(conflicting(3));
        h.keyspace.seed("k", "0");
        assert_eq!(&h.run(words), expected, "{words:?}");
        assert_eq!(h.keyspace.hook.conditional_writes, 4, "{words:?}");
    }
}

/// Before each of the first `races` conditional writes of the session, another
/// client's write lands on the same key: an increment by 100 (on a number) or an
/// append of `!` (on anything else).
struct Racing {
    races: usize,
}

fn racing(races: usize) -> Hooked<Racing> {
    Hooked::new(Racing { races })
}

impl Hook for Racing {
    fn before(&mut self, call: Call<'_>, store: &mut MemKeyspace) -> Result<(), KeyspaceError> {
        let Some((key, _, now_ms)) = call.conditional_write() else {
            return Ok(());
        };
        if self.races == 0 {
            return Ok(());
        }
        self.races -= 1;
        let current = store.get(key, now_ms).expect("get").map(|r| r.value);
        let value = match current.as_deref().map(std::str::from_utf8) {
            None => b"100".to_vec(),
            Some(Ok(text)) if text.parse::<i64>().is_ok() => {
                (text.parse::<i64>().expect("a number") + 100)
                    .to_string()
                    .into_bytes()
            }
            Some(_) => [current.as_deref().unwrap_or_default(), b"!"].concat(),
        };
        store
            .put(key, &value, None, Expect::Any, now_ms)
            .expect("put");
        Ok(())
    }
}

#[test]
fn no_increment_is_lost() {
    let mut h = Harness::with(racing(3));
    // The racer's 3 increments of 100 land between our reads and writes; ours is
    // applied after them, on the value they left.
    assert_eq!(h.run(&["INCRBY", "n", "1"]), int(301));
    assert_eq!(h.run(&["GET", "n"]), bulk("301"));
}

#[test]
fn appends_are_not_lost() {
    let mut h = Harness::with(racing(2));
    h.keyspace.seed("s", "a");
    assert_eq!(h.run(&["APPEND", "s", "b"]), int(4));
    assert_eq!(h.run(&["GET", "s"]), bulk("a!!b"));
}

#[test]
fn set_nx_loses_to_a_racing_creator() {
    let mut h = Harness::with(racing(1));
    assert_eq!(h.run(&["SET", "lock", "me", "NX"]), Value::Null);
    assert_eq!(h.run(&["GET", "lock"]), bulk("100"));
    let mut h = Harness::with(racing(1));
    assert_eq!(h.run(&["SETNX", "lock", "me"]), int(0));
}

#[test]
fn getdel_returns_what_it_deleted() {
    let mut h = Harness::with(racing(1));
    h.keyspace.seed("k", "7");
    assert_eq!(h.run(&["GETDEL", "k"]), bulk("107"));
    assert_eq!(h.run(&["EXISTS", "k"]), int(0));
}

#[test]
fn msetnx_loses_to_a_racing_creator() {
    // The racer creates "a" just before MSETNX's conditional write of it.
    let mut h = Harness::with(racing(1));
    assert_eq!(h.run(&["MSETNX", "a", "1", "b", "2"]), int(0));
    assert_eq!(
        h.run(&["MGET", "a", "b"]),
        array(vec![bulk("100"), Value::Null])
    );
}

/// Lets the first conditional write through and then creates the next key
/// before MSETNX writes it.
struct SecondKeyTaken {
    writes: usize,
}

impl Hook for SecondKeyTaken {
    fn before(&mut self, call: Call<'_>, store: &mut MemKeyspace) -> Result<(), KeyspaceError> {
        let Call::Put { key, now_ms, .. } = call else {
            return Ok(());
        };
        self.writes += 1;
        if self.writes == 2 {
            store.put(key, b"theirs", None, Expect::Any, now_ms)?;
        }
        Ok(())
    }
}

#[test]
fn msetnx_undoes_its_first_write() {
    let mut h = Harness::with(Hooked::new(SecondKeyTaken { writes: 0 }));
    assert_eq!(h.run(&["MSETNX", "a", "1", "b", "2"]), int(0));
    assert_eq!(
        h.run(&["MGET", "a", "b"]),
        array(vec![Value::Null, bulk("theirs")])
    );
}
