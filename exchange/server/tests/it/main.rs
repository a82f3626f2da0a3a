//! Integration tests of cx-exchange-server, one binary to save link time.

mod api;
mod books;
mod common;
mod door;
mod explorer;
mod intents;
mod leases;
mod market_live;
mod matmul;
mod offers;
mod routing;
mod slow_clients;
mod standing;
mod store;
mod tls;
mod train;
mod verification;
