//! The seven classic designs on the loopback fabric: many requests of 32 B, 1 KiB
//! and 64 KiB from concurrent clients answered right; the counters each message
//! pattern implies; every acknowledged request durable in the receiver's pool at
//! the moment of its acknowledgement (and, as a control, not durable without the
//! receiver's persist); FaSST's MTU; ScaleRPC's groups; the processing delay.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use rowankv_classic_rpc::{
    Client, Design, Handler, Layout, RpcError, ServerConfig, Totals, VerbCounts, HEADER_BYTES,
    RFP_FETCH_BYTES, UD_MTU_BYTES,
};
use rowankv_fabric::{FaultInjector, LoopbackFabric, LoopbackNic, PowerFailure, RegionMemory};
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_types::Clock;

const SIZES: [usize; 3] = [32, 1024, 64 << 10];

/// Each client's sequential calls per size, and the pipelined batch after them.
const CALLS_PER_SIZE: u64 = 10;

fn seed(client: usize, size: usize, i: u64) -> u64 {
    ((client as u64) << 48) | ((size as u64) << 16) | i
}

/// One client's workload: sequential calls of every size, then a full window
/// pipelined with `post`/`poll`; every reply checked.
fn drive(design: Design, id: usize, client: &mut Client<LoopbackNic>, inflight_max: usize) {
    for size in SIZES {
        for i in 0..CALLS_PER_SIZE {
            let request = pattern(seed(id, size, i), size);
            let got = client.call(&request);
            if design == Design::Fasst && HEADER_BYTES + size > UD_MTU_BYTES {
                assert!(
                    matches!(got, Err(RpcError::TooLarge { bytes, .. }) if bytes == size),
                    "{design}: {size} B must be refused, got {got:?}"
                );
                continue;
            }
            let got = got.unwrap_or_else(|e| panic!("{design} client {id}, {size} B #{i}: {e}"));
            assert!(
                got == expected_echo(&request),
                "{design} client {id}: wrong reply to {size} B #{i}"
            );
        }
    }
    let requests: Vec<Vec<u8>> = (0..inflight_max as u64)
        .map(|i| pattern(seed(id, 1, 1000 + i), 100 + i as usize))
        .collect();
    let mut seqs = Vec::new();
    for r in &requests {
        seqs.push(client.post(r).expect("post within the window"));
    }
    assert!(
        matches!(client.post(b"x"), Err(RpcError::WindowFull { .. })),
        "{design}: the window is bounded"
    );
    let mut got = Vec::new();
    while got.len() < requests.len() {
        if let Some(reply) = client.poll().expect("poll") {
            got.push(reply);
        } else {
            std::thread::yield_now();
        }
    }
    for ((reply, seq), request) in got.iter().zip(&seqs).zip(&requests) {
        assert_eq!(reply.seq, *seq, "{design}: replies come in request order");
        assert!(
            reply.data == expected_echo(request),
            "{design}: pipelined reply"
        );
    }
}

fn round_trips_with_concurrent_clients(design: Design) {
    const CLIENTS: usize = 3;
    const INFLIGHT: usize = 3;
    let fabric = LoopbackFabric::new();
    let (server, clients) = rig(
        &fabric,
        design,
        config_64k(CLIENTS, INFLIGHT),
        None,
        CLIENTS,
        echo(),
    );
    let running = server.spawn().expect("spawn");
    let mut clients = clients;
    std::thread::scope(|s| {
        for (id, client) in clients.iter_mut().enumerate() {
            s.spawn(move || drive(design, id, client, INFLIGHT));
        }
    });
    let server = running.stop().expect("server ran without error");
    let stats: Vec<_> = clients.iter().map(|c| c.stats()).collect();
    let totals = Totals::of(&stats, &server.stats());
    let sizes_carried = if design == Design::Fasst { 2 } else { 3 };
    let calls = CLIENTS as u64 * (sizes_carried * CALLS_PER_SIZE + INFLIGHT as u64);
    assert_eq!(totals.calls, calls, "{design}");
    assert_eq!(totals.receiver_requests, calls, "{design}");
    assert_eq!(
        totals.receiver_persists, calls,
        "{design}: one persist per request"
    );
    if design == Design::Fasst {
        let refused: u64 = stats.iter().map(|s| s.refused).sum();
        assert_eq!(refused, CLIENTS as u64 * CALLS_PER_SIZE);
    }
}

#[test]
fn darpc_round_trips_many_requests_from_concurrent_clients() {
    round_trips_with_concurrent_clients(Design::DaRpc);
}

