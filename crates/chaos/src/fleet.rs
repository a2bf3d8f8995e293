//! The client processes of a chaos run: each a `rowankv chaos-client` child of
//! the chaos process ([`client_main`] is its body), with its own RowanKV
//! client and its own journal file (`clients/client-<n>.jsonl`, one per life;
//! [`crate::clients::FileJournal`]), killed with `kill -9` by the fault
//! `kill-client` and started again as a new client.
//!
//! A client process stops when its standard input closes (the chaos process
//! closes it at the end of the load, or dies): it finishes the operation in
//! flight, records it, and exits 0. One that exits otherwise, or is still
//! running a while after it was told to stop, is a violation, as a server
//! that crashes is.
//!
//! A restarted client takes a new client number (`n + 1000 × life`), as
//! Jepsen gives a crashed process a new identity: its operation cut short by
//! the kill stays open (unknown outcome) for good, and the new life's
//! operations are not ordered after it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_sim::history::{Operation, Status};

use crate::clients::{self, FileJournal, Load, Role, OP_TIMEOUT};
use crate::cluster::{die_with_parent, io_err, open_log};
use crate::ChaosError;

/// Client numbers of one slot's lives are this far apart.
pub const LIFE_STRIDE: u32 = 1_000;

/// How long a client process may take to stop once told to (it finishes the
/// operation in flight, bounded by the client's own deadlines).
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// What a client process is told on its command line.
#[derive(Clone, Debug)]
pub struct ClientProcess {
    pub cluster_id: u64,
    pub secret_file: PathBuf,
    pub cms: Vec<String>,
    /// Keys `k0..k<keys>`.
    pub keys: usize,
    pub zipf: f64,
    pub seed: u64,
    pub client: u32,
    /// `None`: a mixed client; `Some(key)`: a one-key reader.
    pub reader: Option<String>,
    /// The run's start on the host's monotonic clock.
    pub start_monotonic_ns: u64,
    pub journal: PathBuf,
}

/// The keys of a run of `n` keys.
pub fn key_names(n: usize) -> Vec<String> {
    (0..n).map(|k| format!("k{k}")).collect()
}

/// The body of `rowankv chaos-client`: operations until standard input
/// closes, each in the journal (created here; it must not exist).
pub fn client_main(p: &ClientProcess) -> Result<(), ChaosError> {
    let secret = std::fs::read(&p.secret_file)
        .map_err(io_err(format!("reading {}", p.secret_file.display())))?;
    if p.start_monotonic_ns > clients::monotonic_ns() {
        return Err(ChaosError::Options(format!(
            "--start-monotonic-ns {} is not a past reading of this host's monotonic clock",
            p.start_monotonic_ns
        )));
    }
    if p.keys == 0 {
        return Err(ChaosError::Options("--keys 0: a client needs keys".into()));
    }
    if !(p.zipf.is_finite() && p.zipf >= 0.0) {
        return Err(ChaosError::Options(format!(
            "--zipf {}: a Zipf exponent is finite and not negative",
            p.zipf
        )));
    }
    let mut journal = FileJournal::create(&p.journal)
        .map_err(io_err(format!("creating {}", p.journal.display())))?;
    let load = Arc::new(Load {
        cluster_id: p.cluster_id,
        secret,
        cms: p.cms.clone(),
        start_monotonic_ns: p.start_monotonic_ns,
        keys: key_names(p.keys),
        zipf_s: p.zipf,
        seed: p.seed,
        stop: AtomicBool::new(false),
    });
    {
        let load = load.clone();
        std::thread::Builder::new()
            .name("stdin-watch".into())
            .spawn(move || {
                let mut sink = [0u8; 64];
                let mut stdin = std::io::stdin();
                while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
                load.stop.store(true, Ordering::Release);
            })
            .map_err(io_err("starting a thread"))?;
    }
    let role = match &p.reader {
        Some(k) => Role::Reader(k.clone()),
        None => Role::Mixed,
    };
    clients::run(&load, p.client, &role, &mut journal)
        .map_err(io_err(format!("writing {}", p.journal.display())))?;
    Ok(())
}

/// One life of a client slot.
struct Life {
    client: u32,
    journal: PathBuf,
    /// When it was killed (ns since the run's start), if it was.
    killed_at: Option<u64>,
}

