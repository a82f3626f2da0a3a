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

/// A provider's bid on a reserve as the award sees it at the window's start.
#[derive(Debug, Clone, PartialEq)]
pub struct Bid<'a> {
    /// Who bid (the provider's key hash, hex): ties between equal rates go to the smaller.
    pub bidder: &'a str,
    /// The bundle it bid with, as the engine holds it now (`None`: it left the engine).
    pub bundle: Option<&'a cx_protocol::Bundle>,
    /// The rate offered, wei per compute-second.
    pub rate_wei_per_s: u64,
    /// Compute the bundle already committed to other reserves whose windows overlap this one,
    /// milliseconds.
    pub committed_elsewhere_ms: u64,
}

/// Why a bid cannot win.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "binding", rename_all = "snake_case")]
pub enum BidRefusal {
    /// Its bundle left the engine (its provider went silent or lost its stake).
    BundleGone,
    /// The bundle does not offer the reserve's tier.
    Tier,
    /// The bundle can hold neither the model's base nor has it resident.
    Memory {
        /// The base's bytes.
        needed_bytes: u64,
        /// The bundle's free memory.
        available_bytes: u64,
    },
    /// The reserved compute does not fit what the bundle has left over the window.
    Capacity {
        /// The reserved compute, milliseconds.
        needed_ms: u64,
        /// The window's length less what the bundle committed to overlapping reserves.
        free_ms: u64,
    },
    /// The rate is above the buyer's limit.
    AboveLimit {
        /// The bid's rate.
        rate_wei_per_s: u64,
        /// The buyer's `max_price_wei_per_s`.
        max_wei_per_s: u64,
    },
    /// The rate is not below the bundle's spot ask (a reserve is priced below spot).
    NotBelowSpot {
        /// The bid's rate.
        rate_wei_per_s: u64,
        /// The bundle's ask.
        spot_wei_per_s: u64,
    },
}

/// The outcome of a reserve's bidding.
#[derive(Debug, Clone, PartialEq)]
pub struct Award {
    /// The winning bid's index and the reserve it commits (window, compute, rate).
    pub winner: Option<(usize, Reserve)>,
    /// Every bid that could not win, by index, with why.
    pub refused: Vec<(usize, BidRefusal)>,
}

