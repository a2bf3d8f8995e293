//! A server process's Redis front end (`[resp]` in its file): Redis clients,
//! `redis-cli` and `redis-benchmark` connect to it and their commands run
//! against the whole cluster.
//!
//! Each connection has a thread of its own that parses requests
//! (`rowankv_resp::RequestParser`, pipelining included), runs them through the
//! command layer (`rowankv_redis::Session`) and writes the replies in the
//! connection's protocol. The command layer reaches the data through
//! [`ClusterKeyspace`]: RowanKV clients of this process, on its own NIC, which
//! route each key to its shard's primary over the fabric (`resp.redirect =
//! forward`: a key whose primary is another server costs that extra hop).
//! Read-modify-write commands are conditional writes (`Client::put_if`),
//! executed atomically at the primary.
//!
//! The clients are pooled (at most [`CLIENTS_MAX`], made when first needed and
//! shared by every connection), so a hundred Redis connections do not open a
//! hundred sets of connections to every worker of every server.
//!
//! The front end shares its process with a storage server, so what a client may
//! make it hold is bounded: arguments of at most [`BULK_BYTES_MAX`], at most
//! [`ARGUMENTS_MAX`] of them, [`QUERY_BUFFER_MAX`] bytes of requests not yet run,
//! [`CONNECTIONS_MAX`] connections (one thread each); replies are written out
//! as they reach a megabyte, and a client that reads none for 30 s is dropped.
//! A connection waits for a pool client at most [`POOL_WAIT`] (`TRYAGAIN`
//! then): longer than one operation's timeout, so clients held through a
//! failover or a stalled server do not turn a queue of waiting connections
//! into errors.
//!
//! SCAN walks the shards one after another, each through its primary
//! (`Body::Scan`); KEYS and DBSIZE scan every shard.
//!
//! Cluster routing: shards own ranges of Redis Cluster's hash slots
//! (`rowankv_wire::config::routing_hash`), and the front end describes them
//! (CLUSTER SLOTS, SHARDS, NODES: [`topology`]) with every member's Redis
//! address from the configuration, so cluster-aware clients send each key to
//! its primary's front end. With `resp.redirect = moved` the front end is a
//! Redis Cluster node: a key whose primary is another server is answered
//! `-MOVED slot host:port`, a command over several slots `-CROSSSLOT`, and
//! SCAN, KEYS and DBSIZE cover the shards it leads. With `forward` (the
//! default) it serves every key itself as above.
//!
//! Expiry (SET EX/PX/EXAT/PXAT/KEEPTTL, EXPIRE and its family, TTL) is stored
//! with the value in its log entry: the front end turns a relative time into
//! Unix milliseconds on its own clock, the key's primary answers a value past
//! it as absent on its clock, and the cleaner keeps only its tombstone. Across
//! hosts the clocks' skew shifts when a key expires by as much.
//!
//! FLUSHALL (when `resp.flushall` enables it) deletes what a SCAN finds, key by
//! key: not atomic with writes that race it.
//!
//! CLUSTER SETSLOT <slot> NODE <node-id> (when `resp.setslot` enables it)
//! moves the shard whose range starts at `<slot>` to the member with that
//! Redis Cluster id ([`cluster_node_id`], what CLUSTER NODES prints): checked
//! against the server's configuration ([`setslot_move`]), then asked of the
//! active CM as `rowankv reshard` asks it (`CmSource::reshard`, `Body::Reshard`:
//! the CM plans and stores the migration). It answers once the CM has listed
//! the move and this server holds that configuration; the copy goes on
//! behind it (INFO's `rowankv` section counts the migrations under way).
//! No front end ever answers `-ASK` (docs/resharding.md, "Redis clients
//! during a move"): from the configuration that lists a move on, the target
//! is the shard's primary and serves every key of it, the keys not copied yet
//! read at the source by the target's own client (`AskSource`), so `-MOVED`
//! to the target is the whole answer. A command the move holds up for longer
//! than an operation may wait (a conditional write of a key not copied yet,
//! a SCAN of the shard) is answered `-TRYAGAIN`: it changed nothing, and
//! cluster clients retry it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam::channel::{bounded, Sender};
use parking_lot::Mutex;
use rowankv_client::cm_source::{CmSource, ReshardError};
use rowankv_client::{Client, ClientConfig, ClientError, Expect as WireExpect};
use rowankv_fabric::tcp::TcpNic;
use rowankv_redis::{
    ClusterNode, ClusterShard, Context, Expect, Keyspace, KeyspaceError, Record, ServerInfo,
    Session, SlotMoveError, SlotRange, Topology,
};
use rowankv_resp::{encode, RequestLimits, RequestParser};
use rowankv_rpc::directory::Directory;
use rowankv_server::deploy::{Redirect, RespDeployment};
use rowankv_types::{NodeId, ShardId, Term};
use rowankv_wire::config::{Config, ConfigSource};
use rowankv_wire::frame::ErrorCode;

