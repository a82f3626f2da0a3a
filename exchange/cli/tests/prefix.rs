//! A continuation is cleared onto the provider holding its conversation prefix (SPEC §4), each
//! party its own process: Anvil with the contracts, `cx serve`, two `cx-provider serve
//! --exchange …` on the same generated model, and an agent calling the OpenAI door.
//!
//! The first turn goes to the only provider there is (`cpu-1`), which keeps the turn's KV cache
//! and reports its prefix id in its signed residency report. A second provider (`cpu-2`) then
//! joins, asking less; the continuation of the first turn goes back to `cpu-1`, because it skips
//! the prefix's prefill there (most of the work: a long history, a short answer) — and the
//! decision names the prefix and the hit, with `cpu-2` feasible beside it and dearer (a cost,
//! not a filter).
//!
//! Build `cx-provider` first when running this alone (`cargo build -p cx-provider`).

mod common;

use alloy::primitives::B256;
use common::{Killed, MODEL, cx_json, group_key, path, provider_bin, run, scratch};
use cx_devnet::db::TempDatabase;
use cx_devnet::free_port;
use cx_protocol::order::chat_prompt;
use cx_protocol::prefix::{continued_prefix_id, held_prefix_id};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_is_cleared_onto_the_provider_holding_its_prefix() {
    let bin = provider_bin();
    let dir = scratch("prefix");
    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 4, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    let exchange = common::start_exchange(&dir.path, &deployments, &db.url, &[]).await;
    let (url, ca, exchange_key) = (
        exchange.url.clone(),
        exchange.ca.clone(),
        exchange.key_hash.clone(),
    );
    let model_dir = common::gen_model(&bin, &dir.path);
    let client = cx_client::Client::new(&url, Some(&ca))
        .unwrap()
        .with_timeout(Duration::from_secs(90));
    let start_provider = |n: usize, ask_wei_per_s: u64| {
        let identity = dir.path.join(format!("provider-{n}.key"));
        let out = run(&bin, &["keygen", "--out", path(&identity)], "");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let evm_key = dir.path.join(format!("provider-{n}-evm.key"));
        common::write_evm_key(&evm_key, &anvil.keys[1 + n]);
        common::stake_provider(&bin, &evm_key, &deployments, &identity);
        Killed(
            Command::new(&bin)
                .args(["serve", "--model", path(&model_dir)])
                .args(["--port", &free_port().unwrap().to_string()])
                .args(["--served-model-name", MODEL, "--threads", "1"])
                .args(["--exchange", &url, "--exchange-ca", path(&ca)])
                .args(["--exchange-key-hash", &format!("0x{exchange_key}")])
                .args(["--identity", path(&identity)])
                .args(["--payout", &anvil.keys[1 + n].address().to_string()])
                .args(["--operator", &format!("op-{n}")])
                .args(["--ask-wei-per-s", &ask_wei_per_s.to_string()])
                .args(["--bundle-id", &format!("cpu-{n}"), "--model-name", MODEL])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("cx-provider runs"),
        )
    };
    // Waits until bundle `id` is live and `holds` says yes of it.
    let until = async |id: &str, holds: &dyn Fn(&cx_protocol::Bundle) -> bool| {
        let waited = Instant::now();
        loop {
            let bundles = client.providers().await.unwrap_or_default();
            if let Some(b) = bundles.iter().find(|b| b.id == id)
                && holds(b)
            {
                return b.clone();
            }
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "{id} never reported what was waited for: {bundles:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let _first = start_provider(1, 1_000_000);
    until("cpu-1", &|_| true).await;

    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[0].to_bytes())).await;
    let escrow_id = agent.open_tab(&client, 5_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(escrow_id, "4000000", "1000000", "80").await;
    let chat = async |messages: &[(&str, &str)]| {
        let messages: Vec<_> = messages
            .iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let answered = client
            .chat(
                &api_key,
                &json!({"model": MODEL, "messages": messages, "max_tokens": 8}),
            )
            .await
            .expect("the call is answered");
        let reply = answered["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        let job_id: B256 = answered["cx"]["job_id"].as_str().unwrap().parse().unwrap();
        (
            reply,
            client
                .clone()
                .with_credential(cx_client::Credential::Session(api_key.clone()))
                .job(job_id)
                .await
                .unwrap(),
        )
    };

    // Turn one, on the only provider; it holds the turn and says so in its residency report.
    let system = "You answer in one word, every time, whatever you are asked about.";
    let question = "Which colour is the sky on a clear summer day?";
    let (reply, first) = chat(&[("system", system), ("user", question)]).await;
    assert_eq!(first.bundle_id.as_deref(), Some("cpu-1"));
    let turn1 = chat_prompt([("system", system), ("user", question)]);
    // Its prefix is the system message, which nobody holds: a miss, priced and not refused.
    assert_eq!(
        first.decision.prefix_id,
        continued_prefix_id(MODEL, None, &turn1)
    );
    assert!(
        first
            .decision
            .terms
            .is_some_and(|t| !t.prefix_hit && t.prefix_miss > 0.0)
    );
    let held = held_prefix_id(MODEL, None, &turn1, &reply).unwrap();
    until("cpu-1", &|b| b.resident_prefixes.contains(&held)).await;

    // A second provider joins, asking less; a fresh chat continues no prefix.
    let _second = start_provider(2, 800_000);
    until("cpu-2", &|_| true).await;
    let (_, fresh) = chat(&[("user", "Hello there, who are you?")]).await;
    assert_eq!(fresh.decision.prefix_id, None);
    assert!(
        fresh
            .decision
            .terms
            .is_some_and(|t| !t.prefix_hit && t.prefix_miss == 0.0)
    );

    // The continuation goes back to the provider that holds its prefix.
    let follow_up = "And at night?";
    let messages = [
        ("system", system),
        ("user", question),
        ("assistant", reply.as_str()),
        ("user", follow_up),
    ];
    assert_eq!(
        continued_prefix_id(MODEL, None, &chat_prompt(messages)).as_deref(),
        Some(held.as_str())
    );
    let (_, next) = chat(&messages).await;
    let decision = &next.decision;
    assert_eq!(next.bundle_id.as_deref(), Some("cpu-1"), "{decision:?}");
    assert_eq!(decision.prefix_id.as_deref(), Some(held.as_str()));
    let terms = decision.terms.expect("the chosen bundle's terms");
    assert!(terms.prefix_hit, "{decision:?}");
    assert_eq!(terms.prefix_miss, 0.0);
    // cpu-2 was feasible, only dearer with the prefill it would redo: a cost, not a filter.
    assert!(
        decision.feasible.iter().any(|r| r.id == "cpu-2"),
        "{decision:?}"
    );
    assert_eq!(decision.feasible[0].id, "cpu-1");
}