/// Awards reserve `order` (id `id`) of catalog model `model` (its name, which bundles list
/// among their resident bases) whose base is `base_bytes` to the **lowest
/// feasible bid**: its bundle is live, offers the tier, holds or can hold the base, the rate is
/// within the buyer's limit and below the bundle's spot ask, and the reserved compute fits the
/// bundle's time over the window less what it committed to overlapping reserves. Compute is
/// counted on the committed bundle's own measured throughput (an intent drawing on the reserve
/// draws its `t_compute` there), so a bundle has `window × 1000` compute-ms to commit at most.
/// Feasibility first, then the rate (a cheap infeasible bid never wins); equal rates go to the
/// smaller bidder key, so the award is deterministic.
pub fn award(
    id: &str,
    order: &cx_protocol::order::Reserve,
    (model, base_bytes): (&str, u64),
    bids: &[Bid<'_>],
) -> Award {
    let window_ms = (order.window_end_s - order.window_start_s).saturating_mul(1000);
    let mut refused = Vec::new();
    let mut best: Option<(usize, Reserve)> = None;
    for (i, bid) in bids.iter().enumerate() {
        let refusal = (|| {
            let bundle = bid.bundle.ok_or(BidRefusal::BundleGone)?;
            if !bundle.tiers.contains(order.tier) {
                return Err(BidRefusal::Tier);
            }
            if !bundle.resident_bases.iter().any(|b| b == model) && bundle.memory_bytes < base_bytes
            {
                return Err(BidRefusal::Memory {
                    needed_bytes: base_bytes,
                    available_bytes: bundle.memory_bytes,
                });
            }
            if bid.rate_wei_per_s > order.max_price_wei_per_s {
                return Err(BidRefusal::AboveLimit {
                    rate_wei_per_s: bid.rate_wei_per_s,
                    max_wei_per_s: order.max_price_wei_per_s,
                });
            }
            let free_ms = window_ms.saturating_sub(bid.committed_elsewhere_ms);
            if order.compute_ms > free_ms {
                return Err(BidRefusal::Capacity {
                    needed_ms: order.compute_ms,
                    free_ms,
                });
            }
            Reserve::new(
                id,
                order.window_start_s as f64,
                order.window_end_s as f64,
                order.compute_ms,
                bid.rate_wei_per_s,
                bundle.price_wei_per_s,
            )
            .map_err(|_| BidRefusal::NotBelowSpot {
                rate_wei_per_s: bid.rate_wei_per_s,
                spot_wei_per_s: bundle.price_wei_per_s,
            })
        })();
        match refusal {
            Err(why) => refused.push((i, why)),
            Ok(reserve) => {
                let better = best.as_ref().is_none_or(|(j, _)| {
                    let b = &bids[*j];
                    (bid.rate_wei_per_s, bid.bidder) < (b.rate_wei_per_s, b.bidder)
                });
                if better {
                    best = Some((i, reserve));
                }
            }
        }
    }
    Award {
        winner: best,
        refused,
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

    fn bundle(id: &str, ask: u64, tiers: &[cx_protocol::Tier]) -> cx_protocol::Bundle {
        serde_json::from_value(serde_json::json!({
            "id": id, "provider": "op", "price_wei_per_s": ask.to_string(),
            "memory_bytes": 1_000_000, "bandwidth_bps": 1e9, "rtt_s": 0.001,
            "flops_per_s": 1e9, "context_max": 512, "determinism": ["D"],
            "tiers": tiers, "resident_bases": ["m"],
        }))
        .unwrap()
    }

    #[test]
    fn the_lowest_feasible_bid_wins_and_a_cheaper_infeasible_one_loses() {
        use cx_protocol::Tier;
        let order = cx_protocol::order::Reserve {
            model: "m".into(),
            tier: Tier::T1,
            window_start_s: 100,
            window_end_s: 110,
            compute_ms: 6_000,
            max_price_wei_per_s: 1_000,
            tab_id: 1,
            nonce: 1,
            expiry_s: 200,
        };
        let (a, b, c, d) = (
            bundle("a", 1_000, &[Tier::T0, Tier::T1]),
            bundle("b", 2_000, &[Tier::T0, Tier::T1]),
            bundle("c", 500, &[Tier::T0]),
            bundle("d", 900, &[Tier::T1]),
        );
        let bid = |bidder, bundle, rate, elsewhere| Bid {
            bidder,
            bundle,
            rate_wei_per_s: rate,
            committed_elsewhere_ms: elsewhere,
        };
        let bids = [
            bid("1", Some(&a), 900, 0),
            bid("2", Some(&b), 800, 0),
            // Cheaper, but infeasible each for its own reason.
            bid("3", Some(&c), 100, 0),
            bid("4", Some(&d), 200, 5_000),
            bid("5", None, 50, 0),
            bid("6", Some(&a), 1_000, 0),
            bid("7", Some(&b), 1_001, 0),
        ];
        let won = award("r", &order, ("m", 10), &bids);
        let (i, reserve) = won.winner.unwrap();
        assert_eq!((i, reserve.price_wei_per_s), (1, 800));
        assert_eq!(
            won.refused,
            vec![
                (2, BidRefusal::Tier),
                (
                    3,
                    BidRefusal::Capacity {
                        needed_ms: 6_000,
                        free_ms: 5_000
                    }
                ),
                (4, BidRefusal::BundleGone),
                (
                    5,
                    BidRefusal::NotBelowSpot {
                        rate_wei_per_s: 1_000,
                        spot_wei_per_s: 1_000
                    }
                ),
                (
                    6,
                    BidRefusal::AboveLimit {
                        rate_wei_per_s: 1_001,
                        max_wei_per_s: 1_000
                    }
                ),
            ]
        );
        assert_eq!(award("r", &order, ("m", 10), &[]).winner, None);
    }
}
