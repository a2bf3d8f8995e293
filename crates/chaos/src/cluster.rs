//! The processes of a chaos run: one etcd, the CMs and the servers, each a child
//! of the chaos process, started from configuration files written into the
//! run's directory (as `scripts/cluster --etcd` writes them), every one of its
//! lives appended to `logs/NAME.log`.
//!
//! Every child is watched: one that exits when the chaos process did not kill
//! it is a crash, recorded with its exit status and reported as a violation.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use rowankv_cm::{node_record, CoordStore, EtcdConfig, EtcdStore, CM_LEASE_KEY, COMMITTED_KEY};
use rowankv_types::NodeId;

use crate::net::Net;
use crate::ChaosError;

/// The etcd prefix of a chaos cluster's keys.
pub const ETCD_PREFIX: &str = "/rowankv-chaos/";

/// How long etcd may take to answer after it is started.
const ETCD_START_TIMEOUT: Duration = Duration::from_secs(30);

/// What a child process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Etcd,
    Cm,
    Server,
}

/// One process of the cluster, across its restarts.
pub struct Proc {
    pub name: String,
    pub role: Role,
    /// The configuration file (CMs and servers).
    pub config: PathBuf,
    /// The running child, if any.
    pub child: Option<Child>,
    /// Whether it is stopped (SIGSTOP) now.
    pub stopped: bool,
    /// How many times it was started.
    pub starts: u32,
    /// The network namespace it runs in (with [`Layout::netns`]).
    pub ns: Option<String>,
}

impl Proc {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// A port free now, below the kernel's ephemeral range (32768 and up), so that
/// no port the kernel hands out meanwhile takes it before its process binds it,
/// and never the same one twice in this process.
fn free_port() -> Result<u16, ChaosError> {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        21_000 + (std::process::id() % 900) as u16 * 12,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::AcqRel);
        if port >= 32_000 {
            return Err(ChaosError::Cluster(
                "no free port left below the ephemeral range".into(),
            ));
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
}

/// How the cluster is laid out.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
    /// The `rowankv` binary.
    pub bin: PathBuf,
    /// The `etcd` binary.
    pub etcd: PathBuf,
    pub servers: usize,
    pub cms: usize,
    pub lease_ms: u64,
    pub cluster_id: u64,
    /// Every CM and server in a network namespace of its own ([`Net`]);
    /// otherwise all on loopback (no network faults).
    pub netns: bool,
    /// Servers deliberately broken: they answer without a valid lease
    /// (`unsafe_serve_without_lease`, for proving the checks catch it).
    pub planted_serve_without_lease: bool,
}

/// The running cluster.
pub struct Cluster {
    pub layout: Layout,
    pub etcd: Proc,
    pub cms: Vec<Proc>,
    pub servers: Vec<Proc>,
    /// The CMs' `listen` addresses, in the order of `cms`.
    pub cm_addrs: Vec<String>,
    /// The servers' `listen` addresses, in the order of `servers`.
    pub server_addrs: Vec<String>,
    pub etcd_endpoint: String,
    pub secret: Vec<u8>,
    /// Children that exited without being killed: (name, exit status).
    pub crashes: Vec<(String, String)>,
    store: EtcdStore,
    /// The namespaces and bridge (with [`Layout::netns`]); dropped after
    /// every process is killed.
    pub net: Option<Net>,
}

/// `logs/NAME.log` of the run in `dir`, opened to append a life's output
/// after a banner line.
pub(crate) fn open_log(dir: &Path, name: &str, banner: &str) -> Result<File, ChaosError> {
    let path = dir.join("logs").join(format!("{name}.log"));
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    writeln!(f, "==== chaos: {banner}").map_err(io_err(format!("writing {}", path.display())))?;
    Ok(f)
}

/// The child is killed (SIGKILL) when the thread of the chaos process that
/// started it ends — when the chaos process dies, however it dies (a run
/// killed by the OOM killer once left its cluster running). Every child is
/// started from the run's main thread.
#[allow(unsafe_code)] // pre_exec
pub(crate) fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only calls prctl(2) and
    // getppid(2), both async-signal-safe, and allocates nothing.
    unsafe {
        let parent = libc::getpid();
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before prctl: nothing would signal this child.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the chaos process is gone"));
            }
            Ok(())
        });
    }
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ChaosError {
    let what = what.into();
    move |source| ChaosError::Io { what, source }
}

