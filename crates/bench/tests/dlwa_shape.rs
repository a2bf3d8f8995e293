//! The DLWA experiment's shape under the default media model: many per-sender WRITE
//! logs amplify, one Rowan stream does not (seed 000 Figures 2 and 8). DLWA is a
//! count of bytes, not a time, so these assertions do not depend on machine speed.

use rowankv_bench::dlwa::{run_point, DlwaOptions, Mode};

fn small() -> DlwaOptions {
    DlwaOptions {
        ops_per_point: 60_000,
        warmup_ops: 30_000,
        ..DlwaOptions::quick()
    }
}

#[test]
fn many_write_streams_amplify_and_few_do_not() {
    let opts = small();
    let few = run_point(&opts, Mode::Write, 64, 18, 0).unwrap();
    let many = run_point(&opts, Mode::Write, 64, 144, 0).unwrap();
    assert!(few.dlwa < 1.05, "18 WRITE streams: DLWA {}", few.dlwa);
    assert!(many.dlwa > 1.3, "144 WRITE streams: DLWA {}", many.dlwa);
    assert_eq!(many.remote_ops, 60_000);
    assert_eq!(
        many.request_bytes,
        60_000 * 64,
        "every measured byte counted once"
    );
}

#[test]
fn rowan_stays_one_stream_with_and_without_local_writers() {
    let opts = small();
    for locals in [0, 18] {
        let p = run_point(&opts, Mode::Rowan, 64, 144, locals).unwrap();
        assert!(
            p.dlwa <= 1.05,
            "Rowan, {locals} local writers: DLWA {}",
            p.dlwa
        );
        assert_eq!(p.remote_ops, 60_000);
    }
}

#[test]
fn bad_write_size_is_a_clear_error() {
    let err = run_point(&small(), Mode::Write, 100, 1, 0).unwrap_err();
    assert!(err.to_string().contains("multiple of 64"), "{err}");
}
