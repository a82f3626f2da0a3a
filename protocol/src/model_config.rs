//! The Hugging Face `config.json` of a Llama-family model, parsed once for the whole project:
//! the provider builds its forward from it, and `cx capacity adapter --config` sizes adapters
//! with it. Beside it, the two small vocabularies both need: the element types weights are
//! stored in ([`DType`]) and the projections a LoRA adapter can target ([`Projection`]).
//!
//! Fields are named and defaulted as `transformers`' `LlamaConfig` writes them (Mistral, Qwen2
//! and other Llama-family configs share these names). [`ModelConfig::validate`] holds the checks
//! every reader needs (sizes positive, heads that divide); a reader that computes with a field
//! refuses the values it does not support on its own (the provider refuses other
//! architectures, activations and unknown RoPE scalings, and applies Qwen3's own `head_dim`
//! default of 128; sizing adapters needs none of the rest).
//!
//! ```
//! use cx_protocol::model_config::{DType, ModelConfig, Projection};
//!
//! let config = ModelConfig::from_json(r#"{
//!     "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
//!     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256
//! }"#)?;
//! assert_eq!(config.head_dim(), 128);
//! assert_eq!(config.projection_shape(Projection::K), (4096, 1024)); // grouped-query attention
//! assert_eq!(DType::parse("bfloat16")?.bytes(), 2);
//! # Ok::<(), cx_protocol::Error>(())
//! ```

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Element type of stored weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 4 bytes.
    F32,
    /// 2 bytes (bfloat16).
    Bf16,
    /// 2 bytes (IEEE half).
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    /// Parses the short name (`f32`, `bf16`, `f16`) or the one `config.json` writes
    /// (`float32`, `bfloat16`, `float16`).
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" => Ok(Self::F16),
            other => Err(Error::InvalidField {
                field: "dtype".into(),
                reason: format!("unknown `{other}`; use f32, bf16 or f16"),
            }),
        }
    }

    /// The name `config.json` writes (`torch_dtype` / `dtype`): `float32`, `bfloat16`, `float16`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }
}

/// A projection of a decoder layer, as PEFT's `target_modules` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Projection {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`.
    Gate,
    /// `mlp.up_proj`.
    Up,
    /// `mlp.down_proj`.
    Down,
}

impl Projection {
    /// Every projection, in the order a decoder layer applies them.
    pub const ALL: [Projection; 7] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    /// The names, comma separated, for messages that list what is accepted.
    pub const NAMES: &'static str = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";

    /// Position in [`Projection::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// PEFT's `target_modules` name (`q_proj`, …).
    pub fn name(self) -> &'static str {
        match self {
            Projection::Q => "q_proj",
            Projection::K => "k_proj",
            Projection::V => "v_proj",
            Projection::O => "o_proj",
            Projection::Gate => "gate_proj",
            Projection::Up => "up_proj",
            Projection::Down => "down_proj",
        }
    }

    /// The block it belongs to inside a decoder layer: `self_attn` or `mlp`.
    pub fn parent(self) -> &'static str {
        match self {
            Projection::Q | Projection::K | Projection::V | Projection::O => "self_attn",
            Projection::Gate | Projection::Up | Projection::Down => "mlp",
        }
    }

    /// Path inside a decoder layer (`self_attn.q_proj`, `mlp.gate_proj`, …).
    pub fn module_path(self) -> String {
        format!("{}.{}", self.parent(), self.name())
    }

    /// The projection named `name` (`q_proj`, …).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// `config.json` of a Hugging Face Llama-family checkpoint.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ModelConfig {
    /// Model width `d`.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Decoder layers `L`.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// RoPE frequency scaling (`llama3` or `linear`), as Hugging Face writes it.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Context length: prompts plus generated tokens must fit.
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    /// The output projection is the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token(s): a number or a list.
    #[serde(default)]
    pub eos_token_id: Option<EosTokens>,
    /// Storage dtype as Hugging Face names it (`float32`, `bfloat16`, `float16`; see
    /// [`DType::parse`]). Informational: the weights files say what they hold.
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// `["LlamaForCausalLM"]` for Llama.
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    /// `"llama"` for Llama.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP.
    #[serde(default)]
    pub mlp_bias: bool,
    /// MLP activation (`silu` for SwiGLU).
    #[serde(default)]
    pub hidden_act: Option<String>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_max_positions() -> usize {
    2048
}

