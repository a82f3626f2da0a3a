//! The writer lease: one `cx serve` at a time writes a database (see the migration
//! `exchange_writer`). A second node on the same database waits as a standby, or is refused
//! after a bounded wait, instead of clearing the same markets twice; when the writer dies,
//! PostgreSQL releases its lock as its connection closes, and a standby takes over — it builds
//! its engine from the books as any start does, so nothing acknowledged is lost and nothing is
//! done twice (the epoch fences a superseded writer's late commits).

use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};
use tokio::sync::oneshot;

use crate::{Error, Result};

/// The advisory lock's key: the ASCII of "cx-write", fixed, so every build agrees.
const WRITER_LOCK: i64 = 0x6378_2d77_7269_7465;

/// How often a waiting node retries, and how often the holder renews the lease.
pub const LEASE_PERIOD: Duration = Duration::from_secs(1);

/// A holder that has not renewed the lease for this long is cut off by a waiting node: a hung
/// process keeps its socket (and so its lock) open, and TCP keepalives see only dead machines.
pub const LEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// The lease, held while this value lives: a task of its own keeps its connection and renews it
/// from the moment it is taken (a writer rebuilding a large engine must not look hung).
#[derive(Debug)]
pub struct WriterLease {
    epoch: i64,
    forward_token: String,
    lost: Option<oneshot::Receiver<Error>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for WriterLease {
    /// The keeper's connection closes with it: the lock is released at once.
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// What holds the lease's connection and renews it.
struct Keeper {
    conn: PgConnection,
    epoch: i64,
    database_url: String,
}

/// Where the writer is reached and how a forwarding node proves itself to it
/// ([`crate::cluster`]), as the writer wrote them when it took the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterAddress {
    /// The epoch of the lease these belong to.
    pub epoch: i64,
    /// The writer's URL (`https://host:port`).
    pub url: String,
    /// The epoch's forwarding token (a secret: never logged).
    pub forward_token: String,
}

impl WriterLease {
    /// Takes the lease for `holder` (a name for people: host and address), waiting up to
    /// `wait` (`None`: as long as it takes — a standby) while another node holds it, with a
    /// fresh forwarding token ([`WriterLease::forward_token`]). The row names no URL until
    /// [`WriterLease::advertise`]: nothing is forwarded to a writer still rebuilding its
    /// engine. The database must be migrated ([`super::Books::open`]).
    pub async fn take(database_url: &str, holder: &str, wait: Option<Duration>) -> Result<Self> {
        let mut conn = PgConnection::connect(database_url).await?;
        keepalive(&mut conn).await?;
        let started = Instant::now();
        let mut announced = false;
        loop {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(WRITER_LOCK)
                .fetch_one(&mut conn)
                .await?;
            if got {
                break;
            }
            let row: Option<(String, bool)> = sqlx::query_as(
                "SELECT holder, now() - renewed_at > make_interval(secs => $1) \
                 FROM exchange_writer",
            )
            .bind(LEASE_TIMEOUT.as_secs_f64())
            .fetch_optional(&mut conn)
            .await?;
            let (current, stale) = row.unwrap_or_else(|| ("another node".into(), false));
            if stale && wait.is_none() {
                // Only a standby cuts a holder off: a plain start refuses instead.
                tracing::warn!(%current, "the writer stopped renewing its lease; cutting it off");
                cut_off_holder(&mut conn).await?;
                tokio::time::sleep(LEASE_PERIOD / 4).await;
                continue;
            }
            if wait.is_some_and(|w| started.elapsed() >= w) {
                return Err(Error::WriterTaken { holder: current });
            }
            if !announced {
                tracing::info!(%current, "another node writes this database; waiting for its lease");
                announced = true;
            }
            tokio::time::sleep(LEASE_PERIOD).await;
        }
        let forward_token = new_token()?;
        let epoch: i64 = sqlx::query(
            "INSERT INTO exchange_writer (epoch, holder) VALUES (1, $1) \
             ON CONFLICT (only_row) DO UPDATE SET epoch = exchange_writer.epoch + 1, \
             holder = $1, url = NULL, forward_token = NULL, since = now(), renewed_at = now() \
             RETURNING epoch",
        )
        .bind(holder)
        .fetch_one(&mut conn)
        .await?
        .try_get("epoch")?;
        let (tell, lost) = oneshot::channel();
        let keeper = Keeper {
            conn,
            epoch,
            database_url: database_url.to_owned(),
        };
        let keeper = tokio::spawn(async move {
            let _ = tell.send(keeper.run().await);
        });
        Ok(Self {
            epoch,
            forward_token,
            lost: Some(lost),
            keeper,
        })
    }

    /// The token forwarding nodes send with this epoch's requests.
    pub fn forward_token(&self) -> &str {
        &self.forward_token
    }

    /// Says where this writer takes forwarded requests, once it serves: the row gets `url`
    /// and the epoch's token ([`crate::cluster`]), written through `pool` (the books').
    pub async fn advertise(&self, pool: &sqlx::PgPool, url: &str) -> Result<()> {
        sqlx::query("UPDATE exchange_writer SET url = $1, forward_token = $2 WHERE epoch = $3")
            .bind(url)
            .bind(&self.forward_token)
            .bind(self.epoch)
            .execute(pool)
            .await?;
        Ok(())
    }

