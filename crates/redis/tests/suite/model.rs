//! The session against a model: random sequences of commands, valid and garbage,
//! on binary keys, through a Session over MemKeyspace, beside a map of what each
//! key must hold. Checks that nothing panics, that every request gets one reply
//! that encodes in either protocol, and that reads agree with the model.

use std::collections::HashMap;

use proptest::prelude::*;
use rowankv_redis::{commands, Context, MemKeyspace, Session};
use rowankv_resp::{encode, Protocol, Request, Value};

use crate::support::NOW_MS;

/// What the model knows of a key.
#[derive(Clone, Debug, PartialEq)]
enum Known {
    Absent,
    Holds(Vec<u8>),
    /// A garbage command named the key: it may have changed it.
    Unknown,
}

#[derive(Clone, Debug)]
enum Op {
    Set(Vec<u8>, Vec<u8>),
    Get(Vec<u8>),
    Del(Vec<u8>),
    Append(Vec<u8>, Vec<u8>),
    Incr(Vec<u8>),
    Garbage(Vec<Vec<u8>>),
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            b"a".to_vec(),
            b"b".to_vec(),
            b"{t}x".to_vec(),
            b"\x00".to_vec(),
            b"\xff\r\n".to_vec(),
            Vec::new(),
        ]),
        prop::collection::vec(any::<u8>(), 0..4),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8),
        (-5i64..5).prop_map(|n| n.to_string().into_bytes()),
        Just(b"9223372036854775807".to_vec()),
    ]
}

/// A request that may be anything: a known command with random arguments (keys
/// among them), or a random name.
fn garbage() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let mut names: Vec<Vec<u8>> = commands()
        .iter()
        .flat_map(|spec| {
            let mut words = vec![spec.name.as_bytes().to_vec()];
            words.extend(
                spec.subcommands
                    .iter()
                    .map(|sub| sub.name.replace('|', " ").into_bytes()),
            );
            words
        })
        .collect();
    names.extend([b"LPUSH".to_vec(), b"MULTI".to_vec(), b"".to_vec()]);
    let name = prop_oneof![
        prop::sample::select(names),
        prop::collection::vec(any::<u8>(), 0..6),
    ];
    let arg = prop_oneof![
        key(),
        value(),
        prop::sample::select(
            [
                "NX", "XX", "GET", "EX", "PX", "KEEPTTL", "MATCH", "COUNT", "GT", "LT", "0", "-1",
                "3"
            ]
            .map(|w| w.as_bytes().to_vec())
            .to_vec()
        ),
    ];
    (name, prop::collection::vec(arg, 0..6)).prop_map(|(name, args)| {
        // "client setname" and the like become two words.
        let mut argv: Vec<Vec<u8>> = name.split(|&b| b == b' ').map(<[u8]>::to_vec).collect();
        argv.extend(args);
        argv
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (key(), value()).prop_map(|(k, v)| Op::Set(k, v)),
        3 => key().prop_map(Op::Get),
        1 => key().prop_map(Op::Del),
        1 => (key(), value()).prop_map(|(k, v)| Op::Append(k, v)),
        1 => key().prop_map(Op::Incr),
        3 => garbage().prop_map(Op::Garbage),
    ]
}

struct World {
    session: Session,
    keyspace: MemKeyspace,
    ctx: Context,
    model: HashMap<Vec<u8>, Known>,
}

