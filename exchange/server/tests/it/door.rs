//! Session keys, the OpenAI-compatible door and dispatch, end to end on a real PostgreSQL: a
//! provider registers a signed offer, an agent's session key buys a chat completion, the provider
//! pulls the job and returns it with an ML-DSA-signed receipt, and the answer, the tab and the
//! session's cap agree. Every refusal is our JSON error and changes nothing.

use crate::common::TestDb;
use alloy::primitives::{Address, B256};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use cx_exchange::objective::Weights;
use cx_exchange::routing::catalog::Catalog;
use cx_exchange_server::api::{AppState, app};
use cx_exchange_server::books::{Books, JobStatus, TabEvent};
use cx_exchange_server::intake::{InferenceRequest, Intake, request_hash};
use cx_exchange_server::market::Market;
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order::{self, Binding, SessionGrant, SigningKey};
use cx_protocol::pq::Identity;
use cx_protocol::receipt::{Receipt, SignedReceipt};
use cx_protocol::{Bundle, DeterminismClass, Tier};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tower::ServiceExt;

const CHAIN: u64 = 31337;
const CATALOG: &str = include_str!("../../../core/catalog.example.toml");
const TAB_WEI: u128 = 3_000_000;
pub(crate) const PAYOUT: Address = Address::repeat_byte(0x77);

pub(crate) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub(crate) fn domain() -> order::Eip712Domain {
    order::domain(CHAIN, Address::repeat_byte(0x5e))
}

pub(crate) struct Door {
    _db: TestDb,
    pub(crate) books: Books,
    state: AppState,
    router: Router,
    pub(crate) key: SigningKey,
    pub(crate) pq: Identity,
}

pub(crate) fn bundle(id: &str) -> Bundle {
    serde_json::from_value(json!({
        "id": id, "provider": "op-a", "price_wei_per_s": "1000000",
        "memory_bytes": 80_000_000_000u64, "bandwidth_bps": 1e10, "rtt_s": 0.01,
        "flops_per_s": 4e14, "context_max": 32768, "determinism": ["D", "S"],
        "tiers": ["T0", "T1"], "resident_bases": ["llama-3.1-8b-instruct"],
    }))
    .unwrap()
}

/// A provider's identity and dispatch token.
pub(crate) struct Prov {
    pub(crate) id: Identity,
    pub(crate) token: String,
}

impl Prov {
    pub(crate) fn new(seed: u8) -> Self {
        Self {
            id: Identity::from_seed([seed; 32]),
            token: format!("provider-token-{seed}"),
        }
    }

    pub(crate) fn offer(&self, bundles: Vec<Bundle>) -> Value {
        self.offer_with(bundles, None, None)
    }

    /// An offer with a residency report and a search rate.
    pub(crate) fn offer_with(
        &self,
        bundles: Vec<Bundle>,
        residency: Option<cx_protocol::offer::Residency>,
        search_trials_per_s: Option<u64>,
    ) -> Value {
        let offer = Offer {
            operator: "op-a".into(),
            payout: PAYOUT,
            bundles,
            token_hash: Offer::token_hash_of(self.token.as_bytes()),
            issued_at_s: now_s(),
            residency,
            search_trials_per_s,
        };
        serde_json::to_value(SignedOffer::sign(offer, &self.id).unwrap()).unwrap()
    }
}

