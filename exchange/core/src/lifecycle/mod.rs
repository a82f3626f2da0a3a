//! Standing-order lifecycles (SPEC §3) as explicit, pure state machines: reserves and rents
//! (a job's own lifecycle is the server's `JobStatus`; a search's is its books' rows), and the
//! search's proof-of-work arithmetic.
//!
//! Each order owns its state; each event is a method that either moves it to the next state or
//! returns [`crate::Error::IllegalTransition`] and leaves it unchanged. Time is passed in (seconds
//! on the exchange's clock), never read, so every transition is replayable from the books.
//! Money is integer wei; compute is integer milliseconds.

pub mod rent;
pub mod reserve;
pub mod search;

pub use rent::{PinObject, Rent, RentState};
pub use reserve::{Award, Bid, BidRefusal, Draw, Reserve, ReserveState};

/// `numerator × amount / denominator`, rounded down, in u128 without overflow for the amounts
/// this exchange handles (wei × milliseconds); saturates rather than wraps if ever exceeded.
pub(crate) fn pro_rata(amount: u128, numerator: u128, denominator: u128) -> u128 {
    if denominator == 0 {
        return 0;
    }
    amount.saturating_mul(numerator) / denominator
}
