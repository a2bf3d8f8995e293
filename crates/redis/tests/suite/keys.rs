//! Key commands against MemKeyspace.

use std::collections::BTreeSet;

use rowankv_resp::{errors, Value};

use crate::support::*;

#[test]
fn del_unlink_exists_touch() {
    let mut h = Harness::new();
    h.run(&["MSET", "a", "1", "b", "2", "c", "3"]);
    assert_eq!(
        h.run(&["EXISTS", "a", "a", "nope"]),
        int(2),
        "a key named twice counts twice"
    );
    assert_eq!(h.run(&["TOUCH", "a", "b", "nope"]), int(2));
    assert_eq!(h.run(&["DEL", "a", "a", "nope"]), int(1));
    assert_eq!(h.run(&["UNLINK", "b", "c"]), int(2));
    assert_eq!(h.run(&["EXISTS", "a", "b", "c"]), int(0));
    assert_eq!(
        h.run(&["DEL"]),
        err("ERR wrong number of arguments for 'del' command")
    );
}

#[test]
fn expire_family() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["EXPIRE", "k", "10"]), int(0), "no key");
    h.run(&["SET", "k", "v"]);
    assert_eq!(h.run(&["EXPIRE", "k", "10"]), int(1));
    assert_eq!(h.run(&["TTL", "k"]), int(10));
    assert_eq!(h.run(&["PEXPIRE", "k", "1500"]), int(1));
    assert_eq!(h.run(&["PTTL", "k"]), int(1500));
    assert_eq!(
        h.run(&["TTL", "k"]),
        int(2),
        "TTL rounds to the nearest second"
    );
    let at = (NOW_MS / 1000 + 60).to_string();
    assert_eq!(h.run(&["EXPIREAT", "k", &at]), int(1));
    assert_eq!(
        h.run(&["EXPIRETIME", "k"]),
        int((NOW_MS / 1000 + 60) as i64)
    );
    let at_ms = (NOW_MS + 7).to_string();
    assert_eq!(h.run(&["PEXPIREAT", "k", &at_ms]), int(1));
    assert_eq!(h.run(&["PEXPIRETIME", "k"]), int((NOW_MS + 7) as i64));
    assert_eq!(h.run(&["GET", "k"]), bulk("v"), "EXPIRE keeps the value");
    // A time already past deletes the key and answers 1.
    assert_eq!(h.run(&["EXPIRE", "k", "-1"]), int(1));
    assert_eq!(h.run(&["EXISTS", "k"]), int(0));
    h.run(&["SET", "k", "v"]);
    assert_eq!(h.run(&["PEXPIRE", "k", "0"]), int(1));
    assert_eq!(h.run(&["EXISTS", "k"]), int(0));
}

#[test]
fn expire_flags() {
    let mut h = Harness::new();
    h.run(&["SET", "k", "v"]);
    assert_eq!(
        h.run(&["EXPIRE", "k", "100", "XX"]),
        int(0),
        "XX: no expiry yet"
    );
    assert_eq!(
        h.run(&["EXPIRE", "k", "100", "GT"]),
        int(0),
        "GT: no expiry is infinite"
    );
    assert_eq!(
        h.run(&["EXPIRE", "k", "100", "LT"]),
        int(1),
        "LT: less than infinite"
    );
    assert_eq!(
        h.run(&["EXPIRE", "k", "200", "NX"]),
        int(0),
        "NX: has an expiry"
    );
    assert_eq!(h.run(&["EXPIRE", "k", "200", "GT"]), int(1));
    assert_eq!(h.run(&["EXPIRE", "k", "100", "GT"]), int(0));
    assert_eq!(h.run(&["EXPIRE", "k", "300", "LT"]), int(0));
    assert_eq!(h.run(&["EXPIRE", "k", "50", "xx", "lt"]), int(1));
    assert_eq!(h.run(&["TTL", "k"]), int(50));
    assert_eq!(
        h.run(&["EXPIRE", "k", "5", "NX", "XX"]),
        err(errors::EXPIRE_NX_WITH_OTHERS)
    );
    assert_eq!(
        h.run(&["EXPIRE", "k", "5", "GT", "LT"]),
        err(errors::EXPIRE_GT_WITH_LT)
    );
    assert_eq!(
        h.run(&["EXPIRE", "k", "5", "FOO"]),
        err("ERR Unsupported option FOO")
    );
    // Options are checked before the time.
    assert_eq!(
        h.run(&["EXPIRE", "k", "x", "FOO"]),
        err("ERR Unsupported option FOO")
    );
    assert_eq!(h.run(&["EXPIRE", "k", "x"]), err(errors::NOT_AN_INTEGER));
}

