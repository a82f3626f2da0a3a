//! A settling exchange: a committee of `cx-signer`s after a DKG, Anvil with the contracts under
//! its group key, a throwaway database holding that key and `cx serve --settlement`.

use super::market::{
    Chain, Exchange, deploy_chain, spawn_exchange_on, start_exchange, start_exchange_on,
};
use super::{path, scratch};
use crate::ScratchDir;
use std::path::PathBuf;
use std::time::Duration;

/// A settling exchange, each part its own process: a committee of three `cx-signer`s (any two
/// sign), Anvil with the contracts under the group key and `cx serve --settlement`. Fields drop
/// in order: the exchange before its database and chain.
pub struct Settling {
    /// The running `cx serve --settlement`.
    pub market: Exchange,
    /// The exchange's ML-DSA identity (the committee pins it).
    pub exchange: std::sync::Arc<cx_protocol::pq::Identity>,
    /// The committee's fee.
    pub fee: cx_settlement::ledger::Fee,
    /// A client of it (60 s timeout).
    pub client: cx_client::Client,
    /// The exchange's books, read by tests directly.
    pub books: cx_exchange_server::books::Books,
    _db: crate::db::TempDatabase,
    /// The committee: its members and coordinator.
    pub cluster: crate::Cluster,
    /// The chain.
    pub anvil: crate::AnvilInstance,
    /// Its contracts.
    pub deployment: cx_contracts::Deployment,
    /// The deployments file naming it.
    pub deployments: PathBuf,
    /// The market's folder.
    pub dir: ScratchDir,
}

/// [`Settling`] in a fresh `tag` folder: the committee takes a fee of `fee_bps`, Anvil funds
/// `keys` accounts (0 deploys; the caller uses the rest) and key `poster` posts batches.
pub async fn settling(tag: &str, fee_bps: u16, keys: u32, poster: usize) -> Settling {
    settling_with(tag, fee_bps, keys, poster, &[]).await
}

/// [`settling`] with `extra` flags for the first `cx serve` (the writer).
pub async fn settling_with(
    tag: &str,
    fee_bps: u16,
    keys: u32,
    poster: usize,
    extra: &[&str],
) -> Settling {
    let dir = scratch(tag);
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
        crate::Cluster::start_with(
            &crate::signer_binary().unwrap(),
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
        &dir.path,
        keys,
        cx_settlement::frost::EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap(),
        1_200,
    )
    .await;
    std::fs::copy(&deployments, &cluster.deployments_file).unwrap();
    let db = crate::db::TempDatabase::create().await.unwrap();
    let books = cx_exchange_server::books::Books::open(&db.url)
        .await
        .unwrap();
    // The exchange's books hold the group key the coordinator signs under.
    use cx_settlement::coordinator::Store as _;
    cx_settlement::coordinator::PgStore::new(books.pool().clone())
        .save_group_key(0, &package)
        .await
        .unwrap();
    let exchange_key = dir.path.join("exchange.key");
    let coordinator_key = dir.path.join("coordinator.key");
    cx_settlement::keyfile::write_identity(&exchange_key, &exchange).unwrap();
    cx_settlement::keyfile::write_identity(&coordinator_key, &cluster.coordinator).unwrap();
    let poster_key = dir.path.join("poster.key");
    cx_settlement::keyfile::write_secret(
        &poster_key,
        alloy::primitives::B256::from(anvil.keys[poster].to_bytes())
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let settlement = dir.path.join("settlement.json");
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
    let mut flags = vec![
        "--identity",
        path(&exchange_key),
        "--settlement",
        path(&settlement),
    ];
    flags.extend_from_slice(extra);
    let market = start_exchange(&dir.path, &deployments, &db.url, &flags).await;
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

    /// A second node of the exchange on its own port (`cx serve --standby`, the same books,
    /// identity and settlement configuration): it forwards to the writer until it takes over.
    /// Returned as an [`Exchange`] a provider or a client can be pointed at.
    pub fn start_standby(&self) -> Exchange {
        let listen = format!("127.0.0.1:{}", crate::free_port().unwrap());
        let (exchange_key, settlement) = (
            self.dir.path.join("exchange.key"),
            self.dir.path.join("settlement.json"),
        );
        let mut serve = spawn_exchange_on(
            &listen,
            &self.dir.path,
            &self.deployments,
            &self._db.url,
            &[
                "--identity",
                path(&exchange_key),
                "--settlement",
                path(&settlement),
                "--standby",
            ],
        );
        let said = tokio::task::block_in_place(|| serve.field("cx serve:"));
        assert!(said.starts_with("a standby node"), "{said}");
        let url = tokio::task::block_in_place(|| serve.field("url"));
        Exchange {
            url,
            ca: self.market.ca.clone(),
            key_hash: self.market.key_hash.clone(),
            serve,
        }
    }

    /// After the writer is SIGKILLed: `standby` ([`Settling::start_standby`]) takes the lease
    /// (its writer lines printed) and is the exchange from then on, `client` pointed at it.
    pub async fn take_over(&mut self, mut standby: Exchange) {
        let database = tokio::task::block_in_place(|| standby.serve.field("database"));
        assert!(database.ends_with("writer epoch 2)"), "{database}");
        self.client = cx_client::Client::new(&standby.url, Some(&standby.ca))
            .unwrap()
            .with_timeout(Duration::from_secs(60));
        self.market = standby;
    }

    /// SIGKILLs `cx serve` (nothing of its own runs on the way down) and starts it again on the
    /// same address, books, identity and settlement configuration: a crash and a restart.
    pub async fn restart_exchange(&mut self) {
        self.market.serve.kill();
        let listen = self.market.url.trim_start_matches("https://").to_owned();
        let (exchange_key, settlement) = (
            self.dir.path.join("exchange.key"),
            self.dir.path.join("settlement.json"),
        );
        self.market = start_exchange_on(
            &listen,
            &self.dir.path,
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
