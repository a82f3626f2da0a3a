//! The model's configuration: the project's one type for a Hugging Face `config.json`
//! ([`ModelConfig`], from cx-protocol, shared with `cx capacity`), read from a model directory
//! as transformers writes it today, and checked for what this forward supports.
//!
//! # Architectures
//! `model_type` names the [`Architecture`]: `llama`, `mistral`, `qwen2` (Qwen2 and Qwen2.5) and
//! `qwen3`, each Llama's blocks plus what transformers' `modeling_<model_type>.py` adds: Qwen2's
//! q/k/v biases (always there; its file has no field for them), Qwen3's RMSNorm over each
//! head of q and k before RoPE (and q/k/v/o biases when `attention_bias`), Llama's own
//! `attention_bias`/`mlp_bias`. A flag an architecture's transformers class does not read
//! (`attention_bias` on Mistral or Qwen2, `mlp_bias` on all but Llama) is refused when set:
//! its weights would not be what transformers computes with. Defaults follow each
//! transformers config class where they differ from Llama's (Qwen3's `head_dim` 128,
//! Mistral's `sliding_window` 4096).
//!
//! # Two ways of writing RoPE
//! transformers ≥ 5 writes `rope_parameters` (`{"rope_type", "rope_theta", …scaling fields}`)
//! where 4.x wrote a top-level `rope_theta` and `rope_scaling`. The shared type knows only the
//! old form, so [`read_config`] reads both: `rope_parameters`, when present, is what
//! transformers 5 itself computes with, and it wins. Reading only the old form would fall back
//! to θ = 10000 for every new file — wrong logits, and no error to show it.
//!
//! # What is refused
//! A field that changes the computation and that this forward does not implement is refused
//! with its name, never ignored: other `model_type`s, activations other than SiLU, RoPE types
//! other than `default`/`linear`/`llama3` (and unknown keys inside the RoPE object), partial
//! rotary embeddings, sliding windows that mask (Mistral's `sliding_window` below the context;
//! Qwen's `use_sliding_window` with a window below the context on some layer), soft-capping,
//! quantised weights, per-layer attention kinds. Qwen's `sliding_window` and
//! `max_window_layers` are read only when `use_sliding_window` is true, as transformers reads
//! them. Fields that do not change the forward (`use_cache`, `initializer_range`,
//! `pretraining_tp`, which only slices the same product, …) are accepted.

use std::path::Path;

pub use cx_protocol::model_config::{DType, EosTokens, ModelConfig, Projection, RopeScaling};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The `model_type`s this forward runs, as listed in messages.
const SUPPORTED_MODEL_TYPES: &str = "llama, mistral, qwen2, qwen3";

/// Qwen3's `head_dim` when `config.json` has none (transformers' `Qwen3Config` default; not
/// `hidden_size / num_attention_heads` as for the others).
const QWEN3_DEFAULT_HEAD_DIM: usize = 128;

/// Mistral's `sliding_window` when `config.json` has none (transformers' `MistralConfig`).
const MISTRAL_DEFAULT_SLIDING_WINDOW: u64 = 4096;

/// Qwen's `max_window_layers` when `config.json` has none (transformers' `Qwen2Config` and
/// `Qwen3Config`): layers from this index on slide when `use_sliding_window` is true.
const QWEN_DEFAULT_MAX_WINDOW_LAYERS: u64 = 28;

/// The architectures this forward runs, by `config.json`'s `model_type`: Llama's decoder
/// blocks, and what each architecture adds to them in transformers' `modeling_<model_type>.py`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `llama` (and a file without `model_type`): biases on q/k/v/o when `attention_bias`, on
    /// gate/up/down when `mlp_bias`.
    Llama,
    /// `mistral`: Llama without biases; its sliding window is refused unless it never masks.
    Mistral,
    /// `qwen2` (Qwen2 and Qwen2.5): biases on q, k and v, always; none on o or the MLP.
    Qwen2,
    /// `qwen3`: an RMSNorm over each head of q and of k (`q_norm`, `k_norm`, width
    /// `head_dim`) after the projection and before RoPE; biases on q/k/v/o when
    /// `attention_bias`, none on the MLP.
    Qwen3,
}

