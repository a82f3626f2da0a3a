//! LoRA adapters in PEFT format, checked against a base model and held as cx-kernels
//! [`LoraAdapter`]s, one per adapted projection of each layer.
//!
//! A PEFT directory holds `adapter_config.json` (`r`, `lora_alpha`, `target_modules`,
//! `use_rslora`) and `adapter_model.safetensors` with tensors named
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (`r × d_in`) and
//! `….lora_B.weight` (`d_out × r`). The scale is `alpha / r`, or `alpha / √r` with rsLoRA.
//! An adapter's id is the SHA-256 of its two files (see [`adapter_id`]).
//!
//! # Example: an adapter's delta, shape-checked
//! ```
//! use cx_kernels::LoraAdapter;
//! // A rank-2 adapter of a 4 → 3 projection: A is 2 × 4, B is 3 × 2, s = alpha / r = 1.
//! let lora = LoraAdapter::from_peft(&[0.5f32; 8], &[1.0f32; 6], 2, 4, 3, 2.0)?;
//! assert_eq!(lora.delta_dense().len(), 3 * 4); // s·B·A is d_out × d_in
//! assert!(LoraAdapter::from_peft(&[0.5f32; 8], &[1.0f32; 5], 2, 4, 3, 2.0).is_err());
//! # Ok::<(), cx_kernels::Error>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cx_kernels::LoraAdapter;
use cx_kernels::rng::{UniformVec, seeded};
// The base model's shapes come from the shared config type, not from `model`: the forward
// uses adapters, so adapters must not use the forward.
use cx_protocol::model_config::{ModelConfig, Projection};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::adapter_files::read_regular_file;
use crate::error::{Error, Result};

/// `adapter_config.json` as PEFT writes it (the fields we read, and the ones we refuse).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct AdapterConfig {
    /// Rank `r`.
    pub r: usize,
    /// `alpha` of `s = alpha / r`.
    pub lora_alpha: f64,
    /// Adapted modules: a list of names (`q_proj`, …).
    pub target_modules: TargetModules,
    /// rsLoRA: `s = alpha / √r`.
    #[serde(default)]
    pub use_rslora: bool,
    /// `LORA`.
    #[serde(default)]
    pub peft_type: Option<String>,
    /// The base this was trained on (informational).
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    /// `CAUSAL_LM`.
    #[serde(default)]
    pub task_type: Option<String>,
    /// Per-module ranks (not supported when non-empty).
    #[serde(default)]
    pub rank_pattern: BTreeMap<String, serde_json::Value>,
    /// Per-module alphas (not supported when non-empty).
    #[serde(default)]
    pub alpha_pattern: BTreeMap<String, serde_json::Value>,
    /// Dropout (training only).
    #[serde(default)]
    pub lora_dropout: f64,
    /// `none` (bias training is not supported).
    #[serde(default)]
    pub bias: Option<String>,
}

/// `target_modules`: a list, or one name.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TargetModules {
    /// A list of module names.
    List(Vec<String>),
    /// One module name (PEFT also allows a regex here, which we refuse).
    One(String),
}

/// An adapter checked against a base model, ready for the forward.
#[derive(Clone, Debug)]
pub struct Adapter {
    id: String,
    rank: usize,
    scale: f32,
    targets: BTreeSet<Projection>,
    /// Per layer, per target ([`Projection::index`]).
    layers: Vec<[Option<LoraAdapter<f32>>; 7]>,
    bytes: u64,
}

impl Adapter {
    /// An adapter from weights already in memory (a training client's current A and B), named
    /// `id`; `layers` holds, per layer, each adapted projection at [`Projection::index`].
    pub(crate) fn from_parts(
        id: String,
        rank: usize,
        scale: f32,
        targets: BTreeSet<Projection>,
        layers: Vec<[Option<LoraAdapter<f32>>; 7]>,
    ) -> Self {
        let bytes = layers
            .iter()
            .flatten()
            .flatten()
            .map(|l| l.weight_bytes() as u64)
            .sum();
        Self {
            id,
            rank,
            scale,
            targets,
            layers,
            bytes,
        }
    }

