//! Integration tests of cx-contracts, one binary.
//!
//! - `artifacts`: recompiles the contracts and fails if the committed artifacts are stale.

mod artifacts;
