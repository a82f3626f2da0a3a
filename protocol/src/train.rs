//! Fine-tuning as an order (SPEC §3, **Train**): a buyer orders a LoRA adapter trained on a base
//! a provider holds, on data it stored at the exchange by content id; the job settles with a
//! receipt naming the trained adapter's content id, and the adapter is at once in the exchange's
//! store and resident on the provider that trained it.
//!
//! - **Market.** A train order is an intent whose `want` is [`train_market`]`(base)`
//!   (`cx/train/<base>`, a name under [`crate::job::KERNEL_MARKET_PREFIX`]): only a bundle that
//!   lists that name among its resident bases (a provider holding the base and training on it)
//!   takes it, so a base is never fetched for training.
//! - **Request.** [`TrainRequest`] is sent beside the signed intent (the `train` field of
//!   `POST /v1/intents`) and hashed into its `request_hash` ([`TrainRequest::hash`]): the data's
//!   content id, the steps and sequences per step, the LoRA (rank, alpha, target modules, rsLoRA,
//!   seed) and AdamW's settings. The signature binds every one of them.
//! - **Data.** A [`Dataset`] is the JSON `{"sequences": [[token, …], …], "loss_mask": [[w, …],
//!   …]}` that `forward_backward` takes, stored by its bytes' content id ([`dataset_id`]);
//!   `loss_mask[i][k]` weights the prediction of token `k` of sequence `i` from the tokens before
//!   it, so entry 0 must be 0.
//! - **Schedule.** Step `s` (from 0) trains on sequences `(s·b + j) mod n` for `j < b`
//!   ([`TrainRequest::batch`]; `b` the request's `batch_size`, `n` the data's sequences): one
//!   `forward_backward` over them, then one AdamW step. Both sides derive the tokens a job
//!   trains on ([`TrainRequest::tokens`]) from it: the receipt's `tokens`.
//! - **Result.** The provider stores the trained adapter at the exchange (`PUT /v1/adapters`)
//!   and returns [`Trained`]; the receipt's `output_hash` is the adapter's content id (32 bytes),
//!   its `adapter_hash` zero (no adapter goes in), its class S (a trained adapter is not
//!   bit-reproducible across providers).
//!
//! ```
//! use cx_protocol::train::{Dataset, TrainRequest, train_market};
//!
//! let data = Dataset {
//!     sequences: vec![vec![256, 97, 65], vec![256, 98, 72]],
//!     loss_mask: vec![vec![0.0, 0.0, 1.0], vec![0.0, 0.0, 1.0]],
//! };
//! data.validate().unwrap();
//! let mut request = TrainRequest::example(&"ab".repeat(32));
//! request.steps = 3;
//! request.batch_size = 1;
//! request.validate().unwrap();
//! // Step 0 trains sequence 0, step 1 sequence 1, step 2 sequence 0 again: 9 tokens.
//! assert_eq!(request.batch(1, 2).collect::<Vec<_>>(), vec![1]);
//! assert_eq!(request.tokens(&data), 9);
//! assert_eq!(train_market("tiny-llama"), "cx/train/tiny-llama");
//! ```

use crate::error::{Error, Result};
use crate::model_config::Projection;
use crate::order::B256;
use serde::{Deserialize, Serialize};

/// The prefix of training markets: `cx/train/<base>`.
pub const TRAIN_MARKET_PREFIX: &str = "cx/train/";

/// Most optimizer steps one order may ask for.
pub const MAX_TRAIN_STEPS: u32 = 10_000;

/// Most sequences one step trains on.
pub const MAX_BATCH_SIZE: u32 = 256;

/// Highest LoRA rank an order may ask for (a provider may allow less: its `--max-lora-rank`).
pub const MAX_TRAIN_RANK: u32 = 256;

/// Most sequences a dataset holds.
pub const MAX_DATASET_SEQUENCES: usize = 100_000;

/// Most tokens a dataset holds, over all its sequences.
pub const MAX_DATASET_TOKENS: usize = 4 << 20;

/// Largest dataset file, bytes.
pub const MAX_DATASET_BYTES: usize = 32 << 20;

/// The training market of `base`.
pub fn train_market(base: &str) -> String {
    format!("{TRAIN_MARKET_PREFIX}{base}")
}

/// The base a training market trains on, if `market` is one.
pub fn trained_base(market: &str) -> Option<&str> {
    market
        .strip_prefix(TRAIN_MARKET_PREFIX)
        .filter(|b| !b.is_empty())
}

