//! Error replies worded as Redis words them, for the command layer.
//!
//! Clients act on these words: go-redis falls back from `HELLO 3` only on an error
//! starting `ERR unknown command`, cluster clients follow `MOVED`/`ASK` and retry on
//! `TRYAGAIN`, redis-py maps `WRONGPASS`/`NOAUTH` to its authentication error. So
//! each text here is Redis's own (7.x), byte for byte; a test pins every one.
//!
//! Fixed texts are constants (`Value::error(errors::SYNTAX)`); texts that carry a
//! command name, argument or address are functions returning the reply. Each line
//! starts with its code and has no leading `-` or trailing CRLF (the encoder adds
//! them, and writes any CR or LF an echoed argument carries as a space, as Redis does).
//! The protocol errors of the request parser are
//! [`crate::request::ProtocolError`].

use crate::value::Value;

/// A malformed option list, and any other argument combination Redis rejects
/// without a more specific message.
pub const SYNTAX: &str = "ERR syntax error";
/// A string command on a key of another type (RowanKV stores strings only, so this
/// comes only from commands that emulate other types, if any).
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// An argument that must be an integer (INCRBY's increment, EXPIRE's seconds, a
/// stored value INCR reads) and is not, or does not fit in an i64.
pub const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";
/// An argument that must be a float and is not.
pub const NOT_A_FLOAT: &str = "ERR value is not a valid float";
/// INCR/DECR/INCRBY/DECRBY whose result would leave the i64 range.
pub const INCR_OVERFLOW: &str = "ERR increment or decrement would overflow";
/// A command other than AUTH/HELLO/… before authenticating.
pub const NOAUTH: &str = "NOAUTH Authentication required.";
/// HELLO without AUTH on a connection that has not authenticated.
pub const NOAUTH_HELLO: &str = "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time";
/// AUTH or HELLO AUTH with a wrong password (or user).
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
/// AUTH <password> on a server that has no password.
pub const AUTH_WITHOUT_PASSWORD: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";
/// HELLO with a protocol version other than 2 or 3 (go-redis and redis-py fall
/// back to RESP2 on it).
pub const NOPROTO: &str = "NOPROTO unsupported protocol version";
/// HELLO whose version is not a number.
pub const PROTOCOL_VERSION_NOT_INTEGER: &str =
    "ERR Protocol version is not an integer or out of range";
/// A multi-key command whose keys map to different hash slots.
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
/// A key in a slot no node serves.
pub const CLUSTERDOWN_SLOT_NOT_SERVED: &str = "CLUSTERDOWN Hash slot not served";
/// The cluster cannot serve requests at all.
pub const CLUSTERDOWN: &str = "CLUSTERDOWN The cluster is down";
/// A multi-key request while its slot is moving; the client retries.
pub const TRYAGAIN: &str = "TRYAGAIN Multiple keys request during rehashing of slot";
/// CLUSTER commands on a server that is not in cluster mode.
pub const CLUSTER_SUPPORT_DISABLED: &str = "ERR This instance has cluster support disabled";
/// SELECT of a database other than 0 (RowanKV has one).
pub const DB_INDEX_OUT_OF_RANGE: &str = "ERR DB index is out of range";
/// SELECT on a cluster node.
pub const SELECT_IN_CLUSTER_MODE: &str = "ERR SELECT is not allowed in cluster mode";
/// APPEND (or SETRANGE) whose result would exceed `proto-max-bulk-len`.
pub const STRING_TOO_LONG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";
/// SCAN with a cursor that is not a number.
pub const INVALID_CURSOR: &str = "ERR invalid cursor";
/// A count or size that must be positive (SCAN COUNT 0).
pub const NOT_POSITIVE: &str = "ERR value is out of range, must be positive";
/// WAIT/WAITAOF timeout that is not a number.
pub const TIMEOUT_NOT_INTEGER: &str = "ERR timeout is not an integer or out of range";
/// WAIT/WAITAOF with a negative timeout.
pub const TIMEOUT_NEGATIVE: &str = "ERR timeout is negative";
/// EXPIRE with NX together with XX, GT or LT.
pub const EXPIRE_NX_WITH_OTHERS: &str =
    "ERR NX and XX, GT or LT options at the same time are not compatible";
