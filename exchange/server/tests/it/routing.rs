//! Routing by task, live: a door call naming a task (`task:code`, `cx/auto`) goes to the catalog
//! model the router ranks first, and the job's decision names the arm and why; what the router
//! learns comes from the meter (the routed jobs that ended), so an arm that keeps missing its
//! deadlines loses the task; `cx/fanout:N` places a job on each of the top N arms and answers with
//! the synthesised one. Bad targets are refused by name.

use crate::door::{Door, Prov, bundle, chat, now_s};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};

const GENERAL: &str = "llama-3.1-8b-instruct";
const CODER: &str = "qwen2.5-coder-32b-instruct";
const SECRET: &str = "cxs_routing";

/// One provider with a bundle holding each base: the generalist and the coder.
async fn fleet(door: &Door) -> Prov {
    let prov = Prov::new(4);
    let mut general = bundle("general");
    general.resident_bases = vec![GENERAL.into()];
    let mut coder = bundle("coder");
    coder.resident_bases = vec![CODER.into()];
    let (status, body) = door
        .post(
            "/v1/providers/register",
            None,
            &prov.offer(vec![general, coder]),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, opened) = door.session(SECRET, 2_000_000, 1).await;
    assert_eq!(status, StatusCode::CREATED, "{opened}");
    prov
}

fn code_chat(model: &str, deadline_in_s: u64) -> Value {
    let mut call = chat(json!({"model": model, "cx": {"deadline_in_s": deadline_in_s}}));
    call["messages"] = json!([{"role": "user", "content": "Write a def that parses a date."}]);
    call
}

/// The decision of the job a door call under the routing session key placed.
async fn placed_decision(door: &Door, call: &Value) -> Value {
    door.placed_decision(SECRET, call).await
}

fn candidate<'a>(route: &'a Value, arm: &str) -> &'a Value {
    route["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["arm"] == arm)
        .unwrap_or_else(|| panic!("{arm} scored: {route}"))
}

/// What every route records: the target and arm, the code feature (the hint, or the text's
/// `def`) and the coder's profile making more of it (the prior), G's parts and the cost of
/// every scored arm, the models no bundle serves left out with why, the arm's market belief.
fn check_route(decision: &Value, target: &str, arm: &str, bundle: &str) {
    let route = &decision["route"];
    assert_eq!(route["target"], target, "{decision}");
    assert_eq!(route["arm"], arm, "{route}");
    assert_eq!(decision["chosen"], bundle, "{decision}");
    assert_eq!(route["features"][5], 1.0, "{route}");
    let (coder, general) = (candidate(route, CODER), candidate(route, GENERAL));
    assert!(
        coder["utility"].as_f64() > general["utility"].as_f64(),
        "{route}"
    );
    for c in [coder, general] {
        let parts = ["risk", "ambiguity", "information_gain", "efe", "score"];
        assert!(parts.iter().all(|p| c[p].is_f64()), "{c}");
        assert!(
            c["cost_wei"].as_str().unwrap().parse::<u128>().unwrap() > 0,
            "{c}"
        );
    }
    let gated = route["gated"].as_array().unwrap();
    assert!(
        gated
            .iter()
            .any(|g| g["arm"] == "llama-3.1-70b-instruct" && g["reason"].is_string()),
        "{route}"
    );
    assert_eq!(route["belief"].as_array().unwrap().len(), 3, "{route}");
    assert_eq!(route["profile"].as_array().unwrap().len(), 7, "{route}");
}

