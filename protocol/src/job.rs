//! A job as the exchange clears it: `j = (m, c, Δ, κ, τ, V)` (SPEC §2).

use crate::class::{DeterminismClass, Tier};
use crate::error::{Error, Result, non_negative, nonzero, positive};
use serde::{Deserialize, Serialize};

/// Model names under this prefix are job kinds the exchange defines (such as
/// [`crate::matmul::MATMUL_MODEL`]), not catalog models: there are no weights to fetch, so only a
/// bundle that lists the name among its resident bases can run one.
pub const KERNEL_MARKET_PREFIX: &str = "cx/";

/// One unit of inference work to place on a bundle.
///
/// Sizes are bytes, times seconds, work floating-point operations. The model `m` is the base id
/// plus an optional adapter id; `base_bytes` and `adapter_bytes` are their sizes |w_m| and |a|,
/// and `kv_bytes` the KV cache the context needs, |kv(c)|.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Buyer account (or agent id); the affinity key that routes an agent back to its provider.
    #[serde(default)]
    pub agent: String,
    /// Base model id (the m of SPEC §2 without its adapter).
    #[serde(default)]
    pub base_model: String,
    /// Adapter id (content hash), if the job runs with one.
    #[serde(default)]
    pub adapter: Option<String>,
    /// |w_m|: bytes of the base weights.
    pub base_bytes: u64,
    /// |a|: bytes of the adapter (0 when there is none).
    #[serde(default)]
    pub adapter_bytes: u64,
    /// |kv(c)|: bytes of KV cache the context needs.
    #[serde(default)]
    pub kv_bytes: u64,
    /// c: context size in tokens (input + maximum output).
    pub context_tokens: u32,
    /// Δ: seconds from submission by which the result must be back.
    pub deadline_s: f64,
    /// κ: the determinism class the buyer needs.
    pub determinism: DeterminismClass,
    /// τ: the verification tier the buyer requires.
    pub tier: Tier,
    /// Work of the job in FLOPs, from which a bundle's `flops_per_s` estimates t_compute.
    #[serde(default)]
    pub compute_flops: f64,
    /// V: value at risk, in wei.
    #[serde(default, with = "crate::price::wei_string")]
    pub value_wei: u128,
    /// The most the buyer pays for the whole job, in wei (an intent's `max_price_wei`); a bundle
    /// whose charge for the job ([`crate::price::charge_wei`]) is more is not eligible.
    #[serde(default, with = "crate::price::wei_string_opt")]
    pub max_price_wei: Option<u128>,
    /// The conversation prefix the job continues, if any (SPEC §4): a bundle holding it skips
    /// the prefix's prefill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixNeed>,
}

/// The conversation prefix a job continues: its id ([`crate::prefix`]) and the work a bundle
/// holding its KV cache does not redo.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixNeed {
    /// The prefix id ([`crate::prefix::continued_prefix_id`]).
    pub id: String,
    /// FLOPs of the prefix's prefill: what a hit saves of `compute_flops` (at most all of it).
    pub flops: f64,
}

impl Job {
    /// Checks every field's domain; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        nonzero("base_bytes", self.base_bytes)?;
        if self.adapter.is_some() {
            nonzero("adapter_bytes", self.adapter_bytes)?;
        }
        nonzero("context_tokens", u64::from(self.context_tokens))?;
        positive("deadline_s", self.deadline_s)?;
        non_negative("compute_flops", self.compute_flops)?;
        if let Some(prefix) = &self.prefix {
            non_negative("prefix.flops", prefix.flops)?;
            if prefix.flops > self.compute_flops {
                return Err(Error::InvalidField {
                    field: "prefix.flops".to_owned(),
                    reason: format!(
                        "{} is more than the job's compute_flops {}",
                        prefix.flops, self.compute_flops
                    ),
                });
            }
        }
        if self.max_price_wei == Some(0) {
            return Err(Error::InvalidField {
                field: "max_price_wei".to_owned(),
                reason: "must be > 0 (a limit of zero buys nothing; omit it for no limit)"
                    .to_owned(),
            });
        }
        if self.tier == Tier::Attested {
            return Err(Error::AttestedUnavailable {
                field: "tier".to_owned(),
            });
        }
        Ok(())
    }

    /// Whether the job carries an adapter that must be present for it to run.
    pub fn needs_adapter(&self) -> bool {
        self.adapter.is_some() || self.adapter_bytes > 0
    }

    /// Whether only a bundle holding the job's base can take it: a kernel market (a name under
    /// [`KERNEL_MARKET_PREFIX`]) has no weights any other bundle could load.
    pub fn needs_resident_base(&self) -> bool {
        self.base_model.starts_with(KERNEL_MARKET_PREFIX)
    }

    /// The key consistent hashing uses to send this job where its agent went before.
    pub fn affinity_key(&self) -> &str {
        if !self.agent.is_empty() {
            &self.agent
        } else if let Some(adapter) = &self.adapter {
            adapter
        } else {
            &self.base_model
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        serde_json::from_str(
            r#"{"base_bytes": 1000, "context_tokens": 10, "deadline_s": 1,
                "determinism": "S", "tier": "T0"}"#,
        )
        .unwrap()
    }

    #[test]
    fn validation_names_the_field() {
        let mut j = job();
        j.validate().unwrap();
        j.deadline_s = f64::NAN;
        assert_eq!(j.validate().unwrap_err().field(), "deadline_s");
        j.deadline_s = -1.0;
        assert_eq!(j.validate().unwrap_err().field(), "deadline_s");
        let mut j = job();
        j.base_bytes = 0;
        assert_eq!(j.validate().unwrap_err().field(), "base_bytes");
        let mut j = job();
        j.tier = Tier::Attested;
        assert!(matches!(
            j.validate(),
            Err(Error::AttestedUnavailable { .. })
        ));
        let mut j = job();
        j.max_price_wei = Some(0);
        assert_eq!(j.validate().unwrap_err().field(), "max_price_wei");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<Job>(
            r#"{"base_bytes": 1, "context_tokens": 1, "deadline_s": 1,
                "determinism": "S", "tier": "T0", "deadline": 5}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("unknown field `deadline`"),
            "{err}"
        );
    }
}
