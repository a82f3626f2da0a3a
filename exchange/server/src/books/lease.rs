//! Leases: one `cx serve` at a time writes a database (see the migration `exchange_writer`),
//! and one at a time runs each duty beside it (the settlement loop, the chain watchers; the
//! migration `exchange_duties`), on whichever nodes take them. A second node on the same
//! database waits as a standby, or is refused after a bounded wait, instead of clearing the same
//! markets twice; when a holder dies, PostgreSQL releases its lock as its connection closes,
//! and a waiting node takes over — a writer builds its engine from the books as any start does,
//! a duty starts from the books where the last holder left them, so nothing acknowledged is lost
//! and nothing is done twice (the epoch fences a superseded holder's late commits).

use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::postgres::PgConnection;
use tokio::sync::oneshot;

use crate::{Error, Result};

/// What a lease lets its holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Seat {
    /// Write the books: the matching engine, intake, the sweeps (`exchange_writer`).
    Writer,
    /// Run a duty (`exchange_duties`).
    Duty(Duty),
}

/// What runs once per cluster beside the writer, on the node holding its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Duty {
    /// The settlement loop: cutting, signing and posting batches.
    Settlement,
    /// The chain watchers: tabs opened and reclaimed, batches landed.
    Watch,
}

impl Duty {
    /// Every duty.
    pub const ALL: [Duty; 2] = [Duty::Settlement, Duty::Watch];

    /// Its name in `exchange_duties`, in `cx.<name>_epoch` and on `cx serve --duties`.
    pub fn as_str(self) -> &'static str {
        match self {
            Duty::Settlement => "settlement",
            Duty::Watch => "watch",
        }
    }
}

impl std::str::FromStr for Duty {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Duty::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| format!("unknown duty {s:?} (settlement, watch)"))
    }
}

impl Seat {
    /// Its name: `writer` or the duty's.
    pub fn as_str(self) -> &'static str {
        match self {
            Seat::Writer => "writer",
            Seat::Duty(duty) => duty.as_str(),
        }
    }

    /// The advisory lock's key: the ASCII of "cx-write", "cx-settl", "cx-watch", fixed, so every
    /// build agrees.
    fn lock_key(self) -> i64 {
        match self {
            Seat::Writer => 0x6378_2d77_7269_7465,
            Seat::Duty(Duty::Settlement) => 0x6378_2d73_6574_746c,
            Seat::Duty(Duty::Watch) => 0x6378_2d77_6174_6368,
        }
    }

    /// The session setting the fence reads (`SET cx.<seat>_epoch`).
    pub(super) fn epoch_setting(self) -> String {
        format!("cx.{}_epoch", self.as_str())
    }

    /// Reads the holder and whether it stopped renewing for [`LEASE_TIMEOUT`].
    async fn holder(self, conn: &mut PgConnection) -> Result<Option<(String, bool)>> {
        let stale = "now() - renewed_at > make_interval(secs => $1)";
        let query = match self {
            Seat::Writer => format!("SELECT holder, {stale} FROM exchange_writer"),
            Seat::Duty(_) => format!("SELECT holder, {stale} FROM exchange_duties WHERE duty = $2"),
        };
        let query = sqlx::query_as(&query).bind(LEASE_TIMEOUT.as_secs_f64());
        Ok(self.named(query).fetch_optional(conn).await?)
    }

    /// Raises the epoch for `holder`, who has just taken the lock: the new epoch.
    async fn raise(self, conn: &mut PgConnection, holder: &str) -> Result<i64> {
        let query = match self {
            Seat::Writer => {
                "INSERT INTO exchange_writer (epoch, holder) VALUES (1, $1) \
                 ON CONFLICT (only_row) DO UPDATE SET epoch = exchange_writer.epoch + 1, \
                 holder = $1, url = NULL, forward_token = NULL, since = now(), renewed_at = now() \
                 RETURNING epoch"
            }
            Seat::Duty(_) => {
                "INSERT INTO exchange_duties (duty, epoch, holder) VALUES ($2, 1, $1) \
                 ON CONFLICT (duty) DO UPDATE SET epoch = exchange_duties.epoch + 1, \
                 holder = $1, since = now(), renewed_at = now() \
                 RETURNING epoch"
            }
        };
        let query = sqlx::query_scalar(query).bind(holder);
        Ok(self.named(query).fetch_one(conn).await?)
    }

    /// Renews the lease of `epoch`: false if the row names another epoch (another node took it).
    async fn renew(self, conn: &mut PgConnection, epoch: i64) -> Result<bool> {
        let query = match self {
            Seat::Writer => "UPDATE exchange_writer SET renewed_at = now() WHERE epoch = $1",
            Seat::Duty(_) => {
                "UPDATE exchange_duties SET renewed_at = now() WHERE epoch = $1 AND duty = $2"
            }
        };
        let done = self
            .named(sqlx::query(query).bind(epoch))
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The epoch the row names now.
    async fn epoch(self, conn: &mut PgConnection) -> Result<Option<i64>> {
        let query = match self {
            Seat::Writer => "SELECT epoch FROM exchange_writer",
            Seat::Duty(_) => "SELECT epoch FROM exchange_duties WHERE duty = $1",
        };
        Ok(self
            .named(sqlx::query_scalar(query))
            .fetch_optional(conn)
            .await?)
    }

    /// `query` with the duty's name bound last (its row's key); the writer's table has one row.
    fn named<'q, Q: Bind<'q>>(self, query: Q) -> Q {
        match self {
            Seat::Writer => query,
            Seat::Duty(duty) => query.bind_name(duty.as_str()),
        }
    }
}

