//! The configuration: the initial shard map, routing, validation and JSON.

use std::sync::Arc;

use rowankv_types::{NodeId, ShardId, Term};
use rowankv_wire::config::{
    routing_hash, slot_of_hash, slot_start_hash, Config, ConfigError, ConfigSource, Member,
    Migration, ShardAssignment, ROUTING_SEED,
};

fn members(n: u32) -> Vec<Member> {
    (1..=n)
        .map(|i| Member {
            added: 0,
            node: NodeId(i),
            workers: 4,
            address: None,
            resp: None,
        })
        .collect()
}

/// 3 servers × 48 shards, replication factor 3: the standard test cluster.
fn standard() -> Config {
    Config::initial(0xC1A5, &members(3), 48, 3).expect("initial configuration")
}

#[test]
fn initial_three_by_forty_eight_validates_and_places_replicas() {
    let config = standard();
    config.validate().unwrap();
    assert_eq!(config.term, Term(1));
    assert_eq!(config.cluster_id, 0xC1A5);
    assert_eq!(config.replication_factor, 3);
    assert_eq!(config.members, members(3));
    assert_eq!(config.shard_count(), 144);
    for node in 1..=3 {
        let node = NodeId(node);
        assert_eq!(config.primary_shards(node).count(), 48, "{node}");
        assert_eq!(config.backup_shards(node).count(), 96, "{node}");
    }
    for (i, s) in config.shards.iter().enumerate() {
        assert_eq!(s.shard, ShardId(i as u16));
        assert_eq!(s.primary, NodeId(i as u32 % 3 + 1));
        // Backups follow the primary in ring order.
        let expected: Vec<NodeId> = (1..3).map(|k| NodeId((i as u32 + k) % 3 + 1)).collect();
        assert_eq!(s.backups, expected);
        assert!(s.is_replica(s.primary));
    }
}

#[test]
fn initial_covers_the_whole_hash_space() {
    let config = standard();
    assert_eq!(config.shard_for_hash(0).shard, ShardId(0));
    assert_eq!(config.shard_for_hash(u64::MAX).shard, ShardId(143));
    for pair in config.shards.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert_eq!(config.shard_for_hash(b.start_hash).shard, b.shard);
        assert_eq!(config.shard_for_hash(b.start_hash - 1).shard, a.shard);
        assert_eq!(config.shard_for_hash(a.start_hash).shard, a.shard);
    }
    // Whole slots, as even as they divide: shard i starts at slot
    // floor(i × 16384 / 144), so each owns 113 or 114 slots.
    for (i, s) in config.shards.iter().enumerate() {
        assert_eq!(s.start_hash, slot_start_hash((i * 16384 / 144) as u16));
        let (first, last) = config.slot_range(i);
        assert_eq!(slot_of_hash(s.start_hash), first);
        assert!(
            (113..=114).contains(&(last - first + 1)),
            "{i}: {first}..={last}"
        );
    }
    assert_eq!(config.slot_range(143).1, 16383);
}

/// A key's shard owns the key's Redis Cluster slot, so a cluster-aware Redis
/// client routes as RowanKV does; keys with one hash tag share a shard.
#[test]
fn a_key_is_routed_to_the_shard_that_owns_its_hash_slot() {
    let config = standard();
    for i in 0..20_000 {
        let key = format!("key:{i}");
        let slot = rowankv_resp::key_slot(key.as_bytes());
        let shard = config.shard_for_key(key.as_bytes()).shard;
        let (first, last) = config.slot_range(shard.0 as usize);
        assert!(
            (first..=last).contains(&slot),
            "{key}: slot {slot}, {shard} owns {first}..={last}"
        );
        assert_eq!(slot_of_hash(routing_hash(key.as_bytes())), slot);
        let tagged = format!("{{user{}}}.{i}", i % 7);
        let same = format!("{{user{}}}", i % 7);
        assert_eq!(
            config.shard_for_key(tagged.as_bytes()).shard,
            config.shard_for_key(same.as_bytes()).shard,
            "{tagged}"
        );
    }
    // Redis Cluster's own example slots.
    // The CRC16 check value 0x31C3 (12739) is below 16384: the slot itself.
    assert_eq!(rowankv_resp::key_slot(b"123456789"), 12739);
    let too_many = Config::initial(1, &members(3), 5462, 1).unwrap_err();
    assert!(
        too_many.to_string().contains("more than the 16384 slots"),
        "{too_many}"
    );
}

