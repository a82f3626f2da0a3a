//! Integration tests of cx-settlement, one binary (link time on 2 cores).
//!
//! - `fixtures`: writes the FROST fixtures the Forge tests check;
//! - `hostile`: members that cheat, stall or lie against the coordinator's committee, over the
//!   real transport.
//!
//! The coordinator's own tests (batching, any t of n, exactly-once posting) are unit tests on
//! its in-memory boundaries; everything with processes, Anvil or PostgreSQL is in cx-e2e.

mod fixtures;
mod hostile;
