//! The Prometheus endpoint of a server or CM process (`[metrics] listen =
//! "host:port"`; every metric is listed in `docs/deployment.md`, "Metrics").
//!
//! A small HTTP/1.1 server on one thread of its own, on a std `TcpListener`:
//! `GET /metrics` (or `HEAD`) is answered with the Prometheus text exposition
//! format (version 0.0.4) from `prometheus-client`'s encoder; any other path
//! is answered 404, another method 405, a request that is not HTTP 400, one
//! whose head exceeds [`REQUEST_BYTES_MAX`] 431, one that does not arrive
//! within [`REQUEST_TIMEOUT`] 408. One connection is served at a time and
//! closed after its answer, so a scraper costs one thread and a bounded
//! buffer whatever it sends.
//!
//! Nothing is counted for the endpoint: the collectors ([`ServerMetrics`],
//! [`CmMetrics`]) read, at scrape time, the counters the roles keep anyway
//! (`ServerStats`, `CmStats`: relaxed atomics, no lock on the hot path) and
//! the state they can observe (the engine's segment census, the b-log's
//! backlog, the media model's bytes), the same sources `rowankv status`
//! reads. The endpoint stops when its [`MetricsEndpoint`] is dropped (the
//! process stopping), within [`ACCEPT_POLL`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, DescriptorEncoder, EncodeGaugeValue, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use rowankv_cm::role::CmStats;
use rowankv_fabric::Nic;
use rowankv_server::server::{LatencyHistogram, ERROR_CODE_SLOTS};
use rowankv_server::{ServerShared, ServerStats};

use crate::{perr, ProcessError};

/// The largest request head read (request line and headers); a longer one is
/// answered 431 and the connection closed.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a connection may take to send its request, and to take the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the listener looks for a connection (and for the stop flag).
pub const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// Bytes of a refused request read and discarded after the answer, at most, so
/// that the client reads the answer instead of a reset.
const DRAIN_BYTES_MAX: usize = 1 << 20;

/// A running endpoint; dropping it stops the endpoint's thread.
pub struct MetricsEndpoint {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Where it listens (the port the kernel picked, for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serve `registry` at `listen` until the endpoint is dropped. `what` names
/// the process in the log.
pub fn start(
    listen: SocketAddr,
    registry: Registry,
    what: &str,
) -> Result<MetricsEndpoint, ProcessError> {
    let listener =
        TcpListener::bind(listen).map_err(perr(&format!("the metrics endpoint on {listen}")))?;
    listener
        .set_nonblocking(true)
        .map_err(perr("the metrics listener"))?;
    let address = listener
        .local_addr()
        .map_err(perr("the metrics listener's address"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let name = what.to_string();
    let thread = std::thread::Builder::new()
        .name(format!("{what}-metrics"))
        .spawn(move || serve(&listener, &registry, &stopping, &name))
        .map_err(perr("the metrics thread"))?;
    tracing::info!(%address, "metrics served at http://{address}/metrics");
    Ok(MetricsEndpoint {
        address,
        stop,
        thread: Some(thread),
    })
}

fn serve(listener: &TcpListener, registry: &Registry, stop: &AtomicBool, what: &str) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, registry) {
                    tracing::warn!(process = what, %peer, error = %e, "metrics request");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!(process = what, error = %e, "accepting a metrics connection");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

/// Why a request got no metrics.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("answered {status}: {why}")]
    Refused { status: &'static str, why: String },
    #[error("encoding the metrics: {0}")]
    Encode(std::fmt::Error),
}

/// Read one request from `stream` and answer it.
fn answer(mut stream: TcpStream, registry: &Registry) -> Result<(), RequestError> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let head = match read_head(&mut stream) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(()), // closed without a request
        Err(e) => return refuse(stream, e),
    };
    let (head_only, path) = match parse_head(&head) {
        Ok(r) => r,
        Err(e) => return refuse(stream, e),
    };
    if path != "/metrics" {
        let e = refused("404 Not Found", format!("no {path:?} here: GET /metrics"));
        return refuse(stream, e);
    }
    let mut body = String::new();
    if let Err(e) = prometheus_text::encode(&mut body, registry) {
        write_answer(&mut stream, "500 Internal Server Error", "", false)?;
        return Err(RequestError::Encode(e));
    }
    write_answer(&mut stream, "200 OK", &body, head_only)?;
    Ok(())
}

fn refused(status: &'static str, why: impl Into<String>) -> RequestError {
    RequestError::Refused {
        status,
        why: why.into(),
    }
}

/// Answer a request that gets no metrics with its status, then read what the
/// client still sends (bounded), so that it reads the answer, not a reset.
fn refuse(mut stream: TcpStream, e: RequestError) -> Result<(), RequestError> {
    if let RequestError::Refused { status, why } = &e {
        let text = format!("{why}\n");
        write_answer(&mut stream, status, &text, false)?;
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < DRAIN_BYTES_MAX {
            match stream.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    }
    Err(e)
}

/// The request head (up to the blank line), `None` if the connection closed
/// before sending anything.
fn read_head(stream: &mut TcpStream) -> Result<Option<Vec<u8>>, RequestError> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(refused(
                    "408 Request Timeout",
                    format!("no complete request within {REQUEST_TIMEOUT:?}"),
                ))
            }
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            if head.is_empty() {
                return Ok(None);
            }
            return Err(refused("400 Bad Request", "the request ended early"));
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_end(&head) {
            head.truncate(end);
            return Ok(Some(head));
        }
        if head.len() > REQUEST_BYTES_MAX {
            return Err(refused(
                "431 Request Header Fields Too Large",
                format!("a request head of more than {REQUEST_BYTES_MAX} bytes"),
            ));
        }
    }
}

