//! The crate's one error type.

/// Everything that can go wrong in settlement.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A FROST operation (key generation, signing, aggregation) failed.
    #[error("FROST: {0}")]
    Frost(#[from] frost_secp256k1::Error),
    /// A key or signature could not be brought into the form the contracts take.
    #[error("encoding: {0}")]
    Encoding(String),
    /// A Merkle tree was asked for something it does not hold.
    #[error("merkle: {0}")]
    Merkle(String),
    /// A contract refused a call; `name` is the decoded custom error when it is one of ours.
    #[error("contract reverted with {name}{detail}")]
    Reverted {
        /// Custom error name (e.g. `InvalidSignature`), or `unknown` when it could not be decoded.
        name: String,
        /// The decoded arguments, for the message.
        detail: String,
    },
    /// The JSON-RPC endpoint failed or answered something unexpected.
    #[error("rpc: {0}")]
    Rpc(String),
    /// Starting or talking to the local devnet (Anvil) failed.
    #[error("devnet: {0} (run scripts/setup-foundry.sh to install Anvil into .tools/)")]
    Devnet(String),
    /// A file could not be read or written.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A JSON file did not parse.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
