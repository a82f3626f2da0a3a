//! The model's configuration: the project's one type for a Hugging Face `config.json`
//! ([`ModelConfig`], from cx-protocol, shared with `cx capacity`), read from a model directory
//! and checked for what this forward supports.

use std::path::Path;

pub use cx_protocol::model_config::{DType, EosTokens, ModelConfig, Projection, RopeScaling};

use crate::error::{Error, Result};

/// Reads and checks `DIR/config.json`.
pub fn read_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let config = ModelConfig::from_json(&text).map_err(|e| malformed(&path, e))?;
    check_supported(&config, &path)?;
    Ok(config)
}

/// The common checks ([`ModelConfig::validate`]) and the fields this forward refuses rather than
/// ignores: biases, activations other than SiLU, RoPE scalings other than `llama3`/`linear`,
/// odd head widths (RoPE rotates the two halves of a head).
pub fn validate(config: &ModelConfig, path: &Path) -> Result<()> {
    config.validate().map_err(|e| malformed(path, e))?;
    check_supported(config, path)
}

fn check_supported(config: &ModelConfig, path: &Path) -> Result<()> {
    let bad = |reason: String| Error::Config {
        path: path.to_path_buf(),
        what: "config.json",
        reason,
    };
    if !config.head_dim().is_multiple_of(2) {
        return Err(bad(format!(
            "head_dim {} must be even and positive (RoPE rotates halves)",
            config.head_dim()
        )));
    }
    if config.attention_bias || config.mlp_bias {
        return Err(bad(
            "attention_bias / mlp_bias are not supported (Llama has no biases)".into(),
        ));
    }
    if let Some(act) = &config.hidden_act
        && act != "silu"
    {
        return Err(bad(format!("hidden_act `{act}` is not supported (silu)")));
    }
    if let Some(scaling) = &config.rope_scaling
        && !matches!(scaling.rope_type.as_str(), "llama3" | "linear" | "default")
    {
        return Err(bad(format!(
            "rope_scaling type `{}` is not supported (llama3, linear, default)",
            scaling.rope_type
        )));
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
