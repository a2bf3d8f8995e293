//! Unit tests of the protocol on one cluster: PUT/GET, conflicts and chain walks,
//! the interposer's redirection and its fall-backs, GC and slot reuse, crashes.

use rowankv_fabric::{LoopbackFabric, PowerFailure};

use crate::cluster::{AnyClient, Cluster, Memory};
use crate::switch::SwitchConfig;
use crate::{Config, Reply, Request};

fn cluster(config: Config) -> Cluster {
    Cluster::new(
        LoopbackFabric::new(),
        config,
        Memory::Pm { crash_sim: true },
        SwitchConfig {
            keys_max: 64,
            ..SwitchConfig::default()
        },
    )
    .unwrap()
}

fn run(c: &mut AnyClient, req: Request) -> Reply {
    if let Some(o) = c.start(req) {
        return o.result.unwrap();
    }
    for _ in 0..10_000 {
        if let Some(o) = c.poll() {
            return o.result.unwrap();
        }
    }
    panic!("operation did not finish");
}

fn put(c: &mut AnyClient, k: &str, v: &str) {
    let r = run(
        c,
        Request::Put {
            key: k.into(),
            value: v.into(),
        },
    );
    assert!(matches!(r, Reply::Put { .. }));
}

fn get(c: &mut AnyClient, k: &str) -> Option<Vec<u8>> {
    match run(c, Request::Get { key: k.into() }) {
        Reply::Get { value } => value,
        r => panic!("{r:?}"),
    }
}

#[test]
fn put_then_get_on_every_replica_and_absent_keys() {
    let mut cl = cluster(Config {
        replicas: 3,
        ..Config::default()
    });
    let mut a = cl.client(false).unwrap();
    let mut b = cl.client(false).unwrap();
    assert_eq!(get(&mut a, "k"), None);
    put(&mut a, "k", "v1");
    assert_eq!(get(&mut b, "k").as_deref(), Some(&b"v1"[..]));
    put(&mut b, "k", "v2");
    // a's cached tail is stale: it walks to v2.
    assert_eq!(get(&mut a, "k").as_deref(), Some(&b"v2"[..]));
    assert!(a.stats().walk_steps >= 1);
    let key_id = cl.ms.lookup(b"k").unwrap().key_id;
    for i in 0..3 {
        let chain = cl.ms.chain_on(i, key_id).unwrap();
        let values: Vec<_> = chain.iter().map(|(_, v)| v.clone()).collect();
        assert_eq!(
            values,
            vec![b"".to_vec(), b"v1".to_vec(), b"v2".to_vec()],
            "replica {i}"
        );
    }
}

#[test]
fn too_long_values_are_refused_with_a_typed_error() {
    let mut cl = cluster(Config::default());
    let mut a = cl.client(false).unwrap();
    let o = a
        .start(Request::Put {
            key: b"k".to_vec(),
            value: vec![0; 65],
        })
        .unwrap();
    assert!(matches!(o.result, Err(crate::CloverError::TooLong { .. })));
}

/// Two writers race on one key: both write, then both CAS the same tail.
fn race(interposed: bool) -> (AnyClient, AnyClient, Cluster) {
    let mut cl = cluster(Config::default());
    let mut a = cl.client(interposed).unwrap();
    let mut b = cl.client(interposed).unwrap();
    put(&mut a, "k", "v0");
    put(&mut b, "k", "v1"); // b knows the tail, a's cache is stale
    put(&mut a, "k", "v2"); // a's CAS misses (walk natively, redirected interposed)
    (a, b, cl)
}

#[test]
fn native_a_stale_cas_fails_and_the_writer_walks() {
    let (a, mut b, cl) = race(false);
    assert_eq!(a.stats().cas_failed, 1);
    assert!(a.stats().walk_steps >= 1);
    assert_eq!(get(&mut b, "k").as_deref(), Some(&b"v2"[..]));
    assert_eq!(cl.switch.stats().cas_redirected, 0);
}

