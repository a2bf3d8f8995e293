//! The YCSB workload generator of `rowankv bench ycsb`: operation mixes, key
//! popularity, object sizes, record keys, determinism and the load phase.
//!
//! Statistical checks draw from fixed seeds, so they are deterministic; their bounds
//! sit many standard deviations away from the expected values.

use std::collections::HashSet;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rowankv_bench::ycsb::workload::{
    record_key, record_keys_max, zeta, Generator, KeyDist, Op, ParseError, Permutation, SizeDist,
    Workload, Zipfian, ZIPFIAN_THETA_DEFAULT,
};

const ZIPF: KeyDist = KeyDist::Zipfian {
    theta: ZIPFIAN_THETA_DEFAULT,
};
const MAX_VALUE: usize = 16 * 1024;

/// The average object size (key + value) each size model must reproduce: the
/// published averages for the RocksDB workloads (seed 000 §6.1), the model means for
/// ETC and SYS (seed 001 §5.2 gives shapes, not means; see docs/workloads.md).
fn target_object_bytes(sizes: SizeDist) -> f64 {
    match sizes {
        SizeDist::ZippyDb => 90.8,
        SizeDist::Up2x => 57.25,
        SizeDist::Udb => 153.8,
        SizeDist::Etc => 327.64,
        SizeDist::Sys => 748.40,
        SizeDist::Fixed {
            key_bytes,
            value_bytes,
        } => (key_bytes + value_bytes) as f64,
    }
}

/// How often each record is the target of `ops` operations.
fn record_counts(generator: &mut Generator, records: u64, ops: usize) -> Vec<u32> {
    let mut counts = vec![0u32; records as usize];
    for _ in 0..ops {
        counts[generator.next_op().record() as usize] += 1;
    }
    counts
}

fn hottest(counts: &[u32], n: usize) -> Vec<u64> {
    let mut by_count: Vec<(u32, u64)> = counts
        .iter()
        .enumerate()
        .map(|(i, &c)| (c, i as u64))
        .collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    by_count.iter().take(n).map(|&(_, i)| i).collect()
}

#[test]
fn put_fraction_of_each_workload_is_within_one_percent() {
    const OPS: usize = 200_000;
    for workload in Workload::ALL {
        let mut generator = Generator::new(
            workload,
            workload.default_key_dist(),
            SizeDist::ZippyDb,
            100_000,
            MAX_VALUE,
            11,
        );
        let mut writes = 0usize;
        for _ in 0..OPS {
            let op = generator.next_op();
            // Each workload writes with its own kind of operation only.
            match (workload, op) {
                (Workload::Load, Op::Insert { .. })
                | (Workload::A | Workload::B, Op::Put { .. })
                | (Workload::D, Op::Insert { .. })
                | (Workload::F, Op::ReadModifyWrite { .. }) => writes += 1,
                (_, Op::Get { .. }) => {}
                (w, op) => panic!("workload {w} issued {op:?}"),
            }
        }
        let fraction = writes as f64 / OPS as f64;
        assert!(
            (fraction - workload.put_fraction()).abs() <= 0.01,
            "workload {workload}: put fraction {fraction}, target {}",
            workload.put_fraction()
        );
    }
}

#[test]
fn names_parse_and_print() {
    for workload in Workload::ALL {
        assert_eq!(workload.to_string().parse::<Workload>(), Ok(workload));
    }
    assert_eq!("LOAD".parse::<Workload>(), Ok(Workload::Load));
    assert_eq!("F".parse::<Workload>(), Ok(Workload::F));
    assert_eq!(
        "e".parse::<Workload>(),
        Err(ParseError::Workload("e".into()))
    );

    assert_eq!("zipfian".parse::<KeyDist>(), Ok(ZIPF));
    assert_eq!(
        "Zipfian:0.8".parse::<KeyDist>(),
        Ok(KeyDist::Zipfian { theta: 0.8 })
    );
    assert_eq!("uniform".parse::<KeyDist>(), Ok(KeyDist::Uniform));
    assert_eq!("LATEST".parse::<KeyDist>(), Ok(KeyDist::Latest));
    for bad in ["zipfian:1", "zipfian:0", "zipfian:x", "hotspot"] {
        assert!(bad.parse::<KeyDist>().is_err(), "{bad}");
    }
    for dist in [
        ZIPF,
        KeyDist::Zipfian { theta: 0.5 },
        KeyDist::Uniform,
        KeyDist::Latest,
    ] {
        assert_eq!(dist.to_string().parse::<KeyDist>(), Ok(dist));
    }

    let fixed = SizeDist::Fixed {
        key_bytes: 16,
        value_bytes: 100,
    };
    assert_eq!("fixed:16:100".parse::<SizeDist>(), Ok(fixed));
    assert_eq!("ZippyDB".parse::<SizeDist>(), Ok(SizeDist::ZippyDb));
    for sizes in SizeDist::MODELS.into_iter().chain([fixed]) {
        assert_eq!(sizes.to_string().parse::<SizeDist>(), Ok(sizes));
    }
    for bad in [
        "fixed:0:10",
        "fixed:10:0",
        "fixed:10",
        "fixed:a:b",
        "fixed:1025:1",
        "etc2",
    ] {
        assert!(bad.parse::<SizeDist>().is_err(), "{bad}");
    }
}

