//! The seven designs on `TcpFabric`: every verb crosses a real TCP connection and
//! the NIC engine of each node lands it, so nothing here can lean on the loopback
//! fabric's synchronous execution.

mod common;

use common::*;
use rowankv_classic_rpc::{Design, Totals};
use rowankv_fabric::TcpFabric;

#[test]
fn every_design_round_trips_on_tcp() {
    const CLIENTS: usize = 2;
    const CALLS_PER_SIZE: u64 = 4;
    for design in Design::ALL {
        let fabric = TcpFabric::new();
        let (server, mut clients) = rig(
            &fabric,
            design,
            config_64k(CLIENTS, 2),
            None,
            CLIENTS,
            echo(),
        );
        let running = server.spawn().expect("spawn");
        std::thread::scope(|s| {
            for (id, client) in clients.iter_mut().enumerate() {
                s.spawn(move || {
                    for size in [32, 1024, 64 << 10] {
                        if design == Design::Fasst && size > 4096 {
                            assert!(client.call(&vec![0u8; size]).is_err());
                            continue;
                        }
                        for i in 0..CALLS_PER_SIZE {
                            let request =
                                pattern(((id as u64) << 32) | ((size as u64) << 8) | i, size);
                            let got = client
                                .call(&request)
                                .unwrap_or_else(|e| panic!("{design} {size} B on tcp: {e}"));
                            assert!(got == expected_echo(&request), "{design} {size} B on tcp");
                        }
                    }
                });
            }
        });
        let server = running.stop().expect("server");
        let stats: Vec<_> = clients.iter().map(|c| c.stats()).collect();
        let totals = Totals::of(&stats, &server.stats());
        let sizes = if design == Design::Fasst { 2 } else { 3 };
        let calls = CLIENTS as u64 * sizes * CALLS_PER_SIZE;
        assert_eq!(totals.calls, calls, "{design}");
        assert_eq!(totals.receiver_persists, calls, "{design}");
    }
}