#[test]
fn routing_spreads_keys_evenly_over_servers() {
    let config = standard();
    let keys = 100_000;
    let mut per_server = [0usize; 3];
    for i in 0..keys {
        let key = format!("user{i:012}");
        let shard = config.shard_for_key(key.as_bytes());
        assert_eq!(
            shard.shard,
            config.shard_for_hash(routing_hash(key.as_bytes())).shard
        );
        per_server[(shard.primary.0 - 1) as usize] += 1;
    }
    let third = keys as f64 / 3.0;
    for (server, &count) in per_server.iter().enumerate() {
        let ratio = count as f64 / third;
        assert!(
            (0.9..=1.1).contains(&ratio),
            "server {server} got {count} of {keys} keys ({per_server:?})"
        );
    }
}

#[test]
fn routing_hash_is_the_slot_over_a_hash_seeded_apart_from_the_index_hash() {
    let key = b"user000000000042";
    let slot = u64::from(rowankv_resp::key_slot(key));
    assert_eq!(
        routing_hash(key),
        (slot << 50) | (xxhash_rust::xxh3::xxh3_64_with_seed(key, ROUTING_SEED) >> 14)
    );
    // The keys of one slot (one hash tag) — all of one shard — still spread
    // over the engine's index tags (the unseeded xxh3's top 16 bits).
    let tags: std::collections::BTreeSet<u64> = (0..1000u32)
        .map(|i| {
            let key = format!("{{tag}}.{i}");
            assert_eq!(
                routing_hash(key.as_bytes()) >> 50,
                u64::from(rowankv_resp::key_slot(b"tag"))
            );
            xxhash_rust::xxh3::xxh3_64(key.as_bytes()) >> 48
        })
        .collect();
    assert!(
        tags.len() > 980,
        "{} distinct index tags of 1000",
        tags.len()
    );
}

#[test]
fn lookups_by_id() {
    let config = standard();
    assert_eq!(config.shard(ShardId(5)).unwrap().shard, ShardId(5));
    assert_eq!(config.shard(ShardId(143)).unwrap().shard, ShardId(143));
    assert!(config.shard(ShardId(144)).is_none());
    assert_eq!(config.member(NodeId(2)).unwrap().workers, 4);
    assert!(config.member(NodeId(9)).is_none());
}

#[test]
fn initial_with_replication_factor_one_has_no_backups() {
    let config = Config::initial(1, &members(2), 4, 1).unwrap();
    assert_eq!(config.shard_count(), 8);
    assert!(config.shards.iter().all(|s| s.backups.is_empty()));
    assert_eq!(config.backup_shards(NodeId(1)).count(), 0);
    assert_eq!(config.primary_shards(NodeId(1)).count(), 4);
}

#[test]
fn initial_rejects_impossible_requests() {
    let cases = [
        Config::initial(1, &[], 4, 1),
        Config::initial(1, &members(3), 0, 3),
        Config::initial(1, &members(3), 4, 0),
        Config::initial(1, &members(3), 4, 4),
        Config::initial(1, &members(2), 40_000, 2),
        Config::initial(
            1,
            &[
                Member {
                    added: 0,
                    node: NodeId(1),
                    workers: 1,
                    address: None,
                    resp: None,
                },
                Member {
                    added: 0,
                    node: NodeId(1),
                    workers: 1,
                    address: None,
                    resp: None,
                },
            ],
            4,
            1,
        ),
    ];
    for (i, result) in cases.into_iter().enumerate() {
        assert!(
            matches!(result, Err(ConfigError::Invalid(_))),
            "case {i}: {result:?}"
        );
    }
}

/// Applies `break_it` to a valid configuration and expects validation to fail with a
/// message containing `needle`.
fn rejects(what: &str, needle: &str, break_it: impl FnOnce(&mut Config)) {
    let mut config = standard();
    break_it(&mut config);
    match config.validate() {
        Err(ConfigError::Invalid(message)) => assert!(
            message.contains(needle),
            "{what}: message {message:?} does not mention {needle:?}"
        ),
        other => panic!("{what}: expected Invalid, got {other:?}"),
    }
    // from_json validates too.
    assert!(
        matches!(
            Config::from_json(&config.to_json()),
            Err(ConfigError::Invalid(_))
        ),
        "{what}: from_json accepted it"
    );
}

