//! The WRITE strategies' replicators (`rwrite`, `batch`, `share`) against a
//! backup the test plays by hand, on the loopback fabric with a manual clock:
//! every hand-over gets exactly one outcome whatever happens to the grant
//! exchange, a failed WRITE does not stall the queue pair it failed on, and a
//! segment is sealed only once the WRITEs into it have completed.

use std::sync::Arc;

use rowankv_fabric::{
    Access, CqKind, DramMemory, Fabric, FaultInjector, LoopbackFabric, LoopbackNic, Nic, QueuePair,
    RegionMemory,
};
use rowankv_rpc::endpoint::{connect_pair, Endpoint, EndpointConfig, Event, PeerId};
use rowankv_types::{ManualClock, NodeId, Term};
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Response};

use super::{
    BatchConfig, Outcomes, RemoteLogTarget, ReplCtx, Replicator, RwriteReplicator, ShareReplicator,
    SharedLog, Strategy,
};

const P: NodeId = NodeId(0);
const B: NodeId = NodeId(1);
const TIMEOUT_NS: u64 = 1_000_000;
const SEGMENT_BYTES: u64 = 1024;
const STRATEGIES: [Strategy; 3] = [Strategy::Rwrite, Strategy::Batch, Strategy::Share];
/// Long enough for a batch to be flushed and a shared chain to be checked.
const STEP_NS: u64 = 200_000;

/// A primary's replicator with one backup, `B`, whose worker the test plays.
struct Rig {
    fabric: LoopbackFabric,
    clock: Arc<ManualClock>,
    ep: Endpoint<LoopbackNic>,
    repl: Box<dyn Replicator<LoopbackNic>>,
    out: Outcomes,
    /// The backup's worker endpoint, and the primary as it sees it.
    backup: Endpoint<LoopbackNic>,
    primary_peer: PeerId,
    /// The backup's data area (segment `s` at `s * SEGMENT_BYTES`).
    memory: Arc<DramMemory>,
    /// The backup's end of the WRITE queue pair.
    passive: <LoopbackNic as Nic>::Qp,
    /// `share`: the log the replicator's server shares.
    shared: Option<Arc<SharedLog>>,
    _passive_cq: <LoopbackNic as Nic>::Cq,
    target_qp: rowankv_fabric::QpAddr,
}

/// A grant request as the backup received it: id, seal.
type GrantRequest = (u64, Option<u32>);

impl Rig {
    fn new(strategy: Strategy) -> Rig {
        let clock = ManualClock::new();
        clock.advance_ns(1_000_000);
        let fabric = LoopbackFabric::with_clock(clock.clone());
        let (pn, bn) = (fabric.attach(P).unwrap(), fabric.attach(B).unwrap());
        let mut ep = Endpoint::new(pn.clone(), EndpointConfig::default()).unwrap();
        let mut backup = Endpoint::new(bn.clone(), EndpointConfig::default()).unwrap();
        let (backup_peer, primary_peer) = connect_pair(&mut ep, &mut backup).unwrap();
        let memory = Arc::new(DramMemory::new(16 * SEGMENT_BYTES as usize));
        let mem: Arc<dyn RegionMemory> = memory.clone();
        let region = bn
            .register(mem, 0, 16 * SEGMENT_BYTES as usize, Access::REMOTE_WRITE)
            .unwrap();
        let qp = pn.create_qp(ep.cq(), ep.cq(), None, 64).unwrap();
        let passive_cq = bn.create_cq(CqKind::Ring { capacity: 64 }).unwrap();
        let passive = bn.create_qp(&passive_cq, &passive_cq, None, 16).unwrap();
        qp.connect(passive.addr()).unwrap();
        passive.connect(qp.addr()).unwrap();
        let target_qp = qp.addr();
        let target = RemoteLogTarget {
            qp,
            region: region.remote(),
            peer: backup_peer,
            log: 5,
        };
        let shared = (strategy == Strategy::Share).then(SharedLog::new);
        let repl: Box<dyn Replicator<LoopbackNic>> = match strategy {
            Strategy::Share => Box::new(ShareReplicator::new(
                [(B, (shared.clone().expect("share"), target))]
                    .into_iter()
                    .collect(),
                TIMEOUT_NS,
            )),
            Strategy::Batch => Box::new(RwriteReplicator::new(
                [(B, target)].into_iter().collect(),
                Some(BatchConfig::default()),
                TIMEOUT_NS,
            )),
            _ => Box::new(RwriteReplicator::new(
                [(B, target)].into_iter().collect(),
                None,
                TIMEOUT_NS,
            )),
        };
        Rig {
            fabric,
            clock,
            ep,
            repl,
            out: Outcomes::default(),
            backup,
            primary_peer,
            memory,
            passive,
            shared,
            _passive_cq: passive_cq,
            target_qp,
        }
    }

