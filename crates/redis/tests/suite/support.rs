//! A session, a keyspace and a context, and short ways to write replies.

use rowankv_redis::{Context, Keyspace, MemKeyspace, Outcome, Session};
use rowankv_resp::{encode, Request, Value};

/// The time tests start at: 2023-11-14T22:13:20Z.
pub const NOW_MS: u64 = 1_700_000_000_000;

pub struct Harness<K: Keyspace = MemKeyspace> {
    pub session: Session,
    pub keyspace: K,
    pub ctx: Context,
}

impl Harness<MemKeyspace> {
    pub fn new() -> Harness<MemKeyspace> {
        Harness::with(MemKeyspace::new())
    }
}

impl<K: Keyspace> Harness<K> {
    pub fn with(keyspace: K) -> Harness<K> {
        Harness {
            session: Session::new(7),
            keyspace,
            ctx: Context::new(NOW_MS),
        }
    }

    /// Runs a request given as raw words.
    pub fn execute(&mut self, argv: Vec<Vec<u8>>) -> Outcome {
        let request = Request::new(argv);
        let outcome = self
            .session
            .execute(&request, &mut self.keyspace, &self.ctx);
        assert_eq!(outcome.replies.len(), 1, "one reply per request");
        outcome
    }

    /// Runs a request given as words and returns its one reply.
    pub fn run(&mut self, words: &[&str]) -> Value {
        let argv = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let outcome = self.execute(argv);
        assert!(!outcome.close || words[0].eq_ignore_ascii_case("quit"));
        outcome.replies.into_iter().next().expect("one reply")
    }

    /// The reply as the client reads it off the wire, in the session's protocol.
    pub fn wire(&mut self, words: &[&str]) -> String {
        let reply = self.run(words);
        let mut out = Vec::new();
        encode(&reply, self.session.protocol(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn advance_ms(&mut self, ms: u64) {
        self.ctx.now_ms += ms;
    }
}

pub fn ok() -> Value {
    Value::ok()
}

pub fn int(n: i64) -> Value {
    Value::Integer(n)
}

pub fn bulk(text: &str) -> Value {
    Value::bulk(text)
}

pub fn err(line: &str) -> Value {
    Value::error(line)
}

pub fn array(items: Vec<Value>) -> Value {
    Value::Array(items)
}

pub fn bulks(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| bulk(s)).collect())
}

/// The text of a bulk or verbatim string reply.
pub fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) | Value::Verbatim { text: bytes, .. } => {
            String::from_utf8_lossy(bytes).into_owned()
        }
        other => panic!("not a string reply: {other:?}"),
    }
}

/// Whether the reply is an error starting with `prefix`.
pub fn is_error_starting(value: &Value, prefix: &str) -> bool {
    matches!(value, Value::Error(line) if line.starts_with(prefix.as_bytes()))
}