#[tokio::test]
async fn a_task_goes_to_the_arm_the_router_ranks_first_and_the_decision_says_why() {
    let door = Door::new().await;
    fleet(&door).await;

    // Nothing metered: the prior decides, and a code task goes to the coder.
    let first = placed_decision(&door, &code_chat("task:code", 30)).await;
    check_route(&first, "task:code", CODER, "coder");
    // That job is still out: what one more coder request would teach is on its way, so the
    // generalist, as unknown and with nothing out, is probed (the text makes it a code task).
    let second = placed_decision(&door, &code_chat("cx/auto", 30)).await;
    check_route(&second, "cx/auto", GENERAL, "general");
    let route = &second["route"];
    assert!(
        candidate(route, CODER)["information_gain"].as_f64()
            < candidate(route, GENERAL)["information_gain"].as_f64(),
        "{route}"
    );

    // A quality floor is a ceiling: the generalist (0.55) is left out, the coder (0.72) taken.
    let mut floor = code_chat("task:chat", 30);
    floor["cx"]["min_quality"] = json!(0.7);
    let decision = placed_decision(&door, &floor).await;
    assert_eq!(decision["route"]["arm"], CODER, "{decision}");
    assert!(
        decision["route"]["gated"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["arm"] == GENERAL && g["reason"].as_str().unwrap().contains("min_quality")),
        "{decision}"
    );

    // The explorer's job page shows the route.
    let id: Vec<u8> =
        sqlx::query_scalar("SELECT id FROM exchange_jobs ORDER BY created_at DESC LIMIT 1")
            .fetch_one(door.books.pool())
            .await
            .unwrap();
    let (status, page) = door
        .text(
            Request::get(format!("/explorer/jobs/0x{}", hex::encode(id)))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("Route: ") && page.contains("id=\"route-"),
        "{page}"
    );

    // Targets the router does not know are refused by name, and nothing is written.
    let jobs = door.count("exchange_jobs").await;
    for (model, says) in [
        ("task:poetry", "unknown task"),
        ("cx/fanout:9", "from 2 to 4"),
        ("cx/fanout:1", "from 2 to 4"),
    ] {
        let (status, body) = door
            .post("/v1/chat/completions", Some(SECRET), &code_chat(model, 30))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{model}: {body}");
        assert_eq!(body["error"]["field"], "model", "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{body}"
        );
    }
    // No arm that good is served: refused, naming why each was left out.
    let mut none = code_chat("task:code", 30);
    none["cx"]["min_quality"] = json!(0.99);
    let (status, body) = door.post("/v1/chat/completions", Some(SECRET), &none).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("min_quality"),
        "{body}"
    );
    // A floor on a call that names its model would change nothing: refused by name.
    let mut named = code_chat(GENERAL, 30);
    named["cx"]["min_quality"] = json!(0.5);
    let (status, body) = door
        .post("/v1/chat/completions", Some(SECRET), &named)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "cx.min_quality", "{body}");
    // A task with an adapter: the adapter names its base, there is nothing to route.
    let mut with_adapter = code_chat("task:code", 30);
    with_adapter["cx"]["adapter_id"] = json!(format!("0x{}", "ab".repeat(32)));
    let (status, body) = door
        .post("/v1/chat/completions", Some(SECRET), &with_adapter)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("trained on one base"),
        "{body}"
    );
    assert_eq!(door.count("exchange_jobs").await, jobs);
}