    fn now(&self) -> u64 {
        rowankv_types::Clock::now_ns(&*self.clock)
    }

    fn env(&self) -> Envelope {
        Envelope {
            cluster_id: 1,
            term: Term(1),
            request_id: 0,
            sender: P,
        }
    }

    fn replicate(&mut self, token: u64, entry: &[u8]) {
        let env = self.env();
        let now = self.now();
        let mut cx = ReplCtx {
            ep: &mut self.ep,
            env,
            now_ns: now,
        };
        self.repl.replicate(&mut cx, B, entry, token);
    }

    /// Let `ns` pass, then what a worker's step does: poll, then tick.
    fn step(&mut self, ns: u64) {
        self.clock.advance_ns(ns);
        let env = self.env();
        let now = self.now();
        let (mut events, mut data) = (Vec::new(), Vec::new());
        self.ep.poll(&mut events, &mut data).unwrap();
        let mut cx = ReplCtx {
            ep: &mut self.ep,
            env,
            now_ns: now,
        };
        for ev in events {
            match ev {
                Event::Message { peer, start, len } => {
                    let f = frame::decode(&data[start..start + len]).unwrap();
                    let Body::Response(r) = f.body else {
                        panic!("the primary was sent a request")
                    };
                    self.repl
                        .on_response(&mut cx, peer, f.header.request_id, &r, &mut self.out);
                }
                Event::Owner(c) => self.repl.on_completion(&mut cx, &c, &mut self.out),
                Event::SendFailed { peer, .. } => {
                    self.repl.on_send_failed(&mut cx, peer, &mut self.out)
                }
            }
        }
        self.repl.tick(&mut cx, &mut self.out);
    }

    /// The grant requests the backup has received since it last looked.
    fn grant_requests(&mut self) -> Vec<GrantRequest> {
        let (mut events, mut data) = (Vec::new(), Vec::new());
        self.backup.poll(&mut events, &mut data).unwrap();
        let mut found = Vec::new();
        for ev in events {
            if let Event::Message { start, len, .. } = ev {
                let f = frame::decode(&data[start..start + len]).unwrap();
                match f.body {
                    Body::GrantSegment { sealed, .. } => found.push((f.header.request_id, sealed)),
                    other => panic!("the backup was sent {other:?}"),
                }
            }
        }
        found
    }

    /// Answer grant request `id`.
    fn answer(&mut self, id: u64, response: Response<'_>) {
        let env = Envelope {
            request_id: id,
            sender: B,
            ..self.env()
        };
        self.backup
            .respond(self.primary_peer, &env, &Body::Response(response))
            .unwrap();
    }

    fn grant(&mut self, id: u64, segment: u32) {
        self.answer(
            id,
            Response::Segment {
                segment,
                offset: u64::from(segment) * SEGMENT_BYTES,
                len_bytes: SEGMENT_BYTES,
            },
        );
    }

    /// Answer every request the backup has with a fresh segment, from `next`.
    fn grant_all(&mut self, next: &mut u32) -> Vec<GrantRequest> {
        let requests = self.grant_requests();
        for &(id, _) in &requests {
            self.grant(id, *next);
            *next += 1;
        }
        requests
    }

    /// The outcomes so far, taken.
    fn outcomes(&mut self) -> (Vec<u64>, Vec<u64>) {
        let acked = std::mem::take(&mut self.out.acked);
        let failed = std::mem::take(&mut self.out.failed);
        (acked, failed.into_iter().map(|(t, _)| t).collect())
    }

    fn landed(&self, segment: u32, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.memory
            .dma_read(segment as usize * SEGMENT_BYTES as usize, &mut b);
        b
    }
}

fn entry(byte: u8, len: usize) -> Vec<u8> {
    vec![byte; len]
}

#[test]
fn an_entry_waiting_for_a_segment_that_never_comes_fails_after_the_timeout() {
    for strategy in STRATEGIES {
        let mut rig = Rig::new(strategy);
        rig.replicate(7, &entry(1, 64));
        rig.step(STEP_NS);
        let first = rig.grant_requests();
        assert!(!first.is_empty(), "{strategy}: no segment asked for");
        // Not answered. Nothing is decided before the timeout...
        rig.step(TIMEOUT_NS - 2 * STEP_NS);
        assert_eq!(rig.outcomes(), (vec![], vec![]), "{strategy}");
        // ...and the entry fails once it has passed.
        rig.step(2 * STEP_NS);
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![], vec![7]), "{strategy}");
        assert!(
            !rig.grant_requests().is_empty(),
            "{strategy}: the unanswered request was not sent again"
        );
    }
}

