//! A llama.cpp GGUF of a Llama-family model, read as the Hugging Face checkpoint it was
//! converted from: `config.json` from the `llama.*` metadata, the tensors under transformers'
//! names (q and k rows put back in Hugging Face's order), and — when no `tokenizer.json` is
//! beside the file — `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`
//! from the `tokenizer.*` metadata. Everything else in the model (the template, the forward,
//! the stop ids) then reads these as it reads any checkpoint: one parse of each file type.
//!
//! # Why q and k are permuted back
//! llama.cpp's `convert_hf_to_gguf.py` interleaves the two RoPE halves of each head of
//! `q_proj` and `k_proj` (`permute`: rows `(head, half, i)` become `(head, i, half)`), because
//! ggml rotates adjacent pairs; this forward rotates halves, as transformers does, so the rows
//! go back. Rows move whole, so quantized blocks move as they are.

use serde_json::{Map, Value as Json, json};

use super::ModelConfig;
use super::config::Architecture;
use super::gguf::{Gguf, TensorType, Value};
use super::weights::Checkpoint;
use crate::error::{Error, Result};

/// The architectures read from GGUF (`general.architecture`).
const ARCHITECTURES: &str = "llama";

fn refuse(g: &Gguf, what: String) -> Error {
    Error::Model(format!("{}: {what}", g.path().display()))
}

fn need_int(g: &Gguf, key: &str) -> Result<i128> {
    g.int(key)?
        .ok_or_else(|| refuse(g, format!("metadata `{key}` is missing")))
}

/// `config.json` as transformers would write it for this file.
pub(super) fn config_json(g: &Gguf) -> Result<String> {
    let arch = g.str("general.architecture")?.unwrap_or_default();
    if arch != "llama" {
        return Err(refuse(
            g,
            format!("`general.architecture` `{arch}` is not supported from GGUF ({ARCHITECTURES})"),
        ));
    }
    if let Some(kind) = g.str("llama.rope.scaling.type")?
        && kind != "none"
    {
        return Err(refuse(
            g,
            format!("`llama.rope.scaling.type` `{kind}` is not supported from GGUF"),
        ));
    }
    if g.tensors.iter().any(|t| t.name == "rope_freqs.weight") {
        return Err(refuse(
            g,
            "tensor rope_freqs.weight (Llama 3.1-style RoPE scaling) is not supported from GGUF; \
             use the safetensors checkpoint"
                .into(),
        ));
    }
    let heads = need_int(g, "llama.attention.head_count")?;
    let hidden = need_int(g, "llama.embedding_length")?;
    let vocab = match g.int("llama.vocab_size")? {
        Some(v) => v,
        None => g
            .array("tokenizer.ggml.tokens")?
            .map(|t| t.len() as i128)
            .ok_or_else(|| refuse(g, "neither `llama.vocab_size` nor tokens".into()))?,
    };
    let mut c = Map::new();
    c.insert("model_type".into(), json!("llama"));
    c.insert("architectures".into(), json!(["LlamaForCausalLM"]));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert(
        "intermediate_size".into(),
        json!(need_int(g, "llama.feed_forward_length")?),
    );
    c.insert(
        "num_hidden_layers".into(),
        json!(need_int(g, "llama.block_count")?),
    );
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert(
        "num_key_value_heads".into(),
        json!(g.int("llama.attention.head_count_kv")?.unwrap_or(heads)),
    );
    if let Some(hd) = g.int("llama.attention.key_length")? {
        c.insert("head_dim".into(), json!(hd));
    }
    c.insert(
        "max_position_embeddings".into(),
        json!(need_int(g, "llama.context_length")?),
    );
    c.insert(
        "rms_norm_eps".into(),
        json!(
            g.float("llama.attention.layer_norm_rms_epsilon")?
                .unwrap_or(1e-5)
        ),
    );
    c.insert(
        "rope_theta".into(),
        json!(g.float("llama.rope.freq_base")?.unwrap_or(10_000.0)),
    );
    c.insert("vocab_size".into(), json!(vocab));
    c.insert(
        "tie_word_embeddings".into(),
        json!(!g.tensors.iter().any(|t| t.name == "output.weight")),
    );
    c.insert("hidden_act".into(), json!("silu"));
    for (key, field) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = g.int(key)? {
            c.insert(field.into(), json!(id));
        }
    }
    Ok(Json::Object(c).to_string())
}

