//! The crate's error: what the service's parts (books, chain watcher, loops) can fail with.
//! The HTTP layer turns it into an [`crate::api::ApiError`]; nothing here picks a status.

/// An error of the exchange service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL refused or failed a query or a connection.
    #[error("database: {0} (is PostgreSQL running at DATABASE_URL?)")]
    Database(#[from] sqlx::Error),
    /// A migration in `migrations/` failed or does not match what the database recorded.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
