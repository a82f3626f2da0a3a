//! Benchmarks over real processes and a real chain, behind `cx-devnet bench …` (and any other
//! binary that wants them: each returns its report, whose `table()` is the human form and whose
//! serde form is the `--json` line).
//!
//! - [`cluster`]: the exchange as `cx serve` nodes on one database: 1 and 2 nodes side by side,
//!   and the writer killed under load;
//! - [`gas`]: gas of FROST verification, settlement per job and a claim, on a fresh Anvil;
//! - [`intake`]: signed intents over HTTPS through verify → persist → clear, with its bounds
//!   (its clients in a process of their own, [`intake_load`]);
//! - [`load`]: open-loop load on intake or the OpenAI door: the knee, 1×/2×/4× past it, a soak;
//! - [`router`]: routing by task on live traffic through a regime shift, every router policy
//!   against the best fixed arm, from the meter;
//! - [`sign`]: handshake, DKG and signing latency of a committee of signer processes.

pub mod cluster;
pub mod gas;
pub mod intake;
pub mod intake_load;
pub mod load;
pub mod router;
pub mod sign;

pub use cluster::{ClusterBenchConfig, ClusterReport, cluster_bench};
pub use gas::{GasReport, gas_bench};
pub use intake::{IntakeBenchConfig, IntakeReport, intake_bench};
pub use intake_load::{LoadOutcome, intake_load};
pub use load::{LoadConfig, LoadReport, load_bench};
pub use router::{RouterBenchConfig, RouterReport, router_bench};
pub use sign::{SignBenchReport, sign_bench};
