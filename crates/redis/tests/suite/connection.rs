//! Connection commands, protocol switching, authentication, unknown commands.

use rowankv_resp::{errors, Protocol, Value};

use crate::support::*;

#[test]
fn ping_echo() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["PING"]), Value::simple("PONG"));
    assert_eq!(h.run(&["PING", "hi"]), bulk("hi"));
    assert_eq!(
        h.run(&["PING", "a", "b"]),
        err("ERR wrong number of arguments for 'ping' command")
    );
    assert_eq!(h.run(&["ECHO", "x y"]), bulk("x y"));
    assert_eq!(
        h.run(&["ECHO"]),
        err("ERR wrong number of arguments for 'echo' command")
    );
}

#[test]
fn unknown_commands_and_subcommands() {
    let mut h = Harness::new();
    assert_eq!(
        h.run(&["LPUSH", "list", "x"]),
        err("ERR unknown command 'LPUSH', with args beginning with: 'list' 'x' ")
    );
    assert_eq!(
        h.run(&["MULTI"]),
        err("ERR unknown command 'MULTI', with args beginning with: ")
    );
    assert_eq!(
        h.run(&["CLIENT", "KILL", "x"]),
        err("ERR unknown subcommand 'KILL'. Try CLIENT HELP.")
    );
    assert_eq!(
        h.run(&["CLIENT"]),
        err("ERR wrong number of arguments for 'client' command")
    );
    assert_eq!(
        h.run(&["CLIENT", "SETNAME"]),
        err("ERR wrong number of arguments for 'client|setname' command")
    );
    let help = h.run(&["CLIENT", "HELP"]);
    let Value::Array(lines) = help else {
        panic!("{help:?}")
    };
    assert!(lines.contains(&Value::simple("SETNAME")));
    let outcome = h.execute(vec![Vec::new()]);
    assert_eq!(
        outcome.replies,
        vec![err("ERR unknown command '', with args beginning with: ")]
    );
}

#[test]
fn hello_switches_protocol() {
    let mut h = Harness::new();
    assert_eq!(h.session.protocol(), Protocol::Resp2);
    let reply = h.run(&["HELLO", "3"]);
    assert_eq!(h.session.protocol(), Protocol::Resp3);
    assert_eq!(
        reply,
        Value::Map(vec![
            (bulk("server"), bulk("rowankv")),
            (bulk("version"), bulk("7.2.0")),
            (bulk("proto"), int(3)),
            (bulk("id"), int(7)),
            (bulk("mode"), bulk("standalone")),
            (bulk("role"), bulk("master")),
            (bulk("modules"), array(vec![])),
        ])
    );
    let wire = h.wire(&["HELLO"]);
    assert!(
        wire.starts_with("%7\r\n$6\r\nserver\r\n$7\r\nrowankv\r\n"),
        "{wire}"
    );
    let wire = h.wire(&["HELLO", "2"]);
    assert!(wire.starts_with("*14\r\n$6\r\nserver\r\n"), "{wire}");
    assert!(wire.contains("$5\r\nproto\r\n:2\r\n"), "{wire}");
    assert_eq!(h.session.protocol(), Protocol::Resp2);
}

#[test]
fn hello_errors() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["HELLO", "4"]), err(errors::NOPROTO));
    assert_eq!(h.run(&["HELLO", "1"]), err(errors::NOPROTO));
    assert_eq!(
        h.run(&["HELLO", "three"]),
        err(errors::PROTOCOL_VERSION_NOT_INTEGER)
    );
    assert_eq!(
        h.run(&["HELLO", "3", "AUTH", "default"]),
        err("ERR Syntax error in HELLO option 'AUTH'")
    );
    assert_eq!(
        h.run(&["HELLO", "3", "FOO"]),
        err("ERR Syntax error in HELLO option 'FOO'")
    );
    assert_eq!(
        h.run(&["HELLO", "3", "SETNAME", "a b"]),
        err(errors::CLIENT_NAME_INVALID)
    );
    assert_eq!(
        h.session.protocol(),
        Protocol::Resp2,
        "a failed HELLO changes nothing"
    );
    assert!(!h.run(&["HELLO", "3", "SETNAME", "conn1"]).is_error());
    assert_eq!(h.run(&["CLIENT", "GETNAME"]), bulk("conn1"));
}

