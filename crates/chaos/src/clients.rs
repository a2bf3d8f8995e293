//! The load of a chaos run: client *processes* (`rowankv chaos-client`, one
//! per client, started and killed by [`crate::fleet`]), each with its own
//! RowanKV client (its own node on the `tcp` fabric, reaching the cluster
//! through the CMs as `rowankv put/get` do), recording every operation in the
//! simulator's history format (`rowankv_sim::history`) in a journal file.
//!
//! Keys are drawn Zipfian from a few hundred, so many clients write the hot
//! keys at once. Every value written is unique (`c<client>-<n>`, and a
//! restarted client process takes a new client number), so a read names the
//! one write it observed. Outcomes:
//! - answered: `ok` (a GET that finds nothing is `ok` with no output);
//! - no answer, or an error after which the write may have been applied
//!   ([`ClientError::is_unknown`]): `unknown` — never `fail`;
//! - refused without effect (the client's own bounds, a refusal the client
//!   knows changed nothing): `fail`.
//!
//! The journal holds two lines per operation: its call (written before the
//! request is sent, with status `unknown`) and its outcome. A client killed
//! with `kill -9` in the middle of an operation thus leaves the call on
//! record, and the operation is checked as one of unknown outcome — a write
//! it sent may still appear. Every process measures `call` and `return` as
//! its `CLOCK_MONOTONIC` reading minus the run's start on that clock
//! ([`Load::start_monotonic_ns`], passed to a client process on its command
//! line), so the histories of all processes share one timeline.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};
use rowankv_client::{ClientConfig, ClientError, Op, Output};
use rowankv_deploy::client::{self, Remote};
use rowankv_sim::history::{OpKind, Operation, Status};

/// How long one operation may take before it is given up (outcome unknown).
pub const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Consecutive errors after which a client thread drops its client and
/// connects anew (a fresh node, a fresh configuration).
const ERRORS_BEFORE_RECONNECT: u32 = 8;

/// Pause between polls of an operation in flight: the client threads share two
/// cores with the whole cluster, so they must not spin.
const POLL_PAUSE: Duration = Duration::from_micros(200);

/// What every client thread shares.
pub struct Load {
    pub cluster_id: u64,
    pub secret: Vec<u8>,
    pub cms: Vec<String>,
    /// The run's start on the host's monotonic clock: `call` and `return`
    /// are nanoseconds since this, read from `CLOCK_MONOTONIC` alone in every
    /// process (no pairing with an [`Instant`], which a descheduled thread
    /// would skew by however long it was off the CPU).
    pub start_monotonic_ns: u64,
    pub keys: Vec<String>,
    /// Zipf exponent of the key choice.
    pub zipf_s: f64,
    pub seed: u64,
    pub stop: AtomicBool,
}

impl Load {
    pub fn now_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.start_monotonic_ns)
    }

    fn connect(&self) -> Result<Remote, String> {
        let config = ClientConfig {
            timeout: OP_TIMEOUT,
            connect_timeout: OP_TIMEOUT,
            ..ClientConfig::default()
        };
        client::connect(self.cluster_id, &self.secret, &self.cms, config).map_err(|e| e.to_string())
    }
}

/// How far ahead of now a PUT's expiry time is: far past any clock jump (an
/// hour at most) and any run.
const EXPIRY_AHEAD_MS: u64 = 24 * 3600 * 1000;

/// The expiry time of a PUT of `value`: a day from now for about a third of
/// values (chosen by the value), none for the rest. Entries with expiry times
/// take every path a plain one does; no value may expire within a run, so a
/// server that measured expiry against a wrong clock (or stepped its lease
/// clock with its calendar) would lose acknowledged writes.
fn expiry_of(value: &str) -> Option<u64> {
    let h = value
        .bytes()
        .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b)));
    (h % 3 == 0).then(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        now + EXPIRY_AHEAD_MS
    })
}

/// Where a client's operations are recorded.
pub trait Journal {
    /// The operation as it is about to be sent (status `unknown`, `return`
    /// equal to `call`).
    fn called(&mut self, op: &Operation) -> io::Result<()>;
    /// Its outcome.
    fn returned(&mut self, op: Operation) -> io::Result<()>;
}

/// In memory: outcomes only (a thread of the chaos process cannot be killed
/// on its own).
impl Journal for Vec<Operation> {
    fn called(&mut self, _op: &Operation) -> io::Result<()> {
        Ok(())
    }

