//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong starting, deploying to or supervising the devnet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Settlement (a contract call, the committee, the chain) failed.
    #[error("{0}")]
    Settlement(#[from] cx_settlement::Error),
    /// The registry or deployments file could not be read or written.
    #[error("{0}")]
    Contracts(#[from] cx_contracts::Error),
    /// A program could not be started.
    #[error("cannot start {program}: {source}{hint}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// A child process exited before it was ready.
    #[error("{name} exited at start ({status}); its log:\n{log}")]
    Exited {
        /// Which child.
        name: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its log, when it has one.
        log: String,
    },
    /// A child process did not become ready in time.
    #[error("{name} was not ready within {waited_s} s")]
    NotReady {
        /// Which child.
        name: String,
        /// How long we waited.
        waited_s: u64,
    },
    /// A file or folder could not be read, written or created.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No free port could be found on 127.0.0.1.
    #[error("no free port on 127.0.0.1: {0}")]
    NoFreePort(std::io::Error),
    /// Anvil's `--config-out` file does not say what it should.
    #[error("anvil config {path}: {reason}")]
    AnvilConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The JSON-RPC endpoint failed.
    #[error("rpc: {0}")]
    Rpc(#[from] alloy::transports::TransportError),
    /// A chain answers with another chain id than its registry entry says.
    #[error("registry says chain {expected} at {rpc_url} but it reports {actual}")]
    WrongChain {
        /// The registry's id.
        expected: u64,
        /// The URL.
        rpc_url: String,
        /// What the chain reports.
        actual: u64,
    },
    /// A measurement came out wrong (the bench's own check).
    #[error("bench: {0}")]
    Bench(&'static str),
    /// A benchmark over real processes could not run (what failed, in words).
    #[error("bench: {0}")]
    BenchFailed(String),
    /// A binary the devnet or a test starts is not built.
    #[error(
        "{path} is missing: build it (`cargo build -p {package}`; scripts/run.sh builds the \
         release ones) or set {env}"
    )]
    MissingBinary {
        /// Where it was looked for.
        path: PathBuf,
        /// The package that builds it.
        package: &'static str,
        /// The environment variable that names another.
        env: &'static str,
    },
    /// `cargo build` of the signer binary failed.
    #[error("building cx-signer failed ({0}); run `cargo build -p cx-settlement --bin cx-signer`")]
    BuildSigner(String),
    /// The throwaway database could not be created or migrated.
    #[error("database: {0} (is PostgreSQL running at DATABASE_URL?)")]
    Database(#[from] sqlx::Error),
    /// The exchange's books could not create or migrate the throwaway database.
    #[error("the exchange's books")]
    Books(#[from] cx_exchange_server::Error),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
