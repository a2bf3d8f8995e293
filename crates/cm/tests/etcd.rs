//! The etcd backend beyond the conformance suite (which runs in `store.rs`): two
//! stores and two configuration managers on one etcd (failover through it), key
//! prefixes, TTL rounding, watch, request-size limits, and the errors of an etcd
//! that is unreachable, frozen or answering junk. Each test starts its own etcd
//! and passes without running, after printing why, where etcd is not installed.

mod etcd_process;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rowankv_cm::etcd::{LeaseTtl, WatchEvent};
use rowankv_cm::store::{CoordStore, Guard, LeaseId, StoreError, VALUE_BYTES_MAX};
use rowankv_cm::{
    CmError, ConfigManager, EtcdConfig, EtcdStore, StoreSource, CM_LEASE_KEY, CONFIG_KEY,
};
use rowankv_types::{NodeId, Term};
use rowankv_wire::config::{Config, ConfigSource, Member};

use etcd_process::EtcdProcess;

const CLUSTER_ID: u64 = 0x0102_0304;
/// The active-CM lease of the failover test: etcd's 1 s granularity.
const CM_TTL_NS: u64 = 1_000_000_000;
const EVENT_WAIT: Duration = Duration::from_secs(10);

fn conflict(result: Result<impl std::fmt::Debug, StoreError>) -> (String, u64) {
    match result {
        Err(StoreError::Conflict { key, current }) => (key, current),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

fn unavailable_message(result: Result<impl std::fmt::Debug, StoreError>) -> String {
    match result {
        Err(StoreError::Unavailable(message)) => message,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

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

// ---- Two instances on one etcd --------------------------------------------------

#[test]
fn two_stores_see_each_others_writes_and_refuse_a_stale_compare() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let a = etcd.store("/rowankv/shared/");
    let b = etcd.store("/rowankv/shared/");

    let r1 = a.put_if("k", b"from a", 0, None).unwrap();
    assert_eq!(b.get("k").unwrap(), Some((b"from a".to_vec(), r1)));
    let r2 = b.put_if("k", b"from b", r1, None).unwrap();
    assert_eq!(a.get("k").unwrap(), Some((b"from b".to_vec(), r2)));
    // `a` still believes the key is at r1: its compare-and-put is refused and
    // names the revision `b` wrote.
    assert_eq!(
        conflict(a.put_if("k", b"stale", r1, None)),
        ("k".into(), r2)
    );
    assert_eq!(conflict(a.delete_if("k", r1)), ("k".into(), r2));
    assert_eq!(b.get("k").unwrap().unwrap().0, b"from b");

    // The fence of a CM: `a` holds the active key and writes guarded by it; `b`
    // takes the key over; `a`'s next guarded write is refused on the guard.
    let lease_a = a.grant_lease(CM_TTL_NS).unwrap();
    let held = a.put_if("active", b"a", 0, Some(lease_a)).unwrap();
    let fence = Guard {
        key: "active".to_owned(),
        revision: held,
    };
    let r3 = a.put_if_guarded(&fence, "config", b"1", 0, None).unwrap();
    assert_eq!(b.get("config").unwrap(), Some((b"1".to_vec(), r3)));
    // `a`'s lease ends (revoked here; expiry in the CM test below); `b` sees the
    // key vanish and creates it with its own lease.
    a.revoke(lease_a).unwrap();
    assert_eq!(b.get("active").unwrap(), None);
    let lease_b = b.grant_lease(CM_TTL_NS).unwrap();
    let held_b = b.put_if("active", b"b", 0, Some(lease_b)).unwrap();
    assert_eq!(
        conflict(a.put_if_guarded(&fence, "config", b"2", r3, None)),
        ("active".into(), held_b)
    );
    assert_eq!(b.get("config").unwrap(), Some((b"1".to_vec(), r3)));

    // Leases are etcd's, not an instance's: `a` keeps `b`'s lease alive and sees
    // what etcd granted; both see its keys vanish when `b` revokes it.
    a.keep_alive(lease_b).unwrap();
    let ttl = a.lease_ttl(lease_b).unwrap().unwrap();
    assert_eq!(ttl.granted_s, 1);
    assert!(ttl.remaining_s <= 1);
    b.revoke(lease_b).unwrap();
    assert_eq!(a.get("active").unwrap(), None);
    assert_eq!(a.lease_ttl(lease_b).unwrap(), None);
    // etcd forgets a lease once it is gone: the instance that granted it reports
    // it expired; another instance cannot tell it from one never granted.
    assert!(matches!(
        b.keep_alive(lease_b),
        Err(StoreError::LeaseExpired(_))
    ));
    assert!(matches!(
        a.keep_alive(lease_b),
        Err(StoreError::UnknownLease(_))
    ));
}

#[test]
fn two_cms_fail_over_through_etcd() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let store_a: Arc<dyn CoordStore> = Arc::new(etcd.store("/rowankv/failover/"));
    let store_b: Arc<dyn CoordStore> = Arc::new(etcd.store("/rowankv/failover/"));

    let cm_a = ConfigManager::bootstrap(store_a.clone(), initial(CLUSTER_ID)).unwrap();
    let active_a = cm_a.acquire_active("cm-a", CM_TTL_NS).unwrap();
    // The standby finds the stored configuration and the active CM.
    let cm_b = ConfigManager::bootstrap(store_b.clone(), initial(CLUSTER_ID)).unwrap();
    assert_eq!(cm_b.current(), cm_a.current());
    assert_eq!(cm_b.revision(), cm_a.revision());
    match cm_b.acquire_active("cm-b", CM_TTL_NS) {
        Err(CmError::ActiveHeld { holder }) => assert_eq!(holder, "cm-a"),
        other => panic!("expected ActiveHeld, got {other:?}"),
    }

    // The active CM commits term 2; the standby's stale commit of its own term 2
    // is refused by the compare-and-put, and a reload finds A's.
    let t2 = cm_a
        .commit_as(&active_a, next_term(&cm_a.current()))
        .unwrap();
    assert_eq!(t2.term, Term(2));
    assert!(matches!(
        cm_b.commit(next_term(&initial(CLUSTER_ID))),
        Err(CmError::Conflict(_))
    ));
    assert_eq!(cm_b.reload().unwrap(), t2);
    assert_eq!(*StoreSource::new(store_b.clone()).fetch().unwrap(), *t2);

    // A renews across more than its TTL and stays active.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(400));
        active_a.renew().unwrap();
    }
    assert!(matches!(
        cm_b.acquire_active("cm-b", CM_TTL_NS),
        Err(CmError::ActiveHeld { .. })
    ));

    // A stops renewing (it hangs or dies): B takes over once etcd expires A's lease.
    let last_renewal = Instant::now();
    let active_b = loop {
        match cm_b.acquire_active("cm-b", CM_TTL_NS) {
            Ok(active) => break active,
            Err(CmError::ActiveHeld { holder }) => assert_eq!(holder, "cm-a"),
            Err(e) => panic!("{e}"),
        }
        assert!(
            last_renewal.elapsed() < Duration::from_secs(15),
            "B did not take over"
        );
        std::thread::sleep(Duration::from_millis(25));
    };
    let takeover = last_renewal.elapsed();
    eprintln!("takeover {takeover:?} after the last renewal of a {CM_TTL_NS} ns lease");
    assert!(
        takeover >= Duration::from_millis(800),
        "took over {takeover:?} after a renewal of a 1 s lease"
    );
    assert_eq!(
        store_a.get(CM_LEASE_KEY).unwrap().unwrap().0,
        b"cm-b".to_vec()
    );
    let t3 = cm_b
        .commit_as(&active_b, next_term(&cm_b.current()))
        .unwrap();

    // A, deposed without knowing it, cannot commit: the store checks its fence.
    match cm_a.commit_as(&active_a, next_term(&t2)) {
        Err(CmError::LeaseLost { holder }) => assert_eq!(holder, "cm-a"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    match active_a.renew() {
        Err(CmError::LeaseLost { holder }) => assert_eq!(holder, "cm-a"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // Everyone reads B's term 3.
    assert_eq!(*StoreSource::new(store_a.clone()).fetch().unwrap(), *t3);
    assert_eq!(cm_a.reload().unwrap(), t3);
    // B steps down cleanly: the key is free at once.
    active_b.release().unwrap();
    assert_eq!(store_a.get(CM_LEASE_KEY).unwrap(), None);
    assert!(store_a.get(CONFIG_KEY).unwrap().is_some());
}

// ---- Prefixes ---------------------------------------------------------------------

#[test]
fn prefixes_keep_clusters_apart() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let c1 = etcd.store("/rowankv/c1/");
    let c10 = etcd.store("/rowankv/c10/");
    let r1 = c1.put_if("k", b"one", 0, None).unwrap();
    // The same key in another cluster is another key.
    let r10 = c10.put_if("k", b"ten", 0, None).unwrap();
    c10.put_if("only10", b"", 0, None).unwrap();
    assert_eq!(c1.get("k").unwrap(), Some((b"one".to_vec(), r1)));
    assert_eq!(c10.get("k").unwrap(), Some((b"ten".to_vec(), r10)));
    assert_eq!(c1.get("only10").unwrap(), None);
    let keys = |s: &EtcdStore| -> Vec<String> {
        s.list("").unwrap().into_iter().map(|(k, _, _)| k).collect()
    };
    assert_eq!(keys(&c1), ["k"]);
    assert_eq!(keys(&c10), ["k", "only10"]);
    c1.delete_if("k", r1).unwrap();
    assert_eq!(c10.get("k").unwrap(), Some((b"ten".to_vec(), r10)));
    // Where the keys are in etcd: under each prefix.
    let root = etcd.store("/rowankv/");
    assert_eq!(keys(&root), ["c10/k", "c10/only10"]);
    // The revision counter is etcd's, shared by every prefix: revisions are
    // increasing, not dense, within one cluster.
    let next1 = c1.put_if("k", b"", 0, None).unwrap();
    c10.put_if("k2", b"", 0, None).unwrap();
    assert!(c1.put_if("k3", b"", 0, None).unwrap() > next1 + 1);
    // A prefix must end with '/', so that "/rowankv/c1" cannot see "/rowankv/c10/".
    let bad = EtcdStore::new(EtcdConfig::new([etcd.endpoint()], "/rowankv/c1"));
    assert!(unavailable_message(bad).contains("must end with '/'"));
}

// ---- Leases -----------------------------------------------------------------------

#[test]
fn lease_ttls_round_up_to_whole_seconds() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let s = etcd.store("/rowankv/ttl/");
    for (ttl_ns, granted_s) in [
        (1, 1),
        (999_999_999, 1),
        (1_000_000_000, 1),
        (1_000_000_001, 2),
        (2_500_000_000, 3),
        (3_600_000_000_000, 3600),
    ] {
        let lease = s.grant_lease(ttl_ns).unwrap();
        let ttl = s.lease_ttl(lease).unwrap().unwrap();
        assert_eq!(ttl.granted_s, granted_s, "ttl {ttl_ns} ns");
        assert!(ttl.remaining_s <= granted_s);
        s.revoke(lease).unwrap();
        assert_eq!(s.lease_ttl(lease).unwrap(), None);
    }
    assert!(matches!(
        s.grant_lease(u64::MAX),
        Err(StoreError::LimitExceeded { .. })
    ));
    assert_eq!(s.lease_ttl(LeaseId(0)).unwrap(), None);
}

#[test]
fn etcd_raises_short_ttls_to_its_minimum() {
    // etcd's defaults: 100 ms heartbeat, 1 s election timeout, so its minimum TTL
    // is 1.5 s rounded up.
    let Some(etcd) =
        EtcdProcess::start_with(&["--heartbeat-interval=100", "--election-timeout=1000"])
    else {
        return;
    };
    let s = etcd.store("/rowankv/ttl/");
    let lease = s.grant_lease(1_000_000_000).unwrap();
    assert!(matches!(
        s.lease_ttl(lease).unwrap(),
        Some(LeaseTtl { granted_s: 2, .. })
    ));
    let lease = s.grant_lease(5_000_000_000).unwrap();
    assert_eq!(s.lease_ttl(lease).unwrap().unwrap().granted_s, 5);
}

#[test]
fn a_lease_survives_an_etcd_restart() {
    let Some(mut etcd) = EtcdProcess::start() else {
        return;
    };
    let s = etcd.store("/rowankv/restart/");
    let lease = s.grant_lease(30_000_000_000).unwrap();
    let r = s.put_if("held", b"x", 0, Some(lease)).unwrap();
    etcd.restart();
    assert_eq!(s.get("held").unwrap(), Some((b"x".to_vec(), r)));
    s.keep_alive(lease).unwrap();
    s.revoke(lease).unwrap();
    assert_eq!(s.get("held").unwrap(), None);
}

// ---- Watch ------------------------------------------------------------------------

fn next_event(watch: &rowankv_cm::etcd::Watch) -> WatchEvent {
    watch
        .recv_timeout(EVENT_WAIT)
        .unwrap()
        .expect("an event within the wait")
}

#[test]
fn watch_reports_puts_deletes_and_lease_ends_in_revision_order() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let s = etcd.store("/rowankv/watch/");
    let other_cluster = etcd.store("/rowankv/other/");
    let watch = s.watch("/cfg/", 0).unwrap();
    let ra = s.put_if("/cfg/a", b"1", 0, None).unwrap();
    s.put_if("/elsewhere", b"", 0, None).unwrap();
    other_cluster.put_if("/cfg/a", b"", 0, None).unwrap();
    let rb = s.put_if("/cfg/b", b"2", 0, None).unwrap();
    s.delete_if("/cfg/a", ra).unwrap();
    let ra_deleted = s.get("/cfg/b").unwrap().unwrap().1 + 1;
    let lease = s.grant_lease(CM_TTL_NS).unwrap();
    let rl = s.put_if("/cfg/leased", b"l", 0, Some(lease)).unwrap();
    s.revoke(lease).unwrap();
    let expected = [
        WatchEvent::Put {
            key: "/cfg/a".to_owned(),
            value: b"1".to_vec(),
            revision: ra,
        },
        WatchEvent::Put {
            key: "/cfg/b".to_owned(),
            value: b"2".to_vec(),
            revision: rb,
        },
        WatchEvent::Delete {
            key: "/cfg/a".to_owned(),
            revision: ra_deleted,
        },
        WatchEvent::Put {
            key: "/cfg/leased".to_owned(),
            value: b"l".to_vec(),
            revision: rl,
        },
        WatchEvent::Delete {
            key: "/cfg/leased".to_owned(),
            revision: rl + 1,
        },
    ];
    for want in expected {
        assert_eq!(next_event(&watch), want);
    }
    // Nothing else: the writes outside the prefix were not reported.
    assert_eq!(
        watch.recv_timeout(Duration::from_millis(300)).unwrap(),
        None
    );
    // And a lease that expires (not revoked) is reported as the deletion of its key.
    let lease = s.grant_lease(CM_TTL_NS).unwrap();
    s.put_if("/cfg/expiring", b"", 0, Some(lease)).unwrap();
    assert!(matches!(next_event(&watch), WatchEvent::Put { .. }));
    let event = next_event(&watch);
    assert!(
        matches!(&event, WatchEvent::Delete { key, .. } if key == "/cfg/expiring"),
        "{event:?}"
    );
}

#[test]
fn watch_from_a_revision_replays_what_came_after_it() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let s = etcd.store("/rowankv/watch/");
    let r1 = s.put_if("a", b"1", 0, None).unwrap();
    let r2 = s.put_if("a", b"2", r1, None).unwrap();
    let r3 = s.put_if("b", b"3", 0, None).unwrap();
    // Read at r1, watch after it: nothing between the read and the watch is lost.
    let watch = s.watch("", r1).unwrap();
    assert_eq!(next_event(&watch).revision(), r2);
    assert_eq!(next_event(&watch).revision(), r3);
    let r4 = s.put_if("c", b"4", 0, None).unwrap();
    let event = next_event(&watch);
    assert_eq!((event.key(), event.revision()), ("c", r4));
}

#[test]
fn dropping_a_watch_stops_it_and_a_lost_etcd_ends_it() {
    let Some(mut etcd) = EtcdProcess::start() else {
        return;
    };
    let s = etcd.store("/rowankv/watch/");
    let watch = s.watch("", 0).unwrap();
    let started = Instant::now();
    drop(watch); // joins the watch's thread
    assert!(started.elapsed() < Duration::from_secs(2));
    s.put_if("k", b"", 0, None).unwrap();

    let watch = s.watch("", 0).unwrap();
    etcd.kill();
    let message = unavailable_message(watch.recv_timeout(EVENT_WAIT));
    assert!(message.contains("watch stream"), "{message}");
    // A watch cannot be made while etcd is down.
    assert!(unavailable_message(s.watch("", 0)).contains("unreachable"));
}

#[test]
fn a_watch_from_a_compacted_revision_is_refused() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let s = etcd.store("/rowankv/watch/");
    let r1 = s.put_if("a", b"1", 0, None).unwrap();
    let r2 = s.put_if("a", b"2", r1, None).unwrap();
    let r3 = s.put_if("a", b"3", r2, None).unwrap();
    let answer = etcd_process::http_agent()
        .post(format!("{}/v3/kv/compaction", etcd.endpoint()))
        .send(format!("{{\"revision\":\"{r3}\",\"physical\":true}}"))
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(answer.contains("header"), "{answer}");
    // etcd may refuse at creation or cancel right after: either way it says why.
    let message = match s.watch("", r1) {
        Ok(watch) => unavailable_message(watch.recv_timeout(EVENT_WAIT)),
        Err(e) => unavailable_message(Err::<(), _>(e)),
    };
    assert!(message.contains("compacted"), "{message}");
}