fn invalid(field: &str, reason: impl Into<String>) -> Error {
    Error::InvalidField {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// The LoRA to train (PEFT's `LoraConfig` fields that change what is computed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TrainLora {
    /// Rank `r`.
    pub rank: u32,
    /// `alpha`: the scale is `alpha / r` (`alpha / √r` with rsLoRA).
    pub lora_alpha: f64,
    /// Adapted projections, PEFT's names (`q_proj`, …, `down_proj`).
    pub target_modules: Vec<String>,
    /// rsLoRA.
    pub use_rslora: bool,
    /// Seed of `A`'s initialisation (`B` starts at zero, as PEFT does).
    pub seed: u64,
}

/// AdamW's settings, applied at every step (PyTorch's `torch.optim.AdamW`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TrainOptimizer {
    /// Learning rate.
    pub lr: f64,
    /// `β₁`, `β₂`.
    pub betas: [f64; 2],
    /// `ε`.
    pub eps: f64,
    /// Decoupled weight decay `λ`.
    pub weight_decay: f64,
    /// Clip the gradients' global L2 norm to this first (absent: no clipping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_grad_norm: Option<f64>,
}

/// A training job: what to train on, how long, and what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TrainRequest {
    /// The dataset's content id ([`dataset_id`]), 64 hex digits.
    pub data: String,
    /// Optimizer steps.
    pub steps: u32,
    /// Sequences per step (cycled through the data in order).
    pub batch_size: u32,
    /// The LoRA.
    pub lora: TrainLora,
    /// AdamW.
    pub optimizer: TrainOptimizer,
}

/// The first AdamW setting out of range, as (field, reason): lr > 0, each β in [0, 1), ε > 0,
/// λ ≥ 0, a clipping norm > 0, all finite. The one rule for the exchange's intake and the
/// provider's `optim_step`.
pub fn check_optimizer(
    lr: f64,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
    max_grad_norm: Option<f64>,
) -> Option<(&'static str, String)> {
    if !(lr.is_finite() && lr > 0.0) {
        return Some(("lr", format!("lr must be a positive number, got {lr}")));
    }
    if let Some(b) = betas
        .into_iter()
        .find(|b| !(b.is_finite() && (0.0..1.0).contains(b)))
    {
        return Some(("betas", format!("each beta must be in [0, 1), got {b}")));
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Some(("eps", format!("eps must be positive, got {eps}")));
    }
    if !(weight_decay.is_finite() && weight_decay >= 0.0) {
        return Some((
            "weight_decay",
            format!("weight_decay must be ≥ 0, got {weight_decay}"),
        ));
    }
    if let Some(n) = max_grad_norm
        && !(n.is_finite() && n > 0.0)
    {
        return Some((
            "max_grad_norm",
            format!("max_grad_norm must be positive, got {n}"),
        ));
    }
    None
}

/// The first LoRA setting out of range, as (field, reason): `1 ≤ rank ≤ max_rank`, a finite
/// scale of moderate size, at least one target. The one rule for the exchange's intake and the
/// provider's training clients.
pub fn check_lora(
    rank: u64,
    lora_alpha: f64,
    use_rslora: bool,
    targets: usize,
    max_rank: u64,
) -> Option<(&'static str, String)> {
    if rank == 0 || rank > max_rank {
        return Some((
            "rank",
            format!("rank must be in 1..={max_rank}, got {rank}"),
        ));
    }
    let scale = if use_rslora {
        lora_alpha / (rank as f64).sqrt()
    } else {
        lora_alpha / rank as f64
    };
    if !(lora_alpha.is_finite() && scale.is_finite() && scale.abs() < 1e30) {
        return Some((
            "lora_alpha",
            format!("lora_alpha must be a finite number of moderate size, got {lora_alpha}"),
        ));
    }
    if targets == 0 {
        return Some((
            "target_modules",
            format!("target_modules needs at least one of {}", Projection::NAMES),
        ));
    }
    None
}

impl TrainLora {
    /// The target modules as projections, each named once; the error names `target_modules`.
    pub fn projections(&self) -> Result<Vec<Projection>> {
        let mut out = Vec::new();
        for name in &self.target_modules {
            let p = Projection::from_name(name).ok_or_else(|| {
                invalid(
                    "target_modules",
                    format!("`{name}` is not one of {}", Projection::NAMES),
                )
            })?;
            if out.contains(&p) {
                return Err(invalid(
                    "target_modules",
                    format!("`{name}` is named twice"),
                ));
            }
            out.push(p);
        }
        Ok(out)
    }
}

