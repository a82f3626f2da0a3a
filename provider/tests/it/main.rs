//! Integration tests of cx-provider, one binary (link time on 2 cores).

mod api;
mod bases;
mod cache;
mod common;
mod equivalence;
mod exchange_link;
mod gguf;
mod hf_fixtures;
mod http;
mod http_safety;
mod model;
mod prefix;
mod real_model;
mod sampling;
mod training;
