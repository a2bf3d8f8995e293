//! Cluster mode: topology answers, CROSSSLOT, and keyspace errors as replies.

use rowankv_redis::{
    ClusterNode, ClusterShard, KeyspaceError, MemKeyspace, SlotMoveError, SlotRange, Topology,
    TopologyError,
};
use rowankv_resp::{errors, key_slot, Value};

use crate::keyspaces::{Call, Hook, Hooked};
use crate::support::*;

fn node(n: u8, port: u16) -> ClusterNode {
    ClusterNode {
        id: format!("{:040x}", n),
        host: format!("10.0.0.{n}"),
        port,
    }
}

/// Two shards: node 1 (primary, slots 0-8191) with replica 2; node 3 (primary,
/// slots 8192-16383) with replica 1. This node is node 1.
fn topology() -> Topology {
    Topology::new(
        5,
        format!("{:040x}", 1),
        vec![
            ClusterShard {
                slots: vec![SlotRange {
                    start: 0,
                    end: 8191,
                }],
                primary: node(1, 7001),
                replicas: vec![node(2, 7002)],
            },
            ClusterShard {
                slots: vec![
                    SlotRange {
                        start: 8192,
                        end: 16382,
                    },
                    SlotRange {
                        start: 16383,
                        end: 16383,
                    },
                ],
                primary: node(3, 7003),
                replicas: vec![node(1, 7001)],
            },
        ],
    )
    .expect("a valid topology")
}

fn cluster_harness() -> Harness {
    let mut h = Harness::new();
    h.ctx.topology = Some(topology());
    h
}

#[test]
fn topology_is_validated() {
    let shard = |slots: Vec<SlotRange>, id: String| ClusterShard {
        slots,
        primary: ClusterNode {
            id,
            host: "h".into(),
            port: 1,
        },
        replicas: vec![],
    };
    let good = || format!("{:040x}", 9);
    assert_eq!(
        Topology::new(1, "x", vec![shard(vec![], "not-hex".into())]),
        Err(TopologyError::NodeId("not-hex".into()))
    );
    assert_eq!(
        Topology::new(
            1,
            good(),
            vec![shard(vec![SlotRange { start: 5, end: 4 }], good())]
        ),
        Err(TopologyError::SlotRange { start: 5, end: 4 })
    );
    assert_eq!(
        Topology::new(
            1,
            good(),
            vec![shard(
                vec![SlotRange {
                    start: 0,
                    end: 16384
                }],
                good()
            )]
        ),
        Err(TopologyError::SlotRange {
            start: 0,
            end: 16384
        })
    );
    assert_eq!(
        Topology::new(
            1,
            good(),
            vec![shard(
                vec![
                    SlotRange { start: 0, end: 9 },
                    SlotRange { start: 9, end: 12 }
                ],
                good()
            )]
        ),
        Err(TopologyError::SlotOwnedTwice(9))
    );
    let other = format!("{:040x}", 8);
    assert_eq!(
        Topology::new(1, other.clone(), vec![shard(vec![], good())]),
        Err(TopologyError::MyselfUnknown(other))
    );
}

#[test]
fn cluster_commands_need_cluster_mode() {
    let mut h = Harness::new();
    for sub in ["INFO", "SLOTS", "SHARDS", "NODES", "MYID"] {
        assert_eq!(
            h.run(&["CLUSTER", sub]),
            err(errors::CLUSTER_SUPPORT_DISABLED),
            "{sub}"
        );
    }
    assert_eq!(
        h.run(&["CLUSTER", "KEYSLOT", "foo"]),
        err(errors::CLUSTER_SUPPORT_DISABLED)
    );
    assert_eq!(h.run(&["READONLY"]), err(errors::CLUSTER_SUPPORT_DISABLED));
    assert_eq!(
        h.run(&["CLUSTER", "FAILOVER"]),
        err("ERR unknown subcommand 'FAILOVER'. Try CLUSTER HELP.")
    );
    // Keys in different slots are fine outside cluster mode.
    assert_eq!(h.run(&["MSET", "a", "1", "b", "2"]), ok());
}

