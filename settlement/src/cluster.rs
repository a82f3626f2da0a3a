//! A committee of `cx-signer run` processes on loopback, for the bench, the devnet and the tests:
//! fresh identities (key files 0600), one config per signer, free ports, children killed on drop.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cx_protocol::pq::Identity;

use crate::config::{Member, SignerConfig};
use crate::coordinator::Committee;
use crate::devnet::free_port;
use crate::error::{Error, Result};
use crate::keyfile;

/// A folder removed on drop.
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
            hex::encode(&crate::dkg::random_bytes()[..6])
        ));
        std::fs::create_dir_all(&path)?;
        Ok(Self { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // CX_KEEP_SCRATCH=1 keeps configs and signer logs for a post-mortem.
        if std::env::var_os("CX_KEEP_SCRATCH").is_some() {
            eprintln!("kept {}", self.path.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// n signer processes and the coordinator identity they trust.
pub struct Cluster {
    binary: PathBuf,
    dir: ScratchDir,
    /// The coordinator's identity (pinned in every signer's config).
    pub coordinator: Arc<Identity>,
    /// Every member as the others know it.
    pub members: Vec<Member>,
    children: Vec<Option<Child>>,
    /// Where the signers read the chain registry and addresses (write it after deploying).
    pub deployments_file: PathBuf,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Cluster({} signers in {})",
            self.members.len(),
            self.dir.path.display()
        )
    }
}

impl Cluster {
    /// Starts one signer per entry of `operators` (its operator name; regions are `region-i`)
    /// from `binary` and waits until each accepts connections.
    pub fn start(binary: &Path, operators: &[&str]) -> Result<Self> {
        let dir = ScratchDir::new("cx-committee")?;
        let deployments_file = dir.path.join("deployments.json");
        let mut members = Vec::new();
        for (i, operator) in operators.iter().enumerate() {
            let index = i as u16 + 1;
            let identity = Identity::generate();
            keyfile::write_identity(&Self::identity_path(&dir.path, index), &identity)?;
            members.push(Member {
                index,
                address: format!("127.0.0.1:{}", free_port()?),
                verification_key: identity.public().to_bytes().to_vec(),
                operator: operator.to_string(),
                region: format!("region-{}", i % 3),
            });
        }
        let coordinator = Arc::new(Identity::generate());
        for m in &members {
            let config = SignerConfig {
                index: m.index,
                identity_file: Self::identity_path(&dir.path, m.index),
                data_dir: dir.path.join(format!("signer-{}", m.index)),
                coordinator_key: coordinator.public().to_bytes().to_vec(),
                committee: members.clone(),
                deployments_file: deployments_file.clone(),
            };
            std::fs::write(
                Self::config_path(&dir.path, m.index),
                serde_json::to_string_pretty(&config)?,
            )?;
        }
        let mut cluster = Self {
            binary: binary.to_path_buf(),
            children: (0..members.len()).map(|_| None).collect(),
            dir,
            coordinator,
            members,
            deployments_file,
        };
        for index in 1..=cluster.members.len() as u16 {
            cluster.spawn(index)?;
        }
        for index in 1..=cluster.members.len() as u16 {
            cluster.wait_ready(index)?;
        }
        Ok(cluster)
    }

    fn identity_path(dir: &Path, index: u16) -> PathBuf {
        dir.join(format!("signer-{index}.identity"))
    }

    /// The config file of signer `index`.
    pub fn config_path(dir: &Path, index: u16) -> PathBuf {
        dir.join(format!("signer-{index}.json"))
    }

    /// The folder holding configs, keys and logs.
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    fn spawn(&mut self, index: u16) -> Result<()> {
        let log = std::fs::File::create(self.dir.path.join(format!("signer-{index}.log")))?;
        let child = Command::new(&self.binary)
            .arg("run")
            .arg("--config")
            .arg(Self::config_path(&self.dir.path, index))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| Error::Config(format!("cannot start {}: {e}", self.binary.display())))?;
        self.children[index as usize - 1] = Some(child);
        Ok(())
    }

    fn wait_ready(&mut self, index: u16) -> Result<()> {
        // Readiness, not timing: poll until the port accepts; a generous bound turns a broken
        // start into an error instead of a hang.
        let address: SocketAddr = self.members[index as usize - 1]
            .address
            .parse()
            .map_err(|e| Error::Config(format!("bad address: {e}")))?;
        let start = Instant::now();
        loop {
            if let Some(child) = self.children[index as usize - 1].as_mut()
                && let Some(status) = child.try_wait()?
            {
                let log =
                    std::fs::read_to_string(self.dir.path.join(format!("signer-{index}.log")))
                        .unwrap_or_default();
                return Err(Error::Config(format!(
                    "signer {index} exited at start ({status}): {log}"
                )));
            }
            if TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(Error::Config(format!(
                    "signer {index} did not listen within 60 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills signer `index` (SIGKILL: no chance to flush anything it did not already persist).
    pub fn kill(&mut self, index: u16) {
        if let Some(mut child) = self.children[index as usize - 1].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts signer `index` again from its files and waits until it listens.
    pub fn restart(&mut self, index: u16) -> Result<()> {
        self.kill(index);
        self.spawn(index)?;
        self.wait_ready(index)
    }

    /// A committee client for the coordinator: threshold `t`, at least `min_operators` distinct
    /// operators per signing set.
    pub fn committee(&self, t: u16, min_operators: usize) -> Result<Committee> {
        Committee::new(
            self.coordinator.clone(),
            self.members.clone(),
            t,
            min_operators,
        )
    }

    /// The log of signer `index` so far.
    pub fn log(&self, index: u16) -> String {
        std::fs::read_to_string(self.dir.path.join(format!("signer-{index}.log")))
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for index in 1..=self.children.len() as u16 {
            self.kill(index);
        }
    }
}
