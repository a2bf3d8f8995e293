//! `rowankv bench reshard` (seed 000 Figure 15) end to end, small: the
//! hotspot overloads the hot shard's server, the CM detects it and moves a
//! shard off it, the busiest server's share falls back, and every
//! acknowledged write reads back.

use rowankv_bench::ycsb::reshard::{self, ReshardOptions};

#[test]
fn the_hotspot_is_detected_and_migrated_away_and_nothing_is_lost() {
    let opts = ReshardOptions {
        records: 6_000,
        seconds: 7.0,
        hotspot_at_s: 2.0,
        clients: 8,
        progress: false,
        ..ReshardOptions::quick()
    };
    let r = reshard::run(&opts).expect("a run");
    let text = reshard::report(&r);
    assert!(
        text.lines().all(|l| l.starts_with("[no timing model]")),
        "{text}"
    );
    assert_eq!(r.servers_failed, 0, "a spoiled run: {text}");
    assert_eq!(r.lost_writes, 0, "{text}");
    assert!(r.verified_keys > 0, "{text}");
    assert_eq!(r.detected_server, Some(r.hot_server), "{text}");
    assert!(r.detect_ms.is_some_and(|d| d > 0.0), "{text}");
    assert!(
        r.migrations
            .iter()
            .any(|&(shard, from, _)| from == r.hot_server && shard == r.hot_shard),
        "the hot shard did not move off its server: {text}"
    );
    assert!(r.objects_moved > 0 && r.migration_ms.is_some(), "{text}");
    // The hotspot makes one server the busiest by far; the move mends it.
    assert!(r.imbalance_hotspot > 1.3, "{text}");
    let after = r
        .imbalance_after
        .expect("a settled interval after the move");
    assert!(after < r.imbalance_hotspot, "{text}");
    assert_eq!(r.timeline.len(), 70);
    assert_eq!(r.server_timeline.len(), 6);
}