impl World {
    fn run(&mut self, argv: Vec<Vec<u8>>) -> Value {
        let outcome = self
            .session
            .execute(&Request::new(argv), &mut self.keyspace, &self.ctx);
        assert_eq!(outcome.replies.len(), 1);
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let mut out = Vec::new();
            encode(&outcome.replies[0], protocol, &mut out);
            assert!(!out.is_empty());
        }
        outcome.replies.into_iter().next().expect("one reply")
    }

    fn known(&self, key: &[u8]) -> Known {
        self.model.get(key).cloned().unwrap_or(Known::Absent)
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Set(k, v) => {
                let reply = self.run(vec![b"SET".to_vec(), k.clone(), v.clone()]);
                assert_eq!(reply, Value::ok());
                self.model.insert(k, Known::Holds(v));
            }
            Op::Get(k) => {
                let reply = self.run(vec![b"GET".to_vec(), k.clone()]);
                match self.known(&k) {
                    Known::Absent => assert_eq!(reply, Value::Null, "GET {k:?}"),
                    Known::Holds(v) => assert_eq!(reply, Value::BulkString(v), "GET {k:?}"),
                    Known::Unknown => {
                        assert!(
                            matches!(reply, Value::Null | Value::BulkString(_)),
                            "{reply:?}"
                        )
                    }
                }
            }
            Op::Del(k) => {
                let reply = self.run(vec![b"DEL".to_vec(), k.clone()]);
                match self.known(&k) {
                    Known::Absent => assert_eq!(reply, Value::Integer(0)),
                    Known::Holds(_) => assert_eq!(reply, Value::Integer(1)),
                    Known::Unknown => assert!(matches!(reply, Value::Integer(0 | 1))),
                }
                self.model.insert(k, Known::Absent);
            }
            Op::Append(k, v) => {
                let reply = self.run(vec![b"APPEND".to_vec(), k.clone(), v.clone()]);
                match self.known(&k) {
                    Known::Absent => {
                        assert_eq!(reply, Value::Integer(v.len() as i64));
                        self.model.insert(k, Known::Holds(v));
                    }
                    Known::Holds(old) => {
                        let new = [old, v].concat();
                        assert_eq!(reply, Value::Integer(new.len() as i64));
                        self.model.insert(k, Known::Holds(new));
                    }
                    Known::Unknown => assert!(matches!(reply, Value::Integer(_))),
                }
            }
            Op::Incr(k) => {
                let reply = self.run(vec![b"INCR".to_vec(), k.clone()]);
                let expected = match self.known(&k) {
                    Known::Absent => Some(Some(1)),
                    Known::Holds(v) => Some(
                        std::str::from_utf8(&v)
                            .ok()
                            .filter(|t| {
                                t.parse::<i64>()
                                    .map(|n| n.to_string() == **t)
                                    .unwrap_or(false)
                            })
                            .and_then(|t| t.parse::<i64>().ok())
                            .and_then(|n| n.checked_add(1)),
                    ),
                    Known::Unknown => None,
                };
                match (expected, &reply) {
                    (Some(Some(n)), _) => {
                        assert_eq!(reply, Value::Integer(n));
                        self.model
                            .insert(k, Known::Holds(n.to_string().into_bytes()));
                    }
                    (Some(None), _) => assert!(reply.is_error(), "{reply:?}"),
                    (None, Value::Integer(n)) => {
                        self.model
                            .insert(k, Known::Holds(n.to_string().into_bytes()));
                    }
                    (None, _) => assert!(reply.is_error(), "{reply:?}"),
                }
            }
            Op::Garbage(argv) => {
                if argv.is_empty() {
                    return;
                }
                for word in &argv[1..] {
                    self.model.insert(word.clone(), Known::Unknown);
                }
                self.run(argv);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn session_agrees_with_the_model(ops in prop::collection::vec(op(), 1..64)) {
        let mut world = World {
            session: Session::new(1),
            keyspace: MemKeyspace::new(),
            ctx: Context::new(NOW_MS),
            model: HashMap::new(),
        };
        for op in ops {
            world.apply(op);
        }
    }

    #[test]
    fn any_bytes_get_one_reply(argv in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 1..8)) {
        let mut world = World {
            session: Session::new(1),
            keyspace: MemKeyspace::new(),
            ctx: Context::new(NOW_MS),
            model: HashMap::new(),
        };
        world.run(argv);
    }
}
