//! cx-protocol: the wire types every compute-exchange party shares.
//!
//! Agents, providers, the exchange and the settlement committee exchange these types as JSON
//! (serde, snake case, units in field names). The crate depends on nothing of ours and does no
//! I/O.
//!
//! - [`class`]: determinism classes (D, D∞, S) and verification tiers (T0–T3, attested), with
//!   compact sets of each that bundles advertise.
//! - [`job`]: a job `j = (m, c, Δ, κ, τ, V)` as the exchange clears it (SPEC §2).
//! - [`workload`]: what a job computes — an inference, a product or a training run — as one
//!   type, decided where the order comes in and carried from there.
//! - [`wire`]: the bodies the exchange's API and its providers exchange (assignments, results,
//!   registrations), each declared once for the exchange, its providers and its clients.
//! - [`decision`]: a clearing decision — the choice, each cost term, the feasible and refused
//!   bundles with their binding constraints — as the clearing core computes it and every party
//!   reads it.
//! - [`job_status`]: where a job is in its life, as the API reports it and the books keep it.
//! - [`matmul`]: the `matmul` job kind (T2): its reserved market, request, bounds and product
//!   encoding.
//! - [`model_config`]: the Hugging Face `config.json` of a Llama-family base (the one parse of it),
//!   weight dtypes and the projections a LoRA adapter targets.
//! - [`bundle`]: a provider bundle as it is registered: device, free memory, link, price,
//!   capabilities and what is resident (SPEC §2).
//! - [`id`]: content ids (SHA-256) for adapters and other artifacts.
//! - [`inventory`]: shadow price of a residency slot, eviction by value per byte (never a pin),
//!   and the KV keep-or-evict rule — shared by providers' caches and the exchange.
//! - [`price`]: the one price unit — integers in the asset's smallest unit (wei per
//!   compute-second for asks and quotes, a total in wei for a buyer's limit) and the one place
//!   floats convert to it.
//! - [`prefix`]: conversation-prefix ids over the rendered chat text, which a provider holds
//!   KV caches under and the exchange routes continuations by (SPEC §4).
//! - [`pq`]: ML-DSA-65 identities and hybrid ML-KEM-768 + X25519 sessions.
//! - [`receipt`]: provider-signed (ML-DSA) receipts with a canonical byte encoding.
//! - [`bid`]: provider-signed (ML-DSA) bids on open reserves.
//! - [`access`]: an account's access credential (EIP-191 signed lines naming what it allows —
//!   reading its jobs, storing content —, the account, the exchange and an expiry).
//! - [`replica`]: verification runs (T1, T3): the ids of the runs that re-execute a job.
//! - [`tolerance`]: class D∞'s check: when two runs' outputs agree within the stated tolerance.
//! - [`order`]: signed orders — EIP-712 typed data (alloy `sol!`) for intents, reserves, rents,
//!   searches, tab terms, session grants and key bindings, each signed by the account
//!   (secp256k1) and co-signed by its bound ML-DSA-65 key; the wallet JSON for each kind.
//!
//! ```
//! use cx_protocol::{DeterminismClass, Job, Tier};
//!
//! let job: Job = serde_json::from_str(r#"{
//!     "base_model": "llama-8b", "base_bytes": 16000000000, "adapter_bytes": 20000000,
//!     "kv_bytes": 500000000, "context_tokens": 4096, "deadline_s": 30,
//!     "determinism": "D", "tier": "T1"
//! }"#).unwrap();
//! job.validate().unwrap();
//! assert_eq!(job.determinism, DeterminismClass::D);
//! assert_eq!(job.tier, Tier::T1);
//! ```

pub mod access;
pub mod assignment;
pub mod bid;
pub mod bundle;
pub mod class;
pub mod decision;
pub mod error;
pub mod holders;
pub mod id;
pub mod inventory;
pub mod job;
pub mod job_status;
pub mod matmul;
pub mod model_config;
pub mod offer;
pub mod order;
pub mod pq;
pub mod prefix;
pub mod price;
pub mod receipt;
pub mod replica;
pub mod tab_close;
pub mod tolerance;
pub mod train;
pub mod voucher;
pub mod wire;
pub mod workload;

pub use bundle::Bundle;
pub use class::{ClassSet, DeterminismClass, Tier, TierSet};
pub use error::{Error, Result};
pub use id::content_id;
pub use job::{Job, PrefixNeed};
