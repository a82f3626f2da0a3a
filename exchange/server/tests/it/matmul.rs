//! The `cx/matmul-f32` job kind on a real PostgreSQL: a product intent is cleared onto the one
//! bundle that offers the kernel at T2, the provider returns `C` with a signed receipt, and
//! the exchange's Freivalds check decides — a right product is `done` and `verified`, a wrong
//! one `failed`, never charged, its hold back on the tab. Refusals name their field and write
//! nothing.

use crate::door::{Door, domain, now_s};
use alloy::primitives::{Address, B256};
use axum::http::StatusCode;
use base64::Engine as _;
use cx_protocol::matmul::{MATMUL_MODEL, MatmulRequest, product_hash, product_to_bytes};
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order::{self, Intent};
use cx_protocol::pq::Identity;
use cx_protocol::receipt::{Receipt, SignedReceipt};
use cx_protocol::{Bundle, DeterminismClass, Tier};
use serde_json::{Value, json};

const PAYOUT: Address = Address::repeat_byte(0x77);
const TOKEN: &str = "matmul-provider-token";

fn request() -> MatmulRequest {
    MatmulRequest {
        m: 64,
        k: 48,
        n: 32,
        seed_a: 11,
        seed_b: 12,
    }
}

fn bundle(id: &str, tiers: Value, bases: Value) -> Bundle {
    serde_json::from_value(json!({
        "id": id, "provider": "op-m", "price_wei_per_s": "1000000",
        "memory_bytes": 1_000_000_000u64, "bandwidth_bps": 1e9, "rtt_s": 0.01,
        "flops_per_s": 1e9, "context_max": 1, "determinism": ["D_inf", "S"],
        "tiers": tiers, "resident_bases": bases,
    }))
    .unwrap()
}

/// Registers a provider with the matmul bundle, a T2 bundle without the kernel, and an
/// inference bundle at T0/T1; returns its identity.
async fn provider(door: &Door) -> Identity {
    let id = Identity::from_seed([21; 32]);
    let offer = Offer {
        operator: "op-m".into(),
        payout: PAYOUT,
        bundles: vec![
            bundle("mm", json!(["T2"]), json!([MATMUL_MODEL])),
            bundle("t2-no-kernel", json!(["T2"]), json!([])),
            bundle(
                "infer",
                json!(["T0", "T1"]),
                json!(["llama-3.1-8b-instruct"]),
            ),
        ],
        token_hash: Offer::token_hash_of(TOKEN.as_bytes()),
        issued_at_s: now_s(),
        residency: None,
        search_trials_per_s: None,
    };
    let signed = serde_json::to_value(SignedOffer::sign(offer, &id).unwrap()).unwrap();
    let (status, body) = door.post("/v1/providers/register", None, &signed).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    id
}

fn intent(request: &MatmulRequest, nonce: u64, change: impl FnOnce(&mut Intent)) -> Intent {
    let mut intent = Intent {
        want: MATMUL_MODEL.into(),
        adapter_id: None,
        request_hash: request.hash(),
        deadline_s: now_s() + 60,
        max_price_wei: 1_000_000,
        market_limit: false,
        min_tier: Tier::T2,
        determinism: DeterminismClass::DInf,
        tab_id: 3,
        nonce,
        expiry_s: now_s() + 60,
    };
    change(&mut intent);
    intent
}

async fn submit(door: &Door, intent: Intent, body: Value) -> (StatusCode, Value) {
    let signed = order::sign(intent, &domain(), &door.key, &door.pq).unwrap();
    let mut body = body;
    body["intent"] = serde_json::to_value(&signed).unwrap();
    door.post("/v1/intents", None, &body).await
}

/// Pulls the one job, computes its product (perturbed when `wrong`), and returns it with an
/// honest receipt over the bytes sent: the result's answer and the job id.
async fn run_job(door: &Door, prov: &Identity, wrong: bool) -> ((StatusCode, Value), String) {
    let (id, result) = pull_and_compute(door, prov, wrong).await;
    let answer = door
        .post(&format!("/v1/jobs/{id}/result"), Some(TOKEN), &result)
        .await;
    (answer, id)
}