    /// Content id: SHA-256 of the files, hex.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Rank `r`.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The scale `s` every projection uses.
    pub fn scale(&self) -> f32 {
        self.scale
    }
    /// Adapted projections.
    pub fn targets(&self) -> &BTreeSet<Projection> {
        &self.targets
    }
    /// Bytes of weights held (`Σ r·(d_in + d_out)` × 4).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// The adapter of projection `target` in layer `layer`, if adapted.
    pub fn projection(&self, layer: usize, target: Projection) -> Option<&LoraAdapter<f32>> {
        self.layers.get(layer)?[target.index()].as_ref()
    }
}

/// Names of an adapter directory's files.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The weights file.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// The id of an adapter directory: the protocol's content id ([`cx_protocol::content_id`]) of its
/// two files, so the exchange's adapter store, the provider and anyone else name the same bytes
/// the same way, wherever they live.
pub fn adapter_id(config_bytes: &[u8], weight_bytes: &[u8]) -> String {
    cx_protocol::content_id(&[
        (ADAPTER_CONFIG, config_bytes),
        (ADAPTER_WEIGHTS, weight_bytes),
    ])
}

/// The most bytes an adapter's files may hold, so a load never reads without bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdapterLimits {
    /// `adapter_config.json` (PEFT writes about 1 KB).
    pub config_bytes: u64,
    /// `adapter_model.safetensors`: every projection at the largest accepted rank in `f32`,
    /// plus room for the JSON header.
    pub weight_bytes: u64,
}

impl AdapterLimits {
    /// The limits for adapters of `base` up to rank `max_rank`.
    pub fn new(base: &ModelConfig, max_rank: usize) -> Self {
        let all: BTreeSet<Projection> = Projection::ALL.into_iter().collect();
        let tensors = (base.num_hidden_layers as u64).saturating_mul(2 * 7);
        // A header entry is a name (~70 bytes), a dtype, a shape and offsets.
        let header = tensors.saturating_mul(256).saturating_add(64 * 1024);
        Self {
            config_bytes: 1 << 20,
            weight_bytes: adapter_bytes(base, max_rank, &all).saturating_add(header),
        }
    }
}

/// Both files of an adapter directory, each a regular file within `limits`.
fn read_files(dir: &Path, limits: AdapterLimits) -> Result<(Vec<u8>, Vec<u8>)> {
    Ok((
        read_regular_file(&dir.join(ADAPTER_CONFIG), limits.config_bytes)?,
        read_regular_file(&dir.join(ADAPTER_WEIGHTS), limits.weight_bytes)?,
    ))
}

/// Reads only the id of an adapter directory (hashes both files).
pub fn read_adapter_id(dir: &Path, limits: AdapterLimits) -> Result<String> {
    let (config, weights) = read_files(dir, limits)?;
    Ok(adapter_id(&config, &weights))
}

/// Reads and checks `adapter_config.json` of `dir`.
pub fn read_adapter_config(dir: &Path) -> Result<AdapterConfig> {
    let path = dir.join(ADAPTER_CONFIG);
    parse_adapter_config(&path, &read_regular_file(&path, 1 << 20)?)
}

/// Keys of PEFT 0.21's `LoraConfig` that never change what a loaded adapter computes: metadata,
/// training-only settings, initialisation recipes (the weights file already holds the result),
/// and layer selections that the tensor names already say.
const HARMLESS_KEYS: [&str; 24] = [
    "lora_ga_config",
    "megatron_core",
    "runtime_config",
    "auto_mapping",
    "base_model_name_or_path",
    "corda_config",
    "ensure_weight_tying",
    "eva_config",
    "exclude_modules",
    "inference_mode",
    "init_lora_weights",
    "layers_pattern",
    "layers_to_transform",
    "loftq_config",
    "lora_dropout",
    "peft_version",
    "revision",
    "task_type",
    "qalora_group_size",
    "r",
    "lora_alpha",
    "target_modules",
    "use_rslora",
    "peft_type",
];

