//! Train orders on the exchange ([`cx_protocol::train`]): the job a train intent is cleared as,
//! and the check of what a provider says it trained before the job is `done`.
//!
//! Pricing follows the usual rule for training a network with `N` parameters: a step costs about
//! three forward passes, `6·N` FLOPs per token (the provider's `bench train` measures the ratio),
//! over every token the schedule trains on ([`TrainRequest::tokens`]). Memory is the widest
//! step's activations, estimated as [`ACTIVATION_KV_FACTOR`] times the catalog's KV bytes per
//! position (the exchange knows no hidden sizes; the provider's own residency budget is the
//! exact check, and a job it cannot hold is released: re-cleared elsewhere or refunded).
//!
//! A trained adapter is T0 work (the provider is trusted, and staked): the check at the result
//! is that the adapter the receipt names is in the store and is the LoRA the buyer signed for —
//! its config's rank, alpha, rsLoRA, target modules and base — so the buyer's next intents can
//! name it.

use super::{Placing, Produced, WorkloadOrder};
use crate::error::{Error, Result, invalid};
use crate::intake::state::Intake;
use crate::jobs::placement::{Placed, Want};
use alloy::primitives::{Address, B256};
use cx_exchange::routing::catalog::Shape;
use cx_protocol::train::{Dataset, TrainRequest, train_market, trained_base};
use cx_protocol::wire::{Assignment, Output};
use cx_protocol::{DeterminismClass, Job, Tier};

/// Activation bytes a training position holds, in KV-cache positions: backprop keeps every
/// layer's inputs, attention and MLP activations and the logits, in `f32` with autograd's
/// copies — tens of times a position's keys and values (the provider's own count for the tiny
/// model is ~45 KB a position against 1 KB of KV). An estimate: the provider's budget is the
/// exact check, and a job it cannot hold is released at once (re-cleared or refunded).
pub const ACTIVATION_KV_FACTOR: u64 = 64;

/// FLOPs per parameter and token of one training step (forward 2, backward 4).
pub const TRAIN_FLOPS_PER_PARAMETER_TOKEN: f64 = 6.0;

impl WorkloadOrder for TrainRequest {
    const RETURNS: &'static [&'static str] = &["trained"];
    /// The adapter the result names, and the base it must be trained on.
    type Then = (String, String);

    /// The base from the catalog, the dataset from the store (an id the store lacks is
    /// refused), the job [`job`] prices, and the clearing over the bundles that train on the
    /// base.
    async fn place(&self, intake: &Intake, want: &Want, placing: Placing) -> Result<Placed> {
        let named = base_of(want)?;
        let model = intake
            .market()
            .catalog()
            .resolve(named)
            .map_err(|_| Error::UnknownModel(named.to_owned()))?;
        let shape = model
            .shape
            .ok_or_else(|| Error::NotClearable(model.name.clone()))?;
        self.validate().map_err(|e| e.within("train"))?;
        let data = dataset(intake, self).await?;
        let job = job(
            want,
            self,
            &data,
            &model.name,
            &shape,
            placing.account,
            placing.now_s,
        )?;
        intake.clear_placed(job, want, &[])
    }

    /// The output hash it must carry (the adapter id's bytes), the tokens the order's
    /// schedule trains on (from the stored dataset), and the adapter to check.
    async fn produced(
        &self,
        intake: &Intake,
        job: &Assignment,
        output: &Output,
    ) -> Result<Produced<Self::Then>> {
        let invalid = |field: &'static str, reason: String| Error::InvalidOutput { field, reason };
        let trained = output.trained.as_ref().ok_or_else(|| {
            invalid(
                "trained",
                "is missing: a training job returns its adapter's id".into(),
            )
        })?;
        let base = trained_base(&job.model).ok_or_else(|| Error::Corrupt {
            what: "a training job's market",
            value: job.model.clone(),
        })?;
        if trained.steps != self.steps {
            return Err(invalid(
                "trained.steps",
                format!("is {}, the order asked {}", trained.steps, self.steps),
            ));
        }
        let output_hash = trained.output_hash()?;
        let tokens = self.tokens(&dataset(intake, self).await?);
        Ok(Produced {
            output_hash,
            hashed: "the trained adapter's content id",
            tokens,
            tokens_are: "the tokens the order's schedule trains on",
            then: (trained.adapter_id.clone(), base.to_owned()),
        })
    }

    /// The adapter the receipt names must be in the store, and be the LoRA the buyer signed
    /// for: else the buyer could not use what it paid for.
    async fn confirm(
        &self,
        intake: &Intake,
        _: B256,
        _: &crate::books::Provider,
        (adapter_id, base): Self::Then,
        _: u64,
    ) -> Result<Option<serde_json::Value>> {
        let stored =
            intake
                .books()
                .adapter(&adapter_id)
                .await?
                .ok_or_else(|| Error::InvalidOutput {
                    field: "trained.adapter_id",
                    reason: "names no adapter in this exchange's store: PUT it to /v1/adapters \
                         before the result"
                        .into(),
                })?;
        check_trained(&stored.config, self, &base)?;
        Ok(None)
    }
}

