//! Supervision of child processes, in one place for every kind the devnet runs (Anvil and
//! signers now; the exchange and providers later): start with the output in a log file, wait
//! until a port accepts (readiness, not timing), kill on drop, read the log for a post-mortem.
//! Also the scratch folders and free ports they use.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A free TCP port on 127.0.0.1 (bound then released; the child binds it right after).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(Error::NoFreePort)?;
    Ok(listener.local_addr().map_err(Error::NoFreePort)?.port())
}

/// The TCP sockets listening on this machine (IPv4 and IPv6), as `(port, inode)`: the rows of
/// `/proc/net/tcp` and `tcp6` in state `0A`. `None` where there is no procfs.
pub fn listening_sockets() -> Option<Vec<(u16, u64)>> {
    let tables: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .collect();
    if tables.is_empty() {
        return None;
    }
    Some(
        tables
            .iter()
            .flat_map(|text| text.lines().skip(1))
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port = fields.get(1)?.rsplit(':').next()?;
                let port = u16::from_str_radix(port, 16).ok()?;
                let inode = fields.get(9)?.parse().ok()?;
                (*fields.get(3)? == "0A").then_some((port, inode))
            })
            .collect(),
    )
}

/// Whether process `pid`, or a process it started, holds a socket listening on TCP `port`
/// (the inodes of [`listening_sockets`] on that port against the sockets among
/// `/proc/<pid>/fd`). `None` where procfs cannot tell.
pub fn listens(pid: u32, port: u16) -> Option<bool> {
    let inodes: Vec<String> = listening_sockets()?
        .into_iter()
        .filter(|(p, _)| *p == port)
        .map(|(_, inode)| format!("socket:[{inode}]"))
        .collect();
    let mut pids = vec![pid];
    let mut seen = 0;
    while let Some(&pid) = pids.get(seen) {
        seen += 1;
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path())
                .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
            {
                return Some(true);
            }
        }
        // Its children (a wrapper script's server is one), bounded against a fork storm.
        if pids.len() < 64 {
            pids.extend(children(pid));
        }
    }
    Some(false)
}

/// The children of `pid`, from each of its threads' `/proc/<pid>/task/<tid>/children`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The `cx-provider` binary: `CX_PROVIDER_BIN`, else the one beside the running executable (`cx`
/// in `target/<profile>/`), else the one a folder up (a test binary runs from
/// `target/<profile>/deps/`). Not built here: `cargo test --workspace` and `scripts/run.sh`
/// build it.
pub fn provider_binary() -> Result<PathBuf> {
    built_binary("cx-provider", "cx-provider", "CX_PROVIDER_BIN")
}

