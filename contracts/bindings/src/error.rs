//! The crate's one error type: reading and writing the registry and deployment files.

use std::path::PathBuf;

/// What can go wrong with the registry and deployment files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}: {source} (for deployments: deploy the contracts first)")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written (or its folder created).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not the JSON it should be.
    #[error("{path} is not a valid file of its kind: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why the JSON did not fit.
        source: serde_json::Error,
    },
    /// A file parsed but says something unusable.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        reason: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