#[test]
fn reply_shapes_per_protocol() {
    let mut h = Harness::new();
    h.run(&["SET", "k", "v", "EX", "100"]);
    let resp2 = [
        h.wire(&["GET", "missing"]),
        h.wire(&["TTL", "k"]),
        h.wire(&["MGET", "k", "missing"]),
        h.wire(&["CONFIG", "GET", "databases"]),
        h.wire(&["SET", "k", "v", "NX"]),
        h.wire(&["INFO", "clients"]),
    ];
    assert_eq!(resp2[0], "$-1\r\n");
    assert_eq!(resp2[1], ":100\r\n");
    assert_eq!(resp2[2], "*2\r\n$1\r\nv\r\n$-1\r\n");
    assert_eq!(resp2[3], "*2\r\n$9\r\ndatabases\r\n$1\r\n1\r\n");
    assert_eq!(resp2[4], "$-1\r\n");
    assert!(resp2[5].starts_with("$"), "{}", resp2[5]);
    h.run(&["HELLO", "3"]);
    assert_eq!(h.wire(&["GET", "missing"]), "_\r\n");
    assert_eq!(h.wire(&["TTL", "k"]), ":100\r\n");
    assert_eq!(h.wire(&["MGET", "k", "missing"]), "*2\r\n$1\r\nv\r\n_\r\n");
    assert_eq!(
        h.wire(&["CONFIG", "GET", "databases"]),
        "%1\r\n$9\r\ndatabases\r\n$1\r\n1\r\n"
    );
    assert_eq!(h.wire(&["SET", "k", "v", "NX"]), "_\r\n");
    assert!(h.wire(&["INFO", "clients"]).starts_with("="));
    assert_eq!(h.wire(&["CLIENT", "GETNAME"]), "_\r\n");
}

#[test]
fn auth_gates_commands() {
    let mut h = Harness::new();
    h.ctx.requirepass = Some(b"s3cret".to_vec());
    assert!(!h.session.is_authenticated(&h.ctx));
    assert_eq!(h.run(&["GET", "k"]), err(errors::NOAUTH));
    assert_eq!(h.run(&["PING"]), err(errors::NOAUTH));
    assert_eq!(h.run(&["CLIENT", "ID"]), err(errors::NOAUTH));
    // Unknown commands and arity are checked before authentication, as in Redis.
    assert!(is_error_starting(
        &h.run(&["LPUSH", "l", "x"]),
        "ERR unknown command"
    ));
    assert!(is_error_starting(&h.run(&["GET"]), "ERR wrong number"));
    assert_eq!(h.run(&["HELLO", "3"]), err(errors::NOAUTH_HELLO));
    assert_eq!(h.session.protocol(), Protocol::Resp2);
    assert_eq!(h.run(&["AUTH", "wrong"]), err(errors::WRONGPASS));
    assert_eq!(h.run(&["AUTH", "admin", "s3cret"]), err(errors::WRONGPASS));
    assert_eq!(h.run(&["AUTH", "a", "b", "c"]), err(errors::SYNTAX));
    assert_eq!(h.run(&["GET", "k"]), err(errors::NOAUTH));
    assert_eq!(h.run(&["AUTH", "s3cret"]), ok());
    assert!(h.session.is_authenticated(&h.ctx));
    assert_eq!(h.run(&["GET", "k"]), Value::Null);
    // RESET forgets the authentication.
    assert_eq!(h.run(&["RESET"]), Value::simple("RESET"));
    assert_eq!(h.run(&["GET", "k"]), err(errors::NOAUTH));
    assert_eq!(h.run(&["AUTH", "default", "s3cret"]), ok());
    assert_eq!(h.run(&["GET", "k"]), Value::Null);
}

#[test]
fn hello_auth() {
    let mut h = Harness::new();
    h.ctx.requirepass = Some(b"pw".to_vec());
    assert_eq!(
        h.run(&["HELLO", "3", "AUTH", "default", "bad"]),
        err(errors::WRONGPASS)
    );
    assert_eq!(h.session.protocol(), Protocol::Resp2);
    let reply = h.run(&["HELLO", "3", "AUTH", "default", "pw", "SETNAME", "me"]);
    assert!(matches!(reply, Value::Map(_)), "{reply:?}");
    assert_eq!(h.session.protocol(), Protocol::Resp3);
    assert_eq!(h.session.name(), Some(&b"me"[..]));
    assert_eq!(h.run(&["GET", "k"]), Value::Null);
}

