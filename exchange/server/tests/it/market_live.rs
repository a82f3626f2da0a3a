//! The market maker on live load, and market orders: a door call that leaves its limit to the
//! market is cleared under the market's quote for it (bundles asking more are refused, the quote
//! is recorded in the decision), refused when the quote costs more than the session has left;
//! and the regime moves off calm when work piles up and back when it drains.

use crate::door::{Door, Prov, bundle, chat, now_s};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use cx_exchange::pricing::hmm::Regime;
use cx_protocol::Tier;
use serde_json::{Value, json};

const MODEL: &str = "llama-3.1-8b-instruct";

/// A bundle of the door's fleet asking `ask_wei_per_s`, holding the base or not.
fn priced(id: &str, ask_wei_per_s: u64, holds_base: bool) -> cx_protocol::Bundle {
    let mut b = bundle(id);
    b.price_wei_per_s = ask_wei_per_s;
    if !holds_base {
        b.resident_bases.clear();
    }
    b
}

/// Two bundles at 1 M wei/s that would have to fetch the base, one at 50 M wei/s holding it:
/// the median ask (the market's reference) is 1 M wei/s.
async fn fleet(door: &Door) {
    let prov = Prov::new(4);
    let offer = prov.offer(vec![
        priced("cold-a", 1_000_000, false),
        priced("cold-b", 1_000_000, false),
        priced("dear", 50_000_000, true),
    ]);
    let (status, body) = door.post("/v1/providers/register", None, &offer).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// The open quote of the catalog model's T0 market.
fn t0_quote(market: &cx_exchange_server::market::Market) -> cx_exchange_server::books::MarketQuote {
    market
        .quotes()
        .unwrap()
        .into_iter()
        .find(|q| q.model == MODEL && q.tier == Tier::T0)
        .unwrap()
}

/// The decision of the job a door call under the market session key placed.
async fn placed_decision(door: &Door, call: Value) -> Value {
    door.placed_decision("cxs_market", &call).await
}

#[tokio::test]
async fn a_market_order_clears_under_the_quote_and_records_it() {
    let door = Door::new().await;
    fleet(&door).await;
    let (status, opened) = door.session("cxs_market", 2_000_000, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");

    // With a limit in wei, the bundle holding the base wins, whatever it asks (μ1).
    let fixed = placed_decision(&door, chat(json!({"cx": {"deadline_in_s": 30}}))).await;
    assert_eq!(fixed["chosen"], "dear", "{fixed}");
    assert!(fixed.get("quote").is_none(), "{fixed}");

    // Left to the market, only bundles asking at most the quote's ask may take it.
    let market = placed_decision(
        &door,
        chat(json!({"cx": {"deadline_in_s": 30, "max_price_wei": "market"}})),
    )
    .await;
    let quote = &market["quote"];
    let ask: u64 = quote["ask_wei_per_s"].as_str().unwrap().parse().unwrap();
    let bid: u64 = quote["bid_wei_per_s"].as_str().unwrap().parse().unwrap();
    assert!(
        bid < ask && (1_000_000..2_000_000).contains(&ask),
        "{quote}"
    );
    assert!(quote["regime"].is_string(), "{quote}");
    assert!(
        ["cold-a", "cold-b"].contains(&market["chosen"].as_str().unwrap()),
        "{market}"
    );
    let dear = market["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "dear")
        .expect("the dear bundle is refused");
    assert_eq!(dear["binding"], "price", "{dear}");

    // The order filled under its quote: the buyer's next one is quoted no higher (its own
    // preference, learned from that fill; `a_tenants_fills_tilt_its_own_quote_and_no_one_elses`).
    let again = placed_decision(
        &door,
        chat(json!({"cx": {"deadline_in_s": 30, "max_price_wei": "market"}})),
    )
    .await;
    let next: u64 = again["quote"]["ask_wei_per_s"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(next <= ask, "{} then {}", quote, again["quote"]);
}

#[tokio::test]
async fn a_market_order_is_refused_when_the_quote_costs_more_than_the_session_has_left() {
    let door = Door::new().await;
    fleet(&door).await;
    // 1 wei of room: no bundle's charge at or under the quote fits.
    let (status, opened) = door.session("cxs_market", 1, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");
    let (status, body) = door
        .post(
            "/v1/chat/completions",
            Some("cxs_market"),
            &chat(json!({"cx": {"max_price_wei": "market"}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "no_match", "{body}");
    assert_eq!(door.count("exchange_jobs").await, 0);
    assert_eq!(door.held().await, 0);

    // A limit that is neither wei nor "market" is refused by name.
    let (status, body) = door
        .post(
            "/v1/chat/completions",
            Some("cxs_market"),
            &chat(json!({"cx": {"max_price_wei": "cheap"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"].to_string().contains("max_price_wei"),
        "{body}"
    );
    assert_eq!(door.count("exchange_jobs").await, 0);
}

#[tokio::test]
async fn the_regime_moves_off_calm_under_a_backlog_and_back_when_it_drains() {
    let door = Door::new().await;
    let prov = Prov::new(4);
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer(vec![priced("only", 1_000_000, true)]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, opened) = door.session("cxs_market", 2_000_000, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");
    let market = door.intake().market();
    let mut now = now_s();
    // Idle: the sweeps see no work on the one bundle offering the market, and it calms.
    for _ in 0..20 {
        now += 1;
        let open = door.books.open_work().await.unwrap();
        market.observe_load(&open, now).unwrap();
    }
    let calm = t0_quote(market);
    assert_eq!(calm.regime, Regime::Calm, "{calm:?}");
    assert!(calm.observations >= 20);

    // Eight calls nobody runs pile up on it: the engine's queue counts them at once, and the
    // maker sees eight jobs per server.
    for _ in 0..8 {
        placed_decision(&door, chat(json!({"cx": {"deadline_in_s": 30}}))).await;
    }
    let open = door.books.open_work().await.unwrap();
    assert_eq!(open.iter().map(|w| w.jobs).sum::<u64>(), 8, "{open:?}");
    let mut surged_after = None;
    for sweep in 1..=10 {
        now += 1;
        market.observe_load(&open, now).unwrap();
        if surged_after.is_none() && t0_quote(market).regime == Regime::Surge {
            surged_after = Some(sweep);
        }
    }
    let surge = t0_quote(market);
    assert!(surged_after.is_some_and(|s| s <= 3), "{surge:?}");
    assert!(
        surge.ask_wei_per_s > calm.ask_wei_per_s,
        "{surge:?} vs {calm:?}"
    );

    // Their deadlines pass: the work drains, and the market calms again, its ask back down.
    door.books.expire_due(now + 60).await.unwrap();
    let mut calmed_after = None;
    for sweep in 1..=60 {
        now += 1;
        let open = door.books.open_work().await.unwrap();
        assert!(open.is_empty());
        market.observe_load(&open, now + 60).unwrap();
        if calmed_after.is_none() && t0_quote(market).regime == Regime::Calm {
            calmed_after = Some(sweep);
        }
    }
    let after = t0_quote(market);
    assert!(calmed_after.is_some_and(|s| s <= 10), "{after:?}");
    assert!(after.ask_wei_per_s < surge.ask_wei_per_s, "{after:?}");
}

#[tokio::test]
async fn a_tenants_fills_tilt_its_own_quote_and_no_one_elses() {
    let door = Door::new().await;
    fleet(&door).await;
    let (status, opened) = door.session("cxs_market", 2_000_000, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");
    let call = chat(json!({"cx": {"deadline_in_s": 30, "max_price_wei": "market"}}));
    let first = placed_decision(&door, call.clone()).await;
    assert_eq!(first["quote"]["tenant_log_multiplier"], 0.0, "{first}");
    let ask = |d: &Value| -> u64 {
        d["quote"]["ask_wei_per_s"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    // Its orders fill at 1 M wei/s, under the shared ask: its own quote comes down toward what it
    // pays (never under it: the bundles it fills on stay eligible).
    let mut last = first.clone();
    for _ in 0..6 {
        last = placed_decision(&door, call.clone()).await;
    }
    let tilted = last["quote"]["tenant_log_multiplier"].as_f64().unwrap();
    assert!(tilted < 0.0, "{last}");
    assert!(
        ask(&last) < ask(&first),
        "{} vs {}",
        ask(&last),
        ask(&first)
    );
    assert!(ask(&last) >= 1_000_000, "{last}");
    assert!(
        ["cold-a", "cold-b"].contains(&last["chosen"].as_str().unwrap()),
        "{last}"
    );
    // The shared quote, what every other account is quoted, has not moved.
    let market = door.intake().market();
    let shared = t0_quote(market);
    assert_eq!(shared.observations, 0, "no sweep ran");
    let buyer = cx_protocol::order::account_of(&door.key);
    let other = cx_protocol::order::Address::repeat_byte(0x42);
    assert!(market.preference_of(buyer).is_some());
    assert!(market.preference_of(other).is_none());

    // Stored as the sweep stores it, read back from the books (`Preferences::restore` puts a
    // stored delta back in a restarted market), shown on the explorer.
    let changed = market.changed_preferences();
    assert_eq!(changed.len(), 1);
    door.books.save_tenant_preferences(&changed).await.unwrap();
    let stored = door.books.tenant_preferences().await.unwrap();
    assert_eq!(stored, changed);
    let (status, page) = door
        .text(
            Request::get(format!("/explorer/accounts/{buyer}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Learned from 7 of this account"), "{page}");
}
