//! [`Error`]: everything the client can fail with, one variant per cause.

use std::path::PathBuf;

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a call to the exchange, or a key file, can fail with. Every message is one line that
/// names what to change (the URL, the file, the field the server blamed).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The exchange answered with its JSON error `{"error": {"code", "message", "field"}}`.
    #[error("{code} (HTTP {status}){}: {message}", field.as_deref().map(|f| format!(" at {f}")).unwrap_or_default())]
    Api {
        /// The HTTP status.
        status: u16,
        /// The server's stable, machine-readable code (`tab_overspent`, `nonce_reused`, …).
        code: String,
        /// What is wrong and what to do, in the server's words.
        message: String,
        /// The JSON path of the field the server blamed, if one.
        field: Option<String>,
    },
    /// The exchange answered with a status that is not a success and a body that is not our
    /// error shape (a proxy in front of it, say).
    #[error("{method} {path}: HTTP {status} without an exchange error body: {body}")]
    UnexpectedStatus {
        /// The request's method.
        method: &'static str,
        /// The request's path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body, as text.
        body: String,
    },
    /// A successful answer whose JSON is not what the endpoint returns.
    #[error("{method} {path}: the answer is not the expected JSON: {source}")]
    Decode {
        /// The request's method.
        method: &'static str,
        /// The request's path.
        path: String,
        /// What did not parse.
        source: serde_json::Error,
    },
    /// The exchange URL cannot be used.
    #[error("exchange URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why (scheme, host, …).
        reason: String,
    },
    /// Connecting, the TLS handshake or the HTTP exchange failed.
    #[error("{method} {url}: {reason}")]
    Transport {
        /// The request's method.
        method: &'static str,
        /// The full URL.
        url: String,
        /// The causes, outermost first, joined by ": ".
        reason: String,
    },
    /// No answer within the client's timeout.
    #[error("{method} {url}: no answer within {timeout_s} s")]
    Timeout {
        /// The request's method.
        method: &'static str,
        /// The full URL.
        url: String,
        /// The timeout, seconds.
        timeout_s: u64,
    },
    /// A CA certificate file (`--ca`) could not be read or holds no usable certificate.
    #[error("{}: {reason}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the TLS configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// Signing or checking an order failed (a field out of range, a domain without a contract).
    #[error(transparent)]
    Protocol(#[from] cx_protocol::Error),
    /// A key file exists and `force` was not given.
    #[error("{}: already exists; pass --force to replace it (the old keys are lost)", path.display())]
    KeyFileExists {
        /// The file.
        path: PathBuf,
    },
    /// A key file could not be read, written or renamed.
    #[error("{}: {source}", path.display())]
    KeyFileIo {
        /// The file (or its temporary sibling).
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A key file is readable by users other than its owner.
    #[error("{}: readable by other users (mode {mode:03o}); run `chmod 600` on it", path.display())]
    KeyFilePermissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A key file's contents are not a valid key file.
    #[error("{}: {reason}", path.display())]
    KeyFileInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// The server's error code, when the exchange refused the request.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The field the server blamed, when it blamed one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Api { field, .. } => field.as_deref(),
            _ => None,
        }
    }

    /// The HTTP status of an answer that was not a success.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } | Self::UnexpectedStatus { status, .. } => Some(*status),
            _ => None,
        }
    }
}
