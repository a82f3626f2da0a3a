//! The exchange core's one error type.

use cx_protocol::Tier;

/// Everything the pure market core can refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A job, bundle or parameter failed validation; the field is named.
    #[error(transparent)]
    Invalid(#[from] cx_protocol::Error),
    /// No bundle with this id is registered.
    #[error("unknown bundle `{0}`: register it first")]
    UnknownBundle(String),
    /// A lifecycle event that the order's current state does not allow.
    #[error("{order} order in state `{state}` cannot take event `{event}`")]
    IllegalTransition {
        /// Kind of order (reserve, rent).
        order: &'static str,
        /// State it was in (unchanged).
        state: String,
        /// Event that was refused.
        event: &'static str,
    },
    /// A reserve priced at or above spot is not a reserve.
    #[error("reserve price {reserve_wei_per_s} wei/s must be below spot {spot_wei_per_s} wei/s")]
    ReserveNotBelowSpot {
        /// Offered reserve price, wei per compute-second.
        reserve_wei_per_s: u64,
        /// Spot price, wei per compute-second.
        spot_wei_per_s: u64,
    },
    /// A draw on a reserve larger than what is left of it, or outside its window.
    #[error("reserve cannot cover the draw: {0}")]
    ReserveExhausted(String),
    /// A tier that no bundle on this exchange can offer.
    #[error("tier {0} cannot be offered here")]
    TierUnavailable(Tier),
    /// A model catalog that breaks a rule at load; `at` names the rung (`models[2].rungs[0]`).
    #[error("catalog {at}: {rule}: {detail}")]
    Catalog {
        /// Where in the catalog: a model, a rung or a provider, as a dotted path.
        at: String,
        /// The rule that was broken, e.g. `free rung routes only to a zero-priced upstream`.
        rule: &'static str,
        /// The offending values and what to change.
        detail: String,
    },
    /// A model name or alias that the catalog does not know.
    #[error("unknown model `{0}`: add it (or an alias) to the catalog")]
    UnknownModel(String),
    /// A pricing market (model class × tier) that has not been opened.
    #[error("unknown market `{0}`: open it with MarketMaker::open first")]
    UnknownMarket(String),
}

/// `Result` with the core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand for an invalid-field error.
pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> Error {
    Error::Invalid(cx_protocol::Error::InvalidField {
        field: field.to_owned(),
        reason: reason.into(),
    })
}
