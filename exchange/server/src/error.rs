//! The crate's error: what the service's parts (books, chain watcher, intake) can fail with.
//! The HTTP layer turns it into an [`crate::api::ApiError`] in one place; nothing here picks a
//! status.

use alloy::primitives::Address;

/// An error of the exchange service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL refused or failed a query or a connection.
    // The cause is the source, not in the message: `{:#}` chains print it once.
    #[error("database (is PostgreSQL running at DATABASE_URL?)")]
    Database(#[from] sqlx::Error),
    /// A migration in `migrations/` failed or does not match what the database recorded.
    #[error("applying migrations/")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The market core refused (an invalid bundle, job or weight).
    #[error(transparent)]
    Market(#[from] cx_exchange::Error),
    /// An order, binding or wire value is invalid or does not verify; names its field.
    #[error(transparent)]
    Protocol(#[from] cx_protocol::Error),
    /// A JSON column or body did not (de)serialize.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Another node holds the database's writer lease (`cx serve --standby` waits for it).
    #[error(
        "another cx serve writes this database ({holder}); stop it, or start this one with --standby to take over when it stops"
    )]
    WriterTaken {
        /// The holder as it named itself.
        holder: String,
    },
    /// The operating system gave no randomness (a token could not be made).
    #[error("no randomness: {0}")]
    NoRandomness(String),
    /// A lease was lost (its connection failed, another node took it): this node must stop
    /// what it held it for.
    #[error("lost a lease: {0}")]
    LeaseLost(String),
    /// A row holds what this code never writes (a bug or a hand edit).
    #[error("the books hold an invalid {what}: {value:?}")]
    Corrupt {
        /// What kind of value.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// A number does not fit the column.
    #[error("{what} {value} is out of range")]
    OutOfRange {
        /// What kind of number.
        what: &'static str,
        /// The number.
        value: u64,
    },
    /// The account is bound to another ML-DSA key already.
    #[error("account {0} is already bound to another ML-DSA key")]
    AccountAlreadyBound(Address),
    /// The ML-DSA key is bound to another account already.
    #[error("this ML-DSA key is already bound to another account")]
    KeyAlreadyBound,
    /// No such tab (or not the signer's: the answer is the same).
    #[error("no tab {escrow_id} on chain {chain_id} for this account (open it on chain first)")]
    UnknownTab {
        /// The chain.
        chain_id: u64,
        /// The escrow id.
        escrow_id: u64,
    },
    /// The tab was reclaimed on chain.
    #[error("tab {escrow_id} on chain {chain_id} is closed (reclaimed on chain)")]
    TabClosed {
        /// The chain.
        chain_id: u64,
        /// The escrow id.
        escrow_id: u64,
    },
    /// The tab may be reclaimed before the job could be paid.
    #[error(
        "the tab can be reclaimed at {tab_deadline_s}, before this job could settle \
         ({needed_until_s}); open a tab with a later deadline"
    )]
    TabEndsTooSoon {
        /// When the buyer may reclaim the tab, unix seconds.
        tab_deadline_s: u64,
        /// When the job needs it until, unix seconds.
        needed_until_s: u64,
    },
    /// The tab has less left than the job needs.
    #[error("the tab has {available_wei} wei left; this job needs {needed_wei}")]
    TabOverspent {
        /// What is left, wei.
        available_wei: u128,
        /// What the job would hold, wei.
        needed_wei: u128,
    },
    /// The account already used this nonce on this chain.
    #[error("nonce {nonce} was already used by this account on this chain (a replay?)")]
    NonceReused {
        /// The nonce.
        nonce: u64,
    },
    /// A chain's JSON-RPC URL does not parse.
    #[error("invalid JSON-RPC URL {0:?}")]
    BadRpcUrl(String),
    /// A chain's node refused or failed a call.
    #[error("chain: {0}")]
    Chain(String),
    /// Chain `chain_id` reorganised from `fork_block`, and a replaced block opened a tab that
    /// jobs, sessions or standing orders already draw on: the watcher stops there.
    #[error(
        "chain {chain_id} reorganised from block {fork_block} under tabs {tabs:?}, which orders already draw on; the watcher stops on this chain until an operator reconciles it"
    )]
    ReorgBelowHolds {
        /// The chain.
        chain_id: u64,
        /// The first replaced block.
        fork_block: u64,
        /// The tabs opened in replaced blocks that something draws on.
        tabs: Vec<u64>,
    },
    /// No open search has this id (unknown, filled by another witness, or ended).
    #[error("no open search has this id (another witness won, it ended, or it never existed)")]
    SearchNotOpen,
    /// No reserve in the state the call needs has this id (unknown, its window started, not
    /// committed to this provider, or its window not over): the reason says which.
    #[error("the reserve is not open to this: {reason}")]
    ReserveNotOpen {
        /// What the reserve's state does not allow.
        reason: &'static str,
    },
    /// No rent in the state the call needs has this id (unknown, not committed to this
    /// provider, or its term not over): the reason says which.
    #[error("the rent is not open to this: {reason}")]
    RentNotOpen {
        /// What the rent's state does not allow.
        reason: &'static str,
    },
    /// No live bundles can hold the rented state within the buyer's limit and ε; nothing was
    /// held. Names the binding field (`rent.order.target`, `.max_rent_wei`, `.epsilon_ppm`).
    #[error("{field}: no live bundles can keep it resident as asked: {reason}")]
    NoRentHolder {
        /// The rent's field that binds.
        field: &'static str,
        /// Why none can (the binding constraint).
        reason: String,
    },
    /// No live provider takes the search's work within the buyer's limit or deadline; nothing
    /// was held. Names the binding field.
    #[error("{field}: {reason}")]
    SearchUnpriced {
        /// The search's field that binds (`search.order`, `.max_price_wei`, `.deadline_s`).
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A bid on a reserve cannot be taken; names the bid's field.
    #[error("bid.{field}: {reason}")]
    BidRefused {
        /// The bid's field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The claimed witness does not satisfy the search.
    #[error(
        "{witness} is not a witness: SHA-256(prefix ‖ nonce, 8 bytes little-endian) is not below the target"
    )]
    NotAWitness {
        /// The nonce claimed.
        witness: u64,
    },
    /// The tab has taken as many jobs as one settlement batch part pays.
    #[error(
        "tab {escrow_id} on chain {chain_id} has taken {jobs} jobs, all one batch can settle: \
         settle it (POST /v1/tabs/{chain_id}/{escrow_id}/close) and open another"
    )]
    TabFull {
        /// Chain.
        chain_id: u64,
        /// Tab.
        escrow_id: u64,
        /// The limit.
        jobs: u32,
    },
    /// The provider's payout account is not staked (or registered another key) on a chain the
    /// exchange settles on.
    #[error("not staked on chain {chain_id}: {reason}")]
    NotStaked {
        /// The chain.
        chain_id: u64,
        /// What falls short.
        reason: String,
    },
    /// The settlement loop or its configuration failed (the coordinator's error, as text).
    #[error("settlement: {0}")]
    Settlement(String),
    /// The order names a chain this exchange does not serve.
    #[error("chain {0} is not served by this exchange (see GET /v1/chains)")]
    UnknownChain(u64),
    /// The request does not hash to the signed `request_hash`.
    #[error(
        "request does not match the signed request_hash (SHA-256 of the request's canonical JSON: \
         keys sorted, no whitespace)"
    )]
    RequestHashMismatch,
    /// The prompt is longer than the exchange accepts.
    #[error("request.prompt is longer than {limit_bytes} bytes")]
    PromptTooLong {
        /// The limit.
        limit_bytes: usize,
    },
    /// The adapter id names no adapter the exchange holds.
    #[error(
        "intent.order.adapter_id names no adapter this exchange holds (store it with PUT /v1/adapters)"
    )]
    UnknownAdapter,
    /// More requests are doing work than the server takes at once ([`crate::limits::InFlight`]).
    #[error(
        "the exchange is at its bound of {max} requests at once; nothing was done, send it again"
    )]
    Overloaded {
        /// The bound.
        max: usize,
    },
    /// A client sent more than its rate limit allows ([`crate::limits`]).
    #[error("too many requests from this {what}: retry after {retry_after_s} s")]
    RateLimited {
        /// What the limit is counted by (`IP address`, `account`).
        what: &'static str,
        /// Seconds until the next request is allowed.
        retry_after_s: u64,
    },
    /// A train order's `data` names no dataset the exchange holds.
    #[error("train.data names no dataset this exchange holds (store it with PUT /v1/datasets)")]
    UnknownDataset,
    /// The model (or task) is not in the catalog.
    #[error("unknown model {0:?} (see GET /v1/models)")]
    UnknownModel(String),
    /// The model is in the catalog but has no shape to clear it by.
    #[error("model {0:?} has no shape in the catalog; the exchange cannot clear it on its fleet")]
    NotClearable(String),
    /// Prompt tokens plus `max_tokens` overflow.
    #[error("request: prompt tokens + max_tokens overflow the context arithmetic")]
    ContextTooLarge,
    /// No bundle can take the job; the nearest and what it missed by.
    #[error("no bundle can take this job within its constraints; {detail}")]
    NoMatch {
        /// The nearest bundle's binding constraint and factor.
        detail: String,
    },
    /// A T1 or T3 class-D job needs verification runs on other providers, and the feasible fleet
    /// cannot place them within the deadline and the buyer's limit.
    #[error(
        "min_tier {tier} needs {needed} verification run(s) on {kind}, and the feasible fleet \
         cannot place them by the deadline within the limit ({detail}); ask a lower min_tier, \
         a later deadline or a higher limit"
    )]
    NoReplica {
        /// The tier asked.
        tier: cx_protocol::Tier,
        /// Runs it needs besides the job itself.
        needed: usize,
        /// What kind of other providers: `another provider`, `providers of distinct operators`.
        kind: &'static str,
        /// Why the fleet falls short.
        detail: String,
        /// Whether the shortfall is operator diversity (T3's committee).
        diverse: bool,
    },
    /// No session has this bearer token or id.
    #[error("no session has this key (make one with `cx agent session`)")]
    UnknownSession,
    /// The session was revoked.
    #[error("this session key was revoked")]
    SessionRevoked,
    /// The session's grant expired.
    #[error("this session key expired at {expiry_s} (unix seconds)")]
    SessionExpired {
        /// When, unix seconds.
        expiry_s: u64,
    },
    /// The call would take the session past its spend cap.
    #[error(
        "this session key has {left_wei} wei left of its spend cap; this call needs {needed_wei}"
    )]
    SessionCapReached {
        /// What is left under the cap, wei.
        left_wei: u128,
        /// What the call would hold, wei.
        needed_wei: u128,
    },
    /// Another session already uses this bearer secret.
    #[error("another session already uses this bearer secret; make a new one")]
    BearerReused,
    /// No bundle could run the job (its provider gave it up, or left the market, and no other
    /// could take it by its deadline); its hold was released.
    #[error("no provider could run the job{}; nothing was charged", reason.as_deref().map(|r| format!(" (its provider gave it up: {r})")).unwrap_or_default())]
    Refunded {
        /// The job.
        job_id: alloy::primitives::B256,
        /// Why its provider gave it up, if it said.
        reason: Option<String>,
    },
    /// No provider returned a result by the job's deadline; its hold was released.
    #[error("no provider returned a result by the deadline ({deadline_s}); nothing was charged")]
    DeadlineMissed {
        /// The job.
        job_id: alloy::primitives::B256,
        /// Its deadline, unix seconds.
        deadline_s: u64,
    },
    /// `max_tokens` is zero: there is nothing to generate or to charge.
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// The bundle id is registered by another provider key.
    #[error("bundle {0:?} is registered by another provider key")]
    BundleOwned(String),
    /// The key registered before under another operator.
    #[error(
        "this provider key is registered for operator {registered:?}; an offer cannot change it"
    )]
    OperatorChanged {
        /// The operator it registered with.
        registered: String,
    },
    /// Storing this would take the account past its store quota.
    #[error(
        "the account owns {used} bytes of stored adapters and datasets; {bytes} more would pass \
         its quota of {quota}"
    )]
    StoreQuota {
        /// Bytes it owns now.
        used: u64,
        /// Bytes of this upload.
        bytes: u64,
        /// Its quota.
        quota: u64,
    },
    /// No provider has this dispatch token.
    #[error("no provider has this dispatch token (register with POST /v1/providers/register)")]
    UnknownProvider,
    /// No such job among the provider's.
    #[error("no such job among this provider's")]
    UnknownJob,
    /// The job is not running (already done, expired, or never pulled).
    #[error("the job is {status}, not running: its result is not taken")]
    JobNotRunning {
        /// Its state.
        status: cx_protocol::job_status::JobStatus,
    },
    /// The result came after the job's deadline.
    #[error("the result came after the job's deadline ({deadline_s})")]
    ResultLate {
        /// The deadline, unix seconds.
        deadline_s: u64,
    },
    /// The receipt claims more than the job's assigned price.
    #[error("the receipt claims {charged_wei} wei; the job's price is at most {price_wei}")]
    OverCharged {
        /// What the receipt claims, wei.
        charged_wei: u128,
        /// What the job holds, wei.
        price_wei: u128,
    },
    /// The receipt does not describe this job or this result.
    #[error("the receipt's {field} {reason}")]
    ReceiptMismatch {
        /// The receipt's field.
        field: &'static str,
        /// How it differs.
        reason: String,
    },
    /// The result's output is not what the job's kind returns (a matmul job's product missing,
    /// not base64, of the wrong size; a product on an inference job).
    #[error("output.{field} {reason}")]
    InvalidOutput {
        /// The output's field.
        field: &'static str,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// The returned product failed its Freivalds check (tier T2): the job failed, nothing is
    /// charged and its hold went back to the tab.
    #[error(
        "the product is not A·B: it failed Freivalds' check ({rounds} rounds); the job failed \
         and nothing is charged"
    )]
    ProductRejected {
        /// Rounds run.
        rounds: usize,
    },
    /// A verification could not run (no randomness for its vectors, its kernel failed): an
    /// internal fault, not a verdict on the result.
    #[error("verification: {0}")]
    Verification(String),
    /// A value the exchange does not implement, named, never ignored.
    #[error("{field}: {reason}")]
    Unsupported {
        /// The field.
        field: &'static str,
        /// Why, and what is supported.
        reason: &'static str,
    },
    /// This exact order was accepted before.
    #[error("this order was already accepted")]
    OrderExists,
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is the database being away (restarting, unreachable, the pool out of
    /// connections within its bound) rather than a query this code got wrong: the request may
    /// be sent again as it is once it is back, and nothing it asked for was committed.
    pub fn is_outage(&self) -> bool {
        match self {
            Self::Database(err) => is_outage(err),
            _ => false,
        }
    }

    /// Whether this is PostgreSQL refusing a statement for contention ([`is_contention`]).
    pub fn is_contention(&self) -> bool {
        match self {
            Self::Database(err) => is_contention(err),
            _ => false,
        }
    }
}

/// Whether `err` is PostgreSQL refusing a statement for its contention with another
/// transaction: a deadlock it broke by aborting this one (SQLSTATE 40P01) or a serialization
/// failure (40001). The transaction was rolled back whole, so it may be run again as it was.
pub(crate) fn is_contention(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().is_some_and(|code| matches!(&*code, "40P01" | "40001")))
}

/// Whether `err` is PostgreSQL being away: no connection within the pool's bound, the socket
/// failing, or the server saying it is shutting down or starting (SQLSTATE class 08, connection
/// exception; 57P01–57P03, admin or crash shutdown and cannot connect now), or this node fenced
/// off as a superseded writer (CX001).
pub(crate) fn is_outage(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(&*code, "57P01" | "57P02" | "57P03")
                // The writer fence (migration `exchange_writer`): another node took over; the
                // statement was refused whole, and the request may go to the new writer.
                || &*code == "CX001"
        }),
        _ => false,
    }
}

/// A refusal naming `field` and why (a protocol-level invalid field: 400 with the field).
pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> Error {
    cx_protocol::Error::InvalidField {
        field: field.to_owned(),
        reason: reason.into(),
    }
    .into()
}