use crate::{perr, ProcessError};

/// Clients one front end shares among its connections, at most.
pub const CLIENTS_MAX: usize = 16;

/// How long a connection waits for a pool client before its command answers
/// `TRYAGAIN`: three operations' timeouts, so that every client being held
/// through one timed-out operation (a primary lost until the next
/// configuration) is waited out.
pub const POOL_WAIT: Duration = Duration::from_secs(30);

/// The low bits of a SCAN cursor: the shard's own cursor.
const SHARD_CURSOR_MASK: u64 = (1 << 48) - 1;

/// How long one operation may take before the command answers an error.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// The front end runs inside a storage server, so what one client may make it
/// hold is bounded well below Redis's defaults (512 MiB arguments, a 1 GiB
/// query buffer): a RowanKV key and value take a few KiB at most.
/// The longest argument (`proto-max-bulk-len`): longer is a protocol error.
pub const BULK_BYTES_MAX: usize = 1 << 20;
/// The most arguments of one request.
pub const ARGUMENTS_MAX: usize = 64 * 1024;
/// Bytes of a connection's requests not yet run; more closes it.
pub const QUERY_BUFFER_MAX: usize = 16 << 20;
/// Reply bytes written out at once, rather than gathered further.
const REPLY_FLUSH_BYTES: usize = 1 << 20;
/// Redis connections served at once; more are answered
/// `ERR max number of clients reached` and closed.
pub const CONNECTIONS_MAX: u64 = 1024;
/// A client that reads none of its replies for this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long CLUSTER SETSLOT, once the CM has listed the move, waits for this
/// server to hold that configuration (so that CLUSTER SLOTS asked next here
/// shows the move). It answers OK either way: the move is stored.
const SETSLOT_SHOWN_WAIT: Duration = Duration::from_secs(5);

/// What the front end needs of its server.
pub struct FrontParts {
    pub nic: TcpNic,
    pub directory: Directory,
    pub source: Arc<dyn ConfigSource>,
    /// The CMs, asked to move a shard (CLUSTER SETSLOT): the server's own
    /// source of configurations, as `rowankv reshard` asks through its own.
    pub cms: Arc<CmSource<TcpNic>>,
    /// The configuration the server holds now (INFO's `rowankv` section).
    pub config: Arc<dyn Fn() -> Option<Arc<Config>> + Send + Sync>,
    /// The server's node and replication strategy, for INFO.
    pub node: String,
    pub me: NodeId,
    pub strategy: String,
}

/// A member's Redis Cluster node id: 40 hex characters, the cluster id and
/// the node's, so the same on every front end.
pub fn cluster_node_id(cluster_id: u64, node: NodeId) -> String {
    format!("{cluster_id:032x}{:08x}", node.0)
}