#[test]
fn farm_round_trips_many_requests_from_concurrent_clients() {
    round_trips_with_concurrent_clients(Design::Farm);
}

#[test]
fn fasst_round_trips_many_requests_from_concurrent_clients() {
    round_trips_with_concurrent_clients(Design::Fasst);
}

#[test]
fn l5_round_trips_many_requests_from_concurrent_clients() {
    round_trips_with_concurrent_clients(Design::L5);
}

#[test]
fn rfp_round_trips_many_requests_from_concurrent_clients() {
    round_trips_with_concurrent_clients(Design::Rfp);
}

#[test]
fn octopus_round_trips_many_requests_from_concurrent_clients() {
    round_trips_with_concurrent_clients(Design::Octopus);
}

#[test]
fn scalerpc_round_trips_many_requests_from_concurrent_clients() {
    round_trips_with_concurrent_clients(Design::ScaleRpc);
}

// ---------------------------------------------------------------------------
// Counters

/// What `n` calls of `request_len` B with `reply_len` B replies must count.
struct Expect {
    client: VerbCounts,
    server: VerbCounts,
    round_trips: u64,
    messages: u64,
    bytes_to_client: u64,
    bytes_copied: u64,
    warmups: u64,
}

fn verbs(send: u64, write: u64, write_imm: u64, read: u64) -> VerbCounts {
    VerbCounts {
        send,
        write,
        write_imm,
        read,
    }
}

#[test]
fn counters_are_what_each_message_pattern_says() {
    // 203 calls: ScaleRPC warms up at calls 0, 101 and 202.
    const N: u64 = 203;
    const REQUEST: usize = 100;
    const REPLY: usize = 16;
    let config = ServerConfig {
        clients_max: 1,
        inflight_max: 2,
        request_bytes_max: 4096,
        reply_bytes_max: 4096,
        ..ServerConfig::default()
    };
    let message = (HEADER_BYTES + REQUEST) as u64;
    let reply = (HEADER_BYTES + REPLY) as u64;
    let fetch = RFP_FETCH_BYTES.min(Layout::new(&config).reply_slot_bytes()) as u64;
    let handler: Handler = Arc::new(|_: &[u8]| vec![7u8; REPLY]);
    for design in Design::ALL {
        let e = match design {
            Design::DaRpc | Design::Fasst => Expect {
                client: verbs(N, 0, 0, 0),
                server: verbs(N, 0, 0, 0),
                round_trips: N,
                messages: 2 * N,
                bytes_to_client: N * reply,
                bytes_copied: N * message,
                warmups: 0,
            },
            Design::Farm => Expect {
                client: verbs(0, N, 0, 0),
                server: verbs(0, N, 0, 0),
                round_trips: N,
                messages: 2 * N,
                bytes_to_client: N * reply,
                bytes_copied: 0,
                warmups: 0,
            },
            Design::L5 => Expect {
                client: verbs(0, 2 * N, 0, 0),
                server: verbs(0, N, 0, 0),
                round_trips: N,
                messages: 3 * N,
                bytes_to_client: N * reply,
                bytes_copied: 0,
                warmups: 0,
            },
            Design::Rfp => Expect {
                client: verbs(0, N, 0, N),
                server: verbs(0, 0, 0, 0),
                round_trips: 2 * N,
                messages: 3 * N,
                bytes_to_client: N * fetch,
                bytes_copied: 0,
                warmups: 0,
            },
            Design::Octopus => Expect {
                client: verbs(0, 0, N, 0),
                server: verbs(0, 0, N, 0),
                round_trips: N,
                messages: 2 * N,
                bytes_to_client: N * reply,
                bytes_copied: 0,
                warmups: 0,
            },
            Design::ScaleRpc => Expect {
                client: verbs(0, N, 0, 0),
                server: verbs(0, N, 0, 3),
                round_trips: N + 3,
                messages: 2 * N + 2 * 3,
                bytes_to_client: N * reply,
                bytes_copied: 0,
                warmups: 3,
            },
        };
        let fabric = LoopbackFabric::new();
        let (server, mut clients) = rig(&fabric, design, config, None, 1, handler.clone());
        let running = server.spawn().expect("spawn");
        for i in 0..N {
            let got = clients[0]
                .call(&pattern(i, REQUEST))
                .unwrap_or_else(|e| panic!("{design} call {i}: {e}"));
            assert_eq!(got, vec![7u8; REPLY]);
        }
        let server = running.stop().expect("server");
        let c = clients[0].stats();
        let s = server.stats();
        let t = Totals::of(&[c], &s);
        assert_eq!(t.calls, N, "{design}");
        assert_eq!(t.client_verbs, e.client, "{design}: the client's verbs");
        assert_eq!(t.server_verbs, e.server, "{design}: the server's verbs");
        assert_eq!(t.round_trips, e.round_trips, "{design}: round trips");
        assert_eq!(t.messages, e.messages, "{design}: messages");
        assert_eq!(
            t.bytes_to_server,
            N * message,
            "{design}: every request's bytes reach the server once"
        );
        assert_eq!(t.bytes_to_client, e.bytes_to_client, "{design}: bytes back");
        assert_eq!(t.receiver_requests, N, "{design}: receiver CPU work");
        assert_eq!(t.receiver_persists, N, "{design}: one persist per request");
        assert_eq!(
            s.bytes_persisted,
            N * message,
            "{design}: the whole request"
        );
        assert_eq!(s.bytes_copied, e.bytes_copied, "{design}: receiver copies");
        assert_eq!(s.warmups, e.warmups, "{design}: warm-ups");
        assert_eq!(c.warmup_calls, e.warmups, "{design}: warm-up calls");
        assert_eq!(s.malformed, 0, "{design}");
        assert_eq!(s.group_switches, 0, "{design}: one client is one group");
        if design != Design::Rfp {
            assert_eq!(c.empty_fetches, 0, "{design}");
        }
    }
}

