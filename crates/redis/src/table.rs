//! The command table: every command RowanKV answers, with what Redis's COMMAND
//! reports about it (arity, flags, key positions, ACL categories, tips) and the
//! handler that runs it.
//!
//! One row per command, one row per subcommand of a container (CLIENT, CONFIG,
//! CLUSTER, COMMAND). The table is the single source for dispatch, arity errors,
//! cluster slot checks (key positions), COMMAND's replies and the compatibility
//! page `docs/redis-compatibility.md` (a test checks the page against the table).

use crate::cmd::{cluster, connection, introspect, keys, server, strings};
use crate::fail::Reply;
use crate::session::Call;

/// Runs one command.
pub(crate) type Handler = fn(&mut Call<'_>) -> Reply;

/// How far RowanKV implements a command (the compatibility page's status column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// As Redis 7.2 does it, for a string-only keyspace.
    Supported,
    /// Answered, with differences the compatibility page lists.
    Partial,
    /// Known, and refused with an error saying why.
    Refused,
}

impl Status {
    /// The word the compatibility page uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Supported => "supported",
            Status::Partial => "partial",
            Status::Refused => "refused",
        }
    }
}

/// Where a command's keys are in its arguments, as Redis's COMMAND reports them:
/// `first` and `last` are argument indexes (0 is the name; `last` negative counts
/// from the end, -1 the last argument), `step` the distance between keys.
/// `first == 0`: the command has no keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPositions {
    pub first: i32,
    pub last: i32,
    pub step: i32,
}

const NO_KEYS: KeyPositions = KeyPositions {
    first: 0,
    last: 0,
    step: 0,
};
const ONE_KEY: KeyPositions = KeyPositions {
    first: 1,
    last: 1,
    step: 1,
};
const ALL_KEYS: KeyPositions = KeyPositions {
    first: 1,
    last: -1,
    step: 1,
};
const KEY_VALUE_PAIRS: KeyPositions = KeyPositions {
    first: 1,
    last: -1,
    step: 2,
};

/// One command or subcommand.
#[derive(Debug)]
pub struct CommandSpec {
    /// Redis's full name in lower case: `get`, `client|setname`.
    pub name: &'static str,
    /// Redis's arity: `n` exactly n words (name included), `-n` at least n.
    pub arity: i32,
    /// COMMAND's flags (`write`, `readonly`, `fast`, `no_auth`, ...).
    pub flags: &'static [&'static str],
    pub keys: KeyPositions,
    /// COMMAND's ACL categories (`@read`, `@string`, ...).
    pub acl_categories: &'static [&'static str],
    /// COMMAND's tips for cluster clients (`request_policy:all_shards`, ...).
    pub tips: &'static [&'static str],
    /// COMMAND DOCS's group (`string`, `generic`, `connection`, ...).
    pub group: &'static str,
    /// COMMAND DOCS's summary.
    pub summary: &'static str,
    pub status: Status,
    /// A container's subcommands (CLIENT SETNAME, ...); empty for others.
    pub subcommands: &'static [CommandSpec],
    /// `None` only for a container that cannot run without a subcommand.
    pub(crate) handler: Option<Handler>,
}

/// The defaults rows override.
const ROW: CommandSpec = CommandSpec {
    name: "",
    arity: 1,
    flags: &[],
    keys: NO_KEYS,
    acl_categories: &[],
    tips: &[],
    group: "",
    summary: "",
    status: Status::Supported,
    subcommands: &[],
    handler: None,
};

