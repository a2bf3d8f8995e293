//! The configuration files of a deployed RowanKV: what `rowankv server --config FILE`
//! and `rowankv cm --config FILE` read (TOML; reference in `docs/deployment.md`,
//! examples in `config/`).
//!
//! A file is parsed strictly: an unknown key, a missing one, a value of the wrong
//! type or out of its range is an error naming the key, so a typo never silently
//! falls back to a default. Sizes are integers of bytes or strings with a binary
//! unit (`"512MiB"`, `"8GiB"`). Addresses are `host:port`. The shared secret that
//! peers prove to each other when they connect is read from a file
//! (`secret_file`, at least [`SECRET_BYTES_MIN`] bytes, trailing whitespace
//! ignored) so that it appears in no command line and no configuration dump.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use rowankv_pmem::Medium;
use rowankv_wire::config::check_host_port;
use serde::Deserialize;

use crate::replication::Strategy;

/// Shortest shared secret accepted.
pub const SECRET_BYTES_MIN: usize = 16;
/// Largest number of workers of one server (a worker's id is a byte in places).
pub const WORKERS_MAX: u16 = 255;

/// Why a configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeployConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
}

/// A size in bytes: an integer, or a string with a unit (B, KiB, MiB, GiB, TiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Bytes(n)),
            Raw::Text(t) => parse_bytes(&t).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

/// `"512MiB"` → 536870912. Units are binary; a bare number is bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4096, \"512MiB\", \"8GiB\")"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (B, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `rowankv server --config FILE`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    /// The cluster this server belongs to; every peer checks it.
    pub cluster_id: u64,
    /// File holding the shared secret peers prove when they connect.
    pub secret_file: PathBuf,
    /// The CMs' addresses (`host:port`), the active one found by asking.
    pub cms: Vec<String>,
    /// Where this server's NIC engine listens, and the address peers use to
    /// reach it (`advertise`; default: `listen`, which then must not be a
    /// wildcard address).
    pub listen: String,
    #[serde(default)]
    pub advertise: Option<String>,
    /// Where the fabric engine listens (default: the host of `listen`, a port
    /// the kernel picks; peers learn it when they connect).
    #[serde(default)]
    pub fabric_listen: Option<String>,
    pub pool: PoolFile,
    /// Worker roles (each with its own log), 1..=255.
    pub workers: u16,
    /// The Redis protocol front end (absent: none).
    #[serde(default)]
    pub resp: Option<RespFile>,
    /// The Prometheus metrics endpoint (absent: none).
    #[serde(default)]
    pub metrics: Option<MetricsFile>,
    /// A deliberately broken server, for proving that the chaos test catches
    /// one (`rowankv chaos --planted serve-without-lease`): it answers without
    /// a valid lease, so a server cut off from the CMs serves stale data.
    /// Never set it for data you keep.
    #[serde(default)]
    pub unsafe_serve_without_lease: bool,
    /// For tests of the `drpc` strategy: the redo role does not run, so
    /// entries other servers replicate here stay in the redo rings until the
    /// server restarts without it (writes block once a sender's window of 32
    /// fills). Loses nothing; never useful outside tests.
    #[serde(default)]
    pub test_hold_redo_role: bool,
}

/// `[metrics]`: the Prometheus text endpoint of a server or CM (`GET /metrics`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsFile {
    /// Where the endpoint listens (`host:port`).
    pub listen: String,
}

/// `[resp]`: the server's Redis protocol (RESP2/RESP3) front end.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespFile {
    /// Where Redis clients connect (`host:port`; port 0: none).
    pub listen: String,
    /// The file holding the password clients give (`AUTH`, `HELLO … AUTH`);
    /// absent: none asked.
    #[serde(default)]
    pub requirepass_file: Option<PathBuf>,
    /// Whether FLUSHALL/FLUSHDB are executed (default: refused).
    #[serde(default)]
    pub flushall: bool,
    /// Whether CLUSTER SETSLOT <slot> NODE <node-id> moves shards (default:
    /// refused — any client of the port could move them).
    #[serde(default)]
    pub setslot: bool,
    /// Where Redis clients are told to connect (`CLUSTER SLOTS`, `-MOVED`);
    /// default: the host of the server's `advertise` with `listen`'s port.
    #[serde(default)]
    pub advertise: Option<String>,
    /// A key whose primary is another server: `forward` (default: served
    /// here, the request forwarded over the fabric) or `moved` (answered
    /// `-MOVED slot host:port`, as a Redis Cluster node does).
    #[serde(default)]
    pub redirect: Option<String>,
}