/// Where the head ends (its blank line), if it is complete.
fn find_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// (HEAD rather than GET, the path) of a request head.
fn parse_head(head: &[u8]) -> Result<(bool, String), RequestError> {
    let bad = |why: &str| refused("400 Bad Request", why.to_string());
    let text = std::str::from_utf8(head).map_err(|_| bad("a request head that is not text"))?;
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("not an HTTP request line"));
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err(bad("not an HTTP/1 request"));
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        other => {
            return Err(refused(
                "405 Method Not Allowed",
                format!("{other}: only GET and HEAD"),
            ))
        }
    };
    let path = target.split('?').next().unwrap_or(target);
    Ok((head_only, path.to_string()))
}

fn write_answer(
    stream: &mut TcpStream,
    status: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let content_type = if status.starts_with("200") {
        prometheus_text::CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

// ---------------------------------------------------------------------------
// Encoding helpers: a metric family per call, written through the encoder.

type Labels = Vec<(&'static str, String)>;

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge<V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: V,
) -> std::fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, u64)],
) -> std::fmt::Result {
    if series.is_empty() {
        return Ok(());
    }
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        m.encode_family(labels)?
            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

fn gauges<V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, V)],
) -> std::fmt::Result {
    if series.is_empty() {
        return Ok(());
    }
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        m.encode_family(labels)?.encode_gauge(v)?;
    }
    Ok(())
}

fn histograms(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, &LatencyHistogram)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in series {
        let (buckets, sum) = h.snapshot();
        let count = buckets.iter().map(|(_, n)| n).sum();
        m.encode_family(labels)?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    Ok(())
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// A server's metrics.

/// What a server process shows: the server of its current incarnation (a
/// server the CM evicts joins again as a new one; the endpoint stays), its
/// pool's path as the `pool` label.
pub struct ServerMetrics<N: Nic> {
    server: RwLock<Weak<ServerShared<N>>>,
    pool: String,
}

impl<N: Nic> std::fmt::Debug for ServerMetrics<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics")
            .field("pool", &self.pool)
            .finish()
    }
}

impl<N: Nic> ServerMetrics<N> {
    pub fn new(pool: String) -> Arc<ServerMetrics<N>> {
        Arc::new(ServerMetrics {
            server: RwLock::new(Weak::new()),
            pool,
        })
    }