#[test]
fn rfp_fetches_a_long_result_with_a_second_read() {
    const N: u64 = 20;
    let config = config_64k(1, 2);
    let fabric = LoopbackFabric::new();
    let (server, mut clients) = rig(&fabric, Design::Rfp, config, None, 1, echo());
    let running = server.spawn().expect("spawn");
    for i in 0..N {
        let request = pattern(i, 4000);
        assert!(clients[0].call(&request).expect("call") == expected_echo(&request));
    }
    running.stop().expect("server");
    let c = clients[0].stats();
    assert_eq!(c.verbs.read, 2 * N, "a first fetch and the rest");
    assert_eq!(c.round_trips, 3 * N, "the WRITE and two READs");
    assert_eq!(
        c.bytes_to_client,
        N * (HEADER_BYTES + 2 + 4000) as u64,
        "the two READs fetch the result exactly"
    );
}

// ---------------------------------------------------------------------------
// Durability

fn crash_pool(config: &ServerConfig) -> Arc<Pool> {
    Pool::anonymous(
        Layout::new(config).server_bytes(),
        PoolOptions {
            crash_sim: true,
            ..PoolOptions::default()
        },
    )
    .expect("anonymous pool")
}

fn durability_config(persist_requests: bool) -> ServerConfig {
    ServerConfig {
        clients_max: 2,
        inflight_max: 2,
        request_bytes_max: 1024,
        reply_bytes_max: 64,
        persist_requests,
        ..ServerConfig::default()
    }
}

/// Calls from two clients in turn; after each acknowledgement the crash image of
/// the receiver's pool (every unpersisted line lost) must hold the request, or,
/// when the receiver does not persist, must not. Returns the requests.
fn calls_checked_against_crash_images(design: Design, persist: bool) -> Vec<Vec<u8>> {
    const CALLS_PER_CLIENT: u64 = 6;
    let config = durability_config(persist);
    let pool = crash_pool(&config);
    let fabric = LoopbackFabric::new();
    let handler: Handler = Arc::new(|_: &[u8]| b"ack".to_vec());
    let memory: Arc<dyn RegionMemory> = pool.clone();
    let (server, mut clients) = rig(&fabric, design, config, Some(memory), 2, handler);
    let running = server.spawn().expect("spawn");
    let crash = pool.crash().expect("crash simulator");
    let mut requests = Vec::new();
    for i in 0..CALLS_PER_CLIENT {
        for (id, client) in clients.iter_mut().enumerate() {
            let request = pattern(seed(id, 300, i) ^ 0xD00D, 300);
            assert_eq!(client.call(&request).expect("call"), b"ack");
            let image = crash.image(PowerFailure::DropAll);
            assert_eq!(
                contains(&image, &request),
                persist,
                "{design}: acknowledged request {i} of client {id} {} the crash image",
                if persist {
                    "missing from"
                } else {
                    "found in (unpersisted)"
                }
            );
            requests.push(request);
        }
    }
    let server = running.stop().expect("server");
    assert_eq!(
        server.stats().persists,
        if persist { 2 * CALLS_PER_CLIENT } else { 0 }
    );
    if persist {
        // The whole node loses power: the last window of each client is still in
        // the pool (older slots were reused by later requests).
        fabric.power_fail(SERVER, PowerFailure::DropAll);
        let mut after = vec![0u8; pool.len_bytes()];
        pool.read(0, &mut after);
        for request in requests.iter().rev().take(2 * config.inflight_max) {
            assert!(
                contains(&after, request),
                "{design}: a request lost in the power failure"
            );
        }
    }
    requests
}

