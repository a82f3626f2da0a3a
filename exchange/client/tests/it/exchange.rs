//! The client drives a real exchange over HTTPS: bind → intent → job → jobs → tab, a refused
//! intent whose error arrives typed, and the post-quantum key exchange on the pooled connection.
//!
//! The server is built exactly as the server's own intent tests build it (`api::app` over
//! `AppState::with_intake`, books from `Books::open` on a database of its own), then served by
//! `tls::serve_https` with a development CA made in a temporary directory.

use cx_client::types::JobsQuery;
use cx_client::{AgentKeys, Client, Error, InferenceRequest, request_hash};
use cx_exchange::objective::Weights;
use cx_exchange::routing::catalog::Catalog;
use cx_exchange_server::api::{AppState, app};
use cx_exchange_server::books::{Books, TabEvent, database_url};
use cx_exchange_server::intake::Intake;
use cx_exchange_server::market::Market;
use cx_exchange_server::tls::{self, DevCa, Limits};
use cx_protocol::order::{Address, B256, Intent, Kind};
use cx_protocol::pq::Identity;
use cx_protocol::{Bundle, DeterminismClass, Tier};
use serde_json::json;
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use std::path::PathBuf;
use tokio::sync::oneshot;

const CHAIN: u64 = 31337;
const ESCROW: u64 = 3;
const CATALOG: &str = include_str!("../../../core/catalog.example.toml");