/// What a front end does with a key whose primary is another server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Redirect {
    /// Serve it, forwarding to the primary over the fabric (one more hop):
    /// clients that are not cluster-aware see one store holding every key.
    #[default]
    Forward,
    /// Answer `-MOVED slot host:port` (and `-CROSSSLOT` for a command over
    /// several slots): a Redis Cluster node, for cluster-aware clients.
    Moved,
}

/// A server's pool.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// The pool file: created at `bytes` when absent, opened (and recovered) when
    /// present. It holds the node identity the CM gave this server.
    pub path: PathBuf,
    pub bytes: Bytes,
    /// `emulated` (any file, models ADR PM), `msync` (a disk-backed file) or
    /// `dax` (a file on a DAX file system, MAP_SYNC).
    pub medium: String,
    #[serde(default = "default_segment")]
    pub segment_bytes: Bytes,
}

fn default_segment() -> Bytes {
    Bytes(4 << 20)
}

/// `rowankv cm --config FILE`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CmFile {
    pub cluster_id: u64,
    pub secret_file: PathBuf,
    /// Where this CM listens, and the address servers and clients use.
    pub listen: String,
    #[serde(default)]
    pub advertise: Option<String>,
    /// As a server's `fabric_listen`.
    #[serde(default)]
    pub fabric_listen: Option<String>,
    /// The shape of the first configuration, used once: when the store holds
    /// no configuration yet, the CM waits for `servers` servers to join and
    /// then commits term 1.
    pub bootstrap: BootstrapFile,
    pub store: StoreFile,
    /// Server lease, milliseconds (default 200).
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// The Prometheus metrics endpoint (absent: none).
    #[serde(default)]
    pub metrics: Option<MetricsFile>,
    /// Dynamic resharding (absent: detection only, the paper's thresholds).
    #[serde(default)]
    pub reshard: Option<ReshardFile>,
}

/// `[reshard]` of a CM file: dynamic resharding (seed 000 §4.6).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReshardFile {
    /// The active CM commits the moves it plans (default false: it detects
    /// and reports overloads; operators move shards with `rowankv reshard`).
    #[serde(default)]
    pub auto: bool,
    /// Overloaded above `(1 + overload) ×` the average load (default 0.30).
    #[serde(default = "default_overload")]
    pub overload: f64,
    /// Moves go on until every server is within `(1 + within) ×` the
    /// average (default 0.05).
    #[serde(default = "default_within")]
    pub within: f64,
}

fn default_overload() -> f64 {
    0.30
}

fn default_within() -> f64 {
    0.05
}

impl Default for ReshardFile {
    fn default() -> Self {
        ReshardFile {
            auto: false,
            overload: default_overload(),
            within: default_within(),
        }
    }
}

fn default_lease_ms() -> u64 {
    200
}

/// The first configuration's shape.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapFile {
    pub servers: usize,
    pub shards_per_server: u16,
    pub replication_factor: u8,
    pub strategy: String,
}

/// Where the CM keeps the configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreFile {
    /// The embedded store, persisted to a file (one CM).
    Embedded { path: PathBuf },
    /// etcd v3 (two CMs fail over through it): its client URLs and the prefix
    /// under which this cluster's keys live.
    Etcd {
        endpoints: Vec<String>,
        #[serde(default = "default_prefix")]
        prefix: String,
    },
}

fn default_prefix() -> String {
    "/rowankv/".into()
}

/// A checked server file, ready to start a server from.
#[derive(Clone, Debug)]
pub struct ServerDeployment {
    pub cluster_id: u64,
    pub secret: Vec<u8>,
    pub cms: Vec<String>,
    pub listen: SocketAddr,
    pub advertise: String,
    pub fabric_listen: Option<SocketAddr>,
    pub pool_path: PathBuf,
    pub pool_bytes: u64,
    pub medium: Medium,
    pub segment_bytes: u64,
    pub workers: u16,
    pub resp: Option<RespDeployment>,
    /// Where the metrics endpoint listens (`[metrics] listen`), if anywhere.
    pub metrics: Option<SocketAddr>,
    /// [`ServerFile::unsafe_serve_without_lease`].
    pub unsafe_serve_without_lease: bool,
    /// [`ServerFile::test_hold_redo_role`].
    pub test_hold_redo_role: bool,
}

