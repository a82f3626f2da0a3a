//! Files written by transformers 5 and PEFT 0.21 themselves (`tests/fixtures/hf`, made by
//! `make_fixtures.py` there): the forward matches transformers' logits for θ ≠ 10000 and for
//! llama3 RoPE scaling, with and without a PEFT adapter, and for every architecture it runs
//! (Qwen2 with its q/k/v biases, Qwen3 with its q/k norms and wide heads, Mistral, Llama tied
//! or with biases), in the serving forward and the training forward; configs and adapters with
//! fields the forward does not implement are refused, naming the field.

use std::path::{Path, PathBuf};

use cx_kernels::CpuConfig;
use cx_provider::lora::load_adapter;
use cx_provider::model::{
    KvCache, Model, NamedTensors, Projection, SeqInput, read_config, tensors_from_bytes,
};
use cx_provider::training::{LoraSpec, Precision, TrainingClient};
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
    let named: NamedTensors = tensors
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
        ("gelu.json", "`hidden_act`"),
        ("qwen2-sliding.json", "`use_sliding_window`"),
        ("mistral-sliding.json", "`sliding_window`"),
        ("qwen2-moe.json", "`model_type`"),
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

/// The fixture's weights as the loader reads them (name → (shape, data)).
fn fixture_tensors(name: &str) -> NamedTensors {
    let path = fixture(name).join("model.safetensors");
    tensors_from_bytes(&path, &std::fs::read(&path).unwrap()).unwrap()
}

/// The fixture's `config.json`, parsed and checked as [`read_config`] does.
fn fixture_config(name: &str) -> cx_provider::model::ModelConfig {
    read_config(&fixture(name)).unwrap()
}

/// Loads fixture `name`, checks its weight count and every prompt's last logits against
/// transformers' within 1e-4 relative, and returns the worst relative error (printed for the
/// record).
fn assert_matches_transformers(name: &str) -> f32 {
    let want = expected(name);
    let model = Model::load(&fixture(name), CpuConfig::deterministic()).unwrap();
    // Every stored tensor is held and counted: biases and q/k norms too.
    let stored: usize = fixture_tensors(name).values().map(|(_, d)| d.len()).sum();
    assert_eq!(model.weight_bytes(), 4 * stored, "{name}: weight_bytes");
    let mut worst = 0f32;
    for (prompt, logits) in want.prompts.iter().zip(&want.logits) {
        let err = relative_error(&last_logits(&model, prompt, None), logits);
        assert!(err <= 1e-4, "{name}: relative error {err} for {prompt:?}");
        worst = worst.max(err);
    }
    eprintln!("{name}: worst relative error against transformers {worst:e}");
    worst
}

/// Qwen2/Qwen2.5: biases on q, k and v that no config field announces, a tied head, and
/// `max_window_layers` beside `use_sliding_window: false` (no window). Before, `model_type`
/// qwen2 was refused; read as Llama, the biases were unused tensors.
#[test]
fn qwen2_with_qkv_biases_and_a_tied_head_matches_transformers() {
    let model = Model::load(&fixture("qwen2"), CpuConfig::deterministic()).unwrap();
    assert_eq!(
        model.architecture(),
        cx_provider::model::Architecture::Qwen2
    );
    assert!(model.config().tie_word_embeddings);
    assert_matches_transformers("qwen2");
}

/// Qwen3: an RMSNorm over each head of q and k before RoPE, and `head_dim` 24 where
/// hidden/heads is 16 (q_proj 64 → 96, o_proj 96 → 64).
#[test]
fn qwen3_with_qk_norms_and_wide_heads_matches_transformers() {
    let config = fixture_config("qwen3");
    assert_eq!((config.head_dim(), config.hidden_size / 4), (24, 16));
    assert_matches_transformers("qwen3");
}

#[test]
fn mistral_without_a_window_matches_transformers() {
    assert_matches_transformers("mistral");
}