#[test]
fn zeta_matches_the_plain_sum() {
    for n in [1u64, 2, 3, 1000, 1024, 1025, 5000, 1_000_000, 10_000_000] {
        for theta in [0.5, ZIPFIAN_THETA_DEFAULT, 0.999] {
            let plain: f64 = (1..=n).map(|i| (i as f64).powf(-theta)).sum();
            let fast = zeta(n, theta);
            assert!(
                ((fast - plain) / plain).abs() < 1e-11,
                "zeta({n}, {theta}): {fast} vs plain {plain}"
            );
        }
    }
}

#[test]
fn zipfian_grows_like_it_was_built_at_the_new_size() {
    let mut grown = Zipfian::new(1000, ZIPFIAN_THETA_DEFAULT);
    for items in (1001..=3000).step_by(7) {
        grown.grow_to(items);
    }
    grown.grow_to(1_000_000);
    let built = Zipfian::new(1_000_000, ZIPFIAN_THETA_DEFAULT);
    assert!(((grown.zetan() - built.zetan()) / built.zetan()).abs() < 1e-12);
    for u in [0.0, 0.01, 0.07, 0.1, 0.5, 0.9, 0.999_999] {
        assert_eq!(grown.rank(u), built.rank(u), "u = {u}");
    }
}

#[test]
fn zipfian_hottest_record_and_top_percent_match_theory() {
    const RECORDS: u64 = 1_000_000;
    const OPS: usize = 4_000_000;
    let mut generator = Generator::new(Workload::C, ZIPF, SizeDist::ZippyDb, RECORDS, MAX_VALUE, 3);
    let counts = record_counts(&mut generator, RECORDS, OPS);

    let zetan = zeta(RECORDS, ZIPFIAN_THETA_DEFAULT);
    let top_share = *counts.iter().max().unwrap() as f64 / OPS as f64;
    let top_expected = 1.0 / zetan;
    assert!(
        (top_share / top_expected - 1.0).abs() < 0.10,
        "hottest record share {top_share}, expected {top_expected}"
    );

    let mut sorted = counts.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let top_percent: u64 = sorted[..(RECORDS / 100) as usize]
        .iter()
        .map(|&c| c as u64)
        .sum();
    let top_percent_share = top_percent as f64 / OPS as f64;
    let top_percent_expected = zeta(RECORDS / 100, ZIPFIAN_THETA_DEFAULT) / zetan;
    println!(
        "zipfian 0.99 over {RECORDS}: hottest {top_share:.5} (theory {top_expected:.5}), \
         top 1% {top_percent_share:.4} (theory {top_percent_expected:.4})"
    );
    assert!(
        (top_percent_share / top_percent_expected - 1.0).abs() < 0.05,
        "top 1% share {top_percent_share}, expected {top_percent_expected}"
    );
}

#[test]
fn uniform_is_flat() {
    const RECORDS: u64 = 1_000_000;
    const BUCKETS: usize = 100;
    const OPS: usize = 2_000_000;
    let mut generator = Generator::new(
        Workload::C,
        KeyDist::Uniform,
        SizeDist::ZippyDb,
        RECORDS,
        MAX_VALUE,
        5,
    );
    let mut buckets = [0u64; BUCKETS];
    for _ in 0..OPS {
        let record = generator.next_op().record();
        assert!(record < RECORDS);
        buckets[(record * BUCKETS as u64 / RECORDS) as usize] += 1;
    }
    let expected = OPS as f64 / BUCKETS as f64;
    let chi_square: f64 = buckets
        .iter()
        .map(|&b| (b as f64 - expected).powi(2) / expected)
        .sum();
    let max = *buckets.iter().max().unwrap() as f64;
    let min = *buckets.iter().min().unwrap() as f64;
    // 99 degrees of freedom: mean 99, standard deviation 14.
    assert!(chi_square < 99.0 + 6.0 * 14.1, "chi-square {chi_square}");
    assert!(max / min < 1.05, "max/min bucket ratio {}", max / min);
}

