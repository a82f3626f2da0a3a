//! Fine-tuning as an order across real processes: Anvil with the contracts, `cx serve`, a real
//! `cx-provider serve --exchange` on a generated model, and an agent that stores a dataset
//! (`cx agent put-dataset`), orders a LoRA trained on it (`cx agent train --wait`), and then
//! uses the adapter in signed intents (`cx agent intent --adapter`). The task is a mapping the
//! base does not know (16 keys, each to a letter); the adapter the provider trained, stored at
//! the exchange and named in its receipt, answers it.
//!
//! The `cx-provider` binary is the workspace's `target/debug/cx-provider` (build it first:
//! `cargo build -p cx-provider`).

mod common;

use alloy::primitives::B256;
use common::{cx_json, group_key, path, provider_bin, registered, run, scratch, start_provider};
use cx_devnet::db::TempDatabase;
use std::time::Duration;

/// Key `k` (a lower-case letter) maps to the upper-case letter at `(7k + 3) mod 16`.
fn mapping() -> Vec<(char, char)> {
    (0..16u8)
        .map(|i| ((b'a' + i) as char, (b'A' + (7 * i + 3) % 16) as char))
        .collect()
}

/// The dataset: `BOS key value` per key (the generated model's byte tokenizer: a byte's id is
/// its value, BOS 256), the loss on the value alone.
fn dataset() -> serde_json::Value {
    let (sequences, mask): (Vec<_>, Vec<_>) = mapping()
        .into_iter()
        .map(|(k, v)| (vec![256, k as u32, v as u32], vec![0.0, 0.0, 1.0]))
        .unzip();
    serde_json::json!({ "sequences": sequences, "loss_mask": mask })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_orders_an_adapter_trained_and_its_next_intents_use_it() {
    let bin = provider_bin();
    let dir = scratch("train");
    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 4, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    let exchange = common::start_exchange(&dir.path, &deployments, &db.url, &[]).await;
    let client = cx_client::Client::new(&exchange.url, Some(&exchange.ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    // The tiny catalog's shape with lm_head tied to the embeddings: untied, the generated
    // head bounds every logit too tightly for any adapter to make one token certain.
    let model_dir = dir.path.join("model");
    let out = run(
        &bin,
        &[
            "gen-model",
            "--out",
            path(&model_dir),
            "--hidden",
            "64",
            "--layers",
            "2",
            "--seed",
            "11",
            "--tie",
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[1].to_bytes())).await;
    let tab = agent.open_tab(&client, 50_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let _provider = start_provider(
        &bin,
        &dir.path,
        "trainer",
        &model_dir,
        &exchange,
        &deployments,
        &anvil.keys[2],
        "1000000",
        &[],
    );
    registered(&client, "trainer-train").await;

    let file = dir.path.join("mapping.json");
    std::fs::write(&file, dataset().to_string()).unwrap();
    let stored = cx_json(
        agent.args(&["put-dataset", path(&file), "--json"]),
        String::new(),
    )
    .await;
    assert_eq!(stored["sequences"], 16, "{stored}");
    assert_eq!(stored["tokens"], 48, "{stored}");
    let data = stored["id"].as_str().unwrap().to_owned();

    let tab_arg = tab.to_string();
    let trained = cx_json(
        agent.args(&[
            "train",
            "--base",
            "tiny-llama",
            "--data",
            &data,
            "--steps",
            "30",
            "--batch-size",
            "16",
            "--rank",
            "8",
            "--alpha",
            "16",
            "--seed",
            "3",
            "--lr",
            "0.02",
            "--weight-decay",
            "0",
            "--max-grad-norm",
            "10",
            "--max-price-wei",
            "20000000",
            "--tab",
            &tab_arg,
            "--deadline-in",
            "120",
            "--wait",
            "--json",
        ]),
        String::new(),
    )
    .await;
    assert_eq!(trained["status"], "done", "{trained}");
    assert_eq!(trained["bundle_id"], "trainer-train");
    let report = &trained["trained"];
    let (first, last) = (
        report["loss_first"].as_f64().unwrap(),
        report["loss_last"].as_f64().unwrap(),
    );
    eprintln!("trained over the market: loss {first:.4} → {last:.5} in 30 steps");
    assert!(last * 20.0 < first, "the loss fell {first} → {last}");
    let adapter = report["adapter_id"].as_str().unwrap().to_owned();
    let charged: u128 = trained["held_wei"].as_str().unwrap().parse().unwrap();
    assert!(charged > 0);
    assert_eq!(client.tab(31337, tab).await.unwrap().held_wei, charged);

    // The adapter is in the exchange's store, and the next intents use it: routed to the
    // provider that holds it, they answer the mapping greedily.
    let mut right = 0;
    for (key, value) in mapping().into_iter().take(4) {
        let prompt = key.to_string();
        let answer = cx_json(
            agent.args(&[
                "intent",
                "--model",
                "tiny-llama",
                "--prompt",
                &prompt,
                "--max-tokens",
                "1",
                "--adapter",
                &adapter,
                "--tier",
                "T0",
                "--max-price-wei",
                "1000000",
                "--tab",
                &tab_arg,
                "--wait",
                "--json",
            ]),
            String::new(),
        )
        .await;
        assert_eq!(answer["final_status"], "done", "{answer}");
        assert_eq!(answer["bundle_id"], "trainer", "{answer}");
        if answer["result"]["text"] == value.to_string() {
            right += 1;
        }
    }
    assert_eq!(right, 4, "the trained adapter answers each key");
}
