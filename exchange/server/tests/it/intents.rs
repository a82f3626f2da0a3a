//! `POST /v1/intents` end to end on a real PostgreSQL, signed with the protocol's signer: a good
//! intent is cleared onto the bundle that holds its base and held on its tab; every bad input is
//! refused with our JSON error, the right status and no row written.

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
use cx_exchange_server::limits::RateConfig;
use cx_exchange_server::market::Market;
use cx_protocol::order::{self, Binding, Intent, SigningKey};
use cx_protocol::pq::Identity;
use cx_protocol::{Bundle, DeterminismClass, Tier};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const CHAIN: u64 = 31337;
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

struct World {
    _db: TestDb,
    books: Books,
    router: Router,
    key: SigningKey,
    pq: Identity,
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

async fn world() -> World {
    let db = TestDb::new().await;
    let books = db.books().await;
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    // A cheap bundle that would have to pull 16 GB over 1 Gb/s (128 s), and a dearer one that
    // holds the base.
    market
        .register(&books, bundle("cold-cheap", 100_000, false))
        .await
        .unwrap();
    market
        .register(&books, bundle("warm", 1_000_000, true))
        .await
        .unwrap();
    World::new(db, books, market).await
}

impl World {
    /// The exchange over `market`, an agent bound over the API and its tab open on chain.
    async fn new(db: TestDb, books: Books, market: Market) -> World {
        Self::limited(db, books, market, RateConfig::default()).await
    }

    /// [`World::new`] under the rate limits `limits`.
    async fn limited(db: TestDb, books: Books, market: Market, limits: RateConfig) -> World {
        Self::configured(db, books, market, |intake| intake.with_rate_limits(limits)).await
    }

