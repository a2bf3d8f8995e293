//! What the durable RPC tests share: a counting operator whose double execution is
//! visible, a small geometry that wraps its rings, set-up, and a driver loop.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use rowankv_drpc::{
    ConnId, DrpcError, Effect, Event, FlowConfig, NotNow, Operator, Receiver, RecoveryReport,
    Request, RingGeometry, Sender, StateView, StateWrite, Variant,
};
use rowankv_fabric::Fabric;
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_types::NodeId;

pub const SENDER: NodeId = NodeId(1);
pub const RECEIVER: NodeId = NodeId(2);
/// Add one to counter `i` (payload: `i` as 8 bytes, then filler).
pub const OP_INCREMENT: u16 = 1;
/// Bound on driver rounds (each a sender and a receiver poll).
pub const ROUNDS_MAX: usize = 20_000_000;

/// Counter `i` lives at state offset `8 * i`. Incrementing is not idempotent, so a
/// request executed twice leaves a 2.
pub struct Counters;

impl Operator for Counters {
    fn execute(&mut self, state: &StateView<'_>, request: &Request<'_>) -> Result<Effect, NotNow> {
        Ok(increment(state, request))
    }
}

fn increment(state: &StateView<'_>, request: &Request<'_>) -> Effect {
    {
        if request.op != OP_INCREMENT || request.payload.len() < 8 {
            return Effect {
                writes: Vec::new(),
                reply: b"bad request".to_vec(),
            };
        }
        let i = u64::from_le_bytes(request.payload[..8].try_into().unwrap()) as usize;
        let offset = 8 * i;
        if offset + 8 > state.len_bytes() {
            return Effect {
                writes: Vec::new(),
                reply: b"out of range".to_vec(),
            };
        }
        let v = state.read_u64(offset) + 1;
        Effect {
            writes: vec![StateWrite {
                offset,
                bytes: v.to_le_bytes().to_vec(),
            }],
            reply: v.to_le_bytes().to_vec(),
        }
    }
}

/// [`Counters`] that defer every request while `closed` is set (an operator
/// whose store is out of room), counting the deferrals.
pub struct Gated {
    pub closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub deferred: u64,
}

impl Gated {
    pub fn new(closed: bool) -> (Self, std::sync::Arc<std::sync::atomic::AtomicBool>) {
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(closed));
        (
            Gated {
                closed: flag.clone(),
                deferred: 0,
            },
            flag,
        )
    }
}

impl Operator for Gated {
    fn execute(&mut self, state: &StateView<'_>, request: &Request<'_>) -> Result<Effect, NotNow> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            self.deferred += 1;
            return Err(NotNow("the gate is closed".into()));
        }
        Ok(increment(state, request))
    }
}

pub fn geometry() -> RingGeometry {
    RingGeometry {
        connections: 2,
        ring_bytes: 2048,
        chunk_bytes: 512,
        state_bytes: 4096,
        apply_bytes: 512,
        base: 0,
    }
}

pub fn flow() -> FlowConfig {
    FlowConfig {
        inflight_max: 4,
        inflight_slowed_max: 1,
        batch_max: 1,
        slow_down_threshold: 3,
        requests_per_poll_max: 2,
        reply_bytes_max: 64,
    }
}

/// Request `i`'s payload: its counter index and a filler of varying length, so that
/// entries take from 64 to 448 bytes and the rings wrap and skip chunk tails.
pub fn payload(i: u64) -> Vec<u8> {
    let filler = (i as usize * 53) % 360;
    let mut p = i.to_le_bytes().to_vec();
    p.extend((0..filler).map(|k| (k as u8) ^ (i as u8)));
    p
}

pub fn counter(r: &Receiver<impl rowankv_fabric::Nic, Counters>, i: u64) -> u64 {
    let mut b = [0u8; 8];
    r.read_state(8 * i as usize, &mut b);
    u64::from_le_bytes(b)
}

pub fn formatted_pool(opts: PoolOptions) -> Arc<Pool> {
    let g = geometry();
    let pool = Pool::anonymous(g.pool_bytes(), opts).unwrap();
    Receiver::<rowankv_fabric::LoopbackNic, Counters>::format(&pool, g).unwrap();
    pool
}

/// Opens (recovers) `pool` on `fabric`'s receiver node and connects a sender on
/// connection `conn`.
pub fn connect<F: Fabric>(
    fabric: &F,
    pool: Arc<Pool>,
    variant: Variant,
    flow: FlowConfig,
    conn: ConnId,
) -> (Receiver<F::Nic, Counters>, Sender<F::Nic>, RecoveryReport) {
    let nic_r = fabric.attach(RECEIVER).unwrap();
    let nic_s = fabric.attach(SENDER).unwrap();
    let (mut receiver, report) = Receiver::open(pool, nic_r, flow, Counters).unwrap();
    let mut sender = Sender::new(&nic_s, variant, flow).unwrap();
    let offer = receiver.accept(conn, variant, sender.qp_addr()).unwrap();
    sender.connect(&offer).unwrap();
    (receiver, sender, report)
}

/// What the sender saw of each request: (durable, completed reply).
#[derive(Debug, Default)]
pub struct Seen {
    pub durable: Vec<u64>,
    pub completed: BTreeMap<u64, Vec<u8>>,
    pub order: Vec<Event>,
}

/// Sends `requests` (counter indexes) in order, polling both ends until every one
/// completed. `on_event` sees each event as it is reported.
pub fn drive<N: rowankv_fabric::Nic>(
    receiver: &mut Receiver<N, Counters>,
    sender: &mut Sender<N>,
    requests: &[u64],
    mut on_event: impl FnMut(&Event),
) -> Seen {
    let mut seen = Seen::default();
    let mut next = 0;
    let mut events = Vec::new();
    for _ in 0..ROUNDS_MAX {
        while next < requests.len() {
            let i = requests[next];
            match sender.call(OP_INCREMENT, &payload(i)) {
                Ok(_) => next += 1,
                Err(DrpcError::WouldBlock) => break,
                Err(e) => panic!("call: {e}"),
            }
        }
        match sender.flush() {
            Ok(()) | Err(DrpcError::WouldBlock) => {}
            Err(e) => panic!("flush: {e}"),
        }
        receiver.poll().unwrap();
        events.clear();
        sender.poll(&mut events).unwrap();
        for e in &events {
            on_event(e);
            match e {
                Event::Durable { seq } => seen.durable.push(*seq),
                Event::Completed { seq, reply } => {
                    assert!(
                        seen.completed.insert(*seq, reply.clone()).is_none(),
                        "request {seq} completed twice"
                    );
                }
            }
            seen.order.push(e.clone());
        }
        if next == requests.len() && seen.completed.len() == requests.len() {
            return seen;
        }
        std::thread::yield_now();
    }
    panic!(
        "requests not completed after {ROUNDS_MAX} rounds: {} of {} completed",
        seen.completed.len(),
        requests.len()
    );
}
