//! cx-e2e: the cross-process tests of compute-exchange, in one test binary
//! (`tests/it/main.rs`; run with `cargo test -p cx-e2e`). The crate itself holds no code: the
//! harness they use (Anvil, signer processes, throwaway databases) is cx-devnet's.
//!
//! - `contracts`: deposits, escrows, batches, claims, refunds, replay, slashing and rotation
//!   against real Anvil chains on free ports, with a dealer FROST committee;
//! - `committee`: `cx-signer` processes, a DKG over post-quantum sessions, the coordinator on a
//!   throwaway PostgreSQL database settling on two chains through signer loss, tampering,
//!   crashes and session attacks;
//! - `store`: the coordinator's outbox, the same on the memory and PostgreSQL stores.
//!
//! They need `.tools/anvil` (`scripts/setup-foundry.sh`) and PostgreSQL at `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432`); signer binaries are built through Cargo
//! ([`cx_devnet::signer_binary`]).
