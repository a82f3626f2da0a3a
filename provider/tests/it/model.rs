//! Loading Hugging Face directories: dtypes, shards, tied heads, bad files; the logits tool.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use cx_kernels::CpuConfig;
use cx_provider::Error;
use cx_provider::model::{
    DType, GenModelOptions, KvCache, Model, ModelFiles, SeqInput, read_config, tensors_from_bytes,
    write_generated_model,
};

use crate::common::{TempDir, tiny_model, tiny_options};

fn last_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = KvCache::default();
    model
        .forward(&mut [SeqInput {
            tokens,
            cache: &mut cache,
            adapter: None,
        }])
        .unwrap()
        .remove(0)
}

/// A model split into two shards with `model.safetensors.index.json` loads to the same bits.
#[test]
fn sharded_checkpoint_loads_the_same_model() {
    let dir = TempDir::new("shards");
    let (single, _) = tiny_model(dir.path(), 7);
    let tensors =
        candle_core::safetensors::load(single.join("model.safetensors"), &Device::Cpu).unwrap();
    let sharded = dir.path().join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    std::fs::copy(single.join("config.json"), sharded.join("config.json")).unwrap();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut shards: [HashMap<String, Tensor>; 2] = [HashMap::new(), HashMap::new()];
    let mut weight_map = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i % 2 + 1);
        shards[i % 2].insert((*name).clone(), tensors[*name].clone());
        weight_map.insert((*name).clone(), file.into());
    }
    for (i, shard) in shards.iter().enumerate() {
        candle_core::safetensors::save(
            shard,
            sharded.join(format!("model-0000{}-of-00002.safetensors", i + 1)),
        )
        .unwrap();
    }
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let a = Model::load(&single, CpuConfig::deterministic()).unwrap();
    let b = Model::load(&sharded, CpuConfig::deterministic()).unwrap();
    let tokens = [256, 1, 2, 3];
    assert_eq!(last_logits(&a, &tokens), last_logits(&b, &tokens));
}

/// An F16 checkpoint's matrices are held at two bytes an element, as its headers and the
/// exchange's catalog count them (before, they were widened to four), and every logit has the
/// bits of the same values held as `f32` (each f16 is exactly an f32, and the kernels widen it
/// as they read it).
#[test]
fn f16_matrices_are_held_at_their_size_with_the_bits_of_their_values() {
    let dir = TempDir::new("f16");
    let path = dir.path().join("f16");
    let options = GenModelOptions {
        dtype: DType::F16,
        ..tiny_options(8)
    };
    write_generated_model(&path, &options).unwrap();
    let weights = path.join("model.safetensors");
    let widened = tensors_from_bytes(&weights, &std::fs::read(&weights).unwrap()).unwrap();
    for cpu in [
        CpuConfig::deterministic(),
        CpuConfig::default().with_threads(2),
    ] {
        let held = Model::load(&path, cpu).unwrap();
        let f32_model = Model::new(read_config(&path).unwrap(), widened.clone(), cpu).unwrap();
        for tokens in [&[256, 5, 6][..], &(0..40).collect::<Vec<u32>>()] {
            let (a, b) = (last_logits(&held, tokens), last_logits(&f32_model, tokens));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&a),
                bits(&b),
                "{:?}, {} tokens",
                cpu.mode,
                tokens.len()
            );
        }
        let matrices: usize = widened
            .values()
            .filter(|(shape, _)| shape.len() == 2)
            .map(|(_, data)| data.len())
            .sum();
        assert_eq!(held.weight_bytes() + 2 * matrices, f32_model.weight_bytes());
        assert_eq!(
            ModelFiles::locate(&path).unwrap().held_bytes().unwrap(),
            held.weight_bytes() as u64
        );
    }
}

/// BF16 and F16 checkpoints load; their logits are the F32 model's up to the
/// storage rounding, and a tied model needs no `lm_head.weight`.
#[test]
fn half_precision_and_tied_checkpoints_load() {
    let dir = TempDir::new("dtypes");
    let f32_dir = dir.path().join("f32");
    write_generated_model(&f32_dir, &tiny_options(8)).unwrap();
    let reference = last_logits(
        &Model::load(&f32_dir, CpuConfig::deterministic()).unwrap(),
        &[256, 5, 6],
    );
    for dtype in [DType::Bf16, DType::F16] {
        let path = dir.path().join(format!("{dtype:?}"));
        let config = write_generated_model(
            &path,
            &GenModelOptions {
                dtype,
                ..tiny_options(8)
            },
        )
        .unwrap();
        assert_ne!(config.torch_dtype.as_deref(), Some("float32"));
        let logits = last_logits(
            &Model::load(&path, CpuConfig::deterministic()).unwrap(),
            &[256, 5, 6],
        );
        let worst = logits
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst > 0.0 && worst < 0.1,
            "{dtype:?}: worst difference {worst}"
        );
    }
    let tied = dir.path().join("tied");
    write_generated_model(
        &tied,
        &GenModelOptions {
            tie: true,
            ..tiny_options(9)
        },
    )
    .unwrap();
    let names =
        candle_core::safetensors::load(tied.join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(!names.contains_key("lm_head.weight"));
    assert_eq!(
        last_logits(
            &Model::load(&tied, CpuConfig::deterministic()).unwrap(),
            &[256]
        )
        .len(),
        300
    );
}