// ---- Limits -----------------------------------------------------------------------

#[test]
fn values_up_to_the_trait_limit_fit_when_etcd_allows_them() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    // The test etcd runs with --max-request-bytes of 10 MiB.
    let s = etcd.store("/rowankv/big/");
    let value: Vec<u8> = (0..VALUE_BYTES_MAX).map(|i| (i % 251) as u8).collect();
    let r = s.put_if("big", &value, 0, None).unwrap();
    assert_eq!(s.get("big").unwrap(), Some((value.clone(), r)));
    assert_eq!(s.list("").unwrap(), vec![("big".to_owned(), value, r)]);
}

#[test]
fn requests_over_etcds_limit_are_limit_exceeded() {
    let Some(etcd) = EtcdProcess::start_with(&["--max-request-bytes=1048576"]) else {
        return;
    };
    let two_mib = vec![7u8; 2 << 20];
    // A store told etcd's default limit refuses before sending.
    let told = EtcdStore::new(EtcdConfig::new([etcd.endpoint()], "/rowankv/big/")).unwrap();
    assert!(matches!(
        told.put_if("k", &two_mib, 0, None),
        Err(StoreError::LimitExceeded { max, .. }) if max == 1536 * 1024
    ));
    // A store told a limit larger than the server's: the server refuses, and that
    // is the same error.
    let wrong = etcd.store("/rowankv/big/");
    assert!(matches!(
        wrong.put_if("k", &two_mib, 0, None),
        Err(StoreError::LimitExceeded { .. })
    ));
    let guard = Guard {
        key: "g".to_owned(),
        revision: 0,
    };
    assert!(matches!(
        wrong.put_if_guarded(&guard, "k", &two_mib, 0, None),
        Err(StoreError::LimitExceeded { .. })
    ));
    assert_eq!(told.get("k").unwrap(), None);
    // Under the limit is fine.
    let r = told.put_if("k", &two_mib[..512 << 10], 0, None).unwrap();
    assert_eq!(told.get("k").unwrap().unwrap().1, r);
}

