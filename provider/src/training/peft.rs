//! A trained adapter's files as PEFT 0.21 writes them (`save_pretrained`): the full
//! `adapter_config.json` of `LoraConfig` (every key PEFT 0.21.2 writes, in its sorted order,
//! the ones we do not use at their defaults) and `adapter_model.safetensors` with `F32` tensors
//! named `base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight` and the
//! `{"format": "pt"}` metadata. `tests/fixtures/hf/llama3-lora` holds a pair PEFT wrote itself.

use std::collections::HashMap;

use cx_protocol::model_config::{ModelConfig, Projection};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::json;

use super::LoraSpec;
use crate::error::{Error, Result};

/// PEFT's name of one LoRA tensor (`which` is `A` or `B`).
pub(super) fn tensor_name(layer: usize, projection: Projection, which: &str) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.lora_{which}.weight",
        projection.module_path()
    )
}

/// `adapter_config.json` bytes (pretty, sorted keys, as PEFT's `to_json_string` writes).
pub(super) fn adapter_config(spec: &LoraSpec, base_model_name: Option<&str>) -> Vec<u8> {
    // PEFT writes an integral alpha as an integer.
    let alpha = if spec.lora_alpha.fract() == 0.0 && spec.lora_alpha.abs() < 1e15 {
        json!(spec.lora_alpha as i64)
    } else {
        json!(spec.lora_alpha)
    };
    let targets: Vec<&str> = spec.target_modules.iter().map(|p| p.name()).collect();
    let config = json!({
        "alora_invocation_tokens": null,
        "alpha_pattern": {},
        "arrow_config": null,
        "auto_mapping": null,
        "base_model_name_or_path": base_model_name,
        "bias": "none",
        "corda_config": null,
        "ensure_weight_tying": false,
        "eva_config": null,
        "exclude_modules": null,
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "kasa_config": null,
        "layer_replication": null,
        "layers_pattern": null,
        "layers_to_transform": null,
        "loftq_config": {},
        "lora_alpha": alpha,
        "lora_bias": false,
        "lora_dropout": 0.0,
        "lora_ga_config": null,
        "megatron_config": null,
        "megatron_core": "megatron.core",
        "modules_to_save": null,
        "monteclora_config": null,
        "peft_type": "LORA",
        "peft_version": "0.21.2",
        "qalora_group_size": 16,
        "r": spec.rank,
        "rank_pattern": {},
        "revision": null,
        "target_modules": targets,
        "target_parameters": null,
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": null,
        "use_bdlora": null,
        "use_dora": false,
        "use_qalora": false,
        "use_rslora": spec.use_rslora,
        "velora_config": null,
    });
    // serde_json's map is a BTreeMap here (no `preserve_order`), so keys come out sorted.
    let mut text = serde_json::to_string_pretty(&config).expect("JSON serialises");
    text.push('\n');
    text.into_bytes()
}

/// `adapter_model.safetensors` bytes: per (layer, projection), `A` (`rank × d_in`) and `B`
/// (`d_out × rank`), row-major `f32`.
pub(super) fn adapter_weights(
    config: &ModelConfig,
    rank: usize,
    tensors: &[(usize, Projection, Vec<f32>, Vec<f32>)],
) -> Result<Vec<u8>> {
    let mut named: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (layer, projection, a, b) in tensors {
        let (d_in, d_out) = config.projection_shape(*projection);
        named.push((
            tensor_name(*layer, *projection, "A"),
            vec![rank, d_in],
            a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
        named.push((
            tensor_name(*layer, *projection, "B"),
            vec![d_out, rank],
            b.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
    }
    let views = named
        .iter()
        .map(|(name, shape, data)| {
            TensorView::new(Dtype::F32, shape.clone(), data)
                .map(|view| (name.clone(), view))
                .map_err(|e| Error::Model(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(metadata)).map_err(|e| Error::Model(e.to_string()))
}
