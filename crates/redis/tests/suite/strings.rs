//! String commands against MemKeyspace.

use rowankv_resp::{errors, Value};

use crate::support::*;

const INVALID_SET_EXPIRE: &str = "ERR invalid expire time in 'set' command";

#[test]
fn get_and_set() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["GET", "k"]), Value::Null);
    assert_eq!(h.run(&["SET", "k", "v"]), ok());
    assert_eq!(h.run(&["get", "k"]), bulk("v"));
    assert_eq!(h.run(&["SET", "k", ""]), ok());
    assert_eq!(h.run(&["GET", "k"]), bulk(""));
    assert_eq!(
        h.run(&["GET"]),
        err("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        h.run(&["GET", "a", "b"]),
        err("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        h.run(&["SET", "k"]),
        err("ERR wrong number of arguments for 'set' command")
    );
}

#[test]
fn binary_keys_and_values() {
    let mut h = Harness::new();
    let key = b"\x00\xff\r\n key".to_vec();
    let value = b"\r\n\x00\x01".to_vec();
    h.execute(vec![b"SET".to_vec(), key.clone(), value.clone()]);
    let outcome = h.execute(vec![b"GET".to_vec(), key]);
    assert_eq!(outcome.replies, vec![Value::BulkString(value)]);
}

#[test]
fn set_nx_xx() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["SET", "k", "1", "XX"]), Value::Null);
    assert_eq!(h.run(&["GET", "k"]), Value::Null);
    assert_eq!(h.run(&["SET", "k", "1", "NX"]), ok());
    assert_eq!(h.run(&["SET", "k", "2", "nx"]), Value::Null);
    assert_eq!(h.run(&["GET", "k"]), bulk("1"));
    assert_eq!(h.run(&["SET", "k", "3", "XX"]), ok());
    assert_eq!(h.run(&["GET", "k"]), bulk("3"));
    assert_eq!(h.run(&["SET", "k", "3", "NX", "XX"]), err(errors::SYNTAX));
}

#[test]
fn set_get_option() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["SET", "k", "1", "GET"]), Value::Null);
    assert_eq!(h.run(&["SET", "k", "2", "GET"]), bulk("1"));
    // NX with GET (Redis 7): the old value, and nothing set.
    assert_eq!(h.run(&["SET", "k", "3", "NX", "GET"]), bulk("2"));
    assert_eq!(h.run(&["GET", "k"]), bulk("2"));
    assert_eq!(h.run(&["SET", "new", "3", "NX", "GET"]), Value::Null);
    assert_eq!(h.run(&["GET", "new"]), bulk("3"));
    assert_eq!(h.run(&["SET", "absent", "1", "XX", "GET"]), Value::Null);
    assert_eq!(h.run(&["EXISTS", "absent"]), int(0));
}

#[test]
fn set_expiry_options() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["SET", "a", "v", "EX", "10"]), ok());
    assert_eq!(h.run(&["PTTL", "a"]), int(10_000));
    assert_eq!(h.run(&["SET", "b", "v", "PX", "1500"]), ok());
    assert_eq!(h.run(&["PTTL", "b"]), int(1_500));
    let at_s = (NOW_MS / 1000 + 100).to_string();
    assert_eq!(h.run(&["SET", "c", "v", "EXAT", &at_s]), ok());
    assert_eq!(h.run(&["TTL", "c"]), int(100));
    let at_ms = (NOW_MS + 2_500).to_string();
    assert_eq!(h.run(&["SET", "d", "v", "PXAT", &at_ms]), ok());
    assert_eq!(h.run(&["PEXPIRETIME", "d"]), int((NOW_MS + 2_500) as i64));
    // A plain SET drops the TTL; KEEPTTL keeps it.
    assert_eq!(h.run(&["SET", "a", "w"]), ok());
    assert_eq!(h.run(&["TTL", "a"]), int(-1));
    assert_eq!(h.run(&["SET", "b", "w", "KEEPTTL"]), ok());
    assert_eq!(h.run(&["PTTL", "b"]), int(1_500));
    assert_eq!(h.run(&["GET", "b"]), bulk("w"));
    // Expiry in the past: OK, and the key is gone.
    assert_eq!(h.run(&["SET", "d", "v", "PXAT", "1"]), ok());
    assert_eq!(h.run(&["EXISTS", "d"]), int(0));
    // The key expires after its time.
    h.advance_ms(1_500);
    assert_eq!(h.run(&["GET", "b"]), bulk("w"));
    h.advance_ms(1);
    assert_eq!(h.run(&["GET", "b"]), Value::Null);
}

