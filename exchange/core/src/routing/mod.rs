//! Routing: which model serves a request, before the engine picks which bundle (SPEC §10).
//!
//! - [`features`]: the pure featuriser behind a [`features::Classifier`] trait.
//! - [`utility`]: arms (profile rows), `u(x, p) = xᵀ·W·p`, ceilings that gate before scoring.
//! - [`ridge`]: W fit offline in closed form from logged outcomes.
//! - [`bandit`]: per-tenant online adaptation by LinUCB around the offline W.
//! - [`outcome`]: per arm and HMM regime, Dirichlet counts over discretised outcomes (latency
//!   vs the deadline, cost vs the price limit, quality); the buyer's preferences from the order.
//! - [`efe`]: routing by expected free energy (risk + ambiguity − information gain) over the
//!   market maker's regime belief, gated by the same ceilings, learned from the
//!   [`crate::meter`] only.
//! - [`shift`]: a regime-shifting replay of EFE against LinUCB and the best fixed arm.
//! - [`fanout`]: top-N dispatch and a weightless synthesiser (byte majority for class D,
//!   medoid otherwise).
//! - [`catalog`]: the models, their ordered route rungs with retail and cost prices, and the
//!   rules checked at load.
//! - [`path`]: classify → policy → route → replica → ring, as separate pure stages.

pub mod bandit;
pub mod catalog;
pub mod efe;
pub mod fanout;
pub mod features;
pub mod outcome;
pub mod path;
pub mod ridge;
pub mod shift;
pub mod utility;
