//! Reserves, rents and searches: accepted with both signatures and their most held on the tab,
//! refused by name where a field is unknown or unsupported, and their holds returned when they
//! end unfilled.

use crate::door::{Door, domain, now_s};
use alloy::primitives::{B256, Bytes};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use cx_protocol::Tier;
use cx_protocol::order::{self, Order, Rent, RentTarget, Reserve, Search};
use serde_json::{Value, json};

impl Door {
    fn signed<T: Order>(&self, order: T) -> Value {
        serde_json::to_value(order::sign(order, &domain(), &self.key, &self.pq).unwrap()).unwrap()
    }
}

fn reserve(compute_ms: u64, nonce: u64) -> Reserve {
    Reserve {
        model: "llama-8b".into(),
        tier: Tier::T1,
        window_start_s: now_s(),
        window_end_s: now_s() + 60,
        compute_ms,
        max_price_wei_per_s: 1_500,
        tab_id: 3,
        nonce,
        expiry_s: now_s() + 60,
    }
}

#[tokio::test]
async fn a_reserve_holds_its_take_or_pay_most_and_returns_it_when_it_ends_unfilled() {
    let door = Door::new().await;
    let (status, body) = door
        .post(
            "/v1/reserves",
            None,
            &json!({"reserve": door.signed(reserve(1_001, 1))}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // 1.001 s × 1 500 wei/s, rounded up.
    assert_eq!(body["held_wei"], "1502");
    assert_eq!(body["status"], "open");
    assert_eq!(door.held().await, 1502);
    let id = body["order_id"].as_str().unwrap();
    let (status, shown) = door
        .call(
            Request::get(format!("/v1/orders/{id}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["kind"], "reserve");
    assert_eq!(shown["order"]["reserve"]["order"]["compute_ms"], 1_001);

    let refusals = [
        (
            door.signed(reserve(1_002, 1)),
            StatusCode::CONFLICT,
            "nonce_reused",
        ),
        (
            door.signed(Reserve {
                model: "no-such-model".into(),
                ..reserve(1, 2)
            }),
            StatusCode::NOT_FOUND,
            "unknown_model",
        ),
        (
            door.signed(reserve(10_000_000_000, 3)),
            StatusCode::PAYMENT_REQUIRED,
            "tab_overspent",
        ),
    ];
    for (signed, status, code) in refusals {
        let (got, body) = door
            .post("/v1/reserves", None, &json!({"reserve": signed}))
            .await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }
    assert_eq!(door.count("exchange_standing_orders").await, 1);

    assert_eq!(door.books.expire_standing(now_s() + 61).await.unwrap(), 1);
    assert_eq!(door.held().await, 0, "the hold went back");
    let (_, shown) = door
        .call(
            Request::get(format!("/v1/orders/{id}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(shown["status"], "expired");
}

#[tokio::test]
async fn rents_and_searches_are_checked_by_field() {
    let door = Door::new().await;
    let rent = |target_kind, nonce| Rent {
        target_kind,
        target: B256::repeat_byte(0xab),
        term_s: 600,
        max_rent_wei: 5_000,
        epsilon_ppm: 1_000,
        tab_id: 3,
        nonce,
        expiry_s: now_s() + 60,
    };
    let (status, body) = door
        .post(
            "/v1/rents",
            None,
            &json!({"rent": door.signed(rent(RentTarget::Base, 1))}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "rent.order.target_kind");
    let (status, body) = door
        .post(
            "/v1/rents",
            None,
            &json!({"rent": door.signed(rent(RentTarget::Adapter, 2))}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "unknown_adapter");

    let search = |prefix: Vec<u8>, nonce| Search {
        prefix: Bytes::from(prefix),
        target: B256::repeat_byte(0x0f),
        deadline_s: now_s() + 30,
        max_price_wei: 7_000,
        tab_id: 3,
        nonce,
        expiry_s: now_s() + 30,
    };
    let (status, body) = door
        .post(
            "/v1/searches",
            None,
            &json!({"search": door.signed(search(vec![1; 2_000], 3))}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "search.order.prefix");
    let (status, body) = door
        .post(
            "/v1/searches",
            None,
            &json!({"search": door.signed(search(b"cx".to_vec(), 4))}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["held_wei"], "7000");
    assert_eq!(door.count("exchange_standing_orders").await, 1);
    // Signed by someone the exchange has no binding for.
    let stranger = order::SigningKey::from_slice(&[8; 32]).unwrap();
    let forged = order::sign(search(b"cx".to_vec(), 5), &domain(), &stranger, &door.pq).unwrap();
    let (status, body) = door
        .post("/v1/searches", None, &json!({"search": forged}))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(door.count("exchange_standing_orders").await, 1);
}

mod reserves {
    //! Reserves filled by providers: signed bids until the window starts, the lowest feasible
    //! one committed at the start, the buyer's intents drawing on it at no price, and the
    //! take-or-pay claimed with a receipt at the end.

    use super::*;
    use crate::door::{PAYOUT, Prov, bundle, output, receipt};
    use cx_protocol::DeterminismClass;
    use cx_protocol::bid::{ReserveBid, SignedBid};
    use cx_protocol::order::{InferenceRequest, Intent, request_hash};
    use cx_protocol::receipt::{Receipt, SignedReceipt};

    const CHAIN: u64 = 31337;

    fn bid(prov: &Prov, reserve: B256, bundle_id: &str, rate: u64) -> Value {
        let bid = ReserveBid {
            reserve_id: reserve,
            bundle_id: bundle_id.into(),
            rate_wei_per_s: rate,
            provider_key: B256::from(prov.id.id().0),
        };
        json!({"bid": SignedBid::sign(bid, &prov.id).unwrap()})
    }

    fn take_or_pay(prov: &Prov, id: B256, buyer: [u8; 20], amount: u128) -> SignedReceipt {
        SignedReceipt::sign(
            Receipt {
                job_id: id.0,
                chain_id: CHAIN,
                escrow_id: 3,
                input_hash: id.0,
                output_hash: [0; 32],
                adapter_hash: [0; 32],
                tokens: 0,
                compute_ms: 2_000,
                class: DeterminismClass::D,
                provider: PAYOUT.0.0,
                provider_key: prov.id.id().0,
                amount_owed_wei: amount,
                buyer,
            },
            &prov.id,
        )
        .unwrap()
    }

    async fn order(door: &Door, id: B256) -> Value {
        let (status, shown) = door
            .call(
                Request::get(format!("/v1/orders/{id}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{shown}");
        shown
    }

    async fn sleep_until(unix_s: u64) {
        while now_s() < unix_s {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    #[tokio::test]
    async fn the_lowest_feasible_bid_wins_an_intent_in_the_window_draws_on_it_and_take_or_pay_is_owed()
     {
        let door = Door::new().await;
        let (a, b, c) = (Prov::new(4), Prov::new(5), Prov::new(6));
        for (prov, id) in [(&a, "a"), (&b, "b"), (&c, "c")] {
            let (status, body) = door
                .post(
                    "/v1/providers/register",
                    None,
                    &prov.offer(vec![bundle(id)]),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let t0 = now_s();
        // 2 s of T1 compute in [t0 + 3, t0 + 40), at most 900 000 wei/s (spot asks 1 000 000).
        let reserve = Reserve {
            model: "llama-8b".into(),
            tier: Tier::T1,
            window_start_s: t0 + 3,
            window_end_s: t0 + 40,
            compute_ms: 2_000,
            max_price_wei_per_s: 900_000,
            tab_id: 3,
            nonce: 1,
            expiry_s: t0 + 60,
        };
        let (status, body) = door
            .post(
                "/v1/reserves",
                None,
                &json!({"reserve": door.signed(reserve.clone())}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["held_wei"], "1800000");
        let id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();

        // Bids that cannot be taken are refused by field and leave no row.
        let refusals = [
            // Above the buyer's limit.
            (&a, bid(&a, id, "a", 900_001), "bid.bundle_id"),
            // Another provider's bundle.
            (&b, bid(&b, id, "a", 1), "bid.bundle_id"),
            // Signed for another reserve.
            (&b, bid(&b, B256::repeat_byte(1), "b", 1), "bid.reserve_id"),
        ];
        for (prov, body, field) in refusals {
            let (status, got) = door
                .post(&format!("/v1/reserves/{id}/bids"), Some(&prov.token), &body)
                .await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{got}");
            assert_eq!(got["error"]["field"], field, "{got}");
        }
        // Another provider's signature is not this provider's bid.
        let (status, got) = door
            .post(
                &format!("/v1/reserves/{id}/bids"),
                Some(&a.token),
                &bid(&b, id, "b", 700_000),
            )
            .await;
        assert!(status.is_client_error(), "{got}");
        assert_eq!(door.count("exchange_reserve_bids").await, 0);

        for (prov, bundle_id, rate) in [(&a, "a", 800_000), (&b, "b", 700_000), (&c, "c", 100_000)]
        {
            let (status, got) = door
                .post(
                    &format!("/v1/reserves/{id}/bids"),
                    Some(&prov.token),
                    &bid(prov, id, bundle_id, rate),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{got}");
        }
        // The cheapest bidder's bundle stops offering T1 before the window starts: its bid can
        // no longer win.
        let mut t0_only = bundle("c");
        t0_only.tiers = [Tier::T0].into_iter().collect();
        let (status, _) = door
            .post("/v1/providers/register", None, &c.offer(vec![t0_only]))
            .await;
        assert_eq!(status, StatusCode::CREATED);
        assert!(
            door.intake()
                .award_reserves(now_s())
                .await
                .unwrap()
                .is_empty(),
            "nothing is due before the window"
        );

        sleep_until(t0 + 3).await;
        let awarded = door.intake().award_reserves(now_s()).await.unwrap();
        assert_eq!(awarded, vec![(id, Some("b".to_owned()))]);
        let shown = order(&door, id).await;
        assert_eq!(shown["status"], "committed", "{shown}");
        let fill = &shown["reserve"];
        assert_eq!(fill["bundle_id"], "b");
        assert_eq!(fill["rate_wei_per_s"], 700_000);
        let bids = fill["bids"].as_array().unwrap();
        let status_of = |bundle: &str| {
            let bid = bids.iter().find(|x| x["bundle_id"] == bundle).unwrap();
            (bid["status"].as_str().unwrap(), bid["refusal"].clone())
        };
        assert_eq!(status_of("b").0, "won");
        assert_eq!(status_of("a").0, "lost");
        assert_eq!(status_of("c"), ("lost", json!({"binding": "tier"})));
        let (status, got) = door
            .post(
                &format!("/v1/reserves/{id}/bids"),
                Some(&a.token),
                &bid(&a, id, "a", 1),
            )
            .await;
        assert_eq!(
            (status, got["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("reserve_not_open")),
            "{got}"
        );

        // An intent of the same tab and model in the window goes to the committed bundle at no
        // price of its own.
        let request = InferenceRequest {
            prompt: "Say hello in one word.".into(),
            max_tokens: 16,
        };
        let intent = Intent {
            want: "llama-8b".into(),
            adapter_id: None,
            request_hash: request_hash(&request),
            deadline_s: now_s() + 30,
            max_price_wei: 100_000,
            min_tier: Tier::T0,
            // Class S: drawn at the reserve's T1, which for class D would also place a
            // replica at spot (`verification.rs`); this test is about the draw alone.
            determinism: DeterminismClass::S,
            tab_id: 3,
            nonce: 2,
            expiry_s: now_s() + 60,
        };
        let (status, accepted) = door
            .post(
                "/v1/intents",
                None,
                &json!({"intent": door.signed(intent), "request": request}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
        assert_eq!(accepted["bundle_id"], "b");
        assert_eq!(accepted["held_wei"], "0");
        assert_eq!(accepted["tier"], "T1", "verified at the reserve's tier");
        assert_eq!(door.held().await, 1_800_000, "only the reserve's hold");
        let (status, pulled) = door
            .post(
                "/v1/providers/jobs",
                Some(&b.token),
                &json!({"max_jobs": 4, "wait_s": 1}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pulled}");
        let job = pulled["jobs"][0].clone();
        assert_eq!(job["price_wei"], "0");
        let text = "Hello.";
        let (status, done) = door
            .post(
                &format!("/v1/jobs/{}/result", job["job_id"].as_str().unwrap()),
                Some(&b.token),
                &json!({"output": output(text), "receipt": receipt(&b, &job, text, 0)}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        let fill = order(&door, id).await["reserve"].clone();
        assert_eq!(fill["draws"], 1);
        assert!(fill["used_ms"].as_u64().unwrap() > 0, "{fill}");

        // Take-or-pay: only the committed provider, only after the window, only the rate ×
        // the reserved compute.
        let buyer = order::account_of(&door.key).0.0;
        let owed = 700_000 * 2_000 / 1_000;
        let path = format!("/v1/reserves/{id}/take_or_pay");
        let (status, got) = door
            .post(
                &path,
                Some(&a.token),
                &json!({"receipt": take_or_pay(&a, id, buyer, owed)}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{got}");
        let (status, got) = door
            .post(
                &path,
                Some(&b.token),
                &json!({"receipt": take_or_pay(&b, id, buyer, owed)}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "window not over: {got}");
        let provider = door.intake().provider(&b.token).await.unwrap();
        let after = reserve.window_end_s;
        let err = door
            .intake()
            .claim_reserve(&provider, id, &take_or_pay(&b, id, buyer, owed + 1), after)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("amount_owed_wei"), "{err}");
        door.intake()
            .claim_reserve(&provider, id, &take_or_pay(&b, id, buyer, owed), after)
            .await
            .unwrap();
        let shown = order(&door, id).await;
        assert_eq!(shown["status"], "filled");
        assert_eq!(shown["reserve"]["charged_wei"], owed.to_string());
        assert_eq!(shown["reserve"]["settlement"], "done");
        assert_eq!(door.held().await, owed, "the rest of the hold went back");
        // The tab pays the take-or-pay once; the drawn intent, priced zero, has no voucher.
        let paid = door.books.paid_jobs(CHAIN, 3).await.unwrap();
        assert_eq!(paid.len(), 1);
        assert_eq!(
            (paid[0].kind.as_str(), paid[0].charged_wei),
            ("reserve", owed)
        );
    }

    #[tokio::test]
    async fn a_reserve_with_no_bid_by_its_start_returns_its_hold() {
        let door = Door::new().await;
        let t0 = now_s();
        let (status, body) = door
            .post(
                "/v1/reserves",
                None,
                &json!({"reserve": door.signed(Reserve {
                    window_start_s: t0 + 5,
                    window_end_s: t0 + 60,
                    ..reserve(1_000, 1)
                })}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        assert_eq!(door.held().await, 1_500);
        let awarded = door.intake().award_reserves(t0 + 5).await.unwrap();
        assert_eq!(awarded, vec![(id, None)]);
        assert_eq!(order(&door, id).await["status"], "expired");
        assert_eq!(door.held().await, 0);
    }
}
