//! The pool the books are kept in, opened and migrated, and the conversions every table's
//! statements share (wei as `NUMERIC` text, unsigned ids as `BIGINT`, constraint names).

use super::lease::{Lease, Seat};
use crate::error::Result;
use cx_protocol::workload::WorkloadKind;
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

/// Connections a duty's books keep at most ([`Books::open_fenced`]).
const DUTY_CONNECTIONS: u32 = 4;

/// How long a query waits for a pooled connection (a new one while the server is away).
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The exchange's database, migrated.
#[derive(Clone, Debug)]
pub struct Books {
    pub(super) pool: PgPool,
    /// When this process opened the books, unix seconds on the database's clock: what an
    /// earlier process left in flight is what changed before it.
    pub(super) opened_at_s: f64,
    /// Intents waiting to be written together ([`super::accepts`]).
    pub(super) group: std::sync::Arc<super::accepts::Group>,
}

impl Books {
    /// Connects to `database_url`, creating the database if it does not exist, and applies every
    /// migration it lacks. Safe to run at every start, and from two processes at once (PostgreSQL's
    /// advisory lock serialises the migrations; a database another process just created is used).
    pub async fn open(database_url: &str) -> Result<Self> {
        Self::open_with(database_url, None, MAX_CONNECTIONS).await
    }

    /// [`Books::open`] for the node holding `lease` ([`Lease`]): every connection is
    /// tagged with its seat's epoch, so once another node takes the lease the database refuses
    /// this one's writes to the tables that seat fences. Open after the lease is taken: what was
    /// in flight before is the previous holder's. A duty's books keep a few connections (a duty
    /// makes one pass at a time).
    pub async fn open_fenced(database_url: &str, lease: &Lease) -> Result<Self> {
        let connections = match lease.seat() {
            Seat::Writer => MAX_CONNECTIONS,
            Seat::Duty(_) => DUTY_CONNECTIONS,
        };
        Self::open_with(
            database_url,
            Some((lease.seat().epoch_setting(), lease.epoch())),
            connections,
        )
        .await
    }

    async fn open_with(
        database_url: &str,
        fence: Option<(String, i64)>,
        max_connections: u32,
    ) -> Result<Self> {
        if !Postgres::database_exists(database_url).await?
            && let Err(err) = Postgres::create_database(database_url).await
            // Another process may have created it between our check and our create.
            && !Postgres::database_exists(database_url).await?
        {
            return Err(err.into());
        }
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            // While PostgreSQL restarts a request waits this long for a connection, then is
            // answered 503 (sqlx's default, 30 s, held clients past their own timeouts).
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // sqlx pings a connection before lending it (and again when it comes back): a round
            // trip on every query, on intake's path. Without the first, a connection a database
            // restart broke fails its one query (a 503, as during the restart) and the ping on
            // its return closes it.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let fence = fence.clone();
                Box::pin(async move {
                    if let Some((setting, epoch)) = fence {
                        // A custom setting for the session: the fence trigger reads it.
                        sqlx::query("SELECT set_config($1, $2, false)")
                            .bind(setting)
                            .bind(epoch.to_string())
                            .execute(conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect(database_url)
            .await?;
        MIGRATOR.run(&pool).await?;
        // The kinds this build knows, which jobs name (a foreign key): a kind added to the
        // protocol needs no migration of its own.
        let kinds: Vec<&str> = WorkloadKind::ALL.iter().map(|k| k.as_str()).collect();
        sqlx::query(
            "INSERT INTO exchange_workload_kinds (name) SELECT unnest($1::text[]) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&kinds)
        .execute(&pool)
        .await?;
        let opened_at_s = sqlx::query_scalar("SELECT extract(epoch FROM now())::float8")
            .fetch_one(&pool)
            .await?;
        Ok(Self {
            pool,
            opened_at_s,
            group: Default::default(),
        })
    }

    /// The pool, for the settlement coordinator's store, which keeps its outbox in these books.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// A `u128` amount as PostgreSQL `NUMERIC` text (sqlx has no `u128`; the SQL casts `::numeric`).
pub(super) fn wei_text(wei: u128) -> String {
    wei.to_string()
}

/// A JSON value as the text a `jsonb` parameter binds. Not `Value::to_string`: `Display` writes
/// through `fmt::Formatter` a token at a time, which was ~7 % of the exchange's CPU under intake
/// for a job's decision (`perf`); `serde_json::to_string` writes into one buffer.
pub(super) fn json_text(value: &serde_json::Value) -> String {
    serde_json::to_string(value).expect("a serde_json::Value always serializes")
}

/// A `NUMERIC` read back as text (`::text` in the SQL) into a `u128`.
pub(super) fn parse_wei(text: &str) -> Result<u128> {
    text.parse().map_err(|_| crate::Error::Corrupt {
        what: "a wei amount",
        value: text.to_owned(),
    })
}

/// A chain id or block number as the `BIGINT` PostgreSQL stores.
pub(super) fn to_i64(value: u64, what: &'static str) -> Result<i64> {
    i64::try_from(value).map_err(|_| crate::Error::OutOfRange { what, value })
}

/// The name of the constraint a database error violated, if it is one.
pub(super) fn constraint(err: &sqlx::Error) -> Option<&str> {
    err.as_database_error().and_then(|e| e.constraint())
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`, for printing (`cx serve` and
/// `cx devnet` show the database they use, never its password).
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_password;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact_password("postgres://cx:hunter2@db:5432/cx"),
            "postgres://cx:***@db:5432/cx"
        );
        assert_eq!(
            redact_password("postgres://postgres@127.0.0.1:5432/cx"),
            "postgres://postgres@127.0.0.1:5432/cx"
        );
    }
}
