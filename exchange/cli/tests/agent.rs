//! `cx agent` as users run it: key files (0600, never silently replaced), one-line errors that
//! name the file, the server's refusal code in the line.

mod common;

use common::{last_json, scratch};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// `cx args…`; the tests say what they mean: the environment of whoever runs them does not leak
/// in (the harness's [`common::run`] drops the `cx agent` variables).
fn cx(args: &[&str], stdin: &str) -> Output {
    common::run(&common::cx_binary(), args, stdin)
}

/// Runs `cx` expecting failure; returns its single stderr line.
fn error_line(args: &[&str]) -> String {
    let out = cx(args, "");
    assert!(!out.status.success(), "expected failure for {args:?}");
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_owned();
    assert_eq!(err.lines().count(), 1, "one line, got: {err}");
    assert!(out.stdout.is_empty(), "nothing on stdout on error");
    err
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn keygen_writes_a_0600_key_file_refuses_to_overwrite_it_and_replaces_it_with_force() {
    let dir = scratch("keygen");
    let path = dir.path.join("agent.json");
    let file = path.to_str().unwrap();

    let first = last_json(&cx(&["agent", "keygen", "--out", file, "--json"], ""));
    assert_eq!(mode(&path), 0o600);
    let account = first["account"].as_str().unwrap().to_owned();
    assert!(
        account.starts_with("0x") && account.len() == 42,
        "{account}"
    );
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(stored["kind"], "cx-agent-keys");
    assert_eq!(stored["account"].as_str().unwrap(), account);

    let before = std::fs::read(&path).unwrap();
    let err = error_line(&["agent", "keygen", "--out", file]);
    assert!(err.contains(file), "{err}");
    assert!(err.contains("--force"), "{err}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the old keys are kept"
    );

    let second = last_json(&cx(
        &["agent", "keygen", "--out", file, "--force", "--json"],
        "",
    ));
    assert_ne!(second["account"], first["account"]);
    assert_eq!(mode(&path), 0o600);
    // Nothing but the key file in the directory: no temporary file left behind.
    assert_eq!(std::fs::read_dir(&dir.path).unwrap().count(), 1);
}

#[test]
fn keygen_imports_a_wallet_secret_from_stdin() {
    let dir = scratch("import");
    let path = dir.path.join("agent.json");
    // Anvil's first deterministic account.
    let secret = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80\n";
    let out = cx(
        &[
            "agent",
            "keygen",
            "--out",
            path.to_str().unwrap(),
            "--import-secp256k1",
            "--json",
        ],
        secret,
    );
    let report = last_json(&out);
    assert_eq!(
        report["account"].as_str().unwrap().to_lowercase(),
        "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
    );
}

#[test]
fn a_key_file_others_can_read_is_refused_naming_the_path() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("perm");
    let path = dir.path.join("agent.json");
    let file = path.to_str().unwrap();
    last_json(&cx(&["agent", "keygen", "--out", file, "--json"], ""));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = error_line(&["agent", "--keys", file, "jobs"]);
    assert!(err.contains(file) && err.contains("chmod 600"), "{err}");
}

#[test]
fn commands_that_need_keys_say_how_to_get_them() {
    let err = error_line(&["agent", "jobs"]);
    assert!(
        err.contains("--keys") && err.contains("cx agent keygen"),
        "{err}"
    );
    let err = error_line(&["agent", "keygen"]);
    assert!(err.contains("--out"), "{err}");
}

#[test]
fn an_unreachable_exchange_is_one_line_naming_the_url() {
    let dir = scratch("unreachable");
    let path = dir.path.join("agent.json");
    let file = path.to_str().unwrap();
    last_json(&cx(&["agent", "keygen", "--out", file, "--json"], ""));
    let err = error_line(&[
        "agent",
        "--keys",
        file,
        "--exchange",
        "http://127.0.0.1:9",
        "bind",
    ]);
    assert!(err.contains("http://127.0.0.1:9/v1/chains"), "{err}");
}

