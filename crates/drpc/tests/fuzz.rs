//! Decoders and recovery against arbitrary bytes: PM contents and a peer's replies
//! are outside input, so they may be refused but must never panic the receiver or
//! the sender, nor be taken for a request.

mod common;

use common::*;
use proptest::prelude::*;
use rowankv_drpc::layout::{decode_apply_record, decode_entry, decode_reply, encode_entry};
use rowankv_drpc::{ConnId, DrpcError, Receiver};
use rowankv_fabric::LoopbackFabric;
use rowankv_pmem::PoolOptions;

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
        let _ = decode_entry(&bytes);
        let _ = decode_apply_record(&bytes, 4096);
        let _ = decode_reply(&bytes);
    }

    /// An entry with any one byte changed is refused.
    #[test]
    fn damaged_entry_is_refused(
        seq in 1u64..1 << 40,
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let e = encode_entry(seq, &[(1, &payload)]);
        let used = 24 + 8 + payload.len();
        let i = at.index(used);
        let mut d = e.clone();
        d[i] ^= flip;
        prop_assert!(decode_entry(&e).is_some());
        prop_assert_eq!(decode_entry(&d), None);
    }

    /// Recovery of a pool whose connection header, apply record and ring hold
    /// arbitrary bytes ends with an open receiver or a typed error, and executes
    /// nothing that is not a whole entry.
    #[test]
    fn recovery_from_arbitrary_bytes_never_panics(
        header in proptest::collection::vec(any::<u8>(), 16),
        apply in proptest::collection::vec(any::<u8>(), 0..128),
        ring in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let pool = formatted_pool(PoolOptions::default());
        let g = geometry();
        pool.write(g.conn_header_offset(ConnId(0)), &header);
        pool.write(g.apply_offset(), &apply);
        pool.write(g.ring_offset(ConnId(0)), &ring);
        let fabric = LoopbackFabric::new();
        let nic = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
        match Receiver::open(pool, nic, flow(), Counters) {
            Ok((_, report)) => prop_assert!(report.reexecuted.is_empty()),
            Err(DrpcError::Pool(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error {}", e),
        }
    }
}
