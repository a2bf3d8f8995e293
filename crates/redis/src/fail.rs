//! How a command fails: with an error reply of its own, or with a keyspace error
//! that becomes the reply Redis clients expect (`MOVED`, `TRYAGAIN`, ...).

use rowankv_resp::{errors, Value};

use crate::keyspace::KeyspaceError;
use crate::rmw::RMW_ATTEMPTS_MAX;

/// Why a command handler stopped.
#[derive(Debug)]
pub(crate) enum Fail {
    /// An error reply, as is.
    Reply(Value),
    /// A keyspace error, turned into its reply by [`Fail::into_reply`].
    Keyspace(KeyspaceError),
}

impl From<KeyspaceError> for Fail {
    fn from(error: KeyspaceError) -> Fail {
        Fail::Keyspace(error)
    }
}

/// What a handler returns: its reply, or why it failed.
pub(crate) type Reply = Result<Value, Fail>;

/// A failure with a fixed error line (`errors::SYNTAX`, ...).
pub(crate) fn fail(line: &str) -> Fail {
    Fail::Reply(Value::error(line))
}

/// A failure with an error line built from bytes (one that echoes an argument).
pub(crate) fn fail_bytes(parts: &[&[u8]]) -> Fail {
    Fail::Reply(Value::Error(parts.concat()))
}

/// The reply of a read-modify-write command that lost every attempt to concurrent
/// writers of its key.
pub(crate) fn contended() -> Value {
    Value::error(format!(
        "ERR key is contended: {RMW_ATTEMPTS_MAX} attempts in a row lost to concurrent writes of it; retry the command"
    ))
}

impl Fail {
    pub(crate) fn into_reply(self, cluster_mode: bool) -> Value {
        match self {
            Fail::Reply(value) => value,
            Fail::Keyspace(error) => keyspace_reply(error, cluster_mode),
        }
    }
}

fn keyspace_reply(error: KeyspaceError, cluster_mode: bool) -> Value {
    match error {
        // Only read-modify-write asks with a condition, and it retries; a conflict
        // that reaches here is one it gave up on.
        KeyspaceError::Conflict => contended(),
        KeyspaceError::Moved { slot, host, port } => errors::moved(slot, &host, port),
        KeyspaceError::TryAgain(message) if message.is_empty() => Value::error(errors::TRYAGAIN),
        KeyspaceError::TryAgain(message) => Value::error(format!("TRYAGAIN {message}")),
        KeyspaceError::Down(message) if cluster_mode && message.is_empty() => {
            Value::error(errors::CLUSTERDOWN)
        }
        KeyspaceError::Down(message) if cluster_mode => {
            Value::error(format!("CLUSTERDOWN {message}"))
        }
        KeyspaceError::Down(message) | KeyspaceError::Other(message) => {
            Value::error(format!("ERR {message}"))
        }
    }
}