    fn returned(&mut self, op: Operation) -> io::Result<()> {
        self.push(op);
        Ok(())
    }
}

/// The journal file of a client process: one JSON line per call and one per
/// outcome, each written with one `write(2)` as it happens (no user-space
/// buffer a `kill -9` could lose; the page cache survives the process).
pub struct FileJournal {
    file: File,
    line: Vec<u8>,
}

impl FileJournal {
    pub fn create(path: &Path) -> io::Result<FileJournal> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(path)?;
        Ok(FileJournal {
            file,
            line: Vec::with_capacity(256),
        })
    }

    fn write(&mut self, op: &Operation) -> io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, op).map_err(io::Error::other)?;
        self.line.push(b'\n');
        self.file.write_all(&self.line)
    }
}

impl Journal for FileJournal {
    fn called(&mut self, op: &Operation) -> io::Result<()> {
        self.write(op)
    }

    fn returned(&mut self, op: Operation) -> io::Result<()> {
        self.write(&op)
    }
}

/// The operations of client journals, merged: for each (client, call), the
/// last line (the outcome if it was written, else the call, of unknown
/// outcome). A line that does not parse is an error, except a last line cut
/// short, which only a killed process can leave (`killed`).
pub fn read_journal(text: &str, killed: bool) -> Result<Vec<Operation>, String> {
    let mut by_call: BTreeMap<(u32, u64), Operation> = BTreeMap::new();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    for (n, line) in lines.iter().enumerate() {
        let complete = line.ends_with('\n');
        match serde_json::from_str::<Operation>(line.trim_end()) {
            Ok(op) if complete => {
                by_call.insert((op.client, op.call), op);
            }
            // A last line without its newline: cut by a kill, even if what
            // was written parses.
            _ if !complete && killed && n + 1 == lines.len() => {}
            Ok(_) => return Err(format!("line {}: no newline at the end", n + 1)),
            Err(e) => return Err(format!("line {}: {e}", n + 1)),
        }
    }
    Ok(by_call.into_values().collect())
}

/// Run one operation on `remote` as client `client`: recorded in `journal`
/// when it is sent and when it ends. Returns its status and whether the
/// client had an error (`None` from the client — a stuck client past every
/// deadline — is recorded as unknown; the caller then drops the client).
#[allow(clippy::too_many_arguments)]
pub fn execute(
    load: &Load,
    remote: &mut Remote,
    client: u32,
    op: OpKind,
    key: &str,
    value: Option<String>,
    final_read: bool,
    journal: &mut dyn Journal,
) -> io::Result<(Status, bool)> {
    let request = match op {
        OpKind::Get => Op::Get {
            key: key.as_bytes().to_vec(),
        },
        OpKind::Put => {
            let value = value.clone().expect("a put has a value");
            Op::Put {
                key: key.as_bytes().to_vec(),
                expires_at_ms: expiry_of(&value),
                value: value.into_bytes(),
            }
        }
        OpKind::Del => Op::Del {
            key: key.as_bytes().to_vec(),
        },
    };
    let call = load.now_ns();
    let mut record = Operation {
        client,
        op,
        key: key.to_string(),
        value,
        output: None,
        call,
        ret: call,
        status: Status::Unknown,
        term: 0,
        final_read,
    };
    journal.called(&record)?;
    let id = match remote.client.submit(request) {
        Ok(id) => id,
        Err(e) => {
            // Not sent: nothing can have been applied, unless the client says
            // otherwise.
            record.ret = load.now_ns();
            record.status = if e.is_unknown() {
                Status::Unknown
            } else {
                Status::Fail
            };
            journal.returned(record)?;
            return Ok((
                if e.is_unknown() {
                    Status::Unknown
                } else {
                    Status::Fail
                },
                true,
            ));
        }
    };
    // The client gives up at OP_TIMEOUT; this bound only catches a client that
    // never reports at all.
    let deadline = Instant::now() + OP_TIMEOUT * 3;
    let mut out = Vec::new();
    loop {
        out.clear();
        remote.client.poll(&mut out);
        if let Some(c) = out.iter().find(|c| c.id == id) {
            record.ret = load.now_ns();
            let (status, output) = match (&c.result, op) {
                (Ok(Output::Value { value, .. }), OpKind::Get) => (
                    Status::Ok,
                    Some(String::from_utf8_lossy(value).into_owned()),
                ),
                (Err(ClientError::NotFound), OpKind::Get | OpKind::Del) => (Status::Ok, None),
                (Ok(Output::Written { .. }), OpKind::Put | OpKind::Del) => (Status::Ok, None),
                // An answer of the wrong shape: the client cannot tell what
                // happened.
                (Ok(_), _) => (Status::Unknown, None),
                (Err(e), _) if e.is_unknown() => (Status::Unknown, None),
                (Err(_), _) => (Status::Fail, None),
            };
            record.status = status;
            record.output = output;
            record.term = if status == Status::Ok { c.term.0 } else { 0 };
            journal.returned(record)?;
            return Ok((status, status != Status::Ok));
        }
        if Instant::now() > deadline {
            record.ret = load.now_ns();
            record.status = Status::Unknown;
            journal.returned(record)?;
            return Ok((Status::Unknown, true));
        }
        std::thread::sleep(POLL_PAUSE);
    }
}

