//! Messages on the committee's sessions (JSON inside sealed frames, see [`crate::transport`]).
//!
//! Coordinator → signer: [`Request`], answered by one [`Response`]. Signer → signer (during a
//! DKG): [`Request::Peer`], answered by [`Response::Ack`]. FROST values travel in the
//! `frost-secp256k1` crate's own serde form, which checks points and scalars on the way in.

use alloy::primitives::B256;
use frost_secp256k1 as frost;
use serde::{Deserialize, Serialize};

use crate::ledger::ChainBatch;

/// What a signer is asked.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Liveness and latency probe.
    Ping,
    /// Who are you (index, operator, region, keys held).
    Info,
    /// Run a DKG with the other signers for key `epoch`.
    Dkg(DkgRequest),
    /// Round 1 of FROST signing: commit to fresh nonces under the key `group_key`.
    Commit(CommitRequest),
    /// Check vouchers as the coordinator takes them in, ahead of the batch that will hold them
    /// ([`crate::checked`]): answered [`Response::Ack`] when every one passed, else refused
    /// with the reasons. Nothing is signed.
    CheckVouchers(CheckVouchersRequest),
    /// Round 2: check the batch and sign it.
    SignBatch(SignBatchRequest),
    /// Round 2 for a key rotation: check the new key and sign the rotation message.
    SignRotation(SignRotationRequest),
    /// Round 2 for a slash: check the evidence and sign `ProviderRegistry.slashDigest`.
    SignSlash(Box<SignSlashRequest>),
    /// A DKG message from another signer.
    Peer(PeerMessage),
}

/// A signer's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Ping`].
    Pong,
    /// Answer to [`Request::Info`].
    Info(SignerInfo),
    /// The DKG finished: this signer's view of the group's public keys.
    DkgDone(DkgDone),
    /// Round-1 commitments.
    Committed(Committed),
    /// Round-2 signature share.
    Share(Share),
    /// Receipt of a peer message.
    Ack,
    /// The request was refused; nothing was signed.
    Refused {
        /// Why.
        reason: String,
    },
}

/// A signer's public facts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SignerInfo {
    /// FROST identifier (1-based index).
    pub index: u16,
    /// Who operates it (the diversity rule counts distinct operators).
    pub operator: String,
    /// Where it runs.
    pub region: String,
    /// Epochs of the key packages it holds.
    pub epochs: Vec<u32>,
}

/// Start a DKG.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DkgRequest {
    /// Key epoch being generated.
    pub epoch: u32,
    /// Threshold t.
    pub min_signers: u16,
    /// Every participant's index (n of them, this signer included).
    pub participants: Vec<u16>,
}

/// Result of a DKG at one signer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DkgDone {
    /// Key epoch.
    pub epoch: u32,
    /// The group's public key package (verifying shares and group key).
    pub public_key_package: frost::keys::PublicKeyPackage,
}

/// Round 1 of signing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitRequest {
    /// Names the nonces this commitment is for; the sign request must repeat it.
    pub round_id: B256,
    /// The group key to sign under (SEC1 compressed).
    pub group_key: frost::VerifyingKey,
}

/// Round-1 answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Committed {
    /// Echo of the round id.
    pub round_id: B256,
    /// Commitments to the fresh nonces.
    pub commitments: frost::round1::SigningCommitments,
}

/// Vouchers to check ahead of signing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckVouchersRequest {
    /// At most [`crate::ledger::MAX_RECEIPTS_PER_BATCH`] (one part's worth: the frame's bound).
    pub vouchers: Vec<cx_protocol::voucher::Voucher>,
}

/// Round 2 for a batch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SignBatchRequest {
    /// The round whose nonces to use (they are consumed whatever the outcome).
    pub round_id: B256,
    /// The batch, with everything needed to recompute it — except, when `previous_root` is set,
    /// the two balance lists (left empty: the signer holds its own copy).
    pub batch: ChainBatch,
    /// The balances root the batch builds on, when the batch travels without its balance lists
    /// (the usual case: the request then grows with the receipts, not with history). A signer
    /// that does not hold that list answers [`crate::signer::UNKNOWN_BALANCES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_root: Option<B256>,
    /// The receipts' voucher ids ([`crate::checked::voucher_id`]), in order, when the batch
    /// travels without them (`batch.receipts` empty): the signer takes each from the vouchers it
    /// checked ahead, and answers [`crate::checked::UNKNOWN_VOUCHERS`] for one it does not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_receipts: Option<Vec<B256>>,
    /// Commitments of every signer of the round and the message (the batch digest).
    pub signing_package: frost::SigningPackage,
}

