//! Seeded random Llama checkpoints for tests and benchmarks: a Hugging Face directory
//! (`config.json` and `model.safetensors`) that [`Model::load`](super::Model::load) and
//! candle-transformers read like any other.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use cx_kernels::rng::{ChaCha20Rng, UniformVec, seeded};

use super::config::{self, DType, EosTokens, ModelConfig, Projection};
use super::weights::NamedTensors;
use crate::error::{Error, Result};

/// Options of a generated model.
#[derive(Clone, Debug)]
pub struct GenModelOptions {
    /// Hidden size.
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// SwiGLU inner width.
    pub intermediate: usize,
    /// Vocabulary (at least 258: 256 bytes, BOS, EOS).
    pub vocab: usize,
    /// Context length.
    pub max_positions: usize,
    /// Tie `lm_head` to the embeddings.
    pub tie: bool,
    /// Storage dtype of `model.safetensors`.
    pub dtype: DType,
    /// Seed of the weights.
    pub seed: u64,
}

/// Byte-level tokenizer ids of generated models: bytes are `0..256`, then BOS and EOS.
pub const GENERATED_BOS: u32 = 256;
/// End of sequence in generated models.
pub const GENERATED_EOS: u32 = 257;

/// The config a generated model gets.
pub fn generated_config(o: &GenModelOptions) -> Result<ModelConfig> {
    if o.vocab < 258 {
        return Err(Error::BadRequest(
            "--vocab must be at least 258 (256 bytes, BOS, EOS)".into(),
        ));
    }
    if o.heads == 0 || o.kv_heads == 0 || o.hidden == 0 || !o.hidden.is_multiple_of(o.heads) {
        return Err(Error::BadRequest(
            "--hidden must be a positive multiple of --heads".into(),
        ));
    }
    let config = ModelConfig {
        hidden_size: o.hidden,
        intermediate_size: o.intermediate,
        num_hidden_layers: o.layers,
        num_attention_heads: o.heads,
        num_key_value_heads: Some(o.kv_heads),
        head_dim: Some(o.hidden / o.heads),
        vocab_size: o.vocab,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        max_position_embeddings: o.max_positions,
        tie_word_embeddings: o.tie,
        bos_token_id: Some(GENERATED_BOS),
        eos_token_id: Some(EosTokens::One(GENERATED_EOS)),
        torch_dtype: Some(o.dtype.hf_name().into()),
        architectures: Some(vec!["LlamaForCausalLM".into()]),
        model_type: Some("llama".into()),
        attention_bias: false,
        mlp_bias: false,
        hidden_act: Some("silu".into()),
    };
    config::validate(&config, Path::new("<generated>"))?;
    Ok(config)
}

/// Seeded random weights for `config`, named as Hugging Face names them: name → (shape, data).
///
/// Projections are uniform in `±1/√d_in` (unit-variance activations stay unit-variance),
/// norms near 1, embeddings uniform in `±1`.
pub fn generated_tensors(config: &ModelConfig, seed: u64) -> NamedTensors {
    let mut rng = seeded(seed);
    let mut out = HashMap::new();
    let d = config.hidden_size;
    out.insert(
        "model.embed_tokens.weight".to_string(),
        (
            vec![config.vocab_size, d],
            rng.vec_f32(config.vocab_size * d, 1.0),
        ),
    );
    let norm = |rng: &mut ChaCha20Rng| -> Vec<f32> {
        rng.vec_f32(d, 0.1).into_iter().map(|v| 1.0 + v).collect()
    };
    for i in 0..config.num_hidden_layers {
        for p in Projection::ALL {
            let (d_in, d_out) = config.projection_shape(p);
            out.insert(
                format!("model.layers.{i}.{}.weight", p.module_path()),
                (
                    vec![d_out, d_in],
                    rng.vec_f32(d_out * d_in, 1.0 / (d_in as f32).sqrt()),
                ),
            );
        }
        out.insert(
            format!("model.layers.{i}.input_layernorm.weight"),
            (vec![d], norm(&mut rng)),
        );
        out.insert(
            format!("model.layers.{i}.post_attention_layernorm.weight"),
            (vec![d], norm(&mut rng)),
        );
    }
    out.insert("model.norm.weight".to_string(), (vec![d], norm(&mut rng)));
    if !config.tie_word_embeddings {
        out.insert(
            "lm_head.weight".to_string(),
            (
                vec![config.vocab_size, d],
                rng.vec_f32(config.vocab_size * d, 1.0 / (d as f32).sqrt()),
            ),
        );
    }
    out
}