/// One client of the run, across its lives.
struct Slot {
    name: String,
    base: u32,
    role: Role,
    child: Option<(Child, ChildStdin)>,
    lives: Vec<Life>,
}

/// The client processes of a run.
pub struct Fleet {
    bin: PathBuf,
    dir: PathBuf,
    spec: ClientProcess,
    load: Arc<Load>,
    slots: Vec<Slot>,
    /// Violations: client processes that exited when not killed, or did not
    /// stop, or left a journal that does not read.
    pub violations: Vec<String>,
}

impl Fleet {
    /// The fleet of a run whose clients reach the cluster as `load` says;
    /// `dir` is the run's directory (`clients/` is created in it).
    pub fn new(
        bin: &Path,
        dir: &Path,
        load: Arc<Load>,
        secret_file: PathBuf,
    ) -> Result<Fleet, ChaosError> {
        std::fs::create_dir_all(dir.join("clients")).map_err(io_err("creating clients/"))?;
        let spec = ClientProcess {
            cluster_id: load.cluster_id,
            secret_file,
            cms: load.cms.clone(),
            keys: load.keys.len(),
            zipf: load.zipf_s,
            seed: load.seed,
            client: 0,
            reader: None,
            start_monotonic_ns: load.start_monotonic_ns,
            journal: PathBuf::new(),
        };
        Ok(Fleet {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            spec,
            load,
            slots: Vec::new(),
            violations: Vec::new(),
        })
    }

    /// Add a client (numbered `base`, below [`LIFE_STRIDE`]) and start it.
    pub fn add(&mut self, base: u32, role: Role) -> Result<u32, ChaosError> {
        assert!(base > 0 && base < LIFE_STRIDE, "client number {base}");
        let name = match &role {
            Role::Mixed => format!("client-{base}"),
            Role::Reader(_) => format!("reader-{base}"),
        };
        self.slots.push(Slot {
            name,
            base,
            role,
            child: None,
            lives: Vec::new(),
        });
        self.start(self.slots.len() - 1)
    }

    /// Mixed clients (not the readers): the targets of `kill-client`.
    pub fn mixed(&self) -> usize {
        self.slots.iter().filter(|s| s.role == Role::Mixed).count()
    }

