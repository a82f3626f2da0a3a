//! Clock skew between the exchange and its providers (issue 16), each party its own process:
//! Anvil with the contracts, `cx serve`, and `cx-provider serve --exchange …` processes whose
//! wall clocks run minutes ahead or behind (libfaketime, which shifts the real clock calls of an
//! unmodified binary).
//!
//! A provider keeps the exchange's time from the `Date` of its answers: it stamps its offers on
//! it (an offer more than 300 s off the exchange's clock is refused) and measures deadlines on it
//! (on its own clock, one running ahead refuses jobs that still have time, and one running behind
//! works on past the deadline). So both register and serve a chat with a 20 s deadline, paid.
//!
//! Build `cx-provider` first when running this alone (`cargo build -p cx-provider`).

mod common;

use alloy::primitives::B256;
use common::{cx_json, group_key, provider_bin, scratch};
use cx_devnet::db::TempDatabase;
use serde_json::json;
use std::time::Duration;

/// Debian's libfaketime (`scripts/setup.sh` installs the `faketime` package).
fn libfaketime() -> std::path::PathBuf {
    let lib = std::path::PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1");
    assert!(
        lib.exists(),
        "{} is missing: run scripts/setup.sh (it installs Debian's faketime)",
        lib.display()
    );
    lib
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_whose_clocks_are_minutes_off_serve_by_the_exchanges_deadlines() {
    let lib = libfaketime();
    let bin = provider_bin();
    let dir = scratch("skew");
    let common::Chain {
        anvil, deployments, ..
    } = common::deploy_chain(&dir.path, 4, group_key(), 1).await;
    let db = TempDatabase::create().await.unwrap();
    let exchange = common::start_exchange(&dir.path, &deployments, &db.url, &[]).await;
    let model_dir = common::gen_model(&bin, &dir.path);
    let client = cx_client::Client::new(&exchange.url, Some(&exchange.ca))
        .unwrap()
        .with_timeout(Duration::from_secs(90));
    let agent =
        common::Agent::import(&dir.path, &exchange, B256::from(anvil.keys[0].to_bytes())).await;
    let escrow_id = agent.open_tab(&client, 5_000_000, &deployments).await;
    cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(escrow_id, "4000000", "1000000", "20").await;

    // Ahead first, then behind and a tenth of the price (so the second chat is cleared onto it).
    // At half the price it lost 2 of 6 runs on two loaded cores: the second's compute estimate
    // came out about twice the first's, leaving the two objectives within 1e-6 of each other.
    let mut providers = Vec::new();
    for (n, skew, ask) in [(1, "+400s", "1000000"), (2, "-400s", "100000")] {
        let name = format!("cpu-{n}");
        let mut command = common::provider_command(
            &bin,
            &dir.path,
            &name,
            &model_dir,
            &exchange,
            &deployments,
            &anvil.keys[n],
            ask,
            &[],
        );
        command
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME", skew)
            // Timers and timeouts stay on the true monotonic clock; only wall time is off.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        providers.push(common::Killed(command.spawn().expect("cx-provider runs")));
        common::registered(&client, &name).await;

        let answered = client
            .chat(
                &api_key,
                &json!({"model": common::MODEL, "messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 4}),
            )
            .await
            .unwrap_or_else(|e| panic!("{name} ({skew}) answers within the deadline: {e}"));
        let job_id: B256 = answered["cx"]["job_id"].as_str().unwrap().parse().unwrap();
        let job = client
            .clone()
            .with_credential(cx_client::Credential::Session(api_key.clone()))
            .job(job_id)
            .await
            .unwrap();
        assert_eq!(job.bundle_id.as_deref(), Some(name.as_str()), "{job:?}");
        assert_eq!(job.status, "done", "{skew}: {job:?}");
        assert!(job.receipt.is_some(), "{skew}: paid on a signed receipt");
    }
}
