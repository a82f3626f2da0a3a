//! What the tests share: throwaway databases.

use cx_exchange_server::books::{Books, database_url};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// The server's URL with the database name replaced.
pub(crate) fn with_database(url: &str, name: &str) -> String {
    let (server, _) = url.rsplit_once('/').expect("a database URL ends in /NAME");
    format!("{server}/{name}")
}

/// A database of its own, created and migrated by [`Books::open`], dropped on drop.
pub(crate) struct TestDb {
    name: String,
    url: String,
}

impl TestDb {
    pub(crate) async fn new() -> Self {
        let mut tag = [0u8; 6];
        getrandom::fill(&mut tag).expect("system randomness");
        let name = format!("cx_server_test_{}", hex::encode(tag));
        Self {
            url: with_database(&database_url(), &name),
            name,
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) async fn books(&self) -> Books {
        Books::open(&self.url).await.expect("throwaway database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (url, name) = (database_url(), self.name.clone());
        // Drop cannot await inside the test's runtime; a thread with its own runtime can.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut admin) = PgConnection::connect(&with_database(&url, "postgres")).await
                {
                    let _ =
                        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                            .execute(&mut admin)
                            .await;
                }
            });
        })
        .join();
    }
}

/// `GET path` on `router` with the read credential of `key`'s account (job reads are the
/// buyer's): the exchange's key hash from `GET /v1/exchange`, a credential good for a minute.
pub(crate) async fn read_as(
    router: &axum::Router,
    key: &cx_protocol::order::SigningKey,
    path: &str,
) -> (axum::http::StatusCode, serde_json::Value) {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let get = |request: Request<Body>| async {
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default(),
        )
    };
    let (_, exchange) = get(Request::get("/v1/exchange").body(Body::empty()).unwrap()).await;
    let credential = credential_at(
        exchange["mldsa_key_hash"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap(),
        key,
        cx_protocol::access::Scope::Read,
    );
    get(Request::get(path)
        .header(axum::http::header::AUTHORIZATION, credential)
        .body(Body::empty())
        .unwrap())
    .await
}

/// An `Authorization` value for `scope`, signed by `key`, for the exchange of `intake`.
pub(crate) fn credential(
    intake: &cx_exchange_server::intake::Intake,
    key: &cx_protocol::order::SigningKey,
    scope: cx_protocol::access::Scope,
) -> String {
    credential_at(intake.identity().public().id().0.into(), key, scope)
}

/// An `Authorization` value for `scope`, signed by `key`, for the exchange whose ML-DSA key
/// hash is `exchange`.
pub(crate) fn credential_at(
    exchange: alloy::primitives::B256,
    key: &cx_protocol::order::SigningKey,
    scope: cx_protocol::access::Scope,
) -> String {
    cx_protocol::access::AccessGrant {
        scope,
        account: cx_protocol::order::account_of(key),
        exchange,
        expires_s: cx_exchange_server::intake::now_s() + 60,
    }
    .authorization(key)
}
