//! The books: the exchange's durable state in PostgreSQL.
//!
//! The schema is the workspace's `migrations/` (embedded at build time, so building needs no
//! database), applied by [`Books::open`] when the server starts: a fresh machine gets its
//! database created and migrated, a running one only the migrations it lacks. Every state change
//! that must survive a crash is written here first; the matching engine's memory is a cache
//! rebuilt from these tables. This module is the one door to the database: handlers and loops ask
//! it, they never open connections of their own (the settlement coordinator's outbox gets this
//! pool, on the same migrated database).

mod adapters;
mod bindings;
mod bundles;
mod chain;
mod content;
mod datasets;
mod jobs;
mod providers;
mod quotes;
mod reclear;
mod rent;
mod reserve;
mod residency;
mod search;
mod sessions;
mod settlement;
mod standing;
mod tabs;
mod verification;
mod verified;

pub use adapters::StoredAdapter;
pub use bindings::StoredBinding;
pub use chain::{KEPT_BLOCKS, Rewind, SeenBatch, SeenBlock, TabEvent};
pub use content::{Content, DEFAULT_STORE_QUOTA_BYTES, Upload};
pub use cx_protocol::job_status::JobStatus;
pub use datasets::DatasetSummary;
pub use jobs::{JobEvent, JobRecord, NewJob, NewOrder, NewRun};
pub use providers::{JobResult, Provider};
pub use quotes::{QUOTE_HISTORY_S, QuotePoint};
pub use reclear::{Reassigned, Stranded};
pub use rent::{CommittedRent, RentCommitment, RentFill};
pub use reserve::{Drawable, ReserveFill, StoredBid};
pub use residency::ResidencyMisses;
pub use sessions::Session;
pub use settlement::{PaidJob, SettledJob};
pub use standing::StandingOrder;
pub use tabs::Tab;
pub use verification::{
    GroupHead, PendingSlash, RunRecord, SLASH_RETRY_FIRST_S, SLASH_RETRY_HORIZON_S,
    SLASH_RETRY_MAX_S, Verdict,
};

use crate::error::Result;
use sqlx::Postgres;
use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};

/// The exchange's migrations (`migrations/` at the workspace root).
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// The devnet's database on the local server, where `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/cx";

/// `DATABASE_URL`, else [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// Connections the pool keeps at most: a small service on shared machines.
const MAX_CONNECTIONS: u32 = 16;

/// How long a query waits for a pooled connection (a new one while the server is away).
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The exchange's database, migrated.
#[derive(Clone, Debug)]
pub struct Books {
    pool: PgPool,
    /// When this process opened the books, unix seconds on the database's clock: what an
    /// earlier process left in flight is what changed before it.
    opened_at_s: f64,
}

impl Books {
    /// Connects to `database_url`, creating the database if it does not exist, and applies every
    /// migration it lacks. Safe to run at every start, and from two processes at once (PostgreSQL's
    /// advisory lock serialises the migrations; a database another process just created is used).
    pub async fn open(database_url: &str) -> Result<Self> {
        if !Postgres::database_exists(database_url).await?
            && let Err(err) = Postgres::create_database(database_url).await
            // Another process may have created it between our check and our create.
            && !Postgres::database_exists(database_url).await?
        {
            return Err(err.into());
        }
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            // While PostgreSQL restarts a request waits this long for a connection, then is
            // answered 503 (sqlx's default, 30 s, held clients past their own timeouts).
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(database_url)
            .await?;
        MIGRATOR.run(&pool).await?;
        let opened_at_s = sqlx::query_scalar("SELECT extract(epoch FROM now())::float8")
            .fetch_one(&pool)
            .await?;
        Ok(Self { pool, opened_at_s })
    }

    /// The pool, for the settlement coordinator's store, which keeps its outbox in these books.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// A `u128` amount as PostgreSQL `NUMERIC` text (sqlx has no `u128`; the SQL casts `::numeric`).
fn wei_text(wei: u128) -> String {
    wei.to_string()
}

/// A `NUMERIC` read back as text (`::text` in the SQL) into a `u128`.
fn parse_wei(text: &str) -> Result<u128> {
    text.parse().map_err(|_| crate::Error::Corrupt {
        what: "a wei amount",
        value: text.to_owned(),
    })
}

/// A chain id or block number as the `BIGINT` PostgreSQL stores.
fn to_i64(value: u64, what: &'static str) -> Result<i64> {
    i64::try_from(value).map_err(|_| crate::Error::OutOfRange { what, value })
}