/// The Hugging Face name of a llama.cpp tensor name, and whether its rows are RoPE-permuted
/// (`Some(heads)`: q with the attention heads, k with the key-value heads).
fn hf_name(name: &str, config: &ModelConfig) -> Option<(String, Option<usize>)> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(top) = top {
        return Some((top.to_string(), None));
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (path, permuted) = match part {
        "attn_norm.weight" => ("input_layernorm.weight", None),
        "ffn_norm.weight" => ("post_attention_layernorm.weight", None),
        "attn_q.weight" => ("self_attn.q_proj.weight", Some(config.num_attention_heads)),
        "attn_k.weight" => ("self_attn.k_proj.weight", Some(config.kv_heads())),
        "attn_v.weight" => ("self_attn.v_proj.weight", None),
        "attn_output.weight" => ("self_attn.o_proj.weight", None),
        "ffn_gate.weight" => ("mlp.gate_proj.weight", None),
        "ffn_up.weight" => ("mlp.up_proj.weight", None),
        "ffn_down.weight" => ("mlp.down_proj.weight", None),
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{path}"), permuted))
}

/// For each row of the Hugging Face matrix, the GGUF row it is stored at (`heads` heads of
/// `rows / heads` rows, each stored as interleaved halves).
fn unpermuted_rows(rows: usize, heads: usize) -> Vec<usize> {
    let hd = rows / heads;
    let half = hd / 2;
    (0..rows)
        .map(|r| {
            let (h, within) = (r / hd, r % hd);
            let (t, i) = (within / half, within % half);
            h * hd + 2 * i + t
        })
        .collect()
}

/// The tensors under Hugging Face's names and shapes, as stored (quantized blocks stay blocks;
/// f16 widened to `f32`, as the safetensors reader does).
pub(super) fn checkpoint(g: &Gguf, config: &ModelConfig) -> Result<Checkpoint> {
    let mut out = Checkpoint::default();
    let architecture = Architecture::of(config)?;
    for info in &g.tensors {
        let Some((name, permuted)) = hf_name(&info.name, config) else {
            return Err(refuse(
                g,
                format!(
                    "tensor {} is not part of a `{}` forward; this variant is not supported",
                    info.name,
                    architecture.model_type()
                ),
            ));
        };
        let shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        let bytes = g.read(info)?;
        let rows = if shape.len() == 2 { shape[0] } else { 1 };
        let order = match permuted {
            Some(heads) if heads > 0 && rows % heads == 0 && (rows / heads) % 2 == 0 => {
                Some(unpermuted_rows(rows, heads))
            }
            Some(_) => {
                return Err(refuse(
                    g,
                    format!("tensor {}: {rows} rows are not whole heads", info.name),
                ));
            }
            None => None,
        };
        let row_elements = shape.last().copied().unwrap_or(1);
        fn reorder<T: Copy>(elements: Vec<T>, order: &Option<Vec<usize>>, row: usize) -> Vec<T> {
            match order {
                None => elements,
                Some(from) => from
                    .iter()
                    .flat_map(|&r| elements[r * row..(r + 1) * row].to_vec())
                    .collect(),
            }
        }
        match info.kind {
            TensorType::F32 => {
                let v = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect();
                out.f32
                    .insert(name, (shape, reorder(v, &order, row_elements)));
            }
            TensorType::F16 => {
                let v = bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]))
                    .collect();
                out.f16
                    .insert(name, (shape, reorder(v, &order, row_elements)));
            }
            TensorType::Bf16 => {
                let v = bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
                    .collect();
                out.bf16
                    .insert(name, (shape, reorder(v, &order, row_elements)));
            }
            TensorType::Quant(kind) => {
                if shape.len() != 2 {
                    return Err(refuse(
                        g,
                        format!("tensor {}: a quantized tensor must be a matrix", info.name),
                    ));
                }
                let mut m = cx_kernels::QuantMatrix::new(kind, shape[0], shape[1], bytes)?;
                if let Some(from) = &order {
                    m = m.permute_rows(from)?;
                }
                out.quant.insert(name, (shape, m));
            }
        }
    }
    Ok(out)
}

/// Bytes tensor `t` takes as [`checkpoint`] holds it: blocks, BF16 and F16 matrices as stored,
/// every vector widened to `f32`.
pub(super) fn held_bytes(t: &super::gguf::TensorInfo) -> u64 {
    let elements: u64 = t.dims.iter().product();
    match t.kind {
        TensorType::Quant(_) => t.bytes,
        TensorType::Bf16 | TensorType::F16 if t.dims.len() == 2 => t.bytes,
        _ => elements.saturating_mul(4),
    }
}