#[test]
fn hottest_zipfian_records_are_scattered_and_the_same_for_every_seed() {
    const RECORDS: u64 = 1_000_000;
    const OPS: usize = 1_000_000;
    let mut hot_sets = Vec::new();
    for seed in [1, 2] {
        let mut generator =
            Generator::new(Workload::C, ZIPF, SizeDist::Udb, RECORDS, MAX_VALUE, seed);
        let counts = record_counts(&mut generator, RECORDS, OPS);
        let mut hot = hottest(&counts, 10);
        hot.sort_unstable();
        for pair in hot.windows(2) {
            assert!(pair[1] - pair[0] > 1, "neighbouring hot records {hot:?}");
        }
        assert!(
            hot[9] - hot[0] > RECORDS / 10,
            "hot records bunched: {hot:?}"
        );
        hot_sets.push(hottest(&counts, 3));
    }
    // The three hottest stand clearly apart, so they are the same records, in the
    // same order, whatever the seed: clients agree on what is hot.
    assert_eq!(hot_sets[0], hot_sets[1]);
}

#[test]
fn latest_favours_the_newest_records() {
    const RECORDS: u64 = 100_000;
    const OPS: usize = 1_000_000;
    let mut generator = Generator::new(
        Workload::C,
        KeyDist::Latest,
        SizeDist::ZippyDb,
        RECORDS,
        MAX_VALUE,
        9,
    );
    let counts = record_counts(&mut generator, RECORDS, OPS);
    assert_eq!(
        hottest(&counts, 3),
        vec![RECORDS - 1, RECORDS - 2, RECORDS - 3]
    );
    let top_share = counts[(RECORDS - 1) as usize] as f64 / OPS as f64;
    let top_expected = 1.0 / zeta(RECORDS, ZIPFIAN_THETA_DEFAULT);
    assert!((top_share / top_expected - 1.0).abs() < 0.10);

    // Under D the newest insert becomes the most read record.
    let mut generator = Generator::new(
        Workload::D,
        KeyDist::Latest,
        SizeDist::ZippyDb,
        RECORDS,
        MAX_VALUE,
        9,
    );
    let mut newest = RECORDS - 1;
    let (mut reads, mut reads_of_newest) = (0u64, 0u64);
    for _ in 0..OPS {
        match generator.next_op() {
            Op::Insert { record, .. } => {
                assert_eq!(record, newest + 1, "inserts number new records in order");
                newest = record;
            }
            Op::Get { record } => {
                assert!(record <= newest);
                reads += 1;
                reads_of_newest += (record == newest) as u64;
            }
            op => panic!("D issued {op:?}"),
        }
    }
    assert_eq!(generator.records_known(), newest + 1);
    let share = reads_of_newest as f64 / reads as f64;
    let expected = 1.0 / zeta(newest + 1, ZIPFIAN_THETA_DEFAULT);
    assert!(
        (share / expected - 1.0).abs() < 0.10,
        "newest record read share {share}, expected {expected}"
    );
}

#[test]
fn clients_insert_distinct_records() {
    const CLIENTS: u64 = 4;
    const RECORDS: u64 = 1000;
    let mut inserted = HashSet::new();
    for client in 0..CLIENTS {
        let mut generator = Generator::new(
            Workload::Load,
            ZIPF,
            SizeDist::Etc,
            RECORDS,
            MAX_VALUE,
            100 + client,
        )
        .with_client(client, CLIENTS);
        for _ in 0..10_000 {
            let record = generator.next_op().record();
            assert!(record >= RECORDS);
            assert!(inserted.insert(record), "record {record} inserted twice");
        }
    }
    assert_eq!(
        *inserted.iter().max().unwrap(),
        RECORDS + CLIENTS * 10_000 - 1
    );
}

