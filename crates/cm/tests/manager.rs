//! The configuration manager over the embedded store: bootstrap, commit of the next
//! term, reload, two managers racing, and the active-CM lease.

use std::sync::Arc;

use rowankv_cm::{
    CmError, ConfigManager, CoordStore, EmbeddedStore, StoreError, CM_LEASE_KEY, COMMITTED_KEY,
    CONFIG_KEY,
};
use rowankv_types::{ManualClock, NodeId, Term};
use rowankv_wire::config::{Config, ConfigSource, Member};

const CLUSTER_ID: u64 = 0x0102_0304;
const TTL_NS: u64 = 10_000_000;

fn initial(cluster_id: u64) -> Config {
    let members: Vec<Member> = (0..3)
        .map(|i| Member {
            added: 0,
            node: NodeId(i),
            workers: 2,
            address: None,
            resp: None,
        })
        .collect();
    Config::initial(cluster_id, &members, 4, 3).unwrap()
}

/// The next term: shard 0's primary swaps places with its first backup.
fn next_term(config: &Config) -> Config {
    let mut next = config.clone();
    next.term = Term(config.term.0 + 1);
    let shard = &mut next.shards[0];
    std::mem::swap(&mut shard.primary, &mut shard.backups[0]);
    next.validate().unwrap();
    next
}

fn memory_store(clock: Arc<ManualClock>) -> Arc<dyn CoordStore> {
    Arc::new(EmbeddedStore::in_memory(clock))
}

#[test]
fn bootstrap_stores_the_initial_configuration() {
    let store = memory_store(ManualClock::new());
    let cm = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    assert_eq!(*cm.current(), initial(CLUSTER_ID));
    let (bytes, revision) = store.get(CONFIG_KEY).unwrap().unwrap();
    assert_eq!(Config::from_json(&bytes).unwrap(), initial(CLUSTER_ID));
    assert_eq!(cm.revision(), revision);
    assert_eq!(*cm.fetch().unwrap(), initial(CLUSTER_ID));
}

#[test]
fn bootstrap_and_open_read_back_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cm.json");
    {
        let store: Arc<dyn CoordStore> =
            Arc::new(EmbeddedStore::open(&path, ManualClock::new()).unwrap());
        ConfigManager::bootstrap(store, initial(CLUSTER_ID)).unwrap();
    }
    let store: Arc<dyn CoordStore> =
        Arc::new(EmbeddedStore::open(&path, ManualClock::new()).unwrap());
    let cm = ConfigManager::open(store.clone()).unwrap();
    assert_eq!(*cm.current(), initial(CLUSTER_ID));
    // A second bootstrap of the same cluster finds the stored configuration and
    // keeps it, also when the stored one is ahead of the given initial one.
    let next = cm.commit(next_term(&cm.current())).unwrap();
    let again = ConfigManager::bootstrap(store, initial(CLUSTER_ID)).unwrap();
    assert_eq!(again.current(), next);
}

#[test]
fn bootstrap_of_another_cluster_fails() {
    let store = memory_store(ManualClock::new());
    ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    match ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID + 1)) {
        Err(CmError::WrongCluster { stored, given }) => {
            assert_eq!((stored, given), (CLUSTER_ID, CLUSTER_ID + 1));
        }
        other => panic!("expected WrongCluster, got {other:?}"),
    }
    assert_eq!(
        ConfigManager::open(store).unwrap().current().cluster_id,
        CLUSTER_ID
    );
}

#[test]
fn bootstrap_refuses_an_invalid_initial_configuration() {
    let store = memory_store(ManualClock::new());
    let mut bad = initial(CLUSTER_ID);
    bad.shards[0].backups[0] = bad.shards[0].primary;
    assert!(matches!(
        ConfigManager::bootstrap(store.clone(), bad),
        Err(CmError::Invalid(_))
    ));
    assert_eq!(store.get(CONFIG_KEY).unwrap(), None);
}

#[test]
fn open_without_a_configuration_is_no_config() {
    let store = memory_store(ManualClock::new());
    assert!(matches!(ConfigManager::open(store), Err(CmError::NoConfig)));
}

#[test]
fn a_stored_configuration_that_does_not_decode_is_invalid() {
    let store = memory_store(ManualClock::new());
    store.put_if(CONFIG_KEY, b"{\"term\": 1", 0, None).unwrap();
    assert!(matches!(
        ConfigManager::open(store.clone()),
        Err(CmError::Invalid(_))
    ));
    assert!(matches!(
        ConfigManager::bootstrap(store, initial(CLUSTER_ID)),
        Err(CmError::Invalid(_))
    ));
}