#[test]
fn a_refused_segment_request_fails_the_entries_waiting_for_it() {
    for strategy in STRATEGIES {
        let mut rig = Rig::new(strategy);
        rig.replicate(7, &entry(1, 64));
        rig.step(STEP_NS);
        let requests = rig.grant_requests();
        assert_eq!(requests.len(), 1, "{strategy}: one request at a time");
        rig.answer(
            requests[0].0,
            Response::Error {
                code: ErrorCode::OutOfSpace,
                term: Term(1),
                detail: "no free segment",
            },
        );
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![], vec![7]), "{strategy}");
    }
}

#[test]
fn a_segment_request_whose_connection_failed_is_sent_again() {
    for strategy in STRATEGIES {
        let mut rig = Rig::new(strategy);
        rig.fabric.cut_link(P, B);
        rig.replicate(7, &entry(1, 64));
        // The request goes, its SEND fails, the failure is reported (once: a
        // second failure before an answer would give the path up, below).
        rig.step(STEP_NS);
        rig.fabric.heal_link(P, B);
        assert!(
            rig.grant_requests().is_empty(),
            "{strategy}: sent on a cut link"
        );
        let mut next = 1;
        let mut again = Vec::new();
        for _ in 0..3 {
            rig.step(STEP_NS);
            again.extend(rig.grant_all(&mut next));
        }
        assert!(
            !again.is_empty(),
            "{strategy}: the lost request was not sent again"
        );
        rig.step(STEP_NS);
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![7], vec![]), "{strategy}");
        assert_eq!(rig.landed(1, 64), entry(1, 64), "{strategy}");
    }
}

/// A path whose grant connection fails again after its reset, before any
/// answer (a cut that lasts, or a backup that restarted), is given up: what
/// waits for it fails, and the replicator has no path to the backup any more,
/// so the next entry dials anew (`OnDemand`).
#[test]
fn a_segment_request_connection_that_fails_again_gives_the_path_up() {
    for strategy in STRATEGIES {
        let mut rig = Rig::new(strategy);
        rig.fabric.cut_link(P, B);
        rig.replicate(7, &entry(1, 64));
        let mut steps = 0;
        while rig.repl.connected(B) {
            rig.step(STEP_NS);
            steps += 1;
            assert!(steps < 10_000, "{strategy}: the path was never given up");
        }
        rig.step(STEP_NS);
        let (acked, failed) = rig.outcomes();
        assert_eq!((acked, failed), (vec![], vec![7]), "{strategy}");
    }
}

/// A grant request refused because the backup ended the log (`UnknownLog`:
/// another path of this server arrived there) or because the log holds as
/// many unsealed segments as it may (`Busy`) gives the path up: what waits
/// fails, and the next entry dials anew and gets a new log. Under `share`, a
/// WRITE under way on the given-up path, which may still land, never lets its
/// segment be sealed through the shared chain (the backup seals it once the
/// new path has closed the old one).
#[test]
fn a_refused_log_gives_the_path_up_and_its_writes_under_way_seal_nothing() {
    for code in [ErrorCode::UnknownLog, ErrorCode::Busy] {
        for strategy in STRATEGIES {
            let mut rig = Rig::new(strategy);
            let mut next = 1;
            rig.step(STEP_NS);
            rig.grant_all(&mut next); // segment 1
            rig.replicate(0, &entry(9, 64));
            for _ in 0..2 {
                rig.step(STEP_NS);
                rig.grant_all(&mut next); // segment 2, spare
            }
            rig.step(STEP_NS);
            assert_eq!(rig.outcomes(), (vec![0], vec![]), "{strategy}");
            // The last entry of segment 1 is held on the link; the next one
            // retires segment 1 and asks for a spare.
            rig.fabric.set_delay_ns(P, B, 50 * STEP_NS);
            rig.replicate(1, &entry(1, SEGMENT_BYTES as usize - 64));
            rig.step(STEP_NS);
            rig.fabric.set_delay_ns(P, B, 0);
            rig.replicate(2, &entry(2, SEGMENT_BYTES as usize - 64));
            rig.replicate(3, &entry(3, SEGMENT_BYTES as usize - 64));
            let mut requests = Vec::new();
            for _ in 0..3 {
                rig.step(STEP_NS);
                requests.extend(rig.grant_requests());
            }
            assert!(!requests.is_empty(), "{strategy}: no spare asked for");
            let why = format!("{code}");
            for (id, _) in requests {
                rig.answer(
                    id,
                    Response::Error {
                        code,
                        term: Term(1),
                        detail: &why,
                    },
                );
            }
            rig.step(STEP_NS);
            assert!(
                !rig.repl.connected(B),
                "{strategy}, {code}: the path goes on"
            );
            rig.step(50 * STEP_NS);
            rig.step(STEP_NS);
            let (acked, mut failed) = rig.outcomes();
            failed.sort_unstable();
            assert!(
                acked.is_empty() || acked == [2],
                "{strategy}, {code}: {acked:?}"
            );
            assert!(
                failed.contains(&1) && failed.contains(&3),
                "{strategy}, {code}: {failed:?}"
            );
            if let Some(shared) = &rig.shared {
                assert_eq!(
                    shared.sealable(),
                    Vec::<u32>::new(),
                    "{strategy}, {code}: a segment a given-up WRITE went to may be sealed"
                );
            }
        }
    }
}

