//! Provider offers on a real PostgreSQL against a hostile provider: an offer replaces the
//! provider's bundle set (what it no longer offers leaves the books' live set and the engine),
//! so re-offering fresh bundle ids cannot grow either without bound, and a bundle taken out
//! that jobs were cleared onto keeps its row, so those jobs still complete and settle.

use crate::door::{Door, Prov, bundle, domain, now_s, output, receipt};
use axum::http::StatusCode;
use cx_exchange::objective::Weights;
use cx_exchange::routing::catalog::Catalog;
use cx_exchange_server::market::Market;
use cx_protocol::offer::MAX_OFFER_BUNDLES;
use cx_protocol::order::{self, InferenceRequest, Intent, request_hash};
use cx_protocol::{DeterminismClass, Tier};
use serde_json::json;

const CATALOG: &str = include_str!("../../../core/catalog.example.toml");

/// The ids of the engine's live bundles.
fn live(door: &Door) -> Vec<String> {
    door.intake()
        .market()
        .bundles()
        .into_iter()
        .map(|b| b.id)
        .collect()
}

/// The ids of the bundles a restarted node would load into its engine.
async fn reloaded(door: &Door) -> Vec<String> {
    let market = Market::new(Catalog::from_toml_str(CATALOG).unwrap(), Weights::default()).unwrap();
    market.load(&door.books).await.unwrap();
    market.bundles().into_iter().map(|b| b.id).collect()
}

async fn register(door: &Door, prov: &Prov, ids: &[&str]) -> (StatusCode, serde_json::Value) {
    let bundles = ids.iter().map(|id| bundle(id)).collect();
    door.post("/v1/providers/register", None, &prov.offer(bundles))
        .await
}

/// What broke: every offer added its bundles and none ever left (the silence sweep is per
/// provider, and a provider re-offering stays heard), so a provider re-registering with fresh
/// ids grew `exchange_bundles` and the matching engine by its offer's size each time.
#[tokio::test]
async fn a_provider_reoffering_fresh_bundles_does_not_grow_the_books() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    let mut last = Vec::new();
    for round in 0..12 {
        last = (0..3).map(|k| format!("fresh-{round}-{k}")).collect();
        let ids: Vec<&str> = last.iter().map(String::as_str).collect();
        let (status, body) = register(&door, &prov, &ids).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    // Only the last offer's bundles: in the engine, in the books, and in what a restart loads.
    assert_eq!(live(&door), last);
    assert_eq!(reloaded(&door).await, last);
    // The last offer's bundles, and the previous offer's until the next one (an order cleared
    // onto them as they left may still be writing its job): no job named them, so every
    // earlier offer's rows are gone.
    assert_eq!(door.count("exchange_bundles").await, 6);

    // The bound on a provider's live bundles is the bound on one offer (an offer replaces the
    // set): one more is refused by field and changes nothing.
    let many: Vec<String> = (0..=MAX_OFFER_BUNDLES)
        .map(|k| format!("many-{k}"))
        .collect();
    let ids: Vec<&str> = many.iter().map(String::as_str).collect();
    let (status, body) = register(&door, &prov, &ids).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "offer.bundles", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&MAX_OFFER_BUNDLES.to_string()),
        "{body}"
    );
    assert_eq!(live(&door), last);
    assert_eq!(door.count("exchange_bundles").await, 6);
    // Exactly the bound is taken, and replaces the set.
    let (status, body) = register(&door, &prov, &ids[..MAX_OFFER_BUNDLES]).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(live(&door).len(), MAX_OFFER_BUNDLES);
    assert_eq!(reloaded(&door).await.len(), MAX_OFFER_BUNDLES);
    assert_eq!(
        door.count("exchange_bundles").await,
        MAX_OFFER_BUNDLES as i64 + 3
    );
    // An empty offer withdraws everything (the provider stays registered to finish its jobs),
    // and the one after it leaves no row behind.
    for _ in 0..2 {
        let (status, body) = register(&door, &prov, &[]).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert!(live(&door).is_empty());
        assert!(reloaded(&door).await.is_empty());
    }
    assert_eq!(door.count("exchange_bundles").await, 0);
}

/// A bundle its provider stops offering leaves the engine, but a job already cleared onto it
/// is still that provider's: it pulls it, returns the result and is paid, and the bundle's id
/// stays its own (no other key can take the id its receipts and history name).
#[tokio::test]
async fn a_job_on_a_withdrawn_bundle_still_completes_and_settles() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    let (status, body) = register(&door, &prov, &["old"]).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let request = InferenceRequest {
        prompt: "Say hello in one word.".into(),
        max_tokens: 8,
        ..Default::default()
    };
    let intent = Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash: request_hash(&request),
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
    assert_eq!(accepted["bundle_id"], "old");

    // The provider re-offers without "old": it leaves the engine and the live set, its row stays.
    let (status, body) = register(&door, &prov, &["new"]).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(live(&door), ["new"]);
    assert_eq!(reloaded(&door).await, ["new"]);
    assert_eq!(door.count("exchange_bundles").await, 2);
    let thief = Prov::new(5);
    let (status, body) = register(&door, &thief, &["old"]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("bundle_owned")),
        "{body}"
    );
    // Two more offers: "new" leaves and then goes (no job used it), "old" stays (a job did).
    for _ in 0..2 {
        let (status, body) = register(&door, &prov, &["newer"]).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    assert_eq!(live(&door), ["newer"]);
    let rows: Vec<String> = sqlx::query_scalar("SELECT id FROM exchange_bundles ORDER BY id")
        .fetch_all(door.books.pool())
        .await
        .unwrap();
    assert_eq!(rows, ["newer", "old"]);

    // The job is still the provider's to run, finish and be paid for.
    let (status, pulled) = door
        .post(
            "/v1/providers/jobs",
            Some(&prov.token),
            &json!({"wait_s": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{pulled}");
    let job = pulled["jobs"][0].clone();
    assert_eq!(job["job_id"], accepted["job_id"], "{pulled}");
    assert_eq!(job["bundle_id"], "old");
    let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
    let id = job["job_id"].as_str().unwrap();
    let (status, done) = door
        .post(
            &format!("/v1/jobs/{id}/result"),
            Some(&prov.token),
            &json!({"output": output("hi"), "receipt": receipt(&prov, &job, "hi", price)}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "done");
    let paid = door.books.paid_jobs(31337, 3).await.unwrap();
    assert_eq!(paid.len(), 1);
    assert_eq!(paid[0].charged_wei, price);

    // Offered again, the withdrawn bundle is live again under its owner.
    let (status, body) = register(&door, &prov, &["old", "newer"]).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(live(&door), ["newer", "old"]);
    assert_eq!(reloaded(&door).await, ["newer", "old"]);
}
