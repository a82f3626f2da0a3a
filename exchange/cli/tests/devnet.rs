//! `cx devnet` end to end, as CI runs it: the whole market (two Anvil chains, 5 signers after a
//! DKG, the exchange, 2 providers, 2 agents sending traffic) each its own process, until 5 jobs
//! are settled on chain and a batch has landed on each chain; then it exits 0 with a summary,
//! and nothing it started is left running.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

mod common;

/// Every port the devnet would take with `offset` (ARCHITECTURE's defaults + offset).
fn ports(offset: u16) -> Vec<u16> {
    // The exchange's balancer, its two nodes, the chains, the providers, the signers.
    let mut all = vec![8443, 8451, 8452, 8545, 8546, 9001, 9002];
    all.extend(9101..=9105);
    all.into_iter().map(|p| p + offset).collect()
}

fn all_free(offset: u16) -> bool {
    ports(offset)
        .into_iter()
        .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

/// A port offset from `base` (steps of 40, spread by the process id, so two runs of the suite
/// rarely meet) at which every devnet port is free: away from a devnet someone runs on the
/// defaults, and from the other tests' ranges.
fn free_offset(base: u16) -> u16 {
    (0..200)
        .map(|i| base + ((std::process::id() as u16 % 100) + i) % 200 * 40)
        .find(|o| all_free(*o))
        .expect("some free offset")
}

/// `cx devnet` on ports `offset`, in `dir`, on database `url`, with the built signer `signer`
/// and provider; its flags follow.
fn devnet_command(offset: u16, dir: &Path, url: &str, signer: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cx"));
    command
        .arg("devnet")
        .args(["--port-offset", &offset.to_string()])
        .arg("--dir")
        .arg(dir)
        .env("DATABASE_URL", url)
        .env("CX_SIGNER_BIN", signer)
        .env("CX_PROVIDER_BIN", common::provider_bin())
        .stdin(Stdio::null());
    command
}

/// The ports of `offset` that some socket still listens on (`/proc/net/tcp` and `tcp6`, state
/// `0A`). Not a bind attempt: the other devnet tests of this process run beside this one, and
/// their outgoing connections take ephemeral local ports, which can be one of these (the
/// offsets reach into 32768–60999); such a connection makes a bind fail though no child of this
/// devnet is alive.
fn listening(offset: u16) -> Vec<u16> {
    let ours = ports(offset);
    let Some(sockets) = cx_devnet::supervise::listening_sockets() else {
        // No procfs: fall back to what a bind says.
        return ours
            .into_iter()
            .filter(|p| TcpListener::bind(("127.0.0.1", *p)).is_err())
            .collect();
    };
    let mut held = Vec::new();
    for (port, _) in sockets {
        if ours.contains(&port) && !held.contains(&port) {
            held.push(port);
        }
    }
    held
}

/// Whether nothing listens on a port of `offset` within a few seconds of the devnet's exit: a
/// child killed as it stops may take a moment to close its listener on a loaded machine; one
/// that outlives the devnet holds it for good. `Err` names the ports still held.
fn freed(offset: u16) -> Result<(), Vec<u16>> {
    let waited = Instant::now();
    loop {
        let held = listening(offset);
        if held.is_empty() {
            return Ok(());
        }
        if waited.elapsed().as_secs() >= 15 {
            return Err(held);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The secrets in `dir`'s key files, lowercase hex without `0x` (or the session key as is).
fn secrets_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for path in files_under(dir) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let is_key = name.ends_with(".key") || name.ends_with(".identity");
        let is_agent =
            path.parent().is_some_and(|p| p.ends_with("agents")) && name.ends_with(".json");
        if !is_key && !is_agent {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(fields)) => {
                for (field, value) in fields {
                    if (field.contains("secret") || field.contains("seed"))
                        && let Some(v) = value.as_str()
                    {
                        out.push(v.trim_start_matches("0x").to_lowercase());
                    }
                }
            }
            _ => out.push(text.trim().trim_start_matches("0x").to_lowercase()),
        }
    }
    out.retain(|s| s.len() >= 32);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_devnet_settles_jobs_on_both_chains_and_stops_every_child() {
    let offset = free_offset(20_000);
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let dir = common::scratch("devnet");
    let signer = tokio::task::block_in_place(cx_devnet::signer_binary).unwrap();

    let started = Instant::now();
    let out = tokio::task::spawn_blocking({
        let dir = dir.path.clone();
        let url = db.url.clone();
        move || {
            devnet_command(offset, &dir, &url, &signer)
                .args(["--exit-after-settled", "5"])
                .args(["--providers", "2", "--agents", "2", "--timeout-s", "300"])
                // Chains that mine every 2 s, as a real network: every transaction of the
                // market (deposits, tabs, stakes, batches) waits for its block.
                .args(["--block-time", "2"])
                // Two exchange nodes behind the balancer: the writer, and a standby that
                // forwards to it the connections the balancer gives it.
                .args(["--exchanges", "2"])
                .output()
                .expect("cx runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cx devnet failed ({}):\n{stdout}\n{stderr}\nexchange log:\n{}",
        out.status,
        std::fs::read_to_string(dir.path.join("exchange.log")).unwrap_or_default()
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON, last");
    assert!(summary["settled_jobs"].as_u64().unwrap() >= 5, "{summary}");
    assert!(summary["batches"].as_u64().unwrap() >= 1, "{summary}");
    for chain in ["31337", "31338"] {
        let first = summary["first_batch_s"][chain].as_f64();
        assert!(
            first.is_some_and(|s| s > 0.0),
            "no batch on {chain}: {summary}"
        );
    }
    assert_eq!(
        summary["processes"], 12,
        "11 children (the second exchange node among them) and itself: {summary}"
    );
    // What it printed for a person: where to look, the CA's fingerprint, commands to try.
    let exchange = format!("https://127.0.0.1:{}", 8443 + offset);
    assert!(
        stdout.contains(&format!("explorer   {exchange}/explorer")),
        "{stdout}"
    );
    assert!(stdout.contains("ca sha256  "), "{stdout}");
    assert!(stdout.contains(" intent --model tiny-llama"), "{stdout}");
    assert!(stdout.contains("openai.OpenAI(base_url="), "{stdout}");
    assert!(stdout.contains(" claim --deployments "), "{stdout}");
    assert!(stderr.contains("stopped 11 processes"), "{stderr}");
    // The second node never wrote: it forwarded to the writer the whole run.
    let standby = std::fs::read_to_string(dir.path.join("exchange-node-2.log")).unwrap();
    assert!(
        standby.contains("a standby node, forwarding to the writer"),
        "{standby}"
    );
    assert!(!standby.contains("writer epoch"), "{standby}");
    // Its logs stay for a post-mortem.
    for log in [
        "exchange.log",
        "chain-31337/anvil.log",
        "signers/signer-1.log",
    ] {
        assert!(Path::new(&dir.path.join(log)).exists(), "{log}");
    }
    // Nothing it started still listens.
    if let Err(held) = freed(offset) {
        panic!("a child outlived the devnet: ports {held:?} still listen");
    }
    // No secret it generated is in any log: every key file's secret (the whole file for raw
    // keys; the `*secret*`/`*seed*` fields of JSON key files), the session key, searched for
    // in every `.log` under its folder, as stored and without its 0x.
    let secrets = secrets_under(&dir.path);
    assert!(secrets.len() >= 15, "found only {} secrets", secrets.len());
    for log in files_under(&dir.path)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
    {
        let text = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .to_lowercase();
        for secret in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "{} holds a secret from a key file",
                log.display()
            );
        }
    }
    eprintln!(
        "devnet test: {:.0} s, summary {summary}",
        started.elapsed().as_secs_f64()
    );
}

/// The explorer of a running devnet in a real browser (headless Chromium): wait for a job
/// settled on chain, open its page, check it shows the settled status, every cost term and the
/// transaction hash, then follow its links to the batch and the provider. Screenshots are kept
/// under `out/browser/devnet-*.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_job_of_the_devnet_shows_in_a_real_browser() {
    let offset = free_offset(28_020);
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let dir = common::scratch("devnet-browser");
    let signer = tokio::task::block_in_place(cx_devnet::signer_binary).unwrap();
    let mut devnet = common::Interrupted(
        devnet_command(offset, &dir.path, &db.url, &signer)
            .args(["--providers", "1", "--agents", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cx runs"),
    );
    let exchange = format!("https://127.0.0.1:{}", 8443 + offset);
    let cert = dir.path.join("ca/server.pem");
    let shots = common::screenshots_dir();
    let started = Instant::now();
    let job_path = loop {
        assert!(
            devnet.0.try_wait().unwrap().is_none(),
            "the devnet exited: {}",
            std::fs::read_to_string(dir.path.join("exchange.log")).unwrap_or_default()
        );
        if cert.exists() {
            let list = tokio::task::block_in_place(|| {
                // A job the engine cleared (T0 on one provider): a reserve's take-or-pay or a
                // search's fill has no cost terms to check.
                common::try_browse(
                    &format!("{exchange}/explorer/jobs?status=settled&tier=T0"),
                    &cert,
                )
            });
            if let Some(at) = list
                .as_deref()
                .and_then(|l| l.find("href=\"/explorer/jobs/0x"))
            {
                let list = list.as_deref().unwrap();
                let start = at + "href=\"".len();
                break list[start..start + list[start..].find('"').unwrap()].to_owned();
            }
        }
        assert!(
            started.elapsed().as_secs() < 150,
            "no job settled in 150 s: {}",
            std::fs::read_to_string(dir.path.join("exchange.log")).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    };
    let job_page = tokio::task::block_in_place(|| {
        common::browse(
            &format!("{exchange}{job_path}"),
            &cert,
            &shots.join("devnet-job.png"),
        )
    });
    common::check_settled_job_page(&job_page);
    let batch = common::element_href(&job_page, "batch-link").expect("a batch link");
    let batch_page = tokio::task::block_in_place(|| {
        common::browse(
            &format!("{exchange}{batch}"),
            &cert,
            &shots.join("devnet-batch.png"),
        )
    });
    assert!(
        common::element_text(&batch_page, "parts").is_some(),
        "{batch_page}"
    );
    let provider = common::element_href(&job_page, "provider-link").expect("a provider link");
    let provider_page = tokio::task::block_in_place(|| {
        common::browse(
            &format!("{exchange}{provider}"),
            &cert,
            &shots.join("devnet-provider.png"),
        )
    });
    assert!(
        common::element_text(&provider_page, "stake").is_some(),
        "{provider_page}"
    );

    // Ctrl-C stops every child.
    let stopped = Command::new("kill")
        .args(["-INT", &devnet.0.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let waited = Instant::now();
    while devnet.0.try_wait().unwrap().is_none() {
        assert!(
            waited.elapsed().as_secs() < 30,
            "the devnet did not stop on SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    if let Err(held) = freed(offset) {
        panic!("a child outlived the devnet: ports {held:?} still listen");
    }
}

/// The devnet's fleet (3 providers of 3 operators, 5 signers of which any 3 sign, 2 Anvil
/// chains) serving one agent as issue 13 lists it, every party its own process: an intent with
/// the agent's adapter from submission to a claim on the *second* chain; its second request
/// cleared onto the provider that now holds the adapter; that provider killed with the agent's
/// next job on it, which is re-cleared onto another provider and answered; and the provider
/// claiming what it earned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_served_by_the_provider_holding_its_adapter_and_outlives_a_killed_one() {
    const CHAIN: u64 = 31338;
    let offset = free_offset(36_020);
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let dir = common::scratch("devnet-market");
    let signer = tokio::task::block_in_place(cx_devnet::signer_binary).unwrap();
    // Its output beside, not inside, its folder (which it makes afresh).
    let outs = common::scratch("devnet-market-out");
    let out_path = outs.path.join("devnet.out");
    let mut devnet = common::Interrupted(
        devnet_command(offset, &dir.path, &db.url, &signer)
            .args(["--no-traffic", "--providers", "3", "--agents", "1"])
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(outs.path.join("devnet.err")).unwrap())
            .spawn()
            .expect("cx runs"),
    );
    let log = |name: &str| {
        std::fs::read_to_string(outs.path.join(name))
            .or_else(|_| std::fs::read_to_string(dir.path.join(name)))
            .unwrap_or_default()
    };
    let started = Instant::now();
    while !log("devnet.out").contains("the market is up") {
        assert!(
            devnet.0.try_wait().unwrap().is_none() && started.elapsed().as_secs() < 400,
            "the devnet never came up:\n{}\n{}",
            log("devnet.err"),
            log("exchange.log")
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let url = format!("https://127.0.0.1:{}", 8443 + offset);
    let ca = dir.path.join("ca/ca.pem");
    let deployments = dir.path.join("deployments.json");
    let client = cx_client::Client::new(&url, Some(&ca)).unwrap();
    let agent = |rest: &[&str]| {
        let mut args = common::strings(&[
            "agent",
            "--exchange",
            &url,
            "--ca",
            common::path(&ca),
            "--keys",
            common::path(&dir.path.join("agents/try.json")),
            "--chain",
            &CHAIN.to_string(),
        ]);
        args.extend(common::strings(rest));
        args
    };

    // A tab on the second chain, and one of the devnet's stored adapters (no provider holds
    // any at start).
    let amount: u128 = 50_000_000;
    let tab = common::cx_json(
        agent(&[
            "open-tab",
            "--amount",
            &amount.to_string(),
            "--deadline-in",
            "3600",
            "--deployments",
            common::path(&deployments),
            "--json",
        ]),
        String::new(),
    )
    .await;
    let escrow_id = tab["escrow_id"].as_u64().unwrap();
    let waited = Instant::now();
    while client.tab(CHAIN, escrow_id).await.is_err() {
        assert!(
            waited.elapsed().as_secs() < 30,
            "the tab was never mirrored"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let adapter = common::cx_json(
        agent(&[
            "put-adapter",
            common::path(&dir.path.join("adapters/adapter-007")),
            "--json",
        ]),
        String::new(),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let intent = |prompt: &str, deadline_in: u64| {
        common::cx_json(
            agent(&[
                "intent",
                "--model",
                "tiny-llama",
                "--adapter",
                &adapter,
                "--prompt",
                prompt,
                "--max-tokens",
                "8",
                "--max-price-wei",
                "10000000",
                "--tab",
                &escrow_id.to_string(),
                "--tier",
                "T0",
                "--deadline-in",
                &deadline_in.to_string(),
                "--wait",
                "--json",
            ]),
            String::new(),
        )
    };

    // The first request loads the adapter wherever it is cleared.
    let first = intent("Say hello.", 60).await;
    assert_eq!(first["final_status"], "done", "{first}");
    let holder = first["bundle_id"].as_str().unwrap().to_owned();
    assert!(
        first["terms"]["adapter_load"].as_f64().unwrap() > 0.0,
        "cold at first: {first}"
    );
    // Its provider reports the adapter resident (its offer is re-signed on the change).
    let waited = Instant::now();
    loop {
        let bundles = client.providers().await.unwrap();
        if bundles
            .iter()
            .any(|b| b.id == holder && b.resident_adapters.contains(&adapter))
        {
            break;
        }
        assert!(
            waited.elapsed().as_secs() < 60,
            "{holder} never reported {adapter}: {bundles:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    // The second request of the same agent goes to the provider that holds its adapter.
    let second = intent("Say hello again.", 60).await;
    assert_eq!(second["final_status"], "done", "{second}");
    assert_eq!(second["bundle_id"], holder.as_str(), "{second}");
    assert_eq!(
        second["terms"]["adapter_load"].as_f64(),
        Some(0.0),
        "{second}"
    );

    // The holder dies (SIGKILL: no goodbye). The next request is still cleared onto it (its
    // last report says it holds the adapter); once it has been silent past the devnet's
    // `--provider-silence-s` (75 s) it leaves, and the job moves to another provider, which
    // answers the waiting agent.
    let name = holder.trim_end_matches("-cpu");
    let identity = dir.path.join(format!("providers/{name}.key"));
    let killed = Command::new("pkill")
        .args(["-KILL", "-f", &identity.display().to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "no process of {name}");
    let third = intent("Say hello once more.", 170).await;
    assert_eq!(
        third["final_status"],
        "done",
        "{third}\n{}",
        log("exchange.log")
    );
    let moved_to = third["bundle_id"].as_str().unwrap();
    assert_ne!(moved_to, holder, "{third}");
    // The devnet's `try` agent's job: read with its key.
    let try_keys = cx_client::AgentKeys::load(&dir.path.join("agents/try.json")).unwrap();
    let job = client
        .clone()
        .with_credential(cx_client::Credential::Account(
            try_keys.signing_key().clone(),
        ))
        .job(third["job_id"].as_str().unwrap().parse().unwrap())
        .await
        .unwrap();
    assert!(
        job.events.iter().any(|e| e.status == "re-cleared"),
        "{:?}",
        job.events
    );
    assert!(
        devnet.0.try_wait().unwrap().is_none(),
        "the devnet went down with a provider"
    );
    assert!(log("devnet.err").contains(&format!("{name} exited")));

    // The tab settles on the second chain: the buyer claims the rest, the first provider
    // what its receipts earned less the fee.
    let charged: u128 = [&first, &second, &third]
        .iter()
        .map(|j| {
            j["receipt"]["receipt"]["amount_owed_wei"]
                .as_str()
                .map(|w| w.parse::<u128>().unwrap())
                .or_else(|| {
                    j["receipt"]["receipt"]["amount_owed_wei"]
                        .as_u64()
                        .map(u128::from)
                })
                .unwrap()
        })
        .sum();
    let closed = common::cx_json(
        agent(&["settle-tab", &escrow_id.to_string(), "--json"]),
        String::new(),
    )
    .await;
    assert_eq!(closed["status"], "closing", "{closed}");
    let waited = Instant::now();
    while client.tab(CHAIN, escrow_id).await.unwrap().status != "settled" {
        assert!(
            waited.elapsed().as_secs() < 90,
            "the tab never settled: {}",
            log("exchange.log")
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let claimed = common::cx_json(
        agent(&[
            "claim",
            "--json",
            "--deployments",
            common::path(&deployments),
        ]),
        String::new(),
    )
    .await;
    assert_eq!(
        claimed["claimed_wei"],
        (amount - charged).to_string(),
        "{claimed}"
    );
    let out = common::run(
        &common::provider_bin(),
        &[
            "claim",
            "--evm-key",
            common::path(&dir.path.join(format!("providers/{name}-evm.key"))),
            "--deployments",
            common::path(&deployments),
            "--chain",
            &CHAIN.to_string(),
            "--exchange",
            &url,
            "--exchange-ca",
            common::path(&ca),
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cx devnet --model DIR` runs the market on a real checkpoint (SmolLM2-135M-Instruct, which
/// `scripts/setup.sh` installs): the catalog learns it under its Hub name, the provider serves
/// it, the agents' chats and intents are its answers, and their jobs settle on chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_devnet_runs_the_market_on_a_real_checkpoint() {
    const NAME: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
    let model_dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/models/smollm2-135m-instruct");
    assert!(
        model_dir.join("model.safetensors").exists(),
        "{}: the real model is installed by scripts/setup.sh (scripts/real-model.sh)",
        model_dir.display()
    );
    let offset = free_offset(44_020);
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let dir = common::scratch("devnet-real");
    let signer = tokio::task::block_in_place(cx_devnet::signer_binary).unwrap();
    let out = tokio::task::spawn_blocking({
        let dir = dir.path.clone();
        let url = db.url.clone();
        move || {
            devnet_command(offset, &dir, &url, &signer)
                .args(["--exit-after-settled", "3"])
                .args(["--providers", "1", "--agents", "1", "--timeout-s", "400"])
                .arg("--model")
                .arg(&model_dir)
                .args(["--model-name", NAME])
                .output()
                .expect("cx runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cx devnet --model failed ({}):\n{stdout}\n{stderr}\nexchange log:\n{}",
        out.status,
        std::fs::read_to_string(dir.path.join("exchange.log")).unwrap_or_default()
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON, last");
    assert!(summary["settled_jobs"].as_u64().unwrap() >= 3, "{summary}");
    assert!(
        stdout.contains(&format!(" intent --model {NAME} ")),
        "{stdout}"
    );
    let catalog = std::fs::read_to_string(dir.path.join("catalog.toml")).unwrap();
    assert!(catalog.contains(&format!("name = {NAME:?}")), "{catalog}");
    let adapter: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path.join("adapters/adapter-000/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(adapter["base_model_name_or_path"], NAME);
    if let Err(held) = freed(offset) {
        panic!("a child outlived the devnet: ports {held:?} still listen");
    }
}