    /// Show `server` from now on.
    pub fn show(&self, server: &Arc<ServerShared<N>>) {
        *self.server.write() = Arc::downgrade(server);
    }

    /// A registry of these metrics, for [`start`].
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(self.clone()));
        r
    }
}

impl<N: Nic> Collector for ServerMetrics<N> {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let server = self.server.read().upgrade();
        gauge(
            &mut e,
            "rowankv_server_up",
            "1 while the server has joined and runs its roles, 0 while it starts or joins",
            i64::from(server.is_some()),
        )?;
        let Some(s) = server else {
            return Ok(());
        };
        encode_server(&mut e, &s, &self.pool)
    }
}

fn encode_server<N: Nic>(
    e: &mut DescriptorEncoder,
    s: &ServerShared<N>,
    pool: &str,
) -> std::fmt::Result {
    let st = &s.stats;
    gauges(
        e,
        "rowankv_server_info",
        "The server's node and replication strategy (value 1)",
        &[(
            vec![
                ("node", s.node.0.to_string()),
                ("strategy", s.strategy.name().to_string()),
            ],
            1i64,
        )],
    )?;

    // Requests, errors and latencies, by command.
    let commands = ServerStats::COMMANDS;
    let requests: Vec<(Labels, u64)> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| (vec![("command", c.to_string())], load(&st.requests[i])))
        .collect();
    counters(
        e,
        "rowankv_server_requests",
        "Requests the workers received, by command",
        &requests,
    )?;
    let mut errors: Vec<(Labels, u64)> = Vec::new();
    for (i, c) in commands.iter().enumerate() {
        for slot in 0..ERROR_CODE_SLOTS {
            let n = load(&st.errors[i][slot]);
            if n > 0 {
                let code = ServerStats::error_code_name(slot).unwrap_or_else(|| slot.to_string());
                errors.push((vec![("command", c.to_string()), ("code", code)], n));
            }
        }
    }
    counters(
        e,
        "rowankv_server_errors",
        "Error answers of the workers, by command and error code (only those that occurred)",
        &errors,
    )?;
    let timed = [
        ServerStats::CMD_GET,
        ServerStats::CMD_PUT,
        ServerStats::CMD_DEL,
        ServerStats::CMD_PUT_IF,
        ServerStats::CMD_DEL_IF,
        ServerStats::CMD_SCAN,
    ];
    let latencies: Vec<(Labels, &LatencyHistogram)> = timed
        .iter()
        .map(|&i| (vec![("command", commands[i].to_string())], &st.latency[i]))
        .collect();
    histograms(
        e,
        "rowankv_server_request_duration_seconds",
        "Client requests answered successfully, from their arrival at a worker to the answer \
         (a write's after its last replica's ACK)",
        &latencies,
    )?;
    histograms(
        e,
        "rowankv_server_replication_ack_duration_seconds",
        "From replicating a write to one backup to that backup's durable ACK",
        &[(Vec::new(), &st.replication_ack)],
    )?;
    counter(
        e,
        "rowankv_server_replication_failures",
        "Replications of a write to a backup that failed (the write is replicated again)",
        load(&st.replication_failures),
    )?;
    counter(
        e,
        "rowankv_server_replicated_in",
        "Replicate requests (RPC strategies) appended here as a backup",
        load(&st.replicated_in),
    )?;
    counter(
        e,
        "rowankv_server_segment_grants",
        "Segments granted to the remote logs of other servers (WRITE strategies)",
        load(&st.grants),
    )?;

    // Configuration and lease.
    gauge(
        e,
        "rowankv_server_term",
        "The configuration term the server holds",
        s.term().0 as i64,
    )?;
    gauge(
        e,
        "rowankv_server_committed_term",
        "The highest term the server knows committed",
        s.committed_term().0 as i64,
    )?;
    let now = s.engine.config().clock.now_ns() as i128;
    let until = s.lease_until_ns() as i128;
    gauge(
        e,
        "rowankv_server_lease_remaining_seconds",
        "How long the server's lease still runs (negative: expired)",
        (until - now) as f64 / 1e9,
    )?;
    if until > 0 {
        let granted_from = until - s.settings.failover.lease_ns as i128;
        gauge(
            e,
            "rowankv_server_lease_age_seconds",
            "Time since the renewal that the server's current lease runs from was sent",
            (now - granted_from) as f64 / 1e9,
        )?;
    }

    // Failover: promotions and re-replication.
    counter(
        e,
        "rowankv_server_promotions",
        "Shards this server started to serve as primary after a promotion or a cold start",
        load(&st.shards_served),
    )?;
    gauge(
        e,
        "rowankv_server_promotions_in_progress",
        "Shards being promoted or cold-started here (gathering, installing, scattering)",
        load(&st.recoveries_in_progress) as i64,
    )?;
    gauge(
        e,
        "rowankv_server_rereplication_copies_in_progress",
        "Copies of a shard to a joining backup under way",
        load(&st.copies_in_progress) as i64,
    )?;
    gauge(
        e,
        "rowankv_server_rereplication_pages_remaining",
        "Pages of those copies not yet acknowledged by the joining backups",
        load(&st.copy_pages_remaining) as i64,
    )?;
    counter(
        e,
        "rowankv_server_rereplication_copies",
        "Copies to joining backups finished (reported to the CM)",
        load(&st.copies_done),
    )?;
    counter(
        e,
        "rowankv_server_rereplication_entries",
        "Entries carried by the finished copies",
        load(&st.copy_entries_done),
    )?;
    counter(
        e,
        "rowankv_server_installed_entries",
        "Entries installed here by promotion, re-replication and cold start",
        load(&st.installed),
    )?;

    // Segments, b-log, cleaner.
    let census: Vec<(Labels, i64)> = s
        .engine
        .segment_census()
        .into_iter()
        .map(|((owner, state), n)| {
            (
                vec![
                    ("owner", format!("{owner:?}").to_lowercase()),
                    ("state", format!("{state:?}").to_lowercase()),
                ],
                n as i64,
            )
        })
        .collect();
    gauges(
        e,
        "rowankv_server_segments",
        "Segments in use, by owner and state",
        &census,
    )?;
    gauge(
        e,
        "rowankv_server_free_segments",
        "Free segments",
        s.engine.free_segments() as i64,
    )?;
    gauge(
        e,
        "rowankv_server_blog_digest_backlog_segments",
        "Used b-log segments not yet committed (waiting for their digest or their CommitVer)",
        s.blog.pending_segments().len() as i64,
    )?;
    gauge(
        e,
        "rowankv_server_blog_sealed_segments",
        "Segments sealed by remote senders, still in their grace period before digest",
        s.blog.sealed_segments().len() as i64,
    )?;
    let segment_bytes = s.engine.config().segment_size_bytes as u64;
    counter(
        e,
        "rowankv_server_cleaner_moved_bytes",
        "Bytes of live entries the cleaners moved",
        load(&st.cleaner_bytes_moved),
    )?;
    counter(
        e,
        "rowankv_server_cleaner_freed_bytes",
        "Bytes of segments the cleaners freed",
        load(&st.cleaner_segments_freed) * segment_bytes,
    )?;
    counter(
        e,
        "rowankv_server_cleaner_moved_entries",
        "Live entries the cleaners moved",
        load(&st.cleaner_entries_moved),
    )?;
    counter(
        e,
        "rowankv_server_cleaner_segments_cleaned",
        "Segments the cleaners cleaned",
        load(&st.cleaner_segments_cleaned),
    )?;

    // The pool's media (emulated PM with the media model only).
    if let Some(media) = s.engine.pool().media() {
        let m = media.stats();
        let label = || vec![("pool", pool.to_string())];
        counters(
            e,
            "rowankv_pool_request_bytes",
            "Bytes requested of the pool's DIMMs (64 per cache line written), as the media model counts them",
            &[(label(), m.request_bytes)],
        )?;
        counters(
            e,
            "rowankv_pool_media_bytes",
            "Bytes the pool's media wrote (whole 256 B XPLines), as the media model counts them",
            &[(label(), m.media_bytes)],
        )?;
        gauges(
            e,
            "rowankv_pool_dlwa",
            "Device-level write amplification since the process started: media bytes / request bytes",
            &[(label(), m.dlwa())],
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// A CM's metrics.

/// What a CM process shows: the counters of its role.
#[derive(Debug)]
pub struct CmMetrics {
    pub stats: Arc<CmStats>,
}

impl CmMetrics {
    /// A registry of `stats`, for [`start`].
    pub fn registry(stats: Arc<CmStats>) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(CmMetrics { stats }));
        r
    }
}