impl TrainRequest {
    /// A request with common settings on dataset `data` (rank 8, alpha 16, every projection,
    /// 30 steps of 16 sequences, lr 2e-2, no weight decay, clipping at 10): for examples and
    /// tests.
    pub fn example(data: &str) -> Self {
        Self {
            data: data.to_owned(),
            steps: 30,
            batch_size: 16,
            lora: TrainLora {
                rank: 8,
                lora_alpha: 16.0,
                target_modules: Projection::ALL
                    .iter()
                    .map(|p| p.name().to_owned())
                    .collect(),
                use_rslora: false,
                seed: 0,
            },
            optimizer: TrainOptimizer {
                lr: 2e-2,
                betas: [0.9, 0.999],
                eps: 1e-8,
                weight_decay: 0.0,
                max_grad_norm: Some(10.0),
            },
        }
    }

    /// Checks every field; the error names it (`data`, `steps`, `batch_size`, `lora.rank`, …).
    pub fn validate(&self) -> Result<()> {
        if !is_content_id(&self.data) {
            return Err(invalid(
                "data",
                "must be a dataset's content id: 64 lowercase hex digits",
            ));
        }
        if self.steps == 0 || self.steps > MAX_TRAIN_STEPS {
            return Err(invalid(
                "steps",
                format!("must be in 1..={MAX_TRAIN_STEPS}, got {}", self.steps),
            ));
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(invalid(
                "batch_size",
                format!("must be in 1..={MAX_BATCH_SIZE}, got {}", self.batch_size),
            ));
        }
        let lora = &self.lora;
        let targets = lora.projections().map_err(|e| e.within("lora"))?;
        if let Some((field, reason)) = check_lora(
            u64::from(lora.rank),
            lora.lora_alpha,
            lora.use_rslora,
            targets.len(),
            u64::from(MAX_TRAIN_RANK),
        ) {
            return Err(invalid(&format!("lora.{field}"), reason));
        }
        let o = &self.optimizer;
        if let Some((field, reason)) =
            check_optimizer(o.lr, o.betas, o.eps, o.weight_decay, o.max_grad_norm)
        {
            return Err(invalid(&format!("optimizer.{field}"), reason));
        }
        Ok(())
    }

    /// The intent's `request_hash`: SHA-256 of the request's canonical JSON (keys sorted, no
    /// whitespace), the rule every request kind follows.
    pub fn hash(&self) -> B256 {
        crate::order::request_value_hash(
            &serde_json::to_value(self).expect("a train request always serializes"),
        )
    }

    /// The sequences step `step` trains on, of a dataset of `sequences` (> 0).
    pub fn batch(&self, step: u32, sequences: usize) -> impl Iterator<Item = usize> {
        let b = self.batch_size as usize;
        let first = step as usize * b;
        (first..first + b).map(move |i| i % sequences.max(1))
    }

    /// Tokens the whole job trains on (every position of every sequence of every step): the
    /// receipt's `tokens`.
    pub fn tokens(&self, data: &Dataset) -> u64 {
        let n = data.sequences.len();
        if n == 0 {
            return 0;
        }
        (0..self.steps)
            .flat_map(|s| self.batch(s, n))
            .map(|i| data.sequences[i].len() as u64)
            .sum()
    }

    /// The longest step, as (sequences, longest sequence): what one `forward_backward` holds.
    pub fn widest_step(&self, data: &Dataset) -> (usize, usize) {
        let n = data.sequences.len();
        let longest = data.sequences.iter().map(Vec::len).max().unwrap_or(0);
        ((self.batch_size as usize).min(n.max(1)), longest)
    }
}

/// Token sequences to train on and their loss weights: the body of `forward_backward`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dataset {
    /// Token ids, one list per sequence.
    pub sequences: Vec<Vec<u32>>,
    /// Per sequence, one weight per token (entry 0 is 0: nothing predicts it).
    pub loss_mask: Vec<Vec<f32>>,
}