/// `config` as Redis Cluster clients see it, from `me`'s front end: one shard
/// per RowanKV shard, with its slot range and its primary at the Redis
/// address it joined with. `None` if some primary runs no front end (cluster
/// clients could not reach it).
///
/// A member that holds no replica of any shard is listed as a master of no
/// slots (a shard of none).
///
/// A backup is listed as a replica only if it leads no shard: every RowanKV
/// server is the primary of some shards and a backup of others, while Redis
/// Cluster clients take a node listed as a replica of one shard for a replica
/// everywhere (redis-py then leaves it out of its primaries, and its SCAN and
/// DBSIZE over the primaries miss that node's keys). Reads go to primaries
/// anyway.
pub fn topology(config: &Config, me: NodeId) -> Option<Topology> {
    let leaders: std::collections::BTreeSet<NodeId> =
        config.shards.iter().map(|s| s.primary).collect();
    let node = |n: NodeId| -> Option<ClusterNode> {
        let (host, port) = config.member(n)?.resp.as_ref()?.rsplit_once(':')?;
        Some(ClusterNode {
            id: cluster_node_id(config.cluster_id, n),
            host: host.to_string(),
            port: port.parse().ok()?,
        })
    };
    let shards = config
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (start, end) = config.slot_range(i);
            Some(ClusterShard {
                slots: vec![SlotRange { start, end }],
                primary: node(s.primary)?,
                replicas: s
                    .backups
                    .iter()
                    .filter(|b| !leaders.contains(b))
                    .map(|&b| node(b))
                    .collect::<Option<_>>()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    // A member that leads no shard and backs none (a server that joined
    // since) is listed as a master without slots, as Redis lists an empty
    // node: CLUSTER NODES then shows the id CLUSTER SETSLOT moves a shard to.
    let listed: std::collections::BTreeSet<NodeId> = config
        .shards
        .iter()
        .flat_map(|s| std::iter::once(s.primary).chain(s.backups.iter().copied()))
        .collect();
    let empty = config
        .members
        .iter()
        .filter(|m| !listed.contains(&m.node))
        .filter_map(|m| node(m.node))
        .map(|primary| ClusterShard {
            slots: Vec::new(),
            primary,
            replicas: Vec::new(),
        });
    let shards = shards.into_iter().chain(empty).collect();
    Topology::new(
        config.term.0,
        cluster_node_id(config.cluster_id, me),
        shards,
    )
    .map_err(|e| tracing::warn!(error = %e, "the configuration as a Redis Cluster topology"))
    .ok()
}

/// What `CLUSTER SETSLOT <slot> NODE <node_id>` asks of `config`: the shard
/// whose range of slots starts at `slot`, and the member whose Redis Cluster
/// id ([`cluster_node_id`], any case) is `node_id` and who serves Redis
/// clients (only those are listed by CLUSTER NODES).
///
/// `slot` must be the first of its shard's range: RowanKV moves whole shards,
/// and a request naming one slot inside a range would move the others
/// unasked. The checks here are those a Redis operator needs answered in
/// slots and node ids; the CM checks the move again against the
/// configuration it holds (`plan_migrate`) and alone refuses a target that
/// holds a replica of the shard or a move while another reconfiguration is
/// under way.
pub fn setslot_move(
    config: &Config,
    slot: u16,
    node_id: &str,
) -> Result<(ShardId, NodeId), SlotMoveError> {
    let id_of = |n: NodeId| cluster_node_id(config.cluster_id, n);
    let index = (0..config.shards.len())
        .find(|&i| {
            let (start, end) = config.slot_range(i);
            (start..=end).contains(&slot)
        })
        .ok_or_else(|| SlotMoveError::Refused(format!("no shard owns slot {slot}")))?;
    let (start, end) = config.slot_range(index);
    if slot != start {
        return Err(SlotMoveError::NotShardStart { slot, start, end });
    }
    let wanted = node_id.to_ascii_lowercase();
    let to = config
        .members
        .iter()
        .find(|m| m.resp.is_some() && id_of(m.node) == wanted)
        .map(|m| m.node)
        .ok_or_else(|| SlotMoveError::UnknownNode(node_id.to_string()))?;
    let shard = &config.shards[index];
    if shard.primary == to {
        return Err(SlotMoveError::AlreadyPrimary {
            node: wanted,
            start,
            end,
        });
    }
    if let Some(m) = config.migration(shard.shard) {
        return Err(SlotMoveError::Migrating {
            start,
            end,
            to: id_of(m.to),
        });
    }
    Ok((shard.shard, to))
}

/// A running front end; stopped when dropped.
pub struct RespFront {
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    pub local_addr: SocketAddr,
}

impl Drop for RespFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Clients made on demand, at most [`CLIENTS_MAX`], shared by the connections.
///
/// Handed out in the order asked for: a client given back goes straight to the
/// connection that has waited longest, so a connection running command after
/// command cannot take its client back ahead of one waiting (with fifty
/// connections on sixteen clients, that starved some for the whole wait).
struct ClientPool {
    parts: FrontParts,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Client<TcpNic>>,
    /// Connections waiting for a client, longest first, each by a ticket.
    waiting: std::collections::VecDeque<(u64, Sender<Client<TcpNic>>)>,
    next_ticket: u64,
    made: usize,
}

impl ClientPool {
    fn take(&self) -> Result<Client<TcpNic>, KeyspaceError> {
        let wait = {
            let mut s = self.state.lock();
            if s.waiting.is_empty() {
                if let Some(c) = s.idle.pop() {
                    return Ok(c);
                }
            }
            if s.made < CLIENTS_MAX {
                s.made += 1;
                None
            } else {
                let (tx, rx) = bounded(1);
                let ticket = s.next_ticket;
                s.next_ticket += 1;
                s.waiting.push_back((ticket, tx));
                Some((ticket, rx))
            }
        };
        let Some((ticket, rx)) = wait else {
            return self.make();
        };
        if let Ok(c) = rx.recv_timeout(POOL_WAIT) {
            return Ok(c);
        }
        // Given up waiting: out of the queue, under the lock `give_back` hands
        // clients over under, so a client handed over meanwhile is not lost.
        let mut s = self.state.lock();
        s.waiting.retain(|(t, _)| *t != ticket);
        drop(s);
        rx.try_recv()
            .map_err(|_| KeyspaceError::TryAgain("every cluster client is busy".into()))
    }

    fn make(&self) -> Result<Client<TcpNic>, KeyspaceError> {
        let config = ClientConfig {
            timeout: OP_TIMEOUT,
            connect_timeout: OP_TIMEOUT,
            ..ClientConfig::default()
        };
        Client::connect(
            self.parts.nic.clone(),
            self.parts.directory.clone(),
            self.parts.source.clone(),
            config,
        )
        .map_err(|e| {
            self.state.lock().made -= 1;
            KeyspaceError::Down(format!("connecting to the cluster: {e}"))
        })
    }

    /// `c` to the connection that has waited longest, or to the idle ones.
    fn give_back(&self, mut c: Client<TcpNic>) {
        let mut s = self.state.lock();
        while let Some((_, tx)) = s.waiting.pop_front() {
            match tx.try_send(c) {
                Ok(()) => return,
                Err(e) => c = e.into_inner(),
            }
        }
        s.idle.push(c);
    }
}

/// The cluster as the command layer sees it (see the module docs).
pub struct ClusterKeyspace<'a> {
    pool: &'a ClientPool,
    /// `moved`: the configuration keys are checked against, and this server.
    moved: Option<(Arc<Config>, NodeId)>,
    /// The pool client this connection holds for the command it runs (an
    /// MSET of ten keys takes one client, not ten turns).
    held: Option<Client<TcpNic>>,
}

impl ClusterKeyspace<'_> {
    /// Run `f` on this connection's client, taken from the pool if it holds none.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut Client<TcpNic>) -> Result<T, KeyspaceError>,
    ) -> Result<T, KeyspaceError> {
        if self.held.is_none() {
            self.held = Some(self.pool.take()?);
        }
        f(self.held.as_mut().expect("held"))
    }

    /// The command is over: its client goes back to the pool.
    fn release(&mut self) {
        if let Some(c) = self.held.take() {
            self.pool.give_back(c);
        }
    }

    /// Under `moved`, `-MOVED` for a key whose primary is another server.
    fn route(&self, key: &[u8]) -> Result<(), KeyspaceError> {
        let Some((config, me)) = &self.moved else {
            return Ok(());
        };
        let primary = config.shard_for_key(key).primary;
        if primary == *me {
            return Ok(());
        }
        let slot = rowankv_resp::key_slot(key);
        match config.member(primary).and_then(|m| m.resp.as_deref()) {
            Some(resp) => {
                let (host, port) = resp.rsplit_once(':').unwrap_or((resp, "0"));
                Err(KeyspaceError::Moved {
                    slot,
                    host: host.to_string(),
                    port: port.parse().unwrap_or(0),
                })
            }
            None => Err(KeyspaceError::Down(format!(
                "slot {slot}'s primary {primary} serves no Redis clients"
            ))),
        }
    }
}

