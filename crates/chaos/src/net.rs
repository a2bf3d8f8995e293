//! The network of a chaos run: every CM and every server in a network
//! namespace of its own, each namespace joined by a veth pair to one bridge
//! that the run creates; etcd, the clients and the chaos process itself stay
//! in the host's namespace and reach them over the bridge. Partitions are
//! `nftables` rules inside the namespaces (one table, `inet chaos`, with an
//! input and an output chain, flushed to heal), slow links a `tc tbf` queue on
//! both ends of a server's veth pair. A run claims its names with a lock file
//! in `/run/rowankv-chaos` held for its life; nothing outside the run's own
//! bridge and namespaces is touched, dropping the [`Net`] removes them, and
//! [`Net::remove_orphans`] removes those of a run whose claim is free (its
//! process gone) and only those.
//!
//! Addresses: `10.77.N.0/24`, `N` chosen so that no interface of the host holds
//! one of them already; the host's end of the bridge is `.1`, CM `j` is
//! `.(2 + j)`, server `i` is `.(20 + i)`.
//!
//! The kernel here has no `netem`, so no latency or jitter is added: a slow
//! link is a slow link (a token bucket), not a distant one.

use std::process::Command;

use crate::ChaosError;

/// The nftables table every namespace's filter rules live in.
const TABLE: &str = "inet chaos";

/// The rate of a slow link.
pub const SLOW_RATE: &str = "512kbit";

/// One namespace.
#[derive(Clone, Debug)]
pub struct Space {
    /// Its name (`ip netns`).
    pub ns: String,
    /// Its address on the bridge.
    pub ip: String,
    /// The host's end of its veth pair.
    veth: String,
}

/// The run's bridge and namespaces.
#[derive(Debug)]
pub struct Net {
    /// The run's tag: every name of its network starts with it.
    pub tag: String,
    bridge: String,
    /// The host's address on the bridge.
    pub host_ip: String,
    pub cms: Vec<Space>,
    pub servers: Vec<Space>,
    /// The run's claim on its names: `LOCK_DIR/<tag>.lock`, locked for the
    /// run's life ([`Net::remove_orphans`] removes only names whose lock it
    /// can take).
    _lock: std::fs::File,
}

/// Where runs keep their locks.
const LOCK_DIR: &str = "/run/rowankv-chaos";