#[test]
fn cluster_info_myid_keyslot() {
    let mut h = cluster_harness();
    let info = text(&h.run(&["CLUSTER", "INFO"]));
    for line in [
        "cluster_state:ok\r\n",
        "cluster_slots_assigned:16384\r\n",
        "cluster_known_nodes:3\r\n",
        "cluster_size:2\r\n",
        "cluster_current_epoch:5\r\n",
    ] {
        assert!(info.contains(line), "{line:?} not in {info}");
    }
    assert_eq!(h.run(&["CLUSTER", "MYID"]), bulk(&format!("{:040x}", 1)));
    assert_eq!(h.run(&["CLUSTER", "KEYSLOT", "foo"]), int(12182));
    assert_eq!(
        h.run(&["CLUSTER", "KEYSLOT", "{user1000}.following"]),
        int(key_slot(b"user1000").into())
    );
    assert_eq!(h.run(&["READONLY"]), ok());
    assert_eq!(h.run(&["READWRITE"]), ok());
    let hello = h.run(&["HELLO"]);
    let Value::Map(fields) = hello else { panic!() };
    assert!(fields.contains(&(bulk("mode"), bulk("cluster"))));
    assert_eq!(
        h.run(&["CONFIG", "GET", "cluster-enabled"]),
        Value::Map(vec![(bulk("cluster-enabled"), bulk("yes"))])
    );
}

#[test]
fn cluster_slots() {
    let mut h = cluster_harness();
    let entry = |n: u8, port: u16| {
        array(vec![
            bulk(&format!("10.0.0.{n}")),
            int(port.into()),
            bulk(&format!("{:040x}", n)),
            Value::Map(vec![]),
        ])
    };
    assert_eq!(
        h.run(&["CLUSTER", "SLOTS"]),
        array(vec![
            array(vec![int(0), int(8191), entry(1, 7001), entry(2, 7002)]),
            array(vec![int(8192), int(16382), entry(3, 7003), entry(1, 7001)]),
            array(vec![int(16383), int(16383), entry(3, 7003), entry(1, 7001)]),
        ])
    );
}

#[test]
fn cluster_shards() {
    let mut h = cluster_harness();
    let Value::Array(shards) = h.run(&["CLUSTER", "SHARDS"]) else {
        panic!()
    };
    assert_eq!(shards.len(), 2);
    let Value::Map(second) = &shards[1] else {
        panic!()
    };
    assert_eq!(
        second[0],
        (
            bulk("slots"),
            array(vec![int(8192), int(16382), int(16383), int(16383)])
        )
    );
    let (_, Value::Array(nodes)) = &second[1] else {
        panic!()
    };
    let Value::Map(primary) = &nodes[0] else {
        panic!()
    };
    assert!(primary.contains(&(bulk("role"), bulk("master"))));
    assert!(primary.contains(&(bulk("port"), int(7003))));
    let Value::Map(replica) = &nodes[1] else {
        panic!()
    };
    assert!(replica.contains(&(bulk("role"), bulk("replica"))));
}

#[test]
fn cluster_nodes() {
    let mut h = cluster_harness();
    let nodes = text(&h.run(&["CLUSTER", "NODES"]));
    let id = |n: u8| format!("{:040x}", n);
    let expected = format!(
        "{} 10.0.0.1:7001@17001 myself,master - 0 0 5 connected 0-8191\n\
         {} 10.0.0.2:7002@17002 slave {} 0 0 5 connected\n\
         {} 10.0.0.3:7003@17003 master - 0 0 5 connected 8192-16382 16383\n",
        id(1),
        id(2),
        id(1),
        id(3)
    );
    assert_eq!(nodes, expected);
}

