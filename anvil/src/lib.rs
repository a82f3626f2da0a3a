//! cx-devnet: the local devnet and the test harness — everything that starts processes on this
//! machine so the production crates never have to.
//!
//! - [`supervise`]: child processes (start with a log, wait for a port, kill on drop), scratch
//!   folders, free ports, the binaries it starts — one place for Anvil, signers, the exchange and
//!   providers;
//! - [`anvil`]: Anvil chains from the project-local `.tools/`, with their funded accounts;
//! - [`deploy`]: every contract to every chain of a registry, and the devnet-only calls (test
//!   stablecoin, gas probe); writes cx-contracts' deployments file;
//! - [`cluster`]: a committee of `cx-signer run` processes on loopback;
//! - [`lagging`]: a JSON-RPC front that holds a node's head back (a signer's lagging node);
//! - [`scenario`]: a market on one chain (deployment, a funded buyer, a registered provider and
//!   the receipts it signs) for benches and tests;
//! - [`db`]: the database URL, the workspace's migrations and throwaway databases;
//! - [`bench`]: `cx-devnet bench gas` and `bench sign`, as functions returning their reports;
//! - [`harness`]: the cross-process test harness — markets of real processes (one chain, a
//!   settling committee, a restartable exchange, a private PostgreSQL) that `cx-cli`'s
//!   integration tests start;
//! - [`devnet`]: `cx devnet`'s orchestration — the whole market, each party its own process, with
//!   seeded traffic and a tally of what settled — behind a plain [`devnet::Config`] and
//!   [`devnet::run`] (the `cx` binary keeps only the flags).
//!
//! Data flows: [`anvil`] starts chains → [`deploy`] puts contracts on them → [`cluster`] starts
//! signers that read the deployments file → the coordinator (cx-settlement) settles on them;
//! [`devnet`] composes all of them with the exchange and providers.
//!
//! ```no_run
//! # async fn demo() -> cx_devnet::Result<()> {
//! use cx_devnet::{AnvilInstance, deploy::{deploy, devnet_params}};
//! use cx_settlement::frost::DealerCommittee;
//! use rand_chacha::{ChaCha20Rng, rand_core::SeedableRng};
//!
//! let chain = AnvilInstance::spawn(31337, None, 4)?; // a free port; killed on drop
//! let committee = DealerCommittee::generate(5, 3, &mut ChaCha20Rng::from_seed([1; 32]))?;
//! let deployment =
//!     deploy(&chain.rpc_url(), chain.keys[0].clone(), devnet_params(committee.group_key()?)).await?;
//! println!("Settlement at {} on chain {}", deployment.settlement, deployment.chain_id);
//! # Ok(()) }
//! ```
//!
//! `.tools/` and `runtime/` are found under [`workspace_root`] (this crate's parent folder);
//! `CX_ANVIL`, `CX_SIGNER_BIN` and `CX_PROVIDER_BIN` override the binaries. No feature flags.

pub mod anvil;
pub mod balancer;
pub mod bench;
pub mod cluster;
pub mod db;
pub mod deploy;
pub mod devnet;
mod error;
pub mod harness;
pub mod lagging;
pub mod scenario;
pub mod supervise;

pub use anvil::{AnvilInstance, anvil_binary, workspace_root};
pub use cluster::{Cluster, Placement, signer_binary};
pub use error::{Error, Result};
pub use scenario::ScenarioChain;
pub use supervise::{ScratchDir, Supervised, Usage, free_port, provider_binary};