fn failure(e: ClientError) -> KeyspaceError {
    match e {
        ClientError::Server {
            code: ErrorCode::ConditionFailed | ErrorCode::Busy,
            ..
        } => {
            // Another writer of the key (through another front end, or a
            // client of the native protocol) is in flight: give it a moment
            // before the command reads again, rather than spinning against it.
            let pause = rand::Rng::gen_range(&mut rand::thread_rng(), 100..2_000);
            std::thread::sleep(Duration::from_micros(pause));
            KeyspaceError::Conflict
        }
        e if e.is_unknown() => KeyspaceError::Other(format!("{e} (the write may have happened)")),
        // Held up past the operation's deadline by a migration (a conditional
        // write of a key not copied yet, a SCAN of the shard) or a shard not
        // served yet: nothing changed, and cluster clients retry `TRYAGAIN`.
        ClientError::Server {
            code: ErrorCode::Blocked,
            detail,
        } => KeyspaceError::TryAgain(format!("the shard is blocked ({detail}): ask again")),
        e => KeyspaceError::Other(e.to_string()),
    }
}

fn wire(expect: Expect) -> Option<WireExpect> {
    match expect {
        Expect::Any => None,
        Expect::Absent => Some(WireExpect::Absent),
        Expect::Version(v) => Some(WireExpect::Version(v)),
    }
}