#[test]
fn a_failed_remote_log_write_does_not_stall_the_queue_pair_it_failed_on() {
    for strategy in STRATEGIES {
        let mut rig = Rig::new(strategy);
        let mut next = 1;
        rig.step(STEP_NS);
        rig.grant_all(&mut next);
        rig.step(STEP_NS);
        rig.fabric.cut_link(P, B);
        rig.replicate(1, &entry(1, 64));
        rig.step(STEP_NS);
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![], vec![1]), "{strategy}");
        rig.fabric.heal_link(P, B);
        rig.replicate(2, &entry(2, 64));
        rig.step(STEP_NS);
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![2], vec![]), "{strategy}");
        // Past the hole the failed WRITE left.
        assert_eq!(
            rig.landed(1, 128),
            [entry(0, 64), entry(2, 64)].concat(),
            "{strategy}"
        );
    }
}

#[test]
fn a_filled_segment_is_sealed_only_after_the_writes_into_it_complete() {
    for strategy in STRATEGIES {
        let mut rig = Rig::new(strategy);
        let mut next = 1;
        rig.step(STEP_NS);
        rig.grant_all(&mut next); // segment 1
        rig.replicate(0, &entry(9, 64)); // segment 1 current, a spare asked for
        for _ in 0..2 {
            rig.step(STEP_NS);
            rig.grant_all(&mut next); // segment 2, spare
        }
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![0], vec![]), "{strategy}");
        // The last entry of segment 1 is held on the link.
        rig.fabric.set_delay_ns(P, B, 50 * STEP_NS);
        rig.replicate(1, &entry(1, SEGMENT_BYTES as usize - 64));
        rig.step(STEP_NS);
        rig.fabric.set_delay_ns(P, B, 0);
        // The next entry does not fit: segment 1 retires, segment 2 takes over,
        // and a spare is asked for — without sealing segment 1 yet.
        rig.replicate(2, &entry(2, 64));
        for _ in 0..3 {
            rig.step(STEP_NS);
            for (_, sealed) in rig.grant_all(&mut next) {
                assert_eq!(
                    sealed, None,
                    "{strategy}: segment 1 sealed with a WRITE into it held"
                );
            }
        }
        // The held WRITE lands (the one behind it on the queue pair too); the
        // next request seals segment 1.
        rig.step(50 * STEP_NS);
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![1, 2], vec![]), "{strategy}");
        assert_eq!(
            rig.landed(1, SEGMENT_BYTES as usize),
            [entry(9, 64), entry(1, SEGMENT_BYTES as usize - 64)].concat(),
            "{strategy}"
        );
        let mut seals = Vec::new();
        for _ in 0..3 {
            rig.step(STEP_NS);
            seals.extend(rig.grant_all(&mut next).into_iter().filter_map(|(_, s)| s));
        }
        assert_eq!(
            seals,
            vec![1],
            "{strategy}: segment 1 sealed once, after its WRITEs"
        );
    }
}

/// The fence at the backup: once it destroyed its end of the primary's WRITE
/// queue pair (the primary was removed), nothing the primary writes lands,
/// WRITEs a link delay held from before included, and each gets a failure.
#[test]
fn writes_of_a_sender_whose_queue_pair_the_backup_destroyed_fail_and_never_land() {
    for strategy in STRATEGIES {
        let mut rig = Rig::new(strategy);
        let mut next = 1;
        rig.step(STEP_NS);
        rig.grant_all(&mut next);
        rig.step(STEP_NS);
        rig.fabric.set_delay_ns(P, B, 10 * STEP_NS);
        rig.replicate(1, &entry(1, 64));
        rig.step(STEP_NS);
        assert_eq!(rig.passive.peer(), Some(rig.target_qp));
        rig.passive.close();
        rig.step(10 * STEP_NS);
        rig.fabric.set_delay_ns(P, B, 0);
        rig.replicate(2, &entry(2, 64));
        rig.step(STEP_NS);
        rig.step(STEP_NS);
        assert_eq!(rig.outcomes(), (vec![], vec![1, 2]), "{strategy}");
        assert_eq!(
            rig.landed(1, 128),
            entry(0, 128),
            "{strategy}: landed after the fence"
        );
    }
}
