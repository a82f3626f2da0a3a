//! What the `cx` binary's test files share: a `cx serve` child and the lines it prints.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// A `cx serve` child, killed on drop if the test did not stop it.
pub struct Serve {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Serve {
    pub fn start(args: &[&str], database_url: &str) -> Self {
        // The exchange's identity in a scratch file, not in the package's runtime/ (unless the
        // test names one).
        let identity = std::env::temp_dir().join(format!(
            "cx-serve-identity-{}-{}.key",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut child = Command::new(env!("CARGO_BIN_EXE_cx"))
            .arg("serve")
            .args(args)
            .env("DATABASE_URL", database_url)
            .env("CX_IDENTITY", &identity)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cx runs");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The value of the first printed line `  <key>  <value>`, waiting for it.
    pub fn field(&mut self, key: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(value) = self.seen.iter().find_map(|line| {
                line.trim_start()
                    .strip_prefix(key)
                    .filter(|rest| rest.starts_with(' '))
                    .map(|rest| rest.trim().to_owned())
            }) {
                return value;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!(
                    "cx serve printed no `{key}` line; exit {:?}; stdout so far: {:?}",
                    self.child.try_wait(),
                    self.seen
                ),
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch directory, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "cx-cli-test-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The secp256k1 generator as a group key: the contract only needs a point; no batch is signed.
pub fn group_key() -> cx_settlement::frost::EvmGroupKey {
    cx_settlement::frost::EvmGroupKey {
        x: "0x79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
            .parse::<alloy::primitives::U256>()
            .unwrap(),
        parity: 0,
    }
}

/// Owned arguments.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// A path as an argument.
pub fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

// ---- a market with a real provider (provider.rs, settle.rs) ----------------------------------

pub const MODEL: &str = "tiny-llama";

/// A catalog with one model whose shape is the generated checkpoint's (hidden 64, 2 layers,
/// vocabulary 512: about 0.13 M parameters in f32).
pub use cx_devnet::devnet::CATALOG;

/// A child process killed on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A supervisor (`cx devnet`) stopped on drop as a person stops it, with SIGINT, so that it
/// stops its own children too (SIGKILL would leave them running); SIGKILL after 30 s.
pub struct Interrupted(pub Child);

impl Drop for Interrupted {
    fn drop(&mut self) {
        // Quietly: it may have exited already.
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let waited = std::time::Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) && waited.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn provider_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    let bin = target.join("debug/cx-provider");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p cx-provider` (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

pub fn run(program: &Path, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .env_remove("CX_AGENT_KEYS")
        .env_remove("CX_EXCHANGE")
        .env_remove("CX_CA")
        .env_remove("CX_CHAIN")
        .env_remove("CX_RPC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the program runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// `cx args…` on a blocking thread; its last stdout line as JSON.
pub async fn cx_json(args: Vec<String>, stdin: String) -> Value {
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(Path::new(env!("CARGO_BIN_EXE_cx")), &args, &stdin)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "cx failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().expect("some output")).expect("last line is JSON")
}

/// Writes `key` (an Anvil account's) to a 0600 file, as `cx-provider --evm-key` reads it.
pub fn write_evm_key(path: &Path, key: &alloy::signers::local::PrivateKeySigner) {
    use std::os::unix::fs::PermissionsExt;
    let hex = alloy::primitives::B256::from(key.to_bytes()).to_string();
    std::fs::write(path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `cx-provider stake`: registers `identity`'s key for the account in `evm_key` and stakes
/// 1,000 wei on every chain of `deployments`.
pub fn stake_provider(bin: &Path, evm_key: &Path, deployments: &Path, identity: &Path) {
    let out = run(
        bin,
        &[
            "stake",
            "--evm-key",
            path(evm_key),
            "--deployments",
            path(deployments),
            "--amount",
            "1000",
            "--identity",
            path(identity),
        ],
        "",
    );
    assert!(
        out.status.success(),
        "cx-provider stake: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- a real browser (settle.rs) ---------------------------------------------------------------

/// Where browser screenshots go: `out/browser/` at the workspace root (look at them).
pub fn screenshots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../out/browser");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The base64 SHA-256 of `cert`'s public key (what Chromium pins with
/// `--ignore-certificate-errors-spki-list`), or `None` when openssl cannot read it.
fn spki_sha256(cert: &Path) -> Option<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der \
             | openssl dgst -sha256 -binary | base64",
            cert.display()
        ))
        .output()
        .ok()?;
    let spki = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !spki.is_empty()).then_some(spki)
}

/// Headless Chromium (Debian's `chromium`, `scripts/setup.sh` installs it) on `url`, trusting
/// exactly the server certificate `cert` (its key pinned by SPKI hash), with `extra` flags.
fn chromium(url: &str, cert: &Path, extra: &[String]) -> std::io::Result<Output> {
    let spki = spki_sha256(cert).unwrap_or_default();
    let profile = TempDir::new("chromium");
    Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1280,2400",
        ])
        .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
        .arg(format!("--user-data-dir={}", profile.0.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
}

/// `url`'s DOM after it loaded in headless Chromium, and a screenshot of the page at `shot`.
pub fn browse(url: &str, cert: &Path, shot: &Path) -> String {
    let run = |extra: &[String]| {
        let out = chromium(url, cert, extra).expect("chromium runs (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "chromium {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    run(&[format!("--screenshot={}", shot.display())]);
    assert!(shot.exists(), "no screenshot of {url}");
    String::from_utf8(run(&["--dump-dom".to_owned()]).stdout).unwrap()
}

/// `url`'s DOM in headless Chromium (as [`browse`], no screenshot), or `None` when the page
/// does not load (the server is not up yet).
pub fn try_browse(url: &str, cert: &Path) -> Option<String> {
    let out = chromium(url, cert, &["--dump-dom".to_owned()]).ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks a settled job's explorer page: the settled status, every cost term of the clearing
/// decision and the transaction hash on its tab's chain.
pub fn check_settled_job_page(dom: &str) {
    let status = element_text(dom, "status").expect("a status");
    assert!(status.contains("settled"), "{status}");
    let terms = element_text(dom, "cost-terms").expect("the cost terms");
    for term in [
        "compute",
        "latency",
        "failure",
        "verification",
        "deadline",
        "base",
        "adapter",
        "total",
    ] {
        assert!(terms.contains(term), "{term} missing: {terms}");
    }
    let tab = element_text(dom, "tab").expect("the tab");
    let chain = if tab.contains("31338") {
        "31338"
    } else {
        "31337"
    };
    let tx = element_text(dom, &format!("tx-{chain}")).expect("the transaction");
    assert!(tx.contains("0x") && tx.len() >= 66, "{tx}");
}

/// The text inside the element with `id` in `dom` (tags stripped), if there is one.
pub fn element_text(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let open = dom[..at].rfind('<')?;
    let tag: String = dom[open + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let start = at + dom[at..].find('>')? + 1;
    let end = start + dom[start..].find(&format!("</{tag}>"))?;
    let mut text = String::new();
    let mut in_tag = false;
    for c in dom[start..end].chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The `href` of the element with `id` in `dom`.
pub fn element_href(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let open = dom[..at].rfind('<')?;
    let close = at + dom[at..].find('>')?;
    let tag = &dom[open..close];
    let href = tag.find("href=\"")? + 6;
    Some(tag[href..href + tag[href..].find('"')?].replace("&amp;", "&"))
}

// ---- a market on one chain (provider.rs, settle.rs) -------------------------------------------

/// Anvil (chain 31337, `accounts` funded keys) with the contracts deployed under `group_key`
/// (native asset, minimum stake 1 wei), and `dir/deployments.json` naming it.
pub struct Chain {
    pub anvil: cx_devnet::AnvilInstance,
    pub deployment: cx_contracts::Deployment,
    pub deployments: PathBuf,
}

pub async fn deploy_chain(
    dir: &Path,
    accounts: u32,
    group_key: cx_settlement::frost::EvmGroupKey,
    grace_period_s: u64,
) -> Chain {
    let anvil = cx_devnet::AnvilInstance::spawn(31337, None, accounts)
        .expect("anvil (scripts/setup-foundry.sh)");
    let params = cx_devnet::deploy::DeployParams {
        group_key,
        grace_period_s,
        min_stake: alloy::primitives::U256::from(1u64),
        unbonding_delay_s: 60,
        native: true,
        with_probe: false,
    };
    let deployment = cx_devnet::deploy::deploy(&anvil.rpc_url(), anvil.keys[0].clone(), params)
        .await
        .unwrap();
    let deployments = dir.join("deployments.json");
    cx_contracts::DeploymentsFile {
        chains: vec![cx_contracts::ChainDeployment {
            chain: anvil.entry(),
            deployment,
        }],
    }
    .write(&deployments)
    .unwrap();
    Chain {
        anvil,
        deployment,
        deployments,
    }
}

/// A running `cx serve` and what it printed: its URL, its CA and the key hash it signs with.
pub struct Exchange {
    pub url: String,
    pub ca: PathBuf,
    pub key_hash: String,
    pub serve: Serve,
}

/// `cx serve` on a free port with the tiny catalog, its CA under `dir/ca`, the chains of
/// `deployments`, a 60 s settle margin, and `extra` flags.
pub async fn start_exchange(
    dir: &Path,
    deployments: &Path,
    database_url: &str,
    extra: &[&str],
) -> Exchange {
    let listen = format!("127.0.0.1:{}", cx_devnet::free_port().unwrap());
    start_exchange_on(&listen, dir, deployments, database_url, extra).await
}

/// [`start_exchange`] listening on `listen`: a restart on the same address (and `dir`, so the
/// same CA) is the exchange its providers and agents already know.
pub async fn start_exchange_on(
    listen: &str,
    dir: &Path,
    deployments: &Path,
    database_url: &str,
    extra: &[&str],
) -> Exchange {
    // A test that wrote its own catalog there keeps it (and a restart keeps the first one).
    let catalog = dir.join("catalog.toml");
    if !catalog.exists() {
        std::fs::write(&catalog, CATALOG).unwrap();
    }
    let mut args = strings(&[
        "--listen",
        listen,
        "--ca-dir",
        path(&dir.join("ca")),
        "--deployments",
        path(deployments),
        "--catalog",
        path(&catalog),
        "--settle-margin-s",
        "60",
    ]);
    args.extend(strings(extra));
    let database_url = database_url.to_owned();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut serve = Serve::start(&args, &database_url);
        let url = serve.field("url");
        let ca = PathBuf::from(serve.field("ca"));
        // `identity   <key hash> (<file>; signs assignments)`: the key providers pin.
        let identity = serve.field("identity");
        let key_hash = identity.split_whitespace().next().unwrap().to_owned();
        Exchange {
            url,
            ca,
            key_hash,
            serve,
        }
    })
    .await
    .unwrap()
}

/// `cx-provider gen-model` of the tiny catalog's shape (hidden 64, 2 layers) into `dir/model`.
pub fn gen_model(bin: &Path, dir: &Path) -> PathBuf {
    let model = dir.join("model");
    let out = run(
        bin,
        &[
            "gen-model",
            "--out",
            path(&model),
            "--hidden",
            "64",
            "--layers",
            "2",
            "--seed",
            "5",
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    model
}

/// An agent as `cx agent` drives it: its key file (an imported Anvil key) and the exchange.
pub struct Agent {
    prefix: Vec<String>,
    secret: alloy::primitives::B256,
}

impl Agent {
    /// Writes `dir/agent.json` importing `secret` and returns the agent of `exchange`.
    pub async fn import(dir: &Path, exchange: &Exchange, secret: alloy::primitives::B256) -> Agent {
        let keys = dir.join("agent.json");
        cx_json(
            strings(&[
                "agent",
                "keygen",
                "--out",
                path(&keys),
                "--import-secp256k1",
                "--json",
            ]),
            format!("{secret}\n"),
        )
        .await;
        Agent {
            prefix: strings(&[
                "agent",
                "--exchange",
                &exchange.url,
                "--ca",
                path(&exchange.ca),
                "--keys",
                path(&keys),
            ]),
            secret,
        }
    }

    /// `client` reading jobs as this agent's account (job reads are the buyer's).
    pub fn reader(&self, client: &cx_client::Client) -> cx_client::Client {
        let key = cx_protocol::order::SigningKey::from_slice(self.secret.as_slice())
            .expect("an imported secp256k1 secret");
        client
            .clone()
            .with_credential(cx_client::Credential::Account(key))
    }

    /// The `cx` arguments of `cx agent … rest`.
    pub fn args(&self, rest: &[&str]) -> Vec<String> {
        let mut args = self.prefix.clone();
        args.extend(strings(rest));
        args
    }

    /// `cx agent open-tab` for `amount` wei, due in an hour; waits until the exchange mirrors it.
    pub async fn open_tab(
        &self,
        client: &cx_client::Client,
        amount: u128,
        deployments: &Path,
    ) -> u64 {
        let amount = amount.to_string();
        let tab = cx_json(
            self.args(&[
                "open-tab",
                "--amount",
                &amount,
                "--deadline-in",
                "3600",
                "--json",
                "--deployments",
                path(deployments),
            ]),
            String::new(),
        )
        .await;
        let escrow_id = tab["escrow_id"].as_u64().unwrap();
        let waited = Instant::now();
        while client.tab(31337, escrow_id).await.is_err() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the watcher never mirrored the tab"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        escrow_id
    }

    /// `cx agent session` on tab `tab`, its calls at T0 (stake only); returns the API key.
    pub async fn session(
        &self,
        tab: u64,
        cap_wei: &str,
        max_price_wei: &str,
        deadline_in: &str,
    ) -> String {
        let session = cx_json(
            self.args(&[
                "session",
                "--tab",
                &tab.to_string(),
                "--cap-wei",
                cap_wei,
                "--max-price-wei",
                max_price_wei,
                "--deadline-in",
                deadline_in,
                // One provider: T1 of class D (the default) needs a second to re-execute on.
                "--tier",
                "T0",
                "--json",
            ]),
            String::new(),
        )
        .await;
        session["api_key"].as_str().unwrap().to_owned()
    }
}

/// `cx-provider serve --exchange …` staked under a fresh identity paid to `evm_key`'s account.
#[allow(clippy::too_many_arguments)]
pub fn start_provider(
    bin: &Path,
    dir: &Path,
    name: &str,
    model_dir: &Path,
    exchange: &Exchange,
    deployments: &Path,
    key: &alloy::signers::local::PrivateKeySigner,
    ask_wei_per_s: &str,
    extra: &[&str],
) -> Killed {
    Killed(
        provider_command(
            bin,
            dir,
            name,
            model_dir,
            exchange,
            deployments,
            key,
            ask_wei_per_s,
            extra,
        )
        .spawn()
        .expect("cx-provider runs"),
    )
}

/// [`start_provider`]'s command, staked and ready to spawn (for a test that sets its
/// environment).
#[allow(clippy::too_many_arguments)]
pub fn provider_command(
    bin: &Path,
    dir: &Path,
    name: &str,
    model_dir: &Path,
    exchange: &Exchange,
    deployments: &Path,
    key: &alloy::signers::local::PrivateKeySigner,
    ask_wei_per_s: &str,
    extra: &[&str],
) -> Command {
    serving_command(
        bin,
        dir,
        name,
        (model_dir, MODEL),
        exchange,
        deployments,
        key,
        ask_wei_per_s,
        extra,
    )
}

/// [`provider_command`] for the catalog model `model.1` served from the directory `model.0`.
#[allow(clippy::too_many_arguments)]
pub fn serving_command(
    bin: &Path,
    dir: &Path,
    name: &str,
    model: (&Path, &str),
    exchange: &Exchange,
    deployments: &Path,
    key: &alloy::signers::local::PrivateKeySigner,
    ask_wei_per_s: &str,
    extra: &[&str],
) -> Command {
    let (model_dir, model_name) = model;
    let identity = dir.join(format!("{name}.key"));
    let out = run(bin, &["keygen", "--out", path(&identity)], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let evm_key = dir.join(format!("{name}-evm.key"));
    write_evm_key(&evm_key, key);
    stake_provider(bin, &evm_key, deployments, &identity);
    let mut command = Command::new(bin);
    command
        .args(["serve", "--model", path(model_dir)])
        .args(["--port", &cx_devnet::free_port().unwrap().to_string()])
        .args(["--served-model-name", model_name, "--threads", "1"])
        .args([
            "--exchange",
            &exchange.url,
            "--exchange-ca",
            path(&exchange.ca),
        ])
        .args(["--exchange-key-hash", &format!("0x{}", exchange.key_hash)])
        .args(["--identity", path(&identity)])
        .args(["--payout", &key.address().to_string(), "--operator", name])
        .args(["--ask-wei-per-s", ask_wei_per_s, "--bundle-id", name])
        .args(["--model-name", model_name])
        .args([
            "--fetched-adapters",
            path(&dir.join(format!("{name}-fetched"))),
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    command
}

/// Waits until the exchange lists bundle `id`.
pub async fn registered(client: &cx_client::Client, id: &str) {
    let waited = Instant::now();
    loop {
        if let Ok(bundles) = client.providers().await
            && bundles.iter().any(|b| b.id == id)
        {
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(90),
            "bundle {id} never registered"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A settling exchange, each part its own process: a committee of three `cx-signer`s (any two
/// sign), Anvil with the contracts under the group key and `cx serve --settlement`. Fields drop
/// in order: the exchange before its database and chain.
pub struct Settling {
    pub market: Exchange,
    /// The exchange's ML-DSA identity (the committee pins it).
    pub exchange: std::sync::Arc<cx_protocol::pq::Identity>,
    /// The committee's fee.
    pub fee: cx_settlement::ledger::Fee,
    pub client: cx_client::Client,
    /// The exchange's books, read by tests directly.
    pub books: cx_exchange_server::books::Books,
    _db: cx_devnet::db::TempDatabase,
    /// The committee: its members and coordinator.
    pub cluster: cx_devnet::Cluster,
    pub anvil: cx_devnet::AnvilInstance,
    pub deployment: cx_contracts::Deployment,
    pub deployments: PathBuf,
    pub dir: TempDir,
}

/// [`Settling`] in a fresh `tag` folder: the committee takes a fee of `fee_bps`, Anvil funds
/// `keys` accounts (0 deploys; the caller uses the rest) and key `poster` posts batches.
pub async fn settling(tag: &str, fee_bps: u16, keys: u32, poster: usize) -> Settling {
    let dir = TempDir::new(tag);
    let exchange = std::sync::Arc::new(cx_protocol::pq::Identity::generate());
    let fee = cx_settlement::ledger::Fee {
        bps: fee_bps,
        account: alloy::primitives::Address::repeat_byte(0xfe),
    };
    let rule = cx_settlement::config::CommitteeRule {
        threshold: 2,
        min_operators: 1,
    };
    let cluster = tokio::task::block_in_place(|| {
        cx_devnet::Cluster::start_with(
            &cx_devnet::signer_binary().unwrap(),
            &["a", "b", "c"],
            rule,
            exchange.clone(),
            fee,
        )
    })
    .unwrap();
    let package = cluster.committee(2, 1).unwrap().dkg(0).await.unwrap();
    // The chain, its contracts under the committee's key. The grace period leaves the
    // coordinator's reclaim margin (900 s) after a tab closes.
    let Chain {
        anvil,
        deployment,
        deployments,
    } = deploy_chain(
        &dir.0,
        keys,
        cx_settlement::frost::EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap(),
        1_200,
    )
    .await;
    std::fs::copy(&deployments, &cluster.deployments_file).unwrap();
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let books = cx_exchange_server::books::Books::open(&db.url)
        .await
        .unwrap();
    // The exchange's books hold the group key the coordinator signs under.
    use cx_settlement::coordinator::Store as _;
    cx_settlement::coordinator::PgStore::new(books.pool().clone())
        .save_group_key(0, &package)
        .await
        .unwrap();
    let exchange_key = dir.0.join("exchange.key");
    let coordinator_key = dir.0.join("coordinator.key");
    cx_settlement::keyfile::write_identity(&exchange_key, &exchange).unwrap();
    cx_settlement::keyfile::write_identity(&coordinator_key, &cluster.coordinator).unwrap();
    let poster_key = dir.0.join("poster.key");
    cx_settlement::keyfile::write_secret(
        &poster_key,
        alloy::primitives::B256::from(anvil.keys[poster].to_bytes())
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let settlement = dir.0.join("settlement.json");
    std::fs::write(
        &settlement,
        serde_json::to_string_pretty(&serde_json::json!({
            "coordinator_identity": coordinator_key,
            "committee": cluster.members,
            "threshold": 2,
            "min_operators": 1,
            "fee": fee,
            "poster_key_file": poster_key,
            "batching": {"max_age_s": 1, "min_jobs": 1},
        }))
        .unwrap(),
    )
    .unwrap();
    let market = start_exchange(
        &dir.0,
        &deployments,
        &db.url,
        &[
            "--identity",
            path(&exchange_key),
            "--settlement",
            path(&settlement),
        ],
    )
    .await;
    let client = cx_client::Client::new(&market.url, Some(&market.ca))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    Settling {
        market,
        exchange,
        fee,
        client,
        books,
        _db: db,
        cluster,
        anvil,
        deployment,
        deployments,
        dir,
    }
}

impl Settling {
    /// The exchange's database.
    pub fn database_url(&self) -> &str {
        &self._db.url
    }

    /// SIGKILLs `cx serve` (nothing of its own runs on the way down) and starts it again on the
    /// same address, books, identity and settlement configuration: a crash and a restart.
    pub async fn restart_exchange(&mut self) {
        self.market.serve.kill();
        let listen = self.market.url.trim_start_matches("https://").to_owned();
        let (exchange_key, settlement) = (
            self.dir.0.join("exchange.key"),
            self.dir.0.join("settlement.json"),
        );
        self.market = start_exchange_on(
            &listen,
            &self.dir.0,
            &self.deployments,
            &self._db.url,
            &[
                "--identity",
                path(&exchange_key),
                "--settlement",
                path(&settlement),
            ],
        )
        .await;
    }
}

// ---- process faults (faults.rs) ---------------------------------------------------------------

impl Serve {
    /// SIGKILL, and waits for the process to be gone: a crash, not a shutdown.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// A private PostgreSQL cluster: `initdb` into a scratch directory, `pg_ctl start` on a free
/// port, stopped (`-m immediate`) and removed on drop. Its server can be restarted under a
/// running exchange, which a shared server cannot. Run as `postgres` when the tests run as root
/// (PostgreSQL refuses root).
pub struct PgCluster {
    pub dir: TempDir,
    pub port: u16,
}

impl PgCluster {
    pub fn start(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let port = cx_devnet::free_port().unwrap();
        let cluster = Self { dir, port };
        if cluster.as_root() {
            let chown = Command::new("chown")
                .args(["-R", "postgres:postgres", path(&cluster.dir.0)])
                .status()
                .unwrap();
            assert!(chown.success());
        }
        cluster.tool(
            "initdb",
            &[
                "-D",
                path(&cluster.data()),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        cluster.pg_ctl(&["start", "-w", "-t", "30"]);
        cluster
    }

    fn as_root(&self) -> bool {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
    }

    fn data(&self) -> PathBuf {
        self.dir.0.join("data")
    }

    fn tool(&self, program: &str, args: &[&str]) {
        let program = &pg_binary(program);
        let mut command = if self.as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", program]);
            c
        } else {
            Command::new(program)
        };
        let out = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{program} runs (PostgreSQL's binaries on PATH): {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl <args> -D <data>` with the cluster's port, its socket in its own directory.
    pub fn pg_ctl(&self, args: &[&str]) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            path(&self.dir.0)
        );
        let log = self.dir.0.join("postgres.log");
        let data = self.data();
        let mut all = vec!["-D", path(&data), "-o", &options, "-l", path(&log)];
        all.extend_from_slice(args);
        self.tool("pg_ctl", &all);
    }

    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}

/// PostgreSQL's `program`: on PATH, else in the newest Debian `/usr/lib/postgresql/<v>/bin`
/// (where `scripts/setup.sh`'s `postgresql` package puts it, off PATH).
fn pg_binary(program: &str) -> String {
    let on_path = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|out| out.status.success());
    if on_path {
        return program.to_owned();
    }
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    versions.last().map_or_else(
        || program.to_owned(),
        |v| format!("/usr/lib/postgresql/{v}/bin/{program}"),
    )
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data();
        let pg_ctl = pg_binary("pg_ctl");
        let mut command = if self.as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &pg_ctl]);
            c
        } else {
            Command::new(&pg_ctl)
        };
        let _ = command
            .args(["stop", "-m", "immediate", "-D", path(&data)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// One HTTP/1.1 request over TLS to `url` (trusting `ca`), for what the client library does
/// not show (headers such as `Retry-After`): the status, the headers (names in lower case) and
/// the body; `None` when no answer came within `timeout`.
pub async fn https_request(
    url: &str,
    ca: &Path,
    method: &str,
    path_and_query: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Option<(u16, Vec<(String, String)>, String)> {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("https://").to_owned();
    let ca = rustls::pki_types::CertificateDer::from_pem_file(ca).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let exchange = async move {
        let tcp = tokio::net::TcpStream::connect(&address).await.ok()?;
        let config = cx_exchange_server::tls::client_config([&ca]).unwrap();
        let mut stream = tokio_rustls::TlsConnector::from(config)
            .connect(
                rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                tcp,
            )
            .await
            .ok()?;
        let request = format!(
            "{method} {path_and_query} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        // The server may end without close_notify; what arrived is the answer.
        let _ = stream.read_to_end(&mut response).await;
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let mut lines = head.lines();
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Some((status, headers, body.to_owned()))
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// A market on one chain whose exchange can be killed and restarted: Anvil with the contracts
/// (no committee: nothing settles on chain), `cx serve` on a fixed address with a fixed
/// identity (so its providers, who pin its key, find it again after a restart), a real
/// `cx-provider` (bundle `p0`) and `agents` agents, each bound and with a tab of `tab_wei`.
pub struct Restartable {
    pub exchange: Exchange,
    pub client: cx_client::Client,
    pub books: cx_exchange_server::books::Books,
    pub agents: Arc<Vec<SigningAgent>>,
    pub provider: Killed,
    pub database_url: String,
    pub listen: String,
    pub domain: cx_protocol::order::Eip712Domain,
    pub chain: Chain,
    pub dir: TempDir,
    /// `cx serve` arguments beyond the defaults, kept for restarts.
    serve_args: Vec<String>,
}

/// An agent whose orders the test signs itself (to send many at once, and again).
pub struct SigningAgent {
    pub keys: cx_client::AgentKeys,
    pub tab: u64,
}

impl Restartable {
    pub async fn start(tag: &str, database_url: &str, agents: usize, tab_wei: u128) -> Self {
        Self::start_with(tag, database_url, agents, tab_wei, &[]).await
    }

    /// [`Restartable::start`] with `serve_args` added to `cx serve`'s.
    pub async fn start_with(
        tag: &str,
        database_url: &str,
        agents: usize,
        tab_wei: u128,
        serve_args: &[&str],
    ) -> Self {
        let bin = provider_bin();
        let dir = TempDir::new(tag);
        let serve_args = strings(serve_args);
        // Keys: 0 deploys, 1 the provider, 2.. the agents, the last one a second provider.
        let chain = deploy_chain(&dir.0, 3 + agents as u32, group_key(), 1_200).await;
        let listen = format!("127.0.0.1:{}", cx_devnet::free_port().unwrap());
        let exchange = Self::serve(
            &listen,
            &dir.0,
            &chain.deployments,
            database_url,
            &serve_args,
        )
        .await;
        let client = cx_client::Client::new(&exchange.url, Some(&exchange.ca))
            .unwrap()
            .with_timeout(Duration::from_secs(30));
        let model = gen_model(&bin, &dir.0);
        let provider = start_provider(
            &bin,
            &dir.0,
            "p0",
            &model,
            &exchange,
            &chain.deployments,
            &chain.anvil.keys[1],
            "1000",
            &[],
        );
        let mut signing = Vec::new();
        for n in 0..agents {
            let home = dir.0.join(format!("agent-{n}"));
            std::fs::create_dir_all(&home).unwrap();
            let secret = alloy::primitives::B256::from(chain.anvil.keys[2 + n].to_bytes());
            let agent = Agent::import(&home, &exchange, secret).await;
            cx_json(agent.args(&["bind", "--json"]), String::new()).await;
            let tab = agent.open_tab(&client, tab_wei, &chain.deployments).await;
            let keys = cx_client::AgentKeys::load(&home.join("agent.json")).unwrap();
            signing.push(SigningAgent { keys, tab });
        }
        registered(&client, "p0").await;
        let books = cx_exchange_server::books::Books::open(database_url)
            .await
            .unwrap();
        let domain = cx_protocol::order::domain(31337, chain.deployment.settlement);
        Self {
            exchange,
            client,
            books,
            agents: Arc::new(signing),
            provider,
            database_url: database_url.to_owned(),
            listen,
            domain,
            chain,
            dir,
            serve_args,
        }
    }

    async fn serve(
        listen: &str,
        dir: &Path,
        deployments: &Path,
        database_url: &str,
        extra: &[String],
    ) -> Exchange {
        let identity = dir.join("exchange.key");
        // No rate limits: the tests send bursts on purpose.
        let mut args = vec![
            "--identity",
            path(&identity),
            "--rate-per-account",
            "0",
            "--rate-per-ip",
            "0",
        ];
        args.extend(extra.iter().map(String::as_str));
        start_exchange_on(listen, dir, deployments, database_url, &args).await
    }

    /// A second provider, `name`, on the same model with its own key (the chain's last) and
    /// `ask_wei_per_s`; it is registered when this returns.
    pub async fn second_provider(&self, name: &str, ask_wei_per_s: &str) -> Killed {
        let bin = provider_bin();
        let key = self.chain.anvil.keys.last().expect("funded keys");
        let provider = start_provider(
            &bin,
            &self.dir.0,
            name,
            &self.dir.0.join("model"),
            &self.exchange,
            &self.chain.deployments,
            key,
            ask_wei_per_s,
            &[],
        );
        registered(&self.client, name).await;
        provider
    }

    /// SIGKILLs `cx serve`.
    pub fn kill_exchange(&mut self) {
        self.exchange.serve.kill();
    }

    /// Starts `cx serve` again on the same address, books, CA and identity.
    pub async fn restart_exchange(&mut self) {
        self.exchange.serve.kill();
        self.exchange = Self::serve(
            &self.listen,
            &self.dir.0,
            &self.chain.deployments,
            &self.database_url,
            &self.serve_args,
        )
        .await;
    }

    /// Agent `agent`'s intent with `nonce` (see [`Signer::intent`]).
    pub fn intent(
        &self,
        agent: usize,
        nonce: u64,
        max_price_wei: u128,
        deadline_in_s: u64,
    ) -> Value {
        self.signer()
            .intent(agent, nonce, max_price_wei, deadline_in_s)
    }

    /// What signs the agents' intents, for tasks of their own.
    pub fn signer(&self) -> Signer {
        Signer {
            agents: self.agents.clone(),
            domain: self.domain.clone(),
            url: self.exchange.url.clone(),
            ca: self.exchange.ca.clone(),
        }
    }

    /// `POST /v1/intents` with `body` (see [`Signer::post_intent`]).
    pub async fn post_intent(&self, body: &Value) -> Option<Answer> {
        self.signer().post_intent(body).await
    }
}

/// An answer: its status, its headers (names in lower case) and its JSON body (a string when
/// the body is not JSON).
pub type Answer = (u16, Vec<(String, String)>, Value);

/// The agents of a [`Restartable`] market and where its exchange listens (the same address
/// across restarts).
#[derive(Clone)]
pub struct Signer {
    agents: Arc<Vec<SigningAgent>>,
    domain: cx_protocol::order::Eip712Domain,
    url: String,
    ca: PathBuf,
}

impl Signer {
    /// Agent `agent`'s intent with `nonce` on its tab for a short completion, due in
    /// `deadline_in_s`, within `max_price_wei`; the body `POST /v1/intents` takes.
    pub fn intent(
        &self,
        agent: usize,
        nonce: u64,
        max_price_wei: u128,
        deadline_in_s: u64,
    ) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let request = cx_protocol::order::InferenceRequest {
            prompt: format!("Say hello to agent {agent}, order {nonce}."),
            max_tokens: 4,
            ..Default::default()
        };
        let intent = cx_protocol::order::Intent {
            want: MODEL.into(),
            adapter_id: None,
            request_hash: cx_protocol::order::request_hash(&request),
            deadline_s: now + deadline_in_s,
            max_price_wei,
            min_tier: cx_protocol::Tier::T0,
            determinism: cx_protocol::DeterminismClass::D,
            tab_id: self.agents[agent].tab,
            nonce,
            expiry_s: now + 120,
        };
        let signed = self.agents[agent].keys.sign(intent, &self.domain).unwrap();
        serde_json::json!({ "intent": signed, "request": request })
    }

    /// `POST /v1/intents` with `body`: the status, the headers and the answer; `None` when no
    /// answer came (the exchange is down, or died before it answered).
    pub async fn post_intent(&self, body: &Value) -> Option<Answer> {
        let (status, headers, text) = https_request(
            &self.url,
            &self.ca,
            "POST",
            "/v1/intents",
            Some(body),
            Duration::from_secs(30),
        )
        .await?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Some((status, headers, value))
    }
}

/// Every tab of the books whose hold is not the sum of what its live jobs hold (jobs expired,
/// refunded, failed or cancelled gave theirs back); empty when the books are consistent.
pub async fn tabs_off_their_jobs(books: &cx_exchange_server::books::Books) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT format('tab %s: holds %s, its live jobs %s', t.escrow_id, t.held_wei, \
                coalesce(sum(j.held_wei) FILTER (WHERE j.status NOT IN \
                    ('expired', 'refunded', 'failed', 'cancelled')), 0)) \
         FROM exchange_tabs t LEFT JOIN exchange_jobs j \
           ON j.chain_id = t.chain_id AND j.escrow_id = t.escrow_id \
         GROUP BY t.chain_id, t.escrow_id, t.held_wei \
         HAVING t.held_wei <> coalesce(sum(j.held_wei) FILTER (WHERE j.status NOT IN \
                    ('expired', 'refunded', 'failed', 'cancelled')), 0)",
    )
    .fetch_all(books.pool())
    .await
    .unwrap()
}

/// How many times a restarted exchange handed a job out again (its `running` events that say
/// so).
pub async fn handed_out_again(books: &cx_exchange_server::books::Books) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM exchange_job_events \
         WHERE status = 'running' AND (detail->>'handed_out_again')::boolean",
    )
    .fetch_one(books.pool())
    .await
    .unwrap()
}

/// Job `id`'s status in the books, `None` if there is no such job.
pub async fn job_status(
    books: &cx_exchange_server::books::Books,
    id: alloy::primitives::B256,
) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM exchange_jobs WHERE id = $1")
        .bind(id.as_slice())
        .fetch_optional(books.pool())
        .await
        .unwrap()
}

/// Waits until no job in the books is unfinished (every one done, settled, expired, refunded
/// or failed), at most `within`; returns the statuses counted.
pub async fn all_jobs_end(
    books: &cx_exchange_server::books::Books,
    within: Duration,
) -> Vec<(String, i64)> {
    let waited = Instant::now();
    loop {
        let counts: Vec<(String, i64)> =
            sqlx::query_as("SELECT status, count(*) FROM exchange_jobs GROUP BY status ORDER BY 1")
                .fetch_all(books.pool())
                .await
                .unwrap();
        if counts.iter().all(|(s, _)| {
            s.parse::<cx_exchange_server::books::JobStatus>()
                .is_ok_and(|s| s.is_terminal())
        }) {
            return counts;
        }
        assert!(
            waited.elapsed() < within,
            "jobs still unfinished after {within:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
