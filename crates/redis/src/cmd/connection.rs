//! Connection commands: PING, ECHO, HELLO, AUTH, SELECT, QUIT, RESET, CLIENT.

use rowankv_resp::{errors, Protocol, Value};

use super::{int_arg, is};
use crate::fail::{fail, fail_bytes, Fail, Reply};
use crate::session::{self, Call};

pub(crate) fn ping(call: &mut Call<'_>) -> Reply {
    match call.argv {
        [_] => Ok(Value::simple("PONG")),
        [_, message] => Ok(Value::bulk(message.clone())),
        _ => Err(Fail::Reply(errors::wrong_number_of_arguments(
            call.command(),
        ))),
    }
}

pub(crate) fn echo(call: &mut Call<'_>) -> Reply {
    Ok(Value::bulk(call.argv[1].clone()))
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`: options are all checked
/// before anything changes; authentication comes before the name and protocol,
/// which change only on an authenticated connection.
pub(crate) fn hello(call: &mut Call<'_>) -> Reply {
    let argv = call.argv;
    let mut protocol = None;
    if let Some(version) = argv.get(1) {
        let version = crate::num::parse_i64(version)
            .ok_or_else(|| fail(errors::PROTOCOL_VERSION_NOT_INTEGER))?;
        protocol = Some(Protocol::from_version(version).ok_or_else(|| fail(errors::NOPROTO))?);
    }
    let mut credentials = None;
    let mut name = None;
    let mut j = 2;
    while j < argv.len() {
        let more = argv.len() - 1 - j;
        let option = &argv[j];
        if is(option, "AUTH") && more >= 2 {
            credentials = Some((&argv[j + 1], &argv[j + 2]));
            j += 3;
        } else if is(option, "SETNAME") && more >= 1 {
            validate_attribute(&argv[j + 1]).map_err(|()| fail(errors::CLIENT_NAME_INVALID))?;
            name = Some(&argv[j + 1]);
            j += 2;
        } else {
            return Err(fail_bytes(&[
                b"ERR Syntax error in HELLO option '",
                option,
                b"'",
            ]));
        }
    }
    if let Some((user, password)) = credentials {
        authenticate(call, user, password)?;
    }
    if !call.session.is_authenticated(call.ctx) {
        return Err(fail(errors::NOAUTH_HELLO));
    }
    if let Some(name) = name {
        call.session.name = non_empty(name);
    }
    if let Some(protocol) = protocol {
        call.session.protocol = protocol;
    }
    Ok(hello_map(call))
}

fn hello_map(call: &Call<'_>) -> Value {
    let field = |name: &str, value: Value| (Value::bulk(name), value);
    let mode = if call.ctx.cluster_mode() {
        "cluster"
    } else {
        "standalone"
    };
    let server = &call.ctx.server;
    Value::Map(vec![
        field("server", Value::bulk(server.name.clone())),
        field("version", Value::bulk(server.redis_version.clone())),
        field("proto", Value::Integer(call.session.protocol.version())),
        field("id", Value::Integer(session_id(call))),
        field("mode", Value::bulk(mode)),
        field("role", Value::bulk("master")),
        field("modules", Value::Array(Vec::new())),
    ])
}

fn session_id(call: &Call<'_>) -> i64 {
    i64::try_from(call.session.id).unwrap_or(i64::MAX)
}

/// `AUTH password` or `AUTH user password`.
pub(crate) fn auth(call: &mut Call<'_>) -> Reply {
    let argv = call.argv;
    match argv.len() {
        2 if call.ctx.requirepass.is_none() => Err(fail(errors::AUTH_WITHOUT_PASSWORD)),
        2 => {
            authenticate(call, b"default", &argv[1])?;
            Ok(Value::ok())
        }
        3 => {
            authenticate(call, &argv[1], &argv[2])?;
            Ok(Value::ok())
        }
        _ => Err(fail(errors::SYNTAX)),
    }
}

/// Checks `user`/`password` against the one user RowanKV has, `default`, whose
/// password is `requirepass` (none: any password, as Redis's `nopass` user).
fn authenticate(call: &mut Call<'_>, user: &[u8], password: &[u8]) -> Result<(), Fail> {
    let accepted = user == b"default"
        && call
            .ctx
            .requirepass
            .as_deref()
            .is_none_or(|expected| equal_in_constant_time(password, expected));
    if !accepted {
        return Err(fail(errors::WRONGPASS));
    }
    call.session.authenticated = true;
    Ok(())
}

/// Compares without an early exit, so the time taken does not tell how much of a
/// guessed password was right (Redis's `time_independent_strcmp`).
fn equal_in_constant_time(given: &[u8], expected: &[u8]) -> bool {
    let length = given.len().max(expected.len());
    let mut difference = u8::from(given.len() != expected.len());
    for i in 0..length {
        let a = given.get(i).copied().unwrap_or(0);
        let b = expected.get(i).copied().unwrap_or(0);
        difference |= a ^ b;
    }
    difference == 0
}

/// `SELECT index`: RowanKV has database 0 only.
pub(crate) fn select(call: &mut Call<'_>) -> Reply {
    let index = int_arg(&call.argv[1])?;
    if i32::try_from(index).is_err() {
        return Err(fail("ERR value is out of range"));
    }
    if index != 0 && call.ctx.cluster_mode() {
        return Err(fail(errors::SELECT_IN_CLUSTER_MODE));
    }
    if index != 0 {
        return Err(fail(errors::DB_INDEX_OUT_OF_RANGE));
    }
    Ok(Value::ok())
}

pub(crate) fn quit(call: &mut Call<'_>) -> Reply {
    call.close = true;
    Ok(Value::ok())
}

/// `RESET`: back to a new connection's state (RESP2, not authenticated, no name).
pub(crate) fn reset(call: &mut Call<'_>) -> Reply {
    session::reset(call.session);
    Ok(Value::simple("RESET"))
}

pub(crate) fn client_setname(call: &mut Call<'_>) -> Reply {
    let name = &call.argv[2];
    validate_attribute(name).map_err(|()| fail(errors::CLIENT_NAME_INVALID))?;
    call.session.name = non_empty(name);
    Ok(Value::ok())
}

pub(crate) fn client_getname(call: &mut Call<'_>) -> Reply {
    Ok(call
        .session
        .name
        .clone()
        .map_or(Value::Null, Value::BulkString))
}

/// `CLIENT SETINFO LIB-NAME|LIB-VER value`.
pub(crate) fn client_setinfo(call: &mut Call<'_>) -> Reply {
    let (attribute, value) = (&call.argv[2], &call.argv[3]);
    let slot = if is(attribute, "lib-name") {
        &mut call.session.lib_name
    } else if is(attribute, "lib-ver") {
        &mut call.session.lib_ver
    } else {
        return Err(fail_bytes(&[b"ERR Unrecognized option '", attribute, b"'"]));
    };
    validate_attribute(value).map_err(|()| {
        fail_bytes(&[
            b"ERR ",
            attribute,
            b" cannot contain spaces, newlines or special characters.",
        ])
    })?;
    *slot = non_empty(value);
    Ok(Value::ok())
}

pub(crate) fn client_id(call: &mut Call<'_>) -> Reply {
    Ok(Value::Integer(session_id(call)))
}

/// `CLIENT INFO`: Redis's one line, with the fields RowanKV knows.
pub(crate) fn client_info(call: &mut Call<'_>) -> Reply {
    let session = &call.session;
    let text = |bytes: &Option<Vec<u8>>| {
        String::from_utf8_lossy(bytes.as_deref().unwrap_or_default()).into_owned()
    };
    let line = format!(
        "id={} addr={} laddr={} fd=-1 name={} db=0 user=default resp={} lib-name={} lib-ver={}\n",
        session.id,
        session.peer_addr.as_deref().unwrap_or(""),
        session.local_addr.as_deref().unwrap_or(""),
        text(&session.name),
        session.protocol.version(),
        text(&session.lib_name),
        text(&session.lib_ver),
    );
    Ok(Value::verbatim_text(line))
}

/// Redis's rule for client names and library attributes: printable ASCII without
/// spaces (`!` to `~`).
fn validate_attribute(value: &[u8]) -> Result<(), ()> {
    if value.iter().all(|b| (b'!'..=b'~').contains(b)) {
        Ok(())
    } else {
        Err(())
    }
}

/// An empty name clears the attribute, as in Redis.
fn non_empty(value: &[u8]) -> Option<Vec<u8>> {
    (!value.is_empty()).then(|| value.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_equality() {
        assert!(equal_in_constant_time(b"secret", b"secret"));
        assert!(!equal_in_constant_time(b"secret", b"secreT"));
        assert!(!equal_in_constant_time(b"secret", b"secret1"));
        assert!(!equal_in_constant_time(b"", b"\0"));
        assert!(equal_in_constant_time(b"", b""));
    }

    #[test]
    fn attributes() {
        assert!(validate_attribute(b"redis-py").is_ok());
        assert!(validate_attribute(b"").is_ok());
        assert!(validate_attribute(b"a b").is_err());
        assert!(validate_attribute(b"a\nb").is_err());
        assert!(validate_attribute(b"\xff").is_err());
    }
}
