//! Integration tests of cx-settlement, one binary (link time on 2 cores).
//!
//! - `fixtures`: writes the FROST fixtures the Forge tests check;
//! - `artifacts`: recompiles the contracts and fails if the committed artifacts are stale;
//! - `anvil`: end-to-end against real Anvil chains on free ports;
//! - `committee`: signer processes, DKG over PQ sessions, coordinator on PostgreSQL, two chains.

mod anvil;
mod artifacts;
mod committee;
mod fixtures;