#[test]
fn size_models_reproduce_the_published_averages() {
    const SAMPLES: usize = 1_000_000;
    for sizes in SizeDist::MODELS {
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        let mut total = 0u64;
        for _ in 0..SAMPLES {
            let len = sizes.sample_value_len(&mut rng, MAX_VALUE);
            assert!(
                (1..=sizes.value_bytes_cap()).contains(&len),
                "{sizes}: {len}"
            );
            total += len as u64;
        }
        let measured_value = total as f64 / SAMPLES as f64;
        let measured_object = sizes.key_bytes() as f64 + measured_value;
        let target = target_object_bytes(sizes);
        println!(
            "{sizes}: key {} B, model mean value {:.2} B, object: target {target} B, \
             model {:.2} B, measured {measured_object:.2} B",
            sizes.key_bytes(),
            sizes.mean_value_bytes(),
            sizes.mean_object_bytes()
        );
        assert!(
            (measured_object / target - 1.0).abs() < 0.02,
            "{sizes}: measured mean object {measured_object} B, target {target} B"
        );
        // The exact model mean sits on the target: the sample mean is only noise.
        assert!(
            (sizes.mean_object_bytes() / target - 1.0).abs() < 0.001,
            "{sizes}: model mean object {} B, target {target} B",
            sizes.mean_object_bytes()
        );
    }
}

#[test]
fn value_lengths_respect_a_small_max_value() {
    const SAMPLES: usize = 200_000;
    for sizes in SizeDist::MODELS.into_iter().chain([SizeDist::Fixed {
        key_bytes: 8,
        value_bytes: 500,
    }]) {
        for max_value in [1usize, 20, 64, 400, 1000] {
            let mut rng = ChaCha8Rng::seed_from_u64(max_value as u64);
            let mut total = 0u64;
            for _ in 0..SAMPLES {
                let len = sizes.sample_value_len(&mut rng, max_value);
                assert!(
                    (1..=max_value).contains(&len),
                    "{sizes} max {max_value}: {len}"
                );
                total += len as u64;
            }
            // Truncation conditions the distribution rather than piling draws up at
            // `max_value`; the exact truncated mean says what to expect.
            let measured = total as f64 / SAMPLES as f64;
            let expected = sizes.truncated_mean_value_bytes(max_value);
            assert!(
                (measured / expected - 1.0).abs() < 0.02,
                "{sizes} max {max_value}: measured {measured}, expected {expected}"
            );
        }
    }
}

#[test]
fn fixed_sizes_are_fixed() {
    let sizes = SizeDist::Fixed {
        key_bytes: 24,
        value_bytes: 100,
    };
    let mut generator = Generator::new(Workload::A, ZIPF, sizes, 1000, MAX_VALUE, 1);
    for _ in 0..1000 {
        if let Op::Put { value_len, .. } = generator.next_op() {
            assert_eq!(value_len, 100);
        }
    }
    assert_eq!(sizes.key_bytes(), 24);
    assert_eq!(sizes.mean_value_bytes(), 100.0);
}

fn assert_keys_distinct(key_bytes: usize, records: std::ops::Range<u64>) {
    let mut key = Vec::new();
    let mut keys = Vec::with_capacity((records.end - records.start) as usize);
    for i in records.clone() {
        record_key(i, key_bytes, &mut key);
        assert_eq!(key.len(), key_bytes, "record {i}");
        keys.push(key.clone());
    }
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(
        keys.len() as u64,
        records.end - records.start,
        "{key_bytes}-byte keys of {records:?} collide"
    );
}

#[test]
fn record_keys_are_distinct_and_exactly_as_long_as_asked() {
    for sizes in SizeDist::MODELS {
        assert_keys_distinct(sizes.key_bytes(), 0..1_000_000);
    }
    // Short keys switch from decimal to binary inside these ranges; the two forms
    // must not collide with each other.
    for key_bytes in 1..=9 {
        let max = record_keys_max(key_bytes).min(300_000) as u64;
        assert_keys_distinct(key_bytes, 0..max);
    }
    // The ends of the binary range.
    assert_keys_distinct(2, 0..record_keys_max(2) as u64);
    assert_keys_distinct(10, u64::MAX - 1000..u64::MAX);
    assert_keys_distinct(24, u64::MAX - 1000..u64::MAX);

    let mut key = Vec::new();
    record_key(42, 16, &mut key);
    assert_eq!(key, b"user000000000042");
    record_key(7, 10, &mut key);
    assert_eq!(key, b"user000007");
    record_key(1_000_000, 10, &mut key);
    assert_eq!(key.len(), 10);
    assert_ne!(key[0], b'u');
    assert_eq!(record_keys_max(1), 255);
    assert_eq!(record_keys_max(5), 10 + 255 * 256u128.pow(4));
    assert_eq!(record_keys_max(24), u64::MAX as u128 + 1);
}

