//! Per-tenant preferences, live (SPEC §10): each account's one-bit sign delta over a shared
//! base quote table, learned from its own market orders and applied to their quotes.
//!
//! The table's layers are the market maker's regimes and its cells (model class × deadline
//! bucket) the catalog's models by θ, the job's work ÷ its deadline, in quarters
//! ([`cx_exchange::pricing::tenant::cell`]). A value is a log multiplier of the market's quote;
//! the shared base is 0 (the quote as the maker makes it). A tenant's delta holds one sign bit
//! per cell and a scale and a bias per layer ([`TenantDelta`]), ≈ 32× smaller than a float table
//! per tenant, and learns in that form: every market order of the tenant that clears moves its
//! cell toward `ln(chosen bundle's ask ÷ the shared quote's ask)` — the multiplier that would
//! just have sufficed — and every one refused only on price (some bundle would have taken it
//! at its ask) toward `ln(the cheapest such ask ÷ the shared ask)`. A tenant whose orders fill
//! below the quote comes to be quoted lower (its gate tightens to what it actually pays); one
//! refused on price comes to be quoted higher. No other tenant's quote moves.
//!
//! The exchange keeps them in memory (bounded: [`MAX_TENANTS`]) and writes the changed ones to
//! the books every sweep; they are read back at start.

use alloy::primitives::Address;
use cx_exchange::pricing::hmm::{REGIMES, Regime};
use cx_exchange::pricing::tenant::{BaseTable, DEADLINE_BUCKETS, DeltaParts, TenantDelta};
use std::collections::HashMap;

/// How far one observation moves a tenant's cell toward its target.
pub const LEARNING_RATE: f32 = 0.25;

/// Tenants kept in memory; past it, new tenants get the shared quote and learn nothing (the
/// books keep those already learned).
pub const MAX_TENANTS: usize = 100_000;

/// A multiplier is kept within e^±[`MAX_LOG_MULTIPLIER`] of the shared quote: a tenant's
/// preference tilts the market's price, it does not replace it.
pub const MAX_LOG_MULTIPLIER: f64 = 1.0;

#[derive(Debug, Clone)]
struct Tenant {
    delta: TenantDelta,
    observations: u64,
    dirty: bool,
}

/// Every tenant's preferences over one shared base table.
#[derive(Debug, Clone)]
pub struct Preferences {
    base: BaseTable,
    tenants: HashMap<Address, Tenant>,
}

/// One tenant's preference as the explorer shows it: per regime, the layer's bias and scale
/// (log multipliers) and how many of its orders taught it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PreferenceView {
    /// Per regime (calm, busy, surge): (bias, scale).
    pub layers: Vec<(String, f32, f32)>,
    /// Market orders it learned from.
    pub observations: u64,
    /// Bytes of tenant-specific state.
    pub bytes: usize,
}

impl Preferences {
    /// Preferences over `models` catalog models (every cell of the shared base at 0).
    pub fn new(models: usize) -> Self {
        let cells = models.max(1) * DEADLINE_BUCKETS;
        let base = BaseTable::new(REGIMES, cells, vec![0.0; REGIMES * cells])
            .expect("a non-empty table of zeros");
        Self {
            base,
            tenants: HashMap::new(),
        }
    }

    /// The log multiplier `account`'s quote gets in (`regime`, `cell`): 0 for a tenant with no
    /// preference yet.
    pub fn multiplier(&self, account: Address, regime: Regime, cell: usize) -> f64 {
        if cell >= self.base.cells() {
            return 0.0;
        }
        self.tenants.get(&account).map_or(0.0, |t| {
            f64::from(t.delta.value(&self.base, regime.index(), cell))
                .clamp(-MAX_LOG_MULTIPLIER, MAX_LOG_MULTIPLIER)
        })
    }

    /// Teaches `account`'s cell (`regime`, `cell`) one observation: `target` is the log
    /// multiplier of the shared quote that would just have sufficed.
    pub fn learn(&mut self, account: Address, regime: Regime, cell: usize, target: f64) {
        if cell >= self.base.cells() || !target.is_finite() {
            return;
        }
        if !self.tenants.contains_key(&account) && self.tenants.len() >= MAX_TENANTS {
            return;
        }
        let base = &self.base;
        let tenant = self.tenants.entry(account).or_insert_with(|| Tenant {
            delta: TenantDelta::neutral(base),
            observations: 0,
            dirty: false,
        });
        let target = target.clamp(-MAX_LOG_MULTIPLIER, MAX_LOG_MULTIPLIER) as f32;
        if tenant
            .delta
            .learn(base, regime.index(), cell, target, LEARNING_RATE)
            .is_ok()
        {
            tenant.observations += 1;
            tenant.dirty = true;
        }
    }

    /// The tenants changed since the last call, in storable form (their dirty marks cleared).
    pub fn take_changed(&mut self) -> Vec<(Address, DeltaParts, u64)> {
        self.tenants
            .iter_mut()
            .filter(|(_, t)| t.dirty)
            .map(|(a, t)| {
                t.dirty = false;
                (*a, t.delta.to_parts(), t.observations)
            })
            .collect()
    }

    /// Puts a tenant back from the books (a delta of another shape — the catalog changed — is
    /// dropped: the tenant starts over).
    pub fn restore(&mut self, account: Address, parts: &DeltaParts, observations: u64) {
        if self.tenants.len() >= MAX_TENANTS {
            return;
        }
        if let Ok(delta) = TenantDelta::from_parts(&self.base, parts) {
            self.tenants.insert(
                account,
                Tenant {
                    delta,
                    observations,
                    dirty: false,
                },
            );
        }
    }

    /// What the explorer shows of `account`'s preference.
    pub fn view(&self, account: Address) -> Option<PreferenceView> {
        let tenant = self.tenants.get(&account)?;
        Some(PreferenceView {
            layers: Regime::ALL
                .iter()
                .zip(tenant.delta.layers())
                .map(|(r, (scale, bias))| (r.to_string(), bias, scale))
                .collect(),
            observations: tenant.observations,
            bytes: tenant.delta.bytes(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_fills_move_its_multiplier_and_no_one_elses() {
        let mut p = Preferences::new(2);
        let (a, b) = (Address::repeat_byte(1), Address::repeat_byte(2));
        for _ in 0..20 {
            p.learn(a, Regime::Calm, 1, -0.2);
        }
        let m = p.multiplier(a, Regime::Calm, 1);
        assert!(m < -0.1, "{m}");
        assert_eq!(p.multiplier(b, Regime::Calm, 1), 0.0);
        // Refusals push the other way.
        for _ in 0..40 {
            p.learn(a, Regime::Calm, 1, 0.3);
        }
        assert!(p.multiplier(a, Regime::Calm, 1) > 0.1);
        let changed = p.take_changed();
        assert_eq!(changed.len(), 1);
        assert!(p.take_changed().is_empty());
        let mut q = Preferences::new(2);
        q.restore(a, &changed[0].1, changed[0].2);
        assert_eq!(
            q.multiplier(a, Regime::Calm, 1),
            p.multiplier(a, Regime::Calm, 1)
        );
        // Another catalog's shape does not restore.
        let mut other = Preferences::new(3);
        other.restore(a, &changed[0].1, 1);
        assert_eq!(other.multiplier(a, Regime::Calm, 1), 0.0);
        assert_eq!(p.view(a).unwrap().observations, 60);
    }
}