/// Counts of one client.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadCounts {
    pub connects: u64,
    pub connect_failures: u64,
}

/// What one client does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// PUTs (45 %), DELs (10 %) and GETs of Zipfian keys.
    Mixed,
    /// GETs of one key only ([`run_reader`]).
    Reader(String),
}

/// One client: operations until `load.stop`, every one in `journal`.
pub fn run(
    load: &Load,
    client: u32,
    role: &Role,
    journal: &mut dyn Journal,
) -> io::Result<ThreadCounts> {
    match role {
        Role::Mixed => run_client(load, client, journal),
        Role::Reader(key) => run_reader(load, client, key.clone(), journal),
    }
}

/// A mixed client.
fn run_client(load: &Load, client: u32, journal: &mut dyn Journal) -> io::Result<ThreadCounts> {
    let mut rng = ChaCha8Rng::seed_from_u64(
        load.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(client),
    );
    let zipf = Zipf::new(load.keys.len() as u64, load.zipf_s)
        .expect("a Zipf exponent checked by the options");
    let mut n = 0u64;
    let keys = load.keys.clone();
    drive(load, client, Duration::ZERO, journal, move || {
        let key = keys[zipf.sample(&mut rng) as usize - 1].clone();
        let p: f64 = rng.gen();
        if p < 0.45 {
            n += 1;
            (OpKind::Put, key, Some(format!("c{client}-{n}")))
        } else if p < 0.55 {
            (OpKind::Del, key, None)
        } else {
            (OpKind::Get, key, None)
        }
    })
}

/// Pause between the reads of a one-key reader.
const READER_PAUSE: Duration = Duration::from_millis(2);

/// A one-key reader: GETs of `key` only, until `load.stop`, every one recorded.
///
/// The RowanKV client re-reads the configuration only when an operation
/// fails, and the mixed clients above fail soon after any change (a write
/// through a removed primary fails), so they leave a server that answers
/// when it should not only a few milliseconds to be caught. A reader of one
/// key never writes: while the server it reads from answers, it keeps the
/// configuration it has. A server cut off from the CMs must stop answering
/// when its lease ends (then the reader fails, re-reads the configuration and
/// follows the new primary); one that answers on is caught by the
/// stale-configuration check and, once the key is written elsewhere, by the
/// linearizability check. The run starts one reader per server, each on a key
/// whose shard that server led when the load started.
fn run_reader(
    load: &Load,
    client: u32,
    key: String,
    journal: &mut dyn Journal,
) -> io::Result<ThreadCounts> {
    drive(load, client, READER_PAUSE, journal, move || {
        (OpKind::Get, key.clone(), None)
    })
}