#[test]
#[should_panic(expected = "has no distinct")]
fn record_key_refuses_records_past_its_key_space() {
    record_key(255, 1, &mut Vec::new());
}

#[test]
fn same_seed_same_sequence_different_seed_different_sequence() {
    let run = |workload: Workload, keys: KeyDist, seed: u64| -> Vec<Op> {
        let mut generator = Generator::new(workload, keys, SizeDist::Sys, 50_000, MAX_VALUE, seed);
        let mut ops: Vec<Op> = (0..1000).filter_map(|_| generator.load_op()).collect();
        ops.extend((0..10_000).map(|_| generator.next_op()));
        ops
    };
    for workload in Workload::ALL {
        for keys in [ZIPF, KeyDist::Uniform, KeyDist::Latest] {
            assert_eq!(run(workload, keys, 1), run(workload, keys, 1));
            assert_ne!(run(workload, keys, 1), run(workload, keys, 2));
        }
    }
    // A clone continues the same sequence.
    let mut generator = Generator::new(Workload::A, ZIPF, SizeDist::Udb, 1000, MAX_VALUE, 4);
    generator.next_op();
    let mut clone = generator.clone();
    for _ in 0..100 {
        assert_eq!(generator.next_op(), clone.next_op());
    }
}

#[test]
fn load_phase_inserts_every_record_exactly_once() {
    const RECORDS: u64 = 1_000_003;
    let mut generator = Generator::new(Workload::A, ZIPF, SizeDist::ZippyDb, RECORDS, MAX_VALUE, 8);
    let mut seen = vec![false; RECORDS as usize];
    let mut first = Vec::new();
    while let Some(op) = generator.load_op() {
        let Op::Insert { record, value_len } = op else {
            panic!("load phase issued {op:?}");
        };
        assert!((1..=MAX_VALUE).contains(&value_len));
        assert!(!seen[record as usize], "record {record} loaded twice");
        seen[record as usize] = true;
        if first.len() < 10 {
            first.push(record);
        }
    }
    assert!(seen.iter().all(|&s| s), "a record was never loaded");
    assert_eq!(generator.load_op(), None);
    // Scrambled: the load order is not the record order.
    assert_ne!(first, (0..10).collect::<Vec<u64>>());

    // Clients loading their strides together load every record once too.
    const CLIENTS: u64 = 3;
    let mut seen = vec![false; 10_000];
    for client in 0..CLIENTS {
        let mut generator = Generator::new(
            Workload::Load,
            ZIPF,
            SizeDist::Up2x,
            10_000,
            MAX_VALUE,
            client,
        )
        .with_client(client, CLIENTS);
        while let Some(op) = generator.load_op() {
            let record = op.record() as usize;
            assert!(!seen[record], "record {record} loaded twice");
            seen[record] = true;
        }
    }
    assert!(seen.iter().all(|&s| s));
}

#[test]
fn permutations_are_bijections() {
    for n in [1u64, 2, 3, 4, 5, 17, 1000, 4097, 65_536] {
        let permutation = Permutation::new(n, 0xfeed);
        let mut seen = vec![false; n as usize];
        for x in 0..n {
            let y = permutation.apply(x);
            assert!(!seen[y as usize], "n {n}: {y} hit twice");
            seen[y as usize] = true;
        }
    }
    // Wide domains work too (no overflow in the halves).
    let wide = Permutation::new(u64::MAX, 1);
    assert!(wide.apply(u64::MAX - 1) < u64::MAX);
}

#[test]
fn every_operation_names_an_existing_or_new_record() {
    const RECORDS: u64 = 5000;
    for workload in Workload::ALL {
        for keys in [ZIPF, KeyDist::Uniform, KeyDist::Latest] {
            let mut generator =
                Generator::new(workload, keys, SizeDist::Etc, RECORDS, MAX_VALUE, 21);
            let mut known = RECORDS;
            for _ in 0..20_000 {
                match generator.next_op() {
                    Op::Insert { record, .. } => {
                        assert_eq!(record, known);
                        known += 1;
                    }
                    op => assert!(op.record() < known, "{workload} {keys}: {op:?}"),
                }
            }
        }
    }
}
