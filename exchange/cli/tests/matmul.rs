//! The `cx/matmul-f32` job kind across real processes: Anvil with the contracts, `cx serve`
//! (Freivalds' check on every returned product), two real `cx-provider serve --exchange`
//! processes — one honest, one started with `--fault wrong-product` (a testing aid: it moves one
//! entry of every product far beyond the tolerance and signs an honest receipt over the wrong
//! bytes) — and an agent ordering products with `cx agent matmul --wait`. The wrong product is
//! caught (`verification_failed`, the job `failed`, its hold back on the tab); the right one is
//! `done` and `verified`, and the CLI checked its SHA-256 against the receipt.
//!
//! The `cx-provider` binary is the workspace's `target/debug/cx-provider` (build it first:
//! `cargo build -p cx-provider`).

mod common;

use alloy::primitives::B256;
use common::{cx_json, group_key, provider_bin, registered, run, scratch, start_provider};
use cx_devnet::db::TempDatabase;
use std::path::Path;
use std::time::Duration;

fn matmul_args(tab: u64, seed: &str) -> Vec<String> {
    [
        "matmul",
        "--m",
        "96",
        "--k",
        "80",
        "--n",
        "64",
        "--seed-a",
        seed,
        "--seed-b",
        "7",
        "--max-price-wei",
        "1000000",
        "--tab",
        &tab.to_string(),
        "--deadline-in",
        "60",
        "--wait",
        "--json",
    ]
    .map(str::to_owned)
    .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_product_is_caught_and_refunded_and_a_right_one_is_verified_and_done() {
    let bin = provider_bin();
    let dir = scratch("matmul");
    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 4, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    let exchange = common::start_exchange(
        &dir.path,
        &deployments,
        &db.url,
        &["--freivalds-rounds", "20"],
    )
    .await;
    let client = cx_client::Client::new(&exchange.url, Some(&exchange.ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    let model_dir = common::gen_model(&bin, &dir.path);
    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[1].to_bytes())).await;
    let tab = agent.open_tab(&client, 5_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;

    // First only the faulty provider offers products.
    let _faulty = start_provider(
        &bin,
        &dir.path,
        "faulty",
        &model_dir,
        &exchange,
        &deployments,
        &anvil.keys[2],
        "2000000",
        &["--fault", "wrong-product"],
    );
    registered(&client, "faulty-matmul").await;
    let out = tokio::task::spawn_blocking({
        let args = agent.args(
            &matmul_args(tab, "1")
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run(Path::new(env!("CARGO_BIN_EXE_cx")), &args, "")
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a failed product exits non-zero");
    assert!(stderr.contains("failed"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("a JSON report"),
    )
    .unwrap();
    assert_eq!(report["status"], "failed", "{report}");
    assert_eq!(report["bundle_id"], "faulty-matmul");
    assert_eq!(report["verification"]["status"], "verification_failed");
    assert_eq!(report["verification"]["detail"]["passed"], false);
    assert_eq!(report["verification"]["detail"]["method"], "freivalds");
    assert_eq!(report["product_checked"], false);
    // Its hold went back: the tab holds nothing.
    assert_eq!(client.tab(31337, tab).await.unwrap().held_wei, 0);

    // An honest provider, cheaper, takes the next product.
    let _honest = start_provider(
        &bin,
        &dir.path,
        "honest",
        &model_dir,
        &exchange,
        &deployments,
        &anvil.keys[3],
        "1000000",
        &[],
    );
    registered(&client, "honest-matmul").await;
    let done = cx_json(
        agent.args(
            &matmul_args(tab, "2")
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        ),
        String::new(),
    )
    .await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["bundle_id"], "honest-matmul");
    assert_eq!(done["verification"]["status"], "verified");
    assert_eq!(done["verification"]["detail"]["passed"], true);
    assert_eq!(done["verification"]["detail"]["rounds"], 20);
    assert_eq!(done["verification"]["detail"]["tier"], "T2");
    assert_eq!(done["product_bytes"], 96 * 64 * 4);
    assert_eq!(done["product_checked"], true);
    let charged: u128 = done["held_wei"].as_str().unwrap().parse().unwrap();
    assert!(charged > 0);
    assert_eq!(client.tab(31337, tab).await.unwrap().held_wei, charged);
}
