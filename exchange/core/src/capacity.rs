//! Capacity arithmetic (SPEC §5): a tool users can check residency claims with. Decimal units
//! throughout (1 MB = 10⁶ B, 1 GB = 10⁹ B).
//!
//! - A LoRA on a projection `d_in → d_out` at rank r adds `r·(d_in + d_out)` parameters
//!   (A is r × d_in, B is d_out × r); with T square projections of size d in each of L layers
//!   that is `2·r·L·T·d`.
//! - Adapters beside one shared base: free memory / adapter size, whole adapters only.
//! - N personalised agents: one process per adapter costs N copies of the base; per-sequence
//!   adapter selection costs one base plus N adapters.

use crate::error::{Result, invalid};
pub use cx_protocol::model_config::{DType, ModelConfig, Projection};
use serde::Serialize;

/// Bytes per decimal gigabyte.
pub const GB: f64 = 1e9;
/// Bytes per decimal megabyte.
pub const MB: f64 = 1e6;

/// Parameters and bytes of an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AdapterSize {
    /// Parameter count.
    pub params: u64,
    /// Bytes at the chosen dtype.
    pub bytes: u64,
}

/// `2·r·L·T·d` parameters for T square d × d projections in each of L layers.
pub fn adapter_square(
    hidden: u64,
    layers: u64,
    targets: u64,
    rank: u64,
    dtype: DType,
) -> Result<AdapterSize> {
    for (field, v) in [
        ("hidden", hidden),
        ("layers", layers),
        ("targets", targets),
        ("rank", rank),
    ] {
        if v == 0 {
            return Err(invalid(field, "must be > 0"));
        }
    }
    let params = 2u64
        .checked_mul(rank)
        .and_then(|p| p.checked_mul(layers))
        .and_then(|p| p.checked_mul(targets))
        .and_then(|p| p.checked_mul(hidden))
        .ok_or_else(|| invalid("hidden", "the product overflows 64 bits"))?;
    sized(params, dtype)
}

fn sized(params: u64, dtype: DType) -> Result<AdapterSize> {
    Ok(AdapterSize {
        params,
        bytes: params
            .checked_mul(dtype.bytes())
            .ok_or_else(|| invalid("rank", "the byte count overflows 64 bits"))?,
    })
}

/// Adapter size for a real config: `L · Σ r·(d_in + d_out)` over the target modules.
///
/// `config` is the project's one parse of `config.json` ([`ModelConfig::from_json`]); modules
/// are PEFT target-module names (`q_proj`, …).
pub fn adapter_for_config(
    config: &ModelConfig,
    modules: &[&str],
    rank: u64,
    dtype: DType,
) -> Result<AdapterSize> {
    if rank == 0 {
        return Err(invalid("rank", "must be > 0"));
    }
    if modules.is_empty() {
        return Err(invalid("modules", "name at least one module"));
    }
    config.validate().map_err(|e| e.within("config"))?;
    let mut per_layer = 0u64;
    for m in modules {
        let projection = Projection::from_name(m).ok_or_else(|| {
            invalid(
                "modules",
                format!("unknown module `{m}`; use {}", Projection::NAMES),
            )
        })?;
        let (d_in, d_out) = config.projection_shape(projection);
        // Checked: a config's sizes and a rank come from users, and a wrapped product would
        // print a small, wrong size.
        per_layer = (d_in as u64)
            .checked_add(d_out as u64)
            .and_then(|width| width.checked_mul(rank))
            .and_then(|params| params.checked_add(per_layer))
            .ok_or_else(|| invalid("rank", "the parameter count overflows 64 bits"))?;
    }
    let params = per_layer
        .checked_mul(config.num_hidden_layers as u64)
        .ok_or_else(|| invalid("rank", "the parameter count overflows 64 bits"))?;
    sized(params, dtype)
}

fn positive_bytes(field: &str, value: f64, unit: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value * unit)
    } else {
        Err(invalid(
            field,
            format!("must be a finite number > 0, got {value}"),
        ))
    }
}

/// How a base's weights are stored: a float type or one of llama.cpp's block formats, as bytes
/// per block of elements (what residency of the base costs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// 4 bytes an element.
    F32,
    /// 2 bytes.
    Bf16,
    /// 2 bytes.
    F16,
    /// 34 bytes per 32 (8.5 bits).
    Q8_0,
    /// 18 bytes per 32 (4.5 bits).
    Q4_0,
    /// 20 bytes per 32 (5 bits).
    Q4_1,
    /// 22 bytes per 32 (5.5 bits).
    Q5_0,
    /// 144 bytes per 256 (4.5 bits).
    Q4K,
    /// 210 bytes per 256 (6.5625 bits).
    Q6K,
}