#[test]
fn commit_of_the_next_term_persists() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cm.json");
    let committed = {
        let store: Arc<dyn CoordStore> =
            Arc::new(EmbeddedStore::open(&path, ManualClock::new()).unwrap());
        let cm = ConfigManager::bootstrap(store, initial(CLUSTER_ID)).unwrap();
        let t2 = cm.commit(next_term(&cm.current())).unwrap();
        assert_eq!(t2.term, Term(2));
        assert_eq!(cm.current(), t2);
        let t3 = cm.commit(next_term(&t2)).unwrap();
        assert_eq!(*cm.fetch().unwrap(), *t3);
        t3
    };
    let store: Arc<dyn CoordStore> =
        Arc::new(EmbeddedStore::open(&path, ManualClock::new()).unwrap());
    let cm = ConfigManager::open(store).unwrap();
    assert_eq!(cm.current(), committed);
    assert_eq!(cm.current().term, Term(3));
}

#[test]
fn commit_must_be_exactly_the_next_term() {
    let store = memory_store(ManualClock::new());
    let cm = ConfigManager::bootstrap(store, initial(CLUSTER_ID)).unwrap();
    let revision = cm.revision();
    for term in [Term(0), Term(1), Term(3), Term(u64::MAX)] {
        let mut next = next_term(&cm.current());
        next.term = term;
        match cm.commit(next) {
            Err(CmError::TermNotNext { current, given }) => {
                assert_eq!((current, given), (Term(1), term));
            }
            other => panic!("term {term:?}: expected TermNotNext, got {other:?}"),
        }
    }
    assert_eq!(cm.current().term, Term(1));
    assert_eq!(cm.revision(), revision);
}

#[test]
fn commit_must_keep_the_cluster_and_validate() {
    let store = memory_store(ManualClock::new());
    let cm = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    let mut other = next_term(&cm.current());
    other.cluster_id = CLUSTER_ID + 1;
    assert!(matches!(
        cm.commit(other),
        Err(CmError::WrongCluster { .. })
    ));
    let mut broken = next_term(&cm.current());
    broken.shards[1].primary = NodeId(99);
    assert!(matches!(cm.commit(broken), Err(CmError::Invalid(_))));
    let (bytes, _) = store.get(CONFIG_KEY).unwrap().unwrap();
    assert_eq!(Config::from_json(&bytes).unwrap(), initial(CLUSTER_ID));
}

#[test]
fn two_managers_cannot_both_commit_the_same_term() {
    let store = memory_store(ManualClock::new());
    let first = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    let second = ConfigManager::open(store.clone()).unwrap();

    let winner = first.commit(next_term(&first.current())).unwrap();
    // The second manager's own term 2 differs from the first's.
    let mut rival = next_term(&second.current());
    rival.shards[1].primary = rival.shards[1].backups[1];
    rival.shards[1].backups[1] = initial(CLUSTER_ID).shards[1].primary;
    rival.validate().unwrap();
    assert_ne!(rival, *winner);
    assert!(matches!(second.commit(rival), Err(CmError::Conflict(_))));

    // The stored configuration is the winner's, and the loser still caches term 1
    // until it reloads.
    let (bytes, _) = store.get(CONFIG_KEY).unwrap().unwrap();
    assert_eq!(Config::from_json(&bytes).unwrap(), *winner);
    assert_eq!(second.current().term, Term(1));
    assert_eq!(second.reload().unwrap(), winner);
    assert_eq!(second.revision(), first.revision());
    // After the reload the second manager can commit term 3, and then the first
    // one is the stale one.
    second.commit(next_term(&winner)).unwrap();
    assert!(matches!(
        first.commit(next_term(&winner)),
        Err(CmError::Conflict(_))
    ));
}