// ---- Errors -----------------------------------------------------------------------

fn dead_endpoint() -> String {
    // A port that was free a moment ago: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}")
}

/// Every call on keys and every lease grant against `s` fails with `Unavailable`;
/// returns the messages.
fn key_calls_unavailable(s: &EtcdStore) -> Vec<String> {
    let guard = Guard {
        key: "g".to_owned(),
        revision: 0,
    };
    vec![
        unavailable_message(s.get("k")),
        unavailable_message(s.put_if("k", b"v", 0, None)),
        unavailable_message(s.put_if_guarded(&guard, "k", b"v", 0, None)),
        unavailable_message(s.delete_if("k", 0)),
        unavailable_message(s.list("")),
        unavailable_message(s.grant_lease(CM_TTL_NS)),
    ]
}

/// Every call on an existing lease against `s` fails with `Unavailable`.
fn lease_calls_unavailable(s: &EtcdStore) -> Vec<String> {
    vec![
        unavailable_message(s.keep_alive(LeaseId(5))),
        unavailable_message(s.revoke(LeaseId(5))),
        unavailable_message(s.lease_ttl(LeaseId(5))),
    ]
}

fn every_call_unavailable(s: &EtcdStore) -> Vec<String> {
    let mut messages = key_calls_unavailable(s);
    messages.extend(lease_calls_unavailable(s));
    messages
}