/// Keys PEFT writes that change the computation when set, and are not implemented here: with a
/// value other than "off" (null, false, empty) the adapter is refused, naming the key.
/// `alora_invocation_tokens` (activated LoRA) applies the delta only from the invocation tokens
/// on; applying it everywhere would give different output, so it is refused rather than
/// approximated.
const REFUSED_WHEN_SET: [&str; 12] = [
    "alora_invocation_tokens",
    "use_dora",
    "fan_in_fan_out",
    "lora_bias",
    "modules_to_save",
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "use_qalora",
    "megatron_config",
    "arrow_config",
    "rank_pattern",
];

/// "Off" as PEFT writes a disabled option: null, false, an empty list, object or string.
fn is_off(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Number(_) | Value::Bool(true) => false,
    }
}

fn parse_adapter_config(path: &Path, bytes: &[u8]) -> Result<AdapterConfig> {
    let bad = |reason: String| Error::Config {
        path: path.to_path_buf(),
        what: "adapter_config.json",
        reason,
    };
    let raw: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    // A key this server does not know may change what the adapter computes (a newer PEFT's
    // variant): it passes only when it is off. Known harmless keys pass whatever they hold.
    for (key, value) in &raw {
        let known = HARMLESS_KEYS.contains(&key.as_str())
            || matches!(key.as_str(), "alpha_pattern" | "bias");
        if known || is_off(value) {
            continue;
        }
        let why = if REFUSED_WHEN_SET.contains(&key.as_str()) {
            "is not supported by this server"
        } else {
            "is not a LoRA setting this server knows, and it is set"
        };
        return Err(bad(format!("`{key}` = {value} {why}")));
    }
    let config: AdapterConfig = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if config.r == 0 {
        return Err(bad("`r` must be positive".into()));
    }
    if !config.lora_alpha.is_finite() {
        return Err(bad("`lora_alpha` must be finite".into()));
    }
    if let Some(peft_type) = &config.peft_type
        && peft_type != "LORA"
    {
        return Err(bad(format!("`peft_type` {peft_type} is not LORA")));
    }
    if !config.rank_pattern.is_empty() || !config.alpha_pattern.is_empty() {
        return Err(bad(
            "`rank_pattern`/`alpha_pattern` (per-module ranks) are not supported".into(),
        ));
    }
    if let Some(bias) = &config.bias
        && bias != "none"
    {
        return Err(bad(format!("`bias` = {bias} is not supported (only none)")));
    }
    Ok(config)
}

/// Inputs to a projection are RMS-normed activations or products of them; this bounds their
/// magnitude generously. An adapter whose delta could overflow `f32` for such inputs would
/// serve NaN or ±inf, so it is refused at load.
const INPUT_MAGNITUDE_BOUND: f64 = 1e4;

/// The largest `|(s·B·A·x)_j|` over `‖x‖∞ ≤ 1`: `|s| · max_j Σ_k |B_jk| · max_k Σ_i |A_ki|`,
/// in `f64` so the bound itself cannot overflow.
fn delta_gain(a: &[f32], b: &[f32], rank: usize, d_in: usize, scale: f64) -> f64 {
    let a_rows = a
        .chunks(d_in.max(1))
        .map(|row| row.iter().map(|v| f64::from(v.abs())).sum::<f64>())
        .fold(0.0, f64::max);
    let b_rows = b
        .chunks(rank.max(1))
        .map(|row| row.iter().map(|v| f64::from(v.abs())).sum::<f64>())
        .fold(0.0, f64::max);
    scale.abs() * b_rows * a_rows
}