fn settlement() -> Address {
    Address::repeat_byte(0x5e)
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn tag() -> String {
    let mut bytes = [0u8; 6];
    getrandom::fill(&mut bytes).unwrap();
    hex::encode(bytes)
}

fn with_database(url: &str, name: &str) -> String {
    let (server, _) = url.rsplit_once('/').expect("a database URL ends in /NAME");
    format!("{server}/{name}")
}

/// A database of its own (created and migrated by `Books::open`) and a temporary directory for
/// the CA, both removed on drop.
struct Scratch {
    database: String,
    dir: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let (url, name) = (database_url(), self.database.clone());
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

fn bundle(id: &str, price_wei_per_s: u64, resident: bool) -> Bundle {
    serde_json::from_value(json!({
        "id": id, "provider": "op-a", "price_wei_per_s": price_wei_per_s,
        "memory_bytes": 80_000_000_000u64, "bandwidth_bps": 1e9, "rtt_s": 0.01,
        "flops_per_s": 4e14, "context_max": 32768, "determinism": ["D", "S"],
        "tiers": ["T0", "T1"],
        "resident_bases": if resident { vec!["llama-3.1-8b-instruct"] } else { vec![] },
    }))
    .unwrap()
}

struct Exchange {
    url: String,
    ca_pem: PathBuf,
    _stop: oneshot::Sender<()>,
    _scratch: Scratch,
}

/// An exchange serving chain 31337, with two bundles and the agent's tab 3 (3 000 wei) already
/// mirrored into its books.
async fn exchange(buyer: Address) -> Exchange {
    let scratch = Scratch {
        database: format!("cx_client_test_{}", tag()),
        dir: std::env::temp_dir().join(format!("cx-client-test-{}", tag())),
    };
    let books = Books::open(&with_database(&database_url(), &scratch.database))
        .await
        .expect("a throwaway database (DATABASE_URL or postgres://postgres@127.0.0.1:5432)");
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    market
        .register(&books, bundle("cold-cheap", 100_000, false))
        .await
        .unwrap();
    market
        .register(&books, bundle("warm", 1_000_000, true))
        .await
        .unwrap();
    books
        .apply_chain(
            CHAIN,
            &[TabEvent::Opened {
                escrow_id: ESCROW,
                buyer,
                amount_wei: 3_000,
                deadline_s: now_s() + 3_600,
                reference: B256::repeat_byte(1),
                block: 1,
            }],
            &[],
            2,
            None,
        )
        .await
        .unwrap();
    let intake = Intake::new(books, market, [(CHAIN, settlement())], 60);

    let ca = DevCa::open_or_create(&scratch.dir).unwrap();
    let config = tls::server_config(ca.server_identity().unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(tls::serve_https(
        listener,
        config,
        app(AppState::with_intake(intake)),
        Limits::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    Exchange {
        url: format!("https://{addr}"),
        ca_pem: ca.cert_path(),
        _stop: stop,
        _scratch: scratch,
    }
}

fn request() -> InferenceRequest {
    InferenceRequest {
        prompt: "Say hello in one word.".into(),
        max_tokens: 16,
        ..Default::default()
    }
}

fn intent(nonce: u64, max_price_wei: u128) -> Intent {
    Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash: request_hash(&request()),
        deadline_s: now_s() + 30,
        max_price_wei,
        market_limit: false,
        // T0: one provider (T1 of class D is re-executed on a second one).
        min_tier: Tier::T0,
        determinism: DeterminismClass::D,
        tab_id: ESCROW,
        nonce,
        expiry_s: now_s() + 60,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_binds_submits_and_reads_its_job_and_tab_over_post_quantum_https() {
    let keys = AgentKeys::from_secrets(&[7; 32], Identity::from_seed([9; 32])).unwrap();
    let ex = exchange(keys.account()).await;
    let client = Client::new(&ex.url, Some(&ex.ca_pem)).unwrap();

    let tls = client.connection_info().await.unwrap().expect("https");
    assert_eq!(tls.key_exchange_group, "X25519MLKEM768");
    assert_eq!(tls.protocol_version, "TLSv1_3");
    assert_eq!(tls.alpn.as_deref(), Some("http/1.1"));
    assert_eq!(client.health().await.unwrap().status, "ok");

    let chains = client.chains().await.unwrap();
    assert_eq!(chains.len(), 1);
    assert_eq!(chains[0].chain_id, CHAIN);
    assert_eq!(chains[0].verifying_contract, settlement());
    let domain = chains[0].domain();
    let typed = client.eip712(Kind::Intent, CHAIN).await.unwrap();
    assert_eq!(typed["primaryType"], "Intent");
    assert!(
        client
            .models()
            .await
            .unwrap()
            .iter()
            .any(|m| m.shape.is_some())
    );
    assert_eq!(client.providers().await.unwrap().len(), 2);

    let bound = client
        .bind(&keys.binding(&domain, 0).unwrap())
        .await
        .unwrap();
    assert_eq!(bound.account, keys.account());
    assert_eq!(bound.mldsa_key_hash, keys.mldsa_key_hash());
    // Binding the same key again is a no-op.
    client
        .bind(&keys.binding(&domain, 0).unwrap())
        .await
        .unwrap();

    let signed = keys.sign(intent(1, 100_000), &domain).unwrap();
    let accepted = client.submit_intent(&signed, &request()).await.unwrap();
    assert_eq!(accepted.status, "assigned");
    assert_eq!(accepted.bundle_id, "warm");
    assert!(accepted.held_wei > 0 && accepted.held_wei <= 100_000);
    assert!(accepted.terms.total > 0.0);
    assert_eq!(
        accepted.terms.base_load, 0.0,
        "the warm bundle holds the base"
    );

    // Job reads are the buyer's: without its credential, 401; with it (a fresh signed read
    // credential per request), the job.
    match client.job(accepted.job_id).await {
        Err(cx_client::Error::Api { status: 401, .. }) => {}
        other => panic!("read without a credential: {other:?}"),
    }
    let client = client.with_credential(cx_client::Credential::Account(keys.signing_key().clone()));
    let job = client.job(accepted.job_id).await.unwrap();
    assert_eq!(job.decision.chosen.as_deref(), Some("warm"));
    assert_eq!(job.decision.terms, Some(accepted.terms));
    assert_eq!(job.decision.rejected_total, 1);
    let cold = job
        .decision
        .rejected
        .iter()
        .find(|r| r.id == "cold-cheap")
        .expect("the cheap bundle is explained");
    assert_eq!(cold.binding.to_string(), "deadline");
    assert_eq!(job.id, accepted.job_id);
    assert_eq!(job.account, keys.account());
    assert_eq!(job.escrow_id, ESCROW);
    assert_eq!(job.held_wei, accepted.held_wei);

    let mut query = JobsQuery {
        account: keys.account(),
        status: Some("assigned".into()),
        limit: Some(10),
    };
    let jobs = client.jobs(&query).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, accepted.job_id);
    query.status = Some("done & dusted".into());
    assert!(client.jobs(&query).await.unwrap().is_empty());

    let tab = client.tab(CHAIN, ESCROW).await.unwrap();
    assert_eq!(tab.buyer, keys.account());
    assert_eq!(tab.amount_wei, 3_000);
    assert_eq!(tab.held_wei, accepted.held_wei);
    assert_eq!(tab.status, "open");

    // Another intent with the same nonce: refused, the server's code and field arrive typed.
    let replay = keys.sign(intent(1, 90_000), &domain).unwrap();
    let err = client.submit_intent(&replay, &request()).await.unwrap_err();
    assert!(matches!(err, Error::Api { .. }), "{err}");
    assert_eq!(err.code(), Some("nonce_reused"), "{err}");
    assert_eq!(err.field(), Some("intent.order.nonce"));
    assert_eq!(err.status(), Some(409));

    // Unknown resources are typed too.
    let err = client.tab(CHAIN, 99).await.unwrap_err();
    assert_eq!(err.code(), Some("not_found"), "{err}");
    assert_eq!(err.status(), Some(404));

    // The pool kept the connection: the key exchange still reads the hybrid group.
    let tls = client.connection_info().await.unwrap().expect("https");
    assert_eq!(tls.key_exchange_group, "X25519MLKEM768");
    assert!(client.metrics().await.unwrap().contains("intents"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_intents_arrive_as_typed_errors_and_a_client_without_the_ca_cannot_connect() {
    let keys = AgentKeys::from_secrets(&[8; 32], Identity::from_seed([10; 32])).unwrap();
    let ex = exchange(keys.account()).await;
    let client = Client::new(&ex.url, Some(&ex.ca_pem)).unwrap();
    let domain = client.chains().await.unwrap()[0].domain();

    // Unbound: the co-signature's key is unknown.
    let signed = keys.sign(intent(1, 100_000), &domain).unwrap();
    let err = client.submit_intent(&signed, &request()).await.unwrap_err();
    assert_eq!(err.code(), Some("cosignature_unbound"), "{err}");
    assert_eq!(err.status(), Some(401));

    client
        .bind(&keys.binding(&domain, 0).unwrap())
        .await
        .unwrap();
    // A request other than the one the intent hashed.
    let other = InferenceRequest {
        prompt: "Something else".into(),
        max_tokens: 16,
        ..Default::default()
    };
    let err = client.submit_intent(&signed, &other).await.unwrap_err();
    assert_eq!(err.code(), Some("request_hash_mismatch"), "{err}");
    assert_eq!(err.field(), Some("request"));

    // A price limit below every ask: no bundle can take it, and the line says so.
    let cheap = keys.sign(intent(2, 1), &domain).unwrap();
    let err = client.submit_intent(&cheap, &request()).await.unwrap_err();
    assert_eq!(err.code(), Some("no_match"), "{err}");
    assert_eq!(err.status(), Some(422));
    assert!(err.to_string().starts_with("no_match (HTTP 422)"), "{err}");

    // Mozilla's roots do not include the development CA: the handshake fails, named.
    let stranger = Client::new(&ex.url, None).unwrap();
    let err = stranger.health().await.unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}

#[test]
fn the_client_hashes_requests_exactly_as_the_exchange_does() {
    for (prompt, max_tokens) in [
        ("Say hello in one word.", 16),
        ("", 0),
        ("quotes \" and \\ backslashes, tabs\t, newlines\n", 1),
        ("non-ASCII: résumé, 東京, emoji 🦀, control \u{1}", u32::MAX),
    ] {
        let ours = InferenceRequest {
            prompt: prompt.into(),
            max_tokens,
            ..Default::default()
        };
        let theirs = cx_exchange_server::intake::InferenceRequest {
            prompt: prompt.into(),
            max_tokens,
            ..Default::default()
        };
        assert_eq!(
            request_hash(&ours),
            cx_exchange_server::intake::request_hash(&theirs),
            "{prompt:?}"
        );
    }
}