#[test]
fn an_unreachable_etcd_is_unavailable() {
    let endpoint = dead_endpoint();
    let s = EtcdStore::new(EtcdConfig::new([endpoint.clone()], "/rowankv/x/")).unwrap();
    for message in every_call_unavailable(&s) {
        assert!(message.contains("unreachable"), "{message}");
        assert!(message.contains(&endpoint), "{message}");
    }
    assert!(unavailable_message(s.watch("", 0)).contains("unreachable"));
    assert!(unavailable_message(s.server_version()).contains("unreachable"));
}

#[test]
fn a_dead_first_endpoint_is_skipped() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let s = EtcdStore::new(EtcdConfig::new(
        [dead_endpoint(), etcd.endpoint()],
        "/rowankv/x/",
    ))
    .unwrap();
    let r = s.put_if("k", b"v", 0, None).unwrap();
    assert_eq!(s.get("k").unwrap(), Some((b"v".to_vec(), r)));
    assert!(s.server_version().unwrap().starts_with("3."));
    let watch = s.watch("", 0).unwrap();
    s.put_if("k2", b"", 0, None).unwrap();
    assert_eq!(next_event(&watch).key(), "k2");
}

#[test]
fn a_frozen_etcd_times_out_and_then_recovers() {
    let Some(etcd) = EtcdProcess::start() else {
        return;
    };
    let mut config = EtcdConfig::new([etcd.endpoint()], "/rowankv/x/");
    config.timeout = Duration::from_millis(500);
    let s = EtcdStore::new(config).unwrap();
    let r = s.put_if("k", b"v", 0, None).unwrap();
    etcd.pause();
    let started = Instant::now();
    let message = unavailable_message(s.get("k"));
    // A read is retried once: two timeouts.
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(message.contains("did not answer"), "{message}");
    let started = Instant::now();
    let message = unavailable_message(s.put_if("k", b"w", r, None));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(message.contains("may or may not"), "{message}");
    assert!(unavailable_message(s.watch("", 0)).contains("within"));
    etcd.resume();
    // The timed-out write may have landed once etcd ran again (the caller re-reads
    // to find out); the store answers again either way.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (value, _) = loop {
        match s.get("k") {
            Ok(found) => break found.unwrap(),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("etcd did not recover: {e}"),
        }
    };
    assert!(value == b"v" || value == b"w");
}