#[test]
fn crossslot() {
    let mut h = cluster_harness();
    assert_eq!(h.run(&["MSET", "a", "1", "b", "2"]), err(errors::CROSSSLOT));
    assert_eq!(h.run(&["MGET", "a", "b"]), err(errors::CROSSSLOT));
    assert_eq!(h.run(&["DEL", "a", "b"]), err(errors::CROSSSLOT));
    assert_eq!(h.run(&["EXISTS", "a", "b"]), err(errors::CROSSSLOT));
    assert_eq!(h.run(&["MSET", "{u}a", "1", "{u}b", "2"]), ok());
    assert_eq!(h.run(&["MGET", "{u}a", "{u}b"]), bulks(&["1", "2"]));
    assert_eq!(h.run(&["DEL", "{u}a", "{u}b", "{u}a"]), int(2));
    assert_eq!(h.run(&["SET", "a", "1"]), ok());
    // Authentication comes first.
    h.ctx.requirepass = Some(b"pw".to_vec());
    assert_eq!(h.run(&["MGET", "a", "b"]), err(errors::NOAUTH));
}

#[test]
fn select_in_cluster_mode() {
    let mut h = cluster_harness();
    assert_eq!(h.run(&["SELECT", "0"]), ok());
    assert_eq!(h.run(&["SELECT", "1"]), err(errors::SELECT_IN_CLUSTER_MODE));
}

/// A keyspace that serves only the slots of the first shard and answers
/// `MOVED` for the others, as a node's keyspace over the cluster client may.
struct ShardKeyspace;

impl Hook for ShardKeyspace {
    fn before(&mut self, call: Call<'_>, _: &mut MemKeyspace) -> Result<(), KeyspaceError> {
        let Some(key) = call.key() else {
            return Ok(());
        };
        let slot = key_slot(key);
        if slot <= 8191 {
            Ok(())
        } else {
            Err(KeyspaceError::Moved {
                slot,
                host: "10.0.0.3".into(),
                port: 7003,
            })
        }
    }
}

#[test]
fn moved_from_the_keyspace() {
    let mut h = Harness::with(Hooked::new(ShardKeyspace));
    h.ctx.topology = Some(topology());
    assert_eq!(key_slot(b"foo"), 12182);
    assert_eq!(
        h.run(&["SET", "foo", "v"]),
        err("MOVED 12182 10.0.0.3:7003")
    );
    assert_eq!(h.run(&["GET", "foo"]), err("MOVED 12182 10.0.0.3:7003"));
    assert_eq!(h.run(&["INCR", "foo"]), err("MOVED 12182 10.0.0.3:7003"));
    assert_eq!(
        h.run(&["SET", "bar", "v"]),
        ok(),
        "slot 5061 is served here"
    );
    assert_eq!(h.run(&["GET", "bar"]), bulk("v"));
}

/// A keyspace that fails every call with one error.
struct FailingKeyspace(KeyspaceError);

impl Hook for FailingKeyspace {
    fn before(&mut self, _: Call<'_>, _: &mut MemKeyspace) -> Result<(), KeyspaceError> {
        Err(self.0.clone())
    }
}

#[test]
fn keyspace_errors_become_redis_errors() {
    let cases = [
        (
            KeyspaceError::TryAgain(String::new()),
            false,
            errors::TRYAGAIN.to_string(),
        ),
        (
            KeyspaceError::TryAgain("slot 7 is moving".into()),
            false,
            "TRYAGAIN slot 7 is moving".into(),
        ),
        (
            KeyspaceError::Down(String::new()),
            true,
            errors::CLUSTERDOWN.to_string(),
        ),
        (
            KeyspaceError::Down("Hash slot not served".into()),
            true,
            errors::CLUSTERDOWN_SLOT_NOT_SERVED.into(),
        ),
        (
            KeyspaceError::Down("no quorum".into()),
            false,
            "ERR no quorum".into(),
        ),
        (
            KeyspaceError::Other("disk on fire".into()),
            true,
            "ERR disk on fire".into(),
        ),
    ];
    for (error, cluster, expected) in cases {
        let mut h = Harness::with(Hooked::new(FailingKeyspace(error.clone())));
        if cluster {
            h.ctx.topology = Some(topology());
        }
        for words in [
            &["GET", "k"][..],
            &["SET", "k", "v"],
            &["INCR", "k"],
            &["DBSIZE"],
            &["SCAN", "0"],
        ] {
            assert_eq!(h.run(words), err(&expected), "{error:?} {words:?}");
        }
    }
}