impl Architecture {
    /// The architecture `model_type` names (`None`: the file has none, which is Llama).
    pub fn from_model_type(model_type: Option<&str>) -> Option<Self> {
        match model_type {
            None | Some("llama") => Some(Self::Llama),
            Some("mistral") => Some(Self::Mistral),
            Some("qwen2") => Some(Self::Qwen2),
            Some("qwen3") => Some(Self::Qwen3),
            Some(_) => None,
        }
    }

    /// The architecture of `config`; an unknown `model_type` is refused by name.
    pub fn of(config: &ModelConfig) -> Result<Self> {
        let model_type = config.model_type.as_deref();
        Self::from_model_type(model_type)
            .ok_or_else(|| Error::Model(format!("`model_type`: {}", unsupported(model_type))))
    }

    /// `model_type` as `config.json` writes it.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    /// Whether `projection` carries a bias (`model.layers.N.<module_path>.bias`, `d_out`) in
    /// `config`'s model, as transformers builds its `nn.Linear`.
    pub fn has_bias(self, config: &ModelConfig, projection: Projection) -> bool {
        let attention = projection.parent() == "self_attn";
        match self {
            Self::Llama if attention => config.attention_bias,
            Self::Llama => config.mlp_bias,
            Self::Mistral => false,
            Self::Qwen2 => matches!(projection, Projection::Q | Projection::K | Projection::V),
            Self::Qwen3 => attention && config.attention_bias,
        }
    }

    /// Whether queries and keys are RMS-normalised per head before RoPE (Qwen3's `q_norm` and
    /// `k_norm`, weights of `head_dim`).
    pub fn has_qk_norm(self) -> bool {
        self == Self::Qwen3
    }

    /// Whether transformers' class reads `attention_bias` (Mistral's and Qwen2's do not).
    fn reads_attention_bias(self) -> bool {
        matches!(self, Self::Llama | Self::Qwen3)
    }

    /// Whether transformers' class reads `mlp_bias` (only Llama's does).
    fn reads_mlp_bias(self) -> bool {
        self == Self::Llama
    }
}

/// RoPE types this forward implements.
const SUPPORTED_ROPE_TYPES: [&str; 3] = ["default", "linear", "llama3"];

/// Keys a RoPE object may hold for the supported types. `partial_rotary_factor` is read (and
/// must be 1); every other key belongs to a type we do not implement and is refused by name.
const ROPE_KEYS: [&str; 8] = [
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "partial_rotary_factor",
];

/// Reads and checks the `config.json` of the model at `path` (a folder's file, or a GGUF's
/// metadata as that file).
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    let files = super::files::ModelFiles::locate(path)?;
    match files.read_text("config.json")? {
        Some((path, text)) => parse_config(&text, &path),
        None => {
            let path = files.dir().join("config.json");
            Err(Error::io(
                &path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no config.json or GGUF file"),
            ))
        }
    }
}

/// Parses `config.json` text (either RoPE form) and checks it; `path` is for messages.
pub fn parse_config(text: &str, path: &Path) -> Result<ModelConfig> {
    let mut config = ModelConfig::from_json(text).map_err(|e| malformed(path, e))?;
    let raw: Map<String, Value> = serde_json::from_str(text).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        what: "config.json",
        reason: e.to_string(),
    })?;
    check_unsupported_fields(&raw, path)?;
    if config.model_type.as_deref() == Some("qwen3")
        && raw.get("head_dim").is_none_or(Value::is_null)
    {
        config.head_dim = Some(QWEN3_DEFAULT_HEAD_DIM);
    }
    if let Some(rope) = raw.get("rope_parameters").filter(|v| !v.is_null()) {
        apply_rope_parameters(&mut config, rope, path)?;
    } else if let Some(rope) = raw.get("rope_scaling").filter(|v| !v.is_null()) {
        check_rope_object(rope, "rope_scaling", path)?;
    }
    check_supported(&config, path)?;
    Ok(config)
}

/// The common checks ([`ModelConfig::validate`]) and the fields this forward refuses rather than
/// ignores: other architectures, bias flags the architecture does not read, activations other
/// than SiLU, RoPE scalings other than `llama3`/`linear`, odd head widths (RoPE rotates the two
/// halves of a head).
pub fn validate(config: &ModelConfig, path: &Path) -> Result<()> {
    config.validate().map_err(|e| malformed(path, e))?;
    check_supported(config, path)
}

