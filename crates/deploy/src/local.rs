//! A cluster of real processes on this host, started from files in a directory:
//! what `rowankv bench ycsb --fabric tcp` and the process tests run. (The shell
//! equivalent for people is `scripts/cluster`.)
//!
//! `rowankv` is started as a child process for the CM and every server, each
//! from its TOML file in the directory, logging to `logs/`. Ports are taken from
//! the kernel (bound once, released, then given to the process: another
//! program could take one in between, which makes the start fail loudly, never
//! silently).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_wire::config::{Config, ConfigSource};

use crate::client::attach_client;
use crate::ProcessError;

/// The shape of a local cluster.
#[derive(Clone, Debug)]
pub struct LocalSpec {
    /// The `rowankv` binary.
    pub binary: PathBuf,
    pub dir: PathBuf,
    pub cluster_id: u64,
    pub servers: usize,
    pub shards_per_server: u16,
    pub replication_factor: u8,
    pub strategy: String,
    pub workers: u16,
    pub pool_bytes: u64,
    pub segment_bytes: u64,
    pub lease_ms: u64,
}

/// A running local cluster; every process is killed when it is dropped.
pub struct LocalCluster {
    pub spec: LocalSpec,
    pub cm: String,
    pub secret: Vec<u8>,
    cm_proc: Child,
    servers: Vec<Option<Child>>,
}

fn free_port() -> Result<u16, ProcessError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| ProcessError(format!("a port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| ProcessError(e.to_string()))?
        .port())
}

