//! cx-settlement: the off-chain half of on-chain settlement — what a signer or the coordinator
//! runs in production. (Starting chains, deploying and supervising signer processes for tests and
//! the devnet is cx-devnet's job; the contracts' bindings are cx-contracts'.)
//!
//! Data moves through the parts in this order:
//! - [`merkle`]: the receipts of a batch and every party's cumulative credits become two Merkle
//!   roots (same hashing as `contracts/src/Escrow.sol`, so a [`merkle::BalancesTree`] proof is
//!   what `Escrow.claim` accepts);
//! - [`batch`]: the roots, the settled escrow ranges, chain id, contract, key epoch and nonce
//!   become the
//!   batch digest (`Settlement.batchDigest`, byte for byte);
//! - [`frost`]: the committee signs the digest with FROST(secp256k1, SHA-256) (RFC 9591, the
//!   `frost-secp256k1` crate) and the signature is converted to the contract's form;
//! - [`evm`]: one account's typed calls to a deployment, by concern ([`evm::escrow`],
//!   [`evm::registry`], [`evm::events`]), on cx-contracts' bindings; [`onchain`] is the
//!   read-only view a signer checks against (it holds no Ethereum key).
//!
//! The committee (the off-chain half that produces the signatures):
//! - [`transport`]: length-prefixed frames over TCP carrying `cx-protocol`'s hybrid
//!   ML-KEM-768 + X25519 handshake (ML-DSA-65 authenticated, keys pinned) and then sealed
//!   frames; [`wire`] is what those frames say; [`keyfile`] keeps secrets in 0600 files;
//! - [`dkg`]: FROST key generation among the signers over those sessions (no dealer);
//! - [`ledger`]: receipts + escrows + previous balances → one chain's batch, the function the
//!   coordinator builds with and every signer re-checks with;
//! - [`signer`]: the `cx-signer run` service — checks a batch against the chain ([`onchain`])
//!   and its own record before it signs (the vouchers' signatures once, as they arrive:
//!   [`checked`]); [`config`] is its configuration;
//! - [`slash`]: evidence against a provider (two conflicting class-D receipts) that every signer
//!   checks before it signs a slash with an expiry;
//! - [`coordinator`]: signer-agnostic batching, any-t-of-n signing under a diversity rule,
//!   posting to every chain exactly once, every step in PostgreSQL (outbox). It reaches the
//!   world through three boundaries with in-memory twins for tests: the
//!   [`coordinator::Store`], each [`coordinator::Chain`] and the
//!   [`coordinator::ThresholdSigner`].
//!
//! ```
//! use alloy::primitives::{Address, B256, U256};
//! use cx_settlement::batch::{BatchMessage, ranges_from_ids};
//! use cx_settlement::merkle::BalancesTree;
//!
//! let provider = Address::repeat_byte(0x11);
//! let buyer = Address::repeat_byte(0x22);
//! let balances = BalancesTree::new(vec![(provider, U256::from(90)), (buyer, U256::from(10))])?;
//! let batch = BatchMessage {
//!     chain_id: 31337,
//!     contract: Address::repeat_byte(0xcc),
//!     key_epoch: 0,
//!     nonce: 1,
//!     receipts_root: B256::repeat_byte(0xaa),
//!     balances_root: balances.root(),
//!     ranges: ranges_from_ids(&[0, 1, 2, 7]),
//! };
//! assert_eq!(batch.ranges.len(), 2);
//! let (amount, proof) = balances.proof_for(provider)?;
//! assert_eq!(amount, U256::from(90));
//! assert!(cx_settlement::merkle::MerkleTree::verify(
//!     batch.balances_root,
//!     cx_settlement::merkle::balance_leaf(provider, amount),
//!     &proof,
//! ));
//! # Ok::<(), cx_settlement::Error>(())
//! ```
//!
//! Limits that follow from the encoding (each held by a test):
//! - one chain's part of a batch holds at most [`ledger::MAX_RECEIPTS_PER_BATCH`] (1,000)
//!   receipts; more pending receipts settle in more batches, oldest first;
//! - a sign request fits one frame of at most 16 MiB ([`transport::Limits`]). It carries the
//!   part's receipts and the balances root it builds on, not the balance lists: each signer keeps
//!   its own ([`signer`]), so a full part (~9 MB) fits whatever the history. A signer that lacks
//!   the previous list gets it once in full; that request fits up to ~25,000 parties on the
//!   chain (14.7 MB with a full part);
//! - a signer accepts 256 connections, 32 handshakes a second, 16 sessions per peer, DKGs at
//!   most 16 epochs past its newest key and 3 DKG messages per peer and epoch
//!   ([`config::PeerLimits`], all configurable).
//!
//! No feature flags: the EVM client is always built (alloy with HTTP transport only).

pub mod batch;
pub mod checked;
pub mod config;
pub mod coordinator;
pub mod dkg;
mod error;
pub mod evm;
pub mod frost;
pub mod keyfile;
pub mod ledger;
pub mod merkle;
pub mod onchain;
pub mod signer;
pub mod slash;
pub mod transport;
pub mod wire;

pub use error::{Error, Refusal, Result};