/// The targets an adapter config names, checked.
fn config_targets(path: &Path, config: &AdapterConfig) -> Result<BTreeSet<Projection>> {
    let names: Vec<String> = match &config.target_modules {
        TargetModules::List(list) => list.clone(),
        TargetModules::One(one) => vec![one.clone()],
    };
    let mut targets = BTreeSet::new();
    for name in names {
        let target = Projection::from_name(&name).ok_or_else(|| {
            Error::AdapterMismatch(format!(
                "{}: target module `{name}` is not one of {}",
                path.display(),
                Projection::NAMES
            ))
        })?;
        targets.insert(target);
    }
    if targets.is_empty() {
        return Err(Error::AdapterMismatch(format!(
            "{}: target_modules is empty",
            path.display()
        )));
    }
    Ok(targets)
}

/// Parses a PEFT tensor name into (layer, target, is_a).
fn parse_name(name: &str) -> Option<(usize, Projection, bool)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (parent, rest) = rest.split_once('.')?;
    let (module, rest) = rest.split_once('.')?;
    let target = Projection::from_name(module)?;
    if parent != target.parent() {
        return None;
    }
    // PEFT saves without the adapter name; older files may keep `.default`.
    match rest {
        "lora_A.weight" | "lora_A.default.weight" => Some((layer, target, true)),
        "lora_B.weight" | "lora_B.default.weight" => Some((layer, target, false)),
        _ => None,
    }
}

fn to_f32(path: &Path, name: &str, dtype: Dtype, data: &[u8]) -> Result<Vec<f32>> {
    let bad = |reason: String| Error::Safetensors {
        path: path.to_path_buf(),
        reason: format!("{name}: {reason}"),
    };
    Ok(match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => return Err(bad(format!("dtype {other:?} (expected F32, BF16 or F16)"))),
    })
}

/// Loads a PEFT adapter directory and checks it against `base`: every tensor name must be a
/// LoRA weight of a listed target in an existing layer, with shapes `r × d_in` / `d_out × r`,
/// A and B in pairs, values finite, and `r ≤ max_rank`. Nothing partial is returned.
pub fn load_adapter(dir: &Path, base: &ModelConfig, max_rank: usize) -> Result<Adapter> {
    let (config_bytes, weight_bytes) = read_files(dir, AdapterLimits::new(base, max_rank))?;
    adapter_from_bytes(dir, &config_bytes, &weight_bytes, base, max_rank)
}

