//! Integration tests of cx-settlement, one binary (link time on 2 cores).

mod fixtures;