/// A keyspace that records CLUSTER SETSLOT's moves and answers each with
/// `answer`.
struct Mover {
    asked: Vec<(u16, String)>,
    answer: Result<(), SlotMoveError>,
}

impl Hook for Mover {
    fn before(&mut self, _: Call<'_>, _: &mut MemKeyspace) -> Result<(), KeyspaceError> {
        Ok(())
    }
    fn move_slot(&mut self, slot: u16, node_id: &str) -> Result<(), SlotMoveError> {
        self.asked.push((slot, node_id.to_string()));
        self.answer.clone()
    }
}

fn setslot_harness(answer: Result<(), SlotMoveError>) -> Harness<Hooked<Mover>> {
    let mut h = Harness::with(Hooked::new(Mover {
        asked: Vec::new(),
        answer,
    }));
    h.ctx.topology = Some(topology());
    h.ctx.setslot_enabled = true;
    h
}

#[test]
fn setslot_node_moves_the_shard_through_the_keyspace() {
    let mut h = setslot_harness(Ok(()));
    let id = format!("{:040x}", 3);
    assert_eq!(h.run(&["CLUSTER", "SETSLOT", "0", "NODE", &id]), ok());
    assert_eq!(h.run(&["cluster", "setslot", "8192", "node", &id]), ok());
    assert_eq!(h.keyspace.hook.asked, vec![(0, id.clone()), (8192, id)]);
    // Outside cluster mode too (a forwarding node describes the topology).
    h.ctx.redirects = false;
    assert_eq!(h.run(&["CLUSTER", "SETSLOT", "0", "NODE", "x"]), ok());
    assert_eq!(h.keyspace.hook.asked.len(), 3);
}

#[test]
fn setslot_is_refused_unless_the_server_enables_it() {
    let mut h = setslot_harness(Ok(()));
    h.ctx.setslot_enabled = false;
    let id = format!("{:040x}", 3);
    assert_eq!(
        h.run(&["CLUSTER", "SETSLOT", "0", "NODE", &id]),
        err("ERR CLUSTER SETSLOT is disabled on this RowanKV server (setslot is off in its [resp] section)")
    );
    assert!(h.keyspace.hook.asked.is_empty(), "nothing moved");
    // Without a topology there is no cluster to move anything in.
    let mut h = setslot_harness(Ok(()));
    h.ctx.topology = None;
    assert_eq!(
        h.run(&["CLUSTER", "SETSLOT", "0", "NODE", &id]),
        err(errors::CLUSTER_SUPPORT_DISABLED)
    );
    assert!(h.keyspace.hook.asked.is_empty());
    // A keyspace that cannot move shards says so.
    let mut h = Harness::new();
    h.ctx.topology = Some(topology());
    h.ctx.setslot_enabled = true;
    assert_eq!(
        h.run(&["CLUSTER", "SETSLOT", "0", "NODE", &id]),
        err("ERR this RowanKV node cannot move slots")
    );
}

