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