impl Dataset {
    /// Parses and checks a dataset file; the error names the field (`sequences`, `loss_mask`).
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_DATASET_BYTES {
            return Err(invalid(
                "dataset",
                format!(
                    "is {} bytes; a dataset is at most {MAX_DATASET_BYTES}",
                    bytes.len()
                ),
            ));
        }
        let data: Self = serde_json::from_slice(bytes).map_err(|e| {
            invalid(
                "dataset",
                format!("is not {{\"sequences\": [[…]], \"loss_mask\": [[…]]}}: {e}"),
            )
        })?;
        data.validate()?;
        Ok(data)
    }

    /// Checks the shapes and weights: 1..=[`MAX_DATASET_SEQUENCES`] sequences of at least two
    /// tokens, [`MAX_DATASET_TOKENS`] tokens at most, one finite weight ≥ 0 per token with entry
    /// 0 zero, and some weight above zero.
    pub fn validate(&self) -> Result<()> {
        let n = self.sequences.len();
        if n == 0 || n > MAX_DATASET_SEQUENCES {
            return Err(invalid(
                "sequences",
                format!("must hold 1..={MAX_DATASET_SEQUENCES} sequences, got {n}"),
            ));
        }
        if self.loss_mask.len() != n {
            return Err(invalid(
                "loss_mask",
                format!(
                    "has {} rows for {n} sequences: one per sequence",
                    self.loss_mask.len()
                ),
            ));
        }
        let tokens: usize = self.sequences.iter().map(Vec::len).sum();
        if tokens > MAX_DATASET_TOKENS {
            return Err(invalid(
                "sequences",
                format!("hold {tokens} tokens; a dataset holds at most {MAX_DATASET_TOKENS}"),
            ));
        }
        let mut weight = 0.0f64;
        for (i, (seq, mask)) in self.sequences.iter().zip(&self.loss_mask).enumerate() {
            if seq.len() < 2 {
                return Err(invalid(
                    &format!("sequences[{i}]"),
                    "needs at least two tokens (one to predict from, one to predict)",
                ));
            }
            if mask.len() != seq.len() {
                return Err(invalid(
                    &format!("loss_mask[{i}]"),
                    format!("has {} weights for {} tokens", mask.len(), seq.len()),
                ));
            }
            if mask[0] != 0.0 {
                return Err(invalid(
                    &format!("loss_mask[{i}]"),
                    "entry 0 must be 0: nothing predicts a sequence's first token",
                ));
            }
            if let Some(w) = mask.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
                return Err(invalid(
                    &format!("loss_mask[{i}]"),
                    format!("weights are finite and ≥ 0, got {w}"),
                ));
            }
            weight += mask.iter().map(|w| f64::from(*w)).sum::<f64>();
        }
        if weight <= 0.0 {
            return Err(invalid(
                "loss_mask",
                "every weight is 0: there is nothing to learn",
            ));
        }
        Ok(())
    }

    /// The largest token id, for the provider's vocabulary check.
    pub fn max_token(&self) -> u32 {
        self.sequences.iter().flatten().copied().max().unwrap_or(0)
    }
}

/// A dataset file's content id: [`crate::content_id`] of the one file `dataset.json`.
pub fn dataset_id(bytes: &[u8]) -> String {
    crate::content_id(&[("dataset.json", bytes)])
}

/// Whether `id` is a content id: 64 lowercase hex digits.
pub fn is_content_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What a training job returned: the trained adapter (its content id, stored at the exchange)
/// and how the loss went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Trained {
    /// The adapter's content id (PEFT's two files; the receipt's `output_hash`).
    pub adapter_id: String,
    /// Optimizer steps taken.
    pub steps: u32,
    /// The loss of the first step's `forward_backward` (before any update).
    pub loss_first: f64,
    /// The loss of the last step's `forward_backward`.
    pub loss_last: f64,
}