#[test]
fn set_expiry_errors() {
    let mut h = Harness::new();
    for bad in ["0", "-5"] {
        assert_eq!(
            h.run(&["SET", "k", "v", "EX", bad]),
            err(INVALID_SET_EXPIRE)
        );
        assert_eq!(
            h.run(&["SET", "k", "v", "PXAT", bad]),
            err(INVALID_SET_EXPIRE)
        );
    }
    assert_eq!(
        h.run(&["SET", "k", "v", "EX", "9223372036854775807"]),
        err(INVALID_SET_EXPIRE)
    );
    assert_eq!(
        h.run(&["SET", "k", "v", "PX", "9223372036854775807"]),
        err(INVALID_SET_EXPIRE)
    );
    assert_eq!(
        h.run(&["SET", "k", "v", "EX", "1.5"]),
        err(errors::NOT_AN_INTEGER)
    );
    assert_eq!(
        h.run(&["SET", "k", "v", "EX", "+5"]),
        err(errors::NOT_AN_INTEGER)
    );
    assert_eq!(h.run(&["SET", "k", "v", "EX"]), err(errors::SYNTAX));
    assert_eq!(
        h.run(&["SET", "k", "v", "EX", "5", "PX", "5"]),
        err(errors::SYNTAX)
    );
    assert_eq!(
        h.run(&["SET", "k", "v", "KEEPTTL", "EX", "5"]),
        err(errors::SYNTAX)
    );
    assert_eq!(h.run(&["SET", "k", "v", "PERSIST"]), err(errors::SYNTAX));
    assert_eq!(h.run(&["SET", "k", "v", "BOGUS"]), err(errors::SYNTAX));
    // Syntax is checked before the expiry's value.
    assert_eq!(
        h.run(&["SET", "k", "v", "EX", "0", "NOPE"]),
        err(errors::SYNTAX)
    );
    assert_eq!(h.run(&["EXISTS", "k"]), int(0));
}

#[test]
fn setnx_setex_psetex() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["SETNX", "k", "1"]), int(1));
    assert_eq!(h.run(&["SETNX", "k", "2"]), int(0));
    assert_eq!(h.run(&["GET", "k"]), bulk("1"));
    assert_eq!(h.run(&["SETEX", "k", "10", "v"]), ok());
    assert_eq!(h.run(&["TTL", "k"]), int(10));
    assert_eq!(h.run(&["PSETEX", "k", "10", "v"]), ok());
    assert_eq!(h.run(&["PTTL", "k"]), int(10));
    assert_eq!(
        h.run(&["SETEX", "k", "0", "v"]),
        err("ERR invalid expire time in 'setex' command")
    );
    assert_eq!(
        h.run(&["PSETEX", "k", "-1", "v"]),
        err("ERR invalid expire time in 'psetex' command")
    );
    assert_eq!(
        h.run(&["SETEX", "k", "x", "v"]),
        err(errors::NOT_AN_INTEGER)
    );
    assert_eq!(
        h.run(&["SETEX", "k", "1"]),
        err("ERR wrong number of arguments for 'setex' command")
    );
}

#[test]
fn getset_getdel_getex() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["GETSET", "k", "1"]), Value::Null);
    assert_eq!(h.run(&["EXPIRE", "k", "100"]), int(1));
    assert_eq!(h.run(&["GETSET", "k", "2"]), bulk("1"));
    assert_eq!(h.run(&["TTL", "k"]), int(-1), "GETSET drops the TTL");
    assert_eq!(h.run(&["GETDEL", "k"]), bulk("2"));
    assert_eq!(h.run(&["GETDEL", "k"]), Value::Null);
    assert_eq!(h.run(&["EXISTS", "k"]), int(0));

    assert_eq!(h.run(&["GETEX", "k"]), Value::Null);
    assert_eq!(h.run(&["GETEX", "k", "EX", "5"]), Value::Null);
    assert_eq!(h.run(&["EXISTS", "k"]), int(0), "GETEX does not create");
    h.run(&["SET", "k", "v"]);
    assert_eq!(h.run(&["GETEX", "k", "EX", "5"]), bulk("v"));
    assert_eq!(h.run(&["TTL", "k"]), int(5));
    assert_eq!(h.run(&["GETEX", "k", "PX", "300"]), bulk("v"));
    assert_eq!(h.run(&["PTTL", "k"]), int(300));
    assert_eq!(h.run(&["GETEX", "k", "PERSIST"]), bulk("v"));
    assert_eq!(h.run(&["TTL", "k"]), int(-1));
    assert_eq!(h.run(&["GETEX", "k"]), bulk("v"));
    assert_eq!(h.run(&["GETEX", "k", "EXAT", "1"]), bulk("v"));
    assert_eq!(
        h.run(&["EXISTS", "k"]),
        int(0),
        "an EXAT in the past deletes"
    );
    assert_eq!(h.run(&["GETEX", "k", "NX"]), err(errors::SYNTAX));
    assert_eq!(h.run(&["GETEX", "k", "KEEPTTL"]), err(errors::SYNTAX));
    assert_eq!(
        h.run(&["GETEX", "k", "EX", "5", "PERSIST"]),
        err(errors::SYNTAX)
    );
    assert_eq!(
        h.run(&["GETEX", "k", "EX", "0"]),
        err("ERR invalid expire time in 'getex' command")
    );
}