#[test]
fn invalid_configurations_are_refused() {
    let bad = |config: EtcdConfig| unavailable_message(EtcdStore::new(config));
    let endpoints: [&str; 0] = [];
    assert!(bad(EtcdConfig::new(endpoints, "/p/")).contains("no endpoints"));
    assert!(bad(EtcdConfig::new(["https://127.0.0.1:2379"], "/p/")).contains("TLS"));
    assert!(bad(EtcdConfig::new(["http://127.0.0.1"], "/p/")).contains("http://host:port"));
    assert!(bad(EtcdConfig::new(["127.0.0.1:2379"], "/p")).contains("must end with '/'"));
    let mut zero = EtcdConfig::new(["127.0.0.1:2379"], "/p/");
    zero.timeout = Duration::ZERO;
    assert!(bad(zero).contains("timeout"));
    // A bare host:port is taken as http://.
    assert!(EtcdStore::new(EtcdConfig::for_cluster(["127.0.0.1:2379"], "c1")).is_ok());
    assert_eq!(
        EtcdConfig::for_cluster(["127.0.0.1:2379"], "c1").prefix,
        "/rowankv/c1/"
    );
}

/// A fake etcd that answers every request with `response` (raw bytes), or closes
/// the connection at once if `response` is empty.
struct FakeEtcd {
    endpoint: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeEtcd {
    fn serve(response: Vec<u8>) -> FakeEtcd {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if thread_stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                if response.is_empty() {
                    drop(conn);
                    continue;
                }
                let mut reader = BufReader::new(conn);
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                let mut conn = reader.into_inner();
                let _ = conn.write_all(&response);
            }
        });
        FakeEtcd {
            endpoint,
            stop,
            thread: Some(thread),
        }
    }

    fn store(&self) -> EtcdStore {
        let mut config = EtcdConfig::new([self.endpoint.clone()], "/p/");
        config.timeout = Duration::from_secs(2);
        EtcdStore::new(config).unwrap()
    }
}

