//! A committee of `cx-signer run` processes on loopback, for the bench, the devnet and the tests:
//! fresh identities (key files 0600), one config per signer, free ports, children supervised
//! (killed on drop, logs kept beside the configs).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cx_protocol::pq::Identity;
use cx_settlement::config::{CommitteeRule, MarketTerms, Member, SignerConfig};
use cx_settlement::coordinator::Committee;
use cx_settlement::keyfile;

use crate::error::{Error, Result};
use crate::supervise::{ScratchDir, Supervised, free_port};

/// The `cx-signer` binary to start.
///
/// `CX_SIGNER_BIN` when set. Otherwise, under Cargo (tests, `cargo run -p cx-devnet`), it is
/// built with `cargo build -p cx-settlement --bin cx-signer` (same profile, same target dir)
/// and the path Cargo reports is used: `CARGO_BIN_EXE_*` only exists for binaries of the test's
/// own package, and a path guessed under `target/` could be a stale binary from before the
/// last edit; asking Cargo costs a no-op build when it is current and is never stale. Outside
/// Cargo (a copied `cx-devnet` binary), the `cx-signer` beside the running executable.
pub fn signer_binary() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    if let Some(path) = std::env::var_os("CX_SIGNER_BIN") {
        return Ok(PathBuf::from(path));
    }
    if let Some(cargo) = std::env::var_os("CARGO") {
        return BUILT
            .get_or_init(|| build_signer(Path::new(&cargo)))
            .clone()
            .map_err(Error::BuildSigner);
    }
    let exe = std::env::current_exe().map_err(Error::io("the running executable"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    // Test binaries live one level down, in target/<profile>/deps/.
    for candidate in [dir.join("cx-signer"), dir.join("../cx-signer")] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(Error::BuildSigner(format!(
        "no cx-signer beside {} and not run by Cargo; set CX_SIGNER_BIN",
        exe.display()
    )))
}

fn build_signer(cargo: &Path) -> std::result::Result<PathBuf, String> {
    let mut command = Command::new(cargo);
    command
        .current_dir(crate::workspace_root())
        .args(["build", "-q", "-p", "cx-settlement", "--bin", "cx-signer"])
        .arg("--message-format=json");
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let output = command
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    if !output.status.success() {
        // With --message-format=json the compiler's own words go to stdout, and stderr only
        // says "could not compile": keep the rendered errors, or a failure (a full disk, say)
        // cannot be told from a broken build.
        let rendered: String = messages
            .iter()
            .filter(|m| m["reason"] == "compiler-message" && m["message"]["level"] == "error")
            .filter_map(|m| m["message"]["rendered"].as_str())
            .collect();
        return Err(format!(
            "{}{rendered}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    messages
        .iter()
        .filter(|m| m["target"]["name"] == "cx-signer")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo reported no cx-signer executable".to_string())
}

/// Where a cluster lives: by default a scratch folder (removed on drop) and free ports.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// A folder for configs, keys, data and logs, kept after the signers stop.
    pub dir: Option<PathBuf>,
    /// Signer i (from 0) listens on `first_port + i` on 127.0.0.1 (the devnet's 9101..).
    pub first_port: Option<u16>,
}

/// n signer processes and the coordinator identity they trust.
pub struct Cluster {
    binary: PathBuf,
    dir: ScratchDir,
    /// The coordinator's identity (pinned in every signer's config).
    pub coordinator: Arc<Identity>,
    /// The exchange's identity: every signer pins its key, and pays only jobs it assigned.
    pub exchange: Arc<Identity>,
    /// The exchange's fee every signer computes credits with.
    pub fee: cx_settlement::ledger::Fee,
    /// Every member as the others know it.
    pub members: Vec<Member>,
    children: Vec<Option<Supervised>>,
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
    /// from `binary`, each with `rule` pinned in its config, and waits until each accepts
    /// connections.
    pub fn start(binary: &Path, operators: &[&str], rule: CommitteeRule) -> Result<Self> {
        Self::start_with(
            binary,
            operators,
            rule,
            Arc::new(Identity::generate()),
            Default::default(),
        )
    }

    /// [`Cluster::start`] for the market of `exchange` (the key every signer pins) with `fee`.
    pub fn start_with(
        binary: &Path,
        operators: &[&str],
        rule: CommitteeRule,
        exchange: Arc<Identity>,
        fee: cx_settlement::ledger::Fee,
    ) -> Result<Self> {
        Self::start_in(
            binary,
            &Placement::default(),
            operators,
            rule,
            exchange,
            fee,
        )
    }

    /// [`Cluster::start_with`] where `placement` says: its folder (kept) and its ports.
    ///
    /// Ports it picks itself ([`free_port`]) are free when picked and may be taken by another
    /// process before a signer binds them (every signer's address is in every config, so one
    /// cannot move alone): a signer that exits for a port in use starts the whole committee
    /// again on fresh ports, a few times.
    pub fn start_in(
        binary: &Path,
        placement: &Placement,
        operators: &[&str],
        rule: CommitteeRule,
        exchange: Arc<Identity>,
        fee: cx_settlement::ledger::Fee,
    ) -> Result<Self> {
        let mut tries = 1;
        loop {
            match Self::start_once(binary, placement, operators, rule, exchange.clone(), fee) {
                Err(Error::Exited { log, .. })
                    if placement.first_port.is_none()
                        && tries < 4
                        && log.contains("Address already in use") =>
                {
                    tries += 1;
                }
                started => return started,
            }
        }
    }

    fn start_once(
        binary: &Path,
        placement: &Placement,
        operators: &[&str],
        rule: CommitteeRule,
        exchange: Arc<Identity>,
        fee: cx_settlement::ledger::Fee,
    ) -> Result<Self> {
        let dir = match &placement.dir {
            Some(path) => ScratchDir::kept(path)?,
            None => ScratchDir::new("cx-committee")?,
        };
        let deployments_file = dir.path.join("deployments.json");
        let mut members = Vec::new();
        for (i, operator) in operators.iter().enumerate() {
            let index = i as u16 + 1;
            let identity = Identity::generate();
            keyfile::write_identity(&Self::identity_path(&dir.path, index), &identity)?;
            members.push(Member {
                index,
                address: format!(
                    "127.0.0.1:{}",
                    match placement.first_port {
                        Some(first) => first + i as u16,
                        None => free_port()?,
                    }
                ),
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
                market: MarketTerms {
                    exchange_key: exchange.public().to_bytes().to_vec(),
                    fee,
                    slash: Default::default(),
                },
                rule,
                limits: Default::default(),
                deployments_file: deployments_file.clone(),
            };
            let path = Self::config_path(&dir.path, m.index);
            let text = serde_json::to_string_pretty(&config).expect("plain data serialises");
            std::fs::write(&path, text).map_err(Error::io(&path))?;
        }
        let mut cluster = Self {
            binary: binary.to_path_buf(),
            children: (0..members.len()).map(|_| None).collect(),
            dir,
            coordinator,
            exchange,
            fee,
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

    /// The data folder of signer `index` (key packages, its own record).
    pub fn data_dir(&self, index: u16) -> PathBuf {
        self.dir.path.join(format!("signer-{index}"))
    }

    /// The config file of signer `index`.
    pub fn config_path(dir: &Path, index: u16) -> PathBuf {
        dir.join(format!("signer-{index}.json"))
    }

    fn log_path(&self, index: u16) -> PathBuf {
        self.dir.path.join(format!("signer-{index}.log"))
    }

    /// The folder holding configs, keys and logs.
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    fn spawn(&mut self, index: u16) -> Result<()> {
        let mut command = Command::new(&self.binary);
        command
            .arg("run")
            .arg("--config")
            .arg(Self::config_path(&self.dir.path, index));
        let child = Supervised::spawn(
            format!("signer {index}"),
            command,
            Some(&self.log_path(index)),
            " (build it: cargo build -p cx-settlement --bin cx-signer)",
        )?;
        self.children[index as usize - 1] = Some(child);
        Ok(())
    }

    fn wait_ready(&mut self, index: u16) -> Result<()> {
        let address = &self.members[index as usize - 1].address;
        let address: SocketAddr =
            address
                .parse()
                .map_err(|e| cx_settlement::Error::BadAddress {
                    address: address.clone(),
                    reason: format!("{e}"),
                })?;
        match self.children[index as usize - 1].as_mut() {
            Some(child) => child.wait_ready(
                address,
                Duration::from_secs(60),
                Duration::from_millis(20),
                || true,
            ),
            None => Ok(()),
        }
    }

    /// Kills signer `index` (SIGKILL: no chance to flush anything it did not already persist).
    pub fn kill(&mut self, index: u16) {
        if let Some(mut child) = self.children[index as usize - 1].take() {
            child.kill();
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
        Ok(Committee::new(
            self.coordinator.clone(),
            self.members.clone(),
            t,
            min_operators,
        )?)
    }

    /// Each running signer's supervised process (its pid, its resource use).
    pub fn processes(&self) -> impl Iterator<Item = &Supervised> {
        self.children.iter().flatten()
    }

    /// The log of signer `index` so far.
    pub fn log(&self, index: u16) -> String {
        std::fs::read_to_string(self.log_path(index)).unwrap_or_default()
    }
}