/// [`load_adapter`] on the two files' bytes, already read (within [`AdapterLimits`]): every check
/// of the path loader, which calls it. `dir` only names the files in errors. The fuzz targets
/// load adapters through this.
pub fn adapter_from_bytes(
    dir: &Path,
    config_bytes: &[u8],
    weight_bytes: &[u8],
    base: &ModelConfig,
    max_rank: usize,
) -> Result<Adapter> {
    let config_path = dir.join(ADAPTER_CONFIG);
    let weights_path = dir.join(ADAPTER_WEIGHTS);
    let config = parse_adapter_config(&config_path, config_bytes)?;
    if config.r > max_rank {
        return Err(Error::RankOverLimit {
            rank: config.r,
            max_rank,
        });
    }
    let targets = config_targets(&config_path, &config)?;
    let rank = config.r;
    let scale_f64 = if config.use_rslora {
        config.lora_alpha / (rank as f64).sqrt()
    } else {
        config.lora_alpha / rank as f64
    };
    let scale = scale_f64 as f32;
    if !scale.is_finite() {
        return Err(Error::AdapterMismatch(format!(
            "the scale lora_alpha / r = {scale_f64:e} does not fit f32; outputs would not be \
             finite"
        )));
    }
    let tensors = SafeTensors::deserialize(weight_bytes).map_err(|e| Error::Safetensors {
        path: weights_path.clone(),
        reason: e.to_string(),
    })?;
    type Pair = (Option<Vec<f32>>, Option<Vec<f32>>);
    let mut pairs: BTreeMap<(usize, Projection), Pair> = BTreeMap::new();
    for (name, view) in tensors.tensors() {
        let (layer, target, is_a) = parse_name(&name).ok_or_else(|| {
            Error::AdapterMismatch(format!(
                "tensor `{name}` is not a PEFT LoRA weight of a Llama projection \
                 (base_model.model.model.layers.{{i}}.self_attn|mlp.<proj>.lora_A|lora_B.weight)"
            ))
        })?;
        if layer >= base.num_hidden_layers {
            return Err(Error::AdapterMismatch(format!(
                "tensor `{name}`: layer {layer} but the base has {} layers",
                base.num_hidden_layers
            )));
        }
        if !targets.contains(&target) {
            return Err(Error::AdapterMismatch(format!(
                "tensor `{name}`: {} is not in target_modules",
                target.name()
            )));
        }
        let (d_in, d_out) = base.projection_shape(target);
        let expected = if is_a {
            vec![rank, d_in]
        } else {
            vec![d_out, rank]
        };
        if view.shape() != expected.as_slice() {
            return Err(Error::AdapterMismatch(format!(
                "tensor `{name}` has shape {:?}; r = {rank} and the base's {} ({d_in} → {d_out}) \
                 need {expected:?}",
                view.shape(),
                target.name()
            )));
        }
        let data = to_f32(&weights_path, &name, view.dtype(), view.data())?;
        if data.iter().any(|v| !v.is_finite()) {
            return Err(Error::AdapterMismatch(format!(
                "tensor `{name}` holds NaN or infinite values"
            )));
        }
        let entry = pairs.entry((layer, target)).or_default();
        let slot = if is_a { &mut entry.0 } else { &mut entry.1 };
        if slot.replace(data).is_some() {
            return Err(Error::AdapterMismatch(format!(
                "tensor `{name}` appears twice"
            )));
        }
    }
    if pairs.is_empty() {
        return Err(Error::AdapterMismatch(format!(
            "{} holds no LoRA tensors",
            weights_path.display()
        )));
    }
    let mut layers: Vec<[Option<LoraAdapter<f32>>; 7]> = (0..base.num_hidden_layers)
        .map(|_| Default::default())
        .collect();
    let mut bytes = 0u64;
    for ((layer, target), pair) in pairs {
        let (Some(a), Some(b)) = pair else {
            return Err(Error::AdapterMismatch(format!(
                "layer {layer} {}: lora_A and lora_B must both be present",
                target.name()
            )));
        };
        let (d_in, d_out) = base.projection_shape(target);
        let gain = delta_gain(&a, &b, rank, d_in, scale_f64);
        let overflows = (gain * INPUT_MAGNITUDE_BOUND).is_nan()
            || gain * INPUT_MAGNITUDE_BOUND >= f64::from(f32::MAX);
        if overflows {
            return Err(Error::AdapterMismatch(format!(
                "layer {layer} {}: the delta s·B·A can reach {gain:e} × |x| (lora_alpha = {}); \
                 outputs would not be finite",
                target.name(),
                config.lora_alpha
            )));
        }
        let lora = LoraAdapter::with_scale(&a, &b, rank, d_in, d_out, scale)?;
        bytes += lora.weight_bytes() as u64;
        layers[layer][target.index()] = Some(lora);
    }
    Ok(Adapter {
        id: adapter_id(config_bytes, weight_bytes),
        rank,
        scale,
        targets,
        layers,
        bytes,
    })
}

/// Bytes an adapter of rank `rank` on `targets` takes in memory (`f32`), before loading it:
/// `Σ_layers Σ_targets r·(d_in + d_out)·4` (SPEC §5), saturating at `u64::MAX` (a rank limit
/// of `usize::MAX` means "no limit").
pub fn adapter_bytes(base: &ModelConfig, rank: usize, targets: &BTreeSet<Projection>) -> u64 {
    let per_layer = targets.iter().fold(0u64, |sum, t| {
        let (d_in, d_out) = base.projection_shape(*t);
        let width = (d_in as u64).saturating_add(d_out as u64);
        sum.saturating_add((rank as u64).saturating_mul(width))
    });
    per_layer
        .saturating_mul(base.num_hidden_layers as u64)
        .saturating_mul(4)
}

