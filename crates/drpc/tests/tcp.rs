//! The four durable RPC variants over `TcpFabric`: the sender and the receiver are
//! two NIC engines on 127.0.0.1 in this process, and every verb, the FLUSH and the
//! ATOMIC WRITE included, crosses a real TCP connection. The receiver's pool is a
//! real (anonymous, emulated-PM) pool.

mod common;

use common::*;
use rowankv_drpc::{persisted_header, ConnId, Event, FlowConfig, Variant};
use rowankv_fabric::TcpFabric;
use rowankv_pmem::PoolOptions;

const REQUESTS: u64 = 30;

#[test]
fn every_variant_over_tcp_executes_each_request_once() {
    for batch_max in [1, 2] {
        for variant in Variant::ALL {
            let v = format!("{} batch_max {batch_max}", variant.name());
            let fabric = TcpFabric::new();
            let pool = formatted_pool(PoolOptions::default());
            let flow = FlowConfig {
                batch_max,
                ..flow()
            };
            let (mut r, mut s, _) = connect(&fabric, pool.clone(), variant, flow, ConnId(0));
            let reqs: Vec<u64> = (1..=REQUESTS).collect();
            let seen = drive(&mut r, &mut s, &reqs, |_| {});
            assert_eq!(seen.durable, reqs, "{v}: each durable once, in order");
            let completed: Vec<u64> = seen
                .order
                .iter()
                .filter_map(|e| match e {
                    Event::Completed { seq, .. } => Some(*seq),
                    Event::Durable { .. } => None,
                })
                .collect();
            assert_eq!(completed, reqs, "{v}: FIFO");
            for i in 1..=REQUESTS {
                assert_eq!(counter(&r, i), 1, "{v}: request {i} applied once");
                assert_eq!(seen.completed[&i], 1u64.to_le_bytes(), "{v}: reply {i}");
            }
            let g = r.geometry();
            let (head, done) = persisted_header(&pool, &g, ConnId(0));
            assert_eq!(done, REQUESTS, "{v}");
            assert!(head > g.ring_bytes as u64, "{v}: the ring wrapped");
            assert!(!r.is_broken(ConnId(0)), "{v}: replies all delivered");
        }
    }
}
