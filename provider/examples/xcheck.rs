//! Cross-checks the provider's Llama forward against an independent implementation,
//! candle-transformers' `models::llama`, on a generated model: grouped-query attention, RoPE
//! with and without `llama3` scaling, 40 positions. Exits non-zero past the tolerance.
//!
//! `cargo run --release -p cx-provider --features xcheck --example xcheck`

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Llama, LlamaConfig as CtConfig};
use cx_kernels::CpuConfig;
use cx_provider::model::DType as StorageDType;
use cx_provider::model::{GenModelOptions, KvCache, Model, SeqInput, write_generated_model};

fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("cx-xcheck-{}", std::process::id()));
    let options = GenModelOptions {
        hidden: 64,
        layers: 3,
        heads: 8,
        kv_heads: 2,
        intermediate: 96,
        vocab: 400,
        max_positions: 128,
        tie: false,
        dtype: StorageDType::F32,
        seed: 9,
    };
    write_generated_model(&dir, &options)?;
    let tokens: Vec<u32> = (0..40).map(|i| 32 + (i * 37) % 200).collect();
    let mut worst_overall = 0f32;
    for scaling in [false, true] {
        if scaling {
            let path = dir.join("config.json");
            let mut config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            config["rope_theta"] = 500000.0.into();
            config["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16
            });
            std::fs::write(&path, config.to_string())?;
        }
        let ours = {
            let model = Model::load(&dir, CpuConfig::deterministic())?;
            let mut cache = KvCache::default();
            model
                .forward(&mut [SeqInput {
                    tokens: &tokens,
                    cache: &mut cache,
                    adapter: None,
                }])?
                .remove(0)
        };
        let theirs = {
            let config: CtConfig =
                serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
            let config = config.into_config(false);
            let weights =
                candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)?;
            let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
            let model = Llama::load(vb, &config)?;
            let mut cache = Cache::new(false, DType::F32, &config, &Device::Cpu)?;
            let input = Tensor::new(tokens.as_slice(), &Device::Cpu)?.unsqueeze(0)?;
            model
                .forward(&input, 0, &mut cache)?
                .squeeze(0)?
                .to_vec1::<f32>()?
        };
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!("llama3 rope scaling: {scaling:5}  max |ours − candle-transformers| = {worst:e}");
        worst_overall = worst_overall.max(worst);
    }
    std::fs::remove_dir_all(&dir).ok();
    anyhow::ensure!(worst_overall < 1e-4, "logits differ by {worst_overall}");
    Ok(())
}