#[test]
fn expire_overflow() {
    let mut h = Harness::new();
    h.run(&["SET", "k", "v"]);
    for (command, time) in [
        ("EXPIRE", "9223372036854775807"),
        ("EXPIRE", "-9223372036854775808"),
        ("PEXPIRE", "9223372036854775807"),
        ("EXPIREAT", "9223372036854776"),
    ] {
        let expected = format!(
            "ERR invalid expire time in '{}' command",
            command.to_ascii_lowercase()
        );
        assert_eq!(
            h.run(&[command, "k", time]),
            err(&expected),
            "{command} {time}"
        );
    }
    assert_eq!(h.run(&["PEXPIREAT", "k", "9223372036854775807"]), int(1));
    assert_eq!(h.run(&["PEXPIRETIME", "k"]), int(i64::MAX));
}

#[test]
fn ttl_pttl_persist() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["TTL", "k"]), int(-2));
    assert_eq!(h.run(&["PTTL", "k"]), int(-2));
    assert_eq!(h.run(&["EXPIRETIME", "k"]), int(-2));
    h.run(&["SET", "k", "v"]);
    assert_eq!(h.run(&["TTL", "k"]), int(-1));
    assert_eq!(h.run(&["PEXPIRETIME", "k"]), int(-1));
    assert_eq!(h.run(&["PERSIST", "k"]), int(0), "no expiry to remove");
    assert_eq!(h.run(&["PERSIST", "nope"]), int(0));
    h.run(&["PEXPIRE", "k", "1499"]);
    assert_eq!(h.run(&["TTL", "k"]), int(1));
    h.advance_ms(1000);
    assert_eq!(h.run(&["PTTL", "k"]), int(499));
    assert_eq!(h.run(&["TTL", "k"]), int(0));
    assert_eq!(h.run(&["PERSIST", "k"]), int(1));
    assert_eq!(h.run(&["TTL", "k"]), int(-1));
    h.advance_ms(10_000);
    assert_eq!(h.run(&["GET", "k"]), bulk("v"));
}

#[test]
fn type_command() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["TYPE", "k"]), Value::simple("none"));
    h.run(&["SET", "k", "v"]);
    assert_eq!(h.run(&["TYPE", "k"]), Value::simple("string"));
}

/// Runs a SCAN to its end and returns every key it gave.
fn scan_all(h: &mut Harness, extra: &[&str]) -> Vec<String> {
    let mut cursor = "0".to_string();
    let mut keys = Vec::new();
    for _ in 0..10_000 {
        let mut words = vec!["SCAN", cursor.as_str()];
        words.extend_from_slice(extra);
        let reply = h.run(&words);
        let Value::Array(parts) = reply else {
            panic!("SCAN answered {reply:?}");
        };
        let [next, Value::Array(batch)] = parts.as_slice() else {
            panic!("SCAN answered {parts:?}");
        };
        keys.extend(batch.iter().map(text));
        cursor = text(next);
        if cursor == "0" {
            return keys;
        }
    }
    panic!("SCAN did not end");
}

#[test]
fn scan() {
    let mut h = Harness::new();
    let mut expected = BTreeSet::new();
    for i in 0..250 {
        let key = format!("key:{i}");
        h.run(&["SET", &key, "v"]);
        expected.insert(key);
    }
    h.run(&["SET", "other", "v"]);
    let all: BTreeSet<String> = scan_all(&mut h, &[]).into_iter().collect();
    assert_eq!(all.len(), 251);
    let matched: BTreeSet<String> = scan_all(&mut h, &["MATCH", "key:*", "COUNT", "7"])
        .into_iter()
        .collect();
    assert_eq!(matched, expected);
    assert_eq!(
        scan_all(&mut h, &["MATCH", "oth?r"]),
        vec!["other".to_string()]
    );
    assert_eq!(scan_all(&mut h, &["TYPE", "STRING"]).len(), 251);
    assert!(scan_all(&mut h, &["TYPE", "hash"]).is_empty());
    assert!(scan_all(&mut h, &["TYPE", "nonsense"]).is_empty());
    assert_eq!(scan_all(&mut h, &["COUNT", "1000"]).len(), 251);
}

