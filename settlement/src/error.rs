//! The crate's one error type.
//!
//! Variants are typed by what went wrong so callers can match on them (the coordinator tells
//! "waiting for signers" from "refused"); the three that carry free text ([`Error::Transport`],
//! [`Error::Dkg`], [`Error::InvalidBatch`]) report a protocol or batch check whose reason *is* the
//! explanation (which frame, which peer, which receipt), written for the operator's log.

use std::path::PathBuf;

use alloy::primitives::{Address, B256};

/// Everything that can go wrong in settlement.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- FROST and encodings ------------------------------------------------------------------
    /// A FROST operation (key generation, signing, aggregation) failed.
    #[error("FROST: {0}")]
    Frost(#[from] frost_secp256k1::Error),
    /// A verifying key is not a 33-byte compressed secp256k1 point.
    #[error("verifying key is not a compressed point: {len} bytes")]
    KeyEncoding {
        /// Its length.
        len: usize,
    },
    /// A FROST signature does not have the 65 bytes (compressed R ‖ z) the contracts take.
    #[error("signature has {len} bytes, expected 65")]
    SignatureLength {
        /// Its length.
        len: usize,
    },
    /// A signature's commitment R is not a usable curve point.
    #[error("the signature's R {reason}")]
    InvalidCommitment {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A dealer committee was asked to sign with a participant it dealt no share to.
    #[error("unknown signer {identifier}")]
    UnknownSigner {
        /// The participant's FROST identifier (hex).
        identifier: String,
    },

    // ---- Merkle trees -------------------------------------------------------------------------
    /// A Merkle tree needs at least one leaf.
    #[error("merkle: a tree needs at least one leaf")]
    EmptyTree,
    /// A proof was asked for a leaf the tree does not have.
    #[error("merkle: leaf {index} out of {len}")]
    LeafOutOfRange {
        /// The leaf asked for.
        index: usize,
        /// Leaves in the tree.
        len: usize,
    },
    /// A balances tree names a party twice.
    #[error("merkle: party {party} appears twice")]
    DuplicateParty {
        /// The party.
        party: Address,
    },
    /// A proof was asked for a party the balances tree does not hold.
    #[error("merkle: party {party} not in tree")]
    PartyNotInTree {
        /// The party.
        party: Address,
    },

    // ---- the chain ----------------------------------------------------------------------------
    /// A contract refused a call; `name` is the decoded custom error when it is one of ours.
    #[error("contract reverted with {name}{detail}")]
    Reverted {
        /// Custom error name (e.g. `InvalidSignature`), or `unknown` when it could not be decoded.
        name: String,
        /// The decoded arguments, for the message.
        detail: String,
    },
    /// A mined transaction failed (status 0) without revert data to decode.
    #[error("transaction {tx_hash} failed on chain")]
    TxFailed {
        /// The transaction.
        tx_hash: B256,
    },
    /// The JSON-RPC endpoint failed or answered something unexpected.
    #[error("rpc: {0} (is the chain's RPC endpoint up?)")]
    Rpc(#[from] alloy::transports::TransportError),
    /// A contract call failed for a reason other than a revert (encoding, transport).
    #[error("contract call: {0}")]
    Contract(alloy::contract::Error),
    /// A deployment could not be made, or what is on chain is not what was deployed.
    #[error("deployment: {0}")]
    Deployment(String),
    /// A transaction was not sent because the chain's fee policy refuses it (its gas).
    #[error("gas policy: {0}")]
    GasPolicy(String),
    /// A transaction was sent and is not mined (or could not be sent at its nonce).
    #[error("transaction at nonce {nonce} pending{}: {reason}", .tx_hash.map(|h| format!(" ({h})")).unwrap_or_default())]
    TxPending {
        /// The account nonce it holds.
        nonce: u64,
        /// The last offer sent, if any.
        tx_hash: Option<B256>,
        /// Why the send stopped waiting.
        reason: String,
    },
    /// A sent transaction could not be followed to its receipt.
    #[error("waiting for a transaction: {0}")]
    PendingTx(#[from] alloy::providers::PendingTransactionError),
    /// An RPC URL does not parse.
    #[error("bad RPC URL {url}: {reason}")]
    RpcUrl {
        /// The URL as given.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// A receipt lacks the event its call always emits (wrong contract at that address?).
    #[error("receipt of {tx_hash} has no {event} event (is the deployment file current?)")]
    MissingEvent {
        /// The transaction.
        tx_hash: B256,
        /// The event expected.
        event: &'static str,
    },
    /// A chain id is not in the coordinator's or signer's registry.
    #[error("chain {chain_id} is not in the registry")]
    UnknownChain {
        /// The chain.
        chain_id: u64,
    },
    /// A chain's group key is none of the keys the committee recorded.
    #[error("chain {chain_id}'s group key is not one of the committee's keys")]
    ForeignGroupKey {
        /// The chain.
        chain_id: u64,
    },
    /// A chain's balances root is not the last recorded batch's.
    #[error(
        "chain {chain_id}'s balances root {root} is not the last batch's: another coordinator \
         posted to this contract"
    )]
    ForeignBalancesRoot {
        /// The chain.
        chain_id: u64,
        /// The root found on chain.
        root: B256,
    },
    /// A chain accepted some other batch at the nonce of one of ours.
    #[error("chain {chain_id} accepted another batch at nonce {nonce}")]
    NonceTakenOnChain {
        /// The chain.
        chain_id: u64,
        /// The nonce.
        nonce: u64,
    },

    // ---- files --------------------------------------------------------------------------------
    /// A file or folder could not be read, written or created.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A JSON file did not parse.
    #[error("{path} is not valid JSON of its kind: {source}")]
    JsonFile {
        /// The file.
        path: PathBuf,
        /// Where and why.
        source: serde_json::Error,
    },
    /// A value did not (de)serialise as JSON (a frame, a stored batch body).
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A secret key file is unusable (wrong permissions, wrong content).
    #[error("key file {path}: {reason}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The registry or deployments file could not be read.
    #[error("{0}")]
    Deployments(#[from] cx_contracts::Error),

    // ---- sessions and the committee -----------------------------------------------------------
    /// A socket could not be opened or accepted on.
    #[error("socket {address}: {source} (is the port in use?)")]
    Socket {
        /// The address.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// A post-quantum session or a signed value was refused (wrong identity, replayed, reordered
    /// or altered frame, bad signature).
    #[error("{0}")]
    Protocol(#[from] cx_protocol::Error),
    /// The framed transport failed: connection, timeout, oversized or malformed frame.
    #[error("transport: {0}")]
    Transport(String),
    /// Signers refused to commit or sign, and the signers left cannot form a set without them.
    /// Each refusal is kept apart with its signer: one signer's word is one vote, and a caller
    /// acts on a reason only when enough signers give it (see [`Refusal`]).
    #[error("{}", refusals_text(refusals))]
    Refused {
        /// Every refusal of the signing, one per refusing signer, by index.
        refusals: Vec<Refusal>,
    },
    /// The distributed key generation failed.
    #[error("DKG: {0}")]
    Dkg(String),
    /// A diversity rule no signing set of this committee could ever meet.
    #[error(
        "committee: the diversity rule cannot be met: it asks for {min_operators} distinct \
         operators in a set of {threshold} signers, and the committee has {} operator(s) ({}); \
         lower the rule or add signers run by other operators",
        operators.len(),
        operators.join(", ")
    )]
    ImpossibleRule {
        /// Distinct operators asked for.
        min_operators: usize,
        /// Signers per set.
        threshold: u16,
        /// The committee's operators.
        operators: Vec<String>,
    },
    /// A threshold of zero or above the committee's size.
    #[error("committee: threshold {threshold} is impossible with {members} members")]
    ImpossibleThreshold {
        /// Threshold asked for.
        threshold: u16,
        /// Members.
        members: usize,
    },
    /// Too few signers (or operators) answer to form a signing set now; retry later.
    #[error(
        "committee: waiting for signers: {reachable} of {members} reachable ({operators} \
         operator(s)), a signing set needs {threshold} signers from at least {min_operators} \
         operators"
    )]
    WaitingForSigners {
        /// Members that answered.
        reachable: usize,
        /// Members.
        members: usize,
        /// Distinct operators among those that answered.
        operators: usize,
        /// Signers per set.
        threshold: u16,
        /// Distinct operators per set.
        min_operators: usize,
    },
    /// Chosen signers kept dropping out of signing rounds.
    #[error("committee: signers kept dropping out of signing rounds: {last_gap}")]
    SignersDropping {
        /// Who dropped out of the last round, and why.
        last_gap: String,
    },
    /// No DKG of this key epoch was recorded.
    #[error("committee: no DKG of epoch {epoch} recorded")]
    UnknownEpoch {
        /// The epoch.
        epoch: u32,
    },

    // ---- the coordinator's store --------------------------------------------------------------
    /// The coordinator's PostgreSQL store failed.
    #[error("database: {0} (is PostgreSQL running at DATABASE_URL, and migrated?)")]
    Database(#[from] sqlx::Error),
    /// A stored batch status is not one this version knows.
    #[error("unknown batch status {status}")]
    UnknownStatus {
        /// The stored text.
        status: String,
    },
    /// A batch has no part for a chain.
    #[error("no part of batch {batch_id} for chain {chain_id}")]
    MissingPart {
        /// The batch.
        batch_id: i64,
        /// The chain.
        chain_id: u64,
    },
    /// A part already on chain cannot be replaced.
    #[error("part of batch {batch_id} for chain {chain_id} is on chain already; it stays")]
    PostedAlready {
        /// The batch.
        batch_id: i64,
        /// The chain.
        chain_id: u64,
    },
    /// A chain already has a recorded batch at this nonce.
    #[error("chain {chain_id} already has a batch at nonce {nonce}")]
    NonceInUse {
        /// The chain.
        chain_id: u64,
        /// The nonce.
        nonce: u64,
    },
    /// A batch with a signed part can only be posted, not abandoned.
    #[error("batch {batch_id} has a signed part: it can only be posted, not abandoned")]
    SignedAlready {
        /// The batch.
        batch_id: i64,
    },
    /// An earlier batch is not on every chain yet (nonces must land in order).
    #[error("batch {batch_id} is not on every chain yet; resume it first")]
    Unfinished {
        /// The batch.
        batch_id: i64,
    },
    /// A part marked signed carries no signature.
    #[error("part of batch {batch_id} for chain {chain_id} is signed but has no signature")]
    MissingSignature {
        /// The batch.
        batch_id: i64,
        /// The chain.
        chain_id: u64,
    },
    /// A number does not fit the database's signed 64-bit column.
    #[error("{what} {value} exceeds i64")]
    OutOfRange {
        /// What it is.
        what: &'static str,
        /// The value.
        value: u64,
    },
    /// No batch was recorded for a chain yet.
    #[error("no batch on chain {chain_id} yet")]
    NoBatchYet {
        /// The chain.
        chain_id: u64,
    },
    /// A batch is inconsistent (wrong chain, duplicate job, overclaim, mismatched buyer).
    #[error("batch refused: {0}")]
    InvalidBatch(String),

    // ---- configuration ------------------------------------------------------------------------
    /// A signer's index is not in its committee list.
    #[error("index {index} is not in the committee list; add this signer's entry")]
    NotInCommittee {
        /// The index.
        index: u16,
    },
    /// The market's slash terms cannot be signed under.
    #[error("{path}: market.slash: {reason}; fix the slash terms")]
    SlashTerms {
        /// The config file.
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Two committee entries share one index.
    #[error("the committee list has two entries with one index; give each member its own")]
    DuplicateMember,
    /// A signer's committee entry pins another key than the signer's identity file holds.
    #[error("the committee entry of signer {index} does not carry this signer's key {key}")]
    KeyMismatch {
        /// The signer.
        index: u16,
        /// The key id its identity file holds.
        key: String,
    },
    /// A member's listen address is not `host:port`.
    #[error("bad signer address {address}: {reason}")]
    BadAddress {
        /// The address.
        address: String,
        /// The parser's complaint.
        reason: String,
    },
}

/// One signer's refusal to commit or sign, as it gave it.
///
/// A reason is the refusing signer's own text: a faulty or hostile signer may say anything in
/// it, so nothing should be done on one refusal alone that the committee's threshold would not
/// also do (the exchange drops a job only when t signers name it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The refusing signer's FROST identifier (1-based index).
    pub signer: u16,
    /// Its reason.
    pub reason: String,
}

fn refusals_text(refusals: &[Refusal]) -> String {
    refusals
        .iter()
        .map(|r| format!("signer {} refused: {}", r.signer, r.reason))
        .collect::<Vec<_>>()
        .join(" | ")
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// Decodes a contract error into our custom error name when it is one of ours.
impl From<alloy::contract::Error> for Error {
    fn from(e: alloy::contract::Error) -> Self {
        use cx_contracts::{ProviderRegistry, Settlement};
        fn name_of(debug: String) -> Error {
            let name = debug
                .split(['(', ' ', '{'])
                .next()
                .unwrap_or("unknown")
                .to_string();
            Error::Reverted {
                name,
                detail: format!(": {debug}"),
            }
        }
        if let Some(decoded) = e.as_decoded_interface_error::<Settlement::SettlementErrors>() {
            return name_of(format!("{decoded:?}"));
        }
        if let Some(decoded) =
            e.as_decoded_interface_error::<ProviderRegistry::ProviderRegistryErrors>()
        {
            return name_of(format!("{decoded:?}"));
        }
        if let Some(data) = e.as_revert_data() {
            return Error::Reverted {
                name: "unknown".into(),
                detail: format!(": revert data {data}"),
            };
        }
        Error::Contract(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