/// The three kinds of sqlx query a lease's statements are, each taking the duty's name.
trait Bind<'q> {
    fn bind_name(self, name: &'static str) -> Self;
}

impl<'q> Bind<'q> for sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    fn bind_name(self, name: &'static str) -> Self {
        self.bind(name)
    }
}

impl<'q, O> Bind<'q>
    for sqlx::query::QueryScalar<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>
{
    fn bind_name(self, name: &'static str) -> Self {
        self.bind(name)
    }
}

impl<'q, O> Bind<'q> for sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    fn bind_name(self, name: &'static str) -> Self {
        self.bind(name)
    }
}

/// How often a waiting node retries, and how often the holder renews the lease.
pub const LEASE_PERIOD: Duration = Duration::from_secs(1);

/// A holder that has not renewed the lease for this long is cut off by a waiting node: a hung
/// process keeps its socket (and so its lock) open, and TCP keepalives see only dead machines.
pub const LEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// A lease, held while this value lives: a task of its own keeps its connection and renews it
/// from the moment it is taken (a writer rebuilding a large engine must not look hung).
#[derive(Debug)]
pub struct Lease {
    seat: Seat,
    epoch: i64,
    forward_token: String,
    lost: Option<oneshot::Receiver<Error>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Lease {
    /// The keeper's connection closes with it: the lock is released at once.
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// What holds the lease's connection and renews it.
struct Keeper {
    conn: PgConnection,
    seat: Seat,
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

impl Lease {
    /// Takes `seat`'s lease for `holder` (a name for people: host and address), waiting up to
    /// `wait` (`None`: as long as it takes — a standby, a node ready for a duty) while another
    /// node holds it. Only a node waiting without bound cuts off a holder that stopped renewing
    /// ([`LEASE_TIMEOUT`]): a plain start is refused instead. A writer's lease comes with a
    /// fresh forwarding token ([`Lease::forward_token`]), and its row names no URL until
    /// [`Lease::advertise`]: nothing is forwarded to a writer still rebuilding its engine. The
    /// database must be migrated ([`super::Books::open`]).
    pub async fn take(
        database_url: &str,
        seat: Seat,
        holder: &str,
        wait: Option<Duration>,
    ) -> Result<Self> {
        let mut conn = PgConnection::connect(database_url).await?;
        keepalive(&mut conn).await?;
        let started = Instant::now();
        let mut announced = false;
        loop {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(seat.lock_key())
                .fetch_one(&mut conn)
                .await?;
            if got {
                break;
            }
            let row = seat.holder(&mut conn).await?;
            let (current, stale) = row.unwrap_or_else(|| ("another node".into(), false));
            if stale && wait.is_none() {
                tracing::warn!(%current, seat = seat.as_str(), "the holder stopped renewing its lease; cutting it off");
                cut_off_holder(&mut conn, seat).await?;
                tokio::time::sleep(LEASE_PERIOD / 4).await;
                continue;
            }
            if wait.is_some_and(|w| started.elapsed() >= w) {
                return Err(Error::WriterTaken { holder: current });
            }
            if !announced && seat == Seat::Writer {
                tracing::info!(%current, "another node writes this database; waiting for its lease");
                announced = true;
            }
            tokio::time::sleep(LEASE_PERIOD).await;
        }
        let forward_token = new_token()?;
        let epoch = seat.raise(&mut conn, holder).await?;
        let (tell, lost) = oneshot::channel();
        let keeper = Keeper {
            conn,
            seat,
            epoch,
            database_url: database_url.to_owned(),
        };
        let keeper = tokio::spawn(async move {
            let _ = tell.send(keeper.run().await);
        });
        Ok(Self {
            seat,
            epoch,
            forward_token,
            lost: Some(lost),
            keeper,
        })
    }

    /// What it lets this node do.
    pub fn seat(&self) -> Seat {
        self.seat
    }

    /// The token forwarding nodes send with a writer epoch's requests.
    pub fn forward_token(&self) -> &str {
        &self.forward_token
    }

    /// Says where this writer takes forwarded requests, once it serves: the row gets `url`
    /// and the epoch's token ([`crate::cluster`]), written through `pool` (the books').
    pub async fn advertise(&self, pool: &sqlx::PgPool, url: &str) -> Result<()> {
        debug_assert_eq!(
            self.seat,
            Seat::Writer,
            "only a writer takes forwarded requests"
        );
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
    pub async fn writer_address(pool: &sqlx::PgPool) -> Result<Option<WriterAddress>> {
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

    /// The fencing token: every connection of the books this node opens for the seat carries it
    /// ([`super::Books::open_fenced`]).
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Returns when the lease is lost, with why; the caller must stop writing at once (the
    /// fence refuses its writes anyway once another node took over).
    pub async fn lost(&mut self) -> Error {
        match self.lost.take() {
            Some(lost) => lost
                .await
                .unwrap_or_else(|_| Error::LeaseLost("the lease's keeper stopped".into())),
            None => Error::LeaseLost("the lease's loss was already taken".into()),
        }
    }
}

impl Keeper {
    /// Renews the lease every [`LEASE_PERIOD`] until it is lost, and says why. A lease
    /// connection that fails (PostgreSQL restarted, the network parted) is not yet a loss: while
    /// the database is away nobody else can take the lease either, so the node reconnects and
    /// locks again, and goes on as holder if the epoch is still its own; another epoch means
    /// another node took over while it was cut off.
    async fn run(mut self) -> Error {
        let seat = self.seat;
        let taken = move || {
            Error::LeaseLost(format!(
                "another node took the database's {} lease",
                seat.as_str()
            ))
        };
        loop {
            tokio::time::sleep(LEASE_PERIOD).await;
            match self.seat.renew(&mut self.conn, self.epoch).await {
                Ok(true) => continue,
                Ok(false) => return taken(),
                Err(_) => {}
            }
            tracing::warn!(
                seat = self.seat.as_str(),
                "a lease's connection failed; taking the lease again"
            );
            loop {
                match self.relock().await {
                    Ok(true) => break,
                    Ok(false) => return taken(),
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
            .bind(self.seat.lock_key())
            .fetch_one(&mut conn)
            .await?;
        if !got || self.seat.epoch(&mut conn).await? != Some(self.epoch) {
            return Ok(false);
        }
        self.conn = conn;
        tracing::info!(
            seat = self.seat.as_str(),
            epoch = self.epoch,
            "the lease is held again"
        );
        Ok(true)
    }
}

/// Terminates the backend holding `seat`'s lock (the holder's lease connection), which
/// releases it. A bigint advisory key shows in `pg_locks` as its high and low 32 bits; advisory
/// locks belong to a database, and the same key held in another database of the server is
/// another exchange's lease (another deployment, or a test beside this one), never touched.
async fn cut_off_holder(conn: &mut PgConnection, seat: Seat) -> Result<()> {
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_locks \
         WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid::bigint = $1 AND objid::bigint = $2",
    )
    .bind(seat.lock_key() >> 32)
    .bind(seat.lock_key() & 0xffff_ffff)
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
