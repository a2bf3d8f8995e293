//! The metrics endpoints (`crates/deploy/src/metrics.rs`): a CM and two
//! servers run in this process as `rowankv cm` / `rowankv server` run them
//! (`cm::run`, `server::run` on the tcp fabric, from TOML files), each with
//! `[metrics] listen`; the endpoints are scraped over real TCP.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rowankv_client::ClientConfig;
use rowankv_cm::role::CmStats;
use rowankv_deploy::metrics::{self, CmMetrics, REQUEST_BYTES_MAX};
use rowankv_server::deploy::{CmDeployment, ServerDeployment};

const CLUSTER_ID: u64 = 0x4d45_5452;
const SECRET: &str = "the secret of the metrics tests\n";

/// A port free now, below the kernel's ephemeral range (so that no port the
/// kernel hands out meanwhile takes it before its listener binds it), never
/// the same one twice in this binary.
fn free_port() -> u16 {
    use std::sync::atomic::AtomicU16;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        10_000 + (std::process::id() % 1_000) as u16 * 10,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::AcqRel);
        assert!(port < 32_000, "no free port left below the ephemeral range");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Send `request` to `port` and read the whole answer (the endpoint closes
/// the connection after it): (status code, body).
fn http(port: u16, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).expect("sending the request");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("reading the answer");
    let text = String::from_utf8(answer).expect("a text answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|l| l.trim().parse().ok())
        .expect("a Content-Length");
    if !request.starts_with(b"HEAD ") {
        assert_eq!(length, body.len(), "Content-Length of {head:?}");
    }
    (status, body.to_string())
}

fn get(port: u16, path: &str) -> (u16, String) {
    http(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes(),
    )
}

/// A scrape, parsed: `name{label="value",…}` (labels in their order) → value.
/// Panics on any line that is neither a comment nor `name{labels} value`.
type Samples = BTreeMap<String, f64>;

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Check `{k="v",…}` and return it as written.
fn check_labels(labels: &str, line: &str) {
    let inner = labels
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .unwrap_or_else(|| panic!("labels of {line:?}"));
    let mut rest = inner;
    while !rest.is_empty() {
        let (name, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("a label of {line:?}"));
        assert!(is_name(name), "label name {name:?} in {line:?}");
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                '\n' => panic!("a newline in a label value of {line:?}"),
                _ => {}
            }
        }
        let end = end.unwrap_or_else(|| panic!("an unterminated label value in {line:?}"));
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn parse(text: &str) -> Samples {
    let mut samples = Samples::new();
    let mut types = 0;
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            if comment.starts_with(" TYPE ") {
                types += 1;
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("value {v:?} of {line:?}")),
        };
        let name = series.split('{').next().unwrap();
        assert!(is_name(name), "metric name {name:?} in {line:?}");
        if series.len() > name.len() {
            check_labels(&series[name.len()..], line);
        }
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "{series} twice"
        );
    }
    assert!(types > 0, "no # TYPE line in {text:?}");
    samples
}

fn scrape(port: u16) -> Samples {
    let (status, body) = get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    parse(&body)
}

/// The value of `series`, 0 when absent (a counter not shown yet).
fn value(s: &Samples, series: &str) -> f64 {
    s.get(series).copied().unwrap_or(0.0)
}

/// Sum of every series of `name` whose labels contain all of `labels`.
fn sum(s: &Samples, name: &str, labels: &[&str]) -> f64 {
    s.iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn the_endpoint_serves_only_get_metrics_and_outlives_bad_requests() {
    let stats = Arc::new(CmStats::default());
    stats.leases_granted.store(7, Ordering::Relaxed);
    stats.active.store(1, Ordering::Relaxed);
    let endpoint = metrics::start(
        "127.0.0.1:0".parse().unwrap(),
        CmMetrics::registry(stats.clone()),
        "test",
    )
    .unwrap();
    let port = endpoint.address().port();

    let s = scrape(port);
    assert_eq!(value(&s, "rowankv_cm_leases_granted_total"), 7.0);
    assert_eq!(value(&s, "rowankv_cm_active"), 1.0);

    assert_eq!(get(port, "/").0, 404);
    assert_eq!(get(port, "/metricsx").0, 404);
    let (status, _) = http(port, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 405);
    let (status, _) = http(port, b"\x00\x01\x02 garbage \xff\r\n\r\n");
    assert_eq!(status, 400);
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
    huge.resize(REQUEST_BYTES_MAX * 4, b'a');
    let (status, _) = http(port, &huge);
    assert_eq!(status, 431);
    // A client that connects and leaves without a word.
    drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    // HEAD: the head only.
    let (status, body) = http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!((status, body.as_str()), (200, ""));

    // Still serving, and reading the counters at scrape time.
    stats.leases_granted.store(9, Ordering::Relaxed);
    let s = scrape(port);
    assert_eq!(value(&s, "rowankv_cm_leases_granted_total"), 9.0);

    drop(endpoint);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the endpoint stops when dropped"
    );
}

