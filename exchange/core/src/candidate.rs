//! A bundle as one job sees it: residency resolved (β, α, π) and t_compute estimated.
//!
//! `cx clear` reads candidates directly; the engine derives them from registered bundles.

use cx_protocol::bundle::{validate_capabilities, validate_link};
use cx_protocol::error::{non_negative, nonzero};
use cx_protocol::{ClassSet, TierSet, price};

/// A bundle with the job-dependent quantities already resolved: its id and what clearing reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Bundle id.
    pub id: String,
    /// The numbers feasibility and the objective read.
    pub view: View,
}

/// What feasibility and the objective read of a bundle for one job: copyable, no strings, cheap
/// to build on the clearing hot path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// p(b): the ask, wei per compute-second.
    pub price_wei_per_s: u64,
    /// M: free accelerator memory, bytes.
    pub memory_bytes: u64,
    /// B: ingress bandwidth, bits per second.
    pub bandwidth_bps: f64,
    /// β: the job's base model is resident.
    pub base_resident: bool,
    /// Whether it can load the job's base when not resident (a live provider names the bases
    /// its store holds; a job whose base has no weights to fetch, a kernel market, never is).
    pub base_fetchable: bool,
    /// The rate a base loads at, bits per second (the provider's measured loads, else B).
    pub base_load_bps: f64,
    /// α: the job's adapter is resident.
    pub adapter_resident: bool,
    /// ℓ0: round trip to the buyer, seconds.
    pub rtt_s: f64,
    /// π: the bundle holds the conversation prefix the job continues (false when the job
    /// continues none). A holder's `compute_s` already leaves the prefix's prefill out.
    pub prefix_resident: bool,
    /// t_compute for this job on this bundle, seconds.
    pub compute_s: f64,
    /// Work already queued on the bundle ahead of this job, seconds at its throughput (what
    /// the exchange assigned it and has not seen done): a busy holder is as late as its queue.
    pub queue_s: f64,
    /// c_max(d), tokens.
    pub context_max: u32,
    /// K(d).
    pub determinism: ClassSet,
    /// T(b).
    pub tiers: TierSet,
    /// φ in [0, 1].
    pub failure_rate: f64,
}

impl View {
    /// Checks every field's domain; the error names the first bad field.
    pub fn validate(&self) -> cx_protocol::Result<()> {
        nonzero("memory_bytes", self.memory_bytes)?;
        validate_link(self.bandwidth_bps, self.rtt_s, self.context_max)?;
        cx_protocol::error::positive("base_load_bps", self.base_load_bps)?;
        non_negative("compute_s", self.compute_s)?;
        non_negative("queue_s", self.queue_s)?;
        validate_capabilities(self.determinism, self.tiers, self.failure_rate)
    }

    /// p(b) in whole units of the asset per compute-second: the objective's float unit.
    pub fn price_units_per_s(&self) -> f64 {
        price::to_units(self.price_wei_per_s)
    }
}