/// Llama with `tie_word_embeddings`: the head is the embedding (transformers stores no
/// `lm_head.weight`).
#[test]
fn llama_with_a_tied_head_matches_transformers() {
    assert!(fixture_config("llama-tied").tie_word_embeddings);
    assert_matches_transformers("llama-tied");
}

/// Llama's `attention_bias` (q/k/v/o) and `mlp_bias` (gate/up/down), refused before.
#[test]
fn llama_with_attention_and_mlp_biases_matches_transformers() {
    let config = fixture_config("llama-bias");
    assert!(config.attention_bias && config.mlp_bias);
    assert_matches_transformers("llama-bias");
}

/// A PEFT adapter on Qwen2 (llama3-lora/, the same shapes): PEFT adds the delta to the base
/// layer's output, bias included; the unmerged forward matches it, and the merged-weight
/// reference keeps the biases.
#[test]
fn a_peft_adapter_on_qwen2_matches_transformers_and_its_merged_weights() {
    let want = expected("qwen2");
    let model = Model::load(&fixture("qwen2"), CpuConfig::deterministic()).unwrap();
    let adapter = load_adapter(&fixture("llama3-lora"), model.config(), 64).unwrap();
    let merged = model.merged_with(&adapter).unwrap();
    assert_eq!(merged.weight_bytes(), model.weight_bytes());
    let mut worst = 0f32;
    for (i, prompt) in want.prompts.iter().enumerate() {
        let got = last_logits(&model, prompt, Some(&adapter));
        let err = relative_error(&got, &want.adapter_logits[i]);
        assert!(err <= 1e-4, "adapter: relative error {err} for prompt {i}");
        worst = worst.max(err);
        let err = relative_error(&last_logits(&merged, prompt, None), &got);
        assert!(err <= 1e-5, "merged: relative error {err} for prompt {i}");
    }
    eprintln!("qwen2 + llama3-lora: worst relative error against PEFT {worst:e}");
}

/// Guards the parts the new architectures add: with Qwen2's (or Llama's) biases zeroed, or
/// Qwen3's q/k norms left out (its weights run as Llama), the logits are visibly not
/// transformers' — so the match above is owed to them. And a checkpoint whose config does not
/// announce them is refused, naming the tensor, not run without them.
#[test]
fn qwen2_biases_and_qwen3_qk_norms_change_the_logits() {
    let cpu = CpuConfig::deterministic();
    let long = |name: &str| {
        let want = expected(name);
        (want.prompts[1].clone(), want.logits[1].clone())
    };
    for name in ["qwen2", "llama-bias"] {
        let (prompt, want) = long(name);
        let mut tensors = fixture_tensors(name);
        let mut zeroed = 0;
        for (tensor, (_, data)) in tensors.iter_mut() {
            if tensor.ends_with(".bias") {
                data.fill(0.0);
                zeroed += 1;
            }
        }
        assert_eq!(zeroed, if name == "qwen2" { 3 * 2 } else { 7 * 2 });
        let model = Model::new(fixture_config(name), tensors, cpu).unwrap();
        let err = relative_error(&last_logits(&model, &prompt, None), &want);
        assert!(
            err > 1e-2,
            "{name} without biases: relative error only {err}"
        );
        eprintln!("{name} with biases zeroed: relative error {err:.3}");
    }

    // Qwen3 without its norms is Llama on the same weights (same head_dim, θ, tied or not).
    let (prompt, want) = long("qwen3");
    let mut as_llama = fixture_config("qwen3");
    as_llama.model_type = Some("llama".into());
    let mut tensors = fixture_tensors("qwen3");
    let err = Model::new(as_llama.clone(), tensors.clone(), cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("self_attn.k_norm.weight"), "{err}");
    tensors.retain(|name, _| !name.ends_with("q_norm.weight") && !name.ends_with("k_norm.weight"));
    let without_norms = Model::new(as_llama, tensors, cpu).unwrap();
    let err = relative_error(&last_logits(&without_norms, &prompt, None), &want);
    assert!(
        err > 1e-2,
        "qwen3 without q/k norms: relative error only {err}"
    );
    eprintln!("qwen3 without q/k norms: relative error {err:.3}");

    // Qwen2's weights under a config that does not announce biases: refused by tensor name.
    let mut as_llama = fixture_config("qwen2");
    as_llama.model_type = Some("llama".into());
    let err = Model::new(as_llama, fixture_tensors("qwen2"), cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("self_attn.k_proj.bias"), "{err}");
}

