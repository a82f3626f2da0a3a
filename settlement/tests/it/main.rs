//! Integration tests of cx-settlement, one binary (link time on 2 cores).
//!
//! - `fixtures`: writes the FROST fixtures the Forge tests check;
//! - `artifacts`: recompiles the contracts and fails if the committed artifacts are stale;
//! - `anvil`: end-to-end against real Anvil chains on free ports.

mod anvil;
mod artifacts;
mod fixtures;