/// The stored dataset `request` trains on (an id the store lacks is refused).
async fn dataset(intake: &Intake, request: &TrainRequest) -> Result<Dataset> {
    let bytes = intake
        .books()
        .dataset(&request.data)
        .await?
        .ok_or(Error::UnknownDataset)?;
    Dataset::parse(&bytes).map_err(|e| e.within("train.data").into())
}

/// The base a train intent's `want` names (`cx/train/<base>`), or the refusal naming `want`.
pub fn base_of(want: &Want) -> Result<&str> {
    trained_base(&want.model).ok_or_else(|| {
        invalid(
            "want",
            format!(
                "a train order is placed in the training market of its base: {}",
                train_market("<base>")
            ),
        )
    })
}

/// The job a train intent is cleared as, at `now_s`: the `cx/train/<base>` market (only bundles
/// that train on the base take it), T0, class S, `6·N` FLOPs per trained token, the widest
/// step's activations as its memory. `base` is the catalog name the market names and `shape`
/// its shape. Refuses, by field, another tier or class, an adapter, and a passed deadline.
pub fn job(
    want: &Want,
    request: &TrainRequest,
    data: &Dataset,
    base: &str,
    shape: &Shape,
    account: Address,
    now_s: u64,
) -> Result<Job> {
    request.validate().map_err(|e| e.within("train"))?;
    if want.min_tier != Tier::T0 {
        return Err(invalid(
            "min_tier",
            "a trained adapter is not re-executed or checked by any tier yet: set min_tier to T0",
        ));
    }
    if want.determinism != DeterminismClass::S {
        return Err(invalid(
            "determinism",
            "a trained adapter is not bit-reproducible across providers: set determinism to S",
        ));
    }
    if want.adapter_id.is_some() {
        return Err(invalid(
            "adapter_id",
            "a train order starts a new adapter on the base (none goes in)",
        ));
    }
    want.check_deadline(now_s)?;
    let (sequences, longest) = request.widest_step(data);
    let positions = (sequences * longest) as u64;
    let activations = shape
        .kv_bytes_per_token
        .saturating_mul(ACTIVATION_KV_FACTOR)
        .saturating_mul(positions);
    let tokens = request.tokens(data);
    Ok(Job {
        agent: account.to_string(),
        base_model: train_market(base),
        adapter: None,
        base_bytes: shape.base_bytes,
        adapter_bytes: 0,
        kv_bytes: activations,
        context_tokens: u32::try_from(longest).map_err(|_| Error::ContextTooLarge)?,
        deadline_s: (want.deadline_s - now_s) as f64,
        determinism: DeterminismClass::S,
        tier: Tier::T0,
        compute_flops: TRAIN_FLOPS_PER_PARAMETER_TOKEN * shape.parameters as f64 * tokens as f64,
        value_wei: want.max_price_wei,
        max_price_wei: Some(want.max_price_wei),
        // Training continues no conversation.
        prefix: None,
    })
}