#[test]
fn setslot_arguments_are_checked_before_anything_moves() {
    let mut h = setslot_harness(Ok(()));
    let id = format!("{:040x}", 3);
    for slot in ["abc", "-1", "16384", "99999999999999999999", "1.5", ""] {
        assert_eq!(
            h.run(&["CLUSTER", "SETSLOT", slot, "NODE", &id]),
            err(errors::INVALID_SLOT),
            "{slot:?}"
        );
    }
    assert_eq!(
        h.run(&["CLUSTER", "SETSLOT", "0"]),
        err("ERR wrong number of arguments for 'cluster|setslot' command")
    );
    for words in [
        &["CLUSTER", "SETSLOT", "0", "NODE"][..],
        &["CLUSTER", "SETSLOT", "0", "NODE", &id, "extra"],
        &["CLUSTER", "SETSLOT", "0", "OWNER", &id],
        &["CLUSTER", "SETSLOT", "0", "STABLE", &id],
        &["CLUSTER", "SETSLOT", "0", "IMPORTING"],
    ] {
        assert_eq!(h.run(words), err(errors::SETSLOT_SYNTAX), "{words:?}");
    }
    // Redis's migration steps: RowanKV moves shards itself.
    for words in [
        &["CLUSTER", "SETSLOT", "0", "IMPORTING", &id][..],
        &["CLUSTER", "SETSLOT", "0", "migrating", &id],
        &["CLUSTER", "SETSLOT", "0", "STABLE"],
    ] {
        let Value::Error(line) = h.run(words) else {
            panic!("{words:?} is not refused")
        };
        let line = String::from_utf8_lossy(&line);
        assert!(
            line.starts_with(&format!(
                "ERR CLUSTER SETSLOT {} is not used by RowanKV",
                words[3].to_ascii_uppercase()
            )) && line.contains("NODE <node-id>"),
            "{words:?}: {line}"
        );
    }
    assert!(h.keyspace.hook.asked.is_empty(), "nothing moved");
}

#[test]
fn setslot_refusals_become_redis_errors() {
    let id = format!("{:040x}", 3);
    let cases = [
        (
            SlotMoveError::NotShardStart {
                slot: 100,
                start: 0,
                end: 8191,
            },
            "ERR RowanKV moves whole shards: slot 100 is inside the shard of slots 0-8191; CLUSTER SETSLOT 0 NODE <node-id> moves all of them".to_string(),
        ),
        (
            SlotMoveError::UnknownNode("feed".into()),
            "ERR I don't know about node feed".into(),
        ),
        (
            SlotMoveError::AlreadyPrimary {
                node: id.clone(),
                start: 0,
                end: 8191,
            },
            format!("ERR node {id} is already the primary of slots 0-8191"),
        ),
        (
            SlotMoveError::Migrating {
                start: 0,
                end: 8191,
                to: id.clone(),
            },
            format!("ERR slots 0-8191 are moving to node {id} already: ask again once that move has finished"),
        ),
        (
            SlotMoveError::Refused("n3 holds a replica of shard0".into()),
            "ERR the cluster manager refused to move slot 100's shard: n3 holds a replica of shard0".into(),
        ),
        (
            SlotMoveError::NoManager("connecting to n9: refused".into()),
            "ERR no cluster manager answered the move of slot 100's shard: connecting to n9: refused".into(),
        ),
    ];
    for (error, line) in cases {
        let mut h = setslot_harness(Err(error.clone()));
        assert_eq!(
            h.run(&["CLUSTER", "SETSLOT", "100", "NODE", &id]),
            err(&line),
            "{error:?}"
        );
        assert_eq!(h.keyspace.hook.asked, vec![(100, id.clone())]);
    }
    // An id that is not even text is no node either.
    let mut h = setslot_harness(Ok(()));
    let argv = vec![
        b"CLUSTER".to_vec(),
        b"SETSLOT".to_vec(),
        b"0".to_vec(),
        b"NODE".to_vec(),
        b"\xff\xfe".to_vec(),
    ];
    let reply = h.execute(argv).replies.remove(0);
    assert_eq!(
        reply,
        Value::Error(b"ERR I don't know about node \xff\xfe".to_vec())
    );
    assert!(h.keyspace.hook.asked.is_empty());
}