/// Writes one PEFT adapter directory with seeded random weights (F32): `A` uniform in
/// `±1/√d_in`, `B` uniform in `±b_scale` (PEFT starts `B` at zero; random `B` makes the
/// delta visible), `alpha = 2r`.
pub fn write_random_adapter(
    dir: &Path,
    base: &ModelConfig,
    rank: usize,
    targets: &[Projection],
    b_scale: f32,
    seed: u64,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut rng = seeded(seed);
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for layer in 0..base.num_hidden_layers {
        for &t in targets {
            let (d_in, d_out) = base.projection_shape(t);
            let prefix = format!("base_model.model.model.layers.{layer}.{}", t.module_path());
            let a = rng.vec_f32(rank * d_in, 1.0 / (d_in as f32).sqrt());
            let b = rng.vec_f32(d_out * rank, b_scale);
            tensors.insert(
                format!("{prefix}.lora_A.weight"),
                (vec![rank, d_in], le_bytes(&a)),
            );
            tensors.insert(
                format!("{prefix}.lora_B.weight"),
                (vec![d_out, rank], le_bytes(&b)),
            );
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, (shape, data))| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), data)
                .expect("shape matches data by construction");
            (name.clone(), view)
        })
        .collect();
    let weights_path = dir.join(ADAPTER_WEIGHTS);
    let mut metadata = std::collections::HashMap::new();
    metadata.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(views, Some(metadata), &weights_path).map_err(|e| {
        Error::Safetensors {
            path: weights_path.clone(),
            reason: e.to_string(),
        }
    })?;
    let config = AdapterConfig {
        r: rank,
        lora_alpha: 2.0 * rank as f64,
        target_modules: TargetModules::List(targets.iter().map(|t| t.name().into()).collect()),
        use_rslora: false,
        peft_type: Some("LORA".into()),
        base_model_name_or_path: None,
        task_type: Some("CAUSAL_LM".into()),
        rank_pattern: BTreeMap::new(),
        alpha_pattern: BTreeMap::new(),
        lora_dropout: 0.0,
        bias: Some("none".into()),
    };
    let config_path = dir.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&config).expect("config serialises");
    std::fs::write(&config_path, text).map_err(|e| Error::io(&config_path, e))
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The largest adapter [`write_random_adapters`] builds (it holds one in memory at a time).
pub const MAX_GENERATED_ADAPTER_BYTES: u64 = 4 << 30;

/// Writes `count` adapters named `adapter-000`, `adapter-001`, … under `out`; adapter `i`
/// gets rank `ranks[i % ranks.len()]`, targets `targets`, seed `seed + i`. Returns the
/// directories.
pub fn write_random_adapters(
    out: &Path,
    base: &ModelConfig,
    count: usize,
    ranks: &[usize],
    targets: &[Projection],
    seed: u64,
) -> Result<Vec<PathBuf>> {
    if ranks.is_empty() || ranks.contains(&0) {
        return Err(Error::BadRequest("--ranks needs positive ranks".into()));
    }
    if targets.is_empty() {
        return Err(Error::BadRequest(
            "--targets needs at least one target".into(),
        ));
    }
    // Each adapter is built in memory before it is written: refuse sizes no machine holds
    // rather than abort on a failed allocation.
    let targets_set: BTreeSet<Projection> = targets.iter().copied().collect();
    for &rank in ranks {
        let bytes = adapter_bytes(base, rank, &targets_set);
        if bytes > MAX_GENERATED_ADAPTER_BYTES {
            return Err(Error::BadRequest(format!(
                "--ranks {rank}: one adapter would take {bytes} bytes (over {} GiB); use a \
                 smaller rank",
                MAX_GENERATED_ADAPTER_BYTES >> 30
            )));
        }
    }
    (0..count)
        .map(|i| {
            let dir = out.join(format!("adapter-{i:03}"));
            write_random_adapter(
                &dir,
                base,
                ranks[i % ranks.len()],
                targets,
                0.5 / (ranks[i % ranks.len()] as f32),
                seed.wrapping_add(i as u64),
            )?;
            Ok(dir)
        })
        .collect()
}