impl Trained {
    /// The receipt's `output_hash`: the adapter id's 32 bytes.
    pub fn output_hash(&self) -> Result<[u8; 32]> {
        let mut out = [0u8; 32];
        if !is_content_id(&self.adapter_id) {
            return Err(invalid("trained.adapter_id", "is not a content id"));
        }
        hex::decode_to_slice(&self.adapter_id, &mut out)
            .map_err(|_| invalid("trained.adapter_id", "is not a content id"))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One change to a valid value, in a table of cases.
    type Change<T> = Box<dyn Fn(&mut T)>;

    fn request() -> TrainRequest {
        TrainRequest::example(&"0f".repeat(32))
    }

    fn data() -> Dataset {
        Dataset {
            sequences: vec![vec![1, 2, 3], vec![4, 5], vec![6, 7, 8, 9]],
            loss_mask: vec![
                vec![0.0, 1.0, 1.0],
                vec![0.0, 1.0],
                vec![0.0, 0.0, 0.0, 1.0],
            ],
        }
    }

    #[test]
    fn bad_requests_are_refused_by_field_name() {
        request().validate().unwrap();
        let cases: Vec<(&str, Change<TrainRequest>)> = vec![
            ("data", Box::new(|r| r.data = "xyz".into())),
            ("data", Box::new(|r| r.data = "AB".repeat(32))),
            ("steps", Box::new(|r| r.steps = 0)),
            ("steps", Box::new(|r| r.steps = MAX_TRAIN_STEPS + 1)),
            ("batch_size", Box::new(|r| r.batch_size = 0)),
            ("lora.rank", Box::new(|r| r.lora.rank = 0)),
            ("lora.rank", Box::new(|r| r.lora.rank = MAX_TRAIN_RANK + 1)),
            (
                "lora.lora_alpha",
                Box::new(|r| r.lora.lora_alpha = f64::NAN),
            ),
            (
                "lora.target_modules",
                Box::new(|r| r.lora.target_modules.clear()),
            ),
            (
                "lora.target_modules",
                Box::new(|r| r.lora.target_modules = vec!["wq".into()]),
            ),
            (
                "lora.target_modules",
                Box::new(|r| r.lora.target_modules = vec!["q_proj".into(), "q_proj".into()]),
            ),
            ("optimizer.lr", Box::new(|r| r.optimizer.lr = f64::NAN)),
            ("optimizer.lr", Box::new(|r| r.optimizer.lr = 0.0)),
            (
                "optimizer.betas",
                Box::new(|r| r.optimizer.betas = [0.9, 1.0]),
            ),
            ("optimizer.eps", Box::new(|r| r.optimizer.eps = 0.0)),
            (
                "optimizer.weight_decay",
                Box::new(|r| r.optimizer.weight_decay = -1.0),
            ),
            (
                "optimizer.max_grad_norm",
                Box::new(|r| r.optimizer.max_grad_norm = Some(0.0)),
            ),
        ];
        for (field, change) in cases {
            let mut r = request();
            change(&mut r);
            let err = r.validate().unwrap_err();
            assert_eq!(err.field(), field, "{err}");
        }
    }

    #[test]
    fn the_hash_binds_every_field_and_unknown_fields_are_refused() {
        let base = request().hash();
        let mut r = request();
        r.lora.seed = 1;
        assert_ne!(r.hash(), base);
        let mut r = request();
        r.optimizer.max_grad_norm = None;
        assert_ne!(r.hash(), base);
        // Absent clipping is absent from the JSON, so a client that omits it hashes the same.
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("max_grad_norm"), "{text}");
        let mut v = serde_json::to_value(request()).unwrap();
        v["epochs"] = 3.into();
        let err = serde_json::from_value::<TrainRequest>(v).unwrap_err();
        assert!(err.to_string().contains("epochs"), "{err}");
    }

    #[test]
    fn the_schedule_cycles_through_the_data() {
        let mut r = request();
        r.batch_size = 2;
        r.steps = 3;
        let steps: Vec<Vec<usize>> = (0..3).map(|s| r.batch(s, 3).collect()).collect();
        assert_eq!(steps, vec![vec![0, 1], vec![2, 0], vec![1, 2]]);
        // Lengths 3, 2, 4: (3+2) + (4+3) + (2+4).
        assert_eq!(r.tokens(&data()), 18);
        assert_eq!(r.widest_step(&data()), (2, 4));
    }

    #[test]
    fn bad_datasets_are_refused_by_field_name() {
        data().validate().unwrap();
        let cases: Vec<(&str, Change<Dataset>)> = vec![
            ("sequences", Box::new(|d| d.sequences.clear())),
            (
                "loss_mask",
                Box::new(|d| d.loss_mask.pop().map(drop).unwrap_or(())),
            ),
            ("sequences[1]", Box::new(|d| d.sequences[1] = vec![4])),
            (
                "loss_mask[0]",
                Box::new(|d| d.loss_mask[0] = vec![0.0, 1.0]),
            ),
            ("loss_mask[0]", Box::new(|d| d.loss_mask[0][0] = 1.0)),
            ("loss_mask[2]", Box::new(|d| d.loss_mask[2][1] = f32::NAN)),
            ("loss_mask[2]", Box::new(|d| d.loss_mask[2][1] = -1.0)),
            (
                "loss_mask",
                Box::new(|d| d.loss_mask.iter_mut().flatten().for_each(|w| *w = 0.0)),
            ),
        ];
        for (field, change) in cases {
            let mut d = data();
            change(&mut d);
            let err = d.validate().unwrap_err();
            assert_eq!(err.field(), field, "{err}");
        }
        assert_eq!(Dataset::parse(b"[1,2]").unwrap_err().field(), "dataset");
        let text = serde_json::to_vec(&data()).unwrap();
        assert_eq!(Dataset::parse(&text).unwrap(), data());
        assert_eq!(dataset_id(&text).len(), 64);
        assert_ne!(dataset_id(&text), dataset_id(b"{}"));
    }

    #[test]
    fn markets_name_their_base() {
        assert_eq!(trained_base(&train_market("m")), Some("m"));
        assert_eq!(trained_base("cx/train/"), None);
        assert_eq!(trained_base("m"), None);
    }
}
