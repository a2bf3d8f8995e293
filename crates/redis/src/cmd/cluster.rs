//! Cluster commands: CLUSTER INFO/SLOTS/SHARDS/NODES/KEYSLOT/MYID, READONLY,
//! READWRITE, answered from the context's topology, and CLUSTER SETSLOT ...
//! NODE, which moves a shard through the keyspace. Without a topology, Redis's
//! "cluster support disabled".

use rowankv_resp::{errors, key_slot, Value, SLOT_COUNT};

use crate::cmd::is;
use crate::context::{ClusterNode, ClusterShard, SlotRange, Topology};
use crate::fail::{fail, Fail, Reply};
use crate::keyspace::SlotMoveError;
use crate::session::Call;

fn topology<'a>(call: &Call<'a>) -> Result<&'a Topology, Fail> {
    call.ctx
        .topology
        .as_ref()
        .ok_or_else(|| fail(errors::CLUSTER_SUPPORT_DISABLED))
}

/// `CLUSTER INFO`.
pub(crate) fn info(call: &mut Call<'_>) -> Reply {
    let topology = topology(call)?;
    let assigned = topology.slots_assigned();
    let state = if assigned == u64::from(rowankv_resp::SLOT_COUNT) {
        "ok"
    } else {
        "fail"
    };
    let nodes = distinct_nodes(topology).len();
    let size = topology
        .shards()
        .iter()
        .filter(|s| !s.slots.is_empty())
        .count();
    let epoch = topology.epoch();
    let text = format!(
        "cluster_state:{state}\r\n\
         cluster_slots_assigned:{assigned}\r\n\
         cluster_slots_ok:{assigned}\r\n\
         cluster_slots_pfail:0\r\n\
         cluster_slots_fail:0\r\n\
         cluster_known_nodes:{nodes}\r\n\
         cluster_size:{size}\r\n\
         cluster_current_epoch:{epoch}\r\n\
         cluster_my_epoch:{epoch}\r\n\
         cluster_stats_messages_sent:0\r\n\
         cluster_stats_messages_received:0\r\n\
         total_cluster_links_buffer_limit_exceeded:0\r\n"
    );
    Ok(Value::verbatim_text(text))
}

/// `CLUSTER SLOTS`: per slot range, `[start, end, primary, replicas...]`, each
/// node as `[host, port, id, {}]`.
pub(crate) fn slots(call: &mut Call<'_>) -> Reply {
    let topology = topology(call)?;
    let node = |node: &ClusterNode| {
        Value::Array(vec![
            Value::bulk(node.host.clone()),
            Value::Integer(node.port.into()),
            Value::bulk(node.id.clone()),
            Value::Map(Vec::new()),
        ])
    };
    let mut ranges = Vec::new();
    for shard in topology.shards() {
        for range in &shard.slots {
            let mut entry = vec![
                Value::Integer(range.start.into()),
                Value::Integer(range.end.into()),
                node(&shard.primary),
            ];
            entry.extend(shard.replicas.iter().map(node));
            ranges.push(Value::Array(entry));
        }
    }
    Ok(Value::Array(ranges))
}

/// `CLUSTER SHARDS`: per shard, its slot ranges and its nodes.
pub(crate) fn shards(call: &mut Call<'_>) -> Reply {
    let topology = topology(call)?;
    let pair = |name: &str, value: Value| (Value::bulk(name), value);
    let node = |node: &ClusterNode, role: &str| {
        Value::Map(vec![
            pair("id", Value::bulk(node.id.clone())),
            pair("port", Value::Integer(node.port.into())),
            pair("ip", Value::bulk(node.host.clone())),
            pair("endpoint", Value::bulk(node.host.clone())),
            pair("role", Value::bulk(role)),
            pair("replication-offset", Value::Integer(0)),
            pair("health", Value::bulk("online")),
        ])
    };
    let shard = |shard: &ClusterShard| {
        let slots = shard
            .slots
            .iter()
            .flat_map(|r| [Value::Integer(r.start.into()), Value::Integer(r.end.into())])
            .collect();
        let mut nodes = vec![node(&shard.primary, "master")];
        nodes.extend(shard.replicas.iter().map(|n| node(n, "replica")));
        Value::Map(vec![
            pair("slots", Value::Array(slots)),
            pair("nodes", Value::Array(nodes)),
        ])
    };
    Ok(Value::Array(topology.shards().iter().map(shard).collect()))
}

/// Every node once, in the order first met, with what Redis's node table says
/// about it: the slots it is primary for, or (if it is primary of none) the
/// primary it replicates.
fn distinct_nodes(topology: &Topology) -> Vec<(&ClusterNode, Vec<SlotRange>, Option<&str>)> {
    let mut nodes: Vec<(&ClusterNode, Vec<SlotRange>, Option<&str>)> = Vec::new();
    for shard in topology.shards() {
        match nodes.iter_mut().find(|(n, _, _)| n.id == shard.primary.id) {
            Some((_, slots, master)) => {
                slots.extend(&shard.slots);
                *master = None;
            }
            None => nodes.push((&shard.primary, shard.slots.clone(), None)),
        }
        for replica in &shard.replicas {
            if !nodes.iter().any(|(n, _, _)| n.id == replica.id) {
                nodes.push((replica, Vec::new(), Some(shard.primary.id.as_str())));
            }
        }
    }
    nodes
}

