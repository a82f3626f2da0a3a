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

/// A folder removed on drop (`CX_KEEP_SCRATCH=1` keeps it, configs and logs, for a post-mortem).
#[derive(Debug)]
pub struct ScratchDir {
    /// Its path.
    pub path: PathBuf,
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
        Ok(Self { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
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
        mut command: Command,
        log: Option<&Path>,
        hint: &'static str,
    ) -> Result<Self> {
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(Error::io(path))?,
            ),
            None => Stdio::null(),
        };
        let child = command
            .stdout(Stdio::null())
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
            if TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok() && ready() {
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

    /// Kills the child (SIGKILL: no chance to flush anything it did not already persist).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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