/// A checked `[resp]` section.
#[derive(Clone, Debug)]
pub struct RespDeployment {
    pub listen: SocketAddr,
    /// Where Redis clients are told to connect (`host:port`).
    pub advertise: String,
    pub requirepass: Option<Vec<u8>>,
    pub flushall: bool,
    pub setslot: bool,
    pub redirect: Redirect,
}

/// A checked CM file.
#[derive(Clone, Debug)]
pub struct CmDeployment {
    pub cluster_id: u64,
    pub secret: Vec<u8>,
    pub listen: SocketAddr,
    pub advertise: String,
    pub fabric_listen: Option<SocketAddr>,
    pub bootstrap: BootstrapFile,
    pub strategy: Strategy,
    pub store: StoreFile,
    pub lease_ms: u64,
    /// Where the metrics endpoint listens (`[metrics] listen`), if anywhere.
    pub metrics: Option<SocketAddr>,
    /// `[reshard]`, checked: `0 < within < overload <= 10`.
    pub reshard: ReshardFile,
}

fn read(path: &Path) -> Result<String, DeployConfigError> {
    std::fs::read_to_string(path).map_err(|source| DeployConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse<T: for<'de> Deserialize<'de>>(path: &Path, text: &str) -> Result<T, DeployConfigError> {
    toml::from_str(text).map_err(|e| DeployConfigError::Parse {
        path: path.to_path_buf(),
        message: e.message().to_string()
            + &e.span()
                .map(|s| {
                    let line = text[..s.start].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default(),
    })
}

struct Checker<'a> {
    path: &'a Path,
}

impl Checker<'_> {
    fn bad(&self, key: &'static str, message: impl Into<String>) -> DeployConfigError {
        DeployConfigError::Invalid {
            path: self.path.to_path_buf(),
            key,
            message: message.into(),
        }
    }

    /// A `host:port` ([`check_host_port`]).
    fn address(&self, key: &'static str, text: &str) -> Result<(), DeployConfigError> {
        check_host_port(text).map_err(|why| self.bad(key, why))
    }

    fn listen(&self, key: &'static str, text: &str) -> Result<SocketAddr, DeployConfigError> {
        self.address(key, text)?;
        text.to_socket_addrs()
            .map_err(|e| self.bad(key, format!("{text:?}: {e}")))?
            .next()
            .ok_or_else(|| self.bad(key, format!("{text:?} resolves to no address")))
    }

    fn advertise(
        &self,
        listen: SocketAddr,
        listen_text: &str,
        advertise: Option<&str>,
    ) -> Result<String, DeployConfigError> {
        match advertise {
            Some(a) => {
                self.address("advertise", a)?;
                Ok(a.to_string())
            }
            None if listen.ip().is_unspecified() => Err(self.bad(
                "advertise",
                format!("listen is {listen_text:?}, a wildcard: say which address peers use"),
            )),
            None => Ok(listen_text.to_string()),
        }
    }

    fn secret(&self, file: &Path) -> Result<Vec<u8>, DeployConfigError> {
        let bytes = std::fs::read(file)
            .map_err(|e| self.bad("secret_file", format!("{}: {e}", file.display())))?;
        let trimmed = bytes.trim_ascii_end();
        if trimmed.len() < SECRET_BYTES_MIN {
            return Err(self.bad(
                "secret_file",
                format!(
                    "{} holds {} bytes; a secret has at least {SECRET_BYTES_MIN}",
                    file.display(),
                    trimmed.len()
                ),
            ));
        }
        Ok(trimmed.to_vec())
    }

    fn resp(
        &self,
        path: &Path,
        r: RespFile,
        server_advertise: &str,
    ) -> Result<RespDeployment, DeployConfigError> {
        let listen = self.listen("resp.listen", &r.listen)?;
        let advertise = match &r.advertise {
            Some(a) => {
                self.address("resp.advertise", a)?;
                a.clone()
            }
            None => {
                let host = server_advertise
                    .rsplit_once(':')
                    .map_or(server_advertise, |(h, _)| h);
                format!("{host}:{}", listen.port())
            }
        };
        let redirect = match r.redirect.as_deref() {
            None | Some("forward") => Redirect::Forward,
            Some("moved") => Redirect::Moved,
            Some(other) => {
                return Err(self.bad(
                    "resp.redirect",
                    format!("{other:?} is neither \"forward\" nor \"moved\""),
                ))
            }
        };
        let requirepass = match &r.requirepass_file {
            Some(file) => {
                let file = beside(path, file);
                let bytes = std::fs::read(&file).map_err(|e| {
                    self.bad("resp.requirepass_file", format!("{}: {e}", file.display()))
                })?;
                let pass = bytes.trim_ascii_end().to_vec();
                if pass.is_empty() {
                    return Err(self.bad(
                        "resp.requirepass_file",
                        format!("{} is empty", file.display()),
                    ));
                }
                Some(pass)
            }
            None => None,
        };
        Ok(RespDeployment {
            listen,
            advertise,
            requirepass,
            flushall: r.flushall,
            setslot: r.setslot,
            redirect,
        })
    }

    fn metrics(&self, m: Option<&MetricsFile>) -> Result<Option<SocketAddr>, DeployConfigError> {
        m.map(|m| self.listen("metrics.listen", &m.listen))
            .transpose()
    }

    fn cluster_id(&self, id: u64) -> Result<(), DeployConfigError> {
        if id == 0 {
            return Err(self.bad("cluster_id", "0 is not a cluster id"));
        }
        Ok(())
    }
}

/// Secret files named relative to the configuration file are read from beside it.
fn beside(path: &Path, file: &Path) -> PathBuf {
    if file.is_relative() {
        path.parent().unwrap_or(Path::new(".")).join(file)
    } else {
        file.to_path_buf()
    }
}

impl ServerDeployment {
    /// Read and check a server file.
    pub fn load(path: &Path) -> Result<ServerDeployment, DeployConfigError> {
        Self::from_text(path, &read(path)?)
    }

    /// Check a server file's text (`path` names it in errors and anchors
    /// relative paths).
    pub fn from_text(path: &Path, text: &str) -> Result<ServerDeployment, DeployConfigError> {
        let f: ServerFile = parse(path, text)?;
        let c = Checker { path };
        c.cluster_id(f.cluster_id)?;
        let secret = c.secret(&beside(path, &f.secret_file))?;
        if f.cms.is_empty() {
            return Err(c.bad("cms", "no CM address"));
        }
        for cm in &f.cms {
            c.address("cms", cm)?;
        }
        let listen = c.listen("listen", &f.listen)?;
        let advertise = c.advertise(listen, &f.listen, f.advertise.as_deref())?;
        let fabric_listen = f
            .fabric_listen
            .as_deref()
            .map(|a| c.listen("fabric_listen", a))
            .transpose()?;
        if !(1..=WORKERS_MAX).contains(&f.workers) {
            return Err(c.bad(
                "workers",
                format!("{} is not in 1..={WORKERS_MAX}", f.workers),
            ));
        }
        let medium: Medium = f
            .pool
            .medium
            .parse()
            .map_err(|e| c.bad("pool.medium", format!("{e}")))?;
        let segment = f.pool.segment_bytes.0;
        if segment < 8 << 10 || !segment.is_multiple_of(4096) {
            return Err(c.bad(
                "pool.segment_bytes",
                format!("{segment} is not a multiple of 4 KiB of at least 8 KiB"),
            ));
        }
        let bytes = f.pool.bytes.0;
        if bytes < 16 * segment {
            return Err(c.bad(
                "pool.bytes",
                format!("{bytes} bytes hold fewer than 16 segments of {segment}"),
            ));
        }
        Ok(ServerDeployment {
            cluster_id: f.cluster_id,
            secret,
            cms: f.cms,
            listen,
            fabric_listen,
            pool_path: beside(path, &f.pool.path),
            pool_bytes: bytes,
            medium,
            segment_bytes: segment,
            workers: f.workers,
            metrics: c.metrics(f.metrics.as_ref())?,
            resp: f.resp.map(|r| c.resp(path, r, &advertise)).transpose()?,
            advertise,
            unsafe_serve_without_lease: f.unsafe_serve_without_lease,
            test_hold_redo_role: f.test_hold_redo_role,
        })
    }

    /// Serve the metrics on `port` of the host of `listen` (a `--metrics-port`
    /// flag: it overrides `[metrics] listen`).
    pub fn set_metrics_port(&mut self, port: u16) {
        self.metrics = Some(SocketAddr::new(self.listen.ip(), port));
    }
}

impl CmDeployment {
    /// Read and check a CM file.
    pub fn load(path: &Path) -> Result<CmDeployment, DeployConfigError> {
        Self::from_text(path, &read(path)?)
    }

    /// Check a CM file's text.
    pub fn from_text(path: &Path, text: &str) -> Result<CmDeployment, DeployConfigError> {
        let f: CmFile = parse(path, text)?;
        let c = Checker { path };
        c.cluster_id(f.cluster_id)?;
        let secret = c.secret(&beside(path, &f.secret_file))?;
        let listen = c.listen("listen", &f.listen)?;
        let advertise = c.advertise(listen, &f.listen, f.advertise.as_deref())?;
        let fabric_listen = f
            .fabric_listen
            .as_deref()
            .map(|a| c.listen("fabric_listen", a))
            .transpose()?;
        let b = &f.bootstrap;
        if b.servers == 0 {
            return Err(c.bad("bootstrap.servers", "at least one server"));
        }
        if b.replication_factor == 0 || b.replication_factor as usize > b.servers {
            return Err(c.bad(
                "bootstrap.replication_factor",
                format!(
                    "{} is not in 1..={} (the servers)",
                    b.replication_factor, b.servers
                ),
            ));
        }
        if b.shards_per_server == 0 || b.shards_per_server as usize * b.servers > u16::MAX as usize
        {
            return Err(c.bad(
                "bootstrap.shards_per_server",
                format!(
                    "{} × {} servers is not in 1..={} shards",
                    b.shards_per_server,
                    b.servers,
                    u16::MAX
                ),
            ));
        }
        let strategy: Strategy = b
            .strategy
            .parse()
            .map_err(|e: String| c.bad("bootstrap.strategy", e))?;
        match &f.store {
            StoreFile::Embedded { .. } => {}
            StoreFile::Etcd { endpoints, prefix } => {
                if endpoints.is_empty() {
                    return Err(c.bad("store.endpoints", "no etcd endpoint"));
                }
                for e in endpoints {
                    if !e.starts_with("http://") {
                        return Err(c.bad(
                            "store.endpoints",
                            format!("{e:?}: etcd is reached over http:// (its JSON gateway)"),
                        ));
                    }
                }
                if !prefix.starts_with('/') || !prefix.ends_with('/') {
                    return Err(c.bad(
                        "store.prefix",
                        format!("{prefix:?} must start and end with '/'"),
                    ));
                }
            }
        }
        if !(5..=60_000).contains(&f.lease_ms) {
            return Err(c.bad("lease_ms", format!("{} is not in 5..=60000", f.lease_ms)));
        }
        let reshard = f.reshard.clone().unwrap_or_default();
        if !(reshard.overload > 0.0 && reshard.overload <= 10.0) {
            return Err(c.bad(
                "reshard.overload",
                format!("{} is not in (0, 10]", reshard.overload),
            ));
        }
        if !(reshard.within > 0.0 && reshard.within < reshard.overload) {
            return Err(c.bad(
                "reshard.within",
                format!(
                    "{} must be above 0 and below reshard.overload ({}): a plan must leave every server under the overload it moves shards for",
                    reshard.within, reshard.overload
                ),
            ));
        }
        let store = match f.store {
            StoreFile::Embedded { path: p } => StoreFile::Embedded {
                path: beside(path, &p),
            },
            etcd => etcd,
        };
        Ok(CmDeployment {
            cluster_id: f.cluster_id,
            secret,
            listen,
            advertise,
            fabric_listen,
            strategy,
            bootstrap: f.bootstrap,
            store,
            lease_ms: f.lease_ms,
            metrics: c.metrics(f.metrics.as_ref())?,
            reshard,
        })
    }

    /// Serve the metrics on `port` of the host of `listen` (a `--metrics-port`
    /// flag: it overrides `[metrics] listen`).
    pub fn set_metrics_port(&mut self, port: u16) {
        self.metrics = Some(SocketAddr::new(self.listen.ip(), port));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), "a secret of sixteen bytes\n").unwrap();
        dir
    }

    const SERVER: &str = "cluster_id = 7\nsecret_file = \"secret\"\ncms = [\"127.0.0.1:7000\"]\n\
        listen = \"127.0.0.1:7100\"\nworkers = 1\n\
        [pool]\npath = \"p\"\nbytes = \"64MiB\"\nmedium = \"emulated\"\n";
    const CM: &str = "cluster_id = 7\nsecret_file = \"secret\"\nlisten = \"127.0.0.1:7000\"\n\
        [bootstrap]\nservers = 1\nshards_per_server = 1\nreplication_factor = 1\nstrategy = \"rowan\"\n\
        [store]\nkind = \"embedded\"\npath = \"s.json\"\n";

    #[test]
    fn a_metrics_table_gives_the_endpoint_its_address() {
        let dir = files();
        let path = dir.path().join("f.toml");
        let s = ServerDeployment::from_text(&path, SERVER).unwrap();
        assert_eq!(s.metrics, None);
        let text = format!("{SERVER}[metrics]\nlisten = \"127.0.0.1:9464\"\n");
        let mut s = ServerDeployment::from_text(&path, &text).unwrap();
        assert_eq!(s.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        s.set_metrics_port(9500);
        assert_eq!(s.metrics, Some("127.0.0.1:9500".parse().unwrap()));
        let text = format!("{CM}[metrics]\nlisten = \"127.0.0.1:9465\"\n");
        let c = CmDeployment::from_text(&path, &text).unwrap();
        assert_eq!(c.metrics, Some("127.0.0.1:9465".parse().unwrap()));
    }

    #[test]
    fn a_bad_metrics_table_is_refused_with_its_key() {
        let dir = files();
        let path = dir.path().join("f.toml");
        let text = format!("{SERVER}[metrics]\nlisten = \"nowhere\"\n");
        let e = ServerDeployment::from_text(&path, &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.listen"), "{e}");
        let text = format!("{CM}[metrics]\nlisten = \"127.0.0.1:1\"\nport = 3\n");
        let e = CmDeployment::from_text(&path, &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("port"), "{e}");
    }

    /// FLUSHALL and CLUSTER SETSLOT are off unless the file turns them on.
    #[test]
    fn a_resp_table_enables_flushall_and_setslot_only_when_asked() {
        let dir = files();
        let path = dir.path().join("f.toml");
        let text = format!("{SERVER}[resp]\nlisten = \"127.0.0.1:6379\"\n");
        let r = ServerDeployment::from_text(&path, &text)
            .unwrap()
            .resp
            .unwrap();
        assert!(!r.flushall && !r.setslot);
        let text = format!("{SERVER}[resp]\nlisten = \"127.0.0.1:6379\"\nsetslot = true\n");
        let r = ServerDeployment::from_text(&path, &text)
            .unwrap()
            .resp
            .unwrap();
        assert!(r.setslot && !r.flushall);
        let text = format!("{SERVER}[resp]\nlisten = \"127.0.0.1:6379\"\nsetslots = true\n");
        let e = ServerDeployment::from_text(&path, &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("setslots"), "{e}");
    }

    #[test]
    fn a_reshard_table_sets_the_thresholds_and_bad_ones_are_refused_with_their_key() {
        let dir = files();
        let path = dir.path().join("f.toml");
        let c = CmDeployment::from_text(&path, CM).unwrap();
        assert!(!c.reshard.auto);
        assert_eq!((c.reshard.overload, c.reshard.within), (0.30, 0.05));
        let text = format!("{CM}[reshard]\nauto = true\noverload = 0.5\nwithin = 0.1\n");
        let c = CmDeployment::from_text(&path, &text).unwrap();
        assert!(c.reshard.auto);
        assert_eq!((c.reshard.overload, c.reshard.within), (0.5, 0.1));
        for (bad, key) in [
            ("overload = 0.0", "reshard.overload"),
            ("overload = 20.0", "reshard.overload"),
            ("within = 0.4", "reshard.within"),
            ("within = -0.1", "reshard.within"),
            ("threshold = 3", "threshold"),
        ] {
            let text = format!("{CM}[reshard]\n{bad}\n");
            let e = CmDeployment::from_text(&path, &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }
}