/// One process of the test cluster, stopped (and joined) when dropped.
struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn spawn(name: &str, f: impl FnOnce(Arc<AtomicBool>) + Send + 'static) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || f(s))
            .unwrap();
        Running {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct TestCluster {
    cms: Vec<String>,
    cm_metrics: u16,
    server_metrics: Vec<u16>,
    /// Servers first, then the CM: dropped in that order.
    processes: Vec<Running>,
}

fn start_cluster(dir: &Path, servers: usize) -> TestCluster {
    std::fs::write(dir.join("secret"), SECRET).unwrap();
    let cm = format!("127.0.0.1:{}", free_port());
    let cm_metrics = free_port();
    let cm_file = dir.join("cm.toml");
    std::fs::write(
        &cm_file,
        format!(
            "cluster_id = {CLUSTER_ID}\nsecret_file = \"secret\"\nlisten = \"{cm}\"\nlease_ms = 1000\n\
             [bootstrap]\nservers = {servers}\nshards_per_server = 2\nreplication_factor = 2\nstrategy = \"rowan\"\n\
             [store]\nkind = \"embedded\"\npath = \"store.json\"\n\
             [metrics]\nlisten = \"127.0.0.1:{cm_metrics}\"\n"
        ),
    )
    .unwrap();
    let dep = CmDeployment::load(&cm_file).unwrap();
    let cm_process = Running::spawn("cm", move |stop| {
        if let Err(e) = rowankv_deploy::cm::run(&dep, stop) {
            panic!("the CM: {e}");
        }
    });
    let mut processes = Vec::new();
    let mut server_metrics = Vec::new();
    for i in 0..servers {
        let port = free_port();
        server_metrics.push(port);
        let file = dir.join(format!("server-{i}.toml"));
        std::fs::write(
            &file,
            format!(
                "cluster_id = {CLUSTER_ID}\nsecret_file = \"secret\"\ncms = [\"{cm}\"]\n\
                 listen = \"127.0.0.1:{}\"\nworkers = 2\n\
                 [pool]\npath = \"server-{i}.pool\"\nbytes = \"64MiB\"\nmedium = \"emulated\"\nsegment_bytes = \"1MiB\"\n\
                 [metrics]\nlisten = \"127.0.0.1:{port}\"\n",
                free_port()
            ),
        )
        .unwrap();
        let dep = ServerDeployment::load(&file).unwrap();
        processes.push(Running::spawn(&format!("server-{i}"), move |stop| {
            if let Err(e) = rowankv_deploy::server::run(&dep, stop) {
                panic!("server: {e}");
            }
        }));
    }
    processes.push(cm_process);
    TestCluster {
        cms: vec![cm],
        cm_metrics,
        server_metrics,
        processes,
    }
}

/// Sum over every server's scrape.
fn total(scrapes: &[Samples], name: &str, labels: &[&str]) -> f64 {
    scrapes.iter().map(|s| sum(s, name, labels)).sum()
}

#[test]
fn a_clusters_metrics_count_its_requests_and_time_them() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(dir.path(), 2);
    let secret = SECRET.trim_end().as_bytes().to_vec();
    let config = ClientConfig {
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };

    // The endpoints serve from the start, before the servers have joined.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", cluster.server_metrics[0])).is_err() {
        assert!(Instant::now() < deadline, "no metrics endpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = scrape(cluster.server_metrics[0]);
    assert!(s.contains_key("rowankv_server_up"), "{s:?}");

    // Wait until every server serves: a write to each shard's key succeeds.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut remote = loop {
        assert!(Instant::now() < deadline, "the cluster did not start");
        let Ok(mut r) =
            rowankv_deploy::client::connect(CLUSTER_ID, &secret, &cluster.cms, config.clone())
        else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let all = (0..16).all(|i| r.client.put(format!("warm-{i}").as_bytes(), b"w").is_ok());
        if all {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };

    let before: Vec<Samples> = cluster.server_metrics.iter().map(|&p| scrape(p)).collect();
    const PUTS: usize = 40;
    const GETS: usize = 25;
    for i in 0..PUTS {
        remote
            .client
            .put(
                format!("key-{i}").as_bytes(),
                format!("value-{i}").as_bytes(),
            )
            .expect("a put");
    }
    for i in 0..GETS {
        let v = remote
            .client
            .get(format!("key-{i}").as_bytes())
            .expect("a get");
        assert_eq!(v, format!("value-{i}").as_bytes());
    }
    let after: Vec<Samples> = cluster.server_metrics.iter().map(|&p| scrape(p)).collect();
    let delta =
        |name: &str, labels: &[&str]| total(&after, name, labels) - total(&before, name, labels);

    // Requests and their latencies, counted at the servers that served them.
    let puts = ["command=\"put\""];
    let gets = ["command=\"get\""];
    assert_eq!(delta("rowankv_server_requests_total", &puts), PUTS as f64);
    assert_eq!(delta("rowankv_server_requests_total", &gets), GETS as f64);
    assert_eq!(delta("rowankv_server_errors_total", &puts), 0.0);
    assert_eq!(delta("rowankv_server_errors_total", &gets), 0.0);
    let latency = "rowankv_server_request_duration_seconds";
    assert_eq!(delta(&format!("{latency}_count"), &puts), PUTS as f64);
    assert_eq!(delta(&format!("{latency}_count"), &gets), GETS as f64);
    assert!(delta(&format!("{latency}_sum"), &puts) > 0.0);
    // Every write went to its one backup and was acknowledged (RF 2).
    let acks = delta("rowankv_server_replication_ack_duration_seconds_count", &[]);
    assert!(acks >= PUTS as f64, "{acks} ACKs timed for {PUTS} writes");
    // Buckets are cumulative and end in +Inf = count.
    for s in &after {
        let mut last = 0.0;
        for (k, v) in s
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{latency}_bucket{{command=\"put\"")))
        {
            let _ = k;
            assert!(*v >= 0.0);
            last = f64::max(last, *v);
        }
        let inf = value(
            s,
            &format!("{latency}_bucket{{command=\"put\",le=\"+Inf\"}}"),
        );
        assert_eq!(inf, last, "the +Inf bucket is the largest");
        assert_eq!(
            inf,
            value(s, &format!("{latency}_count{{command=\"put\"}}"))
        );
    }

    // State read at scrape time.
    for s in &after {
        assert_eq!(value(s, "rowankv_server_up"), 1.0);
        assert!(value(s, "rowankv_server_term") >= 1.0);
        assert!(value(s, "rowankv_server_lease_remaining_seconds") > 0.0);
        assert!(value(s, "rowankv_server_lease_age_seconds") >= 0.0);
        assert!(value(s, "rowankv_server_free_segments") > 0.0);
        assert!(sum(s, "rowankv_server_segments", &[]) > 0.0);
        assert!(s.contains_key("rowankv_server_blog_digest_backlog_segments"));
        assert!(s.contains_key("rowankv_server_cleaner_freed_bytes_total"));
        // Media bytes lag request bytes while lines sit in the write-combining
        // buffers, so DLWA may read below 1 early on.
        assert!(s.keys().any(|k| k.starts_with("rowankv_pool_dlwa{pool=")));
        assert!(sum(s, "rowankv_pool_request_bytes_total", &[]) > 0.0);
    }
    let cm = scrape(cluster.cm_metrics);
    assert_eq!(value(&cm, "rowankv_cm_active"), 1.0);
    assert_eq!(value(&cm, "rowankv_cm_members"), 2.0);
    assert!(value(&cm, "rowankv_cm_term") >= 1.0);
    assert!(value(&cm, "rowankv_cm_configs_committed_total") >= 1.0);
    assert!(value(&cm, "rowankv_cm_leases_granted_total") > 0.0);
    assert_eq!(value(&cm, "rowankv_cm_servers_failed_total"), 0.0);

    // Bad requests get an error answer; the endpoint goes on serving.
    let port = cluster.server_metrics[1];
    assert_eq!(get(port, "/nothing").0, 404);
    assert_eq!(http(port, b"garbage\r\n\r\n").0, 400);
    let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    huge.resize(REQUEST_BYTES_MAX * 2, b'x');
    assert_eq!(http(port, &huge).0, 431);
    let again = scrape(port);
    assert!(
        value(&again, "rowankv_server_requests_total{command=\"put\"}")
            >= value(&after[1], "rowankv_server_requests_total{command=\"put\"}")
    );

    // Stopping the processes stops their endpoints.
    drop(remote);
    let ports: Vec<u16> = cluster
        .server_metrics
        .iter()
        .copied()
        .chain([cluster.cm_metrics])
        .collect();
    drop(cluster.processes);
    for p in ports {
        assert!(
            TcpStream::connect(("127.0.0.1", p)).is_err(),
            "port {p} still served after its process stopped"
        );
    }
}