/// EXPIRE with both GT and LT.
pub const EXPIRE_GT_WITH_LT: &str = "ERR GT and LT options at the same time are not compatible";
/// CLIENT SETNAME / HELLO SETNAME with a space or a non-printable byte.
pub const CLIENT_NAME_INVALID: &str =
    "ERR Client names cannot contain spaces, newlines or special characters.";
/// A write sent to a replica.
pub const READONLY: &str = "READONLY You can't write against a read only replica.";
/// A write that cannot reach enough replicas.
pub const NOREPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";
/// A connection beyond `maxclients` (sent, then the connection is closed).
pub const MAX_CLIENTS: &str = "ERR max number of clients reached";
/// A key that must exist and does not (RENAME and friends).
pub const NO_SUCH_KEY: &str = "ERR no such key";
/// A slot argument that is not a number from 0 to 16383 (CLUSTER SETSLOT).
pub const INVALID_SLOT: &str = "ERR Invalid or out of range slot";
/// CLUSTER SETSLOT with an action it does not know, or the wrong number of
/// arguments for its action.
pub const SETSLOT_SYNTAX: &str =
    "ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP";

/// How many bytes of a command name (and, together, of its arguments) the
/// unknown-command error echoes: Redis's `%.128s` and its 128-byte argument budget.
const ECHO_BYTES_MAX: usize = 128;

/// `ERR unknown command 'foo', with args beginning with: 'a' 'b' ` — exactly
/// Redis 7's text, including the trailing space after each quoted argument (and
/// after the colon when there are none).
///
/// As Redis formats them with C's `%s`, the name and each argument end at their
/// first NUL byte; the name is cut to 128 bytes; arguments are added while the
/// argument part is shorter than 128 bytes, each cut to what is left of those 128.
pub fn unknown_command<A: AsRef<[u8]>>(name: &[u8], args: &[A]) -> Value {
    let mut echoed = Vec::new();
    for arg in args {
        if echoed.len() >= ECHO_BYTES_MAX {
            break;
        }
        let budget = ECHO_BYTES_MAX - echoed.len();
        echoed.push(b'\'');
        echoed.extend_from_slice(c_string_prefix(arg.as_ref(), budget));
        echoed.extend_from_slice(b"' ");
    }
    let mut line = b"ERR unknown command '".to_vec();
    line.extend_from_slice(c_string_prefix(name, ECHO_BYTES_MAX));
    line.extend_from_slice(b"', with args beginning with: ");
    line.extend_from_slice(&echoed);
    Value::Error(line)
}

/// `ERR unknown subcommand 'foo'. Try CLIENT HELP.`: a container command (CLIENT,
/// CLUSTER, COMMAND, CONFIG) with a subcommand it does not have. `container` is
/// written in upper case, the subcommand cut as in [`unknown_command`].
pub fn unknown_subcommand(container: &str, subcommand: &[u8]) -> Value {
    let mut line = b"ERR unknown subcommand '".to_vec();
    line.extend_from_slice(c_string_prefix(subcommand, ECHO_BYTES_MAX));
    line.extend_from_slice(b"'. Try ");
    line.extend_from_slice(container.to_ascii_uppercase().as_bytes());
    line.extend_from_slice(b" HELP.");
    Value::Error(line)
}

/// `ERR unknown subcommand or wrong number of arguments for 'foo'. Try CLIENT HELP.`:
/// what Redis's container commands answer for a subcommand they parse themselves.
pub fn subcommand_syntax(container: &str, subcommand: &[u8]) -> Value {
    let mut line = b"ERR unknown subcommand or wrong number of arguments for '".to_vec();
    line.extend_from_slice(c_string_prefix(subcommand, usize::MAX));
    line.extend_from_slice(b"'. Try ");
    line.extend_from_slice(container.to_ascii_uppercase().as_bytes());
    line.extend_from_slice(b" HELP.");
    Value::Error(line)
}

/// `ERR wrong number of arguments for 'get' command`. `command` is the command's
/// full name as Redis spells it (lower case: `get`, `client|setname` for a
/// subcommand); it is written in lower case whatever case the caller gives.
pub fn wrong_number_of_arguments(command: &str) -> Value {
    Value::Error(
        format!(
            "ERR wrong number of arguments for '{}' command",
            command.to_ascii_lowercase()
        )
        .into_bytes(),
    )
}

