//! Routing: which model serves a request, before the engine picks which bundle (SPEC §10).
//!
//! - [`features`]: the pure featuriser behind a [`features::Classifier`] trait.
//! - [`utility`]: arms (profile rows), `u(x, p) = xᵀ·W·p`, ceilings that gate before scoring.
//! - [`ridge`]: W fit offline in closed form from logged outcomes.
//! - [`bandit`]: per-tenant online adaptation by LinUCB around the offline W.
//! - [`fanout`]: top-N dispatch and a weightless synthesiser (byte majority for class D,
//!   medoid otherwise).
//! - [`catalog`]: the models, their ordered route rungs with retail and cost prices, and the
//!   rules checked at load.
//! - [`path`]: classify → policy → route → replica → ring, as separate pure stages.

pub mod bandit;
pub mod catalog;
pub mod fanout;
pub mod features;
pub mod path;
pub mod ridge;
pub mod utility;