/// `rope_scaling` of `config.json`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RopeScaling {
    /// `llama3`, `linear` or `default` (older files call it `type`).
    #[serde(alias = "type")]
    pub rope_type: String,
    /// Scale factor.
    #[serde(default)]
    pub factor: Option<f64>,
    /// llama3: low-frequency factor.
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    /// llama3: high-frequency factor.
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    /// llama3: the context the frequencies were trained for.
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
}

/// `eos_token_id`: one id or several.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum EosTokens {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl ModelConfig {
    /// Parses `config.json` text and [validates](Self::validate) it. A malformed file is an
    /// [`Error::InvalidField`] on `config.json` with serde's reason (which names the field).
    pub fn from_json(text: &str) -> Result<Self> {
        let config: Self = serde_json::from_str(text).map_err(|e| Error::InvalidField {
            field: "config.json".into(),
            reason: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// End-of-sequence ids.
    pub fn eos_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            None => Vec::new(),
            Some(EosTokens::One(id)) => vec![*id],
            Some(EosTokens::Many(ids)) => ids.clone(),
        }
    }

    /// `(d_in, d_out)` of a projection.
    pub fn projection_shape(&self, projection: Projection) -> (usize, usize) {
        let d = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim();
        let kv = self.kv_heads() * self.head_dim();
        let ff = self.intermediate_size;
        match projection {
            Projection::Q => (d, q),
            Projection::K | Projection::V => (d, kv),
            Projection::O => (q, d),
            Projection::Gate | Projection::Up => (d, ff),
            Projection::Down => (ff, d),
        }
    }

    /// The checks every reader needs: sizes positive, query heads a multiple of key/value
    /// heads, a positive head width. The error names the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: String| Error::InvalidField {
            field: field.into(),
            reason,
        };
        for (field, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
        ] {
            if value == 0 {
                return Err(bad(field, "sizes must be positive".into()));
            }
        }
        if self.kv_heads() == 0 || !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return Err(bad(
                "num_key_value_heads",
                format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    self.num_attention_heads,
                    self.kv_heads()
                ),
            ));
        }
        if self.head_dim() == 0 {
            return Err(bad("head_dim", "must be positive".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3_8B: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "eos_token_id": [128001, 128009], "torch_dtype": "bfloat16",
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;

    #[test]
    fn reads_a_real_llama3_config() {
        let c = ModelConfig::from_json(LLAMA3_8B).unwrap();
        assert_eq!((c.kv_heads(), c.head_dim()), (8, 128));
        assert_eq!(c.eos_ids(), vec![128001, 128009]);
        assert_eq!(c.projection_shape(Projection::O), (4096, 4096));
        assert_eq!(c.projection_shape(Projection::Down), (14336, 4096));
        assert_eq!(c.rope_scaling.unwrap().rope_type, "llama3");
        assert_eq!(
            DType::parse(c.torch_dtype.as_deref().unwrap()),
            Ok(DType::Bf16)
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let err = ModelConfig::from_json(r#"{"hidden_size": 8}"#).unwrap_err();
        assert!(err.to_string().contains("missing field"), "{err}");
        let heads = LLAMA3_8B.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 7");
        assert_eq!(
            ModelConfig::from_json(&heads).unwrap_err().field(),
            "num_key_value_heads"
        );
        let zero = LLAMA3_8B.replace("\"num_hidden_layers\": 32", "\"num_hidden_layers\": 0");
        assert_eq!(
            ModelConfig::from_json(&zero).unwrap_err().field(),
            "num_hidden_layers"
        );
        assert_eq!(DType::parse("f8").unwrap_err().field(), "dtype");
    }

    #[test]
    fn projection_names_round_trip() {
        for p in Projection::ALL {
            assert_eq!(Projection::from_name(p.name()), Some(p));
            assert!(Projection::NAMES.contains(p.name()));
        }
        assert_eq!(Projection::Gate.module_path(), "mlp.gate_proj");
        assert_eq!(Projection::from_name("lm_head"), None);
        for d in [DType::F32, DType::Bf16, DType::F16] {
            assert_eq!(DType::parse(d.hf_name()), Ok(d));
        }
    }
}
