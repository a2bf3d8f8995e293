//! `bench rpc` end to end on a tiny run: every JSON field the issue asks for is
//! there, and the counts that need no timing model are what each message pattern
//! says (no timed assertion: op/s and latencies are only checked to be present).

use rowankv_bench::rpc::{self, Load, RpcDesign, RpcOptions};
use rowankv_drpc::layout::{entry_bytes, request_bytes, REPLY_HEADER_BYTES};

const SIZE: usize = 1024;
/// The classic designs' message header.
const CLASSIC_HEADER: f64 = rowankv_classic_rpc::HEADER_BYTES as f64;
/// Both kinds answer 8 bytes.
const REPLY: f64 = 8.0;

fn tiny(designs: &[&str], sizes: &[usize]) -> RpcOptions {
    RpcOptions {
        designs: designs
            .iter()
            .map(|n| RpcDesign::from_name(n).unwrap())
            .collect(),
        sizes_bytes: sizes.to_vec(),
        loads: vec![Load::Light],
        warmup_ms: 5,
        measure_ms: 30,
        ..RpcOptions::quick()
    }
}

#[test]
fn a_tiny_run_reports_every_field_and_the_patterns_counts() {
    let opts = tiny(&["farm", "wflush", "w-rflush"], &[SIZE]);
    let points = rpc::run(&opts, |_| {}).expect("run");
    assert_eq!(points.len(), 3);
    let json = serde_json::to_value(&points).unwrap();
    let label = rowankv_fabric::WireModel::CONNECTX5.label();
    for p in json.as_array().unwrap() {
        for field in [
            "design",
            "size_bytes",
            "load",
            "ops_per_sec",
            "p50_us",
            "p99_us",
            "round_trips_per_op",
            "verbs_per_op",
            "messages_per_op",
            "bytes_to_receiver_per_op",
            "bytes_to_sender_per_op",
            "receiver_persists_per_op",
            "wire_model",
            "op_counts",
        ] {
            assert!(p.get(field).is_some(), "{field} missing in {p}");
        }
        assert_eq!(p["load"], "light");
        assert_eq!(p["size_bytes"], SIZE);
        assert_eq!(p["wire_model"], label.as_str());
        assert!(p["ops_per_sec"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["p99_us"].as_f64().unwrap() >= p["p50_us"].as_f64().unwrap());
    }
    let get = |d: &str| points.iter().find(|p| p.design == d).unwrap();
    let exact = |v: Option<f64>, want: f64, what: &str| {
        assert_eq!(v, Some(want), "{what}");
    };

    // FaRM: WRITE the request, WRITE the reply; the CPU persists the ring slot.
    let farm = get("farm");
    assert_eq!(farm.kind, "classic");
    assert_eq!(farm.family, "write");
    exact(farm.round_trips_per_op, 1.0, "farm round trips");
    exact(farm.sender_verbs_per_op, 1.0, "farm sender verbs");
    exact(farm.receiver_verbs_per_op, 1.0, "farm receiver verbs");
    exact(farm.messages_per_op, 2.0, "farm messages");
    exact(farm.receiver_persists_per_op, 1.0, "farm persists");
    exact(
        farm.bytes_to_receiver_per_op,
        CLASSIC_HEADER + SIZE as f64,
        "farm bytes to the receiver",
    );
    exact(
        farm.bytes_to_sender_per_op,
        CLASSIC_HEADER + REPLY,
        "farm bytes to the sender",
    );

    // WFlush: WRITE + FLUSH + ATOMIC WRITE, one round trip to durable; the
    // completion by SEND; the receiver's CPU persists only its header line.
    let entry = entry_bytes(request_bytes(SIZE)) as f64;
    let wflush = get("wflush");
    assert_eq!(wflush.kind, "durable");
    exact(wflush.round_trips_per_op, 1.0, "wflush round trips");
    exact(wflush.sender_verbs_per_op, 3.0, "wflush sender verbs");
    exact(wflush.receiver_verbs_per_op, 1.0, "wflush receiver verbs");
    exact(wflush.messages_per_op, 4.0, "wflush messages");
    exact(wflush.receiver_persists_per_op, 1.0, "wflush persists");
    exact(wflush.bytes_to_receiver_per_op, entry, "wflush bytes");
    exact(
        wflush.bytes_to_sender_per_op,
        REPLY_HEADER_BYTES as f64 + REPLY,
        "wflush reply bytes",
    );

    // W-RFlush: one WRITE; the receiver's CPU persists the entry (emulated RFlush)
    // and its header, and SENDs a durable notice and a completion.
    let wr = get("w-rflush");
    exact(wr.round_trips_per_op, 1.0, "w-rflush round trips");
    exact(wr.sender_verbs_per_op, 1.0, "w-rflush sender verbs");
    exact(wr.receiver_verbs_per_op, 2.0, "w-rflush receiver verbs");
    exact(wr.receiver_persists_per_op, 2.0, "w-rflush persists");
    exact(
        wr.bytes_to_sender_per_op,
        2.0 * REPLY_HEADER_BYTES as f64 + REPLY,
        "w-rflush reply bytes",
    );

    // Every point says what its op/s counts, and the two kinds differ.
    assert_ne!(farm.op_counts, wflush.op_counts);
    let table = rpc::table(&points);
    assert!(table.starts_with(&format!("Every line below: {label}")));
    assert_eq!(
        table.lines().filter(|l| l.starts_with("wflush ")).count(),
        1
    );
    // The p99 goal compares W-family designs at 1 KiB: present for both.
    let goals = rpc::goals(&points);
    assert_eq!(
        goals.iter().filter(|g| g.metric == "p99").count(),
        2,
        "{goals:?}"
    );
    assert!(rpc::goals_report(&goals).contains("comparisons met"));
}

#[test]
fn fasst_above_its_mtu_is_reported_not_applicable() {
    let opts = tiny(&["fasst"], &[64 << 10]);
    let points = rpc::run(&opts, |_| {}).expect("run");
    assert_eq!(points.len(), 1);
    let p = &points[0];
    assert!(!p.applicable);
    assert!(p.ops_per_sec.is_none() && p.p99_us.is_none());
    assert!(p.note.as_deref().unwrap().contains("MTU"), "{:?}", p.note);
    let json = serde_json::to_value(p).unwrap();
    assert!(json["ops_per_sec"].is_null());
    assert!(rpc::table(&points).contains("not applicable"));
}
