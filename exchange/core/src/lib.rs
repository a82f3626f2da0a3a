//! cx-exchange: the compute-exchange market.
//!
//! The pure core prices residency and refuses what cannot meet a deadline. It does no I/O at
//! all — no network, database, chain, files or clock-driven behaviour — so it is tested and
//! benchmarked in microseconds; the service (`cx-exchange-server`) and the `cx` binary
//! (`exchange/cli`) sit around it. Prices are integers in wei ([`cx_protocol::price`]).
//! - [`candidate`], [`feasibility`], [`objective`]: SPEC §2 — hard constraints with the factor
//!   each was missed by, then the cost with every term reported.
//! - [`clearing`]: one job against a list, explained; [`engine`]: live bundles indexed by
//!   resident adapter, resident base and capability, cleared by exact branch and bound;
//!   [`ring`]: consistent hashing for affinity and tie-breaks.
//! - [`lifecycle`]: intents, reserves, rent on state and search as explicit state machines.
//! - [`capacity`]: the adapter arithmetic of SPEC §5.
//! - [`pricing`]: the market maker (HMM regimes, leapfrog price dynamics, deterministic quotes
//!   whose ask gates which bundles may clear) and per-tenant preference tables (SPEC §10).
//! - [`routing`]: which model an intent maps to before clearing picks a bundle: featuriser,
//!   utility over arm profiles, ridge fit, contextual bandit, expected-free-energy routing over
//!   the market maker's regime belief, fan-out, and the model catalog
//!   with its route rungs.
//! - [`meter`]: one record per routed request (arm, cost in wei, outcome, regime belief): what
//!   the EFE router learns from and what `cx bench pricing` and `cx simulate` report.
//! - [`rng`]: the seeded generator of synthetic traces (ChaCha20; never used to quote or clear).
//! - [`sim`] and [`bench`]: the market simulation and the clearing benchmark, pure functions
//!   that return data (the `cx` binary prints, writes and draws it).
//!
//! ```
//! use cx_exchange::engine::Engine;
//! use cx_exchange::objective::Weights;
//! use cx_protocol::{Bundle, Job};
//!
//! let mut engine = Engine::new(Weights::default()).unwrap();
//! let bundle: Bundle = serde_json::from_str(r#"{
//!     "id": "h200-a", "price_wei_per_s": "1112", "memory_bytes": 60000000000,
//!     "bandwidth_bps": 1e10, "rtt_s": 0.02, "flops_per_s": 4e14, "context_max": 32768,
//!     "determinism": ["D", "S"], "tiers": ["T0", "T1"], "resident_bases": ["llama-8b"]
//! }"#).unwrap();
//! engine.upsert(bundle).unwrap();
//! let job: Job = serde_json::from_str(r#"{
//!     "base_model": "llama-8b", "base_bytes": 16000000000, "kv_bytes": 500000000,
//!     "context_tokens": 4096, "deadline_s": 5, "determinism": "D", "tier": "T1",
//!     "compute_flops": 6.5e13
//! }"#).unwrap();
//! let choice = engine.clear(&job, None).unwrap().unwrap();
//! assert_eq!(choice.bundle_id, "h200-a");
//! assert_eq!(choice.terms.base_load, 0.0); // the base was resident
//! ```

pub mod bench;
pub mod candidate;
pub mod capacity;
pub mod clearing;
pub mod engine;
pub mod error;
pub mod feasibility;
pub mod lifecycle;
pub mod meter;
pub mod objective;
pub mod pricing;
pub mod ring;
pub mod rng;
pub mod routing;
pub mod sim;

pub use error::{Error, Result};
