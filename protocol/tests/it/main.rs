//! cx-protocol's integration tests, one binary (link time on 2 cores).

mod access_python;
mod eip712_python;
mod order;
