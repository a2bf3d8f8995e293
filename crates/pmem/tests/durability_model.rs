//! Model test: random interleavings of write / persist / nt_copy / drain / DMA
//! against a model of the durable bytes. After `power_fail(DropAll)` the pool must
//! equal the model's durable bytes, and `image(DropAll)` must have predicted them.

use proptest::prelude::*;
use rowankv_pmem::{Pool, PoolOptions, PowerFailure, RegionMemory, CACHELINE_BYTES};

const POOL_BYTES: usize = 4096;
const LINES: usize = POOL_BYTES / CACHELINE_BYTES;

#[derive(Clone, Debug)]
enum Op {
    Write { offset: usize, len: usize, byte: u8 },
    WriteU64 { word: usize, value: u64 },
    Persist { offset: usize, len: usize },
    NtCopy { offset: usize, len: usize, byte: u8 },
    Drain { offset: usize, len: usize },
    DmaWrite { offset: usize, len: usize, byte: u8 },
    DmaPersist { offset: usize, len: usize },
}

fn range() -> impl Strategy<Value = (usize, usize)> {
    (0..POOL_BYTES).prop_flat_map(|offset| (Just(offset), 0..=(POOL_BYTES - offset).min(300)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (range(), any::<u8>()).prop_map(|((offset, len), byte)| Op::Write { offset, len, byte }),
        1 => (0..POOL_BYTES / 8, any::<u64>()).prop_map(|(word, value)| Op::WriteU64 { word, value }),
        2 => range().prop_map(|(offset, len)| Op::Persist { offset, len }),
        2 => (range(), any::<u8>()).prop_map(|((offset, len), byte)| Op::NtCopy { offset, len, byte }),
        2 => range().prop_map(|(offset, len)| Op::Drain { offset, len }),
        1 => (range(), any::<u8>()).prop_map(|((offset, len), byte)| Op::DmaWrite { offset, len, byte }),
        1 => range().prop_map(|(offset, len)| Op::DmaPersist { offset, len }),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum LineState {
    Clean,
    /// Holds ordinary stores: only persist makes it durable.
    Cached,
    /// Holds only nt or DMA stores: drain and dma_persist make it durable too.
    Streamed,
}

/// The model: current bytes, durable bytes, and each line's state.
struct Model {
    current: Vec<u8>,
    durable: Vec<u8>,
    state: Vec<LineState>,
}

impl Model {
    fn lines(offset: usize, len: usize) -> std::ops::Range<usize> {
        if len == 0 {
            0..0
        } else {
            offset / CACHELINE_BYTES..(offset + len).div_ceil(CACHELINE_BYTES)
        }
    }

    fn store(&mut self, offset: usize, data: &[u8], cached: bool) {
        self.current[offset..offset + data.len()].copy_from_slice(data);
        for line in Self::lines(offset, data.len()) {
            self.state[line] = match (self.state[line], cached) {
                (_, true) | (LineState::Cached, false) => LineState::Cached,
                _ => LineState::Streamed,
            };
        }
    }

    fn make_durable(&mut self, offset: usize, len: usize, streamed_only: bool) {
        for line in Self::lines(offset, len) {
            let durable = match self.state[line] {
                LineState::Clean => false,
                LineState::Cached => !streamed_only,
                LineState::Streamed => true,
            };
            if durable {
                let at = line * CACHELINE_BYTES;
                self.durable[at..at + CACHELINE_BYTES]
                    .copy_from_slice(&self.current[at..at + CACHELINE_BYTES]);
                self.state[line] = LineState::Clean;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn drop_all_leaves_exactly_the_durable_bytes(ops in prop::collection::vec(op(), 1..60)) {
        let opts = PoolOptions { crash_sim: true, ..PoolOptions::default() };
        let pool = Pool::anonymous(POOL_BYTES, opts).unwrap();
        let mut model = Model {
            current: vec![0; POOL_BYTES],
            durable: vec![0; POOL_BYTES],
            state: vec![LineState::Clean; LINES],
        };
        for op in &ops {
            match *op {
                Op::Write { offset, len, byte } => {
                    pool.write(offset, &vec![byte; len]);
                    model.store(offset, &vec![byte; len], true);
                }
                Op::WriteU64 { word, value } => {
                    pool.write_u64(word * 8, value);
                    model.store(word * 8, &value.to_ne_bytes(), true);
                }
                Op::Persist { offset, len } => {
                    pool.persist(offset, len);
                    model.make_durable(offset, len, false);
                }
                Op::NtCopy { offset, len, byte } => {
                    pool.nt_copy(offset, &vec![byte; len]);
                    model.store(offset, &vec![byte; len], false);
                }
                Op::Drain { offset, len } => {
                    pool.drain(offset, len);
                    model.make_durable(offset, len, true);
                }
                Op::DmaWrite { offset, len, byte } => {
                    pool.dma_write(offset, &vec![byte; len]);
                    model.store(offset, &vec![byte; len], false);
                }
                Op::DmaPersist { offset, len } => {
                    pool.dma_persist(offset, len);
                    model.make_durable(offset, len, true);
                }
            }
        }
        let mut live = vec![0u8; POOL_BYTES];
        pool.read(0, &mut live);
        prop_assert_eq!(&live, &model.current);
        let crash = pool.crash().unwrap();
        let dirty_lines = model.state.iter().filter(|s| **s != LineState::Clean).count();
        prop_assert_eq!(crash.dirty_lines(), dirty_lines);
        let image = crash.image(PowerFailure::DropAll);
        prop_assert_eq!(&image, &model.durable);

        pool.power_fail(PowerFailure::DropAll);
        pool.read(0, &mut live);
        prop_assert_eq!(&live, &model.durable);
        prop_assert_eq!(crash.dirty_lines(), 0);
    }
}
