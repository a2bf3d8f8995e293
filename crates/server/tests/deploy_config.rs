//! The configuration files of a deployment: the examples in `config/` are valid,
//! and every kind of mistake is an error naming its key (never a silent default).

use std::path::{Path, PathBuf};

use rowankv_server::deploy::{parse_bytes, CmDeployment, ServerDeployment, StoreFile};
use rowankv_server::replication::Strategy;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A directory holding `secret` (the examples' secret file) and the example
/// files copied beside it.
fn with_examples() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), "0123456789abcdef0123\n").unwrap();
    for f in ["server.toml", "cm.toml"] {
        std::fs::copy(repo().join("config").join(f), dir.path().join(f)).unwrap();
    }
    dir
}

#[test]
fn the_example_files_are_valid() {
    let dir = with_examples();
    let s = ServerDeployment::load(&dir.path().join("server.toml")).unwrap();
    assert_eq!(s.cluster_id, 0x526f_7761_6e4b_5601);
    assert_eq!(
        s.secret, b"0123456789abcdef0123",
        "trailing newline dropped"
    );
    assert_eq!(s.pool_bytes, 1 << 30);
    assert_eq!(s.segment_bytes, 4 << 20);
    assert_eq!(s.workers, 4);
    assert_eq!(s.advertise, "127.0.0.1:7301");
    assert_eq!(s.pool_path, dir.path().join("data/server-1.pool"));
    let c = CmDeployment::load(&dir.path().join("cm.toml")).unwrap();
    assert_eq!(c.strategy, Strategy::Rowan);
    assert_eq!(c.bootstrap.servers, 3);
    assert_eq!(c.lease_ms, 200);
    assert!(
        matches!(&c.store, StoreFile::Embedded { path } if *path == dir.path().join("data/cm.store"))
    );
}

/// The error of the example server file with `from` replaced by `to`.
fn server_error(from: &str, to: &str) -> String {
    let dir = with_examples();
    let path = dir.path().join("server.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "the example has no {from:?}");
    let text = text.replacen(from, to, 1);
    ServerDeployment::from_text(&path, &text)
        .expect_err("a broken file was accepted")
        .to_string()
}

fn cm_error(from: &str, to: &str) -> String {
    let dir = with_examples();
    let path = dir.path().join("cm.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "the example has no {from:?}");
    let text = text.replacen(from, to, 1);
    CmDeployment::from_text(&path, &text)
        .expect_err("a broken file was accepted")
        .to_string()
}

#[track_caller]
fn says(error: String, words: &[&str]) {
    for w in words {
        assert!(error.contains(w), "{error:?} does not say {w:?}");
    }
}

#[test]
fn mistakes_in_a_server_file_are_errors_naming_the_key() {
    says(
        server_error("workers = 4", "wrokers = 4"),
        &["unknown field", "wrokers"],
    );
    says(
        server_error("workers = 4", ""),
        &["missing field", "workers"],
    );
    says(
        server_error("workers = 4", "workers = 0"),
        &["workers", "1..=255"],
    );
    says(
        server_error("workers = 4", "workers = \"four\""),
        &["invalid type"],
    );
    says(
        server_error("listen = \"127.0.0.1:7301\"", "listen = \"127.0.0.1\""),
        &["listen", "host:port"],
    );
    says(
        server_error("listen = \"127.0.0.1:7301\"", "listen = \"0.0.0.0:7301\""),
        &["advertise", "wildcard"],
    );
    says(
        server_error("cms = [\"127.0.0.1:7400\"]", "cms = []"),
        &["cms", "no CM"],
    );
    says(
        server_error("cms = [\"127.0.0.1:7400\"]", "cms = [\"cm:port\"]"),
        &["cms", "not a port"],
    );
    says(
        server_error("medium = \"emulated\"", "medium = \"tape\""),
        &["pool.medium", "tape"],
    );
    says(
        server_error("bytes = \"1GiB\"", "bytes = \"1GB\""),
        &["unknown unit", "GB"],
    );
    says(
        server_error("bytes = \"1GiB\"", "bytes = \"16MiB\""),
        &["pool.bytes", "fewer than 16 segments"],
    );
    says(
        server_error("segment_bytes = \"4MiB\"", "segment_bytes = 5000"),
        &["pool.segment_bytes", "4 KiB"],
    );
    says(
        server_error("cluster_id = 0x526f77616e4b5601", "cluster_id = 0"),
        &["cluster_id"],
    );
    says(
        server_error("secret_file = \"secret\"", "secret_file = \"nothing-here\""),
        &["secret_file", "nothing-here"],
    );
    says(server_error("[pool]", "[pool"), &["line"]);
}

#[test]
fn a_short_secret_is_refused() {
    let dir = with_examples();
    std::fs::write(dir.path().join("secret"), "short\n").unwrap();
    let e = ServerDeployment::load(&dir.path().join("server.toml"))
        .unwrap_err()
        .to_string();
    says(e, &["secret_file", "5 bytes", "at least 16"]);
}

#[test]
fn mistakes_in_a_cm_file_are_errors_naming_the_key() {
    says(
        cm_error("strategy = \"rowan\"", "strategy = \"paxos\""),
        &["bootstrap.strategy", "paxos"],
    );
    says(
        cm_error("replication_factor = 3", "replication_factor = 4"),
        &["bootstrap.replication_factor", "1..=3"],
    );
    says(
        cm_error("servers = 3", "servers = 0"),
        &["bootstrap.servers"],
    );
    says(
        cm_error("shards_per_server = 16", "shards_per_server = 30000"),
        &["bootstrap.shards_per_server"],
    );
    says(cm_error("lease_ms = 200", "lease_ms = 1"), &["lease_ms"]);
    says(
        cm_error("kind = \"embedded\"", "kind = \"zookeeper\""),
        &["unknown variant", "zookeeper"],
    );
    says(
        cm_error(
            "kind = \"embedded\"\npath = \"data/cm.store\"",
            "kind = \"etcd\"\nendpoints = [\"https://10.0.0.1:2379\"]",
        ),
        &["store.endpoints", "http://"],
    );
    says(
        cm_error(
            "kind = \"embedded\"\npath = \"data/cm.store\"",
            "kind = \"etcd\"\nendpoints = [\"http://10.0.0.1:2379\"]\nprefix = \"rowankv\"",
        ),
        &["store.prefix"],
    );
}

#[test]
fn an_etcd_store_is_read_with_its_default_prefix() {
    let dir = with_examples();
    let path = dir.path().join("cm.toml");
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "kind = \"embedded\"\npath = \"data/cm.store\"",
        "kind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\", \"http://127.0.0.1:22379\"]",
        1,
    );
    let c = CmDeployment::from_text(&path, &text).unwrap();
    match c.store {
        StoreFile::Etcd { endpoints, prefix } => {
            assert_eq!(endpoints.len(), 2);
            assert_eq!(prefix, "/rowankv/");
        }
        other => panic!("read as {other:?}"),
    }
}

#[test]
fn sizes_take_binary_units() {
    assert_eq!(parse_bytes("4096"), Ok(4096));
    assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
    assert_eq!(parse_bytes("8 GiB"), Ok(8 << 30));
    assert_eq!(parse_bytes("1KiB"), Ok(1024));
    assert!(parse_bytes("1kb").unwrap_err().contains("unknown unit"));
    assert!(parse_bytes("GiB").unwrap_err().contains("not a size"));
    assert!(parse_bytes("99999999TiB")
        .unwrap_err()
        .contains("too large"));
}