/// Broken directories are refused with the reason.
#[test]
fn malformed_model_directories_are_refused() {
    let dir = TempDir::new("bad-model");
    let (path, _) = tiny_model(dir.path(), 1);
    // A tensor of the wrong shape.
    let mut tensors =
        candle_core::safetensors::load(path.join("model.safetensors"), &Device::Cpu).unwrap();
    tensors.insert(
        "model.norm.weight".into(),
        Tensor::zeros(7, candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, path.join("model.safetensors")).unwrap();
    let err = Model::load(&path, CpuConfig::deterministic()).unwrap_err();
    assert!(
        matches!(err, Error::Model(ref m) if m.contains("model.norm.weight")),
        "{err}"
    );
    // Heads that do not divide.
    std::fs::write(
        path.join("config.json"),
        r#"{"hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":3,"vocab_size":300}"#,
    )
    .unwrap();
    assert!(matches!(
        Model::load(&path, CpuConfig::deterministic()),
        Err(Error::Config { .. })
    ));
    // Garbage weights.
    std::fs::write(
        path.join("config.json"),
        serde_json::to_string(&tiny_model(dir.path(), 1).1).unwrap(),
    )
    .unwrap();
    std::fs::write(path.join("model.safetensors"), b"not a safetensors file").unwrap();
    assert!(matches!(
        Model::load(&path, CpuConfig::deterministic()),
        Err(Error::Safetensors { .. })
    ));
}

/// `cx-provider logits --json` prints the library's last-position logits.
#[test]
fn logits_command_prints_the_forward() {
    let dir = TempDir::new("logits-cli");
    let (path, config) = tiny_model(dir.path(), 2);
    let adapter = crate::common::adapters(dir.path(), &config, 1, &[8]).remove(0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cx-provider"))
        .args(["logits", "--model"])
        .arg(&path)
        .arg("--adapter")
        .arg(&adapter)
        .args(["--tokens", "256,72,105", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let printed: Vec<f32> = parsed["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let model = Model::load(&path, CpuConfig::deterministic()).unwrap();
    let lora = cx_provider::lora::load_adapter(&adapter, &config, 64).unwrap();
    let mut cache = KvCache::default();
    let expected = model
        .forward(&mut [SeqInput {
            tokens: &[256, 72, 105],
            cache: &mut cache,
            adapter: Some(&lora),
        }])
        .unwrap()
        .remove(0);
    assert_eq!(printed, expected, "JSON round-trips f32 exactly");
}

const WORD_LEVEL_TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"hello":0,"world":1,"[UNK]":2},"unk_token":"[UNK]"}}"#;

/// A model directory's `tokenizer.json` is read through the Hugging Face `tokenizers` crate
/// in every build (it once needed a feature the default build lacked, so no provider on the
/// market could serve a real model).
#[test]
fn tokenizer_json_is_read_in_every_build() {
    let dir = TempDir::new("tokenizer");
    let (path, config) = tiny_model(dir.path(), 1);
    std::fs::write(path.join("tokenizer.json"), WORD_LEVEL_TOKENIZER).unwrap();
    let tokenizer = cx_provider::tokenizer::Tokenizer::for_model(&path, &config).unwrap();
    assert_eq!(tokenizer.name(), "tokenizer.json");
    assert_eq!(
        tokenizer.encode("hello world hello").unwrap(),
        vec![0, 1, 0]
    );
    assert_eq!(tokenizer.decode(&[1, 0]).unwrap(), "world hello");
}

/// `gen-model` writes a real byte-level `tokenizer.json` (so llama.cpp's converter,
/// transformers and vLLM take generated models); the provider recognises it and keeps its own
/// byte tokenizer, and a changed file is not mistaken for it.
#[test]
fn generated_tokenizer_json_is_served_by_the_byte_tokenizer() {
    let dir = TempDir::new("gen-tokenizer");
    let (path, config) = tiny_model(dir.path(), 1);
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path.join("tokenizer.json")).unwrap()).unwrap();
    assert_eq!(written["model"]["type"], "BPE");
    assert_eq!(written["model"]["byte_fallback"], true);
    let vocab = written["model"]["vocab"].as_object().unwrap();
    assert_eq!(vocab.len(), config.vocab_size);
    assert_eq!(vocab["<0x41>"], 0x41);
    assert_eq!(vocab["<s>"], 256);
    assert_eq!(vocab["</s>"], 257);
    assert!(path.join("tokenizer_config.json").exists());

    let tokenizer = cx_provider::tokenizer::Tokenizer::for_model(&path, &config).unwrap();
    assert_eq!(tokenizer.name(), "bytes");
    assert_eq!(tokenizer.encode("Hé").unwrap(), vec![256, 72, 0xC3, 0xA9]);

    let mut other = written.clone();
    other["model"]["byte_fallback"] = serde_json::json!(false);
    std::fs::write(path.join("tokenizer.json"), other.to_string()).unwrap();
    let result = cx_provider::tokenizer::Tokenizer::for_model(&path, &config);
    assert_eq!(result.unwrap().name(), "tokenizer.json");
}