impl CommandSpec {
    /// Whether a request of `argc` words (name included) has this command's arity.
    pub fn arity_accepts(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        let arity = i64::from(self.arity);
        if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        }
    }

    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    /// The keys of a request of this command (by its key positions).
    pub fn keys<'a>(&self, argv: &'a [Vec<u8>]) -> Vec<&'a [u8]> {
        let KeyPositions { first, last, step } = self.keys;
        if first <= 0 || step <= 0 {
            return Vec::new();
        }
        let argc = i64::try_from(argv.len()).unwrap_or(i64::MAX);
        let last = if last < 0 {
            argc + i64::from(last)
        } else {
            i64::from(last).min(argc - 1)
        };
        let (first, step) = (i64::from(first), i64::from(step));
        let mut keys = Vec::new();
        let mut index = first;
        while index <= last {
            let position = usize::try_from(index).expect("index is positive");
            keys.push(argv[position].as_slice());
            index += step;
        }
        keys
    }
}

/// The command `name` names (ASCII case ignored).
pub(crate) fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    lookup_in(COMMANDS, name)
}

/// The subcommand `name` of a container's `subcommands` (the part after `|`).
pub(crate) fn lookup_in(
    specs: &'static [CommandSpec],
    name: &[u8],
) -> Option<&'static CommandSpec> {
    specs.iter().find(|spec| {
        let short = spec.name.rsplit('|').next().unwrap_or(spec.name);
        short.as_bytes().eq_ignore_ascii_case(name)
    })
}

/// Every top-level command RowanKV answers (subcommands inside their containers).
pub fn commands() -> &'static [CommandSpec] {
    COMMANDS
}

// Flag sets.
const READ_FAST: &[&str] = &["readonly", "fast"];
const READ: &[&str] = &["readonly"];
const WRITE: &[&str] = &["write"];
const WRITE_FAST: &[&str] = &["write", "fast"];
const WRITE_OOM: &[&str] = &["write", "denyoom"];
const WRITE_OOM_FAST: &[&str] = &["write", "denyoom", "fast"];
const CONNECTION_NO_AUTH: &[&str] = &[
    "noscript",
    "loading",
    "stale",
    "fast",
    "no_auth",
    "allow_busy",
];
const LOADING_STALE: &[&str] = &["loading", "stale"];
const LOADING_STALE_FAST: &[&str] = &["loading", "stale", "fast"];
const CLIENT_FLAGS: &[&str] = &["noscript", "loading", "stale"];
const CONFIG_FLAGS: &[&str] = &["admin", "noscript", "loading", "stale"];

// ACL category sets.
const STRING_READ_FAST: &[&str] = &["@read", "@string", "@fast"];
const STRING_READ_SLOW: &[&str] = &["@read", "@string", "@slow"];
const STRING_WRITE_FAST: &[&str] = &["@write", "@string", "@fast"];
const STRING_WRITE_SLOW: &[&str] = &["@write", "@string", "@slow"];
const KEYSPACE_READ_FAST: &[&str] = &["@keyspace", "@read", "@fast"];
const KEYSPACE_WRITE_FAST: &[&str] = &["@keyspace", "@write", "@fast"];
const CONNECTION_FAST: &[&str] = &["@fast", "@connection"];
const CONNECTION_SLOW: &[&str] = &["@slow", "@connection"];

// Tip sets.
const MULTI_SHARD_SUM: &[&str] = &["request_policy:multi_shard", "response_policy:agg_sum"];
const ALL_SHARDS_SUCCEED: &[&str] = &["request_policy:all_shards", "response_policy:all_succeeded"];

const STRING: &str = "string";
const GENERIC: &str = "generic";
const CONNECTION: &str = "connection";
const SERVER: &str = "server";
const CLUSTER: &str = "cluster";

