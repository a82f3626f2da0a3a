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
    /// A secret key file is unusable (wrong permissions, wrong content).
    #[error("key file {path}: {reason}")]
    KeyFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A post-quantum session or a signed value was refused (wrong identity, replayed, reordered
    /// or altered frame, bad signature).
    #[error("{0}")]
    Protocol(#[from] cx_protocol::Error),
    /// The framed transport failed: connection, timeout, oversized or malformed frame.
    #[error("transport: {0}")]
    Transport(String),
    /// A signer refused to commit or sign, and said why.
    #[error("signer {signer} refused: {reason}")]
    Refused {
        /// The refusing signer's FROST identifier (1-based index).
        signer: u16,
        /// Its reason.
        reason: String,
    },
    /// The distributed key generation failed.
    #[error("DKG: {0}")]
    Dkg(String),
    /// No set of available signers satisfies the threshold and the diversity rule.
    #[error("committee: {0}")]
    Committee(String),
    /// The coordinator's PostgreSQL store failed.
    #[error("database: {0} (is PostgreSQL running at DATABASE_URL?)")]
    Database(#[from] sqlx::Error),
    /// The embedded migrations could not be applied.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A batch is inconsistent (wrong chain, duplicate job, overclaim, mismatched buyer).
    #[error("batch refused: {0}")]
    InvalidBatch(String),
    /// A configuration file is inconsistent.
    #[error("config: {0}")]
    Config(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
