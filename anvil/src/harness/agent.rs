//! An agent as `cx agent` drives it, for tests that go through the command line.

use super::market::Exchange;
use super::process::cx_json;
use super::{path, strings};
use std::path::Path;
use std::time::{Duration, Instant};

/// An agent as `cx agent` drives it: its key file (an imported Anvil key) and the exchange.
#[derive(Clone)]
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

    /// The same agent asking the exchange at `exchange` (another node of its cluster).
    pub fn at(&self, exchange: &Exchange) -> Agent {
        let mut prefix = self.prefix.clone();
        if let Some(i) = prefix.iter().position(|a| a == "--exchange") {
            prefix[i + 1] = exchange.url.clone();
        }
        Agent {
            prefix,
            ..self.clone()
        }
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