#[test]
fn every_design_holds_each_acknowledged_request_through_a_power_failure() {
    for design in Design::ALL {
        calls_checked_against_crash_images(design, true);
    }
}

#[test]
fn without_the_receivers_persist_acknowledged_requests_are_lost() {
    // The control: the crash images above can tell a persisted request from one
    // that only landed.
    for design in Design::ALL {
        calls_checked_against_crash_images(design, false);
    }
}

#[test]
fn every_design_makes_the_request_durable_before_its_handler_runs() {
    // The handler runs after the persist and before the reply is sent: it looks
    // at the crash image itself and answers whether its request is in it, so the
    // order is checked on the receiver's own thread, not raced against.
    for design in Design::ALL {
        let config = durability_config(true);
        let pool = crash_pool(&config);
        let seen = pool.clone();
        let handler: Handler = Arc::new(move |request: &[u8]| {
            let image = seen
                .crash()
                .expect("crash simulator")
                .image(PowerFailure::DropAll);
            if contains(&image, request) {
                b"durable".to_vec()
            } else {
                b"NOT durable".to_vec()
            }
        });
        let memory: Arc<dyn RegionMemory> = pool.clone();
        let fabric = LoopbackFabric::new();
        let (server, mut clients) = rig(&fabric, design, config, Some(memory), 1, handler);
        let running = server.spawn().expect("spawn");
        for i in 0..5u64 {
            let request = pattern(0xFEED_0000 + i, 200 + i as usize);
            assert_eq!(
                clients[0].call(&request).expect("call"),
                b"durable",
                "{design}: request {i} handled before it was durable"
            );
        }
        running.stop().expect("server");
    }
}

// ---------------------------------------------------------------------------
// Limits and errors

#[test]
fn fasst_refuses_requests_above_the_ud_mtu_and_goes_on() {
    // The reply is the request's length: the request alone meets the MTU.
    let length: Handler = Arc::new(|r: &[u8]| (r.len() as u32).to_le_bytes().to_vec());
    let fabric = LoopbackFabric::new();
    let (server, mut clients) = rig(&fabric, Design::Fasst, config_64k(1, 2), None, 1, length);
    let running = server.spawn().expect("spawn");
    let client = &mut clients[0];
    let fits = pattern(1, UD_MTU_BYTES - HEADER_BYTES);
    let err = client
        .call(&fits)
        .map(|r| assert_eq!(r, 4064u32.to_le_bytes()))
        .and_then(|_| client.call(&pattern(2, UD_MTU_BYTES - HEADER_BYTES + 1)))
        .expect_err("one byte over the MTU");
    assert_eq!(
        err,
        RpcError::TooLarge {
            design: Design::Fasst,
            bytes: UD_MTU_BYTES - HEADER_BYTES + 1,
            limit_bytes: UD_MTU_BYTES - HEADER_BYTES,
        }
    );
    assert!(err.to_string().contains("MTU"), "{err}");
    assert_eq!(client.outstanding(), 0, "nothing was sent");
    let after = pattern(3, 32);
    assert_eq!(
        client.call(&after).expect("still usable"),
        32u32.to_le_bytes()
    );
    let server = running.stop().expect("server");
    assert_eq!(server.stats().requests, 2, "the refused request never left");
    assert_eq!(client.stats().refused, 1);
}

#[test]
fn a_reply_too_large_is_an_error_reply_and_the_connection_goes_on() {
    let config = ServerConfig {
        clients_max: 1,
        inflight_max: 2,
        request_bytes_max: 1024,
        reply_bytes_max: 100,
        ..ServerConfig::default()
    };
    let double: Handler = Arc::new(|r: &[u8]| [r, r].concat());
    for design in Design::ALL {
        let fabric = LoopbackFabric::new();
        let (server, mut clients) = rig(&fabric, design, config, None, 1, double.clone());
        let running = server.spawn().expect("spawn");
        let got = clients[0].call(&[1u8; 80]);
        assert_eq!(
            got,
            Err(RpcError::ReplyTooLarge {
                bytes: 160,
                limit_bytes: 100
            }),
            "{design}"
        );
        assert_eq!(clients[0].call(&[2u8; 10]).expect("next call"), [2u8; 20]);
        let server = running.stop().expect("server");
        assert_eq!(server.stats().replies_too_large, 1, "{design}");
    }
}