impl WeightFormat {
    const NAMES: [(&'static str, WeightFormat); 9] = [
        ("f32", WeightFormat::F32),
        ("bf16", WeightFormat::Bf16),
        ("f16", WeightFormat::F16),
        ("q8_0", WeightFormat::Q8_0),
        ("q4_0", WeightFormat::Q4_0),
        ("q4_1", WeightFormat::Q4_1),
        ("q5_0", WeightFormat::Q5_0),
        ("q4_k", WeightFormat::Q4K),
        ("q6_k", WeightFormat::Q6K),
    ];

    /// Parses a name (`bf16`, `q8_0`, `q4_k`, case-insensitively).
    pub fn parse(text: &str) -> Result<Self> {
        Self::NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(text))
            .map(|&(_, f)| f)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::NAMES.iter().map(|(n, _)| *n).collect();
                invalid(
                    "dtype",
                    format!("unknown `{text}`; use {}", names.join(", ")),
                )
            })
    }

    /// (elements, bytes) of one block.
    pub fn block(self) -> (u64, u64) {
        match self {
            Self::F32 => (1, 4),
            Self::Bf16 | Self::F16 => (1, 2),
            Self::Q8_0 => (32, 34),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q4K => (256, 144),
            Self::Q6K => (256, 210),
        }
    }
}

/// Bytes of `params` weights stored as `format` (whole blocks, rounded up).
pub fn base_bytes(params: u64, format: WeightFormat) -> Result<u64> {
    if params == 0 {
        return Err(invalid("params", "must be > 0"));
    }
    let (elements, bytes) = format.block();
    params
        .div_ceil(elements)
        .checked_mul(bytes)
        .ok_or_else(|| invalid("params", "the byte count overflows 64 bits"))
}

/// Whole adapters that fit in `free_gb` beside one base.
pub fn resident(free_gb: f64, adapter_mb: f64) -> Result<u64> {
    let free = positive_bytes("free_gb", free_gb, GB)?;
    let adapter = positive_bytes("adapter_mb", adapter_mb, MB)?;
    Ok((free / adapter).floor() as u64)
}

/// Memory and accelerators one serving layout needs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Layout {
    /// Total memory, GB.
    pub memory_gb: f64,
    /// Accelerators if memory could be split anywhere: ceil(memory / accelerator).
    pub accelerators: u64,
    /// Accelerators when each process (and each base copy) is placed whole.
    pub accelerators_packed: u64,
    /// Whole accelerators one process spans (tensor-parallel): 1 when a base and an adapter
    /// fit on one, ⌈(base + adapter) / accelerator⌉ otherwise.
    pub accelerators_per_process: u64,
}

/// One process per adapter against per-sequence adapter selection.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Duplication {
    /// N processes, each with its own base and adapter.
    pub per_process: Layout,
    /// One base (per accelerator when packed) and N adapters.
    pub batched: Layout,
    /// per_process memory over batched memory.
    pub ratio: f64,
    /// per_process packed accelerators over batched packed accelerators.
    pub accelerators_ratio: f64,
}