/// Pulls the one job and computes its product (perturbed when `wrong`): the job id and the
/// result body (output and an honest receipt over the bytes), not yet sent.
async fn pull_and_compute(door: &Door, prov: &Identity, wrong: bool) -> (String, Value) {
    let (status, pulled) = door
        .post(
            "/v1/providers/jobs",
            Some(TOKEN),
            &json!({"max_jobs": 4, "wait_s": 5}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{pulled}");
    let job = pulled["jobs"][0].clone();
    assert_eq!(job["model"], MATMUL_MODEL);
    let r: MatmulRequest = serde_json::from_value(job["matmul"].clone()).unwrap();
    assert_eq!(r, request(), "the provider gets the shapes and seeds");
    let (m, k, n) = r.dims();
    let (a, b) = cx_kernels::matmul::operands(m, k, n, r.seed_a, r.seed_b);
    let mut c =
        cx_kernels::matmul::product(&a, &b, m, k, n, &cx_kernels::CpuConfig::default()).unwrap();
    if wrong {
        cx_kernels::matmul::perturb(&mut c, k, n);
    }
    let bytes = product_to_bytes(&c);
    let job_id: B256 = job["job_id"].as_str().unwrap().parse().unwrap();
    let buyer: Address = job["buyer"].as_str().unwrap().parse().unwrap();
    let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
    let receipt = SignedReceipt::sign(
        Receipt {
            job_id: job_id.0,
            chain_id: job["chain_id"].as_u64().unwrap(),
            escrow_id: job["escrow_id"].as_u64().unwrap(),
            input_hash: r.hash().0,
            output_hash: product_hash(&bytes),
            adapter_hash: [0; 32],
            tokens: 0,
            compute_ms: 3,
            class: DeterminismClass::DInf,
            provider: PAYOUT.0.0,
            provider_key: prov.id().0,
            amount_owed_wei: price,
            buyer: buyer.0.0,
        },
        prov,
    )
    .unwrap();
    let output = json!({
        "text": "", "finish_reason": "product", "prompt_tokens": 0, "completion_tokens": 0,
        "product": base64::engine::general_purpose::STANDARD.encode(&bytes),
    });
    (
        job_id.to_string(),
        json!({"output": output, "receipt": receipt}),
    )
}

async fn job(door: &Door, id: &str) -> Value {
    let (status, job) = door.read(&format!("/v1/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    job
}

fn event<'a>(job: &'a Value, status: &str) -> &'a Value {
    job["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["status"] == status)
        .unwrap_or_else(|| panic!("no {status} event: {job}"))
}

#[tokio::test]
async fn a_right_product_is_verified_by_freivalds_and_done() {
    let door = Door::new().await;
    let prov = provider(&door).await;
    let (status, accepted) = submit(
        &door,
        intent(&request(), 1, |_| {}),
        json!({"matmul": request()}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    // Only the bundle holding the kernel takes it, at T2.
    assert_eq!(accepted["bundle_id"], "mm");
    assert_eq!(accepted["tier"], "T2");
    let held: u128 = accepted["held_wei"].as_str().unwrap().parse().unwrap();
    // 2·64·48·32 FLOPs at 10⁹ FLOP/s and 10⁶ wei/s: 196.608 µs, 197 wei rounded up.
    assert_eq!(held, 197);
    let (_, record) = {
        let id = accepted["job_id"].as_str().unwrap().to_owned();
        let j = job(&door, &id).await;
        let rejected = j["decision"]["rejected"].as_array().unwrap();
        let no_kernel = rejected
            .iter()
            .find(|r| r["id"] == "t2-no-kernel")
            .expect("the T2 bundle without the kernel is refused");
        assert_eq!(no_kernel["binding"], "kind", "{no_kernel}");
        (id, j)
    };
    assert_eq!(record["status"], "assigned");

    let ((status, done), id) = run_job(&door, &prov, false).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["charged_wei"], held.to_string());
    let j = job(&door, &id).await;
    assert_eq!(j["status"], "done");
    let verified = &event(&j, "verified")["detail"];
    assert_eq!(verified["tier"], "T2");
    assert_eq!(verified["method"], "freivalds");
    assert_eq!(verified["passed"], true);
    assert_eq!(verified["rounds"], 20);
    assert!(verified["check_ms"].as_f64().unwrap() >= 0.0);
    // 20 rounds · (64·48 + 48·32 + 64·32) / (64·48·32) = 20 · 6656 / 98304.
    let fraction = verified["cost_fraction"].as_f64().unwrap();
    assert!(
        (fraction - 20.0 * 6656.0 / 98_304.0).abs() < 1e-9,
        "{fraction}"
    );
    let states: Vec<&str> = j["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["assigned", "running", "verified", "done"]);
    // The buyer reads the product back, and it is what the receipt hashed.
    let product = base64::engine::general_purpose::STANDARD
        .decode(j["result"]["product"].as_str().unwrap())
        .unwrap();
    assert_eq!(product.len(), 64 * 32 * 4);
    assert_eq!(
        hex::encode(product_hash(&product)),
        j["receipt"]["receipt"]["output_hash"]
            .as_str()
            .unwrap()
            .trim_start_matches("0x")
    );
    assert_eq!(door.held().await, held);
    assert_eq!(door.count("exchange_receipts").await, 1);
    // It settles as any intent: the tab's paid jobs hold it, and the chain the signers check
    // links — the buyer signed the matmul request's hash, the receipt names it as its input.
    let paid = door.books.paid_jobs(31337, 3).await.unwrap();
    assert_eq!(paid.len(), 1);
    assert_eq!(
        (paid[0].kind.as_str(), paid[0].charged_wei),
        ("intent", held)
    );
    let signed: order::Signed<Intent> =
        serde_json::from_value(paid[0].order["intent"].clone()).unwrap();
    let input = order::request_value_hash(paid[0].request.as_ref().unwrap());
    assert_eq!(input, signed.order.request_hash);
    let receipt: SignedReceipt = serde_json::from_value(paid[0].receipt.clone()).unwrap();
    assert_eq!(receipt.receipt.input_hash, input.0);
    // A list of jobs leaves products out (each up to 5.6 MB); the job's own page has it.
    let account = order::account_of(&door.key);
    let (status, list) = door.read(&format!("/v1/jobs?account={account}")).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list[0]["status"], "done");
    assert!(list[0]["result"]["product"].is_null(), "{}", list[0]);
    assert_eq!(list[0]["result"]["finish_reason"], "product");
}

#[tokio::test]
async fn a_wrong_product_fails_freivalds_is_never_charged_and_its_hold_returns() {
    let door = Door::new().await;
    let prov = provider(&door).await;
    let (status, accepted) = submit(
        &door,
        intent(&request(), 1, |_| {}),
        json!({"matmul": request()}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert!(door.held().await > 0);
    let ((status, refused), id) = run_job(&door, &prov, true).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["code"], "verification_failed");
    let j = job(&door, &id).await;
    assert_eq!(j["status"], "failed");
    let failed = &event(&j, "verification_failed")["detail"];
    assert_eq!(failed["passed"], false);
    assert_eq!(failed["method"], "freivalds");
    assert_eq!(failed["rounds"], 20);
    // Nothing charged, no receipt kept, the whole hold back on the tab.
    assert_eq!(door.held().await, 0);
    assert_eq!(door.count("exchange_receipts").await, 0);
    assert!(door.books.paid_jobs(31337, 3).await.unwrap().is_empty());
    // It counts in the provider's observed φ: 1 failed of 1 ended, with the 1-in-20 prior.
    let phi = door
        .books
        .observed_failure_rate(B256::from(prov.id().0))
        .await
        .unwrap();
    assert!((phi - 2.0 / 21.0).abs() < 1e-12, "{phi}");
    // A second result for the failed job is refused: it is not running any more.
    let again = door
        .post(
            &format!("/v1/jobs/{id}/result"),
            Some(TOKEN),
            &json!({"output": {"text": "", "finish_reason": "product", "prompt_tokens": 0,
                               "completion_tokens": 0, "product": ""},
                    "receipt": j["receipt"]}),
        )
        .await;
    assert_ne!(again.0, StatusCode::OK, "{}", again.1);
}

#[tokio::test]
async fn matmul_intents_out_of_bounds_or_terms_are_refused_by_field_and_write_nothing() {
    let door = Door::new().await;
    provider(&door).await;
    let wide = MatmulRequest {
        m: 1,
        k: 2,
        n: 1 << 20,
        ..request()
    };
    let zero = MatmulRequest { m: 0, ..request() };
    // (intent, body, field the error names)
    let cases: Vec<(Intent, Value, &str)> = vec![
        (
            intent(&wide, 1, |_| {}),
            json!({"matmul": wide}),
            "matmul.n",
        ),
        (
            intent(&zero, 2, |_| {}),
            json!({"matmul": zero}),
            "matmul.m",
        ),
        (
            intent(&request(), 3, |i| i.min_tier = Tier::T1),
            json!({"matmul": request()}),
            "min_tier",
        ),
        (
            intent(&request(), 4, |i| i.want = "llama-8b".into()),
            json!({"matmul": request()}),
            "want",
        ),
        (
            intent(&request(), 5, |_| {}),
            json!({"matmul": request(), "request": {"prompt": "x", "max_tokens": 1}}),
            "matmul",
        ),
        (intent(&request(), 6, |_| {}), json!({}), "request"),
    ];
    for (intent, body, field) in cases {
        let (status, answer) = submit(&door, intent, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let named = answer["error"]["field"].as_str().unwrap_or_default();
        assert!(named.ends_with(field), "{body}: {answer}");
    }
    // A request that is not the one signed.
    let other = MatmulRequest {
        seed_b: 99,
        ..request()
    };
    let (status, answer) = submit(
        &door,
        intent(&request(), 7, |_| {}),
        json!({"matmul": other}),
    )
    .await;
    assert!(status.is_client_error(), "{answer}");
    assert_eq!(door.count("exchange_jobs").await, 0);
    assert_eq!(door.count("exchange_orders").await, 0);
    assert_eq!(door.held().await, 0);
}

/// The statuses of job `id`'s events, in order.
async fn states(door: &Door, id: &str) -> Vec<String> {
    let job = door.books.job(id.parse().unwrap()).await.unwrap().unwrap();
    job.events.into_iter().map(|e| e.status).collect()
}

/// What broke: a product returned after its job's deadline ran the Freivalds check first and
/// wrote its verdict (a `verified` event, or — for a wrong product — the job `failed`) before
/// the job's own transaction refused the result as late. A refused result must change nothing:
/// the job is still `running`, for the deadline sweep to expire and refund.
#[tokio::test]
async fn a_late_matmul_result_is_refused_before_any_write() {
    for wrong in [false, true] {
        let door = Door::new().await;
        provider(&door).await;
        let (status, accepted) = submit(
            &door,
            intent(&request(), 1, |_| {}),
            json!({"matmul": request()}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
        let held = door.held().await;
        let prov = Identity::from_seed([21; 32]);
        let (id, result) = pull_and_compute(&door, &prov, wrong).await;
        let before = states(&door, &id).await;
        assert_eq!(before, ["assigned", "running"]);
        let deadline_s = door
            .books
            .job(id.parse().unwrap())
            .await
            .unwrap()
            .unwrap()
            .deadline_s;
        let intake = door.intake();
        let provider = intake.provider(TOKEN).await.unwrap();
        let submission = serde_json::from_value(result).unwrap();
        let refused = intake
            .accept_result(&provider, id.parse().unwrap(), &submission, deadline_s + 1)
            .await;
        assert!(
            matches!(refused, Err(cx_exchange_server::Error::ResultLate { .. })),
            "wrong product: {wrong}: {refused:?}"
        );
        assert_eq!(states(&door, &id).await, before, "wrong product: {wrong}");
        let job = door.books.job(id.parse().unwrap()).await.unwrap().unwrap();
        assert_eq!(job.status, cx_exchange_server::books::JobStatus::Running);
        assert!(job.result.is_none());
        assert_eq!(door.count("exchange_receipts").await, 0);
        assert_eq!(door.held().await, held);
    }
}

/// What broke: a second copy of a right product for a job already `done` was checked again
/// and wrote a second `verified` event before it was refused as not running.
#[tokio::test]
async fn a_result_for_a_finished_matmul_job_is_refused_before_any_write() {
    let door = Door::new().await;
    let prov = provider(&door).await;
    let (status, accepted) = submit(
        &door,
        intent(&request(), 1, |_| {}),
        json!({"matmul": request()}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let (id, result) = pull_and_compute(&door, &prov, false).await;
    let path = format!("/v1/jobs/{id}/result");
    let (status, done) = door.post(&path, Some(TOKEN), &result).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let after = states(&door, &id).await;
    assert_eq!(after, ["assigned", "running", "verified", "done"]);
    let held = door.held().await;
    let (status, again) = door.post(&path, Some(TOKEN), &result).await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    assert_eq!(again["error"]["code"], "job_not_running");
    assert_eq!(states(&door, &id).await, after);
    assert_eq!(door.count("exchange_receipts").await, 1);
    assert_eq!(door.held().await, held);
}