#[test]
fn auth_without_password() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["AUTH", "x"]), err(errors::AUTH_WITHOUT_PASSWORD));
    // The default user has no password: any password passes, another user does not.
    assert_eq!(h.run(&["AUTH", "default", "anything"]), ok());
    assert_eq!(
        h.run(&["AUTH", "someone", "anything"]),
        err(errors::WRONGPASS)
    );
    assert!(!h.run(&["HELLO", "3", "AUTH", "default", "x"]).is_error());
}

#[test]
fn quit_closes() {
    let mut h = Harness::new();
    let outcome = h.execute(vec![b"QUIT".to_vec()]);
    assert_eq!(outcome.replies, vec![ok()]);
    assert!(outcome.close);
    h.ctx.requirepass = Some(b"pw".to_vec());
    let outcome = h.execute(vec![b"quit".to_vec()]);
    assert!(outcome.close, "QUIT needs no authentication");
    let outcome = h.execute(vec![b"PING".to_vec()]);
    assert!(!outcome.close);
}

#[test]
fn select() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["SELECT", "0"]), ok());
    assert_eq!(h.run(&["SELECT", "1"]), err(errors::DB_INDEX_OUT_OF_RANGE));
    assert_eq!(h.run(&["SELECT", "-1"]), err(errors::DB_INDEX_OUT_OF_RANGE));
    assert_eq!(h.run(&["SELECT", "x"]), err(errors::NOT_AN_INTEGER));
    assert_eq!(
        h.run(&["SELECT", "4294967296"]),
        err("ERR value is out of range")
    );
}

#[test]
fn reset_restores_a_new_connections_state() {
    let mut h = Harness::new();
    h.run(&["HELLO", "3", "SETNAME", "n"]);
    assert_eq!(h.run(&["RESET"]), Value::simple("RESET"));
    assert_eq!(h.session.protocol(), Protocol::Resp2);
    assert_eq!(h.session.name(), None);
    assert_eq!(h.session.id(), 7);
}

#[test]
fn client_commands() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["CLIENT", "GETNAME"]), Value::Null);
    assert_eq!(h.run(&["CLIENT", "SETNAME", "worker-1"]), ok());
    assert_eq!(h.run(&["client", "getname"]), bulk("worker-1"));
    assert_eq!(
        h.run(&["CLIENT", "SETNAME", "has space"]),
        err(errors::CLIENT_NAME_INVALID)
    );
    assert_eq!(
        h.run(&["CLIENT", "SETNAME", "new\nline"]),
        err(errors::CLIENT_NAME_INVALID)
    );
    assert_eq!(h.run(&["CLIENT", "SETNAME", ""]), ok());
    assert_eq!(h.run(&["CLIENT", "GETNAME"]), Value::Null);
    assert_eq!(h.run(&["CLIENT", "ID"]), int(7));
    assert_eq!(h.run(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]), ok());
    assert_eq!(h.run(&["CLIENT", "SETINFO", "lib-ver", "5.0.1"]), ok());
    assert_eq!(
        h.session.lib(),
        (Some(&b"redis-py"[..]), Some(&b"5.0.1"[..]))
    );
    assert_eq!(
        h.run(&["CLIENT", "SETINFO", "color", "red"]),
        err("ERR Unrecognized option 'color'")
    );
    assert_eq!(
        h.run(&["CLIENT", "SETINFO", "lib-name", "a b"]),
        err("ERR lib-name cannot contain spaces, newlines or special characters.")
    );
    h.session.set_addresses("10.0.0.5:50000", "10.0.0.1:6379");
    h.run(&["CLIENT", "SETNAME", "w"]);
    let info = text(&h.run(&["CLIENT", "INFO"]));
    assert!(
        info.starts_with("id=7 addr=10.0.0.5:50000 laddr=10.0.0.1:6379 "),
        "{info}"
    );
    assert!(
        info.contains(" name=w ") && info.contains(" lib-name=redis-py lib-ver=5.0.1\n"),
        "{info}"
    );
}
