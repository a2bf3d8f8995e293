//! `rowankv server`, `rowankv cm` (the processes of a deployment) and the client
//! commands `put`, `get`, `del`, `status` that reach a deployed cluster through
//! its CMs (`docs/deployment.md`).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rowankv_client::ClientConfig;
use rowankv_deploy::client;
use rowankv_server::deploy::{CmDeployment, ServerDeployment, SECRET_BYTES_MIN};

#[derive(Args)]
pub struct ProcessArgs {
    /// The TOML file (reference: docs/deployment.md).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Serve Prometheus metrics (`GET /metrics`) on this port of the host the
    /// process listens on; overrides the file's `[metrics] listen`.
    #[arg(long, value_name = "PORT")]
    metrics_port: Option<u16>,
}

/// Stop on SIGTERM or SIGINT.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("installing a signal handler")?;
    }
    Ok(stop)
}

pub fn server(args: ProcessArgs) -> Result<()> {
    let mut dep = ServerDeployment::load(&args.config)?;
    if let Some(port) = args.metrics_port {
        dep.set_metrics_port(port);
    }
    rowankv_deploy::server::run(&dep, stop_flag()?)?;
    Ok(())
}

pub fn cm(args: ProcessArgs) -> Result<()> {
    let mut dep = CmDeployment::load(&args.config)?;
    if let Some(port) = args.metrics_port {
        dep.set_metrics_port(port);
    }
    rowankv_deploy::cm::run(&dep, stop_flag()?)?;
    Ok(())
}

/// How a client command finds and proves itself to the cluster.
#[derive(Args)]
pub struct Reach {
    /// A CM's address (`host:port`; several, comma-separated). Default: $ROWANKV_CM.
    #[arg(long, env = "ROWANKV_CM", value_delimiter = ',')]
    cm: Vec<String>,
    /// The cluster id. Default: $ROWANKV_CLUSTER_ID.
    #[arg(long, env = "ROWANKV_CLUSTER_ID", value_parser = parse_id)]
    cluster_id: u64,
    /// The file holding the cluster's shared secret. Default: $ROWANKV_SECRET_FILE.
    #[arg(long, env = "ROWANKV_SECRET_FILE")]
    secret_file: PathBuf,
    /// How long an operation may take.
    #[arg(long, default_value_t = 5.0)]
    timeout_s: f64,
}

fn parse_id(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let r = match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16),
        None => t.replace('_', "").parse(),
    };
    r.map_err(|_| format!("{s:?} is not a cluster id (decimal or 0x…)"))
}

impl Reach {
    fn secret(&self) -> Result<Vec<u8>> {
        let bytes = std::fs::read(&self.secret_file)
            .with_context(|| format!("reading {}", self.secret_file.display()))?;
        let s = bytes.trim_ascii_end().to_vec();
        if s.len() < SECRET_BYTES_MIN {
            bail!(
                "{} holds {} bytes; a secret has at least {SECRET_BYTES_MIN}",
                self.secret_file.display(),
                s.len()
            );
        }
        Ok(s)
    }

    fn connect(&self) -> Result<client::Remote> {
        if self.cm.is_empty() {
            bail!("no CM address: give --cm HOST:PORT or set ROWANKV_CM");
        }
        let timeout = Duration::from_secs_f64(self.timeout_s.max(0.1));
        let config = ClientConfig {
            timeout,
            connect_timeout: timeout,
            ..ClientConfig::default()
        };
        Ok(client::connect(
            self.cluster_id,
            &self.secret()?,
            &self.cm,
            config,
        )?)
    }
}

#[derive(Args)]
pub struct PutArgs {
    key: String,
    value: String,
    #[command(flatten)]
    reach: Reach,
}

#[derive(Args)]
pub struct KeyArgs {
    key: String,
    #[command(flatten)]
    reach: Reach,
}

#[derive(Args)]
pub struct LeaveArgs {
    /// The server's node (`n10002` or `10002`, as `rowankv status` shows it).
    #[arg(value_parser = parse_node)]
    node: rowankv_types::NodeId,
    #[command(flatten)]
    reach: Reach,
}

fn parse_node(s: &str) -> Result<rowankv_types::NodeId, String> {
    let t = s.trim();
    t.strip_prefix('n')
        .unwrap_or(t)
        .parse()
        .map(rowankv_types::NodeId)
        .map_err(|_| format!("{s:?} is not a node (n10002 or 10002)"))
}

/// Remove a server on purpose: it is taken out of the configuration as a
/// failed one would be (its shards' backups promoted), once its lease ran out;
/// then it stops, and its identity never joins again.
pub fn leave(a: LeaveArgs) -> Result<()> {
    let timeout = Duration::from_secs_f64(a.reach.timeout_s.max(0.1));
    let (term, members) = client::leave_server(
        a.reach.cluster_id,
        &a.reach.secret()?,
        &a.reach.cm,
        a.node,
        timeout,
    )?;
    eprintln!(
        "{} left: the configuration of {term} has {members} members",
        a.node
    );
    Ok(())
}