#[test]
fn scan_errors() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["SCAN", "x"]), err(errors::INVALID_CURSOR));
    assert_eq!(h.run(&["SCAN", "-1"]), err(errors::INVALID_CURSOR));
    assert_eq!(h.run(&["SCAN", "0", "COUNT", "0"]), err(errors::SYNTAX));
    assert_eq!(
        h.run(&["SCAN", "0", "COUNT", "x"]),
        err(errors::NOT_AN_INTEGER)
    );
    assert_eq!(h.run(&["SCAN", "0", "MATCH"]), err(errors::SYNTAX));
    assert_eq!(h.run(&["SCAN", "0", "FOO", "bar"]), err(errors::SYNTAX));
    assert_eq!(
        h.run(&["SCAN"]),
        err("ERR wrong number of arguments for 'scan' command")
    );
    assert_eq!(h.run(&["SCAN", "0"]), array(vec![bulk("0"), array(vec![])]));
}

#[test]
fn keys_command() {
    let mut h = Harness::new();
    for key in ["hello", "hallo", "hxllo", "hllo", "heeeello", "other"] {
        h.run(&["SET", key, "v"]);
    }
    let sorted = |value: Value| -> Vec<String> {
        let Value::Array(items) = value else {
            panic!("{value:?}")
        };
        let mut keys: Vec<String> = items.iter().map(text).collect();
        keys.sort();
        keys
    };
    assert_eq!(
        sorted(h.run(&["KEYS", "h?llo"])),
        ["hallo", "hello", "hxllo"]
    );
    assert_eq!(
        sorted(h.run(&["KEYS", "h*llo"])),
        ["hallo", "heeeello", "hello", "hllo", "hxllo"]
    );
    assert_eq!(sorted(h.run(&["KEYS", "h[ae]llo"])), ["hallo", "hello"]);
    assert_eq!(sorted(h.run(&["KEYS", "h[^e]llo"])), ["hallo", "hxllo"]);
    assert_eq!(sorted(h.run(&["KEYS", "*"])).len(), 6);
    assert_eq!(sorted(h.run(&["KEYS", "nothing*"])).len(), 0);
}

#[test]
fn dbsize_and_flushall() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["DBSIZE"]), int(0));
    h.run(&["MSET", "a", "1", "b", "2"]);
    h.run(&["SET", "c", "3", "PX", "10"]);
    assert_eq!(h.run(&["DBSIZE"]), int(3));
    h.advance_ms(11);
    assert_eq!(h.run(&["DBSIZE"]), int(2));
    assert_eq!(
        h.run(&["FLUSHALL"]),
        err("ERR FLUSHALL is disabled on this RowanKV server (flushall_enabled is off)")
    );
    assert_eq!(
        h.run(&["FLUSHDB", "ASYNC"]),
        err("ERR FLUSHDB is disabled on this RowanKV server (flushall_enabled is off)")
    );
    assert_eq!(h.run(&["DBSIZE"]), int(2));
    h.ctx.flushall_enabled = true;
    assert_eq!(h.run(&["FLUSHALL", "BOGUS"]), err(errors::SYNTAX));
    assert_eq!(h.run(&["FLUSHALL", "SYNC", "ASYNC"]), err(errors::SYNTAX));
    assert_eq!(h.run(&["FLUSHALL", "sync"]), ok());
    assert_eq!(h.run(&["DBSIZE"]), int(0));
    h.run(&["SET", "a", "1"]);
    assert_eq!(h.run(&["FLUSHDB"]), ok());
    assert_eq!(h.run(&["DBSIZE"]), int(0));
}