// ---- the whole agent path: Anvil, a real exchange over HTTPS, the `cx agent` commands ----------

mod devnet {
    use super::common::{ScratchDir, Serve, group_key, path, scratch, strings};
    use super::{error_line, last_json};
    use alloy::primitives::{Address, B256, U256};
    use cx_contracts::{ChainDeployment, DeploymentsFile};
    use cx_devnet::AnvilInstance;
    use cx_devnet::db::TempDatabase;
    use cx_devnet::deploy::{DeployParams, deploy};
    use cx_devnet::free_port;
    use cx_protocol::Bundle;
    use serde_json::{Value, json};
    use std::process::Output;
    use std::time::{Duration, Instant};

    /// `cx` on a blocking thread, so that the exchange in this process keeps serving.
    async fn cx(args: Vec<String>, stdin: String) -> Output {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            super::cx(&args, &stdin)
        })
        .await
        .unwrap()
    }

    async fn cx_error(args: Vec<String>) -> String {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            error_line(&args)
        })
        .await
        .unwrap()
    }

    fn bundle(id: &str, price_wei_per_s: u64, resident: bool) -> Bundle {
        serde_json::from_value(json!({
            "id": id, "provider": "op-a", "price_wei_per_s": price_wei_per_s,
            "memory_bytes": 80_000_000_000u64, "bandwidth_bps": 1e9, "rtt_s": 0.01,
            "flops_per_s": 4e14, "context_max": 32768, "determinism": ["D", "S"],
            "tiers": ["T0", "T1"],
            "resident_bases": if resident { vec!["llama-3.1-8b-instruct"] } else { vec![] },
        }))
        .unwrap()
    }

    /// Anvil with the contracts deployed, `cx serve` on it (a fresh database, its own CA, the
    /// `bundles` fixture), and an agent key file importing Anvil's second account.
    struct Env {
        anvil: AnvilInstance,
        dir: ScratchDir,
        deployments: std::path::PathBuf,
        _db: TempDatabase,
        _serve: Serve,
        url: String,
        ca: std::path::PathBuf,
        keys: std::path::PathBuf,
        account: Address,
    }

    impl Env {
        async fn start(tag: &str, bundles: &[Bundle]) -> Env {
            let anvil =
                AnvilInstance::spawn(31337, None, 3).expect("anvil (scripts/setup-foundry.sh)");
            let rpc = anvil.rpc_url();
            let params = DeployParams {
                group_key: group_key(),
                grace_period_s: 1,
                min_stake: U256::from(1u64),
                unbonding_delay_s: 60,
                asset: cx_contracts::AssetSpec::Native,
            };
            let deployment = deploy(&rpc, anvil.keys[0].clone(), params).await.unwrap();
            let chain = ChainDeployment {
                chain: anvil.entry(),
                deployment,
            };
            let dir = scratch(tag);
            let deployments = dir.path.join("deployments.json");
            DeploymentsFile {
                chains: vec![chain.clone()],
            }
            .write(&deployments)
            .unwrap();

            // The exchange, as a person starts it: `cx serve` on the chain the devnet deployed,
            // a bundle fixture, a fresh database and development CA.
            let db = TempDatabase::create().await.unwrap();
            let bundles_file = dir.path.join("bundles.json");
            std::fs::write(&bundles_file, serde_json::to_string(bundles).unwrap()).unwrap();
            let listen = format!("127.0.0.1:{}", free_port().unwrap());
            let serve_args = [
                "--listen".to_owned(),
                listen,
                "--ca-dir".to_owned(),
                path(&dir.path.join("ca")).to_owned(),
                "--deployments".to_owned(),
                path(&deployments).to_owned(),
                "--bundles".to_owned(),
                path(&bundles_file).to_owned(),
                "--settle-margin-s".to_owned(),
                "60".to_owned(),
            ];
            let db_url = db.url.clone();
            let count = bundles.len();
            let (url, ca, serve) = tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = serve_args.iter().map(String::as_str).collect();
                let mut serve = Serve::start(&args, &db_url);
                let url = serve.field("url");
                let ca = serve.field("ca");
                let registered = serve.field("bundles");
                assert!(registered.starts_with(&count.to_string()), "{registered}");
                (url, ca, serve)
            })
            .await
            .unwrap();

            // The agent: Anvil's second account, imported.
            let keys = dir.path.join("agent.json");
            let secret = format!("{}\n", B256::from(anvil.keys[1].to_bytes()));
            let account = anvil.keys[1].address();
            let made = last_json(
                &cx(
                    strings(&[
                        "agent",
                        "keygen",
                        "--out",
                        path(&keys),
                        "--import-secp256k1",
                        "--json",
                    ]),
                    secret,
                )
                .await,
            );
            assert_eq!(
                made["account"]
                    .as_str()
                    .unwrap()
                    .parse::<Address>()
                    .unwrap(),
                account
            );
            Env {
                anvil,
                dir,
                deployments,
                _db: db,
                _serve: serve,
                url,
                ca: std::path::PathBuf::from(ca),
                keys,
                account,
            }
        }

        /// `cx agent` with this exchange, CA and key file, then `rest`.
        fn agent(&self, rest: &[&str]) -> Vec<String> {
            let mut args = strings(&[
                "agent",
                "--exchange",
                &self.url,
                "--ca",
                path(&self.ca),
                "--keys",
                path(&self.keys),
            ]);
            args.extend(strings(rest));
            args
        }

        fn chain_flags(&self) -> [&str; 2] {
            ["--deployments", path(&self.deployments)]
        }

        /// `open-tab` (signed terms, deposit and openJob on chain), waiting until the server's
        /// chain watcher mirrors it; then `bind`. Returns the tab as `open-tab` printed it.
        async fn open_tab_and_bind(&self, amount: &str) -> Value {
            let mut open = vec![
                "open-tab",
                "--amount",
                amount,
                "--deadline-in",
                "3600",
                "--json",
            ];
            open.extend(self.chain_flags());
            let tab = last_json(&cx(self.agent(&open), String::new()).await);
            assert_eq!(
                tab["terms"]["order"]["buyer"]
                    .as_str()
                    .unwrap()
                    .parse::<Address>()
                    .unwrap(),
                self.account
            );
            let id = tab["escrow_id"].as_u64().unwrap().to_string();
            let waited = Instant::now();
            loop {
                let out = cx(self.agent(&["tab", &id, "--json"]), String::new()).await;
                if out.status.success() {
                    break;
                }
                assert!(
                    waited.elapsed() < Duration::from_secs(30),
                    "the watcher never mirrored tab {id}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let bound = last_json(&cx(self.agent(&["bind", "--json"]), String::new()).await);
            assert_eq!(bound["chain_id"], 31337);
            assert_eq!(
                bound["account"]
                    .as_str()
                    .unwrap()
                    .parse::<Address>()
                    .unwrap(),
                self.account
            );
            tab
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_agent_opens_a_tab_on_chain_binds_submits_lists_and_closes_it() {
        let env = Env::start("devnet", &[bundle("warm", 1_000_000, true)]).await;
        let tab = env.open_tab_and_bind("5000000").await;
        let escrow_id = tab["escrow_id"].as_u64().unwrap();
        let deadline_s = tab["deadline_s"].as_u64().unwrap();
        let id = escrow_id.to_string();
        let agent = |rest: &[&str]| env.agent(rest);
        let chain_flags = env.chain_flags();
        let anvil = &env.anvil;

        let intent = |price: &str, nonce: &str| {
            agent(&[
                "intent",
                "--model",
                "llama-8b",
                "--prompt",
                "Say hello in one word.",
                "--max-tokens",
                "16",
                "--max-price-wei",
                price,
                "--tab",
                &id,
                "--nonce",
                nonce,
                // One bundle: T1 of class D (the default) needs a second provider.
                "--tier",
                "T0",
                "--json",
            ])
        };
        let out = cx(intent("100000", "7"), String::new()).await;
        let accepted = last_json(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("bundle           warm"), "{text}");
        assert!(text.contains("base_load 0.000000"), "{text}");
        assert_eq!(accepted["bundle_id"], "warm");
        assert_eq!(accepted["status"], "assigned");
        assert!(accepted["terms"]["total"].as_f64().unwrap() > 0.0);
        let held = accepted["held_wei"].as_str().unwrap().to_owned();

        // The same nonce again: one line with the server's code and field.
        let err = cx_error(intent("90000", "7")).await;
        assert!(
            err.contains("nonce_reused") && err.contains("intent.order.nonce"),
            "{err}"
        );
        // A limit below every ask: no match, said so.
        let err = cx_error(intent("1", "8")).await;
        assert!(err.contains("no_match (HTTP 422)"), "{err}");

        let jobs = last_json(
            &cx(
                agent(&["jobs", "--status", "assigned", "--json"]),
                String::new(),
            )
            .await,
        );
        assert_eq!(jobs.as_array().unwrap().len(), 1);
        assert_eq!(jobs[0]["id"], accepted["job_id"]);
        let shown = last_json(&cx(agent(&["tab", &id, "--json"]), String::new()).await);
        assert_eq!(shown["amount_wei"], "5000000");
        assert_eq!(shown["held_wei"], Value::String(held));
        assert_eq!(shown["deadline_s"].as_u64().unwrap(), deadline_s);

        // close-tab before the deadline: the contract's refusal, on one line.
        let mut close = vec!["close-tab", id.as_str(), "--withdraw", "--json"];
        close.extend(chain_flags);
        let err = cx_error(agent(&close)).await;
        assert!(err.contains("ReclaimTooEarly"), "{err}");
        // After the deadline and the grace period: reclaimed and withdrawn.
        let now = anvil.now_s().await.unwrap();
        anvil.advance_time(deadline_s + 5 - now).await.unwrap();
        let closed = last_json(&cx(agent(&close), String::new()).await);
        assert_eq!(closed["escrow_id"].as_u64().unwrap(), escrow_id);
        assert_eq!(closed["free_deposit_wei"], "5000000");
        assert!(closed["withdraw_tx"].is_string());
    }

    /// A provider that answers every job it pulls with `answer`, signing each receipt for
    /// half the job's price, until `jobs` are done; returns what it charged. Its payout is
    /// `staker`'s account, staked under its key first (the exchange admits only staked
    /// providers).
    async fn provider(
        url: String,
        ca: std::path::PathBuf,
        jobs: usize,
        answer: &str,
        staker: cx_settlement::evm::EvmClient,
    ) -> u128 {
        use cx_client::Client;
        use cx_client::types::Output;
        use cx_protocol::offer::{Offer, SignedOffer};
        use cx_protocol::pq::Identity;
        let client = Client::new(&url, Some(&ca))
            .unwrap()
            .with_timeout(Duration::from_secs(40));
        let identity = Identity::generate();
        let token = "provider-dispatch-token";
        staker
            .set_metadata("", identity.id().0.into())
            .await
            .unwrap();
        staker.stake(U256::from(1_000u64)).await.unwrap();
        let payout = staker.account();
        let offer = Offer {
            operator: "op-a".into(),
            payout,
            bundles: vec![bundle("warm", 1_000_000, true)],
            token_hash: Offer::token_hash_of(token.as_bytes()),
            issued_at_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            residency: None,
            search_trials_per_s: None,
        };
        let registered = client
            .register_provider(&SignedOffer::sign(offer, &identity).unwrap())
            .await
            .unwrap();
        assert_eq!(registered.bundles, ["warm"]);
        let (mut done, mut charged) = (0, 0);
        while done < jobs {
            for job in client.pull_jobs(token, 4, 30).await.unwrap() {
                let max_tokens = job.workload.inference().unwrap().max_tokens;
                let output = Output::text(answer.to_owned(), "length", 5, max_tokens);
                let receipt = cx_client::provider::sign_receipt(
                    &job,
                    &output,
                    &identity,
                    payout,
                    job.price_wei / 2,
                    3,
                    cx_protocol::DeterminismClass::D,
                )
                .unwrap();
                let completed = client
                    .submit_result(token, job.job_id, &output, &receipt)
                    .await
                    .unwrap();
                charged += completed.charged_wei;
                done += 1;
            }
        }
        charged
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_openai_client_buys_completions_with_a_session_key() {
        let env = Env::start("openai", &[]).await;
        let tab = env.open_tab_and_bind("5000000").await;
        let id = tab["escrow_id"].as_u64().unwrap().to_string();
        let answer = "Hello from the market.";
        // Three calls from the openai client, one from `cx agent chat`.
        let deployment = DeploymentsFile::load(&env.deployments).unwrap().chains[0].deployment;
        let staker = cx_settlement::evm::EvmClient::connect(
            &env.anvil.rpc_url(),
            env.anvil.keys[2].clone(),
            deployment,
        )
        .unwrap();
        let provider = tokio::spawn(provider(env.url.clone(), env.ca.clone(), 4, answer, staker));

        let key_file = env.dir.path.join("session.key");
        let session = last_json(
            &cx(
                env.agent(&[
                    "session",
                    "--tab",
                    &id,
                    "--cap-wei",
                    "4000000",
                    "--max-price-wei",
                    "1000000",
                    "--deadline-in",
                    "30",
                    "--tier",
                    "T0",
                    "--out",
                    path(&key_file),
                    "--json",
                ]),
                String::new(),
            )
            .await,
        );
        let api_key = session["api_key"].as_str().unwrap().to_owned();
        assert!(api_key.starts_with("cxs_"));
        assert_eq!(
            std::fs::read_to_string(&key_file).unwrap().trim(),
            api_key,
            "--out writes the key"
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
            0o600
        );

        // The official client, given only base_url and api_key (and the dev CA, as any private
        // CA is trusted: SSL_CERT_FILE).
        let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.tools/py/bin/python");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_door.py");
        let base_url = format!("{}/v1", env.url);
        let ca = env.ca.clone();
        let key = api_key.clone();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(python)
                .args([script, &base_url, &key, "llama-8b"])
                .env("SSL_CERT_FILE", &ca)
                .output()
                .expect("the project's virtualenv (scripts/setup.sh)")
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "openai_door.py: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            report["models"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m == "llama-3.1-8b-instruct"),
            "models.list() reads the catalog: {report}"
        );
        assert_eq!(report["chat"]["content"], answer, "{report}");
        assert_eq!(report["chat"]["finish_reason"], "length");
        assert_eq!(report["chat"]["total_tokens"], 13);
        assert_eq!(report["stream"]["content"], answer, "{report}");
        assert_eq!(report["stream"]["total_tokens"], 13);
        assert_eq!(report["completion"]["text"], answer);
        assert_eq!(report["logprobs"]["class"], "BadRequestError", "{report}");
        assert_eq!(
            report["bad_key"]["class"], "AuthenticationError",
            "{report}"
        );
        assert_eq!(
            report["unknown_model"]["class"], "NotFoundError",
            "{report}"
        );

        let out = tokio::task::spawn_blocking({
            let (url, ca, key) = (env.url.clone(), env.ca.clone(), api_key.clone());
            move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_cx"))
                    .args(["agent", "--exchange", &url, "--ca", path(&ca), "chat"])
                    .args(["--model", "llama-8b", "--max-tokens", "4", "Say hello."])
                    .env("CX_API_KEY", &key)
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).starts_with(answer));

        let charged = provider.await.unwrap();
        // The tab holds exactly what the receipts charged; the session counted the same.
        let shown = last_json(&cx(env.agent(&["tab", &id, "--json"]), String::new()).await);
        assert_eq!(shown["held_wei"], charged.to_string());
        let done = last_json(
            &cx(
                env.agent(&["jobs", "--status", "done", "--json"]),
                String::new(),
            )
            .await,
        );
        assert_eq!(done.as_array().unwrap().len(), 4);
    }
}