#[derive(Args)]
pub struct ReshardArgs {
    /// The shard to move (`shard3` or `3`, as `rowankv status` shows it).
    #[arg(long, value_parser = parse_shard)]
    shard: rowankv_types::ShardId,
    /// The server that leads it from now on (`n10002` or `10002`): a member
    /// holding no replica of it.
    #[arg(long, value_parser = parse_node)]
    to: rowankv_types::NodeId,
    /// Return once the CM lists the migration, without waiting for its end.
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    reach: Reach,
}

fn parse_shard(s: &str) -> Result<rowankv_types::ShardId, String> {
    let t = s.trim();
    t.strip_prefix("shard")
        .unwrap_or(t)
        .parse()
        .map(rowankv_types::ShardId)
        .map_err(|_| format!("{s:?} is not a shard (shard3 or 3)"))
}

/// Move a shard's primary to another server (dynamic resharding, seed 000
/// §4.6): the CM lists the migration, the source hands the shard over and
/// copies it, clients follow; by default this waits for the end.
pub fn reshard(a: ReshardArgs) -> Result<()> {
    let timeout = Duration::from_secs_f64(a.reach.timeout_s.max(0.1));
    let (listed, finished) = client::reshard(
        a.reach.cluster_id,
        &a.reach.secret()?,
        &a.reach.cm,
        a.shard,
        a.to,
        !a.no_wait,
        timeout,
    )?;
    match finished {
        Some(done) => eprintln!(
            "{} moved to {}: listed at {listed}, finished at {done}",
            a.shard, a.to
        ),
        None => eprintln!("{} is migrating to {} (listed at {listed})", a.shard, a.to),
    }
    Ok(())
}

#[derive(Args)]
pub struct ClockStepArgs {
    /// The server's node (`n10002` or `10002`, as `rowankv status` shows it).
    #[arg(value_parser = parse_node)]
    node: rowankv_types::NodeId,
    /// The step, in milliseconds (negative: back).
    #[arg(long, allow_hyphen_values = true)]
    ms: i64,
    #[command(flatten)]
    reach: Reach,
}

/// Step a server's calendar clock (what expiry times are measured against;
/// never its lease clock), as `date -s` on its host would.
pub fn clock_step(a: ClockStepArgs) -> Result<()> {
    let timeout = Duration::from_secs_f64(a.reach.timeout_s.max(0.1));
    let offset = rowankv_deploy::admin::clock_step(
        a.reach.cluster_id,
        &a.reach.secret()?,
        &a.reach.cm,
        a.node,
        a.ms,
        timeout,
    )?;
    eprintln!(
        "{}'s calendar clock stepped by {} ms: {offset} ms from its host's now",
        a.node, a.ms
    );
    Ok(())
}

#[derive(Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    reach: Reach,
}

pub fn put(a: PutArgs) -> Result<()> {
    let mut r = a.reach.connect()?;
    let version = r.client.put(a.key.as_bytes(), a.value.as_bytes())?;
    eprintln!("OK (version {version})");
    Ok(())
}

pub fn get(a: KeyArgs) -> Result<()> {
    let mut r = a.reach.connect()?;
    match r.client.get(a.key.as_bytes()) {
        Ok(v) => {
            println!("{}", String::from_utf8_lossy(&v));
            Ok(())
        }
        Err(rowankv_client::ClientError::NotFound) => {
            eprintln!("(not found)");
            std::process::exit(1)
        }
        Err(e) => Err(e.into()),
    }
}

pub fn del(a: KeyArgs) -> Result<()> {
    let mut r = a.reach.connect()?;
    let version = r.client.delete(a.key.as_bytes())?;
    eprintln!("OK (version {version})");
    Ok(())
}