    /// Where the current writer takes forwarded requests (`None`: no writer has taken the lease
    /// yet, or it takes none). The row may name a writer that has just died: a forwarding node
    /// finds out when it cannot connect, and reads again.
    pub async fn address(pool: &sqlx::PgPool) -> Result<Option<WriterAddress>> {
        let row: Option<(i64, Option<String>, Option<String>)> =
            sqlx::query_as("SELECT epoch, url, forward_token FROM exchange_writer")
                .fetch_optional(pool)
                .await?;
        Ok(row.and_then(|(epoch, url, token)| {
            Some(WriterAddress {
                epoch,
                url: url?,
                forward_token: token?,
            })
        }))
    }

    /// The fencing token: every connection of the books this node opens carries it.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Returns when the lease is lost, with why; the caller must stop writing at once (the
    /// fence refuses its writes anyway once another node took over).
    pub async fn lost(mut self) -> Error {
        match self.lost.take() {
            Some(lost) => lost
                .await
                .unwrap_or_else(|_| Error::WriterLost("the lease's keeper stopped".into())),
            None => Error::WriterLost("the lease's loss was already taken".into()),
        }
    }
}

impl Keeper {
    /// Renews the lease every [`LEASE_PERIOD`] until it is lost, and says why. A lease
    /// connection that fails (PostgreSQL restarted, the network parted) is not yet a loss: while
    /// the database is away nobody else can take the lease either, so the node reconnects and
    /// locks again, and goes on as writer if the epoch is still its own; another epoch means
    /// another node took over while it was cut off.
    async fn run(mut self) -> Error {
        loop {
            tokio::time::sleep(LEASE_PERIOD).await;
            let renewed =
                sqlx::query("UPDATE exchange_writer SET renewed_at = now() WHERE epoch = $1")
                    .bind(self.epoch)
                    .execute(&mut self.conn)
                    .await;
            match renewed {
                Ok(done) if done.rows_affected() == 1 => continue,
                Ok(_) => {
                    return Error::WriterLost(
                        "another node took the database's writer lease".into(),
                    );
                }
                Err(_) => {}
            }
            tracing::warn!("the writer lease's connection failed; taking the lease again");
            loop {
                match self.relock().await {
                    Ok(true) => break,
                    Ok(false) => {
                        return Error::WriterLost(
                            "another node took the database's writer lease".into(),
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the database is away; the lease is retried");
                        tokio::time::sleep(LEASE_PERIOD).await;
                    }
                }
            }
        }
    }

    /// A new connection holding the lock again with the epoch unchanged (`Ok(false)`: another
    /// node holds the lock, or held it since).
    async fn relock(&mut self) -> Result<bool> {
        let mut conn = PgConnection::connect(&self.database_url).await?;
        keepalive(&mut conn).await?;
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(WRITER_LOCK)
            .fetch_one(&mut conn)
            .await?;
        if !got {
            return Ok(false);
        }
        let epoch: Option<i64> = sqlx::query_scalar("SELECT epoch FROM exchange_writer")
            .fetch_optional(&mut conn)
            .await?;
        if epoch != Some(self.epoch) {
            return Ok(false);
        }
        self.conn = conn;
        tracing::info!(epoch = self.epoch, "the writer lease is held again");
        Ok(true)
    }
}

/// Terminates the backend holding the writer lock (the holder's lease connection), which
/// releases it. A bigint advisory key shows in `pg_locks` as its high and low 32 bits; advisory
/// locks belong to a database, and the same key held in another database of the server is
/// another exchange's lease (another deployment, or a test beside this one), never touched.
async fn cut_off_holder(conn: &mut PgConnection) -> Result<()> {
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_locks \
         WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid::bigint = $1 AND objid::bigint = $2",
    )
    .bind(WRITER_LOCK >> 32)
    .bind(WRITER_LOCK & 0xffff_ffff)
    .execute(conn)
    .await?;
    Ok(())
}

/// How long PostgreSQL keeps the lock of a node that vanished without closing its socket (its
/// machine lost, the network cut): TCP keepalives on the lease's connection, set by the server
/// for this session, close it after 5 s of silence and 3 unanswered probes 2 s apart, ~11 s
/// (the node pings every [`LEASE_PERIOD`], so a live one is never silent that long). A process
/// that dies loses the lock at once: the kernel closes its socket. Ignored over a Unix socket,
/// where a dead peer is always seen.
async fn keepalive(conn: &mut PgConnection) -> Result<()> {
    sqlx::query(
        "SELECT set_config('tcp_keepalives_idle', '5', false), \
         set_config('tcp_keepalives_interval', '2', false), \
         set_config('tcp_keepalives_count', '3', false)",
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// 32 random bytes as hex: a forwarding token no node can guess without reading the row.
fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| Error::NoRandomness(e.to_string()))?;
    Ok(hex::encode(bytes))
}
