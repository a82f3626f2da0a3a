//! Pricing: the market maker and per-tenant preferences (SPEC §10).
//!
//! - [`hmm`]: the regime model over observed load — forward filter online, Baum–Welch offline.
//! - [`leapfrog`]: price dynamics, a damped symplectic step in a regime-dependent anharmonic
//!   potential over occupancy.
//! - [`load`]: what the maker observes of a live market (offered load and occupancy from
//!   arrivals, committed work and servers).
//! - [`market`]: the market maker, one state per (model class × tier) market; deterministic
//!   open quotes with `bid < ask` and no tier crossing; [`market::eligible`] turns providers'
//!   asks into reservation prices.
//! - [`tenant`]: one-bit sign deltas over a shared base quote table, applied to a quote by
//!   [`market::with_preference`].
//! - [`sim`]: a small regime-shift market to compare the market maker with a fixed price.
//! - [`bench`]: [`bench::run_pricing_bench`], behind `cx bench pricing` (with the
//!   expected-free-energy routing replay of [`crate::routing::shift`], which routes under this
//!   maker's regime belief).
//!
//! ```
//! use cx_exchange::pricing::hmm::Observation;
//! use cx_exchange::pricing::market::{MarketMaker, MarketParams, eligible};
//! use cx_protocol::Tier;
//!
//! let mut mm = MarketMaker::new(MarketParams::default()).unwrap();
//! mm.open("llama-8b", 4.0).unwrap(); // reference: 4 units of the asset per compute-hour
//! mm.observe("llama-8b", Tier::T0, &Observation { offered_load: 1.3, occupancy: 1.4 }).unwrap();
//! let quote = mm.quote("llama-8b", Tier::T0, 30.0, 2.0).unwrap();
//! assert!(quote.bid_wei_per_s < quote.ask_wei_per_s); // integers, wei per compute-second
//! assert!(eligible(1_111, &quote)); // a bundle asking 1111 wei/s (4.0/h) may take the job
//! ```

pub mod bench;
pub mod hmm;
pub mod leapfrog;
pub mod load;
pub mod market;
pub mod sim;
pub mod tenant;