pub fn status(a: StatusArgs) -> Result<()> {
    let t = Instant::now();
    let timeout = Duration::from_secs_f64(a.reach.timeout_s.max(0.1));
    let (net, source) =
        client::attach_client(a.reach.cluster_id, &a.reach.secret()?, &a.reach.cm, timeout)?;
    let c = source.last().context("the CMs served no configuration")?;
    let rows: Vec<serde_json::Value> = c
        .members
        .iter()
        .map(|m| {
            let primaries = c.shards.iter().filter(|s| s.primary == m.node).count();
            let backups = c
                .shards
                .iter()
                .filter(|s| s.backups.contains(&m.node))
                .count();
            let joining = c
                .shards
                .iter()
                .filter(|s| s.joining.contains(&m.node))
                .count();
            // What the server says of itself: its lease, its segments, DLWA.
            let stats = client::server_stats(&net, c.cluster_id, m.node, timeout)
                .unwrap_or_else(|e| serde_json::json!({ "unreachable": e }));
            serde_json::json!({
                "node": m.node.0,
                "address": m.address,
                "workers": m.workers,
                "primary_shards": primaries,
                "backup_shards": backups,
                "joining_shards": joining,
                "server": stats,
            })
        })
        .collect();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "cluster_id": format!("{:#x}", c.cluster_id),
                "term": c.term.0,
                "replication_factor": c.replication_factor,
                "shards": c.shards.len(),
                "members": rows,
            })
        );
        return Ok(());
    }
    println!(
        "cluster {:#x}, term {}, {} shards, replication factor {}, {} live servers (read in {:.0} ms)",
        c.cluster_id,
        c.term.0,
        c.shards.len(),
        c.replication_factor,
        c.members.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "{:>10}  {:<22} {:>7} {:>9} {:>7} {:>7}  {:>10} {:>9} {:>5}  segments in use",
        "node",
        "address",
        "workers",
        "primaries",
        "backups",
        "joining",
        "lease left",
        "free segs",
        "DLWA"
    );
    for r in rows {
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        let srv = &r["server"];
        let (lease, free, dlwa, used) = match srv.get("unreachable") {
            Some(why) => (
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                format!("unreachable: {}", why.as_str().unwrap_or("")),
            ),
            None => {
                let used: Vec<String> = srv["segments"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .filter(|(k, _)| !k.ends_with("/free"))
                            .map(|(k, v)| format!("{k} {v}"))
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    format!(
                        "{:.0} ms",
                        srv["lease_remaining_ms"].as_f64().unwrap_or(0.0)
                    ),
                    srv["free_segments"].to_string(),
                    srv["dlwa"]
                        .as_f64()
                        .map_or("n/a".to_string(), |d| format!("{d:.2}")),
                    used.join(", "),
                )
            }
        };
        println!(
            "{:>10}  {:<22} {:>7} {:>9} {:>7} {:>7}  {:>10} {:>9} {:>5}  {}",
            n("node"),
            r["address"].as_str().unwrap_or("-"),
            n("workers"),
            n("primary_shards"),
            n("backup_shards"),
            n("joining_shards"),
            lease,
            free,
            dlwa,
            used
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct WorkloadArgs {
    /// How long to run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Keys written, `PREFIX0` … `PREFIX{keys-1}` (each client its own prefix:
    /// the record below then says exactly what each key must hold).
    #[arg(long, default_value_t = 100)]
    keys: u64,
    #[arg(long, default_value = "w-")]
    prefix: String,
    /// Where to write the record: one JSON line per write (`key`, `value`,
    /// `status`: ok, fail or unknown) and a last line with the totals.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    reach: Reach,
}

/// `rowankv workload`: a mixed load (a PUT of a fresh value, then a GET of
/// another key, in turn) from this process, every write recorded; every GET is
/// checked against what this process wrote and was told (the value of its last
/// acknowledged write to that key, or of a later write whose outcome is
/// unknown). Exit status 1 on any mismatch.
pub fn workload(a: WorkloadArgs) -> Result<()> {
    use std::collections::HashMap;
    use std::io::Write;
    let mut r = a.reach.connect()?;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?,
    );
    // Per key: the last acknowledged value and the values written after it
    // whose outcome is unknown.
    let mut expect: HashMap<u64, (Option<String>, Vec<String>)> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let (mut acked, mut failed, mut unknown, mut reads, mut mismatches) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut seq = 0u64;
    while Instant::now() < deadline {
        let k = seq % a.keys.max(1);
        let key = format!("{}{k}", a.prefix);
        let value = format!("{}v{seq}", a.prefix);
        seq += 1;
        let status = match r.client.put(key.as_bytes(), value.as_bytes()) {
            Ok(_) => {
                acked += 1;
                expect.insert(k, (Some(value.clone()), Vec::new()));
                "ok"
            }
            Err(e) if e.is_unknown() => {
                unknown += 1;
                expect.entry(k).or_default().1.push(value.clone());
                "unknown"
            }
            Err(_) => {
                failed += 1;
                "fail"
            }
        };
        writeln!(
            out,
            "{}",
            serde_json::json!({"key": key, "value": value, "status": status})
        )?;
        // Read a key written a while ago.
        let rk = (seq * 7) % a.keys.max(1);
        if let Some((last, later)) = expect.get(&rk) {
            let key = format!("{}{rk}", a.prefix);
            match r.client.get(key.as_bytes()) {
                Ok(v) => {
                    reads += 1;
                    let v = String::from_utf8_lossy(&v).to_string();
                    if last.as_ref() != Some(&v) && !later.contains(&v) {
                        mismatches += 1;
                        eprintln!("MISMATCH {key}: read {v:?}, last acknowledged {last:?}");
                    }
                }
                Err(rowankv_client::ClientError::NotFound) if last.is_none() => reads += 1,
                Err(rowankv_client::ClientError::NotFound) => {
                    mismatches += 1;
                    eprintln!("MISMATCH {key}: not found, last acknowledged {last:?}");
                }
                Err(_) => {}
            }
        }
    }
    let totals = serde_json::json!({
        "totals": true, "acknowledged": acked, "failed": failed, "unknown": unknown,
        "reads_checked": reads, "mismatches": mismatches,
    });
    writeln!(out, "{totals}")?;
    out.flush()?;
    println!("{totals}");
    if mismatches > 0 {
        bail!("{mismatches} reads did not return the last acknowledged value");
    }
    Ok(())
}