fn spawn(binary: &Path, dir: &Path, name: &str, args: &[&str]) -> Result<Child, ProcessError> {
    let log = std::fs::File::create(dir.join("logs").join(format!("{name}.log")))
        .map_err(|e| ProcessError(format!("a log file: {e}")))?;
    Command::new(binary)
        .args(args)
        .env("NO_COLOR", "1")
        .env(
            "RUST_LOG",
            std::env::var("ROWANKV_PROCESS_LOG")
                .unwrap_or_else(|_| "info,rowankv_fabric=warn,rowankv_rpc=warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| ProcessError(format!("starting {}: {e}", binary.display())))
}

impl LocalCluster {
    /// Write the files and start the CM and the servers; returns once every
    /// server is a member of the first configuration.
    pub fn start(spec: LocalSpec) -> Result<LocalCluster, ProcessError> {
        let dir = &spec.dir;
        std::fs::create_dir_all(dir.join("logs"))
            .map_err(|e| ProcessError(format!("creating {}: {e}", dir.display())))?;
        let secret = format!("local cluster {:x} secret", rand::random::<u64>());
        std::fs::write(dir.join("secret"), &secret)
            .map_err(|e| ProcessError(format!("writing the secret: {e}")))?;
        let cm = format!("127.0.0.1:{}", free_port()?);
        let s = &spec;
        std::fs::write(
            dir.join("cm.toml"),
            format!(
                "cluster_id = {}\nsecret_file = \"secret\"\nlisten = \"{cm}\"\nlease_ms = {}\n\
                 [bootstrap]\nservers = {}\nshards_per_server = {}\nreplication_factor = {}\nstrategy = \"{}\"\n\
                 [store]\nkind = \"embedded\"\npath = \"data/cm.store\"\n",
                s.cluster_id, s.lease_ms, s.servers, s.shards_per_server, s.replication_factor, s.strategy
            ),
        )
        .map_err(|e| ProcessError(format!("writing cm.toml: {e}")))?;
        let cm_proc = spawn(
            &s.binary,
            dir,
            "cm",
            &[
                "cm",
                "--config",
                dir.join("cm.toml").to_str().unwrap_or_default(),
            ],
        )?;
        let mut c = LocalCluster {
            spec: spec.clone(),
            cm,
            secret: secret.into_bytes(),
            cm_proc,
            servers: Vec::new(),
        };
        for i in 0..s.servers {
            let file = dir.join(format!("server-{i}.toml"));
            std::fs::write(
                &file,
                format!(
                    "cluster_id = {}\nsecret_file = \"secret\"\ncms = [\"{}\"]\nlisten = \"127.0.0.1:{}\"\nworkers = {}\n\
                     [pool]\npath = \"data/server-{i}.pool\"\nbytes = {}\nmedium = \"emulated\"\nsegment_bytes = {}\n",
                    s.cluster_id, c.cm, free_port()?, s.workers, s.pool_bytes, s.segment_bytes
                ),
            )
            .map_err(|e| ProcessError(format!("writing {}: {e}", file.display())))?;
            c.servers.push(None);
            c.start_server(i)?;
        }
        c.wait_members(s.servers, Duration::from_secs(60))?;
        c.wait_served(Duration::from_secs(60))?;
        Ok(c)
    }

    /// Wait until a read is served (every server's workers are up: a client
    /// connects to all of them).
    pub fn wait_served(&self, patience: Duration) -> Result<(), ProcessError> {
        let deadline = Instant::now() + patience;
        let mut last = String::new();
        while Instant::now() < deadline {
            let config = rowankv_client::ClientConfig {
                timeout: Duration::from_secs(2),
                connect_timeout: Duration::from_secs(2),
                ..rowankv_client::ClientConfig::default()
            };
            match crate::client::connect(
                self.spec.cluster_id,
                &self.secret,
                std::slice::from_ref(&self.cm),
                config,
            ) {
                Ok(mut r) => {
                    let every = r.client.cluster_config().members.len();
                    let connected = r
                        .client
                        .cluster_config()
                        .members
                        .iter()
                        .filter(|m| r.client.server_peer(m.node).is_some())
                        .count();
                    match r.client.get(b"local-cluster-probe") {
                        Ok(_) | Err(rowankv_client::ClientError::NotFound)
                            if connected == every =>
                        {
                            return Ok(())
                        }
                        Ok(_) | Err(rowankv_client::ClientError::NotFound) => {
                            last = format!("{connected} of {every} servers accept clients")
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ProcessError(format!(
            "no read was served within {patience:?}: {last} (logs in {})",
            self.spec.dir.join("logs").display()
        )))
    }

    /// Start server `i` (again) from its file.
    pub fn start_server(&mut self, i: usize) -> Result<(), ProcessError> {
        let file = self.spec.dir.join(format!("server-{i}.toml"));
        let child = spawn(
            &self.spec.binary,
            &self.spec.dir,
            &format!("server-{i}"),
            &["server", "--config", file.to_str().unwrap_or_default()],
        )?;
        self.servers[i] = Some(child);
        Ok(())
    }

    /// SIGKILL server `i`; when the signal was sent (the process may take a
    /// while longer to be gone: unmapping its pool).
    pub fn kill_server(&mut self, i: usize) -> Instant {
        let at = Instant::now();
        if let Some(mut c) = self.servers[i].take() {
            let _ = c.kill();
            let at = Instant::now();
            let _ = c.wait();
            return at;
        }
        at
    }

    /// The pids of the running servers and the CM.
    pub fn pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .flatten()
            .map(|c| c.id())
            .chain(std::iter::once(self.cm_proc.id()))
            .collect()
    }

    /// A configuration source reading from the CM (its own fabric node).
    pub fn source(
        &self,
    ) -> Result<(crate::Attached, Arc<crate::client::Remembering>), ProcessError> {
        attach_client(
            self.spec.cluster_id,
            &self.secret,
            std::slice::from_ref(&self.cm),
            Duration::from_secs(2),
        )
    }

    /// The configuration as the CM serves it.
    pub fn config(&self) -> Result<Arc<Config>, ProcessError> {
        let (_net, source) = self.source()?;
        source
            .fetch()
            .map_err(|e| ProcessError(format!("the configuration: {e}")))
    }

    /// Wait until `n` servers are members and no shard is joining a backup.
    pub fn wait_members(&self, n: usize, patience: Duration) -> Result<(), ProcessError> {
        let deadline = Instant::now() + patience;
        let (_net, source) = loop {
            match self.source() {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(ProcessError(format!("the CM never answered: {e}")))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        loop {
            if let Ok(c) = source.fetch() {
                if c.members.len() >= n && c.shards.iter().all(|s| s.joining.is_empty()) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(ProcessError(format!(
                    "{n} servers did not become members within {patience:?} (logs in {})",
                    self.spec.dir.join("logs").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for c in self.servers.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.cm_proc.kill();
        let _ = self.cm_proc.wait();
    }
}

/// CPU time (user + system) a process has used, in seconds (Linux `/proc`).
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (f64, f64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // Clock ticks per second: 100 on Linux for every architecture RowanKV runs on.
    Some((utime + stime) / 100.0)
}