impl Cluster {
    /// Write the files and start etcd (waiting until it answers); the CMs and
    /// servers are started by [`Cluster::start_all`].
    pub fn prepare(layout: Layout) -> Result<Cluster, ChaosError> {
        let dir = &layout.dir;
        std::fs::create_dir_all(dir.join("logs")).map_err(io_err("creating logs/"))?;
        std::fs::create_dir_all(dir.join("data")).map_err(io_err("creating data/"))?;
        let secret = b"a secret of the chaos run, not for production".to_vec();
        std::fs::write(dir.join("secret"), &secret).map_err(io_err("writing the secret"))?;
        let net = if layout.netns {
            Net::remove_orphans();
            let tag = format!("rk{}", std::process::id());
            Some(Net::create(&tag, layout.cms, layout.servers)?)
        } else {
            None
        };
        let host = net.as_ref().map_or("127.0.0.1", |n| n.host_ip.as_str());
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_endpoint = format!("http://{host}:{client_port}");
        let cm_addrs: Vec<String> = (0..layout.cms)
            .map(|j| {
                let ip = net.as_ref().map_or(host, |n| n.cms[j].ip.as_str());
                free_port().map(|p| format!("{ip}:{p}"))
            })
            .collect::<Result<_, _>>()?;
        let server_addrs: Vec<String> = (0..layout.servers)
            .map(|i| {
                let ip = net.as_ref().map_or(host, |n| n.servers[i].ip.as_str());
                free_port().map(|p| format!("{ip}:{p}"))
            })
            .collect::<Result<_, _>>()?;
        let cms_toml = cm_addrs
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut cms = Vec::new();
        for (j, a) in cm_addrs.iter().enumerate() {
            let file = dir.join(format!("cm-{j}.toml"));
            let text = format!(
                "# RowanKV CM {j} of a chaos run (reference: docs/deployment.md).\n\
                 cluster_id = {}\nsecret_file = \"secret\"\nlisten = \"{a}\"\nlease_ms = {}\n\n\
                 [bootstrap]\nservers = {}\nshards_per_server = 4\nreplication_factor = 3\nstrategy = \"rowan\"\n\n\
                 [store]\nkind = \"etcd\"\nendpoints = [\"{etcd_endpoint}\"]\nprefix = \"{ETCD_PREFIX}\"\n",
                layout.cluster_id, layout.lease_ms, layout.servers
            );
            std::fs::write(&file, text).map_err(io_err(format!("writing {}", file.display())))?;
            cms.push(Proc {
                name: format!("cm-{j}"),
                role: Role::Cm,
                config: file,
                child: None,
                stopped: false,
                starts: 0,
                ns: net.as_ref().map(|n| n.cms[j].ns.clone()),
            });
        }
        let mut servers = Vec::new();
        for (i, a) in server_addrs.iter().enumerate() {
            let file = dir.join(format!("server-{i}.toml"));
            let text = format!(
                "# RowanKV server {i} of a chaos run (reference: docs/deployment.md).\n\
                 cluster_id = {}\nsecret_file = \"secret\"\ncms = [{cms_toml}]\nlisten = \"{a}\"\nworkers = 1\n\n\
                 [pool]\npath = \"data/server-{i}.pool\"\nbytes = \"64MiB\"\nmedium = \"emulated\"\nsegment_bytes = \"1MiB\"\n",
                layout.cluster_id
            );
            let text = if layout.planted_serve_without_lease {
                // A top-level key: before the first table.
                text.replacen(
                    "workers = 1\n",
                    "workers = 1\n# A planted bug (rowankv chaos --planted serve-without-lease).\nunsafe_serve_without_lease = true\n",
                    1,
                )
            } else {
                text
            };
            std::fs::write(&file, text).map_err(io_err(format!("writing {}", file.display())))?;
            servers.push(Proc {
                name: format!("server-{i}"),
                role: Role::Server,
                config: file,
                child: None,
                stopped: false,
                starts: 0,
                ns: net.as_ref().map(|n| n.servers[i].ns.clone()),
            });
        }
        let store = EtcdStore::new(EtcdConfig {
            timeout: Duration::from_secs(2),
            ..EtcdConfig::new([etcd_endpoint.clone()], ETCD_PREFIX)
        })
        .map_err(|e| ChaosError::Etcd(e.to_string()))?;
        let mut c = Cluster {
            etcd: Proc {
                name: "etcd".into(),
                role: Role::Etcd,
                config: PathBuf::new(),
                child: None,
                stopped: false,
                starts: 0,
                ns: None,
            },
            layout,
            cms,
            servers,
            cm_addrs,
            server_addrs,
            etcd_endpoint,
            secret,
            crashes: Vec::new(),
            store,
            net,
        };
        c.start_etcd(client_port, peer_port)?;
        Ok(c)
    }

