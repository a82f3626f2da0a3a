//! Money through the whole market, each party its own process: a committee of three
//! `cx-signer`s (any two sign) after a DKG, Anvil with the contracts under the group key, `cx
//! serve --settlement` (the coordinator inside the exchange), a real `cx-provider` whose ML-DSA
//! key is registered on chain, and an agent that buys one completion on a tab and asks for it to
//! settle. The batch lands; the provider is credited what its receipt claimed less the
//! exchange's fee, the fee account the fee, the buyer the rest of the tab; the buyer claims
//! with `cx agent claim`, the provider with `cx-provider claim`. Then a real browser (headless
//! Chromium) opens the settled job in the explorer and follows its links to the batch and the
//! provider; the screenshots are kept under `out/browser/`.

mod common;

use alloy::primitives::{B256, U256};
use common::{Killed, MODEL, cx_json, path, provider_bin, run};
use cx_devnet::free_port;
use cx_settlement::evm::EvmClient;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tab_settles_on_chain_through_the_committee_and_both_sides_claim() {
    let bin = provider_bin();
    // The committee pins the exchange's key and takes a 5 % fee; the chain's contracts are
    // under the committee's key (keys: 0 deploys, 1 the agent, 2 the provider, 3 posts).
    let mut world = common::settling("settle", 500, 4, 3).await;
    let settles = world.market.serve.field("settlement");
    let (dir, anvil, deployment, deployments, market, books, exchange, fee) = (
        &world.dir,
        &world.anvil,
        world.deployment,
        &world.deployments,
        &world.market,
        &world.books,
        &world.exchange,
        world.fee,
    );
    let (url, ca, exchange_hash) = (
        market.url.clone(),
        market.ca.clone(),
        market.key_hash.clone(),
    );
    assert!(settles.starts_with("2 of 3 signers"), "{settles}");
    assert_eq!(format!("{}", exchange.id()), exchange_hash);

    // The provider: a generated model, its key registered on chain for its payout account.
    let model_dir = common::gen_model(&bin, &dir.path);
    let identity = dir.path.join("provider.key");
    let out = run(&bin, &["keygen", "--out", path(&identity)], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let evm_key = dir.path.join("provider-evm.key");
    common::write_evm_key(&evm_key, &anvil.keys[2]);
    common::stake_provider(&bin, &evm_key, deployments, &identity);
    let provider_account =
        EvmClient::connect(&anvil.rpc_url(), anvil.keys[2].clone(), deployment).unwrap();
    let payout = provider_account.account();
    let _provider = Killed(
        Command::new(&bin)
            .args(["serve", "--model", path(&model_dir)])
            .args(["--port", &free_port().unwrap().to_string()])
            .args(["--served-model-name", MODEL, "--threads", "1"])
            .args(["--exchange", &url, "--exchange-ca", path(&ca)])
            .args(["--exchange-key-hash", &format!("0x{exchange_hash}")])
            .args(["--identity", path(&identity)])
            .args(["--payout", &payout.to_string(), "--operator", "op-test"])
            .args(["--ask-wei-per-s", "1000000", "--bundle-id", "tiny-cpu-0"])
            .args(["--model-name", MODEL])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cx-provider runs"),
    );
    let client = cx_client::Client::new(&url, Some(&ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    let waited = Instant::now();
    while !client
        .providers()
        .await
        .is_ok_and(|b| b.iter().any(|b| b.id == "tiny-cpu-0"))
    {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "never registered"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The agent buys one completion on a tab of 5,000,000 wei.
    let agent =
        common::Agent::import(&dir.path, market, B256::from(anvil.keys[1].to_bytes())).await;
    let amount = 5_000_000u128;
    let escrow_id = agent.open_tab(&client, amount, deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(escrow_id, "4000000", "1000000", "60").await;
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    });
    let bought = client.chat(&api_key, &chat).await.unwrap();
    assert!(
        bought["choices"][0]["message"]["content"].is_string(),
        "{bought}"
    );
    let chat_charged = client.tab(31337, escrow_id).await.unwrap().held_wei;
    assert!(chat_charged > 0);

    // A search on the same tab: the provider finds a witness (12 leading zero bits: ~4,000
    // hashes), the exchange checks it and fills the search for the work a witness implies at
    // the price it set (the budget for 99 % is held, ~4.6 times that); every signer checks the
    // witness again before it pays.
    let filled = cx_json(
        agent.args(&[
            "search",
            "--prefix",
            &format!("0x{}", hex::encode(b"cx settle test")),
            "--zero-bits",
            "12",
            // The budget at ~10⁵ trials/s (a debug build's worker) and 10⁶ wei/s: ~2·10⁵ wei.
            "--max-price-wei",
            "1000000",
            "--tab",
            &escrow_id.to_string(),
            "--deadline-in",
            "60",
            "--wait",
            "--json",
        ]),
        String::new(),
    )
    .await;
    assert_eq!(filled["status"], "filled", "{filled}");
    let search_id: B256 = filled["id"].as_str().unwrap().parse().unwrap();
    let charged = client.tab(31337, escrow_id).await.unwrap().held_wei;
    let price = &filled["order"]["price"];
    assert_eq!(price["witness_trials"], "4096", "{filled}");
    let witness_wei: u128 = price["witness_wei"].as_str().unwrap().parse().unwrap();
    let hold_wei: u128 = price["hold_wei"].as_str().unwrap().parse().unwrap();
    assert!(0 < witness_wei && witness_wei < hold_wei, "{price}");
    assert_eq!(
        charged,
        chat_charged + witness_wei,
        "the work a witness implies, charged; the rest of the hold returned"
    );

    // Nothing is credited before the tab settles.
    assert!(client.claim(31337, payout).await.is_err());

    // The buyer settles the tab now; the next batch lands on chain.
    let closed = cx_json(
        agent.args(&["settle-tab", &escrow_id.to_string(), "--json"]),
        String::new(),
    )
    .await;
    assert_eq!(closed["status"], "closing", "{closed}");
    let waited = Instant::now();
    let provider_claim = loop {
        if let Ok(claim) = client.claim(31337, payout).await {
            break claim;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(90),
            "the tab never settled: {:?}",
            client.tab(31337, escrow_id).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // 5% of each receipt, rounded down receipt by receipt.
    let cut = chat_charged * 500 / 10_000 + witness_wei * 500 / 10_000;
    assert_eq!(provider_claim.cumulative_wei, (charged - cut).to_string());
    let fee_claim = client.claim(31337, fee.account).await.unwrap();
    assert_eq!(fee_claim.cumulative_wei, cut.to_string());
    assert_eq!(
        client.tab(31337, escrow_id).await.unwrap().status,
        "settled"
    );

    // The buyer claims the rest of the tab, once.
    let claimed = cx_json(
        agent.args(&["claim", "--json", "--deployments", path(deployments)]),
        String::new(),
    )
    .await;
    assert_eq!(
        claimed["claimed_wei"],
        (amount - charged).to_string(),
        "{claimed}"
    );
    let again = run(
        std::path::Path::new(env!("CARGO_BIN_EXE_cx")),
        &agent
            .args(&["claim", "--deployments", path(deployments)])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "",
    );
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("nothing to claim"), "{err}");

    // The provider claims with `cx-provider claim`: the exchange's proof, its own account.
    let before = provider_account.claimed(payout).await.unwrap();
    let claim_args = [
        "claim",
        "--evm-key",
        path(&evm_key),
        "--deployments",
        path(deployments),
        "--exchange",
        &url,
        "--exchange-ca",
        path(&ca),
    ];
    let out = run(&bin, &claim_args, "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("claimed {} wei", charged - cut)),
        "{said}"
    );
    assert_eq!(
        provider_account.claimed(payout).await.unwrap() - before,
        U256::from(charged - cut)
    );
    let again = run(&bin, &claim_args, "");
    assert!(!again.status.success(), "nothing left to claim");

    // The explorer in headless Chromium: the job page shows the job settled, every cost term
    // and the transaction hash on its chain; its links lead to the batch and the provider.
    let jobs = cx_json(agent.args(&["jobs", "--json"]), String::new()).await;
    let chat_job = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["model"] == MODEL)
        .unwrap_or_else(|| panic!("the chat's job: {jobs}"));
    assert!(
        jobs.as_array()
            .unwrap()
            .iter()
            .any(|j| j["model"] == "search"),
        "the search's fill is a job of the tab: {jobs}"
    );
    let job_id = chat_job["id"].as_str().unwrap().to_owned();
    let cert = ca.parent().unwrap().join("server.pem");
    let shots = common::screenshots_dir();
    let job_page = tokio::task::block_in_place(|| {
        common::browse(
            &format!("{url}/explorer/jobs/{job_id}"),
            &cert,
            &shots.join("job.png"),
        )
    });
    common::check_settled_job_page(&job_page);
    let batch_href = common::element_href(&job_page, "batch-link").expect("a batch link");
    let batch_page = tokio::task::block_in_place(|| {
        common::browse(
            &format!("{url}{batch_href}"),
            &cert,
            &shots.join("batch.png"),
        )
    });
    assert!(
        batch_page.contains(&job_id[2..10]),
        "the batch lists the job: {batch_page}"
    );
    let gas = common::element_text(&batch_page, "gas").expect("gas");
    assert!(
        gas.chars().next().is_some_and(|c| c.is_ascii_digit()),
        "{gas}"
    );
    let signers = common::element_text(&batch_page, "signers").expect("signers");
    assert!(
        !signers.contains("not named"),
        "two of three signed: {signers}"
    );
    let provider_href = common::element_href(&job_page, "provider-link").expect("a provider link");
    let provider_page = tokio::task::block_in_place(|| {
        common::browse(
            &format!("{url}{provider_href}"),
            &cert,
            &shots.join("provider.png"),
        )
    });
    let earnings = common::element_text(&provider_page, "earnings").expect("earnings");
    assert!(!earnings.is_empty(), "{earnings}");
    // The search's fill is a job page too, settled with its tab.
    let search_page = tokio::task::block_in_place(|| {
        common::browse(
            &format!("{url}/explorer/jobs/{search_id}"),
            &cert,
            &shots.join("search.png"),
        )
    });
    let status = common::element_text(&search_page, "status").expect("a status");
    assert!(status.contains("settled"), "{status}");
    assert_eq!(
        common::element_href(&search_page, "provider-link"),
        Some(provider_href.clone()),
        "the witness's provider, from its receipt"
    );
    // Its residency report: the slot's shadow price, as its cache reported it with its offer.
    let shadow = common::element_text(&provider_page, "shadow-price").expect("shadow price");
    assert!(!shadow.contains("not reported"), "{shadow}");

    // A provider that changes its registered key after the work: the committee refuses to pay
    // receipts signed by a key no longer registered, the exchange takes that job out of
    // settlement with the signers' reason and gives the batch up, and nothing stays stuck.
    let second_tab = agent.open_tab(&client, 1_000_000, deployments).await;
    let key = agent.session(second_tab, "900000", "100000", "30").await;
    client.chat(&key, &chat).await.unwrap();
    provider_account
        .set_metadata("http://127.0.0.1:9001", B256::repeat_byte(0x66))
        .await
        .unwrap();
    cx_json(
        agent.args(&["settle-tab", &second_tab.to_string(), "--json"]),
        String::new(),
    )
    .await;
    let waited = Instant::now();
    let reason = loop {
        let rejected: Option<(String,)> =
            sqlx::query_as("SELECT reason FROM settlement_rejected_receipts LIMIT 1")
                .fetch_optional(books.pool())
                .await
                .unwrap();
        if let Some((reason,)) = rejected {
            break reason;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the refused job was never taken out"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(reason.contains("has not registered key"), "{reason}");
    let unfinished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM settlement_batch_parts WHERE status <> 'posted'")
            .fetch_one(books.pool())
            .await
            .unwrap();
    assert_eq!(
        unfinished, 0,
        "the refused batch was given up, not left to block the next"
    );
}

/// `cx chain deploy` as an operator runs it against a chain that is not the devnet's: a fresh
/// Anvil with chain id 4242 mining every second, the deployer's key in an encrypted keystore
/// written by Foundry's own `cast wallet import`; the entry it writes is one `cx serve` starts
/// on. A wrong password is one line and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_deploy_with_a_cast_keystore_writes_an_entry_cx_serve_accepts() {
    let anvil = tokio::task::block_in_place(|| {
        cx_devnet::AnvilInstance::spawn_with_block_time(4242, 2, 1).expect("anvil")
    });
    let dir = common::scratch("chain-deploy");
    let cast = cx_devnet::anvil_binary().with_file_name("cast");
    let secret = format!("{}", B256::from(anvil.keys[1].to_bytes()));
    let imported = Command::new(&cast)
        .args(["wallet", "import", "deployer", "--private-key", &secret])
        .args(["--unsafe-password", "correct horse"])
        .args(["--keystore-dir", path(&dir.path)])
        .output()
        .expect("cast runs");
    assert!(imported.status.success(), "{imported:?}");
    let keystore = dir.path.join("deployer");
    let out_file = dir.path.join("deployments.json");
    let deploy = |password: &str| {
        Command::new(common::cx_binary())
            .args(["chain", "deploy", "--rpc", &anvil.rpc_url()])
            .args(["--keystore", path(&keystore)])
            .args(["--group-key", &common::group_key().to_hex()])
            .args(["--asset", "native", "--out", path(&out_file), "--json"])
            .env("CX_KEYSTORE_PASSWORD", password)
            .output()
            .expect("cx runs")
    };

    let wrong = tokio::task::block_in_place(|| deploy("wrong"));
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--keystore") && err.contains("decrypt"),
        "{err}"
    );
    assert!(!out_file.exists(), "nothing written");

    let done = tokio::task::block_in_place(|| deploy("correct horse"));
    assert!(done.status.success(), "{done:?}");
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(
        !stdout.contains(secret.trim_start_matches("0x")),
        "the key is never printed"
    );
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["chain_id"], 4242);
    assert_eq!(
        report["deployer"].as_str().unwrap(),
        anvil.keys[1].address().to_string()
    );
    let file = cx_contracts::DeploymentsFile::load(&out_file).unwrap();
    let entry = file.chain(4242).expect("the chain's entry");
    assert_eq!(entry.deployment.chain_id, 4242);
    assert_eq!(
        entry.deployment.settlement.to_string(),
        report["settlement"].as_str().unwrap()
    );

    // The exchange starts on it and watches the chain at a public chain's depth.
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let listen = format!("127.0.0.1:{}", free_port().unwrap());
    let ca_dir = dir.path.join("ca");
    let line = tokio::task::block_in_place(|| {
        let mut serve = common::Serve::start(
            &[
                "--listen",
                &listen,
                "--ca-dir",
                path(&ca_dir),
                "--deployments",
                path(&out_file),
            ],
            &db.url,
        );
        serve.field("chain")
    });
    assert!(line.starts_with("4242 at "), "{line}");
    assert!(
        line.contains(&entry.deployment.settlement.to_string()),
        "{line}"
    );
    assert!(line.contains("watched at 12 confirmations"), "{line}");
}