/// Compares the two layouts for `agents` personalised agents.
pub fn duplication(
    agents: u64,
    base_gb: f64,
    adapter_mb: f64,
    accelerator_gb: f64,
) -> Result<Duplication> {
    if agents == 0 {
        return Err(invalid("agents", "must be > 0"));
    }
    let base = positive_bytes("base_gb", base_gb, GB)?;
    let adapter = positive_bytes("adapter_mb", adapter_mb, MB)?;
    let accel = positive_bytes("accelerator_gb", accelerator_gb, GB)?;
    let n = agents as f64;
    let process = base + adapter;
    // A base larger than one accelerator is served tensor-parallel across whole accelerators:
    // the fewest that hold a base and one adapter (⌈base / accelerator⌉, one more only when
    // the base fills them exactly). A 70B bf16 base on 80 GB accelerators spans two.
    let span = (process / accel).ceil().max(1.0);
    let group = span * accel;
    let per_process_memory = n * process;
    let per_process_packed = if span > 1.0 {
        n * span
    } else {
        (n / (accel / process).floor()).ceil()
    };
    let per_process = Layout {
        memory_gb: per_process_memory / GB,
        accelerators: (per_process_memory / accel).ceil() as u64,
        accelerators_packed: per_process_packed as u64,
        accelerators_per_process: span as u64,
    };
    let batched_memory = base + n * adapter;
    // Adapters beside the base in one group of `span` accelerators; more agents take more
    // groups, each with its own copy of the base.
    let adapters_per_group = ((group - base) / adapter).floor();
    let batched = Layout {
        memory_gb: batched_memory / GB,
        accelerators: (batched_memory / accel).ceil() as u64,
        accelerators_packed: ((n / adapters_per_group).ceil() * span) as u64,
        accelerators_per_process: span as u64,
    };
    Ok(Duplication {
        per_process,
        batched,
        ratio: per_process_memory / batched_memory,
        accelerators_ratio: per_process.accelerators_packed as f64
            / batched.accelerators_packed as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn square_projection_formula() {
        // 2·16·32·4·4096 = 16 777 216 params, 33 554 432 bytes in bf16.
        let s = adapter_square(4096, 32, 4, 16, DType::Bf16).unwrap();
        assert_eq!(
            s,
            AdapterSize {
                params: 16_777_216,
                bytes: 33_554_432
            }
        );
        assert!(adapter_square(4096, 0, 4, 16, DType::Bf16).is_err());
    }

    #[test]
    fn llama3_8b_attention_adapter_counts_gqa_exactly() {
        let cfg = ModelConfig::from_json(
            r#"{"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}"#,
        )
        .unwrap();
        // q 8192r, k 5120r, v 5120r, o 8192r = 26 624·16 per layer, ×32 layers.
        let s = adapter_for_config(
            &cfg,
            &["q_proj", "k_proj", "v_proj", "o_proj"],
            16,
            DType::Bf16,
        )
        .unwrap();
        assert_eq!(s.params, 13_631_488);
        assert_eq!(s.bytes, 27_262_976);
        // MLP: gate/up 4096+14336, down 14336+4096, rank 8.
        let m = adapter_for_config(&cfg, &["gate_proj", "up_proj", "down_proj"], 8, DType::F32)
            .unwrap();
        assert_eq!(m.params, 3 * 18_432 * 8 * 32);
        assert!(adapter_for_config(&cfg, &["qkv"], 8, DType::F32).is_err());
        // A rank whose product wraps 64 bits is refused, not printed small.
        let err = adapter_for_config(&cfg, &["q_proj"], u64::MAX / 4, DType::Bf16).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
    }

    #[test]
    fn resident_counts_whole_adapters() {
        assert_eq!(resident(80.0, 33.0).unwrap(), 2424); // 80e9 / 33e6 = 2424.24
        assert!(resident(0.0, 33.0).is_err());
        assert!(resident(f64::NAN, 33.0).is_err());
    }

    #[test]
    fn duplication_hand_computed() {
        // 100 agents, 16 GB base, 32 MB adapters, 80 GB accelerators.
        let d = duplication(100, 16.0, 32.0, 80.0).unwrap();
        assert!((d.per_process.memory_gb - 1603.2).abs() < 1e-9);
        assert_eq!(d.per_process.accelerators, 21);
        assert_eq!(d.per_process.accelerators_packed, 25); // 4 processes per accelerator
        assert!((d.batched.memory_gb - 19.2).abs() < 1e-9);
        assert_eq!(d.batched.accelerators, 1);
        assert_eq!(d.batched.accelerators_packed, 1);
        assert!((d.ratio - 83.5).abs() < 1e-9);
        assert_eq!(d.per_process.accelerators_per_process, 1);
    }

    /// Guards the refusal of the seeds' own headline case: a 70B bf16 base (140 GB) on 80 GB
    /// accelerators spans two of them, tensor-parallel.
    #[test]
    fn a_base_larger_than_one_accelerator_spans_whole_accelerators() {
        let d = duplication(100, 140.0, 320.0, 80.0).unwrap();
        assert_eq!(d.per_process.accelerators_per_process, 2);
        assert_eq!(d.per_process.accelerators_packed, 200);
        // One group of two holds the base and floor(19.68 GB / 0.32 GB) = 61 adapters.
        assert_eq!(d.batched.accelerators_packed, 4);
        assert!((d.batched.memory_gb - 172.0).abs() < 1e-9);
        // A base that fills its accelerators exactly needs one more for an adapter.
        assert_eq!(
            duplication(1, 160.0, 32.0, 80.0)
                .unwrap()
                .batched
                .accelerators_per_process,
            3
        );
    }
}
