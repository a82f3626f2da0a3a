//! What the `cx` binary's test files share: a `cx serve` child and the lines it prints.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `cx serve` child, killed on drop if the test did not stop it.
pub struct Serve {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Serve {
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_cx"))
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
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch directory, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "cx-cli-test-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The secp256k1 generator as a group key: the contract only needs a point; no batch is signed.
pub fn group_key() -> cx_settlement::frost::EvmGroupKey {
    cx_settlement::frost::EvmGroupKey {
        x: "0x79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
            .parse::<alloy::primitives::U256>()
            .unwrap(),
        parity: 0,
    }
}

/// Owned arguments.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// A path as an argument.
pub fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}