/// Binary `name` of `package`: `env`, else beside the running executable, else a folder up (from
/// a test binary in `target/<profile>/deps/`, its crate's binaries are in `target/<profile>/`).
pub(crate) fn built_binary(
    name: &str,
    package: &'static str,
    env: &'static str,
) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(Error::io("the running executable"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let beside = dir.join(name);
    for candidate in [&beside, &dir.join("..").join(name)] {
        if candidate.exists() {
            return Ok(candidate.clone());
        }
    }
    Err(Error::MissingBinary {
        path: beside,
        package,
        env,
    })
}

/// A folder removed on drop (`CX_KEEP_SCRATCH=1` keeps it, configs and logs, for a post-mortem),
/// or one that is kept ([`ScratchDir::kept`]: the devnet's `runtime/devnet/…`, read after a run).
#[derive(Debug)]
pub struct ScratchDir {
    /// Its path.
    pub path: PathBuf,
    keep: bool,
}

impl ScratchDir {
    /// A fresh folder under the system's temporary directory.
    pub fn new(prefix: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            hex::encode(&cx_settlement::dkg::random_bytes()[..6])
        ));
        std::fs::create_dir_all(&path).map_err(Error::io(&path))?;
        Ok(Self { path, keep: false })
    }

    /// `path` (created if missing), left in place on drop: logs and configs a person reads
    /// after the processes stopped.
    pub fn kept(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        std::fs::create_dir_all(&path).map_err(Error::io(&path))?;
        Ok(Self { path, keep: true })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if std::env::var_os("CX_KEEP_SCRATCH").is_some() {
            eprintln!("kept {}", self.path.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One child process, killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    child: Option<Child>,
    log: Option<PathBuf>,
}

impl Supervised {
    /// Starts `command` as `name`, its stdout discarded and its stderr appended to `log` (or
    /// discarded when `None`). `hint` is added to a failure to start (what to install).
    pub fn spawn(
        name: impl Into<String>,
        command: Command,
        log: Option<&Path>,
        hint: &'static str,
    ) -> Result<Self> {
        Self::start(name, command, log, false, hint)
    }

    /// [`Supervised::spawn`] with stdout appended to the log too (what a server prints at
    /// start: its URL, its keys), for a process whose whole output a person reads afterwards.
    pub fn spawn_logged(
        name: impl Into<String>,
        command: Command,
        log: &Path,
        hint: &'static str,
    ) -> Result<Self> {
        Self::start(name, command, Some(log), true, hint)
    }

    fn start(
        name: impl Into<String>,
        mut command: Command,
        log: Option<&Path>,
        with_stdout: bool,
        hint: &'static str,
    ) -> Result<Self> {
        let open = |path: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(Error::io(path))
        };
        let (stdout, stderr) = match log {
            Some(path) => {
                let file = open(path)?;
                let stdout = if with_stdout {
                    Stdio::from(file.try_clone().map_err(Error::io(path))?)
                } else {
                    Stdio::null()
                };
                (stdout, Stdio::from(file))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|source| Error::Spawn {
                program: PathBuf::from(command.get_program()),
                source,
                hint,
            })?;
        Ok(Self {
            name: name.into(),
            child: Some(child),
            log: log.map(Path::to_path_buf),
        })
    }

    /// Waits until `address` accepts connections and `ready` says yes, polling every `poll`;
    /// fails if the child exits first or `timeout` passes (so a broken start is an error, not a
    /// hang).
    pub fn wait_ready(
        &mut self,
        address: SocketAddr,
        timeout: Duration,
        poll: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(Error::Exited {
                    name: self.name.clone(),
                    status,
                    log: self.log(),
                });
            }
            // A connection alone does not say the child listens: until it binds, another
            // process may hold the port (two starts picked the same free port; the child then
            // fails with "address in use", caught above on the next poll), and a connect to an
            // unbound port of the ephemeral range can even meet itself (TCP's simultaneous
            // open). A caller that went on would talk to the wrong server, or to none.
            if TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok()
                && self.pid().and_then(|pid| listens(pid, address.port())) != Some(false)
                && ready()
            {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(Error::NotReady {
                    name: self.name.clone(),
                    waited_s: timeout.as_secs(),
                });
            }
            std::thread::sleep(poll);
        }
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Its name, as errors say it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the kernel counted for it so far (Linux `/proc`; `None` elsewhere or once gone).
    pub fn usage(&self) -> Option<Usage> {
        Usage::of(self.pid()?)
    }

    /// Kills the child (SIGKILL: no chance to flush anything it did not already persist).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asks the child to stop (SIGTERM) and waits up to `timeout` for it to exit; SIGKILL after
    /// that. For a process that saves its state on a graceful exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let start = Instant::now();
        while sent && start.elapsed() < timeout {
            if let Ok(Some(_)) = child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(Error::NotReady {
            name: format!("{} (to stop on SIGTERM)", self.name),
            waited_s: timeout.as_secs(),
        })
    }

    /// Its log so far (empty without one).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A process's resource use as Linux's `/proc` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Peak resident memory (`VmHWM`), bytes.
    pub peak_rss_bytes: u64,
    /// Resident memory now (`VmRSS`), bytes.
    pub rss_bytes: u64,
    /// CPU time in user and kernel mode together, clock ticks (100 per second on Linux).
    pub cpu_ticks: u64,
}

impl Usage {
    /// Clock ticks per second of `cpu_ticks` (`sysconf(_SC_CLK_TCK)`, 100 on every Linux
    /// target we run on).
    pub const TICKS_PER_S: u64 = 100;

    /// The usage of process `pid`.
    pub fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .map_or(0, |n| n * 1024)
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold spaces, so split after its `)`):
        // state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Some(Self {
            peak_rss_bytes: kib("VmHWM:"),
            rss_bytes: kib("VmRSS:"),
            cpu_ticks: tick(11) + tick(12),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port is this process's while it listens on it, and not a child's that does not.
    #[test]
    fn a_listening_port_is_told_from_one_another_process_holds() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if listens(std::process::id(), port).is_none() {
            return; // no procfs here
        }
        assert_eq!(listens(std::process::id(), port), Some(true));
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        assert_eq!(listens(child.id(), port), Some(false));
        let _ = child.kill();
        let _ = child.wait();
        drop(listener);
        assert_eq!(listens(std::process::id(), port), Some(false));
    }
}
