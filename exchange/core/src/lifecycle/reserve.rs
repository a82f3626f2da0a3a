//! Reserve: capacity over a window, priced below spot, drawn on first by the buyer's intents,
//! take-or-pay.

use crate::error::{Error, Result};
use crate::lifecycle::pro_rata;
use serde::Serialize;

/// Where a reserve is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ReserveState {
    /// The window is open or not yet over.
    Open,
    /// Settled take-or-pay after the window.
    Closed {
        /// What the buyer pays: the whole commitment, used or not.
        charge_wei: u128,
        /// Committed compute the buyer did not use (the provider keeps it).
        unused_ms: u64,
    },
}

/// What a draw took from the reserve and what must go to spot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Draw {
    /// Covered by the reserve, milliseconds.
    pub from_reserve_ms: u64,
    /// Left for the spot market, milliseconds.
    pub from_spot_ms: u64,
}

/// A reserve order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reserve {
    /// Order id.
    pub id: String,
    /// Window start, seconds on the exchange clock.
    pub window_start_s: f64,
    /// Window end, seconds.
    pub window_end_s: f64,
    /// Committed compute, milliseconds.
    pub committed_ms: u64,
    /// Price per compute-second, wei (below spot).
    pub price_wei_per_s: u64,
    /// Drawn so far, milliseconds.
    pub used_ms: u64,
    /// Current state.
    pub state: ReserveState,
}

impl Reserve {
    /// A reserve priced at `price_wei_per_s`, which must be strictly below `spot_wei_per_s`.
    pub fn new(
        id: impl Into<String>,
        window_start_s: f64,
        window_end_s: f64,
        committed_ms: u64,
        price_wei_per_s: u64,
        spot_wei_per_s: u64,
    ) -> Result<Self> {
        if price_wei_per_s >= spot_wei_per_s {
            return Err(Error::ReserveNotBelowSpot {
                reserve_wei_per_s: price_wei_per_s,
                spot_wei_per_s,
            });
        }
        if !(window_start_s.is_finite()
            && window_end_s.is_finite()
            && window_end_s > window_start_s)
        {
            return Err(crate::error::invalid(
                "window_end_s",
                "the window must end after it starts",
            ));
        }
        if committed_ms == 0 {
            return Err(crate::error::invalid("committed_ms", "must be > 0"));
        }
        Ok(Self {
            id: id.into(),
            window_start_s,
            window_end_s,
            committed_ms,
            price_wei_per_s,
            used_ms: 0,
            state: ReserveState::Open,
        })
    }

    /// Compute still available, milliseconds.
    pub fn remaining_ms(&self) -> u64 {
        self.committed_ms - self.used_ms
    }

    /// An intent of `compute_ms` at `now_s` draws on the reserve first; the rest goes to spot.
    /// Outside the window nothing is drawn.
    pub fn draw(&mut self, now_s: f64, compute_ms: u64) -> Result<Draw> {
        if self.state != ReserveState::Open {
            return Err(Error::IllegalTransition {
                order: "reserve",
                state: "closed".to_owned(),
                event: "draw",
            });
        }
        let in_window = now_s >= self.window_start_s && now_s < self.window_end_s;
        let from_reserve_ms = if in_window {
            compute_ms.min(self.remaining_ms())
        } else {
            0
        };
        self.used_ms += from_reserve_ms;
        Ok(Draw {
            from_reserve_ms,
            from_spot_ms: compute_ms - from_reserve_ms,
        })
    }

    /// Closes the reserve after its window: the buyer pays for the whole commitment.
    pub fn close(&mut self, now_s: f64) -> Result<ReserveState> {
        if self.state != ReserveState::Open || now_s < self.window_end_s {
            return Err(Error::IllegalTransition {
                order: "reserve",
                state: if self.state == ReserveState::Open {
                    "open (window not over)".to_owned()
                } else {
                    "closed".to_owned()
                },
                event: "close",
            });
        }
        self.state = ReserveState::Closed {
            charge_wei: pro_rata(
                u128::from(self.price_wei_per_s),
                u128::from(self.committed_ms),
                1000,
            ),
            unused_ms: self.remaining_ms(),
        };
        Ok(self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priced_at_or_above_spot_is_refused() {
        assert!(matches!(
            Reserve::new("r", 0.0, 10.0, 1000, 100, 100),
            Err(Error::ReserveNotBelowSpot { .. })
        ));
        assert!(Reserve::new("r", 10.0, 10.0, 1000, 90, 100).is_err());
    }

    #[test]
    fn draws_first_then_spot_and_take_or_pay() {
        let mut r = Reserve::new("r", 0.0, 100.0, 5_000, 80, 100).unwrap();
        assert_eq!(
            r.draw(1.0, 3_000).unwrap(),
            Draw {
                from_reserve_ms: 3_000,
                from_spot_ms: 0
            }
        );
        assert_eq!(
            r.draw(2.0, 3_000).unwrap(),
            Draw {
                from_reserve_ms: 2_000,
                from_spot_ms: 1_000
            }
        );
        assert_eq!(
            r.draw(150.0, 500).unwrap(),
            Draw {
                from_reserve_ms: 0,
                from_spot_ms: 500
            }
        );
        assert!(r.close(50.0).is_err(), "window not over");
        // 5 s committed at 80 wei/s: 400 wei whatever was used.
        assert_eq!(
            r.close(100.0).unwrap(),
            ReserveState::Closed {
                charge_wei: 400,
                unused_ms: 0
            }
        );
        assert!(r.draw(101.0, 1).is_err());
    }

    #[test]
    fn unused_commitment_is_still_paid() {
        let mut r = Reserve::new("r", 0.0, 10.0, 10_000, 50, 60).unwrap();
        r.draw(1.0, 1_000).unwrap();
        assert_eq!(
            r.close(10.0).unwrap(),
            ReserveState::Closed {
                charge_wei: 500,
                unused_ms: 9_000
            }
        );
    }
}
