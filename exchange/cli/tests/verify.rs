//! A cheat caught by replication and slashed on chain, each party its own process: a committee
//! of three `cx-signer`s (any two sign) after a DKG, Anvil with the contracts under the group
//! key, `cx serve --settlement`, and three real `cx-provider`s of distinct operators, each staked
//! under its ML-DSA key — the cheapest one started with `--fault wrong-output` (altered bytes
//! under a correctly signed receipt). An agent's T1 class-D intent goes to the cheap cheat and is
//! re-executed on a second provider; the outputs disagree, a referee on the third decides, the
//! cheat's job fails, every signer checks the evidence (the cheat's receipt against the two
//! agreeing ones, each key registered on chain and staked) and the slash lands on the market's
//! terms: the cheat's stake in `ProviderRegistry` loses a bounded multiple of its job's price,
//! paid to the burn address, never to the buyer. When the tab settles, the honest providers are
//! credited and the cheat is not.

mod common;

use alloy::primitives::{B256, U256};
use common::{Killed, MODEL, cx_json, path, provider_bin, run};
use cx_devnet::free_port;
use cx_protocol::replica::run_job_id;
use cx_settlement::evm::EvmClient;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_returning_wrong_bytes_under_t1_is_outvoted_slashed_on_chain_and_not_paid() {
    let bin = provider_bin();
    let world = common::settling("verify", 0, 6, 5).await;
    // Keys: 0 deploys, 1 the agent, 2–4 the providers, 5 posts.
    let (dir, anvil, deployment, deployments, market) = (
        &world.dir,
        &world.anvil,
        world.deployment,
        &world.deployments,
        &world.market,
    );
    let (url, ca, exchange_hash) = (
        market.url.clone(),
        market.ca.clone(),
        market.key_hash.clone(),
    );

    // Three providers of three operators; the cheat asks least, so the job goes to it first.
    let model_dir = common::gen_model(&bin, &dir.path);
    let mut providers = Vec::new();
    let mut payouts = Vec::new();
    for (i, (operator, ask, fault)) in [
        ("op-cheat", "100000", true),
        ("op-b", "1000000", false),
        ("op-c", "1000000", false),
    ]
    .into_iter()
    .enumerate()
    {
        let identity = dir.path.join(format!("provider-{i}.key"));
        let out = run(&bin, &["keygen", "--out", path(&identity)], "");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let evm_key = dir.path.join(format!("provider-{i}-evm.key"));
        common::write_evm_key(&evm_key, &anvil.keys[2 + i]);
        common::stake_provider(&bin, &evm_key, deployments, &identity);
        let payout = anvil.keys[2 + i].address();
        payouts.push(payout);
        let mut cmd = Command::new(&bin);
        cmd.args(["serve", "--model", path(&model_dir)])
            .args(["--port", &free_port().unwrap().to_string()])
            .args(["--served-model-name", MODEL, "--threads", "1"])
            .args(["--exchange", &url, "--exchange-ca", path(&ca)])
            .args(["--exchange-key-hash", &format!("0x{exchange_hash}")])
            .args(["--identity", path(&identity)])
            .args(["--payout", &payout.to_string(), "--operator", operator])
            .args(["--ask-wei-per-s", ask, "--bundle-id", &format!("tiny-{i}")])
            .args(["--model-name", MODEL])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if fault {
            cmd.args(["--fault", "wrong-output"]);
        }
        providers.push(Killed(cmd.spawn().expect("cx-provider runs")));
    }
    let client = cx_client::Client::new(&url, Some(&ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    let waited = Instant::now();
    while client.providers().await.map_or(0, |b| b.len()) < 3 {
        assert!(
            waited.elapsed() < Duration::from_secs(90),
            "the providers never registered"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The agent's T1 class-D intent on a tab.
    let agent =
        common::Agent::import(&dir.path, market, B256::from(anvil.keys[1].to_bytes())).await;
    let escrow_id = agent.open_tab(&client, 5_000_000, deployments).await;
    let reader = agent.reader(&client);
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
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
            "3000000",
            "--tab",
            &escrow_id.to_string(),
            "--deadline-in",
            "120",
            "--tier",
            "T1",
            "--class",
            "D",
            "--json",
        ]),
        String::new(),
    )
    .await;
    let original: B256 = accepted["job_id"].as_str().unwrap().parse().unwrap();
    let ids = [1, 2].map(|k| B256::from(run_job_id(original.0, k)));

    // The verdict: the cheat (on bundle tiny-0, the job's or the replica's) outvoted by the two
    // honest providers, one of them the referee its conflict called for.
    let waited = Instant::now();
    let (cheat_job, honest_jobs) = loop {
        let mut all = vec![reader.job(original).await.unwrap()];
        for id in ids {
            if let Ok(job) = reader.job(id).await {
                all.push(job);
            }
        }
        let (cheat, honest): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|j| j.bundle_id.as_deref() == Some("tiny-0"));
        if cheat.first().is_some_and(|c| c.status == "failed")
            && honest.len() == 2
            && honest.iter().all(|j| j.status == "done")
        {
            break (cheat.into_iter().next().unwrap(), honest);
        }
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "no verdict: {cheat:?} {honest:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        cheat_job
            .events
            .iter()
            .any(|e| e.status == "verification_failed"),
        "{cheat_job:?}"
    );
    for job in &honest_jobs {
        let verified = job.events.iter().find(|e| e.status == "verified");
        let detail = &verified.unwrap_or_else(|| panic!("{job:?}")).detail;
        assert_eq!(detail["method"], "replica");
        assert_eq!(detail["runs"].as_array().unwrap().len(), 3);
    }
    // The buyer's job carries the majority's output, whoever ran it.
    let delivered = reader.job(original).await.unwrap();
    let text = delivered.result.as_ref().unwrap()["text"].as_str().unwrap();
    assert!(!text.contains("altered"), "{text}");

    // The slash lands: the committee signed it on evidence each signer checked, and the cheat's
    // stake lost what the market's terms take (10x its job's price, at most what it has), paid
    // to the burn address; the transaction is a job event.
    let registry = EvmClient::connect(&anvil.rpc_url(), anvil.keys[0].clone(), deployment).unwrap();
    let burn = cx_settlement::slash::BURN_ADDRESS;
    let waited = Instant::now();
    loop {
        let (staked, unbonding, _) = registry.provider_stake(payouts[0]).await.unwrap();
        let left = staked + unbonding;
        if left < U256::from(1_000u64) {
            assert_eq!(
                registry.asset_balance(burn).await.unwrap(),
                U256::from(1_000u64) - left,
                "what was taken went to the burn address (a fresh chain's burn address holds nothing)"
            );
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(90),
            "the cheat was never slashed: {:?}",
            reader.job(cheat_job.id).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for honest in &payouts[1..] {
        let (staked, _, _) = registry.provider_stake(*honest).await.unwrap();
        assert_eq!(staked, U256::from(1_000u64), "honest stakes untouched");
    }
    let waited = Instant::now();
    while !reader
        .job(cheat_job.id)
        .await
        .unwrap()
        .events
        .iter()
        .any(|e| e.status == "slashed" && e.detail["tx_hash"].is_string())
    {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "no slashed event"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The tab settles through the signers: the honest providers are credited what their
    // receipts claimed, the cheat nothing.
    cx_json(
        agent.args(&["settle-tab", &escrow_id.to_string(), "--json"]),
        String::new(),
    )
    .await;
    let waited = Instant::now();
    for honest in &payouts[1..] {
        let claim = loop {
            if let Ok(claim) = client.claim(31337, *honest).await {
                break claim;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(120),
                "the tab never settled: {:?}",
                client.tab(31337, escrow_id).await
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert!(
            claim.cumulative_wei.parse::<u128>().unwrap() > 0,
            "{claim:?}"
        );
    }
    assert!(
        client.claim(31337, payouts[0]).await.is_err(),
        "the cheat is credited nothing"
    );
    drop(providers);
}
