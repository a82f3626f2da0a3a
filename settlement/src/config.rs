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

/// The committee's signing rule as each signer's operator pins it: any `threshold` (t) members
/// sign, and every signing set spans at least `min_operators` distinct operators.
///
/// Why it is the signer's own: a DKG request names t and the participants, and a rotation names
/// a key; if a signer took either from the coordinator, a hostile coordinator could run a DKG at
/// 2-of-n, or among members it controls, and rotate the chains to that key with a signature of
/// the honest current key. With the rule pinned here, a signer refuses a DKG whose threshold or
/// participants differ from its config, a rotation to a key whose threshold or shareholders
/// differ, and a signing set that does not meet the diversity rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitteeRule {
    /// t: signatures need this many members (and a DKG is at exactly this threshold).
    pub threshold: u16,
    /// k: distinct operators a signing set must span (SPEC §7's diversity rule).
    pub min_operators: usize,
}

/// Bounds on what peers may cost a signer (all have defaults; see each field).
///
/// A signer listens on the open network: before a handshake a connection is anyone's, and the
/// handshake itself (ML-KEM-768 + X25519, an ML-DSA-65 signature and verification) costs
/// milliseconds of CPU. So connections are counted and handshakes rate-limited before any
/// cryptography runs; after it, each authenticated peer has its own share; DKG messages are
/// accepted only for a few epochs ahead of the newest key, a bounded number per peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeerLimits {
    /// Connections open at once, authenticated or not; more are closed on accept.
    pub max_connections: usize,
    /// Sessions one authenticated peer may hold at once.
    pub max_sessions_per_peer: usize,
    /// Handshakes started per second (fixed one-second windows); more are closed on accept.
    pub max_handshakes_per_s: u32,
    /// How far past the newest key's epoch a DKG may be (a DKG or peer message for epoch
    /// `u32::MAX` must not end all future DKGs, nor open unbounded inboxes).
    pub max_epoch_gap: u32,
    /// DKG messages one peer may send per epoch (an honest one sends three: round 1, the echo,
    /// round 2).
    pub max_peer_messages_per_epoch: u32,
}

impl Default for PeerLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_sessions_per_peer: 16,
            max_handshakes_per_s: 32,
            max_epoch_gap: 16,
            max_peer_messages_per_epoch: 3,
        }
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
    /// Every member, this signer included: the participants of every DKG, exactly.
    pub committee: Vec<Member>,
    /// The market whose jobs it pays: the exchange key that signs assignments, and the fee.
    pub market: MarketTerms,
    /// The signing rule of the committee (see [`CommitteeRule`]).
    pub rule: CommitteeRule,
    /// Bounds on connections, handshakes and DKG messages (defaults when absent).
    #[serde(default)]
    pub limits: PeerLimits,
    /// The chain registry with deployed addresses (`cx-signer devnet deploy` writes it); read
    /// when a request names a chain, so signers can start before contracts are deployed.
    pub deployments_file: PathBuf,
}

/// The market a committee settles for, pinned in each signer's config: a receipt is paid only
/// with an assignment under `exchange_key`, and credits are computed with `fee`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketTerms {
    /// The exchange's ML-DSA-65 verification key (hex).
    #[serde(with = "hex_bytes")]
    pub exchange_key: Vec<u8>,
    /// The exchange's fee.
    pub fee: crate::ledger::Fee,
    /// What a slash takes and who receives it (default: 10x the job's price, burnt).
    #[serde(default)]
    pub slash: crate::slash::SlashPolicy,
}

impl MarketTerms {
    /// The exchange's key, parsed.
    pub fn exchange(&self) -> Result<cx_protocol::pq::PublicIdentity> {
        Ok(cx_protocol::pq::PublicIdentity::from_bytes(
            &self.exchange_key,
        )?)
    }
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
        config.market.exchange()?;
        config
            .market
            .slash
            .validate()
            .map_err(|reason| Error::SlashTerms {
                path: path.to_path_buf(),
                reason,
            })?;
        config.check()?;
        Ok(config)
    }

    /// Refuses a configuration whose committee has duplicate indices or whose rule no signing
    /// set could meet (the same check the coordinator makes).
    pub fn check(&self) -> Result<()> {
        let indices: std::collections::BTreeSet<u16> =
            self.committee.iter().map(|m| m.index).collect();
        if indices.len() != self.committee.len() {
            return Err(Error::DuplicateMember);
        }
        crate::coordinator::check_rule(
            &self.committee,
            self.rule.threshold,
            self.rule.min_operators,
        )
    }

    /// The pinned committee's indices, ascending.
    pub fn member_indices(&self) -> Vec<u16> {
        let mut indices: Vec<u16> = self.committee.iter().map(|m| m.index).collect();
        indices.sort_unstable();
        indices
    }

    /// Why a set of signers (by index) may not sign under the pinned rule, or `None` when it
    /// may: fewer than t, someone outside the committee, or fewer than k operators.
    pub fn signing_set_gap(&self, signers: &[u16]) -> Option<String> {
        let mut operators = std::collections::BTreeSet::new();
        for index in signers {
            match self.committee.iter().find(|m| m.index == *index) {
                Some(m) => operators.insert(m.operator.as_str()),
                None => return Some(format!("signer {index} is not in this signer's committee")),
            };
        }
        if signers.len() < self.rule.threshold as usize {
            return Some(format!(
                "{} signers is fewer than the committee's threshold {}",
                signers.len(),
                self.rule.threshold
            ));
        }
        if operators.len() < self.rule.min_operators {
            return Some(format!(
                "the signing set spans {} operators; the committee's rule asks for {}",
                operators.len(),
                self.rule.min_operators
            ));
        }
        None
    }

    /// This signer's own committee entry.
    pub fn me(&self) -> Result<&Member> {
        self.committee
            .iter()
            .find(|m| m.index == self.index)
            .ok_or(Error::NotInCommittee { index: self.index })
    }
}
