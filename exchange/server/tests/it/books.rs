//! The books on a real PostgreSQL: a database that does not exist is created and migrated, and
//! opening it again changes nothing. Each run uses its own throwaway database.

use cx_exchange_server::books::{Books, database_url};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// The server's URL with the database name replaced.
fn with_database(url: &str, name: &str) -> String {
    let (server, _) = url.rsplit_once('/').expect("a database URL ends in /NAME");
    format!("{server}/{name}")
}

#[tokio::test]
async fn open_creates_and_migrates_a_missing_database_and_is_idempotent() {
    let base = database_url();
    let name = format!(
        "cx_books_test_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let url = with_database(&base, &name);

    let books = Books::open(&url).await.expect("created and migrated");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' ORDER BY table_name",
    )
    .fetch_all(books.pool())
    .await
    .unwrap();
    for table in [
        "settlement_batches",
        "settlement_receipts",
        "_sqlx_migrations",
    ] {
        assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
    }
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(books.pool())
        .await
        .unwrap();
    books.pool().close().await;

    let again = Books::open(&url).await.expect("opened again");
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(again.pool())
        .await
        .unwrap();
    assert_eq!(applied, still);
    again.pool().close().await;

    let mut admin = PgConnection::connect(&with_database(&base, "postgres"))
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
}
