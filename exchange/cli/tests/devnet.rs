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
    eprintln!(
        "devnet test: {:.0} s, summary {summary}",
        started.elapsed().as_secs_f64()
    );
}