/// `ERR invalid expire time in 'set' command`: an expiry that is not positive or
/// overflows (SET EX/PX/EXAT/PXAT, EXPIRE, PEXPIRE).
pub fn invalid_expire_time(command: &str) -> Value {
    Value::Error(
        format!(
            "ERR invalid expire time in '{}' command",
            command.to_ascii_lowercase()
        )
        .into_bytes(),
    )
}

/// `MOVED <slot> <host>:<port>`: the key's slot is served by another node; a
/// cluster client updates its slot map and retries there.
pub fn moved(slot: u16, host: &str, port: u16) -> Value {
    Value::Error(format!("MOVED {slot} {host}:{port}").into_bytes())
}

/// `ASK <slot> <host>:<port>`: this one request goes to the other node (after
/// ASKING); the slot map does not change.
pub fn ask(slot: u16, host: &str, port: u16) -> Value {
    Value::Error(format!("ASK {slot} {host}:{port}").into_bytes())
}

/// `ERR I don't know about node <id>`: a node id no node of the cluster has
/// (CLUSTER SETSLOT ... NODE). The id is cut as in [`unknown_command`].
pub fn unknown_node(id: &[u8]) -> Value {
    let mut line = b"ERR I don't know about node ".to_vec();
    line.extend_from_slice(c_string_prefix(id, ECHO_BYTES_MAX));
    Value::Error(line)
}

