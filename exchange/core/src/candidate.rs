//! A bundle as one job sees it: residency resolved (β, α) and t_compute estimated.
//!
//! `cx clear` reads candidates directly; the engine derives them from registered bundles.

use cx_protocol::bundle::{Offer, validate_capabilities, validate_offer};
use cx_protocol::error::non_negative;
use cx_protocol::{ClassSet, TierSet};
use serde::{Deserialize, Serialize};

/// A bundle with the job-dependent quantities already resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// Bundle id.
    pub id: String,
    /// p(b) in price units per hour.
    pub price_per_hour: f64,
    /// M: free accelerator memory, bytes.
    pub memory_bytes: u64,
    /// B: ingress bandwidth, bits per second.
    pub bandwidth_bps: f64,
    /// β: the job's base model is resident.
    pub base_resident: bool,
    /// α: the job's adapter is resident.
    pub adapter_resident: bool,
    /// ℓ0: round trip to the buyer, seconds.
    pub rtt_s: f64,
    /// t_compute for this job on this bundle, seconds.
    pub compute_s: f64,
    /// c_max(d), tokens.
    pub context_max: u32,
    /// K(d).
    pub determinism: ClassSet,
    /// T(b).
    pub tiers: TierSet,
    /// φ in [0, 1].
    #[serde(default)]
    pub failure_rate: f64,
}

impl Candidate {
    /// Checks every field's domain; the error names the first bad field.
    pub fn validate(&self) -> cx_protocol::Result<()> {
        validate_offer(&Offer {
            id: &self.id,
            price_per_hour: self.price_per_hour,
            memory_bytes: self.memory_bytes,
            bandwidth_bps: self.bandwidth_bps,
            rtt_s: self.rtt_s,
            context_max: self.context_max,
        })?;
        non_negative("compute_s", self.compute_s)?;
        validate_capabilities(self.determinism, self.tiers, self.failure_rate)
    }

    /// The copyable numbers feasibility and the objective read.
    pub fn view(&self) -> View {
        View {
            price_per_s: self.price_per_hour / 3600.0,
            memory_bytes: self.memory_bytes,
            bandwidth_bps: self.bandwidth_bps,
            base_resident: self.base_resident,
            adapter_resident: self.adapter_resident,
            rtt_s: self.rtt_s,
            compute_s: self.compute_s,
            context_max: self.context_max,
            determinism: self.determinism,
            tiers: self.tiers,
            failure_rate: self.failure_rate,
        }
    }
}

/// The numbers of a [`Candidate`] without its id, cheap to build on the clearing hot path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// p(b) per second of compute.
    pub price_per_s: f64,
    /// M, bytes.
    pub memory_bytes: u64,
    /// B, bits per second.
    pub bandwidth_bps: f64,
    /// β.
    pub base_resident: bool,
    /// α.
    pub adapter_resident: bool,
    /// ℓ0, seconds.
    pub rtt_s: f64,
    /// t_compute, seconds.
    pub compute_s: f64,
    /// c_max(d), tokens.
    pub context_max: u32,
    /// K(d).
    pub determinism: ClassSet,
    /// T(b).
    pub tiers: TierSet,
    /// φ.
    pub failure_rate: f64,
}