#[test]
fn interposed_a_stale_cas_is_redirected_and_succeeds_first_time() {
    let (a, mut b, cl) = race(true);
    assert_eq!(a.stats().cas_failed, 0, "{:?}", a.stats());
    assert_eq!(
        cl.switch.stats().cas_redirected,
        1,
        "{:?}",
        cl.switch.stats()
    );
    assert_eq!(get(&mut b, "k").as_deref(), Some(&b"v2"[..]));
    // The backups were linked after the true predecessor.
    let key_id = cl.ms.lookup(b"k").unwrap().key_id;
    let backup: Vec<_> = cl
        .ms
        .chain_on(1, key_id)
        .unwrap()
        .into_iter()
        .map(|x| x.1)
        .collect();
    assert_eq!(backup.last().unwrap(), b"v2");
    assert_eq!(backup.len(), 4);
}

#[test]
fn interleaved_writers_conflict_natively_and_not_through_the_switch() {
    for interposed in [false, true] {
        let mut cl = cluster(Config {
            gc_every_reports: 0,
            ..Config::default()
        });
        let mut cs: Vec<AnyClient> = (0..4).map(|_| cl.client(interposed).unwrap()).collect();
        put(&mut cs[0], "k", "init");
        for c in cs.iter_mut() {
            assert_eq!(get(c, "k").as_deref(), Some(&b"init"[..]));
        }
        // The GETs connected the clients (each connection resets the switch):
        // one successful CAS through it teaches it the key's tail again.
        put(&mut cs[0], "k", "init2");
        for c in cs.iter_mut() {
            assert_eq!(get(c, "k").as_deref(), Some(&b"init2"[..]));
        }
        let cas_failed_before: u64 = cs.iter().map(|c| c.stats().cas_failed).sum();
        // Every client writes its version, then every client CASes: one round each.
        for round in 0..5 {
            let mut done = 0;
            for (i, c) in cs.iter_mut().enumerate() {
                assert!(c
                    .start(Request::Put {
                        key: b"k".to_vec(),
                        value: format!("{round}-{i}").into_bytes(),
                    })
                    .is_none());
            }
            while done < cs.len() {
                for c in cs.iter_mut() {
                    if !c.is_idle() {
                        if let Some(o) = c.poll() {
                            o.result.unwrap();
                            done += 1;
                        }
                    }
                }
            }
        }
        let failed: u64 = cs.iter().map(|c| c.stats().cas_failed).sum::<u64>() - cas_failed_before;
        if interposed {
            assert_eq!(failed, 0, "the switch resolves every conflict");
            assert!(cl.switch.stats().cas_redirected > 0);
        } else {
            assert!(failed > 0, "native writers conflict");
        }
        // Every writer's version is in the chain once, on every replica.
        let key_id = cl.ms.lookup(b"k").unwrap().key_id;
        let primary: Vec<_> = cl.ms.chain_on(0, key_id).unwrap();
        let backup: Vec<_> = cl.ms.chain_on(1, key_id).unwrap();
        assert_eq!(primary, backup);
        let versions = primary.len() - 3; // head, "init" and "init2"
        assert_eq!(versions, 20, "4 writers x 5 rounds, each once");
    }
}

#[test]
fn the_switch_falls_back_when_its_state_is_dropped_or_wrong() {
    let mut cl = cluster(Config::default());
    let mut a = cl.client(true).unwrap();
    let mut b = cl.client(true).unwrap();
    put(&mut a, "k", "v0");
    put(&mut b, "k", "v1");
    cl.switch.reset();
    put(&mut a, "k", "v2"); // no state: native behaviour, a walks
    assert_eq!(a.stats().cas_failed, 1);
    // A native writer the switch does not see makes its tail wrong.
    let mut n = cl.client(false).unwrap();
    put(&mut n, "k", "v3");
    put(&mut b, "k", "v4"); // redirected to v2's slot: fails, switch resets
    assert!(
        cl.switch.stats().cas_vouched_failed >= 1,
        "{:?}",
        cl.switch.stats()
    );
    assert_eq!(get(&mut a, "k").as_deref(), Some(&b"v4"[..]));
    let key_id = cl.ms.lookup(b"k").unwrap().key_id;
    let values: Vec<_> = cl
        .ms
        .chain_on(0, key_id)
        .unwrap()
        .into_iter()
        .map(|x| x.1)
        .collect();
    assert_eq!(values.len(), 6, "each version once: {values:?}");
}