    fn log_file(&self, name: &str, banner: &str) -> Result<File, ChaosError> {
        open_log(&self.layout.dir, name, banner)
    }

    fn start_etcd(&mut self, client_port: u16, peer_port: u16) -> Result<(), ChaosError> {
        let log = self.log_file("etcd", "etcd started")?;
        let data = self.layout.dir.join("data/etcd");
        let host = self
            .net
            .as_ref()
            .map_or("127.0.0.1", |n| n.host_ip.as_str());
        let peer = format!("http://{host}:{peer_port}");
        let client = format!("http://{host}:{client_port}");
        let mut command = Command::new(&self.layout.etcd);
        die_with_parent(&mut command);
        let child = command
            .arg("--name")
            .arg("chaos")
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("chaos={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                ChaosError::Etcd(format!(
                    "cannot start {} ({e}): a chaos run needs a real etcd \
                     (Debian: apt-get install etcd-server; or --etcd PATH)",
                    self.layout.etcd.display()
                ))
            })?;
        self.etcd.child = Some(child);
        self.etcd.starts += 1;
        let deadline = Instant::now() + ETCD_START_TIMEOUT;
        loop {
            match self.store.server_version() {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(ChaosError::Etcd(format!(
                    "etcd at {} did not answer within {ETCD_START_TIMEOUT:?}: {e} (logs/etcd.log)",
                    self.etcd_endpoint
                )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
            self.watch();
            if !self.crashes.is_empty() {
                return Err(ChaosError::Etcd(format!(
                    "etcd exited at start: {:?} (logs/etcd.log)",
                    self.crashes
                )));
            }
        }
    }

    fn spawn(&self, p: &Proc, t_s: f64) -> Result<Child, ChaosError> {
        let what = match p.role {
            Role::Cm => "cm",
            Role::Server => "server",
            Role::Etcd => unreachable!("etcd is started by start_etcd"),
        };
        let log = self.log_file(
            &p.name,
            &format!("{} start #{} at t={t_s:.3}s", p.name, p.starts + 1),
        )?;
        // `ip netns exec` execs the program: the child's pid is the program's.
        let mut command = match &p.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(Net::exec_prefix(ns)).arg(&self.layout.bin);
                c
            }
            None => Command::new(&self.layout.bin),
        };
        die_with_parent(&mut command);
        command
            .arg(what)
            .arg("--config")
            .arg(&p.config)
            .env("RUST_LOG", "info,rowankv_fabric=warn,rowankv_rpc=warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io_err(format!("starting {}", self.layout.bin.display())))
    }

    /// Start CM `j` (if it is not running).
    pub fn start_cm(&mut self, j: usize, t_s: f64) -> Result<u32, ChaosError> {
        if let Some(pid) = self.cms[j].pid() {
            return Ok(pid);
        }
        let child = self.spawn(&self.cms[j], t_s)?;
        let pid = child.id();
        let p = &mut self.cms[j];
        p.child = Some(child);
        p.starts += 1;
        p.stopped = false;
        Ok(pid)
    }

    /// Start server `i` on its pool (if it is not running).
    pub fn start_server(&mut self, i: usize, t_s: f64) -> Result<u32, ChaosError> {
        if let Some(pid) = self.servers[i].pid() {
            return Ok(pid);
        }
        let child = self.spawn(&self.servers[i], t_s)?;
        let pid = child.id();
        let p = &mut self.servers[i];
        p.child = Some(child);
        p.starts += 1;
        p.stopped = false;
        Ok(pid)
    }

    /// Every CM and server that is not running, started; every stopped one
    /// continued.
    pub fn start_all(&mut self, t_s: f64) -> Result<(), ChaosError> {
        for j in 0..self.cms.len() {
            self.start_cm(j, t_s)?;
        }
        for i in 0..self.servers.len() {
            if self.servers[i].stopped {
                self.signal_server(i, "CONT")?;
            }
            self.start_server(i, t_s)?;
        }
        Ok(())
    }

    /// SIGKILL, and reap. Returns the pid killed (None: it was not running).
    fn kill(p: &mut Proc) -> Option<u32> {
        let mut child = p.child.take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        p.stopped = false;
        Some(pid)
    }

    pub fn kill_server(&mut self, i: usize) -> Option<u32> {
        Self::kill(&mut self.servers[i])
    }

    pub fn kill_cm(&mut self, j: usize) -> Option<u32> {
        Self::kill(&mut self.cms[j])
    }

    /// Every CM and server killed at once: SIGKILL to all first, then reaped.
    pub fn power_cut(&mut self) -> Vec<u32> {
        let mut killed = Vec::new();
        for p in self.cms.iter_mut().chain(self.servers.iter_mut()) {
            if let Some(c) = p.child.as_mut() {
                let _ = c.kill();
                killed.push(c.id());
            }
        }
        for p in self.cms.iter_mut().chain(self.servers.iter_mut()) {
            Self::kill(p);
        }
        killed
    }

    /// `kill -SIG pid` for server `i` (STOP or CONT).
    pub fn signal_server(&mut self, i: usize, signal: &str) -> Result<(), ChaosError> {
        let p = &mut self.servers[i];
        let Some(pid) = p.pid() else {
            return Ok(());
        };
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(io_err("running kill"))?;
        if !status.success() {
            return Err(ChaosError::Cluster(format!(
                "kill -{signal} {pid} ({}) failed: {status}",
                p.name
            )));
        }
        p.stopped = signal == "STOP";
        Ok(())
    }

    /// Reap children that exited by themselves: each is a crash.
    pub fn watch(&mut self) {
        let procs = std::iter::once(&mut self.etcd)
            .chain(self.cms.iter_mut())
            .chain(self.servers.iter_mut());
        for p in procs {
            let Some(child) = p.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                self.crashes.push((
                    format!("{} (start #{}, pid {})", p.name, p.starts, child.id()),
                    status.to_string(),
                ));
                p.child = None;
            }
        }
    }

    /// The CM holding the active lease in etcd, as an index into `cms`.
    pub fn active_cm(&self) -> Result<Option<usize>, ChaosError> {
        let Some((holder, _)) = self
            .store
            .get(CM_LEASE_KEY)
            .map_err(|e| ChaosError::Etcd(e.to_string()))?
        else {
            return Ok(None);
        };
        // The holder is named `cm<node>` (crates/cm/src/role.rs); the node's
        // record holds the CM's address.
        let holder = String::from_utf8_lossy(&holder).into_owned();
        let Some(node) = holder
            .strip_prefix("cm")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            return Err(ChaosError::Etcd(format!(
                "the active CM lease names {holder:?}, not cm<node>"
            )));
        };
        let record =
            node_record(&self.store, NodeId(node)).map_err(|e| ChaosError::Etcd(e.to_string()))?;
        Ok(record.and_then(|r| self.cm_addrs.iter().position(|a| *a == r.address)))
    }

    /// The term recorded committed in etcd (0: none yet).
    pub fn committed_term(&self) -> Result<u64, ChaosError> {
        committed_term(&self.store)
    }

    /// A second handle on the store (for the commit watcher's thread).
    pub fn store(&self) -> Result<EtcdStore, ChaosError> {
        EtcdStore::new(self.store.config().clone()).map_err(|e| ChaosError::Etcd(e.to_string()))
    }

    /// Everything stopped: SIGCONT to stopped servers, then SIGKILL to all.
    /// What exited by itself before is reaped (and recorded) first.
    pub fn shut_down(&mut self) {
        self.watch();
        for i in 0..self.servers.len() {
            if self.servers[i].stopped {
                let _ = self.signal_server(i, "CONT");
            }
        }
        self.power_cut();
        Self::kill(&mut self.etcd);
    }

    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A run that ends early (an error) leaves no process behind.
        for p in self
            .cms
            .iter_mut()
            .chain(self.servers.iter_mut())
            .chain(std::iter::once(&mut self.etcd))
        {
            if p.stopped {
                if let Some(pid) = p.pid() {
                    let _ = Command::new("kill")
                        .arg("-CONT")
                        .arg(pid.to_string())
                        .status();
                }
            }
            Self::kill(p);
        }
    }
}

/// Who holds the active CM lease ([`CM_LEASE_KEY`]), if anyone.
pub fn active_holder(store: &EtcdStore) -> Result<Option<Vec<u8>>, ChaosError> {
    Ok(store
        .get(CM_LEASE_KEY)
        .map_err(|e| ChaosError::Etcd(e.to_string()))?
        .map(|(holder, _)| holder))
}

/// The term recorded committed under [`COMMITTED_KEY`] (0: none yet).
pub fn committed_term(store: &EtcdStore) -> Result<u64, ChaosError> {
    match store
        .get(COMMITTED_KEY)
        .map_err(|e| ChaosError::Etcd(e.to_string()))?
    {
        None => Ok(0),
        Some((bytes, _)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| {
                ChaosError::Etcd(format!("{COMMITTED_KEY} holds {bytes:?}, not a term"))
            }),
    }
}
