//! Cross-process tests, one binary (link time on 2 cores); see the crate overview.

mod committee;
mod contracts;
mod fees;
mod store;
mod watcher;