/// What a [`SignBatchRequest`] carries of one part, the same in every round that signs it.
#[derive(Clone, Debug)]
pub struct PartToSign {
    batch: ChainBatch,
    previous_root: Option<B256>,
    held_receipts: Option<Vec<B256>>,
}

impl PartToSign {
    /// `batch` as the coordinator sends it first: without the balance lists (their root
    /// instead) and without the vouchers (their ids instead), which every signer holds when it
    /// signed the previous part and checked the vouchers as they were taken in.
    pub fn named(batch: &ChainBatch) -> crate::error::Result<Self> {
        Self::whole(batch).vouchers_by_id().lists_by_root()
    }

    /// `batch` with everything: for a signer that lacks what [`PartToSign::named`] names.
    pub fn whole(batch: &ChainBatch) -> Self {
        Self {
            batch: batch.clone(),
            previous_root: None,
            held_receipts: None,
        }
    }

    /// The vouchers named by their ids ([`crate::checked::voucher_id`]) instead of carried.
    pub fn vouchers_by_id(mut self) -> Self {
        let receipts = std::mem::take(&mut self.batch.receipts);
        self.held_receipts = Some(receipts.iter().map(crate::checked::voucher_id).collect());
        self
    }

    /// The balance lists named by the previous list's root instead of carried.
    pub fn lists_by_root(mut self) -> crate::error::Result<Self> {
        self.previous_root = Some(crate::ledger::balances_root(&self.batch.previous_balances)?);
        self.batch.previous_balances = Vec::new();
        self.batch.new_balances = Vec::new();
        Ok(self)
    }

    /// The round-2 request of round `round_id`, with its commitments and message.
    pub fn request(&self, round_id: B256, signing_package: frost::SigningPackage) -> Request {
        Request::SignBatch(SignBatchRequest {
            round_id,
            batch: self.batch.clone(),
            previous_root: self.previous_root,
            held_receipts: self.held_receipts.clone(),
            signing_package,
        })
    }
}

/// Round 2 for a key rotation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SignRotationRequest {
    /// The round whose nonces to use.
    pub round_id: B256,
    /// Chain whose `Settlement` contract rotates.
    pub chain_id: u64,
    /// Epoch of the new key (the signer must hold a key package of it from its own DKG).
    pub new_epoch: u32,
    /// Commitments and the message (`Settlement.rotationDigest`).
    pub signing_package: frost::SigningPackage,
}

/// Round 2 for a slash.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SignSlashRequest {
    /// The round whose nonces to use.
    pub round_id: B256,
    /// Chain whose `ProviderRegistry` slashes.
    pub chain_id: u64,
    /// What the provider did (every signer checks it on its own).
    pub evidence: crate::slash::SlashEvidence,
    /// Stake to take (wei of the asset).
    pub amount: alloy::primitives::U256,
    /// Who receives it.
    pub recipient: alloy::primitives::Address,
    /// Chain time after which the signature is void.
    pub expires_at_s: u64,
    /// Commitments and the message (`ProviderRegistry.slashDigest`).
    pub signing_package: frost::SigningPackage,
}

/// Round-2 answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Share {
    /// Echo of the round id.
    pub round_id: B256,
    /// The signature share.
    pub share: frost::round2::SignatureShare,
}

/// A DKG message between signers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerMessage {
    /// Key epoch of the DKG.
    pub epoch: u32,
    /// Sender's index (must be the session's authenticated identity).
    pub from: u16,
    /// The content.
    pub body: PeerBody,
}

/// Content of a DKG message.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerBody {
    /// Round-1 package (sent identically to every peer: a broadcast).
    Round1(frost::keys::dkg::round1::Package),
    /// SHA-256 of every round-1 package the sender received, to check the broadcast was one.
    Echo(B256),
    /// Round-2 package for the receiver alone (the session encrypts it).
    Round2(frost::keys::dkg::round2::Package),
}