/// What C's `%.*s` prints of `bytes`: up to the first NUL, at most `max` bytes.
fn c_string_prefix(bytes: &[u8], max: usize) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end.min(max)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{encode, Protocol};

    fn wire(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        encode(value, Protocol::Resp2, &mut out);
        out
    }

    fn text(value: &Value) -> String {
        match value {
            Value::Error(line) => String::from_utf8(line.clone()).expect("UTF-8 in these tests"),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn fixed_texts() {
        let cases = [
            (SYNTAX, "-ERR syntax error\r\n"),
            (WRONGTYPE, "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
            (NOT_AN_INTEGER, "-ERR value is not an integer or out of range\r\n"),
            (NOT_A_FLOAT, "-ERR value is not a valid float\r\n"),
            (INCR_OVERFLOW, "-ERR increment or decrement would overflow\r\n"),
            (NOAUTH, "-NOAUTH Authentication required.\r\n"),
            (WRONGPASS, "-WRONGPASS invalid username-password pair or user is disabled.\r\n"),
            (NOPROTO, "-NOPROTO unsupported protocol version\r\n"),
            (PROTOCOL_VERSION_NOT_INTEGER, "-ERR Protocol version is not an integer or out of range\r\n"),
            (CROSSSLOT, "-CROSSSLOT Keys in request don't hash to the same slot\r\n"),
            (CLUSTERDOWN_SLOT_NOT_SERVED, "-CLUSTERDOWN Hash slot not served\r\n"),
            (CLUSTERDOWN, "-CLUSTERDOWN The cluster is down\r\n"),
            (TRYAGAIN, "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"),
            (CLUSTER_SUPPORT_DISABLED, "-ERR This instance has cluster support disabled\r\n"),
            (DB_INDEX_OUT_OF_RANGE, "-ERR DB index is out of range\r\n"),
            (SELECT_IN_CLUSTER_MODE, "-ERR SELECT is not allowed in cluster mode\r\n"),
            (STRING_TOO_LONG, "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n"),
            (INVALID_CURSOR, "-ERR invalid cursor\r\n"),
            (NOT_POSITIVE, "-ERR value is out of range, must be positive\r\n"),
            (TIMEOUT_NOT_INTEGER, "-ERR timeout is not an integer or out of range\r\n"),
            (TIMEOUT_NEGATIVE, "-ERR timeout is negative\r\n"),
            (EXPIRE_NX_WITH_OTHERS, "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n"),
            (EXPIRE_GT_WITH_LT, "-ERR GT and LT options at the same time are not compatible\r\n"),
            (CLIENT_NAME_INVALID, "-ERR Client names cannot contain spaces, newlines or special characters.\r\n"),
            (READONLY, "-READONLY You can't write against a read only replica.\r\n"),
            (NOREPLICAS, "-NOREPLICAS Not enough good replicas to write.\r\n"),
            (MAX_CLIENTS, "-ERR max number of clients reached\r\n"),
            (NO_SUCH_KEY, "-ERR no such key\r\n"),
            (INVALID_SLOT, "-ERR Invalid or out of range slot\r\n"),
            (SETSLOT_SYNTAX, "-ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP\r\n"),
            (
                AUTH_WITHOUT_PASSWORD,
                "-ERR AUTH <password> called without any password configured for the default user. \
                 Are you sure your configuration is correct?\r\n",
            ),
            (
                NOAUTH_HELLO,
                "-NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                 HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                 select the RESP protocol version at the same time\r\n",
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(wire(&Value::error(line)), expected.as_bytes(), "{line}");
        }
    }

    #[test]
    fn unknown_command_format() {
        assert_eq!(
            text(&unknown_command(b"foo", &["a", "b"])),
            "ERR unknown command 'foo', with args beginning with: 'a' 'b' "
        );
        assert_eq!(
            text(&unknown_command::<&str>(b"foo", &[])),
            "ERR unknown command 'foo', with args beginning with: "
        );
        assert_eq!(
            wire(&unknown_command(b"LPUSH", &["list", "x"])),
            b"-ERR unknown command 'LPUSH', with args beginning with: 'list' 'x' \r\n"
        );
    }

    #[test]
    fn unknown_node_format() {
        let id = "a".repeat(40);
        assert_eq!(
            text(&unknown_node(id.as_bytes())),
            format!("ERR I don't know about node {id}")
        );
        assert_eq!(
            text(&unknown_node(b"ab\0cd")),
            "ERR I don't know about node ab"
        );
    }

    #[test]
    fn unknown_command_echo_budget() {
        let long = "x".repeat(200);
        let error = text(&unknown_command(long.as_bytes(), &[long.as_str()]));
        let expected = format!(
            "ERR unknown command '{}', with args beginning with: '{}' ",
            "x".repeat(128),
            "x".repeat(128)
        );
        assert_eq!(error, expected);
        // After 'aaa…' (121 bytes) the argument part is 124 bytes: the next argument
        // gets the 4 bytes left, and then the part is over 128 and echoing stops.
        let first = "a".repeat(121);
        let error = text(&unknown_command(b"f", &[first.as_str(), "bcdefg", "z"]));
        assert_eq!(
            error,
            format!("ERR unknown command 'f', with args beginning with: '{first}' 'bcde' ")
        );
        // Arguments and name end at a NUL, as C strings.
        let error = text(&unknown_command(b"na\0me", &[&b"a\0b"[..], b"c"]));
        assert_eq!(
            error,
            "ERR unknown command 'na', with args beginning with: 'a' 'c' "
        );
    }

    #[test]
    fn unknown_command_cannot_break_framing() {
        assert_eq!(
            wire(&unknown_command(b"a\r\nb", &[&b"\r\n+OK"[..]])),
            b"-ERR unknown command 'a  b', with args beginning with: '  +OK' \r\n"
        );
    }

    #[test]
    fn formatted_texts() {
        assert_eq!(
            text(&wrong_number_of_arguments("GET")),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(
            text(&wrong_number_of_arguments("client|setname")),
            "ERR wrong number of arguments for 'client|setname' command"
        );
        assert_eq!(
            text(&invalid_expire_time("set")),
            "ERR invalid expire time in 'set' command"
        );
        assert_eq!(
            text(&unknown_subcommand("client", b"foo")),
            "ERR unknown subcommand 'foo'. Try CLIENT HELP."
        );
        assert_eq!(
            text(&subcommand_syntax("config", b"foo")),
            "ERR unknown subcommand or wrong number of arguments for 'foo'. Try CONFIG HELP."
        );
        assert_eq!(
            wire(&moved(3999, "127.0.0.1", 6381)),
            b"-MOVED 3999 127.0.0.1:6381\r\n"
        );
        assert_eq!(
            wire(&ask(3999, "10.0.0.2", 7000)),
            b"-ASK 3999 10.0.0.2:7000\r\n"
        );
        assert_eq!(moved(1, "h", 2).error_code(), Some(&b"MOVED"[..]));
    }
}