    /// The slot of the `i`-th mixed client.
    fn mixed_slot(&self, i: usize) -> usize {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.role == Role::Mixed)
            .nth(i % self.mixed().max(1))
            .map(|(n, _)| n)
            .expect("a run has mixed clients")
    }

    /// Start slot `n`'s next life; its pid.
    fn start(&mut self, n: usize) -> Result<u32, ChaosError> {
        let slot = &self.slots[n];
        let life = slot.lives.len() as u32;
        let client = slot.base + LIFE_STRIDE * life;
        let journal = journal_path(&self.dir, client);
        let t = self.load.now_ns() as f64 / 1e9;
        let log = open_log(
            &self.dir,
            &slot.name,
            &format!(
                "{} life #{} as client {client} at t={t:.3}s",
                slot.name,
                life + 1
            ),
        )?;
        let mut command = Command::new(&self.bin);
        die_with_parent(&mut command);
        command
            .arg("chaos-client")
            .arg("--cluster-id")
            .arg(self.spec.cluster_id.to_string())
            .arg("--secret-file")
            .arg(&self.spec.secret_file)
            .arg("--cms")
            .arg(self.spec.cms.join(","))
            .arg("--keys")
            .arg(self.spec.keys.to_string())
            .arg("--zipf")
            .arg(self.spec.zipf.to_string())
            .arg("--seed")
            .arg(self.spec.seed.to_string())
            .arg("--client")
            .arg(client.to_string())
            .arg("--start-monotonic-ns")
            .arg(self.spec.start_monotonic_ns.to_string())
            .arg("--journal")
            .arg(&journal);
        if let Role::Reader(key) = &slot.role {
            command.arg("--reader").arg(key);
        }
        let mut child = command
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io_err(format!("starting {}", self.bin.display())))?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let pid = child.id();
        let slot = &mut self.slots[n];
        slot.child = Some((child, stdin));
        slot.lives.push(Life {
            client,
            journal,
            killed_at: None,
        });
        Ok(pid)
    }

    /// `kill -9` of the `i`-th mixed client (modulo their count): its name,
    /// client number and pid.
    pub fn kill(&mut self, i: usize) -> (String, u32, Option<u32>) {
        let n = self.mixed_slot(i);
        let slot = &mut self.slots[n];
        let client = slot.lives.last().map_or(0, |l| l.client);
        let Some((mut child, _stdin)) = slot.child.take() else {
            return (slot.name.clone(), client, None);
        };
        let pid = child.id();
        if let Ok(Some(status)) = child.try_wait() {
            self.violations.push(format!(
                "{} (client {client}, pid {pid}) exited without being killed: {status}",
                slot.name
            ));
            return (slot.name.clone(), client, None);
        }
        let _ = child.kill();
        let _ = child.wait();
        // Read after the kill: no operation of it was called later.
        let now = self.load.now_ns();
        if let Some(l) = slot.lives.last_mut() {
            l.killed_at = Some(now);
        }
        (slot.name.clone(), client, Some(pid))
    }

    /// Start the `i`-th mixed client again (a new life, a new client
    /// number): its number and pid.
    pub fn restart(&mut self, i: usize) -> Result<(u32, u32), ChaosError> {
        let n = self.mixed_slot(i);
        let pid = self.start(n)?;
        let client = self.slots[n].lives.last().map_or(0, |l| l.client);
        Ok((client, pid))
    }

    /// Tell every client to stop (close its standard input) and wait for
    /// them; a client that had exited already, exits with an error or does
    /// not stop within [`STOP_TIMEOUT`] is a violation (and is killed).
    pub fn stop(&mut self) {
        for slot in &mut self.slots {
            let Some((child, _)) = slot.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                let client = slot.lives.last().map_or(0, |l| l.client);
                self.violations.push(format!(
                    "{} (client {client}, pid {}) exited without being killed: {status}",
                    slot.name,
                    child.id()
                ));
                slot.child = None;
            }
        }
        let mut waiting = Vec::new();
        for slot in &mut self.slots {
            if let Some((child, stdin)) = slot.child.take() {
                drop(stdin);
                waiting.push((slot.name.clone(), child));
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT.max(OP_TIMEOUT * 4);
        for (name, mut child) in waiting {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        self.violations.push(format!(
                            "{name} (pid {}) failed when told to stop: {status} (logs/{name}.log)",
                            child.id()
                        ));
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) | Err(_) => {
                        self.violations.push(format!(
                            "{name} (pid {}) did not stop within {:?} of being told to",
                            child.id(),
                            STOP_TIMEOUT
                        ));
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }

    /// Client processes started (every life).
    pub fn lives(&self) -> usize {
        self.slots.iter().map(|s| s.lives.len()).sum()
    }

    /// Every life's journal, merged into operations (after [`Fleet::stop`]).
    /// An operation whose outcome was never written (its process killed in
    /// the middle of it) is of unknown outcome, ending when the process was
    /// killed. Returns the operations and how many were cut short by a kill.
    pub fn history(&mut self) -> (Vec<Operation>, u64) {
        let mut ops = Vec::new();
        let mut cut = 0;
        for slot in &self.slots {
            for life in &slot.lives {
                let text = match std::fs::read(&life.journal) {
                    Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(e) => {
                        self.violations.push(format!(
                            "{}: client {}'s journal {}: {e}",
                            slot.name,
                            life.client,
                            life.journal.display()
                        ));
                        continue;
                    }
                };
                match clients::read_journal(&text, life.killed_at.is_some()) {
                    Ok(mut life_ops) => {
                        for o in &mut life_ops {
                            if o.status == Status::Unknown && o.ret == o.call {
                                cut += 1;
                                o.ret = life.killed_at.unwrap_or(o.call).max(o.call);
                            }
                        }
                        ops.append(&mut life_ops);
                    }
                    Err(e) => self.violations.push(format!(
                        "{}: client {}'s journal {}: {e}",
                        slot.name,
                        life.client,
                        life.journal.display()
                    )),
                }
            }
        }
        (ops, cut)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some((mut child, stdin)) = slot.child.take() {
                drop(stdin);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A life's journal: `clients/client-<n>.jsonl` in the run's directory.
pub fn journal_path(dir: &Path, client: u32) -> PathBuf {
    dir.join("clients").join(format!("client-{client}.jsonl"))
}
