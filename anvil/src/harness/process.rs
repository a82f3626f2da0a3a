//! Processes a test starts: `cx serve` and the lines it prints, children killed (or
//! interrupted) on drop, one-shot runs of `cx` and `cx-provider`, and signals.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `cx` binary: `CX_BIN`, else the one Cargo built beside the running test (in
/// `target/<profile>/`, a folder above the test binary). Cargo builds it for `cx-cli`'s
/// integration tests, which are this harness's users.
pub fn cx_binary() -> PathBuf {
    crate::supervise::built_binary("cx", "cx-cli", "CX_BIN").unwrap_or_else(|e| panic!("{e}"))
}

/// The `cx-provider` binary ([`crate::provider_binary`]), or a panic that says how to build it.
pub fn provider_bin() -> PathBuf {
    crate::provider_binary().unwrap_or_else(|e| panic!("{e}"))
}

/// A `cx serve` child, killed on drop if the test did not stop it.
pub struct Serve {
    /// The process.
    pub child: Child,
    /// Its stdout, line by line, as it prints them.
    pub lines: mpsc::Receiver<String>,
    /// The lines read so far.
    pub seen: Vec<String>,
}

impl Serve {
    /// `cx serve args…` on `database_url`, its identity in a scratch file (unless `args` name
    /// one), its stdout read line by line.
    pub fn start(args: &[&str], database_url: &str) -> Self {
        // The exchange's identity in a scratch file, not in the package's runtime/ (unless the
        // test names one).
        let identity = std::env::temp_dir().join(format!(
            "cx-serve-identity-{}-{}.key",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut child = Command::new(cx_binary())
            .arg("serve")
            .args(args)
            .env("DATABASE_URL", database_url)
            .env("CX_IDENTITY", &identity)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cx runs");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The value of the first printed line `  <key>  <value>`, waiting for it.
    pub fn field(&mut self, key: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(value) = self.seen.iter().find_map(|line| {
                line.trim_start()
                    .strip_prefix(key)
                    .filter(|rest| rest.starts_with(' '))
                    .map(|rest| rest.trim().to_owned())
            }) {
                return value;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!(
                    "cx serve printed no `{key}` line; exit {:?}; stdout so far: {:?}",
                    self.child.try_wait(),
                    self.seen
                ),
            }
        }
    }

    /// SIGKILL, and waits for the process to be gone: a crash, not a shutdown.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed on drop.
pub struct Killed(
    /// The child.
    pub Child,
);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A supervisor (`cx devnet`) stopped on drop as a person stops it, with SIGINT, so that it
/// stops its own children too (SIGKILL would leave them running); SIGKILL after 30 s.
pub struct Interrupted(
    /// The supervisor.
    pub Child,
);

impl Drop for Interrupted {
    fn drop(&mut self) {
        // Quietly: it may have exited already.
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let waited = std::time::Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) && waited.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for `check` to give something, looking every quarter second; fails the
/// test naming `what` otherwise.
pub async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let waited = Instant::now();
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(waited.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `program args…` with `stdin` to completion, its output captured, without the `cx agent`
/// variables of the caller's environment (`CX_AGENT_KEYS`, `CX_EXCHANGE`, …) so that a test
/// says everything it uses.
pub fn run(program: &Path, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .env_remove("CX_AGENT_KEYS")
        .env_remove("CX_EXCHANGE")
        .env_remove("CX_CA")
        .env_remove("CX_CHAIN")
        .env_remove("CX_RPC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the program runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// `cx args…` on a blocking thread; its last stdout line as JSON.
pub async fn cx_json(args: Vec<String>, stdin: String) -> Value {
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&cx_binary(), &args, &stdin)
    })
    .await
    .unwrap();
    last_json(&out)
}

/// The last stdout line of a `cx … --json` run that succeeded, as JSON (`--json` prints its
/// object last); panics with its stderr when it failed.
pub fn last_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "cx failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().expect("some output")).expect("last line is JSON")
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {pid}");
}