/// Why `model_type` is refused.
fn unsupported(model_type: Option<&str>) -> String {
    format!(
        "`{}` is not supported ({SUPPORTED_MODEL_TYPES})",
        model_type.unwrap_or_default()
    )
}

fn refuse(path: &Path, field: &str, reason: String) -> Error {
    Error::Config {
        path: path.to_path_buf(),
        what: "config.json",
        reason: format!("`{field}`: {reason}"),
    }
}

/// Top-level fields the shared type does not carry but that change the forward.
fn check_unsupported_fields(raw: &Map<String, Value>, path: &Path) -> Result<()> {
    let model_type = raw.get("model_type").and_then(Value::as_str);
    let Some(architecture) = Architecture::from_model_type(model_type) else {
        return Err(refuse(path, "model_type", unsupported(model_type)));
    };
    check_sliding_window(raw, architecture, path)?;
    if let Some(factor) = raw.get("partial_rotary_factor").filter(|v| !v.is_null())
        && factor.as_f64() != Some(1.0)
    {
        return Err(refuse(
            path,
            "partial_rotary_factor",
            format!("{factor} (partial rotary embeddings are not supported; 1.0 is)"),
        ));
    }
    for field in [
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "quantization_config",
    ] {
        if raw.get(field).is_some_and(|v| !v.is_null()) {
            return Err(refuse(path, field, "is not supported".into()));
        }
    }
    if let Some(types) = raw.get("layer_types").and_then(Value::as_array)
        && let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention"))
    {
        return Err(refuse(
            path,
            "layer_types",
            format!("{other} (only full_attention layers are supported)"),
        ));
    }
    Ok(())
}

