//! Configuration of signers (JSON files). The chain registry with addresses both signers and
//! the coordinator read is cx-contracts' [`cx_contracts::DeploymentsFile`].
//!
//! Public keys are pinned in configuration: a signer knows the coordinator's and every other
//! signer's ML-DSA verification key before any session, so nothing is trusted on first use.

use std::path::{Path, PathBuf};

use cx_protocol::pq::PublicIdentity;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Byte strings as hex in JSON.
pub mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Serializes as lowercase hex.
    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    /// Parses hex, with or without `0x`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text.strip_prefix("0x").unwrap_or(&text)).map_err(D::Error::custom)
    }
}

/// One member of the signer committee, as everybody else knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// FROST identifier (1..=n).
    pub index: u16,
    /// `host:port` the signer listens on.
    pub address: String,
    /// Its ML-DSA-65 verification key.
    #[serde(with = "hex_bytes")]
    pub verification_key: Vec<u8>,
    /// Operator running it (the diversity rule counts distinct ones).
    pub operator: String,
    /// Region it runs in.
    pub region: String,
}

impl Member {
    /// Its public identity.
    pub fn public(&self) -> Result<PublicIdentity> {
        Ok(PublicIdentity::from_bytes(&self.verification_key)?)
    }
}

/// A signer's configuration (`cx-signer run --config …`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SignerConfig {
    /// This signer's FROST identifier; its entry in `committee` gives address, operator, region.
    pub index: u16,
    /// Its ML-DSA identity seed file (0600; created on first start if missing).
    pub identity_file: PathBuf,
    /// Where key packages and the signer's own record of settled jobs live.
    pub data_dir: PathBuf,
    /// The coordinator's ML-DSA verification key.
    #[serde(with = "hex_bytes")]
    pub coordinator_key: Vec<u8>,
    /// Every member, this signer included.
    pub committee: Vec<Member>,
    /// The chain registry with deployed addresses (`cx-signer devnet deploy` writes it); read
    /// when a request names a chain, so signers can start before contracts are deployed.
    pub deployments_file: PathBuf,
}

impl SignerConfig {
    /// Reads a configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
        let config: Self = serde_json::from_str(&text).map_err(|source| Error::JsonFile {
            path: path.to_path_buf(),
            source,
        })?;
        config.me()?;
        Ok(config)
    }

    /// This signer's own committee entry.
    pub fn me(&self) -> Result<&Member> {
        self.committee
            .iter()
            .find(|m| m.index == self.index)
            .ok_or(Error::NotInCommittee { index: self.index })
    }
}
