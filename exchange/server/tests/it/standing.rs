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
    for (kind, nonce, what) in [
        (RentTarget::Base, 1, "reports base"),
        (RentTarget::Prefix, 5, "reports prefix"),
    ] {
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(rent(kind, nonce))}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["field"], "rent.order.target");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(what),
            "{body}"
        );
    }
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
        success_ppm: 990_000,
        deadline_s: now_s() + 30,
        max_price_wei: 8_000,
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
            &json!({"search": door.signed(Search {
                success_ppm: 1_000_000,
                ..search(b"cx".to_vec(), 4)
            })}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "search.order.success_ppm");
    // No live provider takes searches: nothing can price the work.
    let (status, body) = door
        .post(
            "/v1/searches",
            None,
            &json!({"search": door.signed(search(b"cx".to_vec(), 4))}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["field"], "search.order", "{body}");
    searcher(&door, 1).await;
    let (status, body) = door
        .post(
            "/v1/searches",
            None,
            &json!({"search": door.signed(search(b"cx".to_vec(), 4))}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // q = 0x0f0f…/2²⁵⁶ ≈ 0.0588: ⌈ln 0.01 / ln(1 − q)⌉ = 76 trials at 10⁶ wei/s and
    // 10⁴ trials/s, 100 wei a trial.
    assert_eq!(body["held_wei"], "7600");
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

/// Registers a provider (seed `seed`) taking searches at 10⁴ trials/s, its bundle asking
/// 10⁶ wei/s: 100 wei a trial.
async fn searcher(door: &Door, seed: u8) -> crate::door::Prov {
    let prov = crate::door::Prov::new(seed);
    let bundle = crate::door::bundle(&format!("searcher-{seed}"));
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer_with(vec![bundle], None, Some(10_000)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    prov
}

#[tokio::test]
async fn a_search_is_held_at_its_budget_and_a_witness_paid_the_work_it_implies() {
    use cx_protocol::DeterminismClass;
    use cx_protocol::receipt::{Receipt, SignedReceipt};
    use sha2::{Digest, Sha256};
    let door = Door::new().await;
    let prov = searcher(&door, 4).await;
    // p = 1/2 a trial (one leading zero bit): a witness implies two trials' work; the buyer
    // asks for 99.9 %, ⌈ln 0.001 / ln 0.5⌉ = 10 trials, held.
    let search = Search {
        prefix: Bytes::from_static(b"cx-half"),
        target: B256::from(cx_exchange::lifecycle::search::target_for_zero_bits(1)),
        success_ppm: 999_000,
        deadline_s: now_s() + 30,
        max_price_wei: 5_000,
        tab_id: 3,
        nonce: 9,
        expiry_s: now_s() + 30,
    };
    let (status, body) = door
        .post(
            "/v1/searches",
            None,
            &json!({"search": door.signed(search.clone())}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["held_wei"], "1000", "10 trials at 100 wei");
    assert_eq!(door.held().await, 1_000);
    let id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
    let (_, open) = door
        .call(
            Request::get("/v1/providers/searches")
                .header("authorization", format!("Bearer {}", prov.token))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    let price = &open["searches"][0]["order"]["price"];
    assert_eq!(
        (
            &price["budget_trials"],
            &price["witness_trials"],
            &price["witness_wei"]
        ),
        (&json!("10"), &json!("2"), &json!("200")),
        "{open}"
    );

    let witness = (0..).find(|n| search.is_witness(*n)).unwrap();
    let claim = |amount_owed_wei| {
        SignedReceipt::sign(
            Receipt {
                job_id: id.0,
                chain_id: 31337,
                escrow_id: 3,
                input_hash: id.0,
                output_hash: Sha256::digest(u64::to_le_bytes(witness)).into(),
                adapter_hash: [0; 32],
                tokens: 0,
                compute_ms: 1,
                class: DeterminismClass::D,
                provider: crate::door::PAYOUT.0.0,
                provider_key: prov.id.id().0,
                amount_owed_wei,
                buyer: order::account_of(&door.key).0.0,
            },
            &prov.id,
        )
        .unwrap()
    };
    let path = format!("/v1/searches/{id}/witness");
    let claimed = |amount| json!({"witness": witness, "receipt": claim(amount)});
    // Claiming the whole hold is refused by name; nothing changes.
    let (status, body) = door.post(&path, Some(&prov.token), &claimed(1_000)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["error"]["field"], "receipt.receipt.amount_owed_wei",
        "{body}"
    );
    assert_eq!(door.held().await, 1_000);
    let (status, body) = door.post(&path, Some(&prov.token), &claimed(200)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "filled");
    assert_eq!(
        door.held().await,
        200,
        "two trials' work charged, the rest returned"
    );
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
            ..Default::default()
        };
        let intent = Intent {
            want: "llama-8b".into(),
            adapter_id: None,
            request_hash: request_hash(&request),
            deadline_s: now_s() + 30,
            max_price_wei: 100_000,
            market_limit: false,
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

mod rents {
    //! Adapter rents filled by providers: committed at acceptance to the cheapest bundle that
    //! can keep the adapter resident, its residency measured every sweep from the bundle's
    //! reports and its jobs' missed deadlines, and claimed at the term's end less the rebate a
    //! missed SLA earns.

    use super::*;
    use crate::door::{PAYOUT, Prov, bundle, chat};
    use axum::http::header;
    use base64::Engine as _;
    use cx_protocol::DeterminismClass;
    use cx_protocol::receipt::{Receipt, SignedReceipt};

    const CHAIN: u64 = 31337;

    /// Stores an adapter on `base`; its content id and |a|.
    async fn adapter(door: &Door, base: &str) -> (String, u64) {
        let data: Vec<u8> = (0..64u8).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4, 4], &data)
            .unwrap();
        let weights = safetensors::serialize(
            [(
                "base_model.model.layers.0.self_attn.q_proj.lora_A.weight",
                view,
            )],
            None,
        )
        .unwrap();
        let config = json!({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                            "target_modules": ["q_proj"], "base_model_name_or_path": base})
        .to_string();
        let files = json!({
            "adapter_config": config,
            "adapter_model_safetensors_base64":
                base64::engine::general_purpose::STANDARD.encode(&weights),
        });
        let (status, stored) = door
            .call(
                Request::put("/v1/adapters")
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(
                        header::AUTHORIZATION,
                        door.credential(cx_protocol::access::Scope::Store),
                    )
                    .body(Body::from(files.to_string()))
                    .unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{stored}");
        let id = stored["id"].as_str().unwrap().to_owned();
        let bytes = door.books.adapter_bytes(&id).await.unwrap().unwrap();
        (id, bytes)
    }

    /// A bundle on the catalog's 8B base asking `ask` wei/s with `memory_bytes` free.
    fn holder(id: &str, ask: u64, memory_bytes: u64) -> cx_protocol::Bundle {
        let mut b = bundle(id);
        b.price_wei_per_s = ask;
        b.memory_bytes = memory_bytes;
        b
    }

    /// A rent tolerating ε = 10 %: one holder, at the prior's 5 % miss probability.
    fn rent(adapter: &str, term_s: u64, max_rent_wei: u128, nonce: u64) -> Rent {
        Rent {
            target_kind: RentTarget::Adapter,
            target: adapter.parse().unwrap(),
            term_s,
            max_rent_wei,
            epsilon_ppm: 100_000,
            tab_id: 3,
            nonce,
            expiry_s: now_s() + 60,
        }
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

    /// Registers `bundles` with a residency report whose 10⁶-byte slot has a shadow price of
    /// 360 loading seconds over the hour: at an ask of 10⁶ wei/s, ρ = 3.6·10¹¹ wei per GB-hour.
    async fn register(door: &Door, prov: &Prov, bundles: Vec<cx_protocol::Bundle>) {
        register_with(door, prov, bundles, Some(360.0)).await;
    }

    /// Registers `bundles` with a residency report whose slot's shadow price is `shadow_s`.
    async fn register_with(
        door: &Door,
        prov: &Prov,
        bundles: Vec<cx_protocol::Bundle>,
        shadow_s: Option<f64>,
    ) {
        let report = cx_protocol::offer::Residency {
            pinned_adapters: vec![],
            free_bytes: 10_000_000,
            slot_bytes: 1_000_000,
            slot_shadow_price: shadow_s,
            prefixes: vec![],
            prefix_bytes: vec![],
            bases: vec![],
        };
        let (status, body) = door
            .post(
                "/v1/providers/register",
                None,
                &prov.offer_with(bundles, Some(report), None),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    fn claim(prov: &Prov, id: B256, adapter: &str, buyer: [u8; 20], amount: u128) -> Value {
        let receipt = SignedReceipt::sign(
            Receipt {
                job_id: id.0,
                chain_id: CHAIN,
                escrow_id: 3,
                input_hash: id.0,
                output_hash: [0; 32],
                adapter_hash: adapter.parse::<B256>().unwrap().0,
                tokens: 0,
                compute_ms: 0,
                class: DeterminismClass::D,
                provider: PAYOUT.0.0,
                provider_key: prov.id.id().0,
                amount_owed_wei: amount,
                buyer,
            },
            &prov.id,
        )
        .unwrap();
        json!({ "receipt": receipt })
    }

    #[tokio::test]
    async fn a_rent_is_committed_to_the_cheapest_bundle_that_can_hold_it() {
        let door = Door::new().await;
        let (a, b, c) = (Prov::new(4), Prov::new(5), Prov::new(6));
        let mut no_base = holder("no-base", 1, 10_000_000);
        no_base.resident_bases.clear();
        // Cheaper than `warm` but without the base, or without room for the adapter.
        register(&door, &a, vec![no_base, holder("tight", 2, 10)]).await;
        register(&door, &b, vec![holder("warm", 1_000_000, 10_000_000)]).await;
        register(&door, &c, vec![holder("dear", 2_000_000, 10_000_000)]).await;
        // Asking half of `warm`, but its cache is busy: the shadow price of its bytes is ten
        // times `warm`'s, so its ρ is five times. And one whose cache can make no slot at all.
        let (busy, full) = (Prov::new(7), Prov::new(8));
        register_with(
            &door,
            &busy,
            vec![holder("busy", 500_000, 10_000_000)],
            Some(3_600.0),
        )
        .await;
        register_with(&door, &full, vec![holder("full", 1, 10_000_000)], None).await;
        let (id, size) = adapter(&door, "llama-3.1-8b-instruct").await;

        // ρ = 360 s × 10⁶ wei/s × 10⁹ / 10⁶ B = 3.6·10¹¹ wei per GB-hour (above the floor, a
        // hundredth of the ask's share, 3.6·10⁹); over 600 s that is |a| × 60 wei.
        let want = u128::from(size) * 60;
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(rent(&id, 600, want - 1, 1))}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["code"], "no_capable_bundle", "{body}");
        assert_eq!(body["error"]["field"], "rent.order.max_rent_wei", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("ask {want} wei")),
            "{body}"
        );
        assert_eq!(door.count("exchange_standing_orders").await, 0);
        assert_eq!(door.held().await, 0, "a refused rent holds nothing");

        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(rent(&id, 600, 1_000_000, 2))}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["status"], "committed");
        assert_eq!(
            door.held().await,
            want,
            "the term's rent is held, not the buyer's limit"
        );
        let order_id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let shown = order(&door, order_id).await;
        assert_eq!(shown["status"], "committed");
        assert_eq!(shown["rent"]["size_bytes"], size);
        assert_eq!(shown["rent"]["holders"].as_array().unwrap().len(), 1);
        let fill = &shown["rent"]["holders"][0];
        assert_eq!(fill["bundle_id"], "warm", "{shown}");
        assert_eq!(
            fill["provider_key_hash"],
            B256::from(b.id.id().0).to_string()
        );
        assert_eq!(fill["job_id"], order_id.to_string());
        assert_eq!(fill["rho_wei_per_gb_hour"], "360000000000");
        assert_eq!(fill["epsilon_ppm"], 100_000);
        assert_eq!(fill["rent_wei"], want.to_string());
        assert_eq!(fill["rebate_wei"], "0");

        // A report listing it counts resident while fresh; the same report 200 s on does not.
        let mut warm = holder("warm", 1_000_000, 10_000_000);
        warm.resident_adapters = vec![id.clone()];
        register(&door, &b, vec![warm]).await;
        assert_eq!(door.intake().observe_rents(now_s()).await.unwrap(), 1);
        assert_eq!(door.intake().observe_rents(now_s() + 200).await.unwrap(), 1);
        let fill = &order(&door, order_id).await["rent"]["holders"][0];
        assert_eq!(
            (&fill["resident_reports"], &fill["absent_reports"]),
            (&json!(1), &json!(1)),
            "{fill}"
        );

        // The holder learns its pin; the others have none.
        for (prov, pins) in [(&b, 1), (&a, 0)] {
            let (status, got) = door
                .call(
                    Request::get("/v1/providers/pins")
                        .header(header::AUTHORIZATION, format!("Bearer {}", prov.token))
                        .body(Body::empty())
                        .unwrap(),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{got}");
            assert_eq!(got["pins"].as_array().unwrap().len(), pins, "{got}");
        }
        assert_eq!(
            door.count("exchange_standing_orders").await,
            1,
            "only the held rent"
        );

        // An adapter on a base no live bundle serves, or on no catalog model, is refused.
        for (base, nonce, why) in [
            ("llama-3.1-70b-instruct", 3, "none serves its base model"),
            ("no-such-base", 4, "names no catalog model"),
        ] {
            let (other, _) = adapter(&door, base).await;
            let (status, body) = door
                .post(
                    "/v1/rents",
                    None,
                    &json!({"rent": door.signed(rent(&other, 600, 1_000_000, nonce))}),
                )
                .await;
            assert_eq!(status, StatusCode::CONFLICT, "{body}");
            assert!(
                body["error"]["message"].as_str().unwrap().contains(why),
                "{body}"
            );
        }
        assert_eq!(door.count("exchange_standing_orders").await, 1);
        assert_eq!(door.held().await, want);

        // ε = 0.1 %: one provider missing 5 % of the time (the prior) is not enough, nor two
        // (0.25 %); three are (0.0125 %), cheapest first, one bundle each, each bound to ε^⅓.
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(Rent {
                    epsilon_ppm: 1_000,
                    ..rent(&id, 600, 1_000_000, 5)
                })}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let three: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let shown = order(&door, three).await;
        let holders = shown["rent"]["holders"].as_array().unwrap();
        assert_eq!(
            holders
                .iter()
                .map(|h| h["bundle_id"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["warm", "dear", "busy"],
            "{shown}"
        );
        let terms: Vec<u128> = holders
            .iter()
            .map(|h| h["rent_wei"].as_str().unwrap().parse().unwrap())
            .collect();
        // ρ: 3.6·10¹¹, 7.2·10¹¹ and 18·10¹¹ wei per GB-hour.
        assert_eq!(terms, [want, want * 2, want * 5]);
        assert_eq!(body["held_wei"], (want * 8).to_string());
        for (k, h) in holders.iter().enumerate() {
            let share = h["epsilon_ppm"].as_u64().unwrap();
            assert!((99_999..=100_000).contains(&share), "{h}");
            assert_eq!(
                h["job_id"],
                B256::from(cx_protocol::holders::holder_job_id(three.0, k as u8)).to_string()
            );
        }
        for (prov, pins) in [(&c, 1), (&busy, 1), (&full, 0)] {
            let (_, got) = door
                .call(
                    Request::get("/v1/providers/pins")
                        .header(header::AUTHORIZATION, format!("Bearer {}", prov.token))
                        .body(Body::empty())
                        .unwrap(),
                )
                .await;
            assert_eq!(got["pins"].as_array().unwrap().len(), pins, "{got}");
            // A holder may fetch the adapter it must keep; another provider may not.
            let (status, got) = door
                .call(
                    Request::get(format!("/v1/adapters/{id}"))
                        .header(header::AUTHORIZATION, format!("Bearer {}", prov.token))
                        .body(Body::empty())
                        .unwrap(),
                )
                .await;
            let expected = if pins == 1 {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            assert_eq!(status, expected, "{got}");
        }
        // ε = 10 ppm would need four providers; three can hold it. Refused, nothing held.
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(Rent {
                    epsilon_ppm: 10,
                    ..rent(&id, 600, 1_000_000, 6)
                })}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["field"], "rent.order.epsilon_ppm", "{body}");
        assert_eq!(door.held().await, want * 9);
    }

    #[tokio::test]
    async fn a_term_measured_absent_is_rebated_when_its_provider_claims_it() {
        let door = Door::new().await;
        let (b, other) = (Prov::new(5), Prov::new(6));
        let (id, size) = adapter(&door, "llama-3.1-8b-instruct").await;
        let mut warm = holder("warm", 1_000_000, 10_000_000);
        warm.resident_adapters = vec![id.clone()];
        register(&door, &b, vec![warm.clone()]).await;
        register(
            &door,
            &other,
            vec![holder("elsewhere", 9_000_000, 10_000_000)],
        )
        .await;
        let t0 = now_s();
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(rent(&id, 6, 1_000_000, 1))}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let order_id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let ends_s = body["ends_s"].as_u64().unwrap();
        assert!(ends_s >= t0 + 6);

        // A sweep with the adapter in the bundle's report: resident.
        assert_eq!(door.intake().observe_rents(now_s()).await.unwrap(), 1);
        // A job of the adapter on the bundle that misses its deadline: absent.
        door.session("cxs_key", 1_000_000, 2).await;
        let (status, body) = door
            .post(
                "/v1/chat/completions",
                Some("cxs_key"),
                &chat(json!({"cx": {"deadline_in_s": 1, "adapter_id": id}})),
            )
            .await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
        let expired = door.books.expire_due(now_s() + 2).await.unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(
            door.books.job(expired[0]).await.unwrap().unwrap().bundle_id,
            Some("warm".to_owned())
        );
        // A sweep whose report no longer lists it: absent.
        warm.resident_adapters.clear();
        register(&door, &b, vec![warm]).await;
        assert_eq!(door.intake().observe_rents(now_s()).await.unwrap(), 1);

        // 6 s × |a| / 10 wei of rent; 2 of 3 observations absent (> ε = 0.1 %): 2/3 rebated.
        let rent_wei = u128::from(size) * 6 / 10;
        let rebate = rent_wei * 2 / 3;
        let owed = rent_wei - rebate;
        let shown = order(&door, order_id).await;
        let fill = &shown["rent"]["holders"][0];
        assert_eq!(
            (
                &fill["resident_reports"],
                &fill["absent_reports"],
                &fill["missed_deadlines"],
                &fill["sla_met"]
            ),
            (&json!(1), &json!(1), &json!(1), &json!(false)),
            "{shown}"
        );
        assert_eq!(fill["rent_wei"], rent_wei.to_string());
        assert_eq!(fill["rebate_wei"], rebate.to_string());

        let buyer = order::account_of(&door.key).0.0;
        let url = format!("/v1/rents/{order_id}/claim");
        let refusals = [
            // Before the term's end.
            (&b, claim(&b, order_id, &id, buyer, owed), "rent_not_open"),
        ];
        for (prov, body, code) in refusals {
            let (status, got) = door.post(&url, Some(&prov.token), &body).await;
            assert_eq!(status, StatusCode::CONFLICT, "{got}");
            assert_eq!(got["error"]["code"], code, "{got}");
        }
        while now_s() < ends_s {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // Not the holder; the whole rent with no rebate; another adapter.
        let (status, got) = door
            .post(
                &url,
                Some(&other.token),
                &claim(&other, order_id, &id, buyer, owed),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{got}");
        for (body, field) in [
            (claim(&b, order_id, &id, buyer, rent_wei), "amount_owed_wei"),
            (
                claim(&b, order_id, &B256::repeat_byte(3).to_string(), buyer, owed),
                "adapter_hash",
            ),
        ] {
            let (status, got) = door.post(&url, Some(&b.token), &body).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{got}");
            assert!(
                got["error"]["field"].as_str().unwrap().ends_with(field),
                "{got}"
            );
        }
        let (status, got) = door
            .post(&url, Some(&b.token), &claim(&b, order_id, &id, buyer, owed))
            .await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_eq!(got["status"], "filled");
        assert_eq!(got["rent"]["holders"][0]["charged_wei"], owed.to_string());
        assert_eq!(got["rent"]["holders"][0]["settlement"], "done");
        assert_eq!(
            got["held_wei"], "0",
            "its one holder claimed: nothing left held"
        );
        // The rest of the hold is back on the tab; what is owed stays held until it settles.
        assert_eq!(door.held().await, owed);
        let (status, _) = door
            .post(&url, Some(&b.token), &claim(&b, order_id, &id, buyer, owed))
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "claimed once");
        let paid = door.books.paid_jobs(CHAIN, 3).await.unwrap();
        let rent_job = paid.iter().find(|p| p.job_id == order_id).unwrap();
        assert_eq!(
            (
                rent_job.kind.as_str(),
                rent_job.charged_wei,
                rent_job.adapter.as_deref()
            ),
            ("rent", owed, Some(id.as_str()))
        );

        // Its holder was seen absent 2 times in 3 (a report and a missed deadline): its miss
        // probability is now (2 + 1) / (3 + 20) ≈ 13 %, above ε = 10 %, so the next rent takes
        // a second provider beside it (13 % × the prior's 5 % ≤ 10 %).
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(rent(&id, 6, 1_000_000_000, 9))}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let next: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let holders = &order(&door, next).await["rent"]["holders"];
        assert_eq!(
            (&holders[0]["bundle_id"], &holders[1]["bundle_id"]),
            (&json!("warm"), &json!("elsewhere")),
            "{holders}"
        );
    }

    #[tokio::test]
    async fn a_rent_on_two_holders_pays_each_its_term_and_is_filled_when_both_claimed() {
        let door = Door::new().await;
        let (b, c) = (Prov::new(5), Prov::new(6));
        register(&door, &b, vec![holder("warm", 1_000_000, 10_000_000)]).await;
        register(&door, &c, vec![holder("dear", 2_000_000, 10_000_000)]).await;
        let (adapter_id, size) = adapter(&door, "llama-3.1-8b-instruct").await;
        // ε = 0.3 %: two providers at the prior's 5 % (0.25 % together), each bound to √ε.
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(Rent {
                    epsilon_ppm: 3_000,
                    ..rent(&adapter_id, 2, 1_000_000, 1)
                })}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let ends_s = body["ends_s"].as_u64().unwrap();
        // 2 s at 3.6·10¹¹ and 7.2·10¹¹ wei per GB-hour.
        let (warm, dear) = (u128::from(size) / 5, u128::from(size) * 2 / 5);
        assert_eq!(body["held_wei"], (warm + dear).to_string());
        let shown = order(&door, id).await;
        assert_eq!(
            shown["rent"]["holders"][1]["epsilon_ppm"], 54_772,
            "{shown}"
        );
        while now_s() < ends_s {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let buyer = order::account_of(&door.key).0.0;
        let url = format!("/v1/rents/{id}/claim");
        // The second holder claims under holder 0's job id: refused by name.
        let (status, got) = door
            .post(
                &url,
                Some(&c.token),
                &claim(&c, id, &adapter_id, buyer, dear),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{got}");
        assert!(
            got["error"]["field"].as_str().unwrap().ends_with("job_id"),
            "{got}"
        );
        let second = B256::from(cx_protocol::holders::holder_job_id(id.0, 1));
        let mut body = claim(&c, id, &adapter_id, buyer, dear);
        let mut receipt: cx_protocol::receipt::SignedReceipt =
            serde_json::from_value(body["receipt"].clone()).unwrap();
        receipt.receipt.job_id = second.0;
        body["receipt"] = serde_json::to_value(
            cx_protocol::receipt::SignedReceipt::sign(receipt.receipt, &c.id).unwrap(),
        )
        .unwrap();
        let (status, got) = door.post(&url, Some(&c.token), &body).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_eq!(got["status"], "committed", "holder 0 has not claimed yet");
        assert_eq!(got["held_wei"], warm.to_string());
        assert_eq!(got["rent"]["holders"][1]["claimed"], true);
        let (status, _) = door.post(&url, Some(&c.token), &body).await;
        assert_eq!(status, StatusCode::CONFLICT, "claimed once");
        let (status, got) = door
            .post(
                &url,
                Some(&b.token),
                &claim(&b, id, &adapter_id, buyer, warm),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_eq!(got["status"], "filled");
        assert_eq!(
            door.held().await,
            warm + dear,
            "both terms owed until the tab settles"
        );
        let paid = door.books.paid_jobs(CHAIN, 3).await.unwrap();
        let mut jobs: Vec<(B256, B256, u128)> = paid
            .iter()
            .filter(|p| p.kind == "rent")
            .map(|p| (p.job_id, p.order_digest, p.charged_wei))
            .collect();
        jobs.sort_by_key(|j| j.2);
        assert_eq!(jobs, [(id, id, warm), (second, id, dear)]);
    }

    #[tokio::test]
    async fn a_prefix_rent_is_held_by_the_provider_holding_its_kv() {
        let door = Door::new().await;
        let (b, c) = (Prov::new(5), Prov::new(6));
        let held = "cd".repeat(32);
        let report = |prefixes: Vec<String>| cx_protocol::offer::Residency {
            pinned_adapters: vec![],
            free_bytes: 10_000_000,
            slot_bytes: 1_000_000,
            slot_shadow_price: Some(360.0),
            prefix_bytes: prefixes.iter().map(|_| 3_000_000).collect(),
            prefixes,
            bases: vec![],
        };
        let offer = |prov: &Prov, id: &str, prefixes| {
            prov.offer_with(
                vec![holder(id, 1_000_000, 10_000_000)],
                Some(report(prefixes)),
                None,
            )
        };
        for (prov, id, prefixes) in [(&b, "holds", vec![held.clone()]), (&c, "other", vec![])] {
            let (status, body) = door
                .post("/v1/providers/register", None, &offer(prov, id, prefixes))
                .await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let prefix_rent = Rent {
            target_kind: RentTarget::Prefix,
            target: held.parse().unwrap(),
            ..rent(&B256::ZERO.to_string(), 10, 10_000_000, 1)
        };
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(prefix_rent)}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        // 10 s × 3·10⁶ bytes at 3.6·10¹¹ wei per GB-hour, on the one provider holding it.
        assert_eq!(body["held_wei"], "3000000");
        let id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let shown = order(&door, id).await;
        assert_eq!(shown["rent"]["size_bytes"], 3_000_000);
        assert_eq!(shown["rent"]["holders"][0]["bundle_id"], "holds", "{shown}");
        // Observed from the holder's report: resident while it lists the prefix.
        assert_eq!(door.intake().observe_rents(now_s()).await.unwrap(), 1);
        let (status, _) = door
            .post("/v1/providers/register", None, &offer(&b, "holds", vec![]))
            .await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(door.intake().observe_rents(now_s()).await.unwrap(), 1);
        let holding = &order(&door, id).await["rent"]["holders"][0];
        assert_eq!(
            (&holding["resident_reports"], &holding["absent_reports"]),
            (&json!(1), &json!(1)),
            "{holding}"
        );
        // A report naming sizes for other than its prefixes is refused by name.
        let mut bad = report(vec![held.clone()]);
        bad.prefix_bytes = vec![1, 2];
        let (status, body) = door
            .post(
                "/v1/providers/register",
                None,
                &b.offer_with(
                    vec![holder("holds", 1_000_000, 10_000_000)],
                    Some(bad),
                    None,
                ),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            body["error"]["field"], "offer.residency.prefix_bytes",
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_base_rent_is_held_by_the_providers_reporting_it_by_content_id() {
        let door = Door::new().await;
        let (b, c) = (Prov::new(5), Prov::new(6));
        let base_id = "ab".repeat(32);
        let report = |bases| cx_protocol::offer::Residency {
            pinned_adapters: vec![],
            free_bytes: 10_000_000,
            slot_bytes: 1_000_000,
            slot_shadow_price: Some(360.0),
            prefixes: vec![],
            prefix_bytes: vec![],
            bases,
        };
        let resident = vec![cx_protocol::offer::ResidentBase {
            id: base_id.clone(),
            name: "llama-3.1-8b-instruct".into(),
            bytes: 2_000_000,
            pinned: false,
        }];
        let offer = |prov: &Prov, id: &str, bases| {
            prov.offer_with(
                vec![holder(id, 1_000_000, 10_000_000)],
                Some(report(bases)),
                None,
            )
        };
        for (prov, id, bases) in [(&b, "holds", resident.clone()), (&c, "other", vec![])] {
            let (status, body) = door
                .post("/v1/providers/register", None, &offer(prov, id, bases))
                .await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let base_rent = Rent {
            target_kind: RentTarget::Base,
            target: base_id.parse().unwrap(),
            ..rent(&B256::ZERO.to_string(), 2, 1_000_000, 1)
        };
        let (status, body) = door
            .post("/v1/rents", None, &json!({"rent": door.signed(base_rent)}))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let ends_s = body["ends_s"].as_u64().unwrap();
        // 2 s × 2·10⁶ bytes at 3.6·10¹¹ wei per GB-hour: 4·10⁵ wei, on the one provider that
        // reports it.
        assert_eq!(body["held_wei"], "400000");
        let shown = order(&door, id).await;
        assert_eq!(shown["rent"]["size_bytes"], 2_000_000);
        assert_eq!(shown["rent"]["holders"][0]["bundle_id"], "holds", "{shown}");
        // Observed from the report's bases: resident, then absent once it no longer lists it.
        assert_eq!(door.intake().observe_rents(now_s()).await.unwrap(), 1);
        let (status, _) = door
            .post("/v1/providers/register", None, &offer(&b, "holds", vec![]))
            .await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(door.intake().observe_rents(now_s()).await.unwrap(), 1);
        let holding = &order(&door, id).await["rent"]["holders"][0];
        assert_eq!(
            (&holding["resident_reports"], &holding["absent_reports"]),
            (&json!(1), &json!(1)),
            "{holding}"
        );
        while now_s() < ends_s {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // Half the observations absent (> ε = 10 %): half rebated; no adapter named.
        let buyer = order::account_of(&door.key).0.0;
        let url = format!("/v1/rents/{id}/claim");
        let (status, got) = door
            .post(
                &url,
                Some(&b.token),
                &claim(&b, id, &base_id, buyer, 200_000),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{got}");
        assert!(
            got["error"]["field"]
                .as_str()
                .unwrap()
                .ends_with("adapter_hash"),
            "{got}"
        );
        let (status, got) = door
            .post(
                &url,
                Some(&b.token),
                &claim(&b, id, &B256::ZERO.to_string(), buyer, 200_000),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_eq!(got["status"], "filled");
        let paid = door.books.paid_jobs(CHAIN, 3).await.unwrap();
        let job = paid.iter().find(|p| p.job_id == id).unwrap();
        assert_eq!((job.charged_wei, job.adapter.as_deref()), (200_000, None));
    }

    #[tokio::test]
    async fn a_rent_its_provider_never_claims_returns_its_hold() {
        let door = Door::new().await;
        let b = Prov::new(5);
        register(&door, &b, vec![holder("warm", 1_000_000, 10_000_000)]).await;
        let (id, _) = adapter(&door, "llama-3.1-8b-instruct").await;
        let (status, body) = door
            .post(
                "/v1/rents",
                None,
                &json!({"rent": door.signed(rent(&id, 2, 1_000_000, 1))}),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let order_id: B256 = body["order_id"].as_str().unwrap().parse().unwrap();
        let ends_s = body["ends_s"].as_u64().unwrap();
        assert_eq!(
            door.intake().observe_rents(ends_s).await.unwrap(),
            0,
            "an ended term is observed no more"
        );
        assert_eq!(
            door.books.expire_standing(ends_s + 5).await.unwrap(),
            0,
            "a committed rent is not an unfilled one"
        );
        let grace = door.intake().reserve_claim_grace_s();
        assert_eq!(
            door.books
                .expire_unclaimed(ends_s + grace, grace)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            door.books
                .expire_unclaimed(ends_s + grace + 1, grace)
                .await
                .unwrap(),
            1
        );
        assert_eq!(order(&door, order_id).await["status"], "unclaimed");
        assert_eq!(door.held().await, 0, "the hold went back");
    }
}