#[test]
fn mget_mset_msetnx() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["MSET", "a", "1", "b", "2"]), ok());
    assert_eq!(
        h.run(&["MGET", "a", "nope", "b"]),
        array(vec![bulk("1"), Value::Null, bulk("2")])
    );
    assert_eq!(
        h.run(&["MSET", "a", "1", "b"]),
        err("ERR wrong number of arguments for 'mset' command")
    );
    assert_eq!(h.run(&["MSETNX", "a", "9", "c", "3"]), int(0));
    assert_eq!(h.run(&["EXISTS", "c"]), int(0));
    assert_eq!(h.run(&["GET", "a"]), bulk("1"));
    assert_eq!(h.run(&["MSETNX", "c", "3", "d", "4"]), int(1));
    assert_eq!(h.run(&["MGET", "c", "d"]), bulks(&["3", "4"]));
    // A key named twice takes its last value, as in Redis.
    assert_eq!(h.run(&["MSETNX", "e", "1", "e", "2"]), int(1));
    assert_eq!(h.run(&["GET", "e"]), bulk("2"));
    assert_eq!(
        h.run(&["MSETNX", "x", "1", "y"]),
        err("ERR wrong number of arguments for 'msetnx' command")
    );
    assert_eq!(
        h.run(&["MGET"]),
        err("ERR wrong number of arguments for 'mget' command")
    );
}

#[test]
fn counters() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["INCR", "n"]), int(1));
    assert_eq!(h.run(&["INCRBY", "n", "41"]), int(42));
    assert_eq!(h.run(&["DECR", "n"]), int(41));
    assert_eq!(h.run(&["DECRBY", "n", "-9"]), int(50));
    assert_eq!(h.run(&["GET", "n"]), bulk("50"));
    assert_eq!(h.run(&["DECRBY", "fresh", "5"]), int(-5));
    assert_eq!(h.run(&["INCRBY", "n", "x"]), err(errors::NOT_AN_INTEGER));
    assert_eq!(h.run(&["INCRBY", "n", " 1"]), err(errors::NOT_AN_INTEGER));
    assert_eq!(h.run(&["INCRBY", "n", "01"]), err(errors::NOT_AN_INTEGER));
    assert_eq!(
        h.run(&["INCRBY", "n", "9223372036854775808"]),
        err(errors::NOT_AN_INTEGER)
    );
    h.run(&["SET", "s", "abc"]);
    assert_eq!(h.run(&["INCR", "s"]), err(errors::NOT_AN_INTEGER));
    h.run(&["SET", "s", " 1"]);
    assert_eq!(h.run(&["INCR", "s"]), err(errors::NOT_AN_INTEGER));
    h.run(&["SET", "max", "9223372036854775807"]);
    assert_eq!(h.run(&["INCR", "max"]), err(errors::INCR_OVERFLOW));
    h.run(&["SET", "min", "-9223372036854775808"]);
    assert_eq!(h.run(&["DECR", "min"]), err(errors::INCR_OVERFLOW));
    assert_eq!(
        h.run(&["DECRBY", "n", "-9223372036854775808"]),
        err("ERR decrement would overflow")
    );
    assert_eq!(
        h.run(&["GET", "max"]),
        bulk("9223372036854775807"),
        "unchanged after an error"
    );
    // INCR keeps the TTL.
    h.run(&["SET", "t", "1", "EX", "100"]);
    assert_eq!(h.run(&["INCR", "t"]), int(2));
    assert_eq!(h.run(&["TTL", "t"]), int(100));
}