impl Door {
    pub(crate) async fn new() -> Self {
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
                    amount_wei: TAB_WEI,
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
        let state = AppState::with_intake(intake);
        let door = Door {
            _db: db,
            books,
            router: app(state.clone()),
            state,
            key,
            pq,
        };
        let binding = Binding::sign(&door.key, &door.pq, &domain(), 0).unwrap();
        let (status, body) = door
            .post(
                "/v1/bindings",
                None,
                &serde_json::to_value(&binding).unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        door
    }

    /// Signs and stores a grant whose bearer secret is `secret`.
    pub(crate) async fn session(
        &self,
        secret: &str,
        cap_wei: u128,
        nonce: u64,
    ) -> (StatusCode, Value) {
        let grant = SessionGrant {
            tab_id: 3,
            spend_cap_wei: cap_wei,
            expiry_s: now_s() + 600,
            default_deadline_s: 20,
            // T0: these calls are about the door, not verification (T1 of class D would be
            // re-executed on a second provider; see `verification.rs`).
            default_tier: Tier::T0,
            default_determinism: DeterminismClass::D,
            default_max_price_wei: 1_000_000,
            bearer_hash: SessionGrant::bearer_hash_of(secret.as_bytes()),
            nonce,
        };
        let signed = order::sign(grant, &domain(), &self.key, &self.pq).unwrap();
        self.post("/v1/sessions", None, &json!({ "grant": signed }))
            .await
    }

    pub(crate) async fn post(
        &self,
        path: &str,
        bearer: Option<&str>,
        body: &Value,
    ) -> (StatusCode, Value) {
        let mut request = Request::post(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        self.call(request.body(Body::from(body.to_string())).unwrap())
            .await
    }

    /// The raw response body of `request` (an explorer page's HTML).
    pub(crate) async fn text(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    pub(crate) fn router(&self) -> &Router {
        &self.router
    }

    /// The buyer's (`key`'s) signed credential for `scope`.
    pub(crate) fn credential(&self, scope: cx_protocol::access::Scope) -> String {
        crate::common::credential(self.intake(), &self.key, scope)
    }

    /// `GET path` as the buyer (`key`'s read credential).
    pub(crate) async fn read(&self, path: &str) -> (StatusCode, Value) {
        crate::common::read_as(&self.router, &self.key, path).await
    }

    pub(crate) async fn call(&self, request: Request<Body>) -> (StatusCode, Value) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub(crate) async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(self.books.pool())
            .await
            .unwrap()
    }

    /// The intake behind the door (sweeps and fills at a chosen time).
    pub(crate) fn intake(&self) -> &Intake {
        self.state.serving().expect("the door serves")
    }

    /// Sends a door call under session key `bearer` in the background (it would wait for a
    /// provider) and returns the decision of the job it placed, read from the books.
    pub(crate) async fn placed_decision(&self, bearer: &str, call: &Value) -> Value {
        let request = Request::post("/v1/chat/completions")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {bearer}"))
            .body(Body::from(call.to_string()))
            .unwrap();
        let before = self.count("exchange_jobs").await;
        let router = self.router.clone();
        let waiting = tokio::spawn(async move { router.oneshot(request).await });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.count("exchange_jobs").await == before {
            assert!(
                !waiting.is_finished(),
                "the call ended without placing a job"
            );
            assert!(std::time::Instant::now() < deadline, "no job placed");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        waiting.abort();
        sqlx::query_scalar("SELECT decision FROM exchange_jobs ORDER BY created_at DESC LIMIT 1")
            .fetch_one(self.books.pool())
            .await
            .unwrap()
    }

    /// `prov`'s pull of at most `max_jobs`, waiting up to `wait_s`: the jobs handed out.
    pub(crate) async fn pull(&self, prov: &Prov, max_jobs: u32, wait_s: u64) -> Vec<Value> {
        let (status, pulled) = self
            .post(
                "/v1/providers/jobs",
                Some(&prov.token),
                &json!({"max_jobs": max_jobs, "wait_s": wait_s}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pulled}");
        pulled["jobs"].as_array().unwrap().clone()
    }

    /// `prov` answers pulled `job` with `text` and a receipt owing its whole price (asserted
    /// taken).
    pub(crate) async fn answer(&self, prov: &Prov, job: &Value, text: &str) {
        let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
        let id = job["job_id"].as_str().unwrap();
        let (status, done) = self
            .post(
                &format!("/v1/jobs/{id}/result"),
                Some(&prov.token),
                &json!({"output": output(text), "receipt": receipt(prov, job, text, price)}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
    }

    pub(crate) async fn held(&self) -> u128 {
        self.books.tab(CHAIN, 3).await.unwrap().unwrap().held_wei
    }
}

pub(crate) fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "llama-8b",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The receipt a provider signs for `job` and `text`.
pub(crate) fn receipt(
    prov: &Prov,
    job: &Value,
    text: &str,
    amount_owed_wei: u128,
) -> SignedReceipt {
    let request: InferenceRequest = serde_json::from_value(job["request"].clone()).unwrap();
    let buyer: Address = job["buyer"].as_str().unwrap().parse().unwrap();
    let job_id: B256 = job["job_id"].as_str().unwrap().parse().unwrap();
    SignedReceipt::sign(
        Receipt {
            job_id: job_id.0,
            chain_id: job["chain_id"].as_u64().unwrap(),
            escrow_id: job["escrow_id"].as_u64().unwrap(),
            input_hash: request_hash(&request).0,
            output_hash: Sha256::digest(text.as_bytes()).into(),
            adapter_hash: [0; 32],
            tokens: 14, // output()'s prompt_tokens + completion_tokens
            compute_ms: 5,
            class: DeterminismClass::D,
            provider: PAYOUT.0.0,
            provider_key: prov.id.id().0,
            amount_owed_wei,
            buyer: buyer.0.0,
        },
        &prov.id,
    )
    .unwrap()
}

/// `signed`'s receipt changed by `change`, signed again by `prov`.
fn resigned(
    prov: &Prov,
    signed: SignedReceipt,
    change: impl FnOnce(&mut Receipt),
) -> SignedReceipt {
    let mut r = signed.receipt;
    change(&mut r);
    SignedReceipt::sign(r, &prov.id).unwrap()
}

pub(crate) fn output(text: &str) -> Value {
    json!({"text": text, "finish_reason": "length", "prompt_tokens": 6, "completion_tokens": 8})
}

#[tokio::test]
async fn a_session_key_buys_a_chat_completion_a_provider_returns_with_a_signed_receipt() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer(vec![bundle("warm")]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["key_hash"], B256::from(prov.id.id().0).to_string());
    // The market maker quotes every model × tier off the fleet's asks.
    let (status, market) = door
        .call(Request::get("/v1/market").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    let quote = market
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["model"] == "llama-3.1-8b-instruct" && q["tier"] == "T1")
        .expect("a T1 market for the catalog model");
    let (bid, ask): (u64, u64) = (
        quote["bid_wei_per_s"].as_str().unwrap().parse().unwrap(),
        quote["ask_wei_per_s"].as_str().unwrap().parse().unwrap(),
    );
    assert!(0 < bid && bid < ask, "{quote}");
    assert_eq!(quote["reference_wei_per_s"], "1000000");
    assert!(quote["regime"].is_string());
    let (status, opened) = door.session("cxs_secret", 1_000_000, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");
    // The grant's co-signature is stored as its bytes, and read back in place under `grant`.
    let (stored, in_body, whole): (Vec<u8>, String, String) = sqlx::query_as(
        "SELECT o.mldsa_signature, o.body #>> '{grant,mldsa_signature}', \
                exchange_order_body(o) #>> '{grant,mldsa_signature}' \
         FROM exchange_orders o WHERE kind = 'session_grant'",
    )
    .fetch_one(door.books.pool())
    .await
    .unwrap();
    assert_eq!(stored.len(), 3309);
    assert_eq!(in_body, "0x");
    assert_eq!(whole, format!("0x{}", hex::encode(&stored)));

    // The call waits for the provider; the provider pulls, runs and answers meanwhile.
    let agent = async {
        door.post(
            "/v1/chat/completions",
            Some("cxs_secret"),
            &chat(json!({"cx": {"deadline_in_s": 20}, "temperature": 0.7, "top_p": 0.95})),
        )
        .await
    };
    let provider = async {
        let (status, pulled) = door
            .post(
                "/v1/providers/jobs",
                Some(&prov.token),
                &json!({"max_jobs": 4, "wait_s": 10}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pulled}");
        let job = pulled["jobs"][0].clone();
        assert_eq!(pulled["jobs"].as_array().unwrap().len(), 1);
        // What was asked is what is run: the messages (the provider renders them with its
        // model's template) and the sampling, with the seed the exchange drew for the call.
        assert_eq!(
            job["request"]["messages"],
            json!([{"role": "user", "content": "Say hello."}])
        );
        assert!(job["request"].get("prompt").is_none(), "{job}");
        assert_eq!(job["request"]["max_tokens"], 8);
        let sampling = &job["request"]["sampling"];
        assert_eq!(
            (&sampling["temperature_milli"], &sampling["top_p_milli"]),
            (&json!(700), &json!(950))
        );
        assert!(sampling["seed"].is_u64(), "{sampling}");
        // The exchange signed the terms for this provider's key, under the key it publishes.
        let (_, exchange) = door
            .call(Request::get("/v1/exchange").body(Body::empty()).unwrap())
            .await;
        let key = cx_protocol::pq::PublicIdentity::from_bytes(
            &hex::decode(exchange["mldsa_key"].as_str().unwrap()).unwrap(),
        )
        .unwrap();
        let signed: cx_protocol::assignment::SignedAssignment =
            serde_json::from_value(job["signed"].clone()).unwrap();
        signed.verify(&key).unwrap();
        assert_eq!(signed.assignment.provider_key, prov.id.id().0);
        assert_eq!(
            signed.assignment.price_wei.to_string(),
            job["price_wei"].as_str().unwrap()
        );
        let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
        let text = "Hello there, agent.";
        let signed = receipt(&prov, &job, text, price / 2);
        let id = job["job_id"].as_str().unwrap();
        let (status, done) = door
            .post(
                &format!("/v1/jobs/{id}/result"),
                Some(&prov.token),
                &json!({"output": output(text), "receipt": signed}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        assert_eq!(done["charged_wei"], (price / 2).to_string());
        price
    };
    let ((status, completion), price) = tokio::join!(agent, provider);
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(
        completion["choices"][0]["message"]["content"],
        "Hello there, agent."
    );
    assert_eq!(completion["choices"][0]["finish_reason"], "length");
    assert_eq!(completion["usage"]["total_tokens"], 14);
    assert_eq!(completion["cx"]["bundle_id"], "warm");

    // The tab and the session's cap hold what the receipt charged; the rest went back.
    assert_eq!(door.held().await, price / 2);
    let session_id = opened["session_id"].as_str().unwrap();
    let (status, session) = door
        .call(
            Request::get(format!("/v1/sessions/{session_id}"))
                .header(header::AUTHORIZATION, "Bearer cxs_secret")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{session}");
    assert_eq!(session["spent_wei"], (price / 2).to_string());
    let job_id = completion["cx"]["job_id"].as_str().unwrap();
    let (_, job) = door.read(&format!("/v1/jobs/{job_id}")).await;
    let states: Vec<&str> = job["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["assigned", "running", "done"]);
    assert_eq!(job["result"]["text"], "Hello there, agent.");
    assert_eq!(
        job["receipt"]["receipt"]["amount_owed_wei"],
        (price / 2).to_string(),
        "the kept receipt is shown"
    );
    assert_eq!(door.count("exchange_receipts").await, 1);
}

#[tokio::test]
async fn the_door_refuses_what_it_cannot_honour_and_writes_nothing() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    door.post(
        "/v1/providers/register",
        None,
        &prov.offer(vec![bundle("warm")]),
    )
    .await;
    let (status, _) = door.session("cxs_small", 1, 1).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = door.session("cxs_key", 1_000_000, 2).await;
    assert_eq!(status, StatusCode::CREATED);
    // The same bearer secret twice, and a replayed grant nonce.
    let (status, body) = door.session("cxs_key", 1_000_000, 3).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("bearer_reused"))
    );
    let (status, body) = door.session("cxs_other", 1_000_000, 2).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("nonce_reused"))
    );

    // (bearer key, body, status, code, field)
    type Case<'a> = (Option<&'a str>, Value, StatusCode, &'a str, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (
            None,
            chat(json!({})),
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            None,
        ),
        (
            Some("cxs_nope"),
            chat(json!({})),
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            None,
        ),
        (
            Some("cxs_key"),
            chat(json!({"temperature": 2.5})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("temperature"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"top_p": 0})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("top_p"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"seed": -1})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("seed"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"tools": []})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            None,
        ),
        (
            Some("cxs_key"),
            chat(json!({"n": 2})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("n"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"stop": ["a", "b", "c", "d", "e"]})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("stop"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"max_tokens": 0})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("max_tokens"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"model": "no-such-model"})),
            StatusCode::NOT_FOUND,
            "unknown_model",
            Some("model"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"model": format!("{:064x}", 7)})),
            StatusCode::NOT_FOUND,
            "unknown_adapter",
            Some("model"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"messages": [{"role": "", "content": "x"}]})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("messages[0].role"),
        ),
        (
            Some("cxs_key"),
            chat(json!({"cx": {"tier": "T3"}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_match",
            None,
        ),
        (
            Some("cxs_key"),
            chat(json!({"cx": {"max_price_wei": "1"}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_match",
            None,
        ),
        (
            Some("cxs_small"),
            chat(json!({})),
            StatusCode::PAYMENT_REQUIRED,
            "session_cap_reached",
            None,
        ),
    ];
    for (bearer, body, status, code, field) in cases {
        let (got, answer) = door.post("/v1/chat/completions", bearer, &body).await;
        assert_eq!(got, status, "{body} → {answer}");
        assert_eq!(answer["error"]["code"], code, "{body} → {answer}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], field, "{body} → {answer}");
        }
        if body.get("tools").is_some() {
            assert!(
                answer["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("tools"),
                "the unknown field is named: {answer}"
            );
        }
    }
    assert_eq!(
        door.count("exchange_jobs").await,
        0,
        "no refused call made a job"
    );
    assert_eq!(door.held().await, 0);

    // Revoked: refused from then on.
    let (_, session) = door.session("cxs_gone", 1_000_000, 9).await;
    let id = session["session_id"].as_str().unwrap();
    let (status, _) = door
        .call(
            Request::delete(format!("/v1/sessions/{id}"))
                .header(header::AUTHORIZATION, "Bearer cxs_key")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "another session's key revokes nothing"
    );
    let (status, _) = door
        .call(
            Request::delete(format!("/v1/sessions/{id}"))
                .header(header::AUTHORIZATION, "Bearer cxs_gone")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = door
        .post("/v1/chat/completions", Some("cxs_gone"), &chat(json!({})))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("session_revoked"))
    );
    // Path parameters that do not parse, or name ids past what the books hold, are our JSON
    // 400 naming the parameter — not axum's text, not a 500 (found by schemathesis).
    for (path, field, code) in [
        ("/v1/tabs/x/1", Some("chain_id"), "invalid_field"),
        (
            "/v1/tabs/1/600823202424277839118336",
            Some("escrow_id"),
            "invalid_field",
        ),
        ("/v1/tabs/0/9223372036854775808", None, "out_of_range"),
        ("/v1/claims/-1/0x00", Some("chain_id"), "invalid_field"),
    ] {
        let (status, body) = door
            .call(Request::get(path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
        assert_eq!(body["error"]["field"].as_str(), field, "{path}: {body}");
    }
    // A provider's route asks for the credential first: without one, nothing it sent is read
    // (a bad id or body is still a 401).
    for path in [
        "/v1/jobs/0/result",
        "/v1/jobs/0/release",
        "/v1/reserves/0/bids",
        "/v1/searches/0/witness",
        "/v1/rents/0/claim",
    ] {
        let (status, body) = door.post(path, None, &json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{path}: {body}");
    }
    assert_eq!(door.count("exchange_jobs").await, 0);
}

#[tokio::test]
async fn a_job_no_provider_finishes_expires_and_its_hold_returns() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    door.post(
        "/v1/providers/register",
        None,
        &prov.offer(vec![bundle("warm")]),
    )
    .await;
    door.session("cxs_key", 1_000_000, 1).await;
    let (status, body) = door
        .post(
            "/v1/chat/completions",
            Some("cxs_key"),
            &chat(json!({"cx": {"deadline_in_s": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"]["code"], "deadline_missed");
    assert!(door.held().await > 0, "held until the sweep");
    // Another session's key cannot cancel it (nor learn that it exists).
    door.session("cxs_other", 1_000_000, 2).await;
    let (_, jobs) = door
        .read(&format!(
            "/v1/jobs?account={}",
            order::account_of(&door.key)
        ))
        .await;
    let first = jobs[0]["id"].as_str().unwrap().to_owned();
    let (status, _) = door
        .call(
            Request::delete(format!("/v1/jobs/{first}"))
                .header(header::AUTHORIZATION, "Bearer cxs_other")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let expired = door.books.expire_due(now_s() + 2).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(door.held().await, 0, "the hold went back to the tab");
    let job = door.books.job(expired[0]).await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Expired);
    // The provider's failure rate is what the exchange saw, whatever its offer says: one
    // failure in one job, against a prior of 1 in 20.
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer(vec![bundle("warm")]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, providers) = door
        .call(Request::get("/v1/providers").body(Body::empty()).unwrap())
        .await;
    let phi = providers[0]["failure_rate"].as_f64().unwrap();
    assert!((phi - 2.0 / 21.0).abs() < 1e-12, "{providers}");
    // A late result is refused.
    let (status, pulled) = door
        .post(
            "/v1/providers/jobs",
            Some(&prov.token),
            &json!({"wait_s": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        pulled["jobs"].as_array().unwrap().is_empty(),
        "expired jobs are not handed out"
    );
}

#[tokio::test]
async fn a_provider_cannot_take_another_providers_bundle_or_claim_more_than_the_price() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    let (status, _) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer(vec![bundle("warm")]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let thief = Prov::new(5);
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &thief.offer(vec![bundle("warm")]),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("bundle_owned"))
    );
    // A provider that stops re-registering goes silent; its next offer brings it back.
    sqlx::query("UPDATE exchange_providers SET seen_at = now() - interval '1 hour'")
        .execute(door.books.pool())
        .await
        .unwrap();
    assert_eq!(
        door.books.silent_bundles(now_s(), 360).await.unwrap(),
        ["warm"]
    );
    let (status, _) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer(vec![bundle("warm")]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(
        door.books
            .silent_bundles(now_s(), 360)
            .await
            .unwrap()
            .is_empty()
    );
    // A tampered offer does not verify.
    let mut tampered = prov.offer(vec![bundle("warm")]);
    tampered["offer"]["payout"] = json!(Address::repeat_byte(0x66));
    let (status, body) = door.post("/v1/providers/register", None, &tampered).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

    door.session("cxs_key", 1_000_000, 1).await;
    let body = chat(json!({"cx": {"deadline_in_s": 4}}));
    let call = door.post("/v1/chat/completions", Some("cxs_key"), &body);
    let provider = async {
        let (status, _) = door
            .post(
                "/v1/providers/jobs",
                Some(&thief.token),
                &json!({"wait_s": 0}),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "the thief's token was never registered"
        );
        let (_, pulled) = door
            .post(
                "/v1/providers/jobs",
                Some(&prov.token),
                &json!({"wait_s": 3}),
            )
            .await;
        let job = pulled["jobs"][0].clone();
        let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
        let id = job["job_id"].as_str().unwrap().to_owned();
        let path = format!("/v1/jobs/{id}/result");
        let bad = [
            // More than the price.
            (
                receipt(&prov, &job, "hi", price + 1),
                output("hi"),
                "over_charged",
            ),
            // A receipt over other bytes than the output.
            (
                receipt(&prov, &job, "hi", 1),
                output("bye"),
                "receipt_mismatch",
            ),
            // Signed by a key that is not the job's provider.
            (
                receipt(&thief, &job, "hi", 1),
                output("hi"),
                "invalid_field",
            ),
            // Claiming other work than the output shows, or a weaker class than the job's.
            (
                resigned(&prov, receipt(&prov, &job, "hi", 1), |r| r.tokens += 1),
                output("hi"),
                "receipt_mismatch",
            ),
            (
                resigned(&prov, receipt(&prov, &job, "hi", 1), |r| {
                    r.class = DeterminismClass::S
                }),
                output("hi"),
                "receipt_mismatch",
            ),
        ];
        for (signed, out, code) in bad {
            let (status, body) = door
                .post(
                    &path,
                    Some(&prov.token),
                    &json!({"output": out, "receipt": signed}),
                )
                .await;
            assert_eq!(body["error"]["code"], code, "{status} {body}");
        }
        assert_eq!(door.count("exchange_receipts").await, 0);
        assert_eq!(door.held().await, price, "nothing was charged or released");
    };
    let ((status, _), ()) = tokio::join!(call, provider);
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test]
async fn a_streamed_call_relays_the_providers_pieces_then_the_rest_of_its_signed_result() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    door.post(
        "/v1/providers/register",
        None,
        &prov.offer(vec![bundle("warm")]),
    )
    .await;
    door.session("cxs_key", 1_000_000, 1).await;
    let body = chat(json!({"stream": true, "cx": {"deadline_in_s": 20}}));
    let agent = async {
        let response = door
            .router
            .clone()
            .oneshot(
                Request::post("/v1/chat/completions")
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::AUTHORIZATION, "Bearer cxs_key")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    let provider = async {
        let (_, pulled) = door
            .post(
                "/v1/providers/jobs",
                Some(&prov.token),
                &json!({"wait_s": 10}),
            )
            .await;
        let job = pulled["jobs"][0].clone();
        let id = job["job_id"].as_str().unwrap().to_owned();
        // Give the door a moment to subscribe, then stream two pieces and one out of order.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        for (offset, text) in [(0, "Hello "), (6, "there"), (99, "junk")] {
            let (status, body) = door
                .post(
                    &format!("/v1/jobs/{id}/progress"),
                    Some(&prov.token),
                    &json!({"offset": offset, "text": text}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        let (status, _) = door
            .post(
                &format!("/v1/jobs/{id}/progress"),
                Some(&Prov::new(5).token),
                &json!({"offset": 0, "text": "x"}),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "only the job's provider streams it"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let text = "Hello there, agent.";
        let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
        let (status, _) = door
            .post(
                &format!("/v1/jobs/{id}/result"),
                Some(&prov.token),
                &json!({"output": output(text), "receipt": receipt(&prov, &job, text, price)}),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    };
    let (sse, ()) = tokio::join!(agent, provider);
    let events: Vec<Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let pieces: Vec<&str> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(pieces, ["Hello ", "there", ", agent."], "{sse}");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length",
        "{sse}"
    );
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
}

/// A provider that leaves the market (silent, or no longer staked) strands its jobs: each moves
/// to another bundle while its deadline allows — the old provider can no longer take it, the new
/// one pulls it — and is refunded at once when no bundle is left.
#[tokio::test]
async fn a_leaving_providers_jobs_are_re_cleared_or_refunded() {
    let door = Door::new().await;
    let (first, second) = (Prov::new(4), Prov::new(5));
    for (prov, b) in [(&first, bundle("warm-a")), (&second, bundle("warm-b"))] {
        let (status, body) = door
            .post("/v1/providers/register", None, &prov.offer(vec![b]))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let request = cx_protocol::order::InferenceRequest {
        prompt: "Say hello in one word.".into(),
        max_tokens: 8,
        ..Default::default()
    };
    let intent = cx_protocol::order::Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash: cx_protocol::order::request_hash(&request),
        deadline_s: now_s() + 120,
        max_price_wei: 1_000_000,
        market_limit: false,
        min_tier: Tier::T0,
        determinism: DeterminismClass::D,
        tab_id: 3,
        nonce: 1,
        expiry_s: now_s() + 60,
    };
    let signed = order::sign(intent, &domain(), &door.key, &door.pq).unwrap();
    let (status, accepted) = door
        .post(
            "/v1/intents",
            None,
            &json!({ "intent": signed, "request": request }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    // Two equal bundles: whichever took the job leaves first.
    let (gone_bundle, other_bundle, first, second) = match accepted["bundle_id"].as_str() {
        Some("warm-a") => ("warm-a", "warm-b", first, second),
        _ => ("warm-b", "warm-a", second, first),
    };
    let job_id: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let held = door.held().await;

    let intake = door.state.serving().unwrap();
    let left = cx_exchange_server::sweeps::leave(intake, &[gone_bundle.into()], now_s())
        .await
        .unwrap();
    assert_eq!((left.bundles, left.moved, left.refunded), (1, 1, 0));
    let job = door.books.job(job_id).await.unwrap().unwrap();
    assert_eq!(job.bundle_id.as_deref(), Some(other_bundle));
    assert!(
        job.events.iter().any(|e| e.status == "re-cleared"),
        "{job:?}"
    );
    assert!(
        door.held().await <= held,
        "an equal bundle: no more than it held"
    );
    let pull = json!({"wait_s": 0});
    let (_, gone) = door
        .post("/v1/providers/jobs", Some(&first.token), &pull)
        .await;
    assert!(gone["jobs"].as_array().unwrap().is_empty(), "{gone}");
    let (_, taken) = door
        .post("/v1/providers/jobs", Some(&second.token), &pull)
        .await;
    assert_eq!(taken["jobs"][0]["job_id"], accepted["job_id"], "{taken}");

    // A dearer provider joins, and the second leaves too: the job moves to the dearer one at
    // its higher price, still within the buyer's signed limit, held from the tab.
    let dear = Prov::new(7);
    let mut dear_bundle = bundle("dear");
    dear_bundle.price_wei_per_s *= 3;
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &dear.offer(vec![dear_bundle]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let before = door.held().await;
    let left = cx_exchange_server::sweeps::leave(intake, &[other_bundle.into()], now_s())
        .await
        .unwrap();
    assert_eq!((left.bundles, left.moved, left.refunded), (1, 1, 0));
    let job = door.books.job(job_id).await.unwrap().unwrap();
    assert_eq!(job.bundle_id.as_deref(), Some("dear"));
    let after = door.held().await;
    assert!(before < after && after <= 1_000_000, "{before} → {after}");
    assert_eq!(job.held_wei, after, "the tab holds what the job holds");

    // The dearer one leaves: nothing can take the job, so it is refunded now, not at its
    // deadline.
    let left = cx_exchange_server::sweeps::leave(intake, &["dear".into()], now_s())
        .await
        .unwrap();
    assert_eq!((left.bundles, left.moved, left.refunded), (1, 0, 1));
    assert_eq!(
        door.books.job(job_id).await.unwrap().unwrap().status,
        JobStatus::Refunded
    );
    assert_eq!(door.held().await, 0, "the hold went back to the tab");
}

#[tokio::test]
async fn a_residency_claim_the_work_contradicts_is_recorded_against_the_provider() {
    use base64::Engine as _;
    let door = Door::new().await;
    let prov = Prov::new(6);
    // An adapter in the exchange's store, and a bundle that reports it (and the base) resident.
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
    let files = json!({
        "adapter_config": r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}"#,
        "adapter_model_safetensors_base64": base64::engine::general_purpose::STANDARD.encode(&weights),
    });
    let put = |authorization: Option<String>| {
        let mut request =
            Request::put("/v1/adapters").header(header::CONTENT_TYPE, "application/json");
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        door.call(request.body(Body::from(files.to_string())).unwrap())
    };
    // Storing needs an account's credential; it is then the adapter's owner.
    let (status, refused) = put(None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    let (status, stored) = put(Some(door.credential(cx_protocol::access::Scope::Store))).await;
    assert_eq!(status, StatusCode::CREATED, "{stored}");
    let adapter = stored["id"].as_str().unwrap().to_owned();
    let mut warm = bundle("warm");
    warm.resident_adapters = vec![adapter.clone()];
    let (status, body) = door
        .post("/v1/providers/register", None, &prov.offer(vec![warm]))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    door.session("cxs_key", 1_000_000, 1).await;

    let call = chat(json!({"cx": {"deadline_in_s": 2, "adapter_id": adapter}}));
    let agent = door.post("/v1/chat/completions", Some("cxs_key"), &call);
    let provider = async {
        let (status, pulled) = door
            .post(
                "/v1/providers/jobs",
                Some(&prov.token),
                &json!({"max_jobs": 1, "wait_s": 10}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pulled}");
        assert_eq!(pulled["jobs"].as_array().unwrap().len(), 1, "{pulled}");
        let fetch = |bearer: Option<&str>| {
            let mut request = Request::get(format!("/v1/adapters/{adapter}"));
            if let Some(token) = bearer {
                request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
            }
            door.call(request.body(Body::empty()).unwrap())
        };
        // No one fetches anonymously, and a stranger's credential finds nothing.
        let (status, _) = fetch(None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let stranger = SigningKey::from_slice(&[78; 32]).unwrap();
        let (status, _) = door
            .call(
                Request::get(format!("/v1/adapters/{adapter}"))
                    .header(
                        header::AUTHORIZATION,
                        crate::common::credential(
                            door.intake(),
                            &stranger,
                            cx_protocol::access::Scope::Read,
                        ),
                    )
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(door.count("exchange_residency_misses").await, 0);
        // A bad token is refused, not treated as anonymous.
        let (status, _) = fetch(Some("not-a-provider")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // The provider that said it held the adapter fetches it for the job: a miss.
        let (status, _) = fetch(Some(&prov.token)).await;
        assert_eq!(status, StatusCode::OK);
    };
    let ((status, body), ()) = tokio::join!(agent, provider);
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    // It took the job on the claim and never answered: the deadline reveals the claim too.
    let expired = door.books.expire_due(now_s() + 3).await.unwrap();
    assert_eq!(expired.len(), 1);
    let misses = door
        .books
        .residency_misses(B256::from(prov.id.id().0))
        .await
        .unwrap();
    assert_eq!(
        (misses.deadline, misses.fetched, misses.claims),
        (1, 1, 1),
        "{misses:?}"
    );
    let claimed: Vec<(String, String)> =
        sqlx::query_as("SELECT evidence, claimed FROM exchange_residency_misses ORDER BY evidence")
            .fetch_all(door.books.pool())
            .await
            .unwrap();
    assert_eq!(
        claimed,
        [
            ("deadline".to_owned(), "base+adapter".to_owned()),
            ("fetched".to_owned(), "base+adapter".to_owned())
        ]
    );
    // The explorer shows it on the provider's page.
    let (status, page) = door
        .call(
            Request::get(format!(
                "/explorer/providers/{}",
                B256::from(prov.id.id().0)
            ))
            .header(header::ACCEPT, "application/json")
            .body(Body::empty())
            .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["residency_misses"]["deadline"], 1, "{page}");
    assert_eq!(page["residency_misses"]["fetched"], 1, "{page}");
}

/// A chat whose only provider gives the job up is answered at once, 503 `refunded` with the
/// provider's reason, not a 504 at the deadline; nothing is charged.
#[tokio::test]
async fn a_chat_its_provider_gives_up_is_answered_503_refunded_with_the_reason() {
    let door = Door::new().await;
    let prov = Prov::new(5);
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer(vec![bundle("warm")]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, opened) = door.session("cxs_gave_up", 1_000_000, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");
    let agent = async {
        door.post(
            "/v1/chat/completions",
            Some("cxs_gave_up"),
            &chat(json!({"cx": {"deadline_in_s": 30}})),
        )
        .await
    };
    let provider = async {
        let (status, pulled) = door
            .post(
                "/v1/providers/jobs",
                Some(&prov.token),
                &json!({"max_jobs": 4, "wait_s": 10}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pulled}");
        let id = pulled["jobs"][0]["job_id"].as_str().unwrap().to_owned();
        let (status, released) = door
            .post(
                &format!("/v1/jobs/{id}/release"),
                Some(&prov.token),
                &json!({"reason": "residency cache full"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{released}");
    };
    let started = std::time::Instant::now();
    let ((status, answer), ()) = tokio::join!(agent, provider);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["error"]["code"], "refunded", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("residency cache full"), "{message}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "answered before the deadline"
    );
    assert_eq!(door.held().await, 0);
}