impl Drop for FakeEtcd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn http_answer(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn malformed_answers_are_unavailable_never_a_panic() {
    let header = r#""header":{"revision":"7"}"#;
    let junk = [
        http_answer("200 OK", "not json at all"),
        http_answer("200 OK", "[1, 2, 3]"),
        http_answer("200 OK", r#"{"kvs": "nope", "ID": true, "TTL": {}}"#),
        http_answer(
            "200 OK",
            &format!(r#"{{{header},"kvs":[{{"key":"!!!","mod_revision":"1"}}]}}"#),
        ),
        http_answer(
            "200 OK",
            &format!(r#"{{{header},"kvs":[{{"key":"L3Av","mod_revision":"x"}}],"responses":7}}"#),
        ),
        // Keys outside what was asked for.
        http_answer(
            "200 OK",
            &format!(
                r#"{{{header},"kvs":[{{"key":"b3RoZXI=","mod_revision":"3"}},{{"key":"b3RoZXI=","mod_revision":"3"}}]}}"#
            ),
        ),
        http_answer("500 Internal Server Error", "oops"),
        http_answer(
            "503 Service Unavailable",
            r#"{"error":"etcdserver: no leader","code":14}"#,
        ),
        b"hello\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"header\":".to_vec(),
        Vec::new(),
    ];
    for response in junk {
        let fake = FakeEtcd::serve(response.clone());
        let s = fake.store();
        // An answer with a header whose other fields are absent is a well-formed
        // answer to a lease call (proto3 leaves zero fields out), not to the others.
        let with_header = String::from_utf8_lossy(&response).contains(header);
        let messages = if with_header {
            key_calls_unavailable(&s)
        } else {
            every_call_unavailable(&s)
        };
        for message in messages {
            assert!(
                message.contains(&fake.endpoint) || message.contains("unreachable"),
                "{message}"
            );
        }
        let shown = String::from_utf8_lossy(&response).into_owned();
        assert!(s.watch("", 0).is_err(), "watch accepted {shown:?}");
        assert!(s.server_version().is_err(), "version accepted {shown:?}");
    }
    // The well-formed answer of the wrong kind: a grant that names no lease, and
    // one shorter than asked.
    for body in [r#"{"TTL":"5"}"#, r#"{"ID":"5","TTL":"0"}"#] {
        let fake = FakeEtcd::serve(http_answer("200 OK", body));
        let message = unavailable_message(fake.store().grant_lease(CM_TTL_NS));
        assert!(message.contains("malformed"), "{message}");
    }
    // Answers without etcd's header, well-formed otherwise.
    let fake = FakeEtcd::serve(http_answer("200 OK", r#"{"succeeded":true}"#));
    let message = unavailable_message(fake.store().put_if("k", b"", 0, None));
    assert!(message.contains("malformed"), "{message}");
    let fake = FakeEtcd::serve(http_answer("200 OK", "{}"));
    for message in every_call_unavailable(&fake.store()) {
        assert!(message.contains("malformed"), "{message}");
    }
}