/// The sliding window, as each architecture's transformers class reads it: refused unless it
/// never masks within the context this forward allows (`max_position_embeddings`).
fn check_sliding_window(
    raw: &Map<String, Value>,
    architecture: Architecture,
    path: &Path,
) -> Result<()> {
    let max_positions = raw
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .unwrap_or(2048);
    let use_sliding_window = raw.get("use_sliding_window").and_then(Value::as_bool);
    let window = match raw.get("sliding_window") {
        // Mistral's config class defaults to a window of 4096 when the file has none.
        None if architecture == Architecture::Mistral => {
            Some(Value::from(MISTRAL_DEFAULT_SLIDING_WINDOW))
        }
        None => None,
        Some(v) if v.is_null() => None,
        Some(v) => Some(v.clone()),
    };
    let masks = |window: &Value| window.as_u64().is_none_or(|w| w < max_positions);
    match architecture {
        // Qwen's config classes drop `sliding_window` unless `use_sliding_window` (default
        // false), and then slide only layers from `max_window_layers` on.
        Architecture::Qwen2 | Architecture::Qwen3 => {
            if use_sliding_window != Some(true) {
                return Ok(());
            }
            let from_layer = raw
                .get("max_window_layers")
                .and_then(Value::as_u64)
                .unwrap_or(QWEN_DEFAULT_MAX_WINDOW_LAYERS);
            let layers = raw
                .get("num_hidden_layers")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            if let Some(window) = window
                && from_layer < layers
                && masks(&window)
            {
                return Err(refuse(
                    path,
                    "use_sliding_window",
                    format!(
                        "true with sliding_window {window} below max_position_embeddings \
                         {max_positions} on layers {from_layer}.. (sliding-window attention is \
                         not supported)"
                    ),
                ));
            }
        }
        Architecture::Llama | Architecture::Mistral => {
            if let Some(window) = window
                && masks(&window)
            {
                return Err(refuse(
                    path,
                    "sliding_window",
                    format!(
                        "{window} (sliding-window attention is not supported; null or ≥ \
                         max_position_embeddings {max_positions} is)"
                    ),
                ));
            }
            if use_sliding_window == Some(true) {
                return Err(refuse(
                    path,
                    "use_sliding_window",
                    "sliding-window attention is not supported".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Checks a RoPE object (`rope_parameters` or `rope_scaling`) for keys and types this forward
/// implements; `field` names it in errors.
fn check_rope_object(rope: &Value, field: &str, path: &Path) -> Result<()> {
    let Some(object) = rope.as_object() else {
        return Err(refuse(
            path,
            field,
            format!("must be an object, got {rope}"),
        ));
    };
    // transformers 5 nests one object per layer type for models that mix attention kinds;
    // Llama has one kind, and the nested form is not this architecture.
    if let Some((key, _)) = object.iter().find(|(_, v)| v.is_object()) {
        return Err(refuse(
            path,
            &format!("{field}.{key}"),
            "per-layer-type RoPE parameters are not supported".into(),
        ));
    }
    if let Some(key) = object.keys().find(|k| !ROPE_KEYS.contains(&k.as_str())) {
        return Err(refuse(
            path,
            &format!("{field}.{key}"),
            "is not supported (it belongs to a RoPE type this forward does not implement)".into(),
        ));
    }
    let rope_type = object
        .get("rope_type")
        .or_else(|| object.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    if !SUPPORTED_ROPE_TYPES.contains(&rope_type) {
        return Err(refuse(
            path,
            &format!("{field}.rope_type"),
            format!("`{rope_type}` is not supported (default, linear, llama3)"),
        ));
    }
    if let Some(factor) = object.get("partial_rotary_factor")
        && factor.as_f64() != Some(1.0)
    {
        return Err(refuse(
            path,
            &format!("{field}.partial_rotary_factor"),
            format!("{factor} (partial rotary embeddings are not supported; 1.0 is)"),
        ));
    }
    for key in [
        "rope_theta",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
    ] {
        if let Some(value) = object.get(key).filter(|v| !v.is_null()) {
            match value.as_f64() {
                Some(v) if v.is_finite() && v > 0.0 => {}
                _ => {
                    return Err(refuse(
                        path,
                        &format!("{field}.{key}"),
                        format!("{value} must be a positive number"),
                    ));
                }
            }
        }
    }
    if rope_type == "llama3"
        && let (Some(low), Some(high)) = (
            object.get("low_freq_factor").and_then(Value::as_f64),
            object.get("high_freq_factor").and_then(Value::as_f64),
        )
        && high <= low
    {
        return Err(refuse(
            path,
            &format!("{field}.high_freq_factor"),
            format!("{high} must be greater than low_freq_factor {low}"),
        ));
    }
    Ok(())
}

/// Reads transformers 5's `rope_parameters` into the shared type's `rope_theta` and
/// `rope_scaling`, which the rotary embedding computes with.
fn apply_rope_parameters(config: &mut ModelConfig, rope: &Value, path: &Path) -> Result<()> {
    check_rope_object(rope, "rope_parameters", path)?;
    let object = rope.as_object().expect("checked to be an object");
    if let Some(theta) = object.get("rope_theta").and_then(Value::as_f64) {
        config.rope_theta = theta;
    }
    let rope_type = object
        .get("rope_type")
        .or_else(|| object.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    config.rope_scaling = if rope_type == "default" {
        None
    } else {
        let mut scaling = object.clone();
        scaling.remove("rope_theta");
        scaling.remove("partial_rotary_factor");
        Some(
            serde_json::from_value::<RopeScaling>(Value::Object(scaling))
                .map_err(|e| refuse(path, "rope_parameters", e.to_string()))?,
        )
    };
    Ok(())
}

fn check_supported(config: &ModelConfig, path: &Path) -> Result<()> {
    if !config.head_dim().is_multiple_of(2) {
        return Err(refuse(
            path,
            "head_dim",
            format!(
                "{} must be even and positive (RoPE rotates halves)",
                config.head_dim()
            ),
        ));
    }
    let model_type = config.model_type.as_deref();
    let architecture = Architecture::from_model_type(model_type)
        .ok_or_else(|| refuse(path, "model_type", unsupported(model_type)))?;
    for (field, set, read) in [
        (
            "attention_bias",
            config.attention_bias,
            architecture.reads_attention_bias(),
        ),
        ("mlp_bias", config.mlp_bias, architecture.reads_mlp_bias()),
    ] {
        if set && !read {
            return Err(refuse(
                path,
                field,
                format!(
                    "true is not part of `{}` (transformers' class does not read it; its \
                     biases are fixed by the architecture)",
                    architecture.model_type()
                ),
            ));
        }
    }
    if let Some(act) = &config.hidden_act
        && act != "silu"
    {
        return Err(refuse(
            path,
            "hidden_act",
            format!("`{act}` is not supported (silu)"),
        ));
    }
    if !(config.rope_theta.is_finite() && config.rope_theta > 0.0) {
        return Err(refuse(
            path,
            "rope_theta",
            format!("{} must be a positive number", config.rope_theta),
        ));
    }
    if !(config.rms_norm_eps.is_finite() && config.rms_norm_eps >= 0.0) {
        return Err(refuse(
            path,
            "rms_norm_eps",
            format!("{} must be a non-negative number", config.rms_norm_eps),
        ));
    }
    if let Some(scaling) = &config.rope_scaling {
        if !SUPPORTED_ROPE_TYPES.contains(&scaling.rope_type.as_str()) {
            return Err(refuse(
                path,
                "rope_scaling.rope_type",
                format!(
                    "`{}` is not supported (default, linear, llama3)",
                    scaling.rope_type
                ),
            ));
        }
        if scaling.rope_type == "llama3" && scaling.original_max_position_embeddings == Some(0) {
            return Err(refuse(
                path,
                "rope_scaling.original_max_position_embeddings",
                "must be positive".into(),
            ));
        }
    }
    Ok(())
}

/// A refusal of the shared parser, as this crate's error on `path`.
fn malformed(path: &Path, e: cx_protocol::Error) -> Error {
    let reason = match e {
        // serde's own message already says which field and where.
        cx_protocol::Error::InvalidField { field, reason } if field == "config.json" => reason,
        other => other.to_string(),
    };
    Error::Config {
        path: path.to_path_buf(),
        what: "config.json",
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300"#;

    fn parse(extra: &str) -> Result<ModelConfig> {
        parse_config(&format!("{{{BASE}{extra}}}"), Path::new("config.json"))
    }

    fn refused_field(extra: &str) -> String {
        let err = parse(extra).unwrap_err().to_string();
        err.split('`').nth(1).unwrap_or(&err).to_string()
    }

    #[test]
    fn rope_parameters_of_transformers_5_are_read() {
        let c = parse(r#", "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}"#)
            .unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert!(c.rope_scaling.is_none());
        let c = parse(
            r#", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        let s = c.rope_scaling.unwrap();
        assert_eq!((s.rope_type.as_str(), s.factor), ("llama3", Some(8.0)));
        assert_eq!(c.rope_theta, 500000.0);
        // The old form still reads.
        let c = parse(r#", "rope_theta": 1000.0"#).unwrap();
        assert_eq!(c.rope_theta, 1000.0);
    }

    #[test]
    fn fields_that_change_the_forward_are_refused_by_name() {
        for (extra, field) in [
            (r#", "hidden_act": "gelu""#, "hidden_act"),
            (r#", "model_type": "qwen2_moe""#, "model_type"),
            (r#", "model_type": "qwen3_moe""#, "model_type"),
            (r#", "sliding_window": 16"#, "sliding_window"),
            // Flags an architecture's transformers class does not read.
            (
                r#", "model_type": "mistral", "attention_bias": true"#,
                "attention_bias",
            ),
            (
                r#", "model_type": "qwen2", "attention_bias": true"#,
                "attention_bias",
            ),
            (r#", "model_type": "qwen3", "mlp_bias": true"#, "mlp_bias"),
            // Windows that mask: Mistral's default (4096) below a longer context, Qwen's when
            // `use_sliding_window` turns it on for a layer.
            (
                r#", "model_type": "mistral", "max_position_embeddings": 32768"#,
                "sliding_window",
            ),
            (
                r#", "model_type": "qwen2", "use_sliding_window": true, "sliding_window": 16,
                "max_window_layers": 1"#,
                "use_sliding_window",
            ),
            (
                r#", "model_type": "qwen3", "use_sliding_window": true, "sliding_window": 16,
                "max_window_layers": 0"#,
                "use_sliding_window",
            ),
            (r#", "use_sliding_window": true"#, "use_sliding_window"),
            (r#", "partial_rotary_factor": 0.5"#, "partial_rotary_factor"),
            (
                r#", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4}"#,
                "rope_parameters.rope_type",
            ),
            (
                r#", "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "beta_fast": 32}"#,
                "rope_parameters.beta_fast",
            ),
            (
                r#", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}"#,
                "rope_scaling.rope_type",
            ),
            (
                r#", "rope_parameters": {"full_attention": {"rope_type": "default"}}"#,
                "rope_parameters.full_attention",
            ),
            (
                r#", "quantization_config": {"bits": 4}"#,
                "quantization_config",
            ),
            (
                r#", "layer_types": ["full_attention", "sliding_attention"]"#,
                "layer_types",
            ),
            (
                r#", "rope_parameters": {"rope_type": "default", "rope_theta": -1}"#,
                "rope_parameters.rope_theta",
            ),
        ] {
            assert_eq!(refused_field(extra), field, "{extra}");
        }
        // Harmless fields pass.
        parse(
            r#", "pretraining_tp": 1, "use_cache": true, "initializer_range": 0.02,
            "sliding_window": null, "model_type": "mistral", "dtype": "float32""#,
        )
        .unwrap();
    }

    /// Qwen2.5's files (written by transformers 4.x) carry a `sliding_window` and
    /// `max_window_layers` beside `use_sliding_window: false`; transformers drops the window
    /// then, and so do we. Windows that never mask within the context pass too.
    #[test]
    fn windows_that_never_mask_are_accepted() {
        for extra in [
            r#", "model_type": "qwen2", "use_sliding_window": false, "sliding_window": 4096,
            "max_window_layers": 1, "max_position_embeddings": 32768"#,
            r#", "model_type": "qwen2", "sliding_window": 32768, "max_window_layers": 21"#,
            r#", "model_type": "qwen3", "use_sliding_window": false, "sliding_window": 16"#,
            // On: but from layer 2 of 2 (no layer slides), or wider than the context.
            r#", "model_type": "qwen2", "use_sliding_window": true, "sliding_window": 16,
            "max_window_layers": 2"#,
            r#", "model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4096,
            "max_window_layers": 0, "max_position_embeddings": 4096"#,
            // Mistral's default window (4096) is not below the default context here (2048).
            r#", "model_type": "mistral""#,
            r#", "model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 4096"#,
        ] {
            parse(extra).unwrap_or_else(|e| panic!("{extra}: {e}"));
        }
    }

    #[test]
    fn each_architecture_has_its_own_biases_and_norms() {
        use Projection::*;
        let biased = |extra: &str| {
            let config = parse(extra).unwrap();
            let architecture = Architecture::of(&config).unwrap();
            let biased: Vec<Projection> = Projection::ALL
                .into_iter()
                .filter(|&p| architecture.has_bias(&config, p))
                .collect();
            (architecture, biased, architecture.has_qk_norm())
        };
        assert_eq!(biased(""), (Architecture::Llama, vec![], false));
        assert_eq!(
            biased(r#", "attention_bias": true, "mlp_bias": true"#),
            (Architecture::Llama, Projection::ALL.to_vec(), false)
        );
        assert_eq!(
            biased(r#", "model_type": "mistral""#),
            (Architecture::Mistral, vec![], false)
        );
        // Qwen2's biases need no field.
        assert_eq!(
            biased(r#", "model_type": "qwen2""#),
            (Architecture::Qwen2, vec![Q, K, V], false)
        );
        assert_eq!(
            biased(r#", "model_type": "qwen3", "head_dim": 8"#),
            (Architecture::Qwen3, vec![], true)
        );
        assert_eq!(
            biased(r#", "model_type": "qwen3", "head_dim": 8, "attention_bias": true"#),
            (Architecture::Qwen3, vec![Q, K, V, O], true)
        );
    }

    /// transformers' `Qwen3Config` defaults `head_dim` to 128, not hidden/heads.
    #[test]
    fn qwen3_head_dim_defaults_as_transformers_does() {
        let c = parse(r#", "model_type": "qwen3""#).unwrap();
        assert_eq!(c.head_dim(), 128);
        assert_eq!(c.projection_shape(Projection::Q), (32, 4 * 128));
        let c = parse(r#", "model_type": "qwen3", "head_dim": 24"#).unwrap();
        assert_eq!(c.head_dim(), 24);
        // The others keep hidden / heads.
        assert_eq!(parse(r#", "model_type": "qwen2""#).unwrap().head_dim(), 8);
    }
}
