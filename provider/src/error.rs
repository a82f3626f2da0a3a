//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in `cx-provider`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    // Not a `source`: the message already holds it, and `{:#}` would print it twice.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// A `config.json` / `adapter_config.json` / index file is not what Hugging Face or PEFT
    /// writes.
    #[error("{path}: malformed {what}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// Which kind of file.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A safetensors file could not be parsed, or holds a dtype we cannot read.
    #[error("{path}: malformed safetensors: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// A base model tensor is missing or has the wrong shape.
    #[error("base model: {0}")]
    Model(String),
    /// An adapter does not fit the base model (shape, target, layer) or breaks a limit.
    #[error("adapter does not fit the base model: {0}")]
    AdapterMismatch(String),
    /// An adapter's rank is above the server's limit.
    #[error("adapter rank {rank} is over the limit {max_rank} (raise --max-lora-rank)")]
    RankOverLimit {
        /// The adapter's rank.
        rank: usize,
        /// The server's limit.
        max_rank: usize,
    },
    /// A requested adapter path is not a directory inside the configured roots (or loading by
    /// path is off). Says nothing about what exists outside the roots.
    #[error("{0}")]
    AdapterPath(String),
    /// An adapter file is not a regular file, or is larger than any accepted adapter can be.
    #[error("{path}: {reason}")]
    AdapterFile {
        /// The file.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// A name would make an id or an alias name other bytes than it names now.
    #[error("{0}")]
    AdapterConflict(String),
    /// No adapter with this alias or id is known.
    #[error("unknown adapter `{0}`: load it with POST /v1/load_lora_adapter or list /v1/models")]
    UnknownAdapter(String),
    /// The residency cache cannot make room: everything else is pinned or in use.
    #[error(
        "residency cache full: {needed_bytes} bytes needed, only {evictable_bytes} evictable \
         (unpin adapters or raise --cache-bytes)"
    )]
    CacheFull {
        /// Bytes that must be freed.
        needed_bytes: u64,
        /// Bytes held by evictable occupants.
        evictable_bytes: u64,
    },
    /// Registered adapter files changed on disk since they were hashed: the id no longer names
    /// them.
    #[error(
        "adapter files in {dir} changed since `{alias}` was registered (id {registered_id} now \
         {found_id}); load it again"
    )]
    AdapterChanged {
        /// The name it was registered under.
        alias: String,
        /// Its directory.
        dir: PathBuf,
        /// The id it was registered with.
        registered_id: String,
        /// The id of the files now.
        found_id: String,
    },
    /// An adapter a waiting request needs was loaded but cannot be made resident (everything
    /// else is pinned or in use): the request is refused rather than left waiting.
    #[error("{0}")]
    NotAdmitted(Box<Error>),
    /// The scheduler thread has stopped; no request can run.
    #[error("the scheduler has stopped")]
    SchedulerStopped,
    /// A sequence's forward or the decoding of its tokens failed; its batch neighbours carry on.
    #[error("{stage} failed: {cause}")]
    Generation {
        /// `forward` or `decoding`.
        stage: &'static str,
        /// Why.
        cause: Box<Error>,
    },
    /// A forward panicked (a bug); the scheduler caught it and carries on.
    #[error("forward panicked (a bug; see the provider's log)")]
    ForwardPanicked,
    /// An adapter load task panicked (a bug).
    #[error("load task failed")]
    LoadPanicked,
    /// A request does not fit the model (context length, token ids).
    #[error("{0}")]
    BadRequest(String),
    /// No training client has this id.
    #[error("unknown training client `{0}`: create one with POST /v1/training/clients")]
    UnknownTrainingClient(String),
    /// A training request's input is out of range (shapes, token ids, settings); nothing
    /// changed.
    #[error("{message}")]
    TrainingInput {
        /// The request field at fault.
        field: Option<&'static str>,
        /// What is wrong and what to do.
        message: String,
    },
    /// A training limit of this server is reached (clients, memory).
    #[error("{0}")]
    TrainingLimit(String),
    /// The loss or the gradients are not finite; nothing was changed.
    #[error("{0}")]
    TrainingDiverged(String),
    /// The model's chat template could not be compiled, raised (`raise_exception`), or failed
    /// on a request's messages; the message says which.
    #[error("{0}")]
    ChatTemplate(String),
    /// A chat was asked of a model without a chat template.
    #[error(
        "this model has no chat template (no chat_template.jinja, no `chat_template` in \
         tokenizer_config.json): send a prompt to /v1/completions, or add the model's template"
    )]
    NoChatTemplate,
    /// A tokenizer could not be loaded or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The kernels refused a call (a shape bug in this crate if it happens).
    #[error("kernel: {0}")]
    Kernel(#[from] cx_kernels::Error),
    /// The exchange could not be reached, refused a request, or answered what it should not.
    // The message names the URL or flag itself.
    #[error("{0}")]
    Exchange(String),
    /// The exchange could not be reached, gave no answer in time, or answered that it is
    /// unavailable for now (5xx): the same request may succeed when sent again.
    #[error("{0}")]
    ExchangeAway(String),
    /// The identity file is missing, unreadable by its owner only, malformed, or exists.
    #[error("{path}: {reason}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A protocol object could not be built or signed (an offer, a receipt).
    #[error("{0}")]
    Protocol(#[from] cx_protocol::Error),
    /// candle refused a tensor operation.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// `Result` with this crate's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            error: source,
        }
    }
}