#[tokio::test]
async fn the_router_learns_from_the_meter_and_turns_from_an_arm_that_misses_its_deadlines() {
    let door = Door::new().await;
    let prov = fleet(&door).await;
    let intake = door.intake();

    // Code tasks, each with a second to live: the provider answers those that went to the
    // generalist and never the coder's.
    const CALLS: usize = 4;
    let mut arms = Vec::new();
    for _ in 0..CALLS {
        let decision = placed_decision(&door, &code_chat("task:code", 1)).await;
        arms.push(decision["route"]["arm"].as_str().unwrap().to_owned());
    }
    assert_eq!(arms[0], CODER, "the prior first: {arms:?}");
    for job in door.pull(&prov, 8, 0).await {
        if job["bundle_id"] == "general" {
            door.answer(&prov, &job, "def parse(s): ...").await;
        }
    }
    let missed = arms.iter().filter(|a| *a == CODER).count();
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    intake.books().expire_due(now_s()).await.unwrap();

    // One metering pass: every routed job that ended is a meter row, folded in once.
    let folded = intake.router().learn(intake.books()).await.unwrap();
    assert_eq!(folded, CALLS);
    assert_eq!(door.count("exchange_meter").await, CALLS as i64);
    let (late, charged): (i64, String) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE latency_s > deadline_s AND quality = 0), \
                sum(cost_wei)::text FROM exchange_meter WHERE arm = $1",
    )
    .bind(CODER)
    .fetch_one(door.books.pool())
    .await
    .unwrap();
    assert_eq!((late, charged.as_str()), (missed as i64, "0"));
    assert_eq!(intake.router().learn(intake.books()).await.unwrap(), 0);

    // The next code task goes to the generalist: G of the coder's outcomes (late, unanswered)
    // outweighs the prior that still favours it.
    let decision = placed_decision(&door, &code_chat("task:code", 30)).await;
    let route = &decision["route"];
    assert_eq!(route["arm"], GENERAL, "{decision}");
    let (coder, general) = (candidate(route, CODER), candidate(route, GENERAL));
    assert!(
        coder["utility"].as_f64() > general["utility"].as_f64(),
        "{route}"
    );
    assert!(coder["risk"].as_f64() > general["risk"].as_f64(), "{route}");
    assert!(
        general["score"].as_f64() > coder["score"].as_f64(),
        "{route}"
    );
}

#[tokio::test]
async fn a_fan_out_runs_the_top_arms_and_answers_with_the_synthesised_one() {
    let door = Door::new().await;
    let prov = fleet(&door).await;

    let agent = async {
        door.post(
            "/v1/chat/completions",
            Some(SECRET),
            &code_chat("cx/fanout:2", 20),
        )
        .await
    };
    let provider = async {
        let mut answered = Vec::new();
        while answered.len() < 2 {
            for job in door.pull(&prov, 4, 10).await {
                // Class D: both arms' bytes agree, so the majority is the answer.
                door.answer(&prov, &job, "def parse(s): ...").await;
                answered.push(job["job_id"].as_str().unwrap().to_owned());
            }
        }
        answered
    };
    let ((status, completion), answered) = tokio::join!(agent, provider);
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(
        completion["choices"][0]["message"]["content"],
        "def parse(s): ..."
    );
    let fanout = &completion["cx"]["fanout"];
    let arms = fanout["arms"].as_array().unwrap();
    assert_eq!(arms.len(), 2, "{fanout}");
    let models: Vec<&str> = arms.iter().map(|a| a["model"].as_str().unwrap()).collect();
    assert_eq!(models, [CODER, GENERAL], "the best-ranked first: {fanout}");
    assert!(arms.iter().all(|a| a["answered"] == true), "{fanout}");
    assert_eq!(fanout["majority"], true, "{fanout}");
    assert_eq!(fanout["agreement"], 1.0, "{fanout}");
    assert_eq!(completion["model"], fanout["chosen"], "{completion}");
    let mut ids: Vec<String> = arms
        .iter()
        .map(|a| a["job_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    let mut answered = answered;
    answered.sort();
    assert_eq!(ids, answered);
    // Both jobs carry the route, with one request id and their rank.
    let routes: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT decision->'route'->>'arm', (decision->'route'->>'rank')::bigint, \
                decision->'route'->>'request' \
         FROM exchange_jobs ORDER BY (decision->'route'->>'rank')::bigint",
    )
    .fetch_all(door.books.pool())
    .await
    .unwrap();
    assert_eq!(routes.len(), 2);
    assert_eq!((routes[0].0.as_str(), routes[0].1), (CODER, 0));
    assert_eq!((routes[1].0.as_str(), routes[1].1), (GENERAL, 1));
    assert_eq!(routes[0].2, routes[1].2, "one request");

    // A fan-out does not stream: the answer is chosen once every arm has answered.
    let mut streamed = code_chat("cx/fanout:2", 20);
    streamed["stream"] = json!(true);
    let (status, body) = door
        .post("/v1/chat/completions", Some(SECRET), &streamed)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "stream", "{body}");
}