#[test]
fn validate_rejects_each_broken_invariant() {
    rejects("no members", "no members", |c| c.members.clear());
    rejects("duplicate member", "twice", |c| {
        let first = c.members[0].clone();
        c.members.push(first);
    });
    rejects("rf 0", "replication factor", |c| c.replication_factor = 0);
    rejects("no shards", "no shards", |c| c.shards.clear());
    rejects("ids out of order", "ids must be", |c| c.shards.swap(3, 4));
    rejects("id gap", "ids must be", |c| {
        c.shards[7].shard = ShardId(200)
    });
    rejects("first start non-zero", "must start at 0", |c| {
        c.shards[0].start_hash = 1
    });
    rejects("equal starts", "not after", |c| {
        c.shards[10].start_hash = c.shards[9].start_hash
    });
    rejects("decreasing starts", "not after", |c| {
        c.shards[10].start_hash = c.shards[9].start_hash - 1
    });
    rejects("a start inside a slot", "inside slot", |c| {
        c.shards[10].start_hash += 1
    });
    rejects("primary not a member", "not a member", |c| {
        c.shards[2].primary = NodeId(77)
    });
    rejects("backup not a member", "not a member", |c| {
        c.shards[2].backups[1] = NodeId(77)
    });
    rejects("primary among backups", "also one of its backups", |c| {
        let primary = c.shards[2].primary;
        c.shards[2].backups[0] = primary;
    });
    rejects("duplicate backups", "twice", |c| {
        let b = c.shards[2].backups[0];
        c.shards[2].backups[1] = b;
    });
    rejects("a joining backup that is also a backup", "twice", |c| {
        c.shards[2].backups.pop();
        let b = c.shards[2].backups[0];
        c.shards[2].joining.push(b);
    });
    rejects("too many with the joining ones", "backups", |c| {
        c.members.push(Member {
            added: 0,
            node: NodeId(4),
            workers: 1,
            address: None,
            resp: None,
        });
        c.shards[2].joining.push(NodeId(4));
    });
    rejects("too many backups", "backups", |c| {
        c.members.push(Member {
            added: 0,
            node: NodeId(4),
            workers: 1,
            address: None,
            resp: None,
        });
        c.shards[2].backups.push(NodeId(4));
    });
}

