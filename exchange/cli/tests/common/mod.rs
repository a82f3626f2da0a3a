//! What the `cx` binary's test files share: cx-devnet's cross-process harness
//! ([`cx_devnet::harness`]), under the name the test files use.

#![allow(unused_imports, unreachable_pub)] // each test binary uses part of it

pub use cx_devnet::ScratchDir;
pub use cx_devnet::harness::*;
