//! A provider bundle as it is registered with the exchange (SPEC §2).

use crate::class::{ClassSet, Tier, TierSet};
use crate::error::{Error, Result, non_negative, nonzero, positive};
use serde::{Deserialize, Serialize};

/// Most bases one bundle names as fetchable.
pub const MAX_FETCHABLE_BASES: usize = 64;

/// `b = (d, M, B, β, α, ℓ0)` plus price, capabilities, throughput and failure history.
///
/// β and α are not fields: they depend on the job, and follow from `resident_bases` and
/// `resident_adapters`. `memory_bytes` is what is free *beside* what is resident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    /// Unique bundle id.
    pub id: String,
    /// The operator that runs it (T3 committees must be diverse in operators).
    #[serde(default)]
    pub provider: String,
    /// Device description, e.g. `H200`.
    #[serde(default)]
    pub device: String,
    /// p(b): the provider's ask, wei per compute-second ([`crate::price`]).
    #[serde(with = "crate::price::rate_string")]
    pub price_wei_per_s: u64,
    /// M: free accelerator memory in bytes.
    pub memory_bytes: u64,
    /// B: ingress bandwidth in bits per second.
    pub bandwidth_bps: f64,
    /// ℓ0: network round trip to buyers, seconds.
    pub rtt_s: f64,
    /// Measured throughput in FLOP/s, which turns a job's work into t_compute.
    pub flops_per_s: f64,
    /// c_max(d): longest context the device serves, tokens.
    pub context_max: u32,
    /// K(d): determinism classes honoured.
    pub determinism: ClassSet,
    /// The kernel corpus its class D runs on (e.g. `cx-cpu-det-v2`, cx-kernels' fixed-order CPU
    /// kernels): class D means the same output bytes as any other run *of the same corpus*, not
    /// of every kernel, so a class-D job's replicas are placed only on bundles naming the corpus
    /// of the job's own bundle. A bundle that honours D∞ or S only names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_corpus: Option<String>,
    /// T(b): verification tiers offered.
    pub tiers: TierSet,
    /// φ: observed failure rate in [0, 1].
    #[serde(default)]
    pub failure_rate: f64,
    /// Base models resident in accelerator memory.
    #[serde(default)]
    pub resident_bases: Vec<String>,
    /// The bases it can load when a job needs one it does not hold (β = 0: the job waits for
    /// the fetch, which t̂ counts), at most [`MAX_FETCHABLE_BASES`]. `None`: any base — SPEC §2's
    /// model, where every bundle can fetch every base's weights (simulations and `cx clear`
    /// files); a live provider names the ones its store holds and its memory can take, so a
    /// bundle that cannot load a base is never chosen for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetchable_bases: Option<Vec<String>>,
    /// The rate it loads a base at, bits per second, as its provider measured its own loads;
    /// `None`: `bandwidth_bps`. t̂ counts a base fetch at this rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_load_bps: Option<f64>,
    /// Adapters (content ids) resident in accelerator memory.
    #[serde(default)]
    pub resident_adapters: Vec<String>,
    /// Conversation prefixes ([`crate::prefix`] ids) whose KV cache it holds, as its provider's
    /// residency report says (the exchange fills it from the offer's `residency.prefixes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resident_prefixes: Vec<String>,
}

impl Bundle {
    /// Checks every field's domain; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        if self.id.is_empty() {
            return Err(Error::InvalidField {
                field: "id".to_owned(),
                reason: "must not be empty".to_owned(),
            });
        }
        nonzero("memory_bytes", self.memory_bytes)?;
        validate_link(self.bandwidth_bps, self.rtt_s, self.context_max)?;
        positive("flops_per_s", self.flops_per_s)?;
        crate::prefix::validate_ids("resident_prefixes", &self.resident_prefixes)?;
        if let Some(bases) = &self.fetchable_bases {
            if bases.len() > MAX_FETCHABLE_BASES {
                return Err(Error::InvalidField {
                    field: "fetchable_bases".to_owned(),
                    reason: format!("names {}; at most {MAX_FETCHABLE_BASES}", bases.len()),
                });
            }
            if let Some(i) = bases.iter().position(String::is_empty) {
                return Err(Error::InvalidField {
                    field: format!("fetchable_bases[{i}]"),
                    reason: "must not be empty".to_owned(),
                });
            }
        }
        if let Some(bps) = self.base_load_bps {
            positive("base_load_bps", bps)?;
        }
        validate_capabilities(self.determinism, self.tiers, self.failure_rate)
    }
}

/// Checks the link and context a bundle offers in any form (registered, or resolved for one job):
/// B > 0 bits/s, ℓ0 ≥ 0 s, c_max > 0 tokens.
pub fn validate_link(bandwidth_bps: f64, rtt_s: f64, context_max: u32) -> Result<()> {
    positive("bandwidth_bps", bandwidth_bps)?;
    non_negative("rtt_s", rtt_s)?;
    nonzero("context_max", u64::from(context_max))
}

/// Checks what every bundle form shares: some class, some tier, no attested tier, φ in [0, 1].
pub fn validate_capabilities(classes: ClassSet, tiers: TierSet, failure_rate: f64) -> Result<()> {
    if classes == ClassSet::EMPTY {
        return Err(Error::InvalidField {
            field: "determinism".to_owned(),
            reason: "must name at least one class (D, D_inf, S)".to_owned(),
        });
    }
    if tiers == TierSet::EMPTY {
        return Err(Error::InvalidField {
            field: "tiers".to_owned(),
            reason: "must name at least one tier (T0–T3)".to_owned(),
        });
    }
    if tiers.contains(Tier::Attested) {
        return Err(Error::AttestedUnavailable {
            field: "tiers".to_owned(),
        });
    }
    if !(0.0..=1.0).contains(&failure_rate) {
        return Err(Error::InvalidField {
            field: "failure_rate".to_owned(),
            reason: format!("must be within [0, 1], got {failure_rate}"),
        });
    }
    Ok(())
}