/// The training forward (candle autograd over the serving model's frozen tensors) computes the
/// same biases and q/k norms: a fresh client (B = 0) gives transformers' logits, and a client
/// with a non-zero delta gives what its adapter gives through the serving path.
#[test]
fn training_forward_matches_transformers_on_biases_and_qk_norms() {
    for name in ["qwen2", "qwen3", "llama-bias"] {
        let want = expected(name);
        let model = Model::load(&fixture(name), CpuConfig::deterministic()).unwrap();
        let spec = LoraSpec::new(2, 4.0, &Projection::ALL);
        let mut client = TrainingClient::new(&model, &spec, Precision::F32).unwrap();
        for (prompt, logits) in want.prompts.iter().zip(&want.logits) {
            let got = client.logits(prompt).unwrap().pop().unwrap();
            let err = relative_error(&got, logits);
            assert!(err <= 1e-4, "{name}: training forward relative error {err}");
        }
        client.randomize_b(7, 0.2).unwrap();
        let adapter = client.to_adapter("t".into()).unwrap();
        let prompt = &want.prompts[1];
        let trained = client.logits(prompt).unwrap().pop().unwrap();
        let served = last_logits(&model, prompt, Some(&adapter));
        assert!(
            relative_error(&trained, &want.logits[1]) > 1e-3,
            "{name}: delta too small"
        );
        let err = relative_error(&trained, &served);
        assert!(
            err <= 1e-5,
            "{name}: training vs serving relative error {err}"
        );
    }
}

/// Autograd's gradients through Qwen3's q/k norms and Qwen2's biases against central
/// differences in f64 (first and last element of each A and B of q and k, layer 0 and 1).
#[test]
fn gradients_through_qk_norms_and_biases_match_finite_differences() {
    for name in ["qwen3", "qwen2"] {
        let model = Model::load(&fixture(name), CpuConfig::deterministic()).unwrap();
        let spec = LoraSpec {
            seed: 4,
            ..LoraSpec::new(2, 4.0, &[Projection::Q, Projection::K])
        };
        let mut client = TrainingClient::new(&model, &spec, Precision::F64).unwrap();
        client.randomize_b(5, 0.2).unwrap();
        let sequences = vec![vec![1, 5, 9, 200, 17, 33], vec![1, 40, 41]];
        let mask = vec![vec![0.0, 1.0, 1.0, 0.5, 1.0, 1.0], vec![0.0, 1.0, 1.0]];
        client.forward_backward(&sequences, &mask).unwrap();
        let grads = client.gradients().unwrap().unwrap();
        let params = client.parameters().unwrap();
        let h = 1e-5;
        let mut worst = 0f64;
        for ((pname, values), (_, grad)) in params.iter().zip(&grads) {
            for index in [0, values.len() - 1] {
                let original = values[index];
                client
                    .set_parameter_element(pname, index, original + h)
                    .unwrap();
                let plus = client.loss(&sequences, &mask).unwrap();
                client
                    .set_parameter_element(pname, index, original - h)
                    .unwrap();
                let minus = client.loss(&sequences, &mask).unwrap();
                client
                    .set_parameter_element(pname, index, original)
                    .unwrap();
                let numeric = (plus - minus) / (2.0 * h);
                let error = (numeric - grad[index]).abs() / grad[index].abs().max(1e-4);
                // A missing or wrong term is off by O(1); the difference quotient itself is
                // good to ~1e-6 here (measured: 7e-7 on qwen3).
                assert!(
                    error < 1e-5,
                    "{name} {pname}[{index}]: autograd {:e}, finite differences {numeric:e}",
                    grad[index]
                );
                worst = worst.max(error);
            }
        }
        eprintln!("{name} gradient check: worst relative error {worst:e}");
    }
}