#[test]
fn racing_bootstraps_agree_on_one_configuration() {
    let store = memory_store(ManualClock::new());
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || ConfigManager::bootstrap(store, initial(CLUSTER_ID)))
        })
        .collect();
    let revisions: Vec<u64> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap().revision())
        .collect();
    assert!(revisions.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn reload_refuses_another_cluster_and_an_older_term() {
    let store = memory_store(ManualClock::new());
    let cm = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    let t2 = cm.commit(next_term(&cm.current())).unwrap();

    // Someone rewrites the key behind the manager's back with term 1.
    let (_, revision) = store.get(CONFIG_KEY).unwrap().unwrap();
    let r = store
        .put_if(CONFIG_KEY, &initial(CLUSTER_ID).to_json(), revision, None)
        .unwrap();
    assert!(matches!(cm.reload(), Err(CmError::Invalid(_))));
    assert_eq!(cm.current(), t2);

    store
        .put_if(
            CONFIG_KEY,
            &next_term(&initial(CLUSTER_ID + 1)).to_json(),
            r,
            None,
        )
        .unwrap();
    assert!(matches!(cm.reload(), Err(CmError::WrongCluster { .. })));
    assert_eq!(cm.current(), t2);
}

#[test]
fn an_unavailable_store_fails_commit_and_changes_nothing() {
    let store = Arc::new(EmbeddedStore::in_memory(ManualClock::new()));
    let cm = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    store.set_available(false);
    assert!(matches!(
        cm.commit(next_term(&cm.current())),
        Err(CmError::Store(StoreError::Unavailable(_)))
    ));
    assert!(matches!(
        cm.reload(),
        Err(CmError::Store(StoreError::Unavailable(_)))
    ));
    assert!(matches!(
        cm.acquire_active("cm-a", TTL_NS),
        Err(CmError::Store(StoreError::Unavailable(_)))
    ));
    // The cache still serves the last configuration.
    assert_eq!(cm.fetch().unwrap().term, Term(1));
    store.set_available(true);
    assert_eq!(cm.commit(next_term(&cm.current())).unwrap().term, Term(2));
}

#[test]
fn only_one_manager_is_active_until_its_lease_expires() {
    let clock = ManualClock::new();
    let store = memory_store(clock.clone());
    let a = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    let b = ConfigManager::open(store.clone()).unwrap();

    let lease_a = a.acquire_active("cm-a", TTL_NS).unwrap();
    assert_eq!(lease_a.holder(), "cm-a");
    assert_eq!(store.get(CM_LEASE_KEY).unwrap().unwrap().0, b"cm-a");
    match b.acquire_active("cm-b", TTL_NS) {
        Err(CmError::ActiveHeld { holder }) => assert_eq!(holder, "cm-a"),
        other => panic!("expected ActiveHeld, got {other:?}"),
    }
    // The same name does not help: the old holder may still be running.
    assert!(matches!(
        b.acquire_active("cm-a", TTL_NS),
        Err(CmError::ActiveHeld { .. })
    ));

    // Renewed in time, the lease outlives several ttls.
    for _ in 0..3 {
        clock.advance_ns(TTL_NS / 2);
        lease_a.renew().unwrap();
        assert!(matches!(
            b.acquire_active("cm-b", TTL_NS),
            Err(CmError::ActiveHeld { .. })
        ));
    }

    // Not renewed, it expires, and the standby takes over.
    clock.advance_ns(TTL_NS);
    let lease_b = b.acquire_active("cm-b", TTL_NS).unwrap();
    assert_eq!(store.get(CM_LEASE_KEY).unwrap().unwrap().0, b"cm-b");
    match lease_a.renew() {
        Err(CmError::LeaseLost { holder }) => assert_eq!(holder, "cm-a"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    lease_b.renew().unwrap();
}

#[test]
fn release_hands_over_without_waiting() {
    let store = memory_store(ManualClock::new());
    let a = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    let b = ConfigManager::open(store.clone()).unwrap();
    let lease_a = a.acquire_active("cm-a", TTL_NS).unwrap();
    lease_a.release().unwrap();
    assert_eq!(store.get(CM_LEASE_KEY).unwrap(), None);
    b.acquire_active("cm-b", TTL_NS).unwrap();
}

/// What is committed is recorded apart from what is stored: storing a term
/// records nothing, the first configuration is committed by definition, the
/// record only moves forward, and only the active manager moves it.
#[test]
fn the_committed_term_is_recorded_apart_from_the_stored_one() {
    let clock = ManualClock::new();
    let store = memory_store(clock.clone());
    let a = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    assert_eq!(a.committed_term().unwrap(), Term(1), "the initial term");
    let lease_a = a.acquire_active("cm-a", TTL_NS).unwrap();
    let t2 = a.commit_as(&lease_a, next_term(&a.current())).unwrap();
    let b = ConfigManager::open(store.clone()).unwrap();
    assert_eq!(b.current().term, Term(2));
    assert_eq!(
        b.committed_term().unwrap(),
        Term(1),
        "stored, not committed"
    );

    a.record_committed(&lease_a, t2.term).unwrap();
    a.record_committed(&lease_a, Term(1)).unwrap();
    assert_eq!(b.committed_term().unwrap(), Term(2), "never moves back");

    // A deposed manager cannot record.
    let t3 = a.commit_as(&lease_a, next_term(&t2)).unwrap();
    clock.advance_ns(TTL_NS);
    let _lease_b = b.acquire_active("cm-b", TTL_NS).unwrap();
    match a.record_committed(&lease_a, t3.term) {
        Err(CmError::LeaseLost { holder }) => assert_eq!(holder, "cm-a"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(b.committed_term().unwrap(), Term(2));
    assert_eq!(
        store.get(COMMITTED_KEY).unwrap().map(|(v, _)| v),
        Some(b"2".to_vec())
    );
}

#[test]
fn a_deposed_manager_cannot_commit_as_active() {
    let clock = ManualClock::new();
    let store = memory_store(clock.clone());
    let a = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    let b = ConfigManager::open(store.clone()).unwrap();
    let lease_a = a.acquire_active("cm-a", TTL_NS).unwrap();
    let t2 = a.commit_as(&lease_a, next_term(&a.current())).unwrap();
    assert_eq!(t2.term, Term(2));

    // a's lease expires without a noticing; b takes over and reloads.
    clock.advance_ns(TTL_NS);
    let lease_b = b.acquire_active("cm-b", TTL_NS).unwrap();
    assert_eq!(b.reload().unwrap(), t2);

    // a's cache is as fresh as b's, so a plain compare-and-put on the configuration
    // would succeed; the fence on the active key refuses it.
    match a.commit_as(&lease_a, next_term(&t2)) {
        Err(CmError::LeaseLost { holder }) => assert_eq!(holder, "cm-a"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(a.current(), t2);
    let t3 = b.commit_as(&lease_b, next_term(&t2)).unwrap();
    assert_eq!(t3.term, Term(3));
}

#[test]
fn the_active_key_survives_a_restart_of_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cm.json");
    {
        let clock = ManualClock::new();
        let store: Arc<dyn CoordStore> =
            Arc::new(EmbeddedStore::open(&path, clock.clone()).unwrap());
        let a = ConfigManager::bootstrap(store, initial(CLUSTER_ID)).unwrap();
        a.acquire_active("cm-a", TTL_NS).unwrap();
        clock.advance_ns(TTL_NS - 1);
    }
    // After the restart the old holder keeps a full ttl: it may still be running.
    let clock = ManualClock::new();
    let store: Arc<dyn CoordStore> = Arc::new(EmbeddedStore::open(&path, clock.clone()).unwrap());
    let b = ConfigManager::open(store).unwrap();
    clock.advance_ns(TTL_NS - 1);
    assert!(matches!(
        b.acquire_active("cm-b", TTL_NS),
        Err(CmError::ActiveHeld { .. })
    ));
    clock.advance_ns(1);
    b.acquire_active("cm-b", TTL_NS).unwrap();
}

#[test]
fn node_identities_are_handed_out_once_above_every_member_and_survive_a_new_manager() {
    let store = memory_store(ManualClock::new());
    let a = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    let b = ConfigManager::open(store.clone()).unwrap();
    let server = rowankv_cm::NodeRecord {
        kind: "server".into(),
        address: "10.0.0.7:7000".into(),
        workers: 0,
        resp: None,
        left: false,
    };
    let client = rowankv_cm::NodeRecord {
        kind: "client".into(),
        address: String::new(),
        workers: 0,
        resp: None,
        left: false,
    };
    // Two managers on one store, interleaved: every identity is new.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..20 {
        let (m, r) = if i % 2 == 0 {
            (&a, &server)
        } else {
            (&b, &client)
        };
        let id = m.allocate_node(r).unwrap();
        assert!(
            id.0 >= rowankv_cm::ALLOCATED_NODE_BASE,
            "{id} is in the reserved range"
        );
        assert!(a.current().member(id).is_none(), "{id} is a member already");
        assert!(seen.insert(id), "{id} handed out twice");
        assert_eq!(a.node_record(id).unwrap().as_ref(), Some(r));
    }
    assert_eq!(seen.len(), 20);
    // A manager opened later (a CM restarted or taking over) continues after them.
    let c = ConfigManager::open(store.clone()).unwrap();
    let next = c.allocate_node(&server).unwrap();
    assert!(next > *seen.iter().next_back().unwrap());
    // An identity never handed out has no record; a bad kind is refused, and
    // hands nothing out.
    assert_eq!(c.node_record(NodeId(5)).unwrap(), None);
    let bad = rowankv_cm::NodeRecord {
        kind: "switch".into(),
        address: String::new(),
        workers: 0,
        resp: None,
        left: false,
    };
    assert!(matches!(c.allocate_node(&bad), Err(CmError::Invalid(_))));
    assert_eq!(
        c.allocate_node(&server).unwrap().0,
        next.0 + 1,
        "the refused request used no identity"
    );
}

#[test]
fn a_corrupt_node_counter_is_an_error_not_a_reused_identity() {
    let store = memory_store(ManualClock::new());
    let m = ConfigManager::bootstrap(store.clone(), initial(CLUSTER_ID)).unwrap();
    store
        .put_if(rowankv_cm::NEXT_NODE_KEY, b"twelve", 0, None)
        .unwrap();
    let r = rowankv_cm::NodeRecord {
        kind: "server".into(),
        address: "h:1".into(),
        workers: 0,
        resp: None,
        left: false,
    };
    let e = m.allocate_node(&r).unwrap_err();
    assert!(
        e.to_string().contains("not a number"),
        "unexpected error: {e}"
    );
}