#[test]
fn gc_frees_old_versions_and_reused_slots_are_never_mistaken() {
    let mut cl = cluster(Config {
        slots: 64,
        chunk_slots: 2,
        versions_kept: 2,
        gc_every_reports: 3,
        ..Config::default()
    });
    let mut a = cl.client(true).unwrap();
    let mut b = cl.client(false).unwrap();
    for i in 0..200 {
        put(&mut a, "x", &format!("a{i}"));
        put(&mut b, "y", &format!("b{i}"));
        // b's cached tail of x ages and its slot is reused.
        assert_eq!(get(&mut b, "x").unwrap(), format!("a{i}").into_bytes());
        if i % 7 == 0 {
            assert_eq!(get(&mut a, "y").unwrap(), format!("b{i}").into_bytes());
        }
    }
    assert!(cl.ms.stats().gc_freed > 100, "{:?}", cl.ms.stats());
    let key_id = cl.ms.lookup(b"x").unwrap().key_id;
    assert!(cl.ms.chain_on(0, key_id).unwrap().len() <= 6);
}

#[test]
fn an_acknowledged_put_survives_a_power_failure_of_every_node() {
    let mut cl = cluster(Config {
        flush_with_cas: false,
        ..Config::default()
    });
    let mut a = cl.client(true).unwrap();
    for i in 0..20 {
        put(&mut a, "k", &format!("v{i}"));
    }
    for i in 0..2 {
        cl.crash(i, PowerFailure::DropAll);
    }
    for i in 0..2 {
        cl.restart(i).unwrap();
    }
    let mut fresh = cl.client(false).unwrap();
    assert_eq!(get(&mut fresh, "k").as_deref(), Some(&b"v19"[..]));
    // The old client reconnects and goes on.
    put(&mut a, "k", "after");
    assert_eq!(get(&mut fresh, "k").as_deref(), Some(&b"after"[..]));
    assert!(a.stats().reconnects >= 2);
}

#[test]
fn a_crash_between_cas_and_drain_is_resolved_by_the_writer() {
    let mut cl = cluster(Config {
        flush_with_cas: false,
        ..Config::default()
    });
    let mut a = cl.client(false).unwrap();
    put(&mut a, "k", "v0");
    assert!(a
        .start(Request::Put {
            key: b"k".to_vec(),
            value: b"v1".to_vec(),
        })
        .is_none());
    for _ in 0..4 {
        // post WRITEs, take them, post CAS, take it: the FLUSH is next.
        assert!(a.poll().is_none());
    }
    // The CAS landed, the drain has not: the link is lost.
    cl.crash(0, PowerFailure::DropAll);
    for _ in 0..5 {
        assert!(a.poll().is_none(), "the writer waits for the node");
    }
    cl.restart(0).unwrap();
    let mut out = None;
    for _ in 0..100 {
        if let Some(o) = a.poll() {
            out = Some(o);
            break;
        }
    }
    out.unwrap().result.unwrap();
    assert_eq!(a.stats().unknown_resolved, 1);
    let mut fresh = cl.client(false).unwrap();
    assert_eq!(get(&mut fresh, "k").as_deref(), Some(&b"v1"[..]));
    let key_id = cl.ms.lookup(b"k").unwrap().key_id;
    assert_eq!(
        cl.ms.chain_on(0, key_id).unwrap().len(),
        3,
        "v1 appended once"
    );
}