/// The loop of a client: the operations `next` chooses, one at a time, each
/// recorded, `pause_ok` after each answered one; a client that fails
/// [`ERRORS_BEFORE_RECONNECT`] times in a row connects anew.
fn drive(
    load: &Load,
    client: u32,
    pause_ok: Duration,
    journal: &mut dyn Journal,
    mut next: impl FnMut() -> (OpKind, String, Option<String>),
) -> io::Result<ThreadCounts> {
    let mut counts = ThreadCounts::default();
    let mut remote: Option<Remote> = None;
    let mut errors = 0u32;
    while !load.stop.load(Ordering::Acquire) {
        let Some(r) = remote.as_mut() else {
            match load.connect() {
                Ok(r) => {
                    counts.connects += 1;
                    remote = Some(r);
                    errors = 0;
                }
                Err(_) => {
                    counts.connect_failures += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            continue;
        };
        let (op, key, value) = next();
        let (_, error) = execute(load, r, client, op, &key, value, false, journal)?;
        if error {
            errors += 1;
            if errors >= ERRORS_BEFORE_RECONNECT {
                remote = None;
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            errors = 0;
            if !pause_ok.is_zero() {
                std::thread::sleep(pause_ok);
            }
        }
    }
    Ok(counts)
}

/// Read every key once more after healing, retrying each until it is
/// answered (`attempts` at most); every attempt is recorded as a final read.
/// Returns the keys that could not be read.
pub fn read_back(
    load: &Load,
    client: u32,
    attempts: u32,
    history: &mut Vec<Operation>,
) -> Vec<String> {
    let mut unread = Vec::new();
    let mut remote: Option<Remote> = None;
    for key in &load.keys {
        let mut done = false;
        for _ in 0..attempts {
            if remote.is_none() {
                match load.connect() {
                    Ok(r) => remote = Some(r),
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                }
            }
            let r = remote.as_mut().expect("connected above");
            let (status, error) = execute(load, r, client, OpKind::Get, key, None, true, history)
                .expect("an in-memory journal does not fail");
            if status == Status::Ok {
                done = true;
                break;
            }
            if error {
                remote = None;
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        if !done {
            unread.push(key.clone());
        }
    }
    unread
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`, the clock of
/// [`Instant`] on Linux), in nanoseconds.
#[allow(unsafe_code)] // clock_gettime(2): std does not expose an Instant's reading
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists
    // on Linux, so the call cannot fail.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The monotonic reading of `start` (an [`Instant`] of this process).
pub fn monotonic_ns_of(start: Instant) -> u64 {
    let (now, elapsed) = (monotonic_ns(), start.elapsed());
    now.saturating_sub(elapsed.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u32, call: u64, ret: u64, status: Status) -> Operation {
        Operation {
            client,
            op: OpKind::Put,
            key: "k1".into(),
            value: Some(format!("c{client}-{call}")),
            output: None,
            call,
            ret,
            status,
            term: if status == Status::Ok { 3 } else { 0 },
            final_read: false,
        }
    }

    fn line(o: &Operation) -> String {
        serde_json::to_string(o).unwrap() + "\n"
    }

    #[test]
    fn a_journal_keeps_the_outcome_of_each_call_and_the_call_of_an_unfinished_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client-1.jsonl");
        let mut j = FileJournal::create(&path).unwrap();
        let a = op(1, 100, 100, Status::Unknown);
        j.called(&a).unwrap();
        j.returned(op(1, 100, 150, Status::Ok)).unwrap();
        let b = op(1, 200, 200, Status::Unknown);
        j.called(&b).unwrap();
        // Killed here: b has no outcome.
        drop(j);
        assert!(
            FileJournal::create(&path).is_err(),
            "a journal is never appended to by a second process"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let ops = read_journal(&text, false).unwrap();
        assert_eq!(ops, vec![op(1, 100, 150, Status::Ok), b]);
    }

    #[test]
    fn a_line_cut_short_is_accepted_only_last_and_only_from_a_killed_client() {
        let full = line(&op(1, 100, 150, Status::Ok));
        let cut = &line(&op(1, 200, 200, Status::Unknown))[..30];
        let text = format!("{full}{cut}");
        assert_eq!(read_journal(&text, true).unwrap().len(), 1);
        let e = read_journal(&text, false).unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        // Cut short in the middle: never.
        let text = format!("{cut}\n{full}");
        let e = read_journal(&text, true).unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
        // A whole last line without its newline is still cut short.
        let text = format!("{full}{}", full.trim_end());
        assert_eq!(read_journal(&text, true).unwrap().len(), 1);
        assert!(read_journal(&text, false).is_err());
    }

    #[test]
    fn the_runs_clock_is_the_monotonic_clock_from_the_start() {
        let start = monotonic_ns();
        let load = Load {
            cluster_id: 1,
            secret: Vec::new(),
            cms: Vec::new(),
            start_monotonic_ns: start,
            keys: vec!["k0".into()],
            zipf_s: 1.0,
            seed: 1,
            stop: AtomicBool::new(false),
        };
        let a = load.now_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = load.now_ns();
        assert!(b >= a + 2_000_000, "{a} then {b}");
        assert!(
            monotonic_ns() - start >= b,
            "the same clock, the same origin"
        );
        // An Instant's reading is on the same clock: never ahead of now.
        let m = monotonic_ns_of(Instant::now());
        assert!(monotonic_ns() >= m);
    }
}
