//! The explorer on a real PostgreSQL: jobs made through the real path (a provider's signed offer,
//! a bound agent's signed intents, the provider's pulls and signed receipts), a posted settlement
//! batch written as the coordinator writes its outbox, then every page read as HTML and as JSON.

use crate::common::TestDb;
use alloy::primitives::{Address, B256};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use cx_exchange::objective::Weights;
use cx_exchange::routing::catalog::Catalog;
use cx_exchange_server::api::{AppState, app};
use cx_exchange_server::books::{Books, TabEvent};
use cx_exchange_server::intake::{InferenceRequest, Intake, request_hash};
use cx_exchange_server::market::Market;
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order::{self, Binding, Intent, SigningKey};
use cx_protocol::pq::Identity;
use cx_protocol::receipt::{Receipt, SignedReceipt};
use cx_protocol::{Bundle, DeterminismClass, Tier};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tower::ServiceExt;

const CHAIN: u64 = 31337;
const OTHER_CHAIN: u64 = 31338;
const CATALOG: &str = include_str!("../../../core/catalog.example.toml");
const PAYOUT: Address = Address::repeat_byte(0x77);
/// An operator name no page may emit as markup.
const HOSTILE: &str = "<script>alert(\"op\")</script>";
const TX_MAIN: B256 = B256::repeat_byte(0xab);
const TX_OTHER: B256 = B256::repeat_byte(0xcd);

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn domain() -> order::Eip712Domain {
    order::domain(CHAIN, Address::repeat_byte(0x5e))
}

/// A bundle that holds the base, and one too small for it (refused on memory).
fn bundles() -> Vec<Bundle> {
    let bundle = |id: &str, memory_bytes: u64, resident: bool| -> Bundle {
        serde_json::from_value(json!({
            "id": id, "provider": HOSTILE, "device": "H200", "price_wei_per_s": "1000000",
            "memory_bytes": memory_bytes, "bandwidth_bps": 1e10, "rtt_s": 0.01,
            "flops_per_s": 4e14, "context_max": 32768, "determinism": ["D", "S"],
            "tiers": ["T0", "T1"],
            "resident_bases": if resident { vec!["llama-3.1-8b-instruct"] } else { vec![] },
        }))
        .unwrap()
    };
    vec![
        bundle("warm", 80_000_000_000, true),
        bundle("tiny", 1_000_000_000, false),
    ]
}

struct World {
    _db: TestDb,
    books: Books,
    router: Router,
    key: SigningKey,
    pq: Identity,
    provider: Identity,
    token: String,
    /// The exchange's identity id, which read credentials name.
    exchange: B256,
}

fn request() -> InferenceRequest {
    InferenceRequest {
        prompt: "Say hello in one word.".into(),
        max_tokens: 16,
        ..Default::default()
    }
}