#[test]
fn validate_rejects_more_shards_than_a_shard_id_can_name() {
    let shard_count = u16::MAX as usize + 1;
    let config = Config {
        cluster_id: 1,
        term: Term(1),
        replication_factor: 1,
        members: members(1),
        shards: (0..shard_count)
            .map(|i| ShardAssignment {
                shard: ShardId(i as u16),
                start_hash: (i as u64) << 47,
                primary: NodeId(1),
                backups: Vec::new(),
                joining: Vec::new(),
            })
            .collect(),
        migrations: Vec::new(),
    };
    match config.validate() {
        Err(ConfigError::Invalid(message)) => assert!(message.contains("65536"), "{message}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn json_round_trips() {
    let config = standard();
    let json = config.to_json();
    assert_eq!(Config::from_json(&json), Ok(config.clone()));
    // Domain numbers travel as plain JSON numbers.
    let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(value["term"], 1);
    assert_eq!(value["shards"][1]["primary"], 2);
    assert_eq!(value["shards"][1]["shard"], 1);

    let mut later = config;
    later.term = Term(9);
    later.shards[4].primary = NodeId(3);
    later.shards[4].backups = vec![NodeId(1), NodeId(2)];
    assert_eq!(Config::from_json(&later.to_json()), Ok(later));
}

#[test]
fn from_json_rejects_what_is_not_a_configuration() {
    for bytes in [
        &b""[..],
        b"not json",
        b"{}",
        b"[1, 2, 3]",
        b"{\"cluster_id\": 1, \"term\": -1, \"replication_factor\": 1, \"members\": [], \"shards\": []}",
        &[0xFF, 0xFE],
    ] {
        assert!(
            matches!(Config::from_json(bytes), Err(ConfigError::Decode(_))),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    // Well-formed JSON of an invalid configuration.
    let json =
        br#"{"cluster_id": 1, "term": 1, "replication_factor": 1, "members": [], "shards": []}"#;
    assert!(matches!(
        Config::from_json(json),
        Err(ConfigError::Invalid(_))
    ));
}

#[test]
fn config_errors_read_clearly() {
    assert_eq!(
        ConfigError::Invalid("no members".into()).to_string(),
        "invalid configuration: no members"
    );
    assert!(ConfigError::Decode("eof".into())
        .to_string()
        .starts_with("cannot decode configuration"));
}

#[test]
fn a_config_source_is_object_safe() {
    struct Fixed(Arc<Config>);
    impl ConfigSource for Fixed {
        fn fetch(&self) -> Result<Arc<Config>, ConfigError> {
            Ok(Arc::clone(&self.0))
        }
    }
    let source: Box<dyn ConfigSource> = Box::new(Fixed(Arc::new(standard())));
    assert_eq!(source.fetch().unwrap().term, Term(1));
}

#[test]
fn a_degraded_shard_and_a_joining_backup_are_valid() {
    let mut c = Config::initial(7, &members(3), 2, 3).unwrap();
    // A failure left one backup; a new one joins.
    let gone = c.shards[1].backups.pop().unwrap();
    c.validate().expect("a degraded shard is valid");
    let mut fewer = c.clone();
    fewer.replication_factor = 4;
    fewer
        .validate()
        .expect("fewer members than the replication factor: degraded");
    c.shards[1].joining.push(gone);
    c.validate().expect("a joining backup is valid");
    assert!(c.shards[1].is_replica(gone));
    assert_eq!(c.shards[1].write_target_count(), 2);
    assert!(c.backup_shards(gone).any(|s| s.shard == c.shards[1].shard));
    let back = Config::from_json(&c.to_json()).unwrap();
    assert_eq!(back, c, "joining backups survive JSON");
}

#[test]
fn members_carry_their_addresses_and_no_two_share_one() {
    let mut m = members(3);
    for (i, member) in m.iter_mut().enumerate() {
        member.address = Some(format!("10.0.0.{}:7300", i + 1));
    }
    let config = Config::initial(0xC1A5, &m, 4, 3).unwrap();
    let back = Config::from_json(&config.to_json()).unwrap();
    assert_eq!(back, config);
    assert_eq!(
        back.member(NodeId(2)).unwrap().address.as_deref(),
        Some("10.0.0.2:7300")
    );

    let mut shared = config.clone();
    shared.members[2].address = shared.members[0].address.clone();
    let e = shared.validate().unwrap_err().to_string();
    assert!(e.contains("another member's"), "{e}");

    for bad in ["10.0.0.9", ":7300", "10.0.0.9:port", "10.0.0.9:70000"] {
        let mut c = config.clone();
        c.members[1].address = Some(bad.into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("not host:port"), "{bad}: {e}");
    }
}

#[test]
fn a_configuration_stored_without_addresses_still_reads_and_writes_none() {
    // What a CM stored before members had addresses (and an in-process cluster
    // stores now): no `address` key at all.
    let config = standard();
    let json = String::from_utf8(config.to_json()).unwrap();
    assert!(
        !json.contains("address"),
        "an absent address is not written"
    );
    let back = Config::from_json(json.as_bytes()).unwrap();
    assert!(back.members.iter().all(|m| m.address.is_none()));
}

/// A migration list (dynamic resharding, seed 000 §4.6): five servers, so that
/// a shard has a member holding none of its replicas to move to.
fn migrating() -> (Config, Migration) {
    let mut c = Config::initial(7, &members(5), 2, 3).unwrap();
    let s = c.shards[0].clone();
    let to = c
        .members
        .iter()
        .map(|m| m.node)
        .find(|n| !s.is_replica(*n))
        .unwrap();
    let m = Migration {
        shard: s.shard,
        from: s.primary,
        to,
    };
    c.shards[0].primary = to;
    c.migrations.push(m);
    (c, m)
}

#[test]
fn a_migration_list_validates_round_trips_and_is_optional() {
    let (c, m) = migrating();
    c.validate().unwrap();
    assert_eq!(c.migration(m.shard), Some(&m));
    let back = Config::from_json(&c.to_json()).unwrap();
    assert_eq!(back, c);
    // A configuration written before the field has none, and writes none.
    let plain = standard();
    let json = String::from_utf8(plain.to_json()).unwrap();
    assert!(!json.contains("migrations"), "{json}");
    assert!(Config::from_json(json.as_bytes())
        .unwrap()
        .migrations
        .is_empty());
}

#[test]
fn a_broken_migration_list_is_refused() {
    let broken = |what: &str, needle: &str, f: &dyn Fn(&mut Config)| {
        let (mut c, _) = migrating();
        f(&mut c);
        match c.validate() {
            Err(ConfigError::Invalid(message)) => {
                assert!(message.contains(needle), "{what}: {message:?}")
            }
            other => panic!("{what}: expected Invalid, got {other:?}"),
        }
        assert!(
            Config::from_json(&c.to_json()).is_err(),
            "{what}: from_json accepted it"
        );
    };
    broken("target not the primary", "but its primary is", &|c| {
        c.shards[0].primary = c.migrations[0].from
    });
    broken("to itself", "to itself", &|c| {
        c.migrations[0].from = c.migrations[0].to
    });
    broken("twice", "twice", &|c| {
        let m = c.migrations[0];
        c.migrations.push(m)
    });
    broken("no such shard", "does not exist", &|c| {
        c.migrations[0].shard = ShardId(99)
    });
    broken("source not a member", "not a member", &|c| {
        c.migrations[0].from = NodeId(77)
    });
    broken("source a replica", "also one of its replicas", &|c| {
        let from = c.migrations[0].from;
        let b = c.shards[0].backups[0];
        c.migrations[0].from = b;
        let _ = from;
    });
}