#[test]
fn a_put_redirected_behind_a_failing_append_waits_then_appends_itself() {
    let mut cl = cluster(Config::default());
    let mut a = cl.client(true).unwrap();
    let mut b = cl.client(true).unwrap();
    put(&mut a, "k", "v0");
    put(&mut b, "k", "v1"); // a's cached tail (v0) is stale now
                            // The switch learned v1 from b's successful CAS. A native writer it does
                            // not see appends v2: the switch's tail is wrong now.
    let mut n = cl.client(false).unwrap();
    put(&mut n, "k", "v2");
    for (c, v) in [(&mut a, "va"), (&mut b, "vb")] {
        assert!(c
            .start(Request::Put {
                key: b"k".to_vec(),
                value: v.into(),
            })
            .is_none());
        assert!(c.poll().is_none()); // post the WRITEs
        assert!(c.poll().is_none()); // take them
    }
    // a's CAS at stale v0 is redirected to v1, the switch's wrong tail (it
    // fails there: v1 links v2), and va becomes the switch's tail.
    assert!(a.poll().is_none());
    // b's CAS at v1 is redirected behind va, which is not linked.
    assert!(b.poll().is_none());
    assert_eq!(cl.switch.stats().cas_redirected, 2);
    let key_id = cl.ms.lookup(b"k").unwrap().key_id;
    let chain = |cl: &Cluster| -> Vec<Vec<u8>> {
        cl.ms
            .chain_on(0, key_id)
            .unwrap()
            .into_iter()
            .map(|x| x.1)
            .collect()
    };
    // vb hangs off va, which is not in the chain: b must not acknowledge yet.
    for _ in 0..4 {
        assert!(
            b.poll().is_none(),
            "b must not acknowledge behind unlinked va"
        );
    }
    // b waits for va's mark; it does not come (a is stalled), so b looks from
    // the head, finds vb detached and appends it again on its own.
    let mut b_done = false;
    for _ in 0..200 {
        if let Some(o) = b.poll() {
            o.result.unwrap();
            b_done = true;
            break;
        }
    }
    assert!(b_done);
    assert!(chain(&cl).contains(&b"vb".to_vec()), "{:?}", chain(&cl));
    assert!(b.stats().walk_steps >= 1, "{:?}", b.stats());
    // a learns its CAS failed (the switch resets), walks, appends va.
    let mut a_done = false;
    for _ in 0..200 {
        if let Some(o) = a.poll() {
            o.result.unwrap();
            a_done = true;
            break;
        }
    }
    assert!(a_done);
    assert!(cl.switch.stats().cas_vouched_failed >= 1);
    assert_eq!(get(&mut b, "k").as_deref(), Some(&b"va"[..]));
    // Each version once, no cycle, the same on the backup.
    assert_eq!(
        chain(&cl),
        vec![
            b"".to_vec(),
            b"v0".to_vec(),
            b"v1".to_vec(),
            b"v2".to_vec(),
            b"vb".to_vec(),
            b"va".to_vec()
        ]
    );
    let backup: Vec<_> = cl
        .ms
        .chain_on(1, key_id)
        .unwrap()
        .into_iter()
        .map(|x| x.1)
        .collect();
    assert_eq!(backup, chain(&cl));
}

#[test]
fn after_a_reset_the_switch_learns_a_tail_only_from_a_successful_cas() {
    let mut cl = cluster(Config::default());
    let mut a = cl.client(true).unwrap();
    let mut b = cl.client(true).unwrap();
    put(&mut a, "k", "v0");
    put(&mut b, "k", "v1"); // a's cached tail (v0) is stale now
    cl.switch.reset();
    let before = cl.switch.stats();
    // a's CAS aims at stale v0. The switch, knowing nothing, lets it fail
    // natively (it does not vouch for a guess), then learns the tail from a's
    // CAS after its walk, which succeeds.
    put(&mut a, "k", "v2");
    let after = cl.switch.stats();
    assert_eq!(a.stats().cas_failed, 1, "{:?}", a.stats());
    assert_eq!(
        after.cas_vouched_failed, before.cas_vouched_failed,
        "{after:?}"
    );
    assert_eq!(
        after.resets, before.resets,
        "no reset follows a reset: {after:?}"
    );
    assert_eq!(after.tails_learned, before.tails_learned + 1, "{after:?}");
    assert_eq!(cl.switch.keys_cached(), 1);
    // What it learned is right: b's stale CAS (at v1) is redirected to v2.
    let b_failed = b.stats().cas_failed;
    put(&mut b, "k", "v3");
    assert_eq!(b.stats().cas_failed, b_failed);
    assert_eq!(cl.switch.stats().cas_redirected, after.cas_redirected + 1);
    assert_eq!(get(&mut a, "k").as_deref(), Some(&b"v3"[..]));
}