impl World {
    async fn new() -> Self {
        let db = TestDb::new().await;
        let books = db.books().await;
        let market =
            Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
        let key = SigningKey::from_slice(&[7; 32]).unwrap();
        let pq = Identity::from_seed([9; 32]);
        books
            .apply_chain(
                CHAIN,
                &[TabEvent::Opened {
                    escrow_id: 3,
                    buyer: order::account_of(&key),
                    amount_wei: 3_000_000,
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
        let intake = Intake::new(
            books.clone(),
            market,
            [(CHAIN, Address::repeat_byte(0x5e))],
            60,
        );
        let exchange = intake.identity().public().id().0.into();
        let state = AppState::with_intake(intake)
            .with_chain_explorers([(CHAIN, "https://scan.example/".to_owned())]);
        let w = World {
            _db: db,
            books,
            router: app(state),
            key,
            pq,
            provider: Identity::from_seed([4; 32]),
            token: "provider-token-4".to_owned(),
            exchange,
        };
        let binding = Binding::sign(&w.key, &w.pq, &domain(), 0).unwrap();
        let (status, body) = w
            .post(
                "/v1/bindings",
                None,
                &serde_json::to_value(&binding).unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let offer = Offer {
            operator: HOSTILE.into(),
            payout: PAYOUT,
            bundles: bundles(),
            token_hash: Offer::token_hash_of(w.token.as_bytes()),
            issued_at_s: now_s(),
            residency: None,
            search_trials_per_s: None,
        };
        let offer = serde_json::to_value(SignedOffer::sign(offer, &w.provider).unwrap()).unwrap();
        let (status, body) = w.post("/v1/providers/register", None, &offer).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        w
    }

    fn account(&self) -> Address {
        order::account_of(&self.key)
    }

    fn provider_key(&self) -> B256 {
        B256::from(self.provider.id().0)
    }

    /// Submits a signed intent; returns the job id.
    async fn intent(&self, nonce: u64) -> B256 {
        let intent = Intent {
            want: "llama-8b".into(),
            adapter_id: None,
            request_hash: request_hash(&request()),
            deadline_s: now_s() + 60,
            max_price_wei: 1_000_000,
            market_limit: false,
            // T1 of class S: priced at T1, not re-executed (byte equality needs class D; the
            // replication pages are in `verification.rs`).
            min_tier: Tier::T1,
            determinism: DeterminismClass::S,
            tab_id: 3,
            nonce,
            expiry_s: now_s() + 60,
        };
        let signed = order::sign(intent, &domain(), &self.key, &self.pq).unwrap();
        let (status, body) = self
            .post(
                "/v1/intents",
                None,
                &json!({ "intent": signed, "request": request() }),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["bundle_id"], "warm");
        body["job_id"].as_str().unwrap().parse().unwrap()
    }

    /// The provider pulls up to `n` jobs and returns each with a receipt charging half its
    /// price; returns what each was charged, by job id.
    async fn run_jobs(&self, n: u32) -> Vec<(B256, u128)> {
        let (status, pulled) = self
            .post(
                "/v1/providers/jobs",
                Some(&self.token),
                &json!({"max_jobs": n, "wait_s": 1}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pulled}");
        let mut done = Vec::new();
        for job in pulled["jobs"].as_array().unwrap() {
            let job_id: B256 = job["job_id"].as_str().unwrap().parse().unwrap();
            let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
            let text = "Hello.";
            let receipt = SignedReceipt::sign(
                Receipt {
                    job_id: job_id.0,
                    chain_id: CHAIN,
                    escrow_id: 3,
                    input_hash: request_hash(&request()).0,
                    output_hash: Sha256::digest(text.as_bytes()).into(),
                    adapter_hash: [0; 32],
                    tokens: 8, // the output's prompt_tokens + completion_tokens
                    compute_ms: 5,
                    class: DeterminismClass::D,
                    provider: PAYOUT.0.0,
                    provider_key: self.provider.id().0,
                    amount_owed_wei: price / 2,
                    buyer: self.account().0.0,
                },
                &self.provider,
            )
            .unwrap();
            let output = json!({"text": text, "finish_reason": "stop", "prompt_tokens": 6,
                                "completion_tokens": 2});
            let (status, body) = self
                .post(
                    &format!("/v1/jobs/{job_id}/result"),
                    Some(&self.token),
                    &json!({"output": output, "receipt": receipt}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            done.push((job_id, price / 2));
        }
        done
    }

    /// Batch 1 as the coordinator leaves it once posted on both chains: the job's receipt in
    /// it, a part per chain with its transaction, the steps it logged.
    async fn settle(&self, job: B256, charged: u128) {
        let pool = self.books.pool();
        let receipt: (String,) =
            sqlx::query_as("SELECT receipt::text FROM exchange_receipts WHERE job_id = $1")
                .bind(job.as_slice())
                .fetch_one(pool)
                .await
                .unwrap();
        // What the coordinator keeps per job: the voucher (order, assignment, receipt).
        let voucher = json!({
            "authority": {"intent": {}},
            "assignment": {"assignment": {"price_wei": (charged * 2).to_string()},
                           "signature": "0x01"},
            "receipt": serde_json::from_str::<Value>(&receipt.0).unwrap(),
        });
        sqlx::query("INSERT INTO settlement_batches (id) VALUES (1)")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO settlement_receipts (job_id, chain_id, escrow_id, voucher, batch_id) \
             VALUES ($1, $2, 3, $3::jsonb, 1)",
        )
        .bind(job.as_slice())
        .bind(CHAIN as i64)
        .bind(voucher.to_string())
        .execute(pool)
        .await
        .unwrap();
        let account = self.account().to_string();
        for (chain, nonce, tx, body) in [
            (
                CHAIN,
                1i64,
                TX_MAIN,
                json!({"receipts": [voucher.clone()],
                       "new_balances": [[PAYOUT.to_string(), format!("{charged}")],
                                        [account, "0x64"]],
                       "gas_used": "84000"}),
            ),
            (
                OTHER_CHAIN,
                1i64,
                TX_OTHER,
                json!({"receipts": [], "new_balances": [], "gas_used": "50000"}),
            ),
        ] {
            sqlx::query(
                "INSERT INTO settlement_batch_parts (batch_id, chain_id, nonce, digest, body, \
                 status, signature, tx_hash) VALUES (1, $1, $2, $3, $4::jsonb, 'posted', $5, $6)",
            )
            .bind(chain as i64)
            .bind(nonce)
            .bind(B256::repeat_byte(0x11).as_slice())
            .bind(body.to_string())
            .bind(vec![1u8; 65])
            .bind(tx.as_slice())
            .execute(pool)
            .await
            .unwrap();
            for (step, detail) in [
                ("built", "nonce 1, 1 receipts".to_owned()),
                (
                    "signed",
                    "digest 0x11, sent with balance changes; signers [1, 2, 4]".to_owned(),
                ),
                ("posted", format!("tx {tx}")),
            ] {
                sqlx::query(
                    "INSERT INTO settlement_steps (batch_id, chain_id, step, detail) \
                     VALUES (1, $1, $2, $3)",
                )
                .bind(chain as i64)
                .bind(step)
                .bind(detail)
                .execute(pool)
                .await
                .unwrap();
            }
        }
    }

    async fn post(&self, path: &str, bearer: Option<&str>, body: &Value) -> (StatusCode, Value) {
        let mut request = Request::post(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = self
            .router
            .clone()
            .oneshot(request.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// GET as a browser asks: the HTML page.
    async fn html(&self, path: &str) -> (StatusCode, String) {
        let response = self
            .router
            .clone()
            .oneshot(
                Request::get(path)
                    .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let content_type = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("text/html"),
            "{path}: {content_type}"
        );
        let csp = response.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(
            csp.starts_with("default-src 'none'"),
            "{path}: no script may run: {csp}"
        );
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// GET with `Accept: application/json`: the same data.
    async fn json(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .router
            .clone()
            .oneshot(
                Request::get(path)
                    .header(header::ACCEPT, "application/json")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }
}

/// Three jobs: the oldest settled in batch 1, the next done (not batched), the newest assigned.
async fn market() -> (World, [B256; 3], u128) {
    let w = World::new().await;
    let first = w.intent(1).await;
    let done = w.run_jobs(1).await;
    assert_eq!(done[0].0, first);
    let second = w.intent(2).await;
    let done2 = w.run_jobs(1).await;
    assert_eq!(done2[0].0, second);
    let third = w.intent(3).await;
    w.settle(first, done[0].1).await;
    (w, [first, second, third], done[0].1 + done2[0].1)
}

#[tokio::test]
async fn a_settled_job_shows_its_order_decision_receipt_batch_and_transactions() {
    let (w, [settled, _, _], _) = market().await;
    let path = format!("/explorer/jobs/{settled}");

    let (status, page) = w.html(&path).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("<dd id=\"status\"><span class=\"badge s-settled\">settled</span></dd>"),
        "{page}"
    );
    assert!(page.contains("id=\"cost-terms\""));
    for term in [
        "compute",
        "latency",
        "failure",
        "verification",
        "deadline-risk",
        "base-load",
        "adapter-load",
        "total",
    ] {
        assert!(page.contains(&format!("id=\"term-{term}\"")), "term {term}");
    }
    // The refused bundle, with its binding constraint and factor.
    assert!(page.contains("<tr id=\"rejected-tiny\">"), "{page}");
    assert!(page.contains("<span class=\"binding\">memory</span>"));
    assert!(page.contains("<dd id=\"chosen-bundle\">warm</dd>"));
    assert!(page.contains("<dd id=\"beta\">1 (resident)</dd>"));
    assert!(page.contains("<dd id=\"alpha\">1 (no adapter)</dd>"));
    // The transaction on each chain: linked where the chain has an explorer (EIP-3091).
    assert!(page.contains(&format!(
        "<a id=\"tx-{CHAIN}\" class=\"tx\" href=\"https://scan.example/tx/{TX_MAIN}\">"
    )));
    assert!(page.contains(&format!(
        "<code id=\"tx-{OTHER_CHAIN}\" class=\"tx\">{TX_OTHER}</code>"
    )));
    // Links to the batch and the provider.
    assert!(page.contains("<a id=\"batch-link\" href=\"/explorer/batches/1\">"));
    assert!(page.contains(&format!(
        "<a id=\"provider-link\" href=\"/explorer/providers/{}\">",
        w.provider_key()
    )));
    assert!(page.contains("id=\"receipt-amount\""));
    assert!(page.contains("id=\"verification-cost\""));
    assert!(
        page.contains("id=\"event-2\""),
        "three events: assigned, running, done"
    );
    assert!(!page.contains("<script"), "the operator's name is escaped");
    assert!(
        !page.contains("Say hello"),
        "the buyer's request is not shown"
    );

    let (status, job) = w.json(&path).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["id"], settled.to_string());
    assert_eq!(job["status"], "settled");
    assert_eq!(job["job_status"], "done");
    assert_eq!(job["tier"], "T1");
    assert_eq!(job["decision"]["chosen"], "warm");
    let terms = job["decision"]["terms"].as_object().unwrap();
    for key in [
        "compute",
        "latency",
        "failure",
        "verification",
        "deadline_risk",
        "base_load",
        "adapter_load",
        "total",
        "completion_s",
    ] {
        assert!(terms[key].is_number(), "{key}: {terms:?}");
    }
    let rejected = &job["decision"]["rejected"][0];
    assert_eq!(rejected["id"], "tiny");
    assert_eq!(rejected["binding"], "memory");
    assert!(rejected["factor"].as_f64().unwrap() > 1.0, "{rejected}");
    assert_eq!(job["residency"]["base_resident"], true);
    assert_eq!(job["order"]["kind"], "intent");
    assert_eq!(job["order"]["signed"]["order"]["nonce"], 1);
    assert_eq!(
        job["assignment"]["provider_key_hash"],
        w.provider_key().to_string()
    );
    assert_eq!(
        job["assignment"]["signed"]["assignment"]["price_wei"], job["assignment"]["price_wei"],
        "the voucher's signed assignment is shown"
    );
    let price: u128 = job["assignment"]["price_wei"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        job["receipt"]["amount_owed_wei"],
        (price / 2).to_string(),
        "the receipt charged half the assigned price"
    );
    assert_eq!(job["verification"]["tier"], "T1");
    assert!(job["verification"]["cost"].is_number());
    assert_eq!(job["settlement"]["state"], "settled");
    assert_eq!(job["settlement"]["batch_id"], 1);
    let parts = job["settlement"]["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0]["tx_hash"], TX_MAIN.to_string());
    assert_eq!(
        parts[0]["tx_url"],
        format!("https://scan.example/tx/{TX_MAIN}")
    );
    assert_eq!(parts[1]["tx_url"], Value::Null);
    let states: Vec<&str> = job["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["assigned", "running", "done"]);
}

#[tokio::test]
async fn the_jobs_list_filters_and_pages_newest_first() {
    let (w, [settled, done, assigned], _) = market().await;
    let ids = |v: &Value| -> Vec<String> {
        v["jobs"]
            .as_array()
            .unwrap_or_else(|| panic!("not a page of jobs: {v}"))
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, all) = w.json("/explorer/jobs").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(
        ids(&all),
        [assigned.to_string(), done.to_string(), settled.to_string()]
    );
    assert_eq!(all["next"], Value::Null);
    let account = w.account().to_string();
    let provider = w.provider_key().to_string();
    for (query, expect) in [
        ("status=settled".to_owned(), vec![settled]),
        ("status=done".to_owned(), vec![done]),
        ("status=assigned".to_owned(), vec![assigned]),
        ("status=expired".to_owned(), vec![]),
        ("tier=T1".to_owned(), vec![assigned, done, settled]),
        ("tier=T2".to_owned(), vec![]),
        (format!("account={account}"), vec![assigned, done, settled]),
        (format!("account={}", Address::repeat_byte(1)), vec![]),
        (format!("provider={provider}&status=done"), vec![done]),
        (
            "model=llama-3.1-8b-instruct&status=settled".to_owned(),
            vec![settled],
        ),
        ("model=other".to_owned(), vec![]),
        (format!("adapter={}", "ab".repeat(32)), vec![]),
    ] {
        let (status, page) = w.json(&format!("/explorer/jobs?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}: {page}");
        let want: Vec<String> = expect.iter().map(|i| i.to_string()).collect();
        assert_eq!(ids(&page), want, "{query}");
    }

    // The filter form as a browser submits it, every field empty: no filter at all.
    let (status, page) = w
        .json("/explorer/jobs?account=&provider=&model=&adapter=&tier=&status=&limit=25")
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(ids(&page).len(), 3);

    // Two per page: the cursor leads to the rest, and so does ?page=2.
    let (_, first) = w.json("/explorer/jobs?limit=2").await;
    assert_eq!(ids(&first), [assigned.to_string(), done.to_string()]);
    let next = first["next"].as_str().unwrap().to_owned();
    assert_eq!(next, format!("/explorer/jobs?limit=2&before={done}"));
    let (_, second) = w.json(&next).await;
    assert_eq!(ids(&second), [settled.to_string()]);
    assert_eq!(second["next"], Value::Null);
    let (_, by_number) = w.json("/explorer/jobs?limit=2&page=2").await;
    assert_eq!(ids(&by_number), [settled.to_string()]);

    let (status, page) = w.html("/explorer/jobs?limit=2").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(&format!("<tr id=\"job-{assigned}\">")));
    assert!(page.contains(&format!(
        "<a id=\"next-page\" href=\"/explorer/jobs?limit=2&amp;before={done}\">"
    )));
    assert!(page.contains(&format!("href=\"/explorer/jobs/{assigned}\"")));
    let (_, page) = w.html("/explorer/jobs").await;
    assert!(
        page.contains("href=\"/explorer/batches/1\""),
        "settled → its batch"
    );
}

#[tokio::test]
async fn bad_filters_are_a_400_and_unknown_jobs_a_404_in_either_format() {
    let (w, _, _) = market().await;
    for (query, field) in [
        ("status=bogus", Some("status")),
        ("tier=T9", Some("tier")),
        ("account=0x12", Some("account")),
        ("provider=nope", Some("provider")),
        ("adapter=xyz", Some("adapter")),
        ("limit=0", Some("limit")),
        ("limit=101", Some("limit")),
        ("page=0", Some("page")),
        (
            "page=2&before=0x0000000000000000000000000000000000000000000000000000000000000001",
            Some("before"),
        ),
        (
            "before=0x0000000000000000000000000000000000000000000000000000000000000001",
            Some("before"),
        ),
        ("color=red", None),
    ] {
        let (status, body) = w.json(&format!("/explorer/jobs?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_field", "{query}: {body}");
        if let Some(field) = field {
            assert_eq!(body["error"]["field"], field, "{query}: {body}");
        }
        let (status, page) = w.html(&format!("/explorer/jobs?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert!(
            page.contains("<dd id=\"error-code\">invalid_field</dd>"),
            "{page}"
        );
    }
    let unknown = format!("/explorer/jobs/{}", B256::repeat_byte(0x42));
    let (status, body) = w.json(&unknown).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
    assert_eq!(body["error"]["message"], "no such job");
    let (status, page) = w.html(&unknown).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(page.contains("<dd id=\"error-message\">no such job</dd>"));
    let (status, body) = w.json("/explorer/jobs/nope").await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (StatusCode::BAD_REQUEST, &json!("id"))
    );
    for path in [
        "/explorer/batches/7",
        "/explorer/providers/0x0000000000000000000000000000000000000000000000000000000000000007",
        "/explorer/accounts/0x0000000000000000000000000000000000000007",
        "/explorer/no-such-page",
    ] {
        let (status, _) = w.json(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        let (status, _) = w.html(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn a_hostile_string_is_escaped_wherever_it_is_shown() {
    let (w, _, _) = market().await;
    let hostile = "%3Cscript%3Ealert(1)%3C%2Fscript%3E%22%3E";
    let (status, page) = w.html(&format!("/explorer/jobs?model={hostile}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("<script"), "{page}");
    assert!(page.contains("value=\"&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;\""));
    // The provider's operator name, on the provider pages.
    let (_, list) = w.html("/explorer/providers").await;
    let (_, one) = w
        .html(&format!("/explorer/providers/{}", w.provider_key()))
        .await;
    for page in [list, one] {
        assert!(!page.contains("<script"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(&quot;op&quot;)&lt;/script&gt;"));
    }
}

#[tokio::test]
async fn batches_providers_markets_and_accounts_show_what_the_books_hold() {
    let (w, [settled, _, _], earned) = market().await;

    // The batch: size, gas, gas per job, signers, chains, transactions, its job.
    let (status, page) = w.html("/explorer/batches/1").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("<dd id=\"batch-size\">1</dd>"));
    assert!(page.contains("<dd id=\"gas\">134000</dd>"));
    assert!(page.contains("<dd id=\"gas-per-job\">134000</dd>"));
    assert!(page.contains("<dd id=\"signers\">1, 2, 4</dd>"));
    assert!(page.contains(&format!("<dd id=\"chains\">{CHAIN}, {OTHER_CHAIN}</dd>")));
    assert!(page.contains(&format!("href=\"https://scan.example/tx/{TX_MAIN}\"")));
    assert!(page.contains(&format!(
        "<a class=\"job-link\" href=\"/explorer/jobs/{settled}\">"
    )));
    let (_, batch) = w.json("/explorer/batches/1").await;
    assert_eq!(batch["size"], 1);
    assert_eq!(batch["status"], "posted");
    assert_eq!(batch["gas_per_job"], 134_000);
    assert_eq!(batch["signers"], json!(["1", "2", "4"]));
    assert_eq!(batch["jobs"][0]["job_id"], settled.to_string());
    let (_, list) = w.json("/explorer/batches").await;
    assert_eq!(list["batches"][0]["id"], 1);
    let (status, page) = w.html("/explorer/batches").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<tr id=\"batch-1\">"));

    // The provider: asks, residency, failure rate, earnings.
    let key = w.provider_key();
    let (status, provider) = w.json(&format!("/explorer/providers/{key}")).await;
    assert_eq!(status, StatusCode::OK, "{provider}");
    assert_eq!(provider["completed"], 2);
    assert_eq!(provider["failed"], 0);
    assert_eq!(provider["open"], 1);
    assert_eq!(provider["failure_rate"], 0.0);
    assert_eq!(provider["earnings_wei"], earned.to_string());
    assert_eq!(provider["stake_wei"], Value::Null);
    assert_eq!(
        provider["stakes"],
        json!([]),
        "no chain to read a stake from"
    );
    let bundles = provider["bundles"].as_array().unwrap();
    assert_eq!(bundles.len(), 2);
    assert_eq!(bundles[1]["id"], "warm");
    assert_eq!(
        bundles[1]["resident_bases"],
        json!(["llama-3.1-8b-instruct"])
    );
    assert_eq!(bundles[1]["live"], true);
    let (_, page) = w.html(&format!("/explorer/providers/{key}")).await;
    assert!(page.contains("<dd id=\"asks\">1000000 wei per compute-second</dd>"));
    assert!(page.contains("<dd id=\"failure-rate\">0.0 %"));
    assert!(page.contains(&format!("<dd id=\"earnings\">{earned} wei</dd>")));
    assert!(page.contains("id=\"residency\""));
    assert!(page.contains("llama-3.1-8b-instruct"));
    assert!(page.contains(&format!("href=\"/explorer/jobs?provider={key}\"")));
    let (_, list) = w.json("/explorer/providers").await;
    assert_eq!(list["providers"][0]["key_hash"], key.to_string());

    // The markets: quotes with bid < ask, and the chart of what jobs paid.
    let (status, markets) = w.json("/explorer/markets").await;
    assert_eq!(status, StatusCode::OK);
    let quote = markets["quotes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["model"] == "llama-3.1-8b-instruct" && q["tier"] == "T1")
        .unwrap();
    let (bid, ask): (u64, u64) = (
        quote["bid_wei_per_s"].as_str().unwrap().parse().unwrap(),
        quote["ask_wei_per_s"].as_str().unwrap().parse().unwrap(),
    );
    assert!(bid < ask, "{quote}");
    assert_eq!(markets["history"].as_array().unwrap().len(), 3);
    let (_, page) = w.html("/explorer/markets").await;
    assert!(page.contains("<tr id=\"quote-llama-3-1-8b-instruct-t1\">"));
    assert!(page.contains("<svg id=\"price-chart\""));
    assert!(page.contains("<polyline id=\"series-llama-3-1-8b-instruct-t1\""));
    // The quotes over time: two samples (as the sweep takes them), the regime changing between.
    assert!(page.contains("<p id=\"quote-chart\" class=\"empty\">"));
    let sample = |bid: u64, regime| cx_exchange_server::books::MarketQuote {
        model: "llama-3.1-8b-instruct".into(),
        tier: Tier::T1,
        bid_wei_per_s: bid,
        ask_wei_per_s: bid + 100,
        regime,
        belief: [1.0, 0.0, 0.0],
        observations: 1,
        reference_wei_per_s: bid + 50,
    };
    use cx_exchange::pricing::hmm::Regime;
    w.books
        .record_quotes(&[sample(900, Regime::Calm)])
        .await
        .unwrap();
    w.books
        .record_quotes(&[sample(1_200, Regime::Surge)])
        .await
        .unwrap();
    let history = w.books.quote_history(10).await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|q| (q.bid_wei_per_s, q.ask_wei_per_s, q.regime.as_str()))
            .collect::<Vec<_>>(),
        [(900, 1_000, "calm"), (1_200, 1_300, "surge")]
    );
    let (_, page) = w.html("/explorer/markets").await;
    assert!(page.contains("<svg id=\"quote-chart\""), "{page}");
    assert!(page.contains("<polyline id=\"series-llama-3-1-8b-instruct-t1-bid\""));
    assert!(page.contains("<polyline id=\"series-llama-3-1-8b-instruct-t1-ask\""));
    assert!(page.contains("<table id=\"regimes\""), "{page}");
    let (_, markets) = w.json("/explorer/markets").await;
    assert_eq!(markets["quote_history"].as_array().unwrap().len(), 2);

    // The account: its tab (amount, held, spent, settled) and its claim.
    let account = w.account();
    let (status, acct) = w.json(&format!("/explorer/accounts/{account}")).await;
    assert_eq!(status, StatusCode::OK, "{acct}");
    let tab = &acct["tabs"][0];
    assert_eq!(tab["amount_wei"], "3000000");
    assert_eq!(tab["spent_wei"], earned.to_string());
    assert_eq!(tab["jobs"], 3);
    assert_eq!(tab["open_jobs"], 1);
    assert_eq!(tab["status"], "open");
    assert_eq!(acct["claims"][0]["chain_id"], CHAIN);
    assert_eq!(acct["claims"][0]["cumulative_wei"], "100");
    let (_, page) = w.html(&format!("/explorer/accounts/{account}")).await;
    assert!(page.contains(&format!("<tr id=\"tab-{CHAIN}-3\">")));
    assert!(page.contains(&format!("<tr id=\"claim-{CHAIN}\">")));
    let (_, list) = w.json("/explorer/accounts").await;
    assert_eq!(
        list["accounts"][0]["account"],
        account.to_string().to_lowercase()
    );

    // The index links to all of it.
    let (status, page) = w.html("/explorer").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(
        "<a class=\"card\" id=\"count-settled\" href=\"/explorer/jobs?status=settled\"><b>1</b>"
    ));
    for nav in ["jobs", "batches", "providers", "markets", "accounts"] {
        assert!(page.contains(&format!("id=\"nav-{nav}\"")));
    }
    let (_, index) = w.json("/explorer").await;
    assert_eq!(index["recent_batches"][0]["id"], 1);
    assert!(
        index["statuses"]
            .as_array()
            .unwrap()
            .contains(&json!({"status": "settled", "jobs": 1})),
        "{index}"
    );
}

/// A continuation is cleared onto the bundle whose provider reports holding its conversation
/// prefix (SPEC §4), beside an otherwise equal one; the decision names the prefix and the hit,
/// in the API and on the explorer's job page.
#[tokio::test]
async fn a_continuation_goes_to_the_prefix_holder_and_its_page_names_the_hit() {
    let w = World::new().await;
    let turn1 = order::chat_prompt([("user", "Name a colour.")]);
    let reply = "Blue.";
    let next = order::chat_prompt([
        ("user", "Name a colour."),
        ("assistant", reply),
        ("user", "Another?"),
    ]);
    let model = "llama-3.1-8b-instruct";
    let held = cx_protocol::prefix::held_prefix_id(model, None, &turn1, reply).unwrap();
    // A second provider, its bundle the same as `warm`, reporting the prefix in its residency.
    let holder_identity = Identity::from_seed([5; 32]);
    let mut holder: Bundle = bundles().remove(0);
    holder.id = "holder".into();
    holder.provider = "op-holder".into();
    let offer = Offer {
        operator: "op-holder".into(),
        // Its own on-chain identity: the T1 replica must run under another payout account.
        payout: Address::repeat_byte(0x5e),
        bundles: vec![holder],
        token_hash: Offer::token_hash_of(b"holder-token"),
        issued_at_s: now_s(),
        residency: Some(cx_protocol::offer::Residency {
            pinned_adapters: vec![],
            free_bytes: 1_000_000,
            slot_bytes: 0,
            slot_shadow_price: Some(0.0),
            prefixes: vec![held.clone()],
            prefix_bytes: vec![],
            bases: vec![],
        }),
        search_trials_per_s: None,
    };
    let offer = serde_json::to_value(SignedOffer::sign(offer, &holder_identity).unwrap()).unwrap();
    let (status, body) = w.post("/v1/providers/register", None, &offer).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let request = InferenceRequest {
        prompt: next,
        max_tokens: 4,
        ..Default::default()
    };
    let intent = Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash: request_hash(&request),
        deadline_s: now_s() + 60,
        max_price_wei: 1_000_000,
        market_limit: false,
        min_tier: Tier::T1,
        determinism: DeterminismClass::D,
        tab_id: 3,
        nonce: 1,
        expiry_s: now_s() + 60,
    };
    let signed = order::sign(intent, &domain(), &w.key, &w.pq).unwrap();
    let (status, body) = w
        .post(
            "/v1/intents",
            None,
            &json!({ "intent": signed, "request": request }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["bundle_id"], "holder", "{body}");
    assert_eq!(body["terms"]["prefix_hit"], true, "{body}");
    let job: B256 = body["job_id"].as_str().unwrap().parse().unwrap();

    let (status, detail) =
        crate::common::read_as(&w.router, &w.key, &format!("/v1/jobs/{job}")).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    let decision = &detail["decision"];
    assert_eq!(decision["prefix_id"], held.as_str(), "{decision}");
    // `warm` was feasible and ranked after: the prefix is a cost, not a filter.
    let feasible: Vec<&str> = decision["feasible"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(feasible, ["holder", "warm"], "{decision}");

    let (status, page) = w.html(&format!("/explorer/jobs/{job}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(&held), "{page}");
    assert!(page.contains("held by the chosen bundle"), "{page}");
    assert!(page.contains("prefix_miss"), "{page}");
}

/// `GET path` as JSON on `router`, from `client`'s address.
async fn json_from(router: &Router, path: &str, client: [u8; 4]) -> (StatusCode, Value) {
    call_from(router, "GET", path, None, client).await
}

/// `method path` on `router` from `client`'s address, with `authorization` if given; the answer
/// as JSON (`null` when it is not).
async fn call_from(
    router: &Router,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    client: [u8; 4],
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::ACCEPT, "application/json");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let mut request = request.body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            client, 40_000,
        ))));
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A node that does not write (a standby) serves the pages read from the books alone, and the
/// API's reads of the books (a job, an account's jobs, a tab) with the same credential checks,
/// from its own connection — the same answers as the writer's — under its own per-address
/// limits; a page the writer's engine holds, a job's cancel or event stream and every write go
/// to its forwarder.
#[tokio::test]
async fn a_node_that_does_not_write_serves_the_books_pages_as_the_writer_does() {
    let (w, [settled, _, _], _) = market().await;
    // What the standby does not answer itself goes to its forwarder: here, a teapot.
    let forwarded = Router::new().fallback(|| async { StatusCode::IM_A_TEAPOT });
    let reading = |limits| {
        cx_exchange_server::api::reads(
            AppState::reading(w.books.clone(), limits, w.exchange)
                .with_chain_explorers([(CHAIN, "https://scan.example/".to_owned())]),
            forwarded.clone(),
        )
    };
    let reads = reading(Default::default());
    let job = format!("/explorer/jobs/{settled}");
    for path in [
        "/explorer",
        "/explorer/jobs",
        "/explorer/jobs?status=settled",
        job.as_str(),
        "/explorer/batches",
        "/explorer/batches/1",
        "/explorer/providers",
        "/explorer/accounts",
    ] {
        let (status, from_writer) = w.json(path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {from_writer}");
        let (status, read_here) = json_from(&reads, path, [10, 0, 0, 1]).await;
        assert_eq!(status, StatusCode::OK, "{path}: {read_here}");
        assert_eq!(read_here, from_writer, "{path}");
    }
    let (status, refused) = json_from(&reads, "/explorer/jobs?status=nope", [10, 0, 0, 1]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    for engine in ["/explorer/markets", "/v1/market", "/explorer/accounts/0x00"] {
        let (status, _) = json_from(&reads, engine, [10, 0, 0, 1]).await;
        assert_eq!(status, StatusCode::IM_A_TEAPOT, "{engine}");
    }
    // The API's reads of the books: the buyer's job and jobs, a tab, with the same credential
    // checks and the same answers as the writer's.
    let read = crate::common::credential_at(w.exchange, &w.key, cx_protocol::access::Scope::Read);
    let buyer = order::account_of(&w.key);
    let job = format!("/v1/jobs/{settled}");
    let jobs = format!("/v1/jobs?account={buyer}");
    let tab = format!("/v1/tabs/{CHAIN}/3");
    for path in [job.as_str(), jobs.as_str(), tab.as_str()] {
        let (status, from_writer) =
            call_from(&w.router, "GET", path, Some(&read), [10, 0, 0, 1]).await;
        assert_eq!(status, StatusCode::OK, "{path}: {from_writer}");
        let (status, read_here) = call_from(&reads, "GET", path, Some(&read), [10, 0, 0, 1]).await;
        assert_eq!(status, StatusCode::OK, "{path}: {read_here}");
        assert_eq!(read_here, from_writer, "{path}");
    }
    let (status, refused) = call_from(&reads, "GET", &job, None, [10, 0, 0, 1]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    let other = SigningKey::from_slice(&[8; 32]).unwrap();
    let stranger =
        crate::common::credential_at(w.exchange, &other, cx_protocol::access::Scope::Read);
    let (status, _) = call_from(&reads, "GET", &job, Some(&stranger), [10, 0, 0, 1]).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another account's job is not found"
    );
    let elsewhere = crate::common::credential_at(
        B256::repeat_byte(3),
        &w.key,
        cx_protocol::access::Scope::Read,
    );
    let (status, _) = call_from(&reads, "GET", &job, Some(&elsewhere), [10, 0, 0, 1]).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a credential for another exchange"
    );
    // Cancelling, the event stream and every other method go to the writer.
    for (method, path) in [
        ("DELETE", job.clone()),
        ("GET", format!("{job}/events")),
        ("POST", "/v1/jobs".to_owned()),
        ("POST", "/v1/intents".to_owned()),
    ] {
        let (status, _) = call_from(&reads, method, &path, Some(&read), [10, 0, 0, 1]).await;
        assert_eq!(status, StatusCode::IM_A_TEAPOT, "{method} {path}");
    }
    // Its own limits per address: past the burst, 429; another address is not held back.
    let strict = reading(cx_exchange_server::limits::RateConfig {
        ip_per_s: 1,
        ip_burst: 2,
        ..Default::default()
    });
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(json_from(&strict, "/explorer/jobs", [10, 0, 0, 2]).await.0);
    }
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    let (status, _) = json_from(&strict, "/explorer/jobs", [10, 0, 0, 3]).await;
    assert_eq!(status, StatusCode::OK);
}
