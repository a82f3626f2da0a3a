//! cx-protocol's integration tests, one binary (link time on 2 cores).

mod eip712_python;
mod order;
mod read_python;
