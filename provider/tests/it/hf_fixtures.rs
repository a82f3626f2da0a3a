//! Files written by transformers 5 and PEFT 0.21 themselves (`tests/fixtures/hf`, made by
//! `make_fixtures.py` there): the forward matches transformers' logits for θ ≠ 10000 and for
//! llama3 RoPE scaling, with and without a PEFT adapter; configs and adapters with fields the
//! forward does not implement are refused, naming the field.

use std::path::{Path, PathBuf};

use cx_kernels::CpuConfig;
use cx_provider::lora::load_adapter;
use cx_provider::model::{KvCache, Model, SeqInput, read_config};
use serde::Deserialize;

use crate::common::TempDir;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

#[derive(Deserialize)]
struct Expected {
    prompts: Vec<Vec<u32>>,
    logits: Vec<Vec<f32>>,
    #[serde(default)]
    adapter_logits: Vec<Vec<f32>>,
}

fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn last_logits(
    model: &Model,
    tokens: &[u32],
    adapter: Option<&cx_provider::lora::Adapter>,
) -> Vec<f32> {
    let mut cache = KvCache::default();
    model
        .forward(&mut [SeqInput {
            tokens,
            cache: &mut cache,
            adapter,
        }])
        .unwrap()
        .remove(0)
}

/// `max |got − want| / max |want|`.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    diff / scale
}

/// Guards the bug where `rope_parameters` (transformers ≥ 5) was ignored and θ fell back to
/// 10000: logits were wrong with no warning.
#[test]
fn rope_parameters_theta_matches_transformers() {
    let want = expected("theta");
    let model = Model::load(&fixture("theta"), CpuConfig::deterministic()).unwrap();
    assert_eq!(model.config().rope_theta, 500_000.0);
    for (prompt, logits) in want.prompts.iter().zip(&want.logits) {
        let err = relative_error(&last_logits(&model, prompt, None), logits);
        assert!(err < 1e-4, "relative error {err} for {prompt:?}");
    }
    // The same weights at θ = 10000 are visibly different: the test can tell.
    let text = std::fs::read_to_string(fixture("theta/config.json")).unwrap();
    let old_form = text.replace("\"rope_parameters\"", "\"ignored_rope_parameters\"");
    let wrong = cx_provider::model::config::parse_config(&old_form, Path::new("x")).unwrap();
    assert_eq!(wrong.rope_theta, 10_000.0);
    let long = &want.prompts[1];
    let tensors = candle_core::safetensors::load(
        fixture("theta/model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let named = tensors
        .into_iter()
        .map(|(n, t)| {
            let shape = t.dims().to_vec();
            (
                n,
                (shape, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()),
            )
        })
        .collect();
    let at_10k = Model::new(wrong, named, CpuConfig::deterministic()).unwrap();
    assert!(relative_error(&last_logits(&at_10k, long, None), &want.logits[1]) > 1e-3);
}

#[test]
fn llama3_rope_scaling_and_a_peft_adapter_match_transformers() {
    let want = expected("llama3");
    let model = Model::load(&fixture("llama3"), CpuConfig::deterministic()).unwrap();
    let scaling = model.config().rope_scaling.clone().unwrap();
    assert_eq!(scaling.rope_type, "llama3");
    assert_eq!(scaling.original_max_position_embeddings, Some(16));
    let adapter = load_adapter(&fixture("llama3-lora"), model.config(), 64).unwrap();
    for (i, prompt) in want.prompts.iter().enumerate() {
        let err = relative_error(&last_logits(&model, prompt, None), &want.logits[i]);
        assert!(err < 1e-4, "base: relative error {err} for prompt {i}");
        let err = relative_error(
            &last_logits(&model, prompt, Some(&adapter)),
            &want.adapter_logits[i],
        );
        assert!(err < 1e-4, "adapter: relative error {err} for prompt {i}");
    }
}

/// Configs transformers 5 writes with fields this forward does not implement: each refusal
/// names the field.
#[test]
fn unsupported_transformers_configs_are_refused_by_field() {
    for (file, field) in [
        ("mlp_bias.json", "`mlp_bias`"),
        ("gelu.json", "`hidden_act`"),
        ("yarn.json", "`rope_parameters.rope_type`"),
        ("dynamic.json", "`rope_parameters.rope_type`"),
    ] {
        let text = std::fs::read_to_string(fixture("refused").join(file)).unwrap();
        let err = cx_provider::model::config::parse_config(&text, Path::new(file))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{file}: {err}");
    }
    // And the whole directory path refuses the same way.
    let dir = TempDir::new("refused-dir");
    std::fs::copy(fixture("refused/yarn.json"), dir.path().join("config.json")).unwrap();
    assert!(
        read_config(dir.path())
            .unwrap_err()
            .to_string()
            .contains("yarn")
    );
}

/// PEFT's aLoRA applies the delta only from the invocation tokens on; serving it at every
/// position gave different output, so it is refused. DoRA likewise.
#[test]
fn alora_and_dora_adapters_from_peft_are_refused_by_key() {
    let model = Model::load(&fixture("llama3"), CpuConfig::deterministic()).unwrap();
    for (name, key) in [("alora", "alora_invocation_tokens"), ("dora", "use_dora")] {
        let err = load_adapter(&fixture(name), model.config(), 64)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{name}: {err}");
    }
}
