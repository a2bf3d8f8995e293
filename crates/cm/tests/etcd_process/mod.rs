//! A real etcd for one test: its own process, free ports, a temporary data
//! directory, killed when dropped.
//!
//! `EtcdProcess::start()` returns `None` (after printing why) only when no etcd is
//! installed (`etcd` on PATH, `/usr/bin/etcd`, or `ROWANKV_ETCD_BIN`); with
//! `ROWANKV_REQUIRE_ETCD=1` a missing etcd fails the test instead. Any other
//! failure to start is a test failure.
//!
//! The test etcd runs with a 50 ms heartbeat and a 500 ms election timeout, so it
//! is leader within about a second and its minimum lease TTL is 1 s (etcd raises
//! every TTL to 1.5 election timeouts, rounded up to a second), and with a 10 MiB
//! request limit so that values up to the trait's 8 MiB fit.
#![allow(dead_code)]

use std::fs::File;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rowankv_cm::{EtcdConfig, EtcdStore};

/// The request limit the test etcd is started with.
pub const MAX_REQUEST_BYTES: usize = 10 << 20;
/// How long a start may take on a loaded two-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct EtcdProcess {
    binary: PathBuf,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    extra_args: Vec<String>,
    child: Option<Child>,
}

/// The etcd binary, if one is installed.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ROWANKV_ETCD_BIN") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            let _ = writeln!(
                std::io::stderr(),
                "ROWANKV_ETCD_BIN={} is not a file",
                path.display()
            );
        }
        return path.is_file().then_some(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("etcd"))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or(None);
    on_path.or_else(|| {
        let usr = PathBuf::from("/usr/bin/etcd");
        usr.is_file().then_some(usr)
    })
}

/// A plain HTTP client for talking to the test etcd directly (no proxy from the
/// environment).
pub fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .into()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

impl EtcdProcess {
    /// A fresh etcd, healthy; `None` if etcd is not installed (see the module doc).
    pub fn start() -> Option<EtcdProcess> {
        EtcdProcess::start_with(&[])
    }

    /// `start` with extra command-line flags (which override the defaults here).
    pub fn start_with(extra_args: &[&str]) -> Option<EtcdProcess> {
        let Some(binary) = etcd_binary() else {
            let reason = "etcd is not installed (no `etcd` on PATH, no /usr/bin/etcd, no \
                          ROWANKV_ETCD_BIN naming one): `apt-get install -y etcd-server`";
            if std::env::var_os("ROWANKV_REQUIRE_ETCD").is_some_and(|v| v == "1") {
                panic!("ROWANKV_REQUIRE_ETCD=1 but {reason}");
            }
            // Straight to the process's stderr: libtest captures `eprintln!` of a
            // passing test, and this must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "{}: SKIPPED (not failed): {reason}",
                std::thread::current().name().unwrap_or("an etcd test")
            );
            return None;
        };
        let mut last_failure = String::new();
        // A port found free may be taken by another test's etcd before ours binds
        // it: try again with new ports.
        for _ in 0..3 {
            let mut etcd = EtcdProcess {
                binary: binary.clone(),
                dir: tempfile::tempdir().expect("a temporary directory"),
                client_port: free_port(),
                peer_port: free_port(),
                extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
                child: None,
            };
            match etcd.spawn_and_wait() {
                Ok(()) => return Some(etcd),
                Err(failure) => last_failure = failure,
            }
        }
        panic!("etcd ({}) did not start: {last_failure}", binary.display());
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("cannot open the log: {e}"))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("cannot open the log: {e}"))?;
        let mut command = Command::new(&self.binary);
        command
            .arg("--name=test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .arg(format!("--max-request-bytes={MAX_REQUEST_BYTES}"))
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        let agent = http_agent();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok())
                .flatten()
            {
                self.child = None;
                return Err(format!(
                    "it exited with {status}; log:\n{}",
                    tail(&self.log_path())
                ));
            }
            let healthy = agent
                .get(format!("{client}/health"))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .is_some_and(|body| body.contains("\"health\":\"true\""));
            if healthy {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "not healthy within {START_TIMEOUT:?}; log:\n{}",
                    tail(&self.log_path())
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:<client port>`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A store on this etcd under `prefix`, knowing the test etcd's request limit.
    pub fn store(&self, prefix: &str) -> EtcdStore {
        let mut config = EtcdConfig::new([self.endpoint()], prefix);
        config.max_request_bytes = MAX_REQUEST_BYTES;
        EtcdStore::new(config).expect("a valid etcd configuration")
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("etcd is running").id()
    }

    /// Kill it (SIGKILL): calls are refused until `restart`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same data directory and ports, and wait until it is
    /// healthy: every key and lease it had is there again.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(failure) = self.spawn_and_wait() {
            panic!("etcd did not restart: {failure}");
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Freeze it (SIGSTOP): connections are accepted by the kernel but nothing is
    /// answered, so calls time out.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    pub fn resume(&self) {
        self.signal("CONT");
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped process dies of SIGKILL too; continue it anyway so that
            // nothing is left frozen if the kill fails.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(self.pid().to_string())
                .stderr(Stdio::null())
                .status();
        }
        self.kill();
    }
}
