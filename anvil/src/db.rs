//! PostgreSQL for the devnet and the tests: the URL (`DATABASE_URL`, else the devnet's local
//! server) and the exchange's migrations, both from the exchange's books, and throwaway databases
//! that tests create and drop.

use cx_exchange_server::books::{Books, database_url};
use sqlx::Connection;
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::error::Result;

/// A migrated database of its own, dropped (with its connections) when this is dropped, pass
/// or fail — so no test depends on rows another test or an earlier run left behind.
#[derive(Debug)]
pub struct TempDatabase {
    admin_url: String,
    name: String,
    /// Its URL.
    pub url: String,
}

impl TempDatabase {
    /// Creates a fresh database on the server of [`database_url`] and migrates it.
    pub async fn create() -> Result<Self> {
        let base = database_url();
        let base = base.split('?').next().unwrap_or_default().to_string();
        let prefix = base.rsplit_once('/').map_or(base.as_str(), |(p, _)| p);
        let admin_url = format!("{prefix}/postgres");
        let name = format!(
            "cx_test_{}",
            hex::encode(&cx_settlement::dkg::random_bytes()[..6])
        );
        let db = Self {
            url: format!("{prefix}/{name}"),
            admin_url,
            name,
        };
        // The exchange's own door creates and migrates it, as `cx serve` does at start.
        Books::open(&db.url).await?.pool().close().await;
        Ok(db)
    }

    /// A small pool on it.
    pub async fn pool(&self) -> Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(4)
            .connect(&self.url)
            .await?)
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, which cannot be blocked on; a thread with its
        // own runtime does the asynchronous DROP DATABASE and is joined.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        })
        .join();
    }
}
