//! The cross-process test harness: markets whose every party is its own process, as `cx-cli`'s
//! integration tests (and anyone testing against real binaries) start them.
//!
//! - [`process`]: `cx serve` and the lines it prints ([`Serve`]), children stopped on drop
//!   ([`Killed`], [`Interrupted`]), one-shot runs of `cx` and `cx-provider`, the binaries;
//! - [`market`]: a market on one chain — Anvil with the contracts ([`deploy_chain`]), `cx serve`
//!   ([`start_exchange`]), staked providers ([`start_provider`]) on a generated model;
//! - [`agent`]: an agent driven through `cx agent`;
//! - [`settling`](mod@settling): a settling exchange — a `cx-signer` committee after a DKG, its group key in
//!   the contracts and a throwaway database ([`Settling`]);
//! - [`restartable`]: a market whose exchange is killed and restarted, with agents whose orders
//!   the test signs itself ([`Restartable`], [`Signer`]) and raw HTTPS requests;
//! - [`postgres`]: a private PostgreSQL server a test can restart ([`PgCluster`]);
//! - [`books`]: what a test asks the exchange's books directly;
//! - [`browser`]: headless Chromium on the explorer.
//!
//! Data flows as in production: chain → contracts → exchange → providers → agents; every part
//! is stopped when its value is dropped. These are test helpers: they panic, with what to do,
//! instead of returning errors, so a failing test says where it failed.
//!
//! ```no_run
//! # async fn demo() {
//! use cx_devnet::harness::{deploy_chain, group_key, scratch, start_exchange};
//! use cx_devnet::db::TempDatabase;
//!
//! let dir = scratch("demo");
//! let chain = deploy_chain(&dir.path, 4, group_key(), 1_200).await;
//! let db = TempDatabase::create().await.unwrap();
//! let exchange = start_exchange(&dir.path, &chain.deployments, &db.url, &[]).await;
//! println!("the exchange at {}", exchange.url);
//! # }
//! ```

pub mod agent;
pub mod books;
pub mod browser;
pub mod market;
pub mod postgres;
pub mod process;
pub mod restartable;
pub mod settling;

pub use crate::devnet::{CATALOG, MODEL};
pub use agent::Agent;
pub use books::{all_jobs_end, handed_out_again, job_status, tabs_off_their_jobs};
pub use browser::{
    browse, check_settled_job_page, element_href, element_text, screenshots_dir, try_browse,
};
pub use market::{
    Chain, Exchange, deploy_chain, gen_model, gen_model_at, provider_command, registered,
    serving_command, stake_provider, start_exchange, start_exchange_on, start_provider,
    write_evm_key,
};
pub use postgres::PgCluster;
pub use process::{
    Interrupted, Killed, Serve, cx_binary, cx_json, last_json, provider_bin, run, signal, until,
};
pub use restartable::{Answer, Restartable, Signer, SigningAgent, https_request};
pub use settling::{Settling, settling, settling_with};

use crate::ScratchDir;

/// A fresh scratch folder for a test, `cx-test-<tag>-…` under the system's temporary directory,
/// removed on drop (`CX_KEEP_SCRATCH=1` keeps it).
pub fn scratch(tag: &str) -> ScratchDir {
    ScratchDir::new(&format!("cx-test-{tag}"))
        .expect("a scratch folder under the temporary directory")
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

/// A path as an argument (panics on a path that is not UTF-8).
pub fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}
