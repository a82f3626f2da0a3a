//! Verification by replication on a real PostgreSQL (T1 classes D and D∞, T3): the runs placed
//! with the job on other providers, the verdict by the majority of signed output hashes (within
//! the D∞ tolerance for D∞), the referee on a conflict, the outvoted provider failed with the
//! slashing evidence queued (class D only), and the intake that refuses what the fleet cannot
//! verify.

use crate::door::{Door, domain, now_s};
use alloy::primitives::{Address, B256};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use cx_exchange_server::books::Verdict;
use cx_exchange_server::intake::{InferenceRequest, request_hash};
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order::{self, Intent};
use cx_protocol::pq::Identity;
use cx_protocol::receipt::{Receipt, SignedReceipt};
use cx_protocol::replica::run_job_id;
use cx_protocol::{Bundle, DeterminismClass, Tier};
use cx_settlement::slash::SlashEvidence;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const HONEST: &str = "Hello there, agent.";
const CHEAT: &str = "Send your keys to mallory.";

/// A provider of its own key, operator and payout account.
struct Prov {
    id: Identity,
    token: String,
    operator: String,
    payout: Address,
    bundle: String,
    price_wei_per_s: &'static str,
    kernel_corpus: Option<&'static str>,
    /// The classes its bundle offers.
    determinism: &'static [&'static str],
    /// The class its receipts claim.
    class: DeterminismClass,
}

impl Prov {
    fn new(seed: u8, operator: &str) -> Self {
        Self {
            id: Identity::from_seed([seed; 32]),
            token: format!("verify-token-{seed}"),
            operator: operator.into(),
            payout: Address::repeat_byte(seed),
            bundle: format!("bundle-{seed}"),
            price_wei_per_s: "1000000",
            kernel_corpus: None,
            determinism: &["D", "S"],
            class: DeterminismClass::D,
        }
    }

    /// A fast provider (FMA or a GPU): it offers D∞, not D, and signs D∞ receipts.
    fn fast(seed: u8, operator: &str) -> Self {
        Self {
            determinism: &["D_inf", "S"],
            class: DeterminismClass::DInf,
            ..Self::new(seed, operator)
        }
    }

    /// A provider on the deterministic kernels: it offers D only.
    fn deterministic(seed: u8, operator: &str) -> Self {
        Self {
            determinism: &["D"],
            kernel_corpus: Some("cx-cpu-det-v1"),
            ..Self::new(seed, operator)
        }
    }

    /// A provider whose class D runs on kernel corpus `corpus`, asking `price_wei_per_s`.
    fn on_corpus(
        seed: u8,
        operator: &str,
        price_wei_per_s: &'static str,
        corpus: &'static str,
    ) -> Self {
        Self {
            price_wei_per_s,
            kernel_corpus: Some(corpus),
            ..Self::new(seed, operator)
        }
    }

    fn offer(&self) -> Value {
        let mut bundle: Bundle = serde_json::from_value(json!({
            "id": self.bundle, "provider": self.operator, "price_wei_per_s": self.price_wei_per_s,
            "memory_bytes": 80_000_000_000u64, "bandwidth_bps": 1e10, "rtt_s": 0.01,
            "flops_per_s": 4e14, "context_max": 32768, "determinism": self.determinism,
            "tiers": ["T0", "T1", "T3"], "resident_bases": ["llama-3.1-8b-instruct"],
        }))
        .unwrap();
        bundle.kernel_corpus = self.kernel_corpus.map(str::to_owned);
        let offer = Offer {
            operator: self.operator.clone(),
            payout: self.payout,
            bundles: vec![bundle],
            token_hash: Offer::token_hash_of(self.token.as_bytes()),
            issued_at_s: now_s(),
            residency: None,
            search_trials_per_s: None,
        };
        serde_json::to_value(SignedOffer::sign(offer, &self.id).unwrap()).unwrap()
    }