/// The `tokenizer.ggml.pre` values whose pre-tokenization is built here, and the pre-tokenizer
/// `tokenizer.json` writes for each (llama.cpp's `llama-vocab.cpp` regexes, as the Hugging Face
/// tokenizers they come from write them).
fn pre_tokenizer(pre: &str) -> Option<Json> {
    let byte_level = |use_regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": use_regex})
    };
    let split = |regex: &str| {
        json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
               "invert": false})
    };
    Some(match pre {
        "default" | "gpt-2" | "gpt2" => byte_level(true),
        // Digits one by one, then GPT-2's split (SmolLM, StarCoder).
        "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama-bpe" | "llama3" => json!({"type": "Sequence", "pretokenizers": [
            split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            byte_level(false)]}),
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [
            split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            byte_level(false)]}),
        _ => return None,
    })
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(items) = g.array(key)? else {
        return Ok(None);
    };
    items
        .iter()
        .map(|v| match v {
            Value::Str(s) => Ok(s.as_str()),
            _ => Err(refuse(g, format!("metadata `{key}` holds a non-string"))),
        })
        .collect::<Result<_>>()
        .map(Some)
}

/// `tokenizer.json` built from `tokenizer.ggml.*` (byte-level BPE, `tokenizer.ggml.model` =
/// `gpt2`), or why it cannot be.
pub(super) fn tokenizer_json(g: &Gguf) -> Result<String> {
    let hint = "put the model's tokenizer.json beside the GGUF file";
    let model = g.str("tokenizer.ggml.model")?.unwrap_or_default();
    if model != "gpt2" {
        return Err(refuse(
            g,
            format!("`tokenizer.ggml.model` `{model}` is not built from GGUF (gpt2 is); {hint}"),
        ));
    }
    let pre = g.str("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre_tokenizer = pre_tokenizer(pre).ok_or_else(|| {
        refuse(
            g,
            format!("`tokenizer.ggml.pre` `{pre}` is not built from GGUF; {hint}"),
        )
    })?;
    let tokens = strings(g, "tokenizer.ggml.tokens")?
        .ok_or_else(|| refuse(g, "metadata `tokenizer.ggml.tokens` is missing".into()))?;
    let merges = strings(g, "tokenizer.ggml.merges")?.unwrap_or_default();
    let types: Vec<i128> = match g.array("tokenizer.ggml.token_type")? {
        None => Vec::new(),
        Some(v) => v
            .iter()
            .map(|t| match t {
                Value::Int(i) => Ok(*i),
                _ => Err(refuse(
                    g,
                    "`tokenizer.ggml.token_type` holds a non-integer".into(),
                )),
            })
            .collect::<Result<_>>()?,
    };
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert((*token).to_string(), json!(id));
        // 3: control (special), 4: user-defined (matched whole, not special).
        let kind = types.get(id).copied().unwrap_or(1);
        if kind == 3 || kind == 4 {
            added.push(json!({"id": id, "content": token, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": kind == 3}));
        }
    }
    let bos = g.int("tokenizer.ggml.bos_token_id")?;
    let post_processor = match (g.bool("tokenizer.ggml.add_bos_token")?, bos) {
        (Some(true), Some(b)) => {
            let text = tokens.get(b as usize).copied().unwrap_or_default();
            json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {text: {"id": text, "ids": [b], "tokens": [text]}}})
        }
        _ => Json::Null,
    };
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    })
    .to_string())
}

/// `tokenizer_config.json` from the metadata: the chat template (`tokenizer.chat_template`)
/// and the BOS/EOS texts it may use.
pub(super) fn tokenizer_config_json(g: &Gguf) -> Result<String> {
    let tokens = strings(g, "tokenizer.ggml.tokens")?.unwrap_or_default();
    let text = |key: &str| -> Result<Json> {
        Ok(match g.int(key)? {
            Some(id) => tokens.get(id as usize).map_or(Json::Null, |t| json!(t)),
            None => Json::Null,
        })
    };
    Ok(json!({
        "chat_template": g.str("tokenizer.chat_template")?,
        "bos_token": text("tokenizer.ggml.bos_token_id")?,
        "eos_token": text("tokenizer.ggml.eos_token_id")?,
    })
    .to_string())
}

/// `generation_config.json` from the metadata: EOS and end-of-turn ids stop a sequence.
pub(super) fn generation_config_json(g: &Gguf) -> Result<String> {
    let mut eos = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = g.int(key)? {
            eos.push(id);
        }
    }
    eos.dedup();
    Ok(json!({ "eos_token_id": eos }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rows_are_put_back_in_halves() {
        // One head of 4 rows stored as (0, 2, 1, 3): HF row 1 (first half, i=1) is GGUF row 2.
        assert_eq!(unpermuted_rows(4, 1), vec![0, 2, 1, 3]);
        assert_eq!(unpermuted_rows(8, 2), vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }
}
