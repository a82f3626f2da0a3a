//! The agent's side of compute-exchange: a typed HTTPS client of the exchange's API, the request
//! hash an intent commits to, and the agent's key file.
//!
//! - [`Client`] ([`client`]): one method per endpoint — [`Client::bind`],
//!   [`Client::submit_intent`], [`Client::open_session`], [`Client::session`],
//!   [`Client::revoke_session`], [`Client::chat`], [`Client::job`], [`Client::jobs`], [`Client::tab`],
//!   [`Client::chains`], [`Client::eip712`], [`Client::models`], [`Client::providers`],
//!   [`Client::health`], [`Client::metrics`] — returning the server's JSON as this crate's
//!   [`types`], or an [`Error`] that carries the server's `code`, `message`, `field` and the HTTP
//!   status ([`Error::Api`]). Requests share a keep-alive pool (hyper-util's client), so clones of
//!   one client on many tasks reuse a few connections.
//! - [`tls`]: rustls on aws-lc-rs, TLS 1.3, key exchange `X25519MLKEM768` first, then `X25519`;
//!   roots from a CA file (the devnet's `runtime/ca/ca.pem`) or Mozilla's. Each response knows
//!   what its connection negotiated ([`Client::connection_info`]). Plain `http://` only when the
//!   URL says so.
//! - [`provider`]: the provider's side of dispatch — [`Client::register_provider`],
//!   [`Client::pull_jobs`], [`Client::submit_result`] and the receipt a result is signed with
//!   ([`provider::sign_receipt`]).
//! - [`keys`]: [`AgentKeys`], the secp256k1 account key and the ML-DSA-65 identity; it signs
//!   bindings and orders (via `cx_protocol::order`) and lives in a 0600 JSON file written
//!   atomically.
//! - [`types::request_hash`]: SHA-256 of the request's canonical JSON, what the exchange checks
//!   against the intent's signed `request_hash`.
//!
//! How data moves: an agent binds once ([`AgentKeys::binding`] → [`Client::bind`]), opens a tab
//! on chain (its `ref` = [`cx_protocol::order::TabTerms::tab_ref`]; the `cx agent open-tab`
//! command does it with cx-settlement), then for each job hashes the request, signs an
//! [`cx_protocol::order::Intent`] naming the tab ([`AgentKeys::sign`]) and submits both
//! ([`Client::submit_intent`]); the answer names the job, its bundle, what it holds on the tab and
//! the clearing decision's terms.
//!
//! ```no_run
//! use cx_client::{AgentKeys, Client, InferenceRequest, request_hash};
//! use cx_protocol::order::Intent;
//! use cx_protocol::{DeterminismClass, Tier};
//! use std::path::Path;
//!
//! # async fn run() -> Result<(), cx_client::Error> {
//! let client = Client::new("https://127.0.0.1:8443", Some(Path::new("runtime/ca/ca.pem")))?;
//! let keys = AgentKeys::load(Path::new("agent.json"))?;
//! let chain = client.chains().await?.remove(0);
//! let domain = chain.domain();
//! client.bind(&keys.binding(&domain, 0)?).await?;
//!
//! let request = InferenceRequest { prompt: "Say hello.".into(), max_tokens: 16, ..Default::default() };
//! let now_s = 1_800_000_000;
//! let intent = Intent {
//!     want: "llama-8b".into(), adapter_id: None, request_hash: request_hash(&request),
//!     deadline_s: now_s + 60, max_price_wei: 100_000, market_limit: false, min_tier: Tier::T1,
//!     determinism: DeterminismClass::D, tab_id: 3, nonce: 1, expiry_s: now_s + 60,
//! };
//! match client.submit_intent(&keys.sign(intent, &domain)?, &request).await {
//!     Ok(accepted) => println!("job {} on {}", accepted.job_id, accepted.bundle_id),
//!     Err(err) if err.code() == Some("tab_overspent") => println!("top up the tab"),
//!     Err(err) => return Err(err),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Offline, the parts that need no server:
//!
//! ```
//! use cx_client::{AgentKeys, InferenceRequest, request_hash};
//! use cx_protocol::pq::Identity;
//!
//! let keys = AgentKeys::from_secrets(&[7; 32], Identity::from_seed([9; 32])).unwrap();
//! let domain = cx_protocol::order::domain(31337, cx_protocol::order::Address::repeat_byte(0x5e));
//! assert!(keys.binding(&domain, 0).unwrap().verify(&domain).is_ok());
//! let request = InferenceRequest { prompt: "hi".into(), max_tokens: 1, ..Default::default() };
//! assert_eq!(request_hash(&request), request_hash(&request.clone()));
//! ```
//!
//! No feature flags.

pub mod client;
pub mod error;
pub mod keys;
pub mod provider;
pub mod tls;
pub mod types;

pub use client::{Client, Credential, DEFAULT_TIMEOUT};
pub use error::{Error, Result};
pub use keys::AgentKeys;
pub use tls::TlsInfo;
pub use types::{
    Accepted, Bound, ChainInfo, Claim, DecisionRecord, Health, InferenceRequest, JobRecord,
    JobsQuery, MarketQuote, ModelInfo, SessionInfo, SessionOpened, StoredDataset, Tab, Terms,
    request_hash,
};