/// candle's name for a storage dtype.
fn candle_dtype(dtype: DType) -> candle_core::DType {
    match dtype {
        DType::F32 => candle_core::DType::F32,
        DType::Bf16 => candle_core::DType::BF16,
        DType::F16 => candle_core::DType::F16,
    }
}

/// Token text of generated models' BOS and EOS in `tokenizer.json`.
const BOS_TEXT: &str = "<s>";
const EOS_TEXT: &str = "</s>";

/// `tokenizer.json` of a generated model's byte-level tokenizer, as the Hugging Face
/// `tokenizers` library writes one: a BPE model without merges whose vocabulary is the 256
/// byte pieces `<0x00>`…`<0xFF>` (ids `0..256`, with `byte_fallback`, so every character
/// falls back to its UTF-8 bytes), `<s>` (BOS, 256) and `</s>` (EOS, 257) as special tokens, and
/// unreachable `<unused_N>` pieces up to `vocab_size`; BOS is prepended by the post-processor.
/// It encodes text exactly as [`crate::tokenizer::Tokenizer::generated`] does, and it is the
/// layout (SentencePiece-style BPE with byte fallback) that transformers, vLLM and llama.cpp's
/// `convert_hf_to_gguf.py` read as a Llama tokenizer.
pub fn generated_tokenizer_json(vocab_size: usize) -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    for id in 0..vocab_size {
        let piece = match id {
            0..256 => format!("<0x{id:02X}>"),
            256 => BOS_TEXT.to_string(),
            257 => EOS_TEXT.to_string(),
            _ => format!("<unused_{id}>"),
        };
        vocab.insert(piece, serde_json::json!(id));
    }
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(GENERATED_BOS, BOS_TEXT), special(GENERATED_EOS, EOS_TEXT)],
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS_TEXT, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS_TEXT, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS_TEXT: {"id": BOS_TEXT, "ids": [GENERATED_BOS], "tokens": [BOS_TEXT]}}
        },
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": []
        }
    })
}

/// `tokenizer_config.json` beside [`generated_tokenizer_json`], for transformers'
/// `AutoTokenizer` (the generic fast tokenizer over `tokenizer.json`).
fn generated_tokenizer_config(config: &ModelConfig) -> serde_json::Value {
    serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TEXT,
        "eos_token": EOS_TEXT,
        "add_bos_token": true,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": config.max_position_embeddings,
    })
}

/// Writes a seeded random Llama into `dir`: `config.json`, `model.safetensors` (written by
/// candle in `o.dtype`), the byte-level tokenizer as `tokenizer.json` and
/// `tokenizer_config.json` ([`generated_tokenizer_json`]), and `chat_template.jinja`
/// ([`GENERATED_CHAT_TEMPLATE`](crate::chat_template::GENERATED_CHAT_TEMPLATE)). Returns the
/// config.
pub fn write_generated_model(dir: &Path, o: &GenModelOptions) -> Result<ModelConfig> {
    let config = generated_config(o)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tensors = generated_tensors(&config, o.seed);
    let mut candle_tensors = HashMap::new();
    for (name, (shape, data)) in tensors {
        let t = Tensor::from_vec(data, shape, &candle_core::Device::Cpu)?
            .to_dtype(candle_dtype(o.dtype))?;
        candle_tensors.insert(name, t);
    }
    let path = dir.join("model.safetensors");
    candle_core::safetensors::save(&candle_tensors, &path).map_err(|e| Error::Safetensors {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let config_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&config).expect("config serialises");
    std::fs::write(&config_path, text).map_err(|e| Error::io(&config_path, e))?;
    for (name, value) in [
        (
            "tokenizer.json",
            generated_tokenizer_json(config.vocab_size),
        ),
        ("tokenizer_config.json", generated_tokenizer_config(&config)),
    ] {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&value).expect("json serialises");
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    }
    let path = dir.join("chat_template.jinja");
    std::fs::write(&path, crate::chat_template::GENERATED_CHAT_TEMPLATE)
        .map_err(|e| Error::io(&path, e))?;
    Ok(config)
}