#[test]
fn a_server_accepts_at_most_its_clients_and_needs_its_memory() {
    let fabric = LoopbackFabric::new();
    let config = config_64k(1, 2);
    let (mut server, _clients) = rig(&fabric, Design::Farm, config, None, 1, echo());
    let nic = rowankv_fabric::Fabric::attach(&fabric, rowankv_types::NodeId(9)).expect("attach");
    assert!(matches!(
        server.connect(&nic),
        Err(RpcError::ServerFull { clients_max: 1 })
    ));
    let small: Arc<dyn RegionMemory> = Arc::new(rowankv_fabric::DramMemory::new(4096));
    let nic = rowankv_fabric::Fabric::attach(&fabric, rowankv_types::NodeId(10)).expect("attach");
    assert!(matches!(
        rowankv_classic_rpc::Server::new(Design::Farm, nic, small, config, echo()),
        Err(RpcError::MemoryTooSmall { got: 4096, .. })
    ));
}

// ---------------------------------------------------------------------------
// ScaleRPC's groups and the processing delay

#[test]
fn scalerpc_serves_groups_in_turn_with_one_warmup_per_hundred_process_calls() {
    const CLIENTS: usize = 4;
    const CALLS: u64 = 110;
    let config = ServerConfig {
        scalerpc_group_size: 2,
        scalerpc_slice_requests_max: 8,
        ..config_64k(CLIENTS, 2)
    };
    let fabric = LoopbackFabric::new();
    let (server, mut clients) = rig(&fabric, Design::ScaleRpc, config, None, CLIENTS, echo());
    let running = server.spawn().expect("spawn");
    std::thread::scope(|s| {
        for (id, client) in clients.iter_mut().enumerate() {
            s.spawn(move || {
                for i in 0..CALLS {
                    let request = pattern(seed(id, 64, i), 64);
                    assert!(client.call(&request).expect("call") == expected_echo(&request));
                }
            });
        }
    });
    let server = running.stop().expect("server");
    let s = server.stats();
    assert_eq!(s.requests, CLIENTS as u64 * CALLS);
    assert_eq!(
        s.warmups,
        CLIENTS as u64 * 2,
        "calls 0 and 101 of each client warm up"
    );
    assert_eq!(s.verbs.read, s.warmups, "a warm-up READs the data");
    assert!(
        s.group_switches >= 1,
        "two groups were both served, so the server switched between them"
    );
}

/// A clock that moves 1 µs each time it is read: a processing delay spent on it
/// ends after a known number of reads, whatever the machine's speed.
#[derive(Debug, Default)]
struct TickingClock(AtomicU64);

impl Clock for TickingClock {
    fn now_ns(&self) -> u64 {
        self.0.fetch_add(1_000, Ordering::SeqCst)
    }
    fn unix_ms(&self) -> u64 {
        0
    }
}

#[test]
fn the_processing_delay_is_spent_once_per_request() {
    const N: u64 = 5;
    const DELAY_NS: u64 = 50_000;
    let config = ServerConfig {
        processing_delay_ns: DELAY_NS,
        ..config_64k(1, 2)
    };
    let fabric = LoopbackFabric::new();
    let memory: Arc<dyn RegionMemory> = Arc::new(rowankv_fabric::DramMemory::new(
        Layout::new(&config).server_bytes(),
    ));
    let nic = rowankv_fabric::Fabric::attach(&fabric, SERVER).expect("attach");
    let mut server = rowankv_classic_rpc::Server::new(Design::Farm, nic, memory, config, echo())
        .expect("server");
    let client_nic =
        rowankv_fabric::Fabric::attach(&fabric, rowankv_types::NodeId(1)).expect("attach");
    let mut client = server.connect(&client_nic).expect("connect");
    // After the connect, so that only the server reads the ticking clock (the
    // client keeps the system clock for its timeout).
    let server = server.with_clock(Arc::new(TickingClock::default()));
    let running = server.spawn().expect("spawn");
    for i in 0..N {
        client.call(&pattern(i, 10)).expect("call");
    }
    let s = running.stop().expect("server").stats();
    assert_eq!(s.requests, N);
    // Each request spins until the clock has moved by the delay: at least the
    // delay, at most one clock read (1 µs) plus the final read more.
    assert!(
        s.processing_ns >= N * DELAY_NS && s.processing_ns <= N * (DELAY_NS + 2_000),
        "processing time {} ns for {N} requests of {DELAY_NS} ns",
        s.processing_ns
    );
}