#[rustfmt::skip]
static COMMANDS: &[CommandSpec] = &[
    // Strings, the common ones first: lookup is a scan of this table.
    CommandSpec { name: "get", arity: 2, flags: READ_FAST, keys: ONE_KEY, acl_categories: STRING_READ_FAST, group: STRING, summary: "Returns the string value of a key.", handler: Some(strings::get), ..ROW },
    CommandSpec { name: "set", arity: -3, flags: WRITE_OOM, keys: ONE_KEY, acl_categories: STRING_WRITE_SLOW, group: STRING, summary: "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist.", handler: Some(strings::set), ..ROW },
    CommandSpec { name: "del", arity: -2, flags: WRITE, keys: ALL_KEYS, acl_categories: &["@keyspace", "@write", "@slow"], tips: MULTI_SHARD_SUM, group: GENERIC, summary: "Deletes one or more keys.", handler: Some(keys::del), ..ROW },
    CommandSpec { name: "mget", arity: -2, flags: READ_FAST, keys: ALL_KEYS, acl_categories: STRING_READ_FAST, tips: &["request_policy:multi_shard"], group: STRING, summary: "Atomically returns the string values of one or more keys.", handler: Some(strings::mget), ..ROW },
    CommandSpec { name: "mset", arity: -3, flags: WRITE_OOM, keys: KEY_VALUE_PAIRS, acl_categories: STRING_WRITE_SLOW, tips: &["request_policy:multi_shard", "response_policy:all_succeeded"], group: STRING, summary: "Creates or modifies the string values of one or more keys.", status: Status::Partial, handler: Some(strings::mset), ..ROW },
    CommandSpec { name: "incr", arity: 2, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", handler: Some(strings::incr), ..ROW },
    CommandSpec { name: "exists", arity: -2, flags: READ_FAST, keys: ALL_KEYS, acl_categories: KEYSPACE_READ_FAST, tips: MULTI_SHARD_SUM, group: GENERIC, summary: "Determines whether one or more keys exist.", handler: Some(keys::exists), ..ROW },
    CommandSpec { name: "ping", arity: -1, flags: &["fast"], acl_categories: CONNECTION_FAST, tips: ALL_SHARDS_SUCCEED, group: CONNECTION, summary: "Returns the server's liveliness response.", handler: Some(connection::ping), ..ROW },
    CommandSpec { name: "setnx", arity: 3, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Set the string value of a key only when the key doesn't exist.", handler: Some(strings::setnx), ..ROW },
    CommandSpec { name: "setex", arity: 4, flags: WRITE_OOM, keys: ONE_KEY, acl_categories: STRING_WRITE_SLOW, group: STRING, summary: "Sets the string value and expiration time of a key. Creates the key if it doesn't exist.", handler: Some(strings::setex), ..ROW },
    CommandSpec { name: "psetex", arity: 4, flags: WRITE_OOM, keys: ONE_KEY, acl_categories: STRING_WRITE_SLOW, group: STRING, summary: "Sets both string value and expiration time in milliseconds of a key. The key is created if it doesn't exist.", handler: Some(strings::setex), ..ROW },
    CommandSpec { name: "getset", arity: 3, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Returns the previous string value of a key after setting it to a new value.", handler: Some(strings::getset), ..ROW },
    CommandSpec { name: "getdel", arity: 2, flags: WRITE_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Returns the string value of a key after deleting the key.", handler: Some(strings::getdel), ..ROW },
    CommandSpec { name: "getex", arity: -2, flags: WRITE_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Returns the string value of a key after setting its expiration time.", handler: Some(strings::getex), ..ROW },
    CommandSpec { name: "msetnx", arity: -3, flags: WRITE_OOM, keys: KEY_VALUE_PAIRS, acl_categories: STRING_WRITE_SLOW, tips: &["request_policy:multi_shard", "response_policy:agg_min"], group: STRING, summary: "Modifies the string values of one or more keys only when all keys don't exist.", status: Status::Partial, handler: Some(strings::msetnx), ..ROW },
    CommandSpec { name: "decr", arity: 2, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", handler: Some(strings::decr), ..ROW },
    CommandSpec { name: "incrby", arity: 3, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't exist.", handler: Some(strings::incrby), ..ROW },
    CommandSpec { name: "decrby", arity: 3, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Decrements a number from the integer value of a key. Uses 0 as initial value if the key doesn't exist.", handler: Some(strings::decrby), ..ROW },
    CommandSpec { name: "incrbyfloat", arity: 3, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Increment the floating point value of a key by a number. Uses 0 as initial value if the key doesn't exist.", status: Status::Partial, handler: Some(strings::incrbyfloat), ..ROW },
    CommandSpec { name: "append", arity: 3, flags: WRITE_OOM_FAST, keys: ONE_KEY, acl_categories: STRING_WRITE_FAST, group: STRING, summary: "Appends a string to the value of a key. Creates the key if it doesn't exist.", handler: Some(strings::append), ..ROW },
    CommandSpec { name: "strlen", arity: 2, flags: READ_FAST, keys: ONE_KEY, acl_categories: STRING_READ_FAST, group: STRING, summary: "Returns the length of a string value.", handler: Some(strings::strlen), ..ROW },
    CommandSpec { name: "setrange", arity: 4, flags: WRITE_OOM, keys: ONE_KEY, acl_categories: STRING_WRITE_SLOW, group: STRING, summary: "Overwrites a part of a string value with another by an offset. Creates the key if it doesn't exist.", handler: Some(strings::setrange), ..ROW },
    CommandSpec { name: "getrange", arity: 4, flags: READ, keys: ONE_KEY, acl_categories: STRING_READ_SLOW, group: STRING, summary: "Returns a substring of the string stored at a key.", handler: Some(strings::getrange), ..ROW },
    CommandSpec { name: "substr", arity: 4, flags: READ, keys: ONE_KEY, acl_categories: STRING_READ_SLOW, group: STRING, summary: "Returns a substring from a string value.", handler: Some(strings::getrange), ..ROW },
    // Keys.
    CommandSpec { name: "unlink", arity: -2, flags: WRITE_FAST, keys: ALL_KEYS, acl_categories: KEYSPACE_WRITE_FAST, tips: MULTI_SHARD_SUM, group: GENERIC, summary: "Asynchronously deletes one or more keys.", handler: Some(keys::del), ..ROW },
    CommandSpec { name: "touch", arity: -2, flags: READ_FAST, keys: ALL_KEYS, acl_categories: KEYSPACE_READ_FAST, tips: MULTI_SHARD_SUM, group: GENERIC, summary: "Returns the number of existing keys out of those specified after updating the time they were last accessed.", handler: Some(keys::exists), ..ROW },
    CommandSpec { name: "expire", arity: -3, flags: WRITE_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_WRITE_FAST, group: GENERIC, summary: "Sets the expiration time of a key in seconds.", handler: Some(keys::expire), ..ROW },
    CommandSpec { name: "pexpire", arity: -3, flags: WRITE_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_WRITE_FAST, group: GENERIC, summary: "Sets the expiration time of a key in milliseconds.", handler: Some(keys::expire), ..ROW },
    CommandSpec { name: "expireat", arity: -3, flags: WRITE_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_WRITE_FAST, group: GENERIC, summary: "Sets the expiration time of a key to a Unix timestamp.", handler: Some(keys::expire), ..ROW },
    CommandSpec { name: "pexpireat", arity: -3, flags: WRITE_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_WRITE_FAST, group: GENERIC, summary: "Sets the expiration time of a key to a Unix milliseconds timestamp.", handler: Some(keys::expire), ..ROW },
    CommandSpec { name: "ttl", arity: 2, flags: READ_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_READ_FAST, tips: &["nondeterministic_output"], group: GENERIC, summary: "Returns the expiration time in seconds of a key.", handler: Some(keys::ttl), ..ROW },
    CommandSpec { name: "pttl", arity: 2, flags: READ_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_READ_FAST, tips: &["nondeterministic_output"], group: GENERIC, summary: "Returns the expiration time in milliseconds of a key.", handler: Some(keys::ttl), ..ROW },
    CommandSpec { name: "expiretime", arity: 2, flags: READ_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_READ_FAST, group: GENERIC, summary: "Returns the expiration time of a key as a Unix timestamp.", handler: Some(keys::expiretime), ..ROW },
    CommandSpec { name: "pexpiretime", arity: 2, flags: READ_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_READ_FAST, group: GENERIC, summary: "Returns the expiration time of a key as a Unix milliseconds timestamp.", handler: Some(keys::expiretime), ..ROW },
    CommandSpec { name: "persist", arity: 2, flags: WRITE_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_WRITE_FAST, group: GENERIC, summary: "Removes the expiration time of a key.", handler: Some(keys::persist), ..ROW },
    CommandSpec { name: "type", arity: 2, flags: READ_FAST, keys: ONE_KEY, acl_categories: KEYSPACE_READ_FAST, group: GENERIC, summary: "Determines the type of value stored at a key.", handler: Some(keys::type_of), ..ROW },
    CommandSpec { name: "scan", arity: -2, flags: READ, acl_categories: &["@keyspace", "@read", "@slow"], tips: &["nondeterministic_output", "request_policy:special", "response_policy:special"], group: GENERIC, summary: "Iterates over the key names in the database.", status: Status::Partial, handler: Some(keys::scan), ..ROW },
    CommandSpec { name: "keys", arity: 2, flags: READ, acl_categories: &["@keyspace", "@read", "@slow", "@dangerous"], tips: &["request_policy:all_shards", "nondeterministic_output_order"], group: GENERIC, summary: "Returns all key names that match a pattern.", status: Status::Partial, handler: Some(keys::keys), ..ROW },
    CommandSpec { name: "dbsize", arity: 1, flags: READ_FAST, acl_categories: KEYSPACE_READ_FAST, tips: &["request_policy:all_shards", "response_policy:agg_sum"], group: SERVER, summary: "Returns the number of keys in the database.", status: Status::Partial, handler: Some(keys::dbsize), ..ROW },
    CommandSpec { name: "flushall", arity: -1, flags: WRITE, acl_categories: &["@keyspace", "@write", "@slow", "@dangerous"], tips: ALL_SHARDS_SUCCEED, group: SERVER, summary: "Removes all keys from all databases.", status: Status::Partial, handler: Some(keys::flushall), ..ROW },
    CommandSpec { name: "flushdb", arity: -1, flags: WRITE, acl_categories: &["@keyspace", "@write", "@slow", "@dangerous"], tips: ALL_SHARDS_SUCCEED, group: SERVER, summary: "Remove all keys from the current database.", status: Status::Partial, handler: Some(keys::flushall), ..ROW },
    // Connection.
    CommandSpec { name: "echo", arity: 2, flags: &["fast"], acl_categories: CONNECTION_FAST, group: CONNECTION, summary: "Returns the given string.", handler: Some(connection::echo), ..ROW },
    CommandSpec { name: "hello", arity: -1, flags: CONNECTION_NO_AUTH, acl_categories: CONNECTION_FAST, group: CONNECTION, summary: "Handshakes with the server.", handler: Some(connection::hello), ..ROW },
    CommandSpec { name: "auth", arity: -2, flags: CONNECTION_NO_AUTH, acl_categories: CONNECTION_FAST, group: CONNECTION, summary: "Authenticates the connection.", status: Status::Partial, handler: Some(connection::auth), ..ROW },
    CommandSpec { name: "select", arity: 2, flags: LOADING_STALE_FAST, acl_categories: CONNECTION_FAST, group: CONNECTION, summary: "Changes the selected database.", status: Status::Partial, handler: Some(connection::select), ..ROW },
    CommandSpec { name: "quit", arity: -1, flags: &["allow_busy", "noscript", "loading", "stale", "fast", "no_auth"], acl_categories: CONNECTION_FAST, group: CONNECTION, summary: "Closes the connection.", handler: Some(connection::quit), ..ROW },
    CommandSpec { name: "reset", arity: 1, flags: CONNECTION_NO_AUTH, acl_categories: CONNECTION_FAST, group: CONNECTION, summary: "Resets the connection.", handler: Some(connection::reset), ..ROW },
    CommandSpec { name: "client", arity: -2, acl_categories: &["@slow"], group: CONNECTION, summary: "A container for client connection commands.", subcommands: CLIENT_SUBCOMMANDS, ..ROW },
    // Server.
    CommandSpec { name: "info", arity: -1, flags: LOADING_STALE, acl_categories: &["@slow", "@dangerous"], tips: &["nondeterministic_output", "request_policy:all_shards", "response_policy:special"], group: SERVER, summary: "Returns information and statistics about the server.", status: Status::Partial, handler: Some(server::info), ..ROW },
    CommandSpec { name: "command", arity: -1, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, tips: &["nondeterministic_output_order"], group: SERVER, summary: "Returns detailed information about all commands.", status: Status::Partial, subcommands: COMMAND_SUBCOMMANDS, handler: Some(introspect::command), ..ROW },
    CommandSpec { name: "config", arity: -2, acl_categories: &["@slow"], group: SERVER, summary: "A container for server configuration commands.", subcommands: CONFIG_SUBCOMMANDS, ..ROW },
    CommandSpec { name: "wait", arity: 3, acl_categories: CONNECTION_SLOW, tips: &["request_policy:all_shards", "response_policy:agg_min"], group: GENERIC, summary: "Blocks until the asynchronous replication of all preceding write commands sent by the connection is completed.", handler: Some(server::wait), ..ROW },
    CommandSpec { name: "waitaof", arity: 4, flags: &["noscript"], acl_categories: CONNECTION_SLOW, tips: &["request_policy:all_shards", "response_policy:agg_min"], group: GENERIC, summary: "Blocks until all of the preceding write commands sent by the connection are written to the append-only file of the master and/or replicas.", handler: Some(server::waitaof), ..ROW },
    CommandSpec { name: "time", arity: 1, flags: LOADING_STALE_FAST, acl_categories: &["@fast"], tips: &["nondeterministic_output"], group: SERVER, summary: "Returns the server time.", handler: Some(server::time), ..ROW },
    // Cluster.
    CommandSpec { name: "cluster", arity: -2, acl_categories: &["@slow"], group: CLUSTER, summary: "A container for Redis Cluster commands.", status: Status::Partial, subcommands: CLUSTER_SUBCOMMANDS, ..ROW },
    CommandSpec { name: "readonly", arity: 1, flags: LOADING_STALE_FAST, acl_categories: CONNECTION_FAST, group: CLUSTER, summary: "Enables read-only queries for a connection to a Redis Cluster replica node.", handler: Some(cluster::readonly), ..ROW },
    CommandSpec { name: "readwrite", arity: 1, flags: LOADING_STALE_FAST, acl_categories: CONNECTION_FAST, group: CLUSTER, summary: "Enables read-write queries for a connection to a Redis Cluster replica node.", handler: Some(cluster::readonly), ..ROW },
];

#[rustfmt::skip]
static CLIENT_SUBCOMMANDS: &[CommandSpec] = &[
    CommandSpec { name: "client|setname", arity: 3, flags: CLIENT_FLAGS, acl_categories: CONNECTION_SLOW, group: CONNECTION, summary: "Sets the connection name.", handler: Some(connection::client_setname), ..ROW },
    CommandSpec { name: "client|getname", arity: 2, flags: CLIENT_FLAGS, acl_categories: CONNECTION_SLOW, group: CONNECTION, summary: "Returns the name of the connection.", handler: Some(connection::client_getname), ..ROW },
    CommandSpec { name: "client|setinfo", arity: 4, flags: CLIENT_FLAGS, acl_categories: CONNECTION_SLOW, tips: &["request_policy:all_nodes", "response_policy:all_succeeded"], group: CONNECTION, summary: "Sets information specific to the client or connection.", handler: Some(connection::client_setinfo), ..ROW },
    CommandSpec { name: "client|id", arity: 2, flags: CLIENT_FLAGS, acl_categories: CONNECTION_SLOW, group: CONNECTION, summary: "Returns the unique client ID of the connection.", handler: Some(connection::client_id), ..ROW },
    CommandSpec { name: "client|info", arity: 2, flags: CLIENT_FLAGS, acl_categories: CONNECTION_SLOW, tips: &["nondeterministic_output"], group: CONNECTION, summary: "Returns information about the connection.", status: Status::Partial, handler: Some(connection::client_info), ..ROW },
    CommandSpec { name: "client|help", arity: 2, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, group: CONNECTION, summary: "Returns helpful text about the different subcommands.", handler: Some(introspect::help), ..ROW },
];

#[rustfmt::skip]
static COMMAND_SUBCOMMANDS: &[CommandSpec] = &[
    CommandSpec { name: "command|count", arity: 2, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, group: SERVER, summary: "Returns a count of commands.", handler: Some(introspect::count), ..ROW },
    CommandSpec { name: "command|docs", arity: -2, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, tips: &["nondeterministic_output_order"], group: SERVER, summary: "Returns documentary information about one, multiple or all commands.", status: Status::Partial, handler: Some(introspect::docs), ..ROW },
    CommandSpec { name: "command|info", arity: -2, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, tips: &["nondeterministic_output_order"], group: SERVER, summary: "Returns information about one, multiple or all commands.", status: Status::Partial, handler: Some(introspect::info), ..ROW },
    CommandSpec { name: "command|list", arity: -2, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, tips: &["nondeterministic_output_order"], group: SERVER, summary: "Returns a list of command names.", handler: Some(introspect::list), ..ROW },
    CommandSpec { name: "command|getkeys", arity: -3, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, group: SERVER, summary: "Extracts the key names from an arbitrary command.", handler: Some(introspect::getkeys), ..ROW },
    CommandSpec { name: "command|help", arity: 2, flags: LOADING_STALE, acl_categories: CONNECTION_SLOW, group: SERVER, summary: "Returns helpful text about the different subcommands.", handler: Some(introspect::help), ..ROW },
];

#[rustfmt::skip]
static CONFIG_SUBCOMMANDS: &[CommandSpec] = &[
    CommandSpec { name: "config|get", arity: -3, flags: CONFIG_FLAGS, acl_categories: &["@admin", "@slow", "@dangerous"], group: SERVER, summary: "Returns the effective values of configuration parameters.", status: Status::Partial, handler: Some(server::config_get), ..ROW },
    CommandSpec { name: "config|set", arity: -4, flags: CONFIG_FLAGS, acl_categories: &["@admin", "@slow", "@dangerous"], tips: &["request_policy:all_nodes", "response_policy:all_succeeded"], group: SERVER, summary: "Sets configuration parameters in-flight.", status: Status::Refused, handler: Some(server::config_set), ..ROW },
    CommandSpec { name: "config|help", arity: 2, flags: LOADING_STALE, acl_categories: &["@slow"], group: SERVER, summary: "Returns helpful text about the different subcommands.", handler: Some(introspect::help), ..ROW },
];

#[rustfmt::skip]
static CLUSTER_SUBCOMMANDS: &[CommandSpec] = &[
    CommandSpec { name: "cluster|info", arity: 2, flags: LOADING_STALE, acl_categories: &["@slow"], tips: &["nondeterministic_output"], group: CLUSTER, summary: "Returns information about the state of a node.", status: Status::Partial, handler: Some(cluster::info), ..ROW },
    CommandSpec { name: "cluster|slots", arity: 2, flags: LOADING_STALE, acl_categories: &["@slow"], tips: &["nondeterministic_output"], group: CLUSTER, summary: "Returns the mapping of cluster slots to nodes.", handler: Some(cluster::slots), ..ROW },
    CommandSpec { name: "cluster|shards", arity: 2, flags: LOADING_STALE, acl_categories: &["@slow"], tips: &["nondeterministic_output"], group: CLUSTER, summary: "Returns the mapping of cluster slots to shards.", status: Status::Partial, handler: Some(cluster::shards), ..ROW },
    CommandSpec { name: "cluster|nodes", arity: 2, flags: LOADING_STALE, acl_categories: &["@slow"], tips: &["nondeterministic_output"], group: CLUSTER, summary: "Returns the cluster configuration for a node.", status: Status::Partial, handler: Some(cluster::nodes), ..ROW },
    CommandSpec { name: "cluster|keyslot", arity: 3, flags: LOADING_STALE, acl_categories: &["@slow"], group: CLUSTER, summary: "Returns the hash slot for a key.", handler: Some(cluster::keyslot), ..ROW },
    CommandSpec { name: "cluster|setslot", arity: -4, flags: &["admin", "stale", "noscript"], acl_categories: &["@admin", "@slow", "@dangerous"], group: CLUSTER, summary: "Binds a hash slot to a node.", status: Status::Partial, handler: Some(cluster::setslot), ..ROW },
    CommandSpec { name: "cluster|myid", arity: 2, flags: LOADING_STALE, acl_categories: &["@slow"], group: CLUSTER, summary: "Returns the ID of a node.", handler: Some(cluster::myid), ..ROW },
    CommandSpec { name: "cluster|help", arity: 2, flags: LOADING_STALE, acl_categories: &["@slow"], group: CLUSTER, summary: "Returns helpful text about the different subcommands.", handler: Some(introspect::help), ..ROW },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn names_are_unique_lower_case_and_handled() {
        let mut seen = std::collections::HashSet::new();
        for spec in COMMANDS {
            assert!(seen.insert(spec.name), "{} twice", spec.name);
            assert_eq!(spec.name, spec.name.to_ascii_lowercase());
            assert!(
                !spec.summary.is_empty() && !spec.group.is_empty(),
                "{}",
                spec.name
            );
            assert!(
                spec.handler.is_some() || !spec.subcommands.is_empty(),
                "{}",
                spec.name
            );
            for sub in spec.subcommands {
                assert!(
                    sub.name.starts_with(&format!("{}|", spec.name)),
                    "{}",
                    sub.name
                );
                assert!(sub.handler.is_some(), "{}", sub.name);
                assert!(sub.arity.unsigned_abs() >= 2, "{}", sub.name);
                assert!(seen.insert(sub.name), "{} twice", sub.name);
            }
        }
    }

    #[test]
    fn lookup_ignores_case() {
        assert_eq!(lookup(b"GeT").map(|s| s.name), Some("get"));
        assert!(lookup(b"get ").is_none());
        let client = lookup(b"client").expect("client");
        assert_eq!(
            lookup_in(client.subcommands, b"SETNAME").map(|s| s.name),
            Some("client|setname")
        );
    }

    #[test]
    fn arity() {
        let get = lookup(b"get").expect("get");
        assert!(get.arity_accepts(2));
        assert!(!get.arity_accepts(1) && !get.arity_accepts(3));
        let del = lookup(b"del").expect("del");
        assert!(!del.arity_accepts(1));
        assert!(del.arity_accepts(2) && del.arity_accepts(100));
    }

    #[test]
    fn key_positions() {
        let keys_of = |words: &[&str]| -> Vec<Vec<u8>> {
            let argv = argv(words);
            let spec = lookup(&argv[0]).expect("known");
            spec.keys(&argv).into_iter().map(<[u8]>::to_vec).collect()
        };
        assert_eq!(keys_of(&["get", "a"]), argv(&["a"]));
        assert_eq!(keys_of(&["set", "a", "1", "EX", "5"]), argv(&["a"]));
        assert_eq!(keys_of(&["mset", "a", "1", "b", "2"]), argv(&["a", "b"]));
        assert_eq!(keys_of(&["del", "a", "b", "c"]), argv(&["a", "b", "c"]));
        assert_eq!(keys_of(&["ping"]), Vec::<Vec<u8>>::new());
        assert_eq!(keys_of(&["mset", "a", "1", "b"]), argv(&["a", "b"]));
    }
}