/// Checks that `adapter_config` (the stored `adapter_config.json` of the adapter a result
/// names) is the LoRA `request` ordered on `base`: PEFT's `r`, `lora_alpha`, `use_rslora`,
/// `target_modules` (as a set) and `base_model_name_or_path`. The error names the config field.
pub fn check_trained(adapter_config: &[u8], request: &TrainRequest, base: &str) -> Result<()> {
    let wrong = |field: &str, reason: String| Error::InvalidOutput {
        field: "trained.adapter_id",
        reason: format!("the stored adapter's {field} {reason}"),
    };
    let config: serde_json::Value = serde_json::from_slice(adapter_config)
        .map_err(|e| wrong("adapter_config.json", format!("is not JSON: {e}")))?;
    let lora = &request.lora;
    if config["r"].as_u64() != Some(u64::from(lora.rank)) {
        return Err(wrong("r", format!("is {}, not {}", config["r"], lora.rank)));
    }
    if config["lora_alpha"].as_f64() != Some(lora.lora_alpha) {
        return Err(wrong(
            "lora_alpha",
            format!("is {}, not {}", config["lora_alpha"], lora.lora_alpha),
        ));
    }
    if config["use_rslora"].as_bool().unwrap_or(false) != lora.use_rslora {
        return Err(wrong(
            "use_rslora",
            format!("is {}, not {}", config["use_rslora"], lora.use_rslora),
        ));
    }
    let mut stored: Vec<&str> = config["target_modules"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    let mut ordered: Vec<&str> = lora.target_modules.iter().map(String::as_str).collect();
    stored.sort_unstable();
    ordered.sort_unstable();
    if stored != ordered {
        return Err(wrong(
            "target_modules",
            format!("are {stored:?}, not {ordered:?}"),
        ));
    }
    if config["base_model_name_or_path"].as_str() != Some(base) {
        return Err(wrong(
            "base_model_name_or_path",
            format!("is {}, not {base:?}", config["base_model_name_or_path"]),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want() -> Want {
        Want {
            model: train_market("tiny-llama"),
            adapter_id: None,
            deadline_s: 1_000,
            max_price_wei: 10_000,
            min_tier: Tier::T0,
            determinism: DeterminismClass::S,
            market_limit: false,
            route: None,
            min_quality: 0.0,
        }
    }

    fn data() -> Dataset {
        Dataset {
            sequences: vec![vec![256, 97, 65]; 4],
            loss_mask: vec![vec![0.0, 0.0, 1.0]; 4],
        }
    }

    fn shape() -> Shape {
        Shape {
            base_bytes: 540_000,
            parameters: 135_000,
            kv_bytes_per_token: 1024,
        }
    }

    #[test]
    fn a_train_job_is_priced_on_the_tokens_it_trains() {
        let mut request = TrainRequest::example(&"ab".repeat(32));
        request.steps = 10;
        request.batch_size = 2;
        let job = job(
            &want(),
            &request,
            &data(),
            "tiny-llama",
            &shape(),
            Address::ZERO,
            900,
        )
        .unwrap();
        assert_eq!(job.base_model, "cx/train/tiny-llama");
        assert!(job.needs_resident_base());
        // 10 steps × 2 sequences × 3 tokens, 6 FLOPs per parameter and token.
        assert_eq!(job.compute_flops, 6.0 * 135_000.0 * 60.0);
        assert_eq!(job.kv_bytes, 1024 * 64 * 2 * 3);
        assert_eq!(job.context_tokens, 3);
        assert_eq!(job.deadline_s, 100.0);
    }

    #[test]
    fn tiers_classes_adapters_and_late_deadlines_are_refused_by_field() {
        let request = TrainRequest::example(&"ab".repeat(32));
        let field_of = |e: Error| match e {
            Error::Protocol(p) => p.field().to_owned(),
            other => panic!("not a field's refusal: {other}"),
        };
        let refused = |w: Want, now: u64| {
            field_of(
                job(
                    &w,
                    &request,
                    &data(),
                    "tiny-llama",
                    &shape(),
                    Address::ZERO,
                    now,
                )
                .unwrap_err(),
            )
        };
        let field = |f: &str| f.to_owned();
        assert_eq!(
            refused(
                Want {
                    min_tier: Tier::T1,
                    ..want()
                },
                0
            ),
            field("min_tier")
        );
        assert_eq!(
            refused(
                Want {
                    determinism: DeterminismClass::D,
                    ..want()
                },
                0
            ),
            field("determinism")
        );
        assert_eq!(
            refused(
                Want {
                    adapter_id: Some(alloy::primitives::B256::ZERO),
                    ..want()
                },
                0
            ),
            field("adapter_id")
        );
        assert_eq!(refused(want(), 1_000), field("deadline_s"));
        let mut bad = request.clone();
        bad.steps = 0;
        let err = job(
            &want(),
            &bad,
            &data(),
            "tiny-llama",
            &shape(),
            Address::ZERO,
            0,
        )
        .unwrap_err();
        assert_eq!(field_of(err), "train.steps");
    }

    #[test]
    fn the_stored_adapter_must_be_the_lora_ordered() {
        let request = TrainRequest::example(&"ab".repeat(32));
        let config = |r: u32, base: &str| {
            serde_json::to_vec(&serde_json::json!({
                "r": r, "lora_alpha": 16, "use_rslora": false, "base_model_name_or_path": base,
                "target_modules": ["v_proj", "q_proj", "k_proj", "o_proj", "gate_proj",
                                   "up_proj", "down_proj"],
            }))
            .unwrap()
        };
        check_trained(&config(8, "tiny-llama"), &request, "tiny-llama").unwrap();
        for (bytes, what) in [
            (config(4, "tiny-llama"), "r"),
            (config(8, "other"), "base_model_name_or_path"),
            (b"nope".to_vec(), "adapter_config.json"),
        ] {
            let err = check_trained(&bytes, &request, "tiny-llama").unwrap_err();
            assert!(err.to_string().contains(what), "{err}");
        }
    }
}