#[test]
fn incrbyfloat() {
    let mut h = Harness::new();
    h.run(&["SET", "f", "10.50"]);
    assert_eq!(h.run(&["INCRBYFLOAT", "f", "0.1"]), bulk("10.6"));
    assert_eq!(h.run(&["INCRBYFLOAT", "f", "-5"]), bulk("5.6"));
    h.run(&["SET", "f", "5.0e3"]);
    assert_eq!(h.run(&["INCRBYFLOAT", "f", "2.0e2"]), bulk("5200"));
    assert_eq!(h.run(&["GET", "f"]), bulk("5200"));
    assert_eq!(h.run(&["INCRBYFLOAT", "new", "1.5"]), bulk("1.5"));
    assert_eq!(
        h.run(&["INCRBYFLOAT", "f", "abc"]),
        err(errors::NOT_A_FLOAT)
    );
    assert_eq!(
        h.run(&["INCRBYFLOAT", "f", "nan"]),
        err(errors::NOT_A_FLOAT)
    );
    assert_eq!(
        h.run(&["INCRBYFLOAT", "f", "inf"]),
        err("ERR increment would produce NaN or Infinity")
    );
    h.run(&["SET", "s", "x"]);
    assert_eq!(h.run(&["INCRBYFLOAT", "s", "1"]), err(errors::NOT_A_FLOAT));
    h.run(&["SET", "z", "1"]);
    assert_eq!(h.run(&["INCRBYFLOAT", "z", "-1"]), bulk("0"));
}

#[test]
fn append_and_strlen() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["STRLEN", "k"]), int(0));
    assert_eq!(h.run(&["APPEND", "k", "Hello"]), int(5));
    assert_eq!(h.run(&["APPEND", "k", " World"]), int(11));
    assert_eq!(h.run(&["GET", "k"]), bulk("Hello World"));
    assert_eq!(h.run(&["STRLEN", "k"]), int(11));
    h.run(&["EXPIRE", "k", "50"]);
    h.run(&["APPEND", "k", "!"]);
    assert_eq!(h.run(&["TTL", "k"]), int(50), "APPEND keeps the TTL");
}

#[test]
fn setrange_and_getrange() {
    let mut h = Harness::new();
    h.run(&["SET", "k", "Hello World"]);
    assert_eq!(h.run(&["SETRANGE", "k", "6", "Redis"]), int(11));
    assert_eq!(h.run(&["GET", "k"]), bulk("Hello Redis"));
    assert_eq!(h.run(&["SETRANGE", "pad", "3", "x"]), int(4));
    assert_eq!(h.run(&["GET", "pad"]), Value::bulk(&b"\0\0\0x"[..]));
    assert_eq!(h.run(&["SETRANGE", "none", "5", ""]), int(0));
    assert_eq!(
        h.run(&["EXISTS", "none"]),
        int(0),
        "an empty SETRANGE creates nothing"
    );
    assert_eq!(h.run(&["SETRANGE", "k", "100", ""]), int(11));
    assert_eq!(
        h.run(&["SETRANGE", "k", "-1", "x"]),
        err("ERR offset is out of range")
    );
    assert_eq!(
        h.run(&["SETRANGE", "k", "x", "x"]),
        err(errors::NOT_AN_INTEGER)
    );
    assert_eq!(
        h.run(&["SETRANGE", "k", "536870912", "x"]),
        err(errors::STRING_TOO_LONG)
    );
    assert_eq!(
        h.run(&["SETRANGE", "k", "9223372036854775807", "x"]),
        err(errors::STRING_TOO_LONG)
    );

    h.run(&["SET", "s", "This is a string"]);
    assert_eq!(h.run(&["GETRANGE", "s", "0", "3"]), bulk("This"));
    assert_eq!(h.run(&["GETRANGE", "s", "-3", "-1"]), bulk("ing"));
    assert_eq!(
        h.run(&["GETRANGE", "s", "0", "-1"]),
        bulk("This is a string")
    );
    assert_eq!(h.run(&["GETRANGE", "s", "10", "100"]), bulk("string"));
    assert_eq!(h.run(&["SUBSTR", "s", "0", "3"]), bulk("This"));
    assert_eq!(h.run(&["GETRANGE", "missing", "0", "-1"]), bulk(""));
    assert_eq!(
        h.run(&["GETRANGE", "s", "a", "1"]),
        err(errors::NOT_AN_INTEGER)
    );
}

#[test]
fn append_refuses_strings_over_512_mib() {
    let mut h = Harness::new();
    // Make a value just under the limit without sending it: SETRANGE pads.
    let limit = 512 * 1024 * 1024;
    assert_eq!(
        h.run(&["SETRANGE", "big", &(limit - 2).to_string(), "ab"]),
        int(limit)
    );
    assert_eq!(h.run(&["APPEND", "big", "c"]), err(errors::STRING_TOO_LONG));
    assert_eq!(h.run(&["STRLEN", "big"]), int(limit));
    assert_eq!(h.run(&["DEL", "big"]), int(1));
}
