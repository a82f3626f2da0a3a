//! Rent on state: `rent = ρ·|a|·dt` buys α = 1 with probability ≥ 1−ε over the term.
//!
//! The exchange pins the object on capable providers, accrues rent as time passes, and counts
//! residency observations: provider reports, and — because residency is self-revealing — every
//! deadline missed by a job that needed the object. If the share of observations that found it
//! absent exceeds ε, the buyer gets back that share of the rent paid.

use crate::error::{Error, Result, invalid};
use crate::lifecycle::pro_rata;
use serde::Serialize;

/// What is pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum PinObject {
    /// A LoRA adapter by content id.
    Adapter(String),
    /// A base model.
    Base(String),
    /// A conversation prefix (its KV cache) by hash.
    Prefix(String),
}

/// Where a rent order is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RentState {
    /// The term is running.
    Active,
    /// The term is over and settled.
    Ended {
        /// Rent paid over the term, wei.
        paid_wei: u128,
        /// Rebate for a missed SLA, wei (0 if it was met).
        rebate_wei: u128,
    },
}

/// A rent-on-state order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rent {
    /// Order id.
    pub id: String,
    /// The pinned object.
    pub object: PinObject,
    /// |a|, bytes.
    pub size_bytes: u64,
    /// ρ: wei per gigabyte-hour (10⁹ bytes × 3600 s).
    pub rho_wei_per_gb_hour: u128,
    /// Term start, seconds.
    pub start_s: f64,
    /// Term end, seconds.
    pub end_s: f64,
    /// ε in parts per million: the largest share of absent observations the SLA tolerates.
    pub epsilon_ppm: u32,
    /// Up to when rent has been accrued, seconds.
    pub accrued_to_s: f64,
    /// Rent accrued so far, wei.
    pub accrued_wei: u128,
    /// Observations that found the object resident.
    pub resident_observations: u64,
    /// Observations that found it absent (reports or missed deadlines).
    pub absent_observations: u64,
    /// Current state.
    pub state: RentState,
}

impl Rent {
    /// A rent order over `[start_s, end_s)`.
    pub fn new(
        id: impl Into<String>,
        object: PinObject,
        size_bytes: u64,
        rho_wei_per_gb_hour: u128,
        (start_s, end_s): (f64, f64),
        epsilon_ppm: u32,
    ) -> Result<Self> {
        if size_bytes == 0 {
            return Err(invalid("size_bytes", "must be > 0"));
        }
        if !(start_s.is_finite() && end_s.is_finite() && end_s > start_s) {
            return Err(invalid("end_s", "the term must end after it starts"));
        }
        if epsilon_ppm > 1_000_000 {
            return Err(invalid("epsilon_ppm", "must be at most 1000000"));
        }
        Ok(Self {
            id: id.into(),
            object,
            size_bytes,
            rho_wei_per_gb_hour,
            start_s,
            end_s,
            epsilon_ppm,
            accrued_to_s: start_s,
            accrued_wei: 0,
            resident_observations: 0,
            absent_observations: 0,
            state: RentState::Active,
        })
    }

    fn active(&self, event: &'static str) -> Result<()> {
        match self.state {
            RentState::Active => Ok(()),
            RentState::Ended { .. } => Err(Error::IllegalTransition {
                order: "rent",
                state: "ended".to_owned(),
                event,
            }),
        }
    }

    /// Accrues `ρ·|a|·dt` up to `now_s` (capped at the term's end); returns what was added.
    pub fn accrue(&mut self, now_s: f64) -> Result<u128> {
        self.active("accrue")?;
        let to = now_s.min(self.end_s);
        if to <= self.accrued_to_s {
            return Ok(0);
        }
        // Milliseconds keep the arithmetic integral; ρ is per 10⁹ B × 3.6·10⁶ ms.
        let dt_ms = ((to - self.accrued_to_s) * 1000.0).round() as u128;
        let added = pro_rata(
            self.rho_wei_per_gb_hour,
            u128::from(self.size_bytes) * dt_ms,
            1_000_000_000 * 3_600_000,
        );
        self.accrued_to_s = to;
        self.accrued_wei += added;
        Ok(added)
    }

    /// A residency observation: a provider report, or a missed deadline (`resident = false`).
    pub fn observe(&mut self, resident: bool) -> Result<()> {
        self.active("observe")?;
        if resident {
            self.resident_observations += 1;
        } else {
            self.absent_observations += 1;
        }
        Ok(())
    }

    /// Whether the SLA holds so far: absent share ≤ ε.
    pub fn sla_met(&self) -> bool {
        let total = self.resident_observations + self.absent_observations;
        total == 0
            || u128::from(self.absent_observations) * 1_000_000
                <= u128::from(self.epsilon_ppm) * u128::from(total)
    }

    /// Ends the term at or after its end: accrues the rest and settles the rebate — the absent
    /// share of the rent when the SLA was missed.
    pub fn end(&mut self, now_s: f64) -> Result<RentState> {
        self.active("end")?;
        if now_s < self.end_s {
            return Err(Error::IllegalTransition {
                order: "rent",
                state: "active (term not over)".to_owned(),
                event: "end",
            });
        }
        self.accrue(now_s)?;
        let total = self.resident_observations + self.absent_observations;
        let rebate_wei = if self.sla_met() {
            0
        } else {
            pro_rata(
                self.accrued_wei,
                u128::from(self.absent_observations),
                u128::from(total),
            )
        };
        self.state = RentState::Ended {
            paid_wei: self.accrued_wei,
            rebate_wei,
        };
        Ok(self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rent() -> Rent {
        // 2 GB at 1000 wei per GB-hour over one hour, ε = 1 %.
        Rent::new(
            "r",
            PinObject::Adapter("a".into()),
            2_000_000_000,
            1_000,
            (0.0, 3600.0),
            10_000,
        )
        .unwrap()
    }

    #[test]
    fn rent_accrues_rho_size_dt() {
        let mut r = rent();
        assert_eq!(r.accrue(1800.0).unwrap(), 1_000);
        assert_eq!(r.accrue(1800.0).unwrap(), 0);
        assert_eq!(
            r.accrue(99_999.0).unwrap(),
            1_000,
            "capped at the term's end"
        );
        assert_eq!(r.accrued_wei, 2_000);
    }

    #[test]
    fn met_sla_pays_no_rebate() {
        let mut r = rent();
        for _ in 0..100 {
            r.observe(true).unwrap();
        }
        r.observe(false).unwrap(); // 1 of 101 < 1 %
        assert_eq!(
            r.end(3600.0).unwrap(),
            RentState::Ended {
                paid_wei: 2_000,
                rebate_wei: 0
            }
        );
    }

    #[test]
    fn missed_sla_rebates_the_absent_share() {
        let mut r = rent();
        for i in 0..10 {
            r.observe(i % 5 != 0).unwrap(); // 2 of 10 absent: 20 % > 1 %
        }
        assert!(r.end(100.0).is_err(), "term not over");
        assert_eq!(
            r.end(3600.0).unwrap(),
            RentState::Ended {
                paid_wei: 2_000,
                rebate_wei: 400
            }
        );
        assert!(r.observe(true).is_err());
        assert!(r.accrue(4000.0).is_err());
    }
}
