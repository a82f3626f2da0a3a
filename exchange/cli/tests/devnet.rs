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
    let mut all = vec![8443, 8545, 8546, 9001, 9002];
    all.extend(9101..=9105);
    all.into_iter().map(|p| p + offset).collect()
}

fn all_free(offset: u16) -> bool {
    ports(offset)
        .into_iter()
        .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
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
    // Ports away from a devnet someone runs on the defaults, and from another run of this test.
    let offset = (0..200)
        .map(|i| 20_000 + ((std::process::id() as u16 % 100) + i) % 200 * 40)
        .find(|o| all_free(*o))
        .expect("some free offset");
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let dir = common::TempDir::new("devnet");
    let signer = tokio::task::block_in_place(cx_devnet::signer_binary).unwrap();
    let provider = common::provider_bin();

    let started = Instant::now();
    let out = tokio::task::spawn_blocking({
        let dir = dir.0.clone();
        let url = db.url.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_cx"))
                .args(["devnet", "--exit-after-settled", "5"])
                .args(["--providers", "2", "--agents", "2", "--timeout-s", "150"])
                .args(["--port-offset", &offset.to_string()])
                .arg("--dir")
                .arg(&dir)
                .env("DATABASE_URL", url)
                .env("CX_SIGNER_BIN", signer)
                .env("CX_PROVIDER_BIN", provider)
                .stdin(Stdio::null())
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
        std::fs::read_to_string(dir.0.join("exchange.log")).unwrap_or_default()
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
        summary["processes"], 11,
        "10 children and itself: {summary}"
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
    assert!(stderr.contains("stopped 10 processes"), "{stderr}");
    // Its logs stay for a post-mortem.
    for log in [
        "exchange.log",
        "chain-31337/anvil.log",
        "signers/signer-1.log",
    ] {
        assert!(Path::new(&dir.0.join(log)).exists(), "{log}");
    }
    // Nothing it started still listens.
    assert!(all_free(offset), "a child outlived the devnet");
    // No secret it generated is in any log: every key file's secret (the whole file for raw
    // keys; the `*secret*`/`*seed*` fields of JSON key files), the session key, searched for
    // in every `.log` under its folder, as stored and without its 0x.
    let secrets = secrets_under(&dir.0);
    assert!(secrets.len() >= 15, "found only {} secrets", secrets.len());
    for log in files_under(&dir.0)
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
    let offset = (0..200)
        .map(|i| 28_020 + ((std::process::id() as u16 % 100) + i) % 200 * 40)
        .find(|o| all_free(*o))
        .expect("some free offset");
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let dir = common::TempDir::new("devnet-browser");
    let signer = tokio::task::block_in_place(cx_devnet::signer_binary).unwrap();
    let mut devnet = common::Killed(
        Command::new(env!("CARGO_BIN_EXE_cx"))
            .args(["devnet", "--providers", "1", "--agents", "1"])
            .args(["--port-offset", &offset.to_string()])
            .arg("--dir")
            .arg(&dir.0)
            .env("DATABASE_URL", &db.url)
            .env("CX_SIGNER_BIN", signer)
            .env("CX_PROVIDER_BIN", common::provider_bin())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cx runs"),
    );
    let exchange = format!("https://127.0.0.1:{}", 8443 + offset);
    let cert = dir.0.join("ca/server.pem");
    let shots = common::screenshots_dir();
    let started = Instant::now();
    let job_path = loop {
        assert!(
            devnet.0.try_wait().unwrap().is_none(),
            "the devnet exited: {}",
            std::fs::read_to_string(dir.0.join("exchange.log")).unwrap_or_default()
        );
        if cert.exists() {
            let list = tokio::task::block_in_place(|| {
                common::try_browse(&format!("{exchange}/explorer/jobs?status=settled"), &cert)
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
            std::fs::read_to_string(dir.0.join("exchange.log")).unwrap_or_default()
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
    assert!(all_free(offset), "a child outlived the devnet");
}