impl Collector for CmMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let st = &self.stats;
        let e = &mut e;
        let g = |c: &AtomicU64| load(c) as i64;
        gauge(
            e,
            "rowankv_cm_active",
            "1 while this CM is the active one",
            g(&st.active),
        )?;
        gauge(
            e,
            "rowankv_cm_term",
            "The term of the configuration the CM holds",
            g(&st.term),
        )?;
        gauge(
            e,
            "rowankv_cm_committed_term",
            "The highest term the CM knows committed",
            g(&st.committed_term),
        )?;
        gauge(
            e,
            "rowankv_cm_members",
            "Servers in the configuration",
            g(&st.members),
        )?;
        gauge(
            e,
            "rowankv_cm_joining_backups",
            "Joining backups in the configuration (shard, server), being filled by re-replication",
            g(&st.joining_backups),
        )?;
        counter(
            e,
            "rowankv_cm_activations",
            "Times this CM became the active one",
            load(&st.activations),
        )?;
        counter(
            e,
            "rowankv_cm_leases_granted",
            "Server leases granted",
            load(&st.leases_granted),
        )?;
        counter(
            e,
            "rowankv_cm_servers_failed",
            "Servers declared failed (lease expired, probe unanswered)",
            load(&st.servers_failed),
        )?;
        counter(
            e,
            "rowankv_cm_failovers",
            "Configurations stored to remove failed servers (their shards' backups promoted)",
            load(&st.failovers),
        )?;
        counter(
            e,
            "rowankv_cm_backups_promoted",
            "Joining backups made full backups once their copy was reported",
            load(&st.backups_promoted),
        )?;
        counter(
            e,
            "rowankv_cm_migrations_started",
            "Migrations of a shard's primary put in the configuration's list (dynamic resharding)",
            load(&st.migrations_started),
        )?;
        counter(
            e,
            "rowankv_cm_migrations_finished",
            "Migrations struck from the list once their copy was reported",
            load(&st.migrations_finished),
        )?;
        counter(
            e,
            "rowankv_cm_joins",
            "Servers added to the configuration",
            load(&st.joins),
        )?;
        counter(
            e,
            "rowankv_cm_leaves",
            "Servers removed on request (rowankv leave)",
            load(&st.leaves),
        )?;
        counter(
            e,
            "rowankv_cm_configs_stored",
            "Configurations stored by this CM",
            load(&st.configs_stored),
        )?;
        counter(
            e,
            "rowankv_cm_configs_committed",
            "Prepare/commit rounds this CM finished",
            load(&st.configs_committed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_parsed_strictly() {
        let ok = |h: &str| parse_head(h.as_bytes()).map_err(|e| e.to_string());
        assert_eq!(
            ok("GET /metrics HTTP/1.1\r\nHost: x"),
            Ok((false, "/metrics".into()))
        );
        assert_eq!(
            ok("HEAD /metrics?x=1 HTTP/1.0"),
            Ok((true, "/metrics".into()))
        );
        assert!(ok("POST /metrics HTTP/1.1").unwrap_err().contains("405"));
        assert!(ok("GET /metrics").unwrap_err().contains("400"));
        assert!(ok("\u{1}\u{2} garbage").unwrap_err().contains("400"));
        assert!(ok("GET metrics HTTP/1.1").unwrap_err().contains("400"));
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(14));
        assert_eq!(find_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
