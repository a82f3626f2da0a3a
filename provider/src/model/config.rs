//! The model's configuration: the project's one type for a Hugging Face `config.json`
//! ([`ModelConfig`], from cx-protocol, shared with `cx capacity`), read from a model directory
//! as transformers writes it today, and checked for what this forward supports.
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
//! with its name, never ignored: biases, activations other than SiLU, RoPE types other than
//! `default`/`linear`/`llama3` (and unknown keys inside the RoPE object), partial rotary
//! embeddings, sliding windows, soft-capping, quantised weights, and architectures other than
//! Llama and Mistral (Qwen2 has q/k/v biases without saying so in a field; Qwen3 normalises
//! q and k). Fields that do not change the forward (`use_cache`, `initializer_range`,
//! `pretraining_tp`, which only slices the same product, …) are accepted.

use std::path::Path;

pub use cx_protocol::model_config::{DType, EosTokens, ModelConfig, Projection, RopeScaling};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// `model_type`s whose forward is exactly this one (when the fields below allow it).
const SUPPORTED_MODEL_TYPES: [&str; 2] = ["llama", "mistral"];

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

/// Reads and checks `DIR/config.json`.
pub fn read_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    parse_config(&text, &path)
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
    if let Some(rope) = raw.get("rope_parameters").filter(|v| !v.is_null()) {
        apply_rope_parameters(&mut config, rope, path)?;
    } else if let Some(rope) = raw.get("rope_scaling").filter(|v| !v.is_null()) {
        check_rope_object(rope, "rope_scaling", path)?;
    }
    check_supported(&config, path)?;
    Ok(config)
}

/// The common checks ([`ModelConfig::validate`]) and the fields this forward refuses rather than
/// ignores: biases, activations other than SiLU, RoPE scalings other than `llama3`/`linear`,
/// odd head widths (RoPE rotates the two halves of a head).
pub fn validate(config: &ModelConfig, path: &Path) -> Result<()> {
    config.validate().map_err(|e| malformed(path, e))?;
    check_supported(config, path)
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
    if let Some(model_type) = raw.get("model_type").and_then(Value::as_str)
        && !SUPPORTED_MODEL_TYPES.contains(&model_type)
    {
        return Err(refuse(
            path,
            "model_type",
            format!("`{model_type}` is not supported (llama, mistral)"),
        ));
    }
    let max_positions = raw
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .unwrap_or(2048);
    // Mistral writes `sliding_window`; a window at least the context long never masks.
    if let Some(window) = raw.get("sliding_window").filter(|v| !v.is_null()) {
        match window.as_u64() {
            Some(w) if w >= max_positions => {}
            _ => {
                return Err(refuse(
                    path,
                    "sliding_window",
                    format!(
                        "{window} (sliding-window attention is not supported; null or ≥ \
                         max_position_embeddings {max_positions} is)"
                    ),
                ));
            }
        }
    }
    if raw.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        return Err(refuse(
            path,
            "use_sliding_window",
            "sliding-window attention is not supported".into(),
        ));
    }
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
    if config.attention_bias {
        return Err(refuse(
            path,
            "attention_bias",
            "true is not supported (Llama has no biases)".into(),
        ));
    }
    if config.mlp_bias {
        return Err(refuse(
            path,
            "mlp_bias",
            "true is not supported (Llama has no biases)".into(),
        ));
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
            (r#", "mlp_bias": true"#, "mlp_bias"),
            (r#", "attention_bias": true"#, "attention_bias"),
            (r#", "hidden_act": "gelu""#, "hidden_act"),
            (r#", "model_type": "qwen2""#, "model_type"),
            (r#", "sliding_window": 16"#, "sliding_window"),
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
}