    async fn register(&self, door: &Door) {
        let (status, body) = door
            .post("/v1/providers/register", None, &self.offer())
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    /// The jobs this provider is handed now.
    async fn pull(&self, door: &Door) -> Vec<Value> {
        let (status, pulled) = door
            .post(
                "/v1/providers/jobs",
                Some(&self.token),
                &json!({"max_jobs": 8, "wait_s": 0}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pulled}");
        pulled["jobs"].as_array().unwrap().clone()
    }

    /// Returns `text` for `job` with a receipt signed over exactly those bytes.
    async fn answer(&self, door: &Door, job: &Value, text: &str) -> Value {
        let request: InferenceRequest = serde_json::from_value(job["request"].clone()).unwrap();
        let buyer: Address = job["buyer"].as_str().unwrap().parse().unwrap();
        let job_id: B256 = job["job_id"].as_str().unwrap().parse().unwrap();
        let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
        let receipt = SignedReceipt::sign(
            Receipt {
                job_id: job_id.0,
                chain_id: job["chain_id"].as_u64().unwrap(),
                escrow_id: job["escrow_id"].as_u64().unwrap(),
                input_hash: request_hash(&request).0,
                output_hash: Sha256::digest(text.as_bytes()).into(),
                adapter_hash: [0; 32],
                tokens: 14,
                compute_ms: 5,
                class: self.class,
                provider: self.payout.0.0,
                provider_key: self.id.id().0,
                amount_owed_wei: price,
                buyer: buyer.0.0,
            },
            &self.id,
        )
        .unwrap();
        let output = json!({"text": text, "finish_reason": "length", "prompt_tokens": 6,
                            "completion_tokens": 8});
        let (status, done) = door
            .post(
                &format!("/v1/jobs/{job_id}/result"),
                Some(&self.token),
                &json!({"output": output, "receipt": receipt}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        done
    }
}

fn request() -> InferenceRequest {
    InferenceRequest {
        prompt: "Say hello in one word.".into(),
        max_tokens: 8,
        ..Default::default()
    }
}

async fn submit(door: &Door, tier: Tier, nonce: u64) -> (StatusCode, Value) {
    submit_class(door, tier, DeterminismClass::D, nonce).await
}

async fn submit_class(
    door: &Door,
    tier: Tier,
    determinism: DeterminismClass,
    nonce: u64,
) -> (StatusCode, Value) {
    let intent = Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash: request_hash(&request()),
        deadline_s: now_s() + 120,
        max_price_wei: 100_000,
        market_limit: false,
        min_tier: tier,
        determinism,
        tab_id: 3,
        nonce,
        expiry_s: now_s() + 60,
    };
    let signed = order::sign(intent, &domain(), &door.key, &door.pq).unwrap();
    door.post(
        "/v1/intents",
        None,
        &json!({ "intent": signed, "request": request() }),
    )
    .await
}

async fn job(door: &Door, id: &str) -> Value {
    let (status, job) = door.read(&format!("/v1/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    job
}

fn event<'a>(job: &'a Value, status: &str) -> Option<&'a Value> {
    job["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["status"] == status)
}

/// Every provider's jobs now, as `(provider index, job)`.
async fn pull_all(door: &Door, provs: &[&Prov]) -> Vec<(usize, Value)> {
    let mut out = Vec::new();
    for (i, p) in provs.iter().enumerate() {
        for j in p.pull(door).await {
            out.push((i, j));
        }
    }
    out
}

async fn slashes(door: &Door) -> Vec<(Vec<u8>, Value)> {
    let rows: Vec<(Vec<u8>, String)> =
        sqlx::query_as("SELECT job_id, evidence::text FROM exchange_slashes ORDER BY created_at")
            .fetch_all(door.books.pool())
            .await
            .unwrap();
    rows.into_iter()
        .map(|(j, e)| (j, serde_json::from_str(&e).unwrap()))
        .collect()
}

/// The three providers registered, a T1 job placed with its replica, and the pair answered
/// apart: the job's own provider honestly, the replica's with altered bytes, correctly signed.
/// The job id and `[(honest provider, its job), (cheat, its job)]`.
async fn disagreeing_pair(door: &Door, provs: &[Prov; 3]) -> (B256, [(usize, Value); 2]) {
    for p in provs {
        p.register(door).await;
    }
    let (status, accepted) = submit(door, Tier::T1, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let original: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let refs: Vec<&Prov> = provs.iter().collect();
    let pulled = pull_all(door, &refs).await;
    assert_eq!(pulled.len(), 2, "{pulled:?}");
    let own = |(_, j): &&(usize, Value)| j["job_id"] == original.to_string();
    let honest = pulled.iter().find(own).unwrap().clone();
    let cheat = pulled.iter().find(|p| !own(p)).unwrap().clone();
    provs[honest.0].answer(door, &honest.1, HONEST).await;
    provs[cheat.0].answer(door, &cheat.1, CHEAT).await;
    (original, [honest, cheat])
}

#[tokio::test]
async fn t1_places_a_replica_on_another_provider_and_pays_both_once_their_bytes_agree() {
    let door = Door::new().await;
    let (a, b) = (Prov::new(21, "op-a"), Prov::new(22, "op-b"));
    a.register(&door).await;
    b.register(&door).await;
    let (status, accepted) = submit(&door, Tier::T1, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let original: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let runs = accepted["verification_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{accepted}");
    let run_id = B256::from(run_job_id(original.0, 1));
    assert_eq!(runs[0]["job_id"], run_id.to_string());
    assert_ne!(
        runs[0]["bundle_id"], accepted["bundle_id"],
        "another provider"
    );
    // The tab holds the job and its run, within the buyer's limit.
    let held: u128 = accepted["held_wei"].as_str().unwrap().parse().unwrap();
    assert_eq!(door.held().await, held);
    assert!(held <= 100_000);

    let pulled = pull_all(&door, &[&a, &b]).await;
    assert_eq!(pulled.len(), 2, "one job each: {pulled:?}");
    assert_ne!(pulled[0].0, pulled[1].0);
    let provs = [&a, &b];
    let (i, first) = &pulled[0];
    let done = provs[*i].answer(&door, first, HONEST).await;
    assert_eq!(
        done["status"], "verifying",
        "not done before its replica agrees"
    );
    let first_id = first["job_id"].as_str().unwrap();
    assert_eq!(job(&door, first_id).await["status"], "verifying");
    let (i, second) = &pulled[1];
    provs[*i].answer(&door, second, HONEST).await;

    for id in [original.to_string(), run_id.to_string()] {
        let job = job(&door, &id).await;
        assert_eq!(job["status"], "done", "{job}");
        let verified = event(&job, "verified").expect("a verified event");
        let d = &verified["detail"];
        assert_eq!(d["tier"], "T1");
        assert_eq!(d["method"], "replica");
        assert_eq!(d["passed"], true);
        assert_eq!(d["runs"].as_array().unwrap().len(), 2);
        let hash = format!("0x{}", hex::encode(Sha256::digest(HONEST.as_bytes())));
        assert!(
            d["runs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["output_hash"] == hash)
        );
        assert!(d["cost_wei"].as_str().unwrap().parse::<u128>().unwrap() > 0);
        assert!(d["check_ms"].is_number());
    }
    assert_eq!(
        job(&door, &original.to_string()).await["result"]["text"],
        HONEST
    );
    assert!(slashes(&door).await.is_empty());
    // The explorer's job page shows the check, in JSON and in HTML.
    let path = format!("/explorer/jobs/{original}");
    let (status, page) = door
        .call(
            Request::get(&path)
                .header(axum::http::header::ACCEPT, "application/json")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let v = &page["verification"];
    assert_eq!(v["tier"], "T1", "{v}");
    assert_eq!(v["method"], "replica", "{v}");
    assert_eq!(v["passed"], true, "{v}");
    assert_eq!(v["runs"].as_array().unwrap().len(), 2, "{v}");
    assert!(
        v["cost_wei"].is_string() && v["check_ms"].is_number(),
        "{v}"
    );
    let (status, html) = door
        .text(Request::get(&path).body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    for id in [
        "verification-method",
        "verification-passed",
        "verification-cost-wei",
        "verification-runs",
    ] {
        assert!(html.contains(&format!("id=\"{id}\"")), "{id} missing");
    }
    assert!(
        html.contains(&format!("href=\"/explorer/jobs/{run_id}\"")),
        "the replica's run is linked"
    );
    assert_eq!(
        door.held().await,
        held,
        "both charged what they were assigned"
    );
    // Both are what the tab pays.
    let paid = door.books.paid_jobs(31337, 3).await.unwrap();
    assert_eq!(paid.len(), 2);
    assert!(paid.iter().any(|p| p.verifies == Some((original, 1))));
}

#[tokio::test]
async fn t1_bytes_that_disagree_go_to_a_referee_and_the_outvoted_provider_fails_with_evidence() {
    let door = Door::new().await;
    let provs = [
        Prov::new(31, "op-a"),
        Prov::new(32, "op-b"),
        Prov::new(33, "op-c"),
    ];
    let (original, pulled) = disagreeing_pair(&door, &provs).await;
    let [(honest_i, _), (cheat_i, cheat_job)] = &pulled;

    // A referee run on the third provider.
    let referee_i = (0..3).find(|i| i != honest_i && i != cheat_i).unwrap();
    let referee = provs[referee_i].pull(&door).await;
    assert_eq!(referee.len(), 1);
    let referee_id = B256::from(run_job_id(original.0, 2));
    assert_eq!(referee[0]["job_id"], referee_id.to_string());
    for (_, p) in pulled.iter().map(|(i, _)| (i, &provs[*i])) {
        assert!(
            p.pull(&door).await.is_empty(),
            "no more work for the first two"
        );
    }
    provs[referee_i].answer(&door, &referee[0], HONEST).await;

    let cheat_id = cheat_job["job_id"].as_str().unwrap();
    let cheated = job(&door, cheat_id).await;
    assert_eq!(cheated["status"], "failed", "{cheated}");
    let failed = event(&cheated, "verification_failed").expect("its verdict");
    assert_eq!(failed["detail"]["passed"], false);
    assert_eq!(failed["detail"]["runs"].as_array().unwrap().len(), 3);
    for id in [original, referee_id] {
        let j = job(&door, &id.to_string()).await;
        assert_eq!(j["status"], "done", "{j}");
        assert_eq!(event(&j, "verified").unwrap()["detail"]["passed"], true);
    }
    // The outvoted job is never paid; its hold went back.
    let paid = door.books.paid_jobs(31337, 3).await.unwrap();
    assert_eq!(paid.len(), 2);
    assert!(paid.iter().all(|p| p.job_id.to_string() != cheat_id));
    assert_eq!(
        door.held().await,
        paid.iter().map(|p| p.charged_wei).sum::<u128>()
    );
    // The evidence: the cheat's receipt against the two agreeing ones, which every signer can
    // check on its own.
    let queued = slashes(&door).await;
    assert_eq!(queued.len(), 1);
    assert_eq!(hex::encode(&queued[0].0), cheat_id.trim_start_matches("0x"));
    let evidence: SlashEvidence = serde_json::from_value(queued[0].1.clone()).unwrap();
    evidence.check().unwrap();
    assert_eq!(evidence.provider(), provs[*cheat_i].payout);
    assert_eq!(evidence.signers().len(), 3);
    // The outvoted count in the observed failure rate φ.
    let phi = door
        .books
        .observed_failure_rate(B256::from(provs[*cheat_i].id.id().0))
        .await
        .unwrap();
    assert!(phi > 1.0 / 20.0, "{phi}");
}

/// Guards a race the cross-process verify test hit: the two disagreeing results of a T1 pair
/// came in together, one judgement placed the referee, and the other, judged on the pair
/// alone, found no referee to add (it was there already) and refunded the whole group beside
/// it ("no majority"), so the cheat was never outvoted. A verdict judged on fewer runs than the
/// group now holds changes nothing, and the referee still decides.
#[tokio::test]
async fn a_verdict_judged_before_the_referee_was_placed_changes_nothing() {
    let door = Door::new().await;
    let provs = [
        Prov::new(41, "op-a"),
        Prov::new(42, "op-b"),
        Prov::new(43, "op-c"),
    ];
    let (original, pulled) = disagreeing_pair(&door, &provs).await;
    let [(honest_i, _), (cheat_i, cheat_job)] = &pulled;
    let cheat_id: B256 = cheat_job["job_id"].as_str().unwrap().parse().unwrap();

    // The other judgement, on the pair as it read it before the referee was placed.
    let stale = Verdict {
        refunded: vec![original, cheat_id],
        ..Verdict::default()
    };
    let applied = door
        .books
        .apply_verdict(original, &[original, cheat_id], &stale)
        .await
        .unwrap();
    assert!(!applied, "a verdict that never saw the referee is stale");
    for id in [original, cheat_id] {
        let j = job(&door, &id.to_string()).await;
        assert_eq!(j["status"], "verifying", "{j}");
    }

    // The referee is still out and decides.
    let referee_i = (0..3).find(|i| i != honest_i && i != cheat_i).unwrap();
    let referee = provs[referee_i].pull(&door).await;
    assert_eq!(referee.len(), 1);
    provs[referee_i].answer(&door, &referee[0], HONEST).await;
    let cheated = job(&door, &cheat_id.to_string()).await;
    assert_eq!(cheated["status"], "failed", "{cheated}");
    for id in [original, B256::from(run_job_id(original.0, 2))] {
        let j = job(&door, &id.to_string()).await;
        assert_eq!(j["status"], "done", "{j}");
    }
}

#[tokio::test]
async fn t3_runs_on_three_operators_and_the_majority_outvotes_the_buyers_own_provider() {
    let door = Door::new().await;
    let provs = [
        Prov::new(41, "op-a"),
        Prov::new(42, "op-b"),
        Prov::new(43, "op-c"),
    ];
    for p in &provs {
        p.register(&door).await;
    }
    let (status, accepted) = submit(&door, Tier::T3, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(accepted["tier"], "T3");
    assert_eq!(accepted["verification_runs"].as_array().unwrap().len(), 2);
    let original: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let refs: Vec<&Prov> = provs.iter().collect();
    let mut pulled = pull_all(&door, &refs).await;
    assert_eq!(pulled.len(), 3, "one run per operator: {pulled:?}");
    // The original's provider cheats, and answers first; the two others agree.
    pulled.sort_by_key(|(_, j)| j["job_id"] != original.to_string());
    let (i, j) = &pulled[0];
    provs[*i].answer(&door, j, CHEAT).await;
    let (i, j) = &pulled[1];
    provs[*i].answer(&door, j, HONEST).await;
    assert_eq!(
        job(&door, &original.to_string()).await["status"],
        "verifying",
        "one against one: the third decides"
    );
    let (i, j) = &pulled[2];
    provs[*i].answer(&door, j, HONEST).await;

    let buyers = job(&door, &original.to_string()).await;
    assert_eq!(buyers["status"], "failed", "its provider was outvoted");
    assert_eq!(
        buyers["result"]["text"], HONEST,
        "the buyer's job carries the majority's output"
    );
    let verdict = event(&buyers, "verification_failed").unwrap();
    assert_eq!(verdict["detail"]["tier"], "T3");
    for k in [1, 2] {
        let run = job(&door, &B256::from(run_job_id(original.0, k)).to_string()).await;
        assert_eq!(run["status"], "done", "{run}");
    }
    let queued = slashes(&door).await;
    assert_eq!(queued.len(), 1);
    let evidence: SlashEvidence = serde_json::from_value(queued[0].1.clone()).unwrap();
    evidence.check().unwrap();
    assert_eq!(evidence.provider(), provs[pulled[0].0].payout);
}

/// What broke: replicas were placed on distinct ML-DSA keys and self-declared operator strings,
/// and a majority was any two agreeing runs. Keys and operator strings cost nothing, so one party
/// with two keys of one payout account (the one identity `ProviderRegistry` stakes and slashes)
/// could take two of a T3 job's three runs, agree with itself, and have the honest third failed
/// and unpaid. Now replicas go to distinct payout accounts only, and agreement counts distinct
/// payout accounts: two keys of one account are one vote.
#[tokio::test]
async fn two_providers_of_one_identity_cannot_outvote_an_honest_third() {
    let door = Door::new().await;
    let sybil = Address::repeat_byte(0x5b);
    let (mut s1, mut s2, honest) = (
        Prov::new(61, "op-a"),
        Prov::new(62, "op-b"),
        Prov::new(63, "op-c"),
    );
    s1.payout = sybil;
    s2.payout = sybil;
    for p in [&s1, &s2, &honest] {
        p.register(&door).await;
    }
    // Three keys and three operator strings, but two on-chain identities: no T3 committee.
    let (status, body) = submit(&door, Tier::T3, 1).await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "two keys of one account took two replicas: {body}"
    );
    assert_eq!(body["error"]["code"], "no_diverse_committee", "{body}");

    // The second key shows another account while the job is placed, then moves back to the
    // first one's (an exchange without chains cannot tell): its vote still counts once.
    s2.payout = Address::repeat_byte(62);
    s2.register(&door).await;
    let (status, accepted) = submit(&door, Tier::T3, 2).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    s2.payout = sybil;
    s2.register(&door).await;
    let provs = [&s1, &s2, &honest];
    let pulled = pull_all(&door, &provs).await;
    assert_eq!(pulled.len(), 3, "{pulled:?}");
    let mut honest_job = None;
    // The honest provider answers last, after the two keys of one account agreed.
    for (i, j) in pulled.iter().filter(|(i, _)| *i != 2) {
        provs[*i].answer(&door, j, CHEAT).await;
    }
    for (i, j) in pulled.iter().filter(|(i, _)| *i == 2) {
        provs[*i].answer(&door, j, HONEST).await;
        honest_job = Some(j["job_id"].as_str().unwrap().to_owned());
    }
    let honest_job = job(&door, &honest_job.unwrap()).await;
    assert_ne!(
        honest_job["status"], "failed",
        "the honest third was outvoted by one identity: {honest_job}"
    );
    for (_, j) in &pulled {
        let run = job(&door, j["job_id"].as_str().unwrap()).await;
        assert_ne!(
            run["status"], "done",
            "nobody is paid without a majority: {run}"
        );
    }
    assert!(
        slashes(&door).await.is_empty(),
        "no evidence against anyone"
    );
}

#[tokio::test]
async fn intake_refuses_a_tier_the_fleet_cannot_verify_and_writes_nothing() {
    let door = Door::new().await;
    let (a, b, c) = (
        Prov::new(51, "op-a"),
        Prov::new(52, "op-a"),
        Prov::new(53, "op-b"),
    );
    a.register(&door).await;
    // One provider: T1 of class D has nowhere to re-execute.
    let (status, body) = submit(&door, Tier::T1, 1).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "no_replica");
    assert_eq!(body["error"]["field"], "min_tier");
    // Three providers but two operators: no diverse committee for T3.
    b.register(&door).await;
    c.register(&door).await;
    let (status, body) = submit(&door, Tier::T3, 2).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "no_diverse_committee");
    assert_eq!(body["error"]["field"], "min_tier");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("T3"),
        "{body}"
    );
    assert_eq!(door.count("exchange_jobs").await, 0);
    assert_eq!(door.count("exchange_orders").await, 0);
    assert_eq!(door.held().await, 0);
    // The same fleet verifies T1: two providers, operators differing where they can.
    let (status, body) = submit(&door, Tier::T1, 3).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

#[tokio::test]
async fn the_door_answers_a_call_whose_own_provider_was_outvoted_with_the_majoritys_output() {
    use cx_protocol::order::SessionGrant;
    let door = Door::new().await;
    let provs = [
        Prov::new(61, "op-a"),
        Prov::new(62, "op-b"),
        Prov::new(63, "op-c"),
    ];
    for p in &provs {
        p.register(&door).await;
    }
    let grant = SessionGrant {
        tab_id: 3,
        spend_cap_wei: 1_000_000,
        expiry_s: now_s() + 600,
        default_deadline_s: 60,
        default_tier: Tier::T1,
        default_determinism: DeterminismClass::D,
        default_max_price_wei: 100_000,
        bearer_hash: SessionGrant::bearer_hash_of(b"cxs_verify"),
        nonce: 9,
    };
    let signed = order::sign(grant, &domain(), &door.key, &door.pq).unwrap();
    let (status, body) = door
        .post("/v1/sessions", None, &json!({ "grant": signed }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let chat = json!({"model": "llama-8b", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "Say hello."}]});
    let agent = door.post("/v1/chat/completions", Some("cxs_verify"), &chat);
    let refs: Vec<&Prov> = provs.iter().collect();
    let providers = async {
        // The job and its replica, as the providers pull them.
        let mut pulled = Vec::new();
        while pulled.len() < 2 {
            pulled.extend(pull_all(&door, &refs).await);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let id = |j: &Value| -> B256 { j["job_id"].as_str().unwrap().parse().unwrap() };
        let (first, second) = (&pulled[0], &pulled[1]);
        let (original, replica) = if B256::from(run_job_id(id(&first.1).0, 1)) == id(&second.1) {
            (first, second)
        } else {
            (second, first)
        };
        // The call's own provider cheats; the replica and then the referee agree.
        provs[original.0].answer(&door, &original.1, CHEAT).await;
        provs[replica.0].answer(&door, &replica.1, HONEST).await;
        let third = (0..3)
            .find(|i| *i != original.0 && *i != replica.0)
            .unwrap();
        let referee = loop {
            if let Some(job) = provs[third].pull(&door).await.pop() {
                break job;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        provs[third].answer(&door, &referee, HONEST).await;
    };
    let ((status, completion), ()) = tokio::join!(agent, providers);
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(completion["choices"][0]["message"]["content"], HONEST);
}

/// GET `path` with `authorization` as the header (or none).
async fn get_with(door: &Door, path: &str, authorization: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::get(path);
    if let Some(value) = authorization {
        request = request.header(axum::http::header::AUTHORIZATION, value);
    }
    door.call(request.body(Body::empty()).unwrap()).await
}

/// The copying replica: while a T1 job awaits its verdict, its replica's provider (or anyone
/// else) cannot read the original's output to sign the same hash without computing — not by
/// id, not by the buyer's list, not by the events stream — and the buyer sees the output only
/// once the verdict makes it owe for it.
#[tokio::test]
async fn a_replica_cannot_read_the_output_it_verifies_and_the_buyer_sees_it_after_the_verdict() {
    let door = Door::new().await;
    let (a, b) = (Prov::new(41, "op-a"), Prov::new(42, "op-b"));
    a.register(&door).await;
    b.register(&door).await;
    let (status, accepted) = submit(&door, Tier::T1, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let pulled = pull_all(&door, &[&a, &b]).await;
    assert_eq!(pulled.len(), 2, "{pulled:?}");
    let provs = [&a, &b];
    let (first, first_job) = &pulled[0];
    let (second, second_job) = &pulled[1];
    provs[*first].answer(&door, first_job, HONEST).await;
    let first_id = first_job["job_id"].as_str().unwrap();
    let copier = provs[*second];
    let buyer = order::account_of(&door.key);
    for path in [
        format!("/v1/jobs/{first_id}"),
        format!("/v1/jobs/{first_id}/events"),
        format!("/v1/jobs?account={buyer}"),
    ] {
        for credential in [None, Some(format!("Bearer {}", copier.token))] {
            let (status, body) = get_with(&door, &path, credential.as_deref()).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
            assert_eq!(body["error"]["code"], "unauthorized", "{body}");
            assert!(!body.to_string().contains(HONEST));
        }
    }
    // Another account's own, valid credential reads nothing of the buyer's.
    let stranger = order::SigningKey::from_slice(&[77; 32]).unwrap();
    let (status, _) =
        crate::common::read_as(door.router(), &stranger, &format!("/v1/jobs/{first_id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = crate::common::read_as(
        door.router(),
        &stranger,
        &format!("/v1/jobs?account={buyer}"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // The buyer itself sees the job verifying, without the output, until the verdict.
    let (status, pending) = door.read(&format!("/v1/jobs/{first_id}")).await;
    assert_eq!(status, StatusCode::OK, "{pending}");
    assert_eq!(pending["status"], "verifying");
    assert_eq!(pending["result"], Value::Null, "{pending}");
    assert_eq!(pending["receipt"], Value::Null, "{pending}");
    let (_, list) = door.read(&format!("/v1/jobs?account={buyer}")).await;
    assert!(!list.to_string().contains(HONEST), "{list}");

    copier.answer(&door, second_job, HONEST).await;
    let (status, done) = door.read(&format!("/v1/jobs/{first_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done["status"], "done");
    assert_eq!(done["result"]["text"], HONEST, "{done}");
    assert!(done["receipt"].is_object());
}

/// The stalling buyer: a buyer who controls a replica lets the group expire unpaid; the
/// honest output it did not pay for is never shown to it.
#[tokio::test]
async fn a_job_that_ends_unpaid_never_shows_its_output_to_the_buyer() {
    let door = Door::new().await;
    let (a, b) = (Prov::new(43, "op-a"), Prov::new(44, "op-b"));
    a.register(&door).await;
    b.register(&door).await;
    let (status, accepted) = submit(&door, Tier::T1, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let pulled = pull_all(&door, &[&a, &b]).await;
    let provs = [&a, &b];
    let (first, first_job) = &pulled[0];
    provs[*first].answer(&door, first_job, HONEST).await;
    let first_id = first_job["job_id"].as_str().unwrap();
    // The replica never answers: the sweep ends the group at its deadline.
    let expired = door.books.expire_due(now_s() + 3_600).await.unwrap();
    assert_eq!(expired.len(), 2, "the job and its run");
    let (status, job) = door.read(&format!("/v1/jobs/{first_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["status"], "expired", "{job}");
    assert_eq!(job["result"], Value::Null, "{job}");
    let buyer = order::account_of(&door.key);
    let (_, list) = door.read(&format!("/v1/jobs?account={buyer}")).await;
    assert!(!list.to_string().contains(HONEST), "{list}");
}

// Issue 32 item 12: class D is byte equality among runs of one kernel corpus, yet a class-D job's
// replica went to the cheapest other provider whatever kernels it ran; a replica on other kernels
// may honestly differ in the last bits, outvote the job's provider and have it slashed. Here the
// cheapest other provider runs another corpus: the replica goes to the dearer one of the job's.
#[tokio::test]
async fn replicas_of_a_class_d_job_run_on_its_kernel_corpus_only() {
    let door = Door::new().await;
    let own = Prov::on_corpus(41, "op-a", "1000000", "cx-cpu-det-v1");
    let other = Prov::on_corpus(42, "op-b", "1100000", "other-det-v1");
    let same = Prov::on_corpus(43, "op-c", "1500000", "cx-cpu-det-v1");
    for p in [&own, &other, &same] {
        p.register(&door).await;
    }
    let (status, accepted) = submit(&door, Tier::T1, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(accepted["bundle_id"], own.bundle, "{accepted}");
    let runs = accepted["verification_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{accepted}");
    assert_eq!(runs[0]["bundle_id"], same.bundle, "{accepted}");

    // Without a second provider of the corpus, the job cannot be verified: refused.
    let door = Door::new().await;
    own.register(&door).await;
    other.register(&door).await;
    let (status, refused) = submit(&door, Tier::T1, 2).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["code"], "no_replica", "{refused}");
}

/// Twenty words, as a fast provider answers.
const FAST: &str = "The capital of France is Paris, a city on the Seine that has been the seat \
                    of government for centuries.";

/// `FAST` with one word flipped, as another fast provider's rounding may answer.
fn fast_flipped() -> String {
    FAST.replace("seat", "centre")
}

// Issue 32 item 12: class D∞ (what `--fast` and `--gpu` providers offer) was replicated by T3
// only and judged by output hash, so a T1 D∞ job was paid unverified, and two honest fast runs
// one flipped token apart never agreed. Now T1 places a replica and D∞ runs agree within the
// tolerance of `cx_protocol::tolerance`.
#[tokio::test]
async fn t1_replicates_a_d_inf_job_and_pays_both_runs_one_token_of_twenty_apart() {
    let door = Door::new().await;
    let (a, b) = (Prov::fast(71, "op-a"), Prov::fast(72, "op-b"));
    a.register(&door).await;
    b.register(&door).await;
    let (status, accepted) = submit_class(&door, Tier::T1, DeterminismClass::DInf, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let original: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let runs = accepted["verification_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "T1 places a D∞ replica: {accepted}");
    let run_id = B256::from(run_job_id(original.0, 1));
    let pulled = pull_all(&door, &[&a, &b]).await;
    assert_eq!(pulled.len(), 2, "one job each: {pulled:?}");
    let provs = [&a, &b];
    let flipped = fast_flipped();
    for (i, j) in &pulled {
        let text = if j["job_id"] == original.to_string() {
            FAST
        } else {
            flipped.as_str()
        };
        provs[*i].answer(&door, j, text).await;
    }
    for id in [original, run_id] {
        let job = job(&door, &id.to_string()).await;
        assert_eq!(job["status"], "done", "{job}");
        let d = &event(&job, "verified").expect("a verified event")["detail"];
        assert_eq!(d["passed"], true, "{d}");
        assert_eq!(d["agreement"], "d_inf_tolerance", "{d}");
    }
    assert_eq!(
        job(&door, &original.to_string()).await["result"]["text"],
        FAST,
        "the buyer gets its own provider's output"
    );
    let paid = door.books.paid_jobs(31337, 3).await.unwrap();
    assert_eq!(paid.len(), 2, "both runs are paid");
    assert!(slashes(&door).await.is_empty());
}

// The D∞ replica posts another text: the referee (on the one provider left, which offers only
// class D, whose bits are within any tolerance) agrees with the original; the cheat is failed
// and unpaid, and no slashing evidence is built (D∞ disagreement is never evidence).
#[tokio::test]
async fn a_d_inf_replica_with_another_text_is_outvoted_by_the_referee_unpaid_and_not_slashed() {
    let door = Door::new().await;
    let provs = [
        Prov::fast(81, "op-a"),
        Prov::fast(82, "op-b"),
        Prov::deterministic(83, "op-c"),
    ];
    for p in &provs {
        p.register(&door).await;
    }
    let (status, accepted) = submit_class(&door, Tier::T1, DeterminismClass::DInf, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let original: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let refs: Vec<&Prov> = provs.iter().collect();
    let pulled = pull_all(&door, &refs).await;
    assert_eq!(pulled.len(), 2, "{pulled:?}");
    assert!(
        pulled.iter().all(|(i, _)| *i != 2),
        "the D∞ providers first: {pulled:?}"
    );
    let (honest_i, honest_job) = pulled
        .iter()
        .find(|(_, j)| j["job_id"] == original.to_string())
        .unwrap();
    let (cheat_i, cheat_job) = pulled
        .iter()
        .find(|(_, j)| j["job_id"] != original.to_string())
        .unwrap();
    provs[*honest_i].answer(&door, honest_job, FAST).await;
    provs[*cheat_i].answer(&door, cheat_job, CHEAT).await;

    let referee = provs[2].pull(&door).await;
    assert_eq!(referee.len(), 1, "a referee on the D provider");
    let referee_id = B256::from(run_job_id(original.0, 2));
    assert_eq!(referee[0]["job_id"], referee_id.to_string());
    provs[2].answer(&door, &referee[0], &fast_flipped()).await;

    let cheat_id = cheat_job["job_id"].as_str().unwrap();
    let cheated = job(&door, cheat_id).await;
    assert_eq!(cheated["status"], "failed", "{cheated}");
    assert_eq!(
        event(&cheated, "verification_failed").unwrap()["detail"]["passed"],
        false
    );
    for id in [original, referee_id] {
        let j = job(&door, &id.to_string()).await;
        assert_eq!(j["status"], "done", "{j}");
    }
    assert_eq!(
        job(&door, &original.to_string()).await["result"]["text"],
        FAST
    );
    let paid = door.books.paid_jobs(31337, 3).await.unwrap();
    assert_eq!(paid.len(), 2);
    assert!(paid.iter().all(|p| p.job_id.to_string() != cheat_id));
    assert!(
        slashes(&door).await.is_empty(),
        "D∞ disagreement is never slashing evidence"
    );
}
