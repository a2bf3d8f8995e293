//! RowanKV's Redis command layer: what a RowanKV server answers on its RESP port,
//! so that Redis clients, `redis-cli`, `redis-benchmark` and cluster-aware clients
//! work against RowanKV unchanged (issue "Speak Redis").
//!
//! # What it owns, what it never does
//!
//! It owns the per-connection state ([`Session`]: protocol, authentication, name),
//! the command table ([`commands`]: name, arity, flags, key positions, handler),
//! every command's semantics and its Redis-worded errors, and the mapping of
//! keyspace failures to the errors clients act on (`MOVED`, `TRYAGAIN`,
//! `CLUSTERDOWN`). It is pure logic: no sockets, no threads, no clock (time comes
//! in [`Context::now_ms`]), no configuration of its own (it comes in [`Context`]).
//! It depends on `rowankv-resp` and nothing else of RowanKV; storage is reached
//! only through the [`Keyspace`] trait, which the servers implement over the
//! cluster's client and [`MemKeyspace`] implements in memory.
//!
//! # How a server uses it
//!
//! ```text
//! per connection:  session = Session::new(next_client_id)
//! per request:     parser.set_auth_required(!session.is_authenticated(&ctx))
//!                  (request, used) = parser.parse(&buffer)?       // rowankv_resp
//!                  outcome = session.execute(&request, &mut keyspace, &ctx)
//!                  for reply in outcome.replies { encode(&reply, session.protocol(), &mut out) }
//!                  if outcome.close { flush, then close }
//! ```
//!
//! A request goes through the checks Redis makes, in Redis's order: the command
//! exists (`ERR unknown command ...`), its arity (`ERR wrong number of arguments
//! ...`), authentication (`NOAUTH`, unless the command is AUTH, HELLO, QUIT or
//! RESET), and in cluster mode that its keys hash to one slot (`CROSSSLOT`); then
//! its handler runs. Commands outside the table (lists, hashes, sets, streams,
//! MULTI, pub/sub, scripting, ...) get Redis's unknown-command error, which is what
//! clients expect of a server without a feature; `docs/redis-compatibility.md`
//! lists, per command, what is supported and how it differs from Redis, and a test
//! keeps that page and the table in step.
//!
//! # What is atomic, and why
//!
//! - Each single-key command is atomic for its key. Plain writes (SET, SETEX,
//!   MSET's writes, DEL) are one keyspace write each. Commands that write from
//!   what they read — INCR/DECR/INCRBY/DECRBY/INCRBYFLOAT, APPEND, SETRANGE,
//!   SETNX, GETSET, GETDEL, GETEX, SET with NX/XX/GET/KEEPTTL, the EXPIRE family,
//!   PERSIST — read the key's record and write with a condition on it
//!   (`Expect::Version(v)` of the record read, or `Expect::Absent`); if another
//!   write got there first, the keyspace answers `Conflict` and the command reads
//!   again and retries, at most [`RMW_ATTEMPTS_MAX`] times, then answers an error saying
//!   the key is contended. Given a keyspace whose conditional write is atomic per
//!   key (the [`Keyspace`] contract, checked by [`conformance`]), every such
//!   command therefore takes effect as if alone on its key: no increment is lost,
//!   no SET NX is won twice.
//! - Commands over several keys are not atomic across them: MGET may see one key
//!   before and another after a concurrent write, MSET's keys become visible one
//!   by one, DEL deletes one key after the other. MSETNX is best effort: it writes
//!   each key only if it is still absent and, if one is taken meanwhile, deletes
//!   the keys it already wrote (each only if nobody rewrote it since) and answers
//!   0. In cluster mode all keys of one command hash to one slot, as Redis Cluster
//!   requires, but that does not make them one atomic unit here.
//!
//! # What WAIT means in RowanKV
//!
//! Redis acknowledges a write once its primary has it in memory and replicates it
//! afterwards; WAIT blocks until enough replicas confirm. RowanKV acknowledges a
//! write only once it is durable on the primary and every replica. So when WAIT
//! runs, every write the connection saw acknowledged is already on all replicas:
//! WAIT answers at once with the number of replicas ([`Context::replicas`]),
//! whatever its timeout, and WAITAOF answers `[1, replicas]` (persistent locally
//! and on every replica). Asking for more replicas than exist does not block
//! either: no more can come.
//!
//! # Invariants
//!
//! - `Session::execute` never panics, whatever the request's bytes (a property
//!   test drives random and garbage requests through it), and answers exactly one
//!   reply per request.
//! - Replies are built as [`rowankv_resp::Value`]s independent of the protocol;
//!   the server encodes them in [`Session::protocol`], which is RESP2 until HELLO 3.
//! - Every loop over client-controlled counts has a named bound
//!   ([`RMW_ATTEMPTS_MAX`], [`SCAN_COUNT_MAX`], [`KEYS_SCANNED_MAX`]).
#![forbid(unsafe_code)]

mod cmd;
mod context;
mod fail;
mod glob;
pub mod keyspace;
mod mem;
mod num;
mod rmw;
mod session;
mod table;

pub mod conformance;

pub use cmd::keys::{KEYS_SCANNED_MAX, SCAN_COUNT_MAX};
pub use cmd::server::KEYSPACE_SAMPLE;
pub use context::{
    ClusterNode, ClusterShard, Context, ServerInfo, SlotRange, Topology, TopologyError,
    NODE_ID_LEN, REDIS_COMPATIBLE_VERSION,
};
pub use keyspace::{Expect, Keyspace, KeyspaceError, Record, SlotMoveError};
pub use mem::MemKeyspace;
pub use rmw::RMW_ATTEMPTS_MAX;
pub use session::{Outcome, Session};
pub use table::{commands, CommandSpec, KeyPositions, Status};
