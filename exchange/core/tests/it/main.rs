//! Integration tests of cx-exchange, one binary to save link time.

mod engine_props;
mod prefix;
mod pricing;
mod routing;
