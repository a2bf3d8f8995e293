//! Fixtures shared by the integration tests: a server and its clients on any
//! fabric, deterministic payloads, and a search of a memory image.

#![allow(dead_code)]

use std::sync::Arc;

use rowankv_classic_rpc::{Client, Design, Handler, Layout, Server, ServerConfig};
use rowankv_fabric::{DramMemory, Fabric, RegionMemory};
use rowankv_types::NodeId;

pub const SERVER: NodeId = NodeId(0);

/// A server of `design` on node 0 of `fabric` over `memory` (DRAM of the layout's
/// size if `None`), and `clients` clients on nodes 1, 2, ...
pub fn rig<F: Fabric>(
    fabric: &F,
    design: Design,
    config: ServerConfig,
    memory: Option<Arc<dyn RegionMemory>>,
    clients: usize,
    handler: Handler,
) -> (Server<F::Nic>, Vec<Client<F::Nic>>) {
    let memory =
        memory.unwrap_or_else(|| Arc::new(DramMemory::new(Layout::new(&config).server_bytes())));
    let nic = fabric.attach(SERVER).expect("attach server");
    let mut server = Server::new(design, nic, memory, config, handler).expect("server");
    let clients = (0..clients)
        .map(|i| {
            let nic = fabric.attach(NodeId(1 + i as u32)).expect("attach client");
            server.connect(&nic).expect("connect")
        })
        .collect();
    (server, clients)
}

/// The reply the test handler gives: "ok" and the request reversed, so a reply
/// proves the server read the whole request.
pub fn echo() -> Handler {
    Arc::new(|request: &[u8]| {
        let mut reply = b"ok".to_vec();
        reply.extend(request.iter().rev());
        reply
    })
}

pub fn expected_echo(request: &[u8]) -> Vec<u8> {
    (echo())(request)
}

/// Deterministic bytes (SplitMix64) from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    assert!(!needle.is_empty());
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A configuration for `clients` clients carrying requests up to 64 KiB and their
/// echoes.
pub fn config_64k(clients: usize, inflight_max: usize) -> ServerConfig {
    ServerConfig {
        clients_max: clients,
        inflight_max,
        request_bytes_max: 64 << 10,
        reply_bytes_max: (64 << 10) + 64,
        ..ServerConfig::default()
    }
}
