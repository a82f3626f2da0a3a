//! A reserve filled end to end, each party its own process: a committee of three `cx-signer`s
//! (any two sign), Anvil with the contracts under the group key, `cx serve --settlement`, and two
//! real `cx-provider`s staked on chain with different asks. The agent posts a reserve with `cx
//! agent reserve --wait`; both providers bid below their asks, and at the window's start the
//! lowest feasible bid commits it. An intent of the same tab in the window is served by the
//! winner at no price of its own; at the window's end the winner claims the take-or-pay with a
//! receipt it signs, and when the tab settles every signer checks the reserve's voucher (the
//! buyer's signed reserve, the exchange's assignment within its limit, the receipt) and the
//! winner is credited rate × compute_ms less the fee on chain.
//!
//! And a rent: `cx agent rent` commits an adapter rent to the provider's bundle; the provider
//! learns its pin, fetches the adapter, keeps it loaded pinned and reported resident for the
//! term, and at its end claims the rent less the measured rebate, which every signer checks as
//! the rent's voucher when the tab settles and the provider is credited on chain.

mod common;

use alloy::primitives::{Address, B256};
use common::{Killed, MODEL, cx_json, path, provider_bin, run, until};
use cx_devnet::free_port;
use cx_settlement::evm::EvmClient;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A real `cx-provider` of `model_dir` staked with Anvil key `key`, serving bundle `name` at
/// `ask` wei/s on `world`'s market; and its payout account.
fn provider(
    world: &common::Settling,
    model_dir: &std::path::Path,
    name: &str,
    key: usize,
    ask: &str,
) -> (Killed, Address) {
    let bin = provider_bin();
    let identity = world.dir.path.join(format!("{name}.key"));
    let out = run(&bin, &["keygen", "--out", path(&identity)], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let evm_key = world.dir.path.join(format!("{name}-evm.key"));
    common::write_evm_key(&evm_key, &world.anvil.keys[key]);
    common::stake_provider(&bin, &evm_key, &world.deployments, &identity);
    let account = EvmClient::connect(
        &world.anvil.rpc_url(),
        world.anvil.keys[key].clone(),
        world.deployment,
    )
    .unwrap()
    .account();
    let child = Command::new(&bin)
        .args(["serve", "--model", path(model_dir)])
        .args(["--port", &free_port().unwrap().to_string()])
        .args(["--served-model-name", MODEL, "--threads", "1"])
        .args([
            "--exchange",
            &world.market.url,
            "--exchange-ca",
            path(&world.market.ca),
        ])
        .args([
            "--exchange-key-hash",
            &format!("0x{}", world.market.key_hash),
        ])
        .args(["--identity", path(&identity)])
        .args(["--payout", &account.to_string()])
        .args(["--operator", &format!("op-{name}")])
        .args(["--ask-wei-per-s", ask, "--bundle-id", name])
        .args(["--model-name", MODEL])
        .args([
            "--fetched-adapters",
            path(&world.dir.path.join(format!("{name}-fetched"))),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("cx-provider runs");
    (Killed(child), account)
}

/// Waits until bundles `ids` are registered at `world`'s exchange (each provider also offers its
/// matmul bundle).
async fn registered(world: &common::Settling, ids: &[&str]) {
    until(
        "the providers registered",
        Duration::from_secs(60),
        || async {
            world
                .client
                .providers()
                .await
                .ok()
                .filter(|b| ids.iter().all(|id| b.iter().any(|b| b.id == *id)))
                .map(|_| ())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_bid_on_by_two_providers_is_won_by_the_lowest_drawn_on_and_paid_on_chain() {
    let world = common::settling("standing", 500, 5, 3).await;
    let client = &world.client;
    let (market, anvil, deployments) = (&world.market, &world.anvil, &world.deployments);

    // Two providers of the same model, asking 1 000 000 and 2 000 000 wei/s; each bids 10 %
    // below its ask (the default --reserve-discount-bps).
    let model_dir = common::gen_model(&provider_bin(), &world.dir.path);
    let mut providers = Vec::new();
    let mut payouts = Vec::new();
    for (name, key, ask) in [("cheap", 2, "1000000"), ("dear", 4, "2000000")] {
        let (child, payout) = provider(&world, &model_dir, name, key, ask);
        providers.push(child);
        payouts.push(payout);
    }
    registered(&world, &["cheap", "dear"]).await;

    let agent = common::Agent::import(
        &world.dir.path,
        market,
        B256::from(anvil.keys[1].to_bytes()),
    )
    .await;
    let amount = 5_000_000u128;
    let escrow_id = agent.open_tab(client, amount, deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let tab = escrow_id.to_string();

    // 1.5 s of compute over a 25 s window starting in 8 s, at most 2 000 000 wei/s: 3 000 000
    // wei held until the window ends.
    let committed = cx_json(
        agent.args(&[
            "reserve",
            "--model",
            MODEL,
            // T0: a job drawn at T1 of class D would also get a replica on the other provider
            // (paid at spot), which is verification's test, not this one.
            "--tier",
            "T0",
            "--start-in",
            "8",
            "--window-s",
            "25",
            "--compute-ms",
            "1500",
            "--max-price-wei-per-s",
            "2000000",
            "--tab",
            &tab,
            "--wait",
            "--json",
        ]),
        String::new(),
    )
    .await;
    assert_eq!(committed["status"], "committed", "{committed}");
    let fill = &committed["reserve"];
    assert_eq!(fill["bundle_id"], "cheap", "{committed}");
    assert_eq!(fill["rate_wei_per_s"], 900_000);
    let bids = fill["bids"].as_array().unwrap();
    assert_eq!(bids.len(), 2, "both providers bid: {committed}");
    assert!(
        bids.iter().any(|b| b["bundle_id"] == "dear"
            && b["status"] == "lost"
            && b["rate_wei_per_s"] == 1_800_000),
        "{committed}"
    );
    let reserve_id: B256 = committed["id"].as_str().unwrap().parse().unwrap();

    // An intent in the window is served by the winner, priced zero.
    let accepted = cx_json(
        agent.args(&[
            "intent",
            "--model",
            MODEL,
            "--prompt",
            "Say hello.",
            "--max-tokens",
            "8",
            "--max-price-wei",
            "100000",
            "--tab",
            &tab,
            "--tier",
            "T0",
            "--deadline-in",
            "20",
            "--json",
        ]),
        String::new(),
    )
    .await;
    assert_eq!(accepted["bundle_id"], "cheap", "{accepted}");
    assert_eq!(accepted["held_wei"], "0", "{accepted}");
    let job_id: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let served = until("the drawn intent done", Duration::from_secs(30), || async {
        agent
            .reader(client)
            .job(job_id)
            .await
            .ok()
            .filter(|j| j.status == "done")
    })
    .await;
    assert_eq!(served.held_wei, 0);
    let drawn = client.standing_order(reserve_id).await.unwrap();
    assert_eq!(drawn["reserve"]["draws"], 1, "{drawn}");

    // At the window's end the winner claims take-or-pay: 900 000 wei/s × 1.5 s.
    let owed = 900_000u128 * 1_500 / 1_000;
    let filled = until(
        "the take-or-pay claimed",
        Duration::from_secs(60),
        || async {
            client
                .standing_order(reserve_id)
                .await
                .ok()
                .filter(|o| o["status"] == "filled")
        },
    )
    .await;
    assert_eq!(
        filled["reserve"]["charged_wei"],
        owed.to_string(),
        "{filled}"
    );
    assert_eq!(client.tab(31337, escrow_id).await.unwrap().held_wei, owed);

    // The tab settles: every signer checks the reserve's voucher; the winner is credited what
    // it was owed less the fee, the loser nothing, the buyer the rest.
    let closed = cx_json(agent.args(&["settle-tab", &tab, "--json"]), String::new()).await;
    assert_eq!(closed["status"], "closing", "{closed}");
    let claim = until("the tab settled", Duration::from_secs(90), || async {
        client.claim(31337, payouts[0]).await.ok()
    })
    .await;
    let cut = owed * 500 / 10_000;
    assert_eq!(claim.cumulative_wei, (owed - cut).to_string());
    assert!(
        client.claim(31337, payouts[1]).await.is_err(),
        "the loser is owed nothing"
    );
    // The claim is served once the batch is submitted; the tab reads settled once the chain
    // watcher has seen the batch land, a moment later.
    until(
        "the tab settled on chain",
        Duration::from_secs(60),
        || async {
            client
                .tab(31337, escrow_id)
                .await
                .ok()
                .filter(|t| t.status == "settled")
        },
    )
    .await;
    let settled = client.standing_order(reserve_id).await.unwrap();
    assert_eq!(settled["reserve"]["settlement"], "settled", "{settled}");
    drop(providers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rented_adapter_is_pinned_by_its_provider_and_its_term_paid_on_chain() {
    let world = common::settling("rent", 500, 5, 3).await;
    let client = &world.client;
    let bin = provider_bin();
    let model_dir = common::gen_model(&bin, &world.dir.path);
    let (provider, payout) = provider(&world, &model_dir, "holder", 2, "1000000");
    registered(&world, &["holder"]).await;

    // An adapter the provider has never seen, on the catalog's base.
    let adapters = world.dir.path.join("adapters");
    let out = run(
        &bin,
        &[
            "gen-adapters",
            "--model",
            path(&model_dir),
            "--out",
            path(&adapters),
            "--count",
            "1",
            "--ranks",
            "4",
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config_path = adapters.join("adapter-000").join("adapter_config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["base_model_name_or_path"] = json!(MODEL);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let agent = common::Agent::import(
        &world.dir.path,
        &world.market,
        B256::from(world.anvil.keys[1].to_bytes()),
    )
    .await;
    // Storing needs a bound account with an open tab.
    let escrow_id = agent.open_tab(client, 5_000_000, &world.deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let stored = cx_json(
        agent.args(&[
            "put-adapter",
            adapters.join("adapter-000").to_str().unwrap(),
            "--json",
        ]),
        String::new(),
    )
    .await;
    let adapter = stored["id"].as_str().unwrap().to_owned();
    let tab = escrow_id.to_string();

    // A 20 s term, at most 1 000 000 wei, tolerating up to half the observations absent (the
    // first sweeps come before the provider has fetched it).
    let committed = cx_json(
        agent.args(&[
            "rent",
            "--adapter",
            &format!("0x{adapter}"),
            "--term-s",
            "20",
            "--max-rent-wei",
            "1000000",
            "--epsilon-ppm",
            "500000",
            "--tab",
            &tab,
            "--json",
        ]),
        String::new(),
    )
    .await;
    assert_eq!(committed["status"], "committed", "{committed}");
    let holding = &committed["rent"]["holders"][0];
    assert_eq!(holding["bundle_id"], "holder", "{committed}");
    let rent_id: B256 = committed["id"].as_str().unwrap().parse().unwrap();
    let rent_wei: u128 = holding["rent_wei"].as_str().unwrap().parse().unwrap();
    assert!(rent_wei > 0, "{committed}");

    // The provider fetches it, loads it pinned and reports it resident.
    until(
        "the rented adapter resident",
        Duration::from_secs(30),
        || async {
            client
                .providers()
                .await
                .ok()
                .filter(|b| {
                    b.iter()
                        .any(|b| b.id == "holder" && b.resident_adapters.contains(&adapter))
                })
                .map(|_| ())
        },
    )
    .await;

    // At the term's end the provider claims the rent less the measured rebate.
    let filled = until("the rent claimed", Duration::from_secs(60), || async {
        client
            .standing_order(rent_id)
            .await
            .ok()
            .filter(|o| o["status"] == "filled")
    })
    .await;
    let fill = &filled["rent"]["holders"][0];
    assert!(fill["resident_reports"].as_u64().unwrap() > 0, "{filled}");
    assert_eq!(fill["sla_met"], true, "{filled}");
    assert_eq!(fill["rebate_wei"], "0", "{filled}");
    assert_eq!(fill["charged_wei"], rent_wei.to_string(), "{filled}");
    assert_eq!(
        client.tab(31337, escrow_id).await.unwrap().held_wei,
        rent_wei
    );

    // The tab settles: every signer checks the rent's voucher; the provider is credited the
    // rent less the fee.
    let closed = cx_json(agent.args(&["settle-tab", &tab, "--json"]), String::new()).await;
    assert_eq!(closed["status"], "closing", "{closed}");
    let claim = until("the tab settled", Duration::from_secs(90), || async {
        client.claim(31337, payout).await.ok()
    })
    .await;
    let cut = rent_wei * 500 / 10_000;
    assert_eq!(claim.cumulative_wei, (rent_wei - cut).to_string());
    // The claim is served once the batch is submitted; the term's settlement reads settled
    // once the chain watcher has seen the batch land, a moment later.
    until(
        "the rent's term settled",
        Duration::from_secs(60),
        || async {
            client
                .standing_order(rent_id)
                .await
                .ok()
                .filter(|o| o["rent"]["holders"][0]["settlement"] == "settled")
        },
    )
    .await;
    drop(provider);
}