/// `CLUSTER NODES`: Redis's node table, one line per node.
pub(crate) fn nodes(call: &mut Call<'_>) -> Reply {
    let topology = topology(call)?;
    let mut text = String::new();
    for (node, slots, master) in distinct_nodes(topology) {
        let myself = if node.id == topology.myself() {
            "myself,"
        } else {
            ""
        };
        let role = if master.is_some() { "slave" } else { "master" };
        let bus_port = u32::from(node.port) + 10_000;
        let bus_port = if bus_port > u32::from(u16::MAX) {
            0
        } else {
            bus_port
        };
        text.push_str(&format!(
            "{} {}:{}@{} {myself}{role} {} 0 0 {} connected",
            node.id,
            node.host,
            node.port,
            bus_port,
            master.unwrap_or("-"),
            topology.epoch(),
        ));
        for range in slots {
            if range.start == range.end {
                text.push_str(&format!(" {}", range.start));
            } else {
                text.push_str(&format!(" {}-{}", range.start, range.end));
            }
        }
        text.push('\n');
    }
    Ok(Value::verbatim_text(text))
}

pub(crate) fn keyslot(call: &mut Call<'_>) -> Reply {
    topology(call)?;
    Ok(Value::Integer(key_slot(&call.argv[2]).into()))
}

pub(crate) fn myid(call: &mut Call<'_>) -> Reply {
    Ok(Value::bulk(topology(call)?.myself().to_string()))
}

/// READONLY and READWRITE: accepted on a cluster node (RowanKV serves reads of a
/// shard where it serves its writes, so neither changes anything).
pub(crate) fn readonly(call: &mut Call<'_>) -> Reply {
    topology(call)?;
    Ok(Value::ok())
}

/// A slot argument: a number from 0 to 16383 (Redis's `getSlotOrReply`).
fn slot_arg(arg: &[u8]) -> Result<u16, Fail> {
    crate::num::parse_i64(arg)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&n| n < SLOT_COUNT)
        .ok_or_else(|| fail(errors::INVALID_SLOT))
}

/// `CLUSTER SETSLOT <slot> NODE <node-id>`: moves the shard whose range of
/// slots starts at `<slot>` to the node, through the keyspace
/// ([`crate::Keyspace::move_slot`]); refused unless the server enables it.
///
/// RowanKV moves whole shards, never single slots, and needs none of Redis's
/// migration steps: the moment the configuration names the target, the target
/// serves the shard and fetches from the source what it has not copied yet.
/// So `<slot>` must be the first slot of a shard's range (naming a slot inside
/// one is refused with the range to name), and IMPORTING, MIGRATING and
/// STABLE are answered with an error that says so.
pub(crate) fn setslot(call: &mut Call<'_>) -> Reply {
    topology(call)?;
    let slot = slot_arg(&call.argv[2])?;
    let action = &call.argv[3];
    let argc = call.argv.len();
    if (is(action, "IMPORTING") || is(action, "MIGRATING")) && argc == 5
        || is(action, "STABLE") && argc == 4
    {
        return Err(fail(&format!(
            "ERR CLUSTER SETSLOT {} is not used by RowanKV: it moves whole shards itself, the \
             target serving a shard at once and fetching from the source the keys it has not \
             copied yet; move one with CLUSTER SETSLOT <first slot of the shard> NODE <node-id>",
            String::from_utf8_lossy(action).to_ascii_uppercase()
        )));
    }
    if !(is(action, "NODE") && argc == 5) {
        return Err(fail(errors::SETSLOT_SYNTAX));
    }
    if !call.ctx.setslot_enabled {
        return Err(fail(
            "ERR CLUSTER SETSLOT is disabled on this RowanKV server (setslot is off in its [resp] section)",
        ));
    }
    let Ok(node) = std::str::from_utf8(&call.argv[4]) else {
        return Err(Fail::Reply(errors::unknown_node(&call.argv[4])));
    };
    call.keyspace
        .move_slot(slot, node)
        .map_err(|e| setslot_failure(e, slot))?;
    Ok(Value::ok())
}

fn setslot_failure(error: SlotMoveError, slot: u16) -> Fail {
    let line = match error {
        SlotMoveError::NotShardStart { start, end, .. } => format!(
            "ERR RowanKV moves whole shards: slot {slot} is inside the shard of slots \
             {start}-{end}; CLUSTER SETSLOT {start} NODE <node-id> moves all of them"
        ),
        SlotMoveError::UnknownNode(id) => return Fail::Reply(errors::unknown_node(id.as_bytes())),
        SlotMoveError::AlreadyPrimary { node, start, end } => {
            format!("ERR node {node} is already the primary of slots {start}-{end}")
        }
        SlotMoveError::Migrating { start, end, to } => format!(
            "ERR slots {start}-{end} are moving to node {to} already: ask again once that move \
             has finished"
        ),
        SlotMoveError::Refused(why) => {
            format!("ERR the cluster manager refused to move slot {slot}'s shard: {why}")
        }
        SlotMoveError::NoManager(why) => {
            format!("ERR no cluster manager answered the move of slot {slot}'s shard: {why}")
        }
        SlotMoveError::Unsupported => "ERR this RowanKV node cannot move slots".to_string(),
    };
    Fail::Reply(Value::error(line))
}