/// Take the exclusive lock on `file` without waiting; whether it was taken.
#[allow(unsafe_code)] // flock(2) on a file this process owns
fn try_lock(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid, open descriptor; flock touches nothing else.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Open (creating) and lock the claim on `tag`; `None` if another process
/// holds it.
fn claim(tag: &str) -> Result<Option<std::fs::File>, ChaosError> {
    std::fs::create_dir_all(LOCK_DIR)
        .map_err(|e| ChaosError::Cluster(format!("creating {LOCK_DIR}: {e}")))?;
    let path = format!("{LOCK_DIR}/{tag}.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| ChaosError::Cluster(format!("opening {path}: {e}")))?;
    Ok(try_lock(&file).then_some(file))
}

fn run(program: &str, args: &[&str]) -> Result<String, ChaosError> {
    let out = Command::new(program).args(args).output().map_err(|e| {
        ChaosError::Cluster(format!(
            "cannot run {program} ({e}): a chaos run's network needs iproute2 and nftables \
             (Debian: apt-get install -y iproute2 nftables), and root; --net loopback runs \
             without network faults"
        ))
    })?;
    if !out.status.success() {
        return Err(ChaosError::Cluster(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, ChaosError> {
    run("ip", args)
}

/// Run `program args` inside namespace `ns`.
fn inside(ns: &str, program: &str, args: &[&str]) -> Result<String, ChaosError> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run("ip", &all)
}

impl Net {
    /// Create the bridge and a namespace for each of `cms` CMs and `servers`
    /// servers, named after `tag` (a few letters and digits, unique to the run).
    pub fn create(tag: &str, cms: usize, servers: usize) -> Result<Net, ChaosError> {
        // A subnet no interface of the host uses.
        let used = ip(&["-o", "-4", "addr", "show"])?;
        let seed = tag.bytes().fold(0u32, |a, b| a.wrapping_mul(31) + b as u32);
        let n = (0..200)
            .map(|k| 20 + (seed + k) % 200)
            .find(|n| !used.contains(&format!(" 10.77.{n}.")))
            .ok_or_else(|| ChaosError::Cluster("no free 10.77.N.0/24 subnet".into()))?;
        let prefix = format!("10.77.{n}");
        let bridge = format!("{tag}b");
        let lock = claim(tag)?.ok_or_else(|| {
            ChaosError::Cluster(format!("another chaos run holds {LOCK_DIR}/{tag}.lock"))
        })?;
        let space = |name: String, host: usize, k: usize| Space {
            ns: format!("{tag}-{name}"),
            ip: format!("{prefix}.{host}"),
            veth: format!("{tag}v{k}"),
        };
        let net = Net {
            tag: tag.to_string(),
            bridge: bridge.clone(),
            host_ip: format!("{prefix}.1"),
            cms: (0..cms)
                .map(|j| space(format!("cm{j}"), 2 + j, j))
                .collect(),
            servers: (0..servers)
                .map(|i| space(format!("s{i}"), 20 + i, cms + i))
                .collect(),
            _lock: lock,
        };
        // What an earlier run of the same tag left is removed first (its
        // names are ours).
        net.remove();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.host_ip),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        let spaces: Vec<Space> = net.cms.iter().chain(&net.servers).cloned().collect();
        for s in &spaces {
            ip(&["netns", "add", &s.ns])?;
            ip(&[
                "link", "add", &s.veth, "type", "veth", "peer", "name", "eth0", "netns", &s.ns,
            ])?;
            ip(&["link", "set", &s.veth, "master", &bridge, "up"])?;
            ip(&[
                "-n",
                &s.ns,
                "addr",
                "add",
                &format!("{}/24", s.ip),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &s.ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &s.ns, "link", "set", "lo", "up"])?;
            inside(&s.ns, "nft", &["add", "table", TABLE])?;
            for (chain, hook) in [("in", "input"), ("out", "output")] {
                inside(
                    &s.ns,
                    "nft",
                    &[&format!(
                        "add chain {TABLE} {chain} {{ type filter hook {hook} priority 0; policy accept; }}"
                    )],
                )?;
            }
        }
        net.check_reachable()?;
        Ok(net)
    }

    /// Every namespace reaches the host over the bridge (a TCP connection to
    /// a listener on the host's address), or the network is not usable.
    fn check_reachable(&self) -> Result<(), ChaosError> {
        let listener = std::net::TcpListener::bind((self.host_ip.as_str(), 0))
            .map_err(|e| ChaosError::Cluster(format!("listening on {}: {e}", self.host_ip)))?;
        let port = listener.local_addr().expect("a bound address").port();
        for s in self.cms.iter().chain(&self.servers) {
            // bash's /dev/tcp: no tool beyond the shell is needed.
            inside(
                &s.ns,
                "bash",
                &["-c", &format!("exec 3<>/dev/tcp/{}/{port}", self.host_ip)],
            )
            .map_err(|e| {
                ChaosError::Cluster(format!(
                    "namespace {} does not reach the host at {}: {e}",
                    s.ns, self.host_ip
                ))
            })?;
        }
        Ok(())
    }

    /// One line for the run's log.
    pub fn describe(&self) -> String {
        format!(
            "network {}: bridge {} ({}), namespaces {}",
            self.tag,
            self.bridge,
            self.host_ip,
            self.cms
                .iter()
                .chain(&self.servers)
                .map(|s| format!("{} ({})", s.ns, s.ip))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The command prefix that runs a program inside namespace `ns`.
    pub fn exec_prefix(ns: &str) -> [String; 3] {
        ["netns".into(), "exec".into(), ns.into()]
    }

    /// Drop what `space` receives from `from` and sends to `to` (addresses).
    pub fn block(space: &Space, from: &[String], to: &[String]) -> Result<(), ChaosError> {
        if !from.is_empty() {
            inside(
                &space.ns,
                "nft",
                &[&format!(
                    "add rule {TABLE} in ip saddr {{ {} }} drop",
                    from.join(", ")
                )],
            )?;
        }
        if !to.is_empty() {
            inside(
                &space.ns,
                "nft",
                &[&format!(
                    "add rule {TABLE} out ip daddr {{ {} }} drop",
                    to.join(", ")
                )],
            )?;
        }
        Ok(())
    }

    /// Cut `a` from `b` both ways (rules on both sides).
    pub fn cut(a: &[&Space], b: &[&Space]) -> Result<(), ChaosError> {
        let ips = |v: &[&Space]| v.iter().map(|s| s.ip.clone()).collect::<Vec<_>>();
        let (ia, ib) = (ips(a), ips(b));
        for s in a {
            Net::block(s, &ib, &ib)?;
        }
        for s in b {
            Net::block(s, &ia, &ia)?;
        }
        Ok(())
    }

    /// Every filter rule of every namespace removed.
    pub fn heal_partitions(&self) -> Result<(), ChaosError> {
        for s in self.cms.iter().chain(&self.servers) {
            inside(&s.ns, "nft", &["flush", "table", TABLE])?;
        }
        Ok(())
    }

    /// Server `i`'s link slowed to [`SLOW_RATE`] both ways.
    pub fn slow(&self, i: usize) -> Result<(), ChaosError> {
        let s = &self.servers[i];
        let tbf = [
            "root", "tbf", "rate", SLOW_RATE, "burst", "16kb", "latency", "400ms",
        ];
        let mut args = vec!["qdisc", "replace", "dev", "eth0"];
        args.extend_from_slice(&tbf);
        inside(&s.ns, "tc", &args)?;
        let mut args = vec!["qdisc", "replace", "dev", &s.veth];
        args.extend_from_slice(&tbf);
        run("tc", &args)?;
        Ok(())
    }

    /// Server `i`'s link back to full speed.
    pub fn heal_slow(&self, i: usize) -> Result<(), ChaosError> {
        let s = &self.servers[i];
        inside(&s.ns, "tc", &["qdisc", "del", "dev", "eth0", "root"])?;
        run("tc", &["qdisc", "del", "dev", &s.veth, "root"])?;
        Ok(())
    }

    /// Remove what runs whose chaos process is gone left behind (a chaos
    /// process killed by a signal does not remove its network): namespaces
    /// `rk<pid>-…` and bridges `rk<pid>b` whose claim (`LOCK_DIR/rk<pid>.lock`)
    /// exists and no process holds. Names without a claim here (another
    /// machine's, another container's) are never touched.
    pub fn remove_orphans() {
        let mut claims: std::collections::BTreeMap<String, Option<std::fs::File>> =
            std::collections::BTreeMap::new();
        let mut dead = |name: &str| -> Option<String> {
            let digits: String = name
                .strip_prefix("rk")?
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if digits.is_empty() {
                return None;
            }
            let tag = format!("rk{digits}");
            if !std::path::Path::new(&format!("{LOCK_DIR}/{tag}.lock")).exists() {
                return None;
            }
            let held = claims
                .entry(tag.clone())
                .or_insert_with(|| claim(&tag).ok().flatten());
            held.is_some().then_some(tag)
        };
        let mut tags = std::collections::BTreeSet::new();
        if let Ok(list) = ip(&["netns", "list"]) {
            for line in list.lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if let Some(tag) = dead(name).filter(|t| name.starts_with(&format!("{t}-"))) {
                    let _ = ip(&["netns", "del", name]);
                    tags.insert(tag);
                }
            }
        }
        if let Ok(links) = ip(&["-o", "link", "show", "type", "bridge"]) {
            for line in links.lines() {
                // "7: rk123b: <...>"
                let name = line.split(": ").nth(1).unwrap_or("");
                if let Some(tag) = dead(name).filter(|t| name == format!("{t}b")) {
                    let _ = ip(&["link", "del", name]);
                    tags.insert(tag);
                }
            }
        }
        for tag in tags {
            let _ = std::fs::remove_file(format!("{LOCK_DIR}/{tag}.lock"));
            eprintln!("chaos: removed the network {tag} of a chaos run whose process is gone");
        }
    }

    /// Remove the namespaces (their veth pairs go with them) and the bridge;
    /// what is already gone is no error.
    fn remove(&self) {
        for s in self.cms.iter().chain(&self.servers) {
            let _ = ip(&["netns", "del", &s.ns]);
            let _ = ip(&["link", "del", &s.veth]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
        let _ = std::fs::remove_file(format!("{LOCK_DIR}/{}.lock", self.tag));
    }
}