impl Keyspace for ClusterKeyspace<'_> {
    fn get(&mut self, key: &[u8], _now_ms: u64) -> Result<Option<Record>, KeyspaceError> {
        self.route(key)?;
        // The primary answers an expired value as absent, on its clock.
        let got = self.with(|c| c.get_stored(key).map_err(failure))?;
        Ok(got.map(|s| Record {
            value: s.value,
            expires_at_ms: s.expires_at_ms,
            version: s.version,
        }))
    }

    fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        expect: Expect,
        _now_ms: u64,
    ) -> Result<u64, KeyspaceError> {
        self.route(key)?;
        self.with(|c| {
            c.put_with(key, value, wire(expect), expires_at_ms)
                .map_err(failure)
        })
    }

    fn delete(&mut self, key: &[u8], expect: Expect, now_ms: u64) -> Result<bool, KeyspaceError> {
        self.route(key)?;
        // Whether a live value was deleted: read, then delete that version;
        // a write in between makes it read again.
        let expect = match expect {
            Expect::Any => {
                for _ in 0..rowankv_redis::RMW_ATTEMPTS_MAX {
                    let Some(r) = self.get(key, now_ms)? else {
                        return Ok(false);
                    };
                    let e = WireExpect::Version(r.version);
                    match self.with(|c| c.delete_if(key, e).map_err(failure)) {
                        Err(KeyspaceError::Conflict) => continue,
                        other => return other.map(|_| true),
                    }
                }
                return Err(KeyspaceError::TryAgain("the key is being written".into()));
            }
            // Nothing to delete, if the key is indeed absent.
            Expect::Absent => {
                return match self.get(key, now_ms)? {
                    Some(_) => Err(KeyspaceError::Conflict),
                    None => Ok(false),
                }
            }
            Expect::Version(v) => WireExpect::Version(v),
        };
        self.with(|c| c.delete_if(key, expect).map_err(failure))
            .map(|_| true)
    }

    /// A cursor is a shard's index in the configuration (high 16 bits) and the
    /// shard's own cursor (low 48 bits, a bucket of its primary's index).
    fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        _now_ms: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), KeyspaceError> {
        let leads = self.moved.as_ref().map(|(_, me)| *me);
        self.with(|c| {
            let config = c.cluster_config();
            let shards: Vec<rowankv_types::ShardId> = (0..config.shards.len())
                .filter(|&i| leads.is_none_or(|me| config.shards[i].primary == me))
                .map(|i| config.shards[i].shard)
                .collect();
            let (mut at, mut inner) = ((cursor >> 48) as usize, cursor & SHARD_CURSOR_MASK);
            let mut keys = Vec::new();
            while at < shards.len() && keys.len() < count.max(1) {
                let want = (count.max(1) - keys.len()).min(u32::MAX as usize) as u32;
                let (next, mut page) = c.scan(shards[at], inner, want).map_err(failure)?;
                keys.append(&mut page);
                if next == 0 {
                    at += 1;
                    inner = 0;
                } else if next > SHARD_CURSOR_MASK {
                    return Err(KeyspaceError::Other(format!(
                        "a shard cursor {next} out of range"
                    )));
                } else {
                    inner = next;
                }
            }
            let next = if at >= shards.len() {
                0
            } else {
                ((at as u64) << 48) | inner
            };
            Ok((next, keys))
        })
    }

    /// Counted by scanning every shard: a cost in proportion to the keys, as
    /// KEYS (Redis counts in constant time).
    fn dbsize(&mut self, now_ms: u64) -> Result<u64, KeyspaceError> {
        let (mut cursor, mut n) = (0u64, 0u64);
        loop {
            let (next, keys) = self.scan(cursor, 10_000, now_ms)?;
            n += keys.len() as u64;
            if next == 0 {
                return Ok(n);
            }
            cursor = next;
        }
    }

    /// Every key a SCAN of the node's part of the keyspace finds is deleted, one
    /// replicated tombstone each: a cost in proportion to the keys, and not
    /// atomic — a key written by another client while the flush runs may
    /// survive it (Redis flushes in one step).
    fn flushall(&mut self) -> Result<(), KeyspaceError> {
        let now = now_ms();
        let mut cursor = 0;
        loop {
            let (next, keys) = self.scan(cursor, 1000, now)?;
            for key in keys {
                self.delete(&key, Expect::Any, now)?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// CLUSTER SETSLOT ... NODE (see the module docs): checked
    /// ([`setslot_move`]), asked of the active CM, and answered once this
    /// server holds the configuration that lists the move (at most
    /// [`SETSLOT_SHOWN_WAIT`]).
    fn move_slot(&mut self, slot: u16, node_id: &str) -> Result<(), SlotMoveError> {
        let parts = &self.pool.parts;
        let config = (parts.config)().ok_or_else(|| {
            SlotMoveError::Refused("this server holds no configuration yet".into())
        })?;
        let (shard, to) = setslot_move(&config, slot, node_id)?;
        let listed = parts.cms.reshard(shard, to).map_err(|e| match e {
            ReshardError::Refused { reason, .. } => SlotMoveError::Refused(reason),
            ReshardError::NoActiveCm(why) => SlotMoveError::NoManager(why),
        })?;
        tracing::info!(slot, %shard, %to, %listed, "CLUSTER SETSLOT: the shard is moving");
        let deadline = Instant::now() + SETSLOT_SHOWN_WAIT;
        while Instant::now() < deadline && (parts.config)().is_none_or(|c| c.term < listed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

/// Commands that read a key and write it again (the command layer's
/// read-modify-write over conditional writes). Run one at a time per key in a
/// front end ([`Stripes`]), so that its own connections do not make each other
/// retry; connections to other front ends still can, and do.
const READ_MODIFY_WRITE: &[&str] = &[
    "incr",
    "decr",
    "incrby",
    "decrby",
    "incrbyfloat",
    "append",
    "setnx",
    "getset",
    "getdel",
    "getex",
    "setrange",
    "msetnx",
    "persist",
    "expire",
    "pexpire",
    "expireat",
    "pexpireat",
    "del",
    "unlink",
];

/// Whether `request` reads and writes its keys again.
fn is_read_modify_write(request: &rowankv_resp::Request) -> bool {
    let name = request.name();
    if name.eq_ignore_ascii_case(b"set") {
        // SET with NX, XX, GET or KEEPTTL reads the key first.
        return request.args().iter().skip(2).any(|a| {
            [&b"nx"[..], b"xx", b"get", b"keepttl"]
                .iter()
                .any(|o| a.eq_ignore_ascii_case(o))
        });
    }
    READ_MODIFY_WRITE
        .iter()
        .any(|c| name.eq_ignore_ascii_case(c.as_bytes()))
}

/// Locks by key hash: a read-modify-write command holds those of its keys.
struct Stripes(Vec<Mutex<()>>);

impl Stripes {
    const COUNT: usize = 256;

    fn new() -> Stripes {
        Stripes((0..Self::COUNT).map(|_| Mutex::new(())).collect())
    }

    /// The stripes of `keys`, in one order (no two commands wait on each other).
    fn indexes(keys: &[&[u8]]) -> Vec<usize> {
        let mut ix: Vec<usize> = keys
            .iter()
            .map(|k| (rowankv_engine::hash_key(k) % Self::COUNT as u64) as usize)
            .collect();
        ix.sort_unstable();
        ix.dedup();
        ix
    }
}

/// What every connection shares.
struct Shared {
    stripes: Stripes,
    pool: ClientPool,
    info: ServerInfo,
    dep: RespDeployment,
    clients: AtomicU64,
    next_id: AtomicU64,
    stop: Arc<AtomicBool>,
    /// The topology of the configuration of the term it was made for.
    topology: Mutex<Option<(Term, Option<Topology>)>>,
}

impl Shared {
    fn context(&self) -> Context {
        let mut ctx = Context::new(now_ms());
        ctx.server = self.info.clone();
        ctx.requirepass = self.dep.requirepass.clone();
        ctx.flushall_enabled = self.dep.flushall;
        ctx.setslot_enabled = self.dep.setslot;
        ctx.connected_clients = self.clients.load(Ordering::Relaxed);
        ctx.redirects = self.dep.redirect == Redirect::Moved;
        if let Some(c) = (self.pool.parts.config)() {
            ctx.topology = {
                let mut cached = self.topology.lock();
                match &*cached {
                    Some((term, t)) if *term == c.term => t.clone(),
                    _ => {
                        let t = topology(&c, self.pool.parts.me);
                        *cached = Some((c.term, t.clone()));
                        t
                    }
                }
            };
            ctx.replicas = u64::from(c.replication_factor.saturating_sub(1));
            ctx.rowankv = vec![
                ("node".into(), self.pool.parts.node.clone()),
                ("term".into(), c.term.0.to_string()),
                ("strategy".into(), self.pool.parts.strategy.clone()),
                ("members".into(), c.members.len().to_string()),
                ("shards".into(), c.shards.len().to_string()),
                ("migrations".into(), c.migrations.len().to_string()),
            ];
        }
        ctx
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < rowankv_redis::NODE_ID_LEN {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(rowankv_redis::NODE_ID_LEN);
    out
}

/// Start the front end of `dep` on its own threads.
pub fn start(dep: &RespDeployment, parts: FrontParts) -> Result<RespFront, ProcessError> {
    let listener =
        TcpListener::bind(dep.listen).map_err(perr(&format!("RESP listen on {}", dep.listen)))?;
    listener
        .set_nonblocking(true)
        .map_err(perr("a non-blocking RESP listener"))?;
    let local_addr = listener.local_addr().map_err(perr("the RESP address"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Shared {
        pool: ClientPool {
            parts,
            state: Mutex::new(PoolState::default()),
        },
        info: ServerInfo {
            tcp_port: local_addr.port(),
            run_id: run_id(),
            started_at_ms: now_ms(),
            ..ServerInfo::default()
        },
        dep: dep.clone(),
        stripes: Stripes::new(),
        clients: AtomicU64::new(0),
        next_id: AtomicU64::new(1),
        stop: stop.clone(),
        topology: Mutex::new(None),
    });
    let accept = std::thread::Builder::new()
        .name("rkv-resp-accept".into())
        .spawn(move || accept_loop(listener, shared))
        .map_err(perr("the RESP accept thread"))?;
    tracing::info!(resp = %local_addr, "serving Redis clients");
    Ok(RespFront {
        stop,
        accept: Some(accept),
        local_addr,
    })
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                if shared.clients.load(Ordering::Relaxed) >= CONNECTIONS_MAX {
                    let mut out = Vec::new();
                    encode(
                        &rowankv_resp::Value::error(rowankv_resp::errors::MAX_CLIENTS),
                        rowankv_resp::Protocol::Resp2,
                        &mut out,
                    );
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = stream.write_all(&out);
                    continue;
                }
                // Counted before its thread runs, so a burst cannot pass the bound.
                shared.clients.fetch_add(1, Ordering::Relaxed);
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("rkv-resp-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve(stream, peer, &s) {
                            tracing::debug!(%peer, error = %e, "RESP connection ended");
                        }
                        s.clients.fetch_sub(1, Ordering::Relaxed);
                    });
                if let Err(e) = spawned {
                    shared.clients.fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!(%peer, error = %e, "no thread for a RESP connection");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a RESP connection");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// One connection, until the client closes it, QUIT, a protocol error, or the
/// front end stops.
fn serve(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    // Wakes up now and then to see whether the front end stops.
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let local = stream.local_addr()?;
    let mut session = Session::new(shared.next_id.fetch_add(1, Ordering::Relaxed));
    session.set_addresses(peer.to_string(), local.to_string());
    let mut parser = RequestParser::new(RequestLimits {
        bulk_bytes_max: BULK_BYTES_MAX,
        multibulk_len_max: ARGUMENTS_MAX,
        ..RequestLimits::default()
    });
    let mut keyspace = ClusterKeyspace {
        pool: &shared.pool,
        moved: None,
        held: None,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut out: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let mut ctx = None::<Context>;
        let mut used = 0;
        loop {
            let c = ctx.get_or_insert_with(|| {
                keyspace.moved = (shared.dep.redirect == Redirect::Moved)
                    .then(|| (shared.pool.parts.config)().map(|c| (c, shared.pool.parts.me)))
                    .flatten();
                shared.context()
            });
            parser.set_auth_required(!session.is_authenticated(c));
            match parser.parse(&buf[used..]) {
                Ok(Some((request, n))) => {
                    used += n;
                    c.now_ms = now_ms();
                    let stripes = if is_read_modify_write(&request) {
                        let spec = rowankv_redis::commands()
                            .iter()
                            .find(|s| request.name().eq_ignore_ascii_case(s.name.as_bytes()));
                        let keys = spec.map(|s| s.keys(request.argv())).unwrap_or_default();
                        Stripes::indexes(&keys)
                    } else {
                        Vec::new()
                    };
                    let _held: Vec<_> = stripes
                        .iter()
                        .map(|&i| shared.stripes.0[i].lock())
                        .collect();
                    let outcome = session.execute(&request, &mut keyspace, c);
                    keyspace.release();
                    for v in &outcome.replies {
                        encode(v, session.protocol(), &mut out);
                    }
                    if outcome.close {
                        stream.write_all(&out)?;
                        return Ok(());
                    }
                    if out.len() >= REPLY_FLUSH_BYTES {
                        stream.write_all(&out)?;
                        out.clear();
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // As Redis: the error, then the connection is closed.
                    encode(&e.reply(), session.protocol(), &mut out);
                    stream.write_all(&out)?;
                    return Ok(());
                }
            }
        }
        buf.drain(..used);
        if !out.is_empty() {
            stream.write_all(&out)?;
            out.clear();
        }
        let n = loop {
            match stream.read(&mut chunk) {
                Ok(n) => break n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if shared.stop.load(Ordering::Acquire) {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Ok(());
        }
        if buf.len() + n > QUERY_BUFFER_MAX {
            let e = format!(
                "ERR Protocol error: more than {QUERY_BUFFER_MAX} bytes of requests not yet run"
            );
            encode(&rowankv_resp::Value::error(e), session.protocol(), &mut out);
            stream.write_all(&out)?;
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowankv_wire::config::{Member, Migration};

    const CLUSTER: u64 = 0x5e7_5107;

    fn member(n: u32) -> Member {
        Member {
            node: NodeId(n),
            workers: 1,
            address: Some(format!("127.0.0.1:{}", 9000 + n)),
            resp: Some(format!("127.0.0.1:{}", 7000 + n)),
            added: 0,
        }
    }

    /// Four members n10..n13, one shard each, three replicas: shard 0
    /// (slots 0-4095) is led by n10 and backed by n11 and n12; n13 holds
    /// none of it.
    fn config() -> Config {
        let members: Vec<Member> = (10..14).map(member).collect();
        let c = Config::initial(CLUSTER, &members, 1, 3).unwrap();
        assert_eq!(c.slot_range(0), (0, 4095));
        assert_eq!(c.shards[0].primary, NodeId(10));
        assert_eq!(c.shards[0].backups, vec![NodeId(11), NodeId(12)]);
        c
    }

    fn id(n: u32) -> String {
        cluster_node_id(CLUSTER, NodeId(n))
    }

    #[test]
    fn setslot_names_a_shard_by_its_first_slot_and_a_member_by_its_cluster_id() {
        let c = config();
        assert_eq!(setslot_move(&c, 0, &id(13)), Ok((ShardId(0), NodeId(13))));
        assert_eq!(
            setslot_move(&c, 4096, &id(13).to_ascii_uppercase()),
            Ok((ShardId(1), NodeId(13))),
            "an id in upper case is the same id"
        );
        // A target holding a replica is the CM's to refuse (plan_migrate).
        assert_eq!(setslot_move(&c, 0, &id(11)), Ok((ShardId(0), NodeId(11))));
        assert_eq!(
            setslot_move(&c, 100, &id(13)),
            Err(SlotMoveError::NotShardStart {
                slot: 100,
                start: 0,
                end: 4095
            })
        );
        assert_eq!(
            setslot_move(&c, 16383, &id(13)),
            Err(SlotMoveError::NotShardStart {
                slot: 16383,
                start: 12288,
                end: 16383
            })
        );
        assert_eq!(
            setslot_move(&c, 0, &id(10)),
            Err(SlotMoveError::AlreadyPrimary {
                node: id(10),
                start: 0,
                end: 4095
            })
        );
        let other_cluster = cluster_node_id(CLUSTER + 1, NodeId(13));
        for unknown in [id(99), other_cluster, "n13".to_string(), String::new()] {
            assert_eq!(
                setslot_move(&c, 0, &unknown),
                Err(SlotMoveError::UnknownNode(unknown.clone())),
                "{unknown:?}"
            );
        }
        // A member without a Redis front end is in no CLUSTER NODES.
        let mut no_resp = c.clone();
        no_resp.members[3].resp = None;
        assert_eq!(
            setslot_move(&no_resp, 0, &id(13)),
            Err(SlotMoveError::UnknownNode(id(13)))
        );
    }

    #[test]
    fn setslot_refuses_a_shard_already_moving() {
        let mut c = config();
        c.migrations.push(Migration {
            shard: ShardId(0),
            from: NodeId(10),
            to: NodeId(13),
        });
        c.shards[0].primary = NodeId(13);
        c.validate().unwrap();
        assert_eq!(
            setslot_move(&c, 0, &id(10)),
            Err(SlotMoveError::Migrating {
                start: 0,
                end: 4095,
                to: id(13)
            })
        );
        assert_eq!(
            setslot_move(&c, 4096, &id(13)),
            Ok((ShardId(1), NodeId(13))),
            "another shard is the CM's to judge"
        );
    }

    /// A member that holds nothing is listed, with no slots, so that its id
    /// can be copied from CLUSTER NODES into CLUSTER SETSLOT.
    #[test]
    fn a_member_holding_nothing_is_a_master_of_no_slots() {
        let mut c = config();
        c.members.push(member(14));
        let t = topology(&c, NodeId(10)).expect("a topology");
        assert_eq!(t.shards().len(), 5);
        let empty = &t.shards()[4];
        assert_eq!(
            (empty.primary.id.as_str(), empty.slots.len()),
            (id(14).as_str(), 0)
        );
        assert_eq!(empty.primary.port, 7014);
        assert_eq!(t.slots_assigned(), 16384);
        // Without a front end it cannot be listed, and the rest still is.
        c.members[4].resp = None;
        let t = topology(&c, NodeId(10)).expect("a topology");
        assert_eq!(t.shards().len(), 4);
        assert!(t.node(&id(14)).is_none());
    }

    #[test]
    fn a_shard_blocked_past_the_deadline_is_tryagain() {
        let blocked = failure(ClientError::Server {
            code: ErrorCode::Blocked,
            detail: "shard blocked".into(),
        });
        assert!(
            matches!(&blocked, KeyspaceError::TryAgain(m) if m.contains("shard blocked")),
            "{blocked:?}"
        );
        let internal = failure(ClientError::Server {
            code: ErrorCode::Internal,
            detail: "x".into(),
        });
        assert!(
            matches!(&internal, KeyspaceError::Other(m) if m.contains("may have happened")),
            "{internal:?}"
        );
    }
}