    /// [`World::new`] with its intake as `configure` makes it.
    async fn configured(
        db: TestDb,
        books: Books,
        market: Market,
        configure: impl FnOnce(Intake) -> Intake,
    ) -> World {
        let key = SigningKey::from_slice(&[7; 32]).unwrap();
        let pq = Identity::from_seed([9; 32]);
        let account = order::account_of(&key);
        books
            .apply_chain(
                CHAIN,
                &[TabEvent::Opened {
                    escrow_id: 3,
                    buyer: account,
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
        let intake = configure(Intake::new(
            books.clone(),
            market,
            [(CHAIN, settlement())],
            60,
        ));
        let w = World {
            _db: db,
            books,
            router: app(AppState::with_intake(intake)),
            key,
            pq,
        };
        let binding = Binding::sign(&w.key, &w.pq, &order::domain(CHAIN, settlement()), 0).unwrap();
        let (status, body) = w
            .send("/v1/bindings", &serde_json::to_value(&binding).unwrap())
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(
            body["mldsa_key_hash"],
            B256::from(w.pq.public().id().0).to_string()
        );
        w
    }
}

fn request() -> InferenceRequest {
    InferenceRequest {
        prompt: "Say hello in one word.".into(),
        max_tokens: 16,
        ..Default::default()
    }
}

fn intent(nonce: u64) -> Intent {
    Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash: request_hash(&request()),
        deadline_s: now_s() + 30,
        max_price_wei: 100_000,
        market_limit: false,
        // T0: clearing, not verification (T1 of class D is re-executed on a second provider;
        // see `verification.rs`).
        min_tier: Tier::T0,
        determinism: DeterminismClass::D,
        tab_id: 3,
        nonce,
        expiry_s: now_s() + 60,
    }
}

impl World {
    fn body(&self, intent: Intent) -> Value {
        let signed = order::sign(
            intent,
            &order::domain(CHAIN, settlement()),
            &self.key,
            &self.pq,
        )
        .unwrap();
        json!({ "intent": signed, "request": request() })
    }

    async fn post(&self, body: &Value) -> (StatusCode, Value) {
        self.send("/v1/intents", body).await
    }

    async fn send(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.call(
            Request::post(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
    }

    /// `GET path` as the buyer (`key`'s read credential).
    async fn read(&self, path: &str) -> (StatusCode, Value) {
        crate::common::read_as(&self.router, &self.key, path).await
    }

    async fn call(&self, request: Request<Body>) -> (StatusCode, Value) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn rows(&self) -> (i64, i64, String) {
        let count = |t: &'static str| async move {
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {t}"))
                .fetch_one(self.books.pool())
                .await
                .unwrap()
        };
        let held = self.books.tab(CHAIN, 3).await.unwrap().unwrap().held_wei;
        (
            count("exchange_orders").await,
            count("exchange_jobs").await,
            held.to_string(),
        )
    }
}

#[tokio::test]
async fn a_signed_intent_is_cleared_onto_the_bundle_that_holds_its_base_and_held_on_its_tab() {
    let w = world().await;
    let (status, body) = w.post(&w.body(intent(1))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["bundle_id"], "warm");
    assert_eq!(body["status"], "assigned");
    assert!(body["terms"]["total"].is_number());
    let held: u128 = body["held_wei"].as_str().unwrap().parse().unwrap();
    assert!(held > 0 && held <= 100_000);

    let id = body["job_id"].as_str().unwrap();
    let (status, job) = w.read(&format!("/v1/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["status"], "assigned");
    assert_eq!(job["decision"]["chosen"], "warm");
    assert!(job["decision"]["terms"]["base_load"].is_number());
    assert_eq!(job["decision"]["rejected_total"], 1);
    let cold = &job["decision"]["rejected"][0];
    assert_eq!(cold["id"], "cold-cheap", "the cheap bundle is explained");
    assert_eq!(cold["binding"], "deadline");
    assert!(cold["factor"].as_f64().unwrap() > 1.0);
    let account = order::account_of(&w.key);
    let (status, list) = w
        .read(&format!("/v1/jobs?account={account}&status=assigned"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list.as_array().unwrap().len(), 1);
    let (_, tab) = w
        .call(
            Request::get(format!("/v1/tabs/{CHAIN}/3"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(tab["held_wei"], held.to_string());

    let (status, typed) = w
        .call(
            Request::get(format!("/v1/eip712/intent?chain_id={CHAIN}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(typed["primaryType"], "Intent");
    assert_eq!(typed["domain"]["chainId"], CHAIN);
}

#[tokio::test]
async fn every_bad_intent_is_refused_with_its_code_and_writes_nothing() {
    let w = world().await;
    let first = w.body(intent(1));
    let (status, _) = w.post(&first).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let before = w.rows().await;

    let mut cases: Vec<(&str, Value, StatusCode, &str)> = Vec::new();
    let mut same_nonce = intent(1);
    same_nonce.max_price_wei = 99_999;
    cases.push((
        "another order, same nonce",
        w.body(same_nonce),
        StatusCode::CONFLICT,
        "nonce_reused",
    ));
    cases.push((
        "the same order again",
        first.clone(),
        StatusCode::CONFLICT,
        "order_exists",
    ));
    let mut wrong_domain = w.body(intent(2));
    wrong_domain["intent"]["chain_id"] = json!(1);
    cases.push((
        "other chain",
        wrong_domain,
        StatusCode::BAD_REQUEST,
        "unknown_chain",
    ));
    let other_contract = {
        let signed = order::sign(
            intent(2),
            &order::domain(CHAIN, Address::repeat_byte(1)),
            &w.key,
            &w.pq,
        )
        .unwrap();
        json!({ "intent": signed, "request": request() })
    };
    cases.push((
        "other contract",
        other_contract,
        StatusCode::UNAUTHORIZED,
        "wrong_domain",
    ));
    let mut no_cosig = w.body(intent(2));
    no_cosig["intent"]["mldsa_signature"] = json!("0x");
    cases.push((
        "no co-signature",
        no_cosig,
        StatusCode::UNAUTHORIZED,
        "cosignature_missing",
    ));
    let mut no_sig = w.body(intent(2));
    no_sig["intent"]["signature"] = json!("0x");
    cases.push((
        "no signature",
        no_sig,
        StatusCode::UNAUTHORIZED,
        "signature_missing",
    ));
    let mut tampered = w.body(intent(2));
    tampered["intent"]["order"]["max_price_wei"] = json!("99999999");
    cases.push(("tampered order", tampered, StatusCode::UNAUTHORIZED, ""));
    let mut expired = intent(2);
    expired.expiry_s = now_s() - 1;
    cases.push((
        "expired",
        w.body(expired),
        StatusCode::BAD_REQUEST,
        "expired",
    ));
    let mut late = intent(2);
    late.deadline_s = now_s() - 1;
    cases.push((
        "deadline passed",
        w.body(late),
        StatusCode::BAD_REQUEST,
        "deadline_passed",
    ));
    let mut unknown_tab = intent(2);
    unknown_tab.tab_id = 99;
    cases.push((
        "unknown tab",
        w.body(unknown_tab),
        StatusCode::NOT_FOUND,
        "unknown_tab",
    ));
    let mut dear = intent(2);
    dear.max_price_wei = 1;
    cases.push((
        "limit below every ask",
        w.body(dear),
        StatusCode::UNPROCESSABLE_ENTITY,
        "no_match",
    ));
    let mut zero = intent(2);
    zero.max_price_wei = 0;
    cases.push(("zero limit", w.body(zero), StatusCode::BAD_REQUEST, ""));
    let mut model = intent(2);
    model.want = "gpt-nothing".into();
    cases.push((
        "unknown model",
        w.body(model),
        StatusCode::NOT_FOUND,
        "unknown_model",
    ));
    let mut tier = intent(2);
    tier.min_tier = Tier::T3;
    cases.push((
        "tier no one offers",
        w.body(tier),
        StatusCode::UNPROCESSABLE_ENTITY,
        "no_match",
    ));
    let mut hash = w.body(intent(2));
    hash["request"]["max_tokens"] = json!(17);
    cases.push((
        "request not the signed one",
        hash,
        StatusCode::BAD_REQUEST,
        "request_hash_mismatch",
    ));
    let mut unknown_field = w.body(intent(2));
    unknown_field["priority"] = json!(1);
    cases.push((
        "unknown field",
        unknown_field,
        StatusCode::BAD_REQUEST,
        "invalid_field",
    ));
    let unbound = {
        let stranger = SigningKey::from_slice(&[8; 32]).unwrap();
        let signed = order::sign(
            intent(2),
            &order::domain(CHAIN, settlement()),
            &stranger,
            &w.pq,
        )
        .unwrap();
        json!({ "intent": signed, "request": request() })
    };
    cases.push((
        "unbound account",
        unbound,
        StatusCode::UNAUTHORIZED,
        "cosignature_unbound",
    ));

    for (what, body, status, code) in cases {
        let (got, err) = w.post(&body).await;
        assert_eq!(got, status, "{what}: {err}");
        assert!(err["error"]["message"].is_string(), "{what}: {err}");
        if !code.is_empty() {
            assert_eq!(err["error"]["code"], code, "{what}: {err}");
        }
        assert_eq!(w.rows().await, before, "{what} wrote something");
    }
    let (status, err) = w.post(&json!("not an object")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let metrics = w
        .router
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&metrics);
    assert!(text.contains("cx_intents_accepted_total 1\n"), "{text}");
    assert!(
        text.contains("cx_intents_refused_total{code=\"nonce_reused\"} 1\n"),
        "{text}"
    );

    // Overspending the tab: 3 000 wei at ~900 per job.
    let mut accepted = 1;
    for nonce in 10..30 {
        let (status, err) = w.post(&w.body(intent(nonce))).await;
        match status {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::PAYMENT_REQUIRED => assert_eq!(err["error"]["code"], "tab_overspent"),
            other => panic!("{other}: {err}"),
        }
    }
    let tab = w.books.tab(CHAIN, 3).await.unwrap().unwrap();
    assert!(tab.held_wei <= tab.amount_wei);
    assert!(accepted > 1 && accepted < 21, "{accepted}");
    assert!(
        tab.available_wei() < tab.held_wei / accepted,
        "the tab is spent to within one job"
    );
}

#[tokio::test]
async fn a_binding_must_verify_both_ways_and_a_key_binds_one_account() {
    let w = world().await;
    let domain = order::domain(CHAIN, settlement());
    // Binding the same key again is a no-op.
    let again = Binding::sign(&w.key, &w.pq, &domain, 1).unwrap();
    let (status, _) = w
        .send("/v1/bindings", &serde_json::to_value(&again).unwrap())
        .await;
    assert_eq!(status, StatusCode::CREATED);
    // Another account claiming the same key: the key's half names the first account.
    let stranger = SigningKey::from_slice(&[8; 32]).unwrap();
    let mut stolen =
        serde_json::to_value(Binding::sign(&stranger, &w.pq, &domain, 0).unwrap()).unwrap();
    let (status, err) = w.send("/v1/bindings", &stolen).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["error"]["code"], "key_bound");
    // A binding whose account was swapped after signing verifies for no one.
    stolen["account"] = json!(order::account_of(&w.key));
    let (status, err) = w.send("/v1/bindings", &stolen).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{err}");
    // The account's key is still the first one.
    let other = Identity::from_seed([3; 32]);
    let swap = Binding::sign(&w.key, &other, &domain, 2).unwrap();
    let (status, err) = w
        .send("/v1/bindings", &serde_json::to_value(&swap).unwrap())
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["error"]["code"], "account_bound");
}

fn put(path: &str, body: &Value, authorization: &str) -> Request<Body> {
    Request::put(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, authorization)
        .body(Body::from(body.to_string()))
        .unwrap()
}

#[tokio::test]
async fn adapters_are_stored_by_content_served_back_and_priced_by_their_bytes() {
    use base64::Engine as _;
    let w = world().await;
    let data: Vec<u8> = (0..64u8).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4, 4], &data).unwrap();
    let weights = safetensors::serialize(
        [(
            "base_model.model.layers.0.self_attn.q_proj.lora_A.weight",
            view,
        )],
        None,
    )
    .unwrap();
    let config = r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}"#;
    let files = json!({
        "adapter_config": config,
        "adapter_model_safetensors_base64": base64::engine::general_purpose::STANDARD.encode(&weights),
    });
    let (_, exchange) = w
        .call(Request::get("/v1/exchange").body(Body::empty()).unwrap())
        .await;
    let store = crate::common::credential_at(
        exchange["mldsa_key_hash"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap(),
        &w.key,
        cx_protocol::access::Scope::Store,
    );
    let (status, stored) = w.call(put("/v1/adapters", &files, &store)).await;
    assert_eq!(status, StatusCode::CREATED, "{stored}");
    let id = stored["id"].as_str().unwrap().to_owned();
    assert_eq!(
        id,
        cx_protocol::content_id(&[
            ("adapter_config.json", config.as_bytes()),
            ("adapter_model.safetensors", &weights)
        ])
    );
    assert_eq!(stored["bytes"], config.len() + weights.len());
    let (status, again) = w.call(put("/v1/adapters", &files, &store)).await;
    assert_eq!(
        (status, again["created"].clone()),
        (StatusCode::OK, json!(false))
    );

    // An id names exactly the bytes it hashes; broken files are refused by name.
    let mut wrong = files.clone();
    wrong["id"] = json!("00".repeat(32));
    let mut not_base64 = files.clone();
    not_base64["adapter_model_safetensors_base64"] = json!("%%%");
    let mut not_safetensors = files.clone();
    not_safetensors["adapter_model_safetensors_base64"] = json!("aGVsbG8=");
    let mut not_json = files.clone();
    not_json["adapter_config"] = json!("{peft");
    for (body, field) in [
        (wrong, "id"),
        (not_base64, "adapter_model_safetensors_base64"),
        (not_safetensors, "adapter_model_safetensors_base64"),
        (not_json, "adapter_config"),
    ] {
        let (status, err) = w.call(put("/v1/adapters", &body, &store)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
        assert_eq!(err["error"]["field"], field, "{err}");
    }

    let (status, back) = w.read(&format!("/v1/adapters/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(back["adapter_config"], config);
    assert_eq!(
        back["adapter_model_safetensors_base64"],
        files["adapter_model_safetensors_base64"]
    );
    let (status, _) = w.read(&format!("/v1/adapters/{}", "ab".repeat(32))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // An intent naming the adapter: no bundle holds it, so clearing prices its load (μ2).
    let mut with_adapter = intent(1);
    with_adapter.adapter_id = Some(id.parse().unwrap());
    let (status, body) = w.post(&w.body(with_adapter)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(
        body["terms"]["adapter_load"].as_f64().unwrap() > 0.0,
        "{body}"
    );
    let mut unknown = intent(2);
    unknown.adapter_id = Some(B256::repeat_byte(0xab));
    let (status, err) = w.post(&w.body(unknown)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(err["error"]["code"], "unknown_adapter");
}

#[tokio::test]
async fn min_tier_is_the_weakest_accepted_a_stronger_one_clears_when_none_offers_it() {
    let db = TestDb::new().await;
    let books = db.books().await;
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    // Tiers that need no second provider: T1 of class S is byte-compared with nothing (T1 of
    // class D and T3 are replicated, and a one-provider fleet refuses them: `verification.rs`);
    // and a T2-only bundle takes products, never inference (T2 is Freivalds' check).
    let mut strong = bundle("t1-only", 1_000_000, true);
    strong.tiers = [Tier::T1].into_iter().collect();
    market.register(&books, strong).await.unwrap();
    let mut t2 = bundle("t2-only", 1_000, true);
    t2.tiers = [Tier::T2].into_iter().collect();
    market.register(&books, t2).await.unwrap();
    let mut weak = bundle("t0", 1_000_000, true);
    weak.tiers = [Tier::T0].into_iter().collect();
    weak.determinism = [DeterminismClass::D].into_iter().collect();
    market.register(&books, weak).await.unwrap();
    let w = World::new(db, books, market).await;
    // T0 is offered: cleared at T0, on the T0 bundle.
    let (status, body) = w.post(&w.body(intent(1))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        (body["tier"].clone(), body["bundle_id"].clone()),
        (json!("T0"), json!("t0"))
    );
    // No bundle offers T0 for class S: the first stronger tier someone offers, T1 (never the
    // cheaper T2-only bundle).
    let mut sampled = intent(2);
    sampled.determinism = DeterminismClass::S;
    let (status, body) = w.post(&w.body(sampled)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        (body["tier"].clone(), body["bundle_id"].clone()),
        (json!("T1"), json!("t1-only"))
    );
    let id = body["job_id"].as_str().unwrap();
    let (_, job) = w.read(&format!("/v1/jobs/{id}")).await;
    assert_eq!(job["decision"]["tier"], "T1");
}

#[tokio::test]
async fn a_server_without_books_says_so() {
    let response = app(AppState::new())
        .oneshot(Request::get("/v1/models").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// `POST /v1/intents` with `body`, as a client sends it.
fn intent_request(body: &Value) -> Request<Body> {
    Request::post("/v1/intents")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// Sends every body to `POST /v1/intents` at once, each on its own task (its own connection to
/// the database); the answers in order.
async fn concurrently(w: &World, bodies: Vec<Value>) -> Vec<(StatusCode, Value)> {
    let mut tasks = Vec::new();
    for body in bodies {
        let router = w.router.clone();
        tasks.push(tokio::spawn(async move {
            let response = router.oneshot(intent_request(&body)).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// Double-spend attempts from many connections at once: one signed intent sent sixteen times
/// is accepted once (its nonce is spent once), and forty intents racing for a tab that holds
/// about three never hold more than it has — each refused one a 402, never a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_spends_on_one_tab_hold_at_most_what_it_has_and_spend_a_nonce_once() {
    let w = world().await;
    let same = w.body(intent(1));
    let answers = concurrently(&w, vec![same; 16]).await;
    let accepted = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::ACCEPTED)
        .count();
    assert_eq!(accepted, 1, "{answers:?}");
    for (status, err) in answers.iter().filter(|(s, _)| *s != StatusCode::ACCEPTED) {
        assert!(status.is_client_error(), "{status}: {err}");
        assert!(err["error"]["code"].is_string(), "{status}: {err}");
    }
    let (orders, jobs, _) = w.rows().await;
    assert_eq!((orders, jobs), (1, 1));

    let bodies: Vec<Value> = (100..140).map(|n| w.body(intent(n))).collect();
    let answers = concurrently(&w, bodies).await;
    let mut held_by_accepted: u128 = 0;
    let mut accepted = 0;
    for (status, body) in &answers {
        match *status {
            StatusCode::ACCEPTED => {
                accepted += 1;
                held_by_accepted += body["held_wei"].as_str().unwrap().parse::<u128>().unwrap();
            }
            StatusCode::PAYMENT_REQUIRED => assert_eq!(body["error"]["code"], "tab_overspent"),
            other => panic!("{other}: {body}"),
        }
    }
    let tab = w.books.tab(CHAIN, 3).await.unwrap().unwrap();
    assert!(tab.held_wei <= tab.amount_wei, "{tab:?}");
    let first: u128 = tab.held_wei - held_by_accepted;
    assert!(first > 0, "the first intent's hold is still there");
    assert!((1..40).contains(&accepted), "{accepted}");
    assert!(
        tab.available_wei() < first,
        "the tab is spent to within one job: {tab:?}"
    );
    let (orders, jobs, _) = w.rows().await;
    assert_eq!((orders, jobs), (1 + accepted, 1 + accepted));
}

/// Past its limits a client gets 429 `rate_limited` with `Retry-After`, and nothing is written:
/// signed orders per account (counted once both signatures hold), requests per IP address (the
/// accept loop tags each with its peer; here over plain HTTP on loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_rate_limits_a_client_gets_429_with_retry_after_and_nothing_is_written() {
    let db = TestDb::new().await;
    let books = db.books().await;
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    market
        .register(&books, bundle("warm", 1_000_000, true))
        .await
        .unwrap();
    let limits = RateConfig {
        ip_per_s: 1,
        ip_burst: 4,
        account_per_s: 1,
        account_burst: 2,
    };
    let w = World::limited(db, books, market, limits).await;
    for nonce in 1..=2 {
        let (status, body) = w.post(&w.body(intent(nonce))).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    let before = w.rows().await;
    let response = w
        .router
        .clone()
        .oneshot(intent_request(&w.body(intent(3))))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = response.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert_eq!(
        w.rows().await,
        before,
        "a limited order writes nothing, spends no nonce"
    );
    // Its nonce is not spent: once the bucket refills, the same order goes through.
    tokio::time::sleep(std::time::Duration::from_secs(retry)).await;
    let (status, body) = w.post(&w.body(intent(3))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    // Per IP address, over a real socket: four at once, then 429 until the bucket refills.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cx_exchange_server::tls::serve_insecure_http(
        listener,
        w.router.clone(),
        cx_exchange_server::tls::Limits::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(plain_get(address, "/healthz").await);
    }
    assert!(
        statuses[..4].iter().all(|s| *s == (200, None)),
        "{statuses:?}"
    );
    assert_eq!(statuses[4].0, 429, "{statuses:?}");
    assert!(
        statuses[4].1.is_some(),
        "a 429 says when to retry: {statuses:?}"
    );
    let _ = stop.send(());
    server.await.unwrap();
}

/// `GET path` over plain HTTP/1.1 on a fresh connection: the status and `Retry-After`, if any.
async fn plain_get(address: std::net::SocketAddr, path: &str) -> (u16, Option<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let retry = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("retry-after:"))
        .map(|l| l["retry-after:".len()..].trim().to_owned());
    (status, retry)
}

/// Past the bound on requests doing work at once (1 here), a request is answered 503
/// `overloaded` with `Retry-After` at once, nothing done; requests that wait by design (health)
/// are not counted; the one in flight finishes, and the next goes through. The request in flight
/// is held by a lock on its tab that another connection takes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_in_flight_a_request_is_shed_with_503_and_retry_after() {
    let db = TestDb::new().await;
    let books = db.books().await;
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    market
        .register(&books, bundle("warm", 1_000_000, true))
        .await
        .unwrap();
    let w = World::configured(db, books, market, |intake| intake.with_max_in_flight(1)).await;
    let mut lock = w.books.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM exchange_tabs WHERE escrow_id = 3 FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let held = {
        let router = w.router.clone();
        let request = intent_request(&w.body(intent(1)));
        tokio::spawn(async move { router.oneshot(request).await.unwrap().status() })
    };
    // Until the intent waits on the tab's lock.
    let waited = std::time::Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND datname = current_database()",
        )
        .fetch_one(w.books.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(waited.elapsed() < std::time::Duration::from_secs(10));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let before = w.rows().await;
    let response = w
        .router
        .clone()
        .oneshot(intent_request(&w.body(intent(2))))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    let health = w
        .router
        .clone()
        .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK, "health is not counted");
    lock.commit().await.unwrap();
    assert_eq!(held.await.unwrap(), StatusCode::ACCEPTED);
    let after = w.rows().await;
    assert_eq!(after.0, before.0 + 1, "only the held order was written");
    let (status, body) = w.post(&w.body(intent(2))).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "the shed order goes through now: {body}"
    );
}

#[tokio::test]
async fn a_signed_market_intent_clears_under_the_quote_and_its_flag_is_signed() {
    let db = TestDb::new().await;
    let books = db.books().await;
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    // Three bundles holding the base; the median ask (the market's reference) is 1 M wei/s.
    for (id, ask) in [
        ("warm-a", 1_000_000),
        ("warm-b", 1_000_000),
        ("dear", 9_000_000),
    ] {
        market
            .register(&books, bundle(id, ask, true))
            .await
            .unwrap();
    }
    let w = World::new(db, books, market).await;
    let mut market_intent = intent(1);
    market_intent.market_limit = true;
    let body = w.body(market_intent);
    assert_eq!(body["intent"]["order"]["market_limit"], true);

    // The flag is part of what the buyer signed: a relayer cannot turn it off (nor on).
    let mut flipped = body.clone();
    flipped["intent"]["order"]["market_limit"] = json!(false);
    let (status, refused) = w.post(&flipped).await;
    assert!(status.is_client_error(), "{status} {refused}");
    assert_eq!(w.rows().await.1, 0, "nothing written");

    let (status, accepted) = w.post(&body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["job_id"].as_str().unwrap();
    let (_, job) = w.read(&format!("/v1/jobs/{id}")).await;
    let quote = &job["decision"]["quote"];
    let ask: u64 = quote["ask_wei_per_s"].as_str().unwrap().parse().unwrap();
    assert!((1_000_000..9_000_000).contains(&ask), "{quote}");
    let dear = job["decision"]["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "dear")
        .expect("the bundle asking over the quote is refused");
    assert_eq!(dear["binding"], "price", "{dear}");
    // A limit in wei is not gated by the quote: the decision has none.
    let (status, fixed) = w.post(&w.body(intent(2))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{fixed}");
    let (_, job) = w
        .read(&format!("/v1/jobs/{}", fixed["job_id"].as_str().unwrap()))
        .await;
    assert!(job["decision"].get("quote").is_none(), "{job}");
}

#[tokio::test]
async fn a_market_intent_is_refused_when_the_quote_costs_more_than_the_tab_holds() {
    let db = TestDb::new().await;
    let books = db.books().await;
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    // At 30 M wei/s the job costs tens of thousands of wei: within the signed cap of 100 000,
    // beyond the 3 000 the tab holds.
    for id in ["warm-a", "warm-b"] {
        market
            .register(&books, bundle(id, 30_000_000, true))
            .await
            .unwrap();
    }
    let w = World::new(db, books, market).await;
    let before = w.rows().await;
    let mut market_intent = intent(1);
    market_intent.market_limit = true;
    let (status, body) = w.post(&w.body(market_intent)).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
    assert_eq!(body["error"]["code"], "tab_overspent", "{body}");
    assert_eq!(w.rows().await, before, "nothing written, nothing held");
}

/// A signed intent may name a task: it is routed to a catalog model (the 202 says which, the
/// decision why) under the same signature; a fan-out is the door's and refused here, with a
/// task the router does not know, and nothing is written.
#[tokio::test]
async fn a_signed_intent_naming_a_task_is_routed_and_its_decision_says_to_which_model() {
    let w = world().await;
    let mut task = intent(1);
    task.want = "task:chat".into();
    let (status, body) = w.post(&w.body(task)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // The only model served is the 8B one (the others gated: no bundle holds or can fetch
    // them in time).
    assert_eq!(body["routed_to"], "llama-3.1-8b-instruct", "{body}");
    assert_eq!(body["bundle_id"], "warm", "{body}");
    let (_, job) = w
        .read(&format!("/v1/jobs/{}", body["job_id"].as_str().unwrap()))
        .await;
    let route = &job["decision"]["route"];
    assert_eq!(route["target"], "task:chat", "{job}");
    assert_eq!(route["arm"], "llama-3.1-8b-instruct", "{route}");
    assert!(!route["gated"].as_array().unwrap().is_empty(), "{route}");
    assert_eq!(job["model"], "llama-3.1-8b-instruct", "{job}");

    let before = w.rows().await;
    for (nonce, want, says) in [
        (2, "cx/fanout:2", "OpenAI door"),
        (3, "task:poetry", "unknown task"),
    ] {
        let mut bad = intent(nonce);
        bad.want = want.into();
        let (status, refused) = w.post(&w.body(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{want}: {refused}");
        assert_eq!(refused["error"]["field"], "intent.order.want", "{refused}");
        assert!(
            refused["error"]["message"].as_str().unwrap().contains(says),
            "{refused}"
        );
    }
    assert_eq!(w.rows().await, before, "nothing written");
}
