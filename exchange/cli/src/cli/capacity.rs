//! `cx capacity …`: the arithmetic of SPEC §5.

use anyhow::Context;
use cx_exchange::capacity::{self, DType, ModelConfig};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Bytes of a base at a weight format (float or quantized), and the adapters that fit
    /// beside it on one accelerator.
    Base(BaseArgs),
    /// Parameters and bytes of a LoRA adapter.
    Adapter(AdapterArgs),
    /// Whole adapters that fit in free memory beside one base.
    Resident(ResidentArgs),
    /// One process per adapter vs per-sequence adapter selection.
    Duplication(DuplicationArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct AdapterArgs {
    /// Model width d (square projections).
    #[arg(long, required_unless_present = "config")]
    hidden: Option<u64>,
    /// Layers L (square projections).
    #[arg(long, required_unless_present = "config")]
    layers: Option<u64>,
    /// Adapted projections per layer T (square projections).
    #[arg(long, required_unless_present = "config")]
    targets: Option<u64>,
    /// LoRA rank r.
    #[arg(long)]
    rank: u64,
    /// Element type: f32, bf16, f16.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// A Hugging Face config.json (exact GQA and MLP sizes) instead of square projections.
    #[arg(long, conflicts_with_all = ["hidden", "layers", "targets"])]
    config: Option<PathBuf>,
    /// Target modules with --config, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "q_proj,k_proj,v_proj,o_proj"
    )]
    modules: Vec<String>,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BaseArgs {
    /// Parameters of the base (e.g. 70e9).
    #[arg(long, value_parser = parse_count)]
    params: u64,
    /// Weight format: f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q4_k, q6_k.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Memory of one accelerator, GB: also print what is left and the adapters that fit.
    #[arg(long, allow_negative_numbers = true)]
    accelerator_gb: Option<f64>,
    /// Adapter size, MB (with --accelerator-gb).
    #[arg(long, allow_negative_numbers = true, requires = "accelerator_gb")]
    adapter_mb: Option<f64>,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

/// A count written as an integer or in exponent form (`70e9`), exactly.
fn parse_count(text: &str) -> Result<u64, String> {
    if let Ok(n) = text.parse::<u64>() {
        return Ok(n);
    }
    match text.split_once(['e', 'E']) {
        Some((m, e)) => {
            let (m, e): (u64, u32) = (
                m.parse().map_err(|_| format!("`{text}` is not a count"))?,
                e.parse().map_err(|_| format!("`{text}` is not a count"))?,
            );
            10u64
                .checked_pow(e)
                .and_then(|p| p.checked_mul(m))
                .ok_or_else(|| format!("`{text}` overflows 64 bits"))
        }
        None => Err(format!("`{text}` is not a count")),
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct ResidentArgs {
    /// Free accelerator memory, GB (10⁹ B).
    #[arg(long, allow_negative_numbers = true)]
    free_gb: f64,
    /// Adapter size, MB (10⁶ B).
    #[arg(long, allow_negative_numbers = true)]
    adapter_mb: f64,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct DuplicationArgs {
    /// Personalised agents N.
    #[arg(long)]
    agents: u64,
    /// Base model size, GB.
    #[arg(long, allow_negative_numbers = true)]
    base_gb: f64,
    /// Adapter size, MB.
    #[arg(long, allow_negative_numbers = true)]
    adapter_mb: f64,
    /// Memory of one accelerator, GB.
    #[arg(long, allow_negative_numbers = true)]
    accelerator_gb: f64,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Base(a) => base(a),
        Command::Adapter(a) => adapter(a),
        Command::Resident(a) => {
            #[derive(Serialize)]
            struct Report {
                resident: u64,
            }
            let resident = capacity::resident(a.free_gb, a.adapter_mb)?;
            let table = format!(
                "{resident} adapters of {} MB fit in {} GB beside the base\n",
                a.adapter_mb, a.free_gb
            );
            super::emit(a.json, &table, &Report { resident })
        }
        Command::Duplication(a) => {
            let d = capacity::duplication(a.agents, a.base_gb, a.adapter_mb, a.accelerator_gb)?;
            let mut table = format!(
                "{:<12}{:>14}{:>14}{:>20}\n{:<12}{:>14.3}{:>14}{:>20}\n{:<12}{:>14.3}{:>14}{:>20}\nratio (memory) {:.2}×, accelerators packed {:.2}×\n",
                "layout",
                "memory_gb",
                "accelerators",
                "accelerators_packed",
                "per_process",
                d.per_process.memory_gb,
                d.per_process.accelerators,
                d.per_process.accelerators_packed,
                "batched",
                d.batched.memory_gb,
                d.batched.accelerators,
                d.batched.accelerators_packed,
                d.ratio,
                d.accelerators_ratio,
            );
            if d.per_process.accelerators_per_process > 1 {
                table.push_str(&format!(
                    "the base does not fit on one accelerator: each process spans {} \
                     (tensor-parallel)\n",
                    d.per_process.accelerators_per_process
                ));
            }
            super::emit(a.json, &table, &d)
        }
    }
}

fn base(a: BaseArgs) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Report {
        params: u64,
        dtype: capacity::WeightFormat,
        base_bytes: u64,
        free_bytes: Option<u64>,
        adapters_resident: Option<u64>,
    }
    let dtype = capacity::WeightFormat::parse(&a.dtype)?;
    let base_bytes = capacity::base_bytes(a.params, dtype)?;
    let mut table = format!(
        "{} parameters at {}: {base_bytes} bytes ({:.2} GB)\n",
        a.params,
        a.dtype,
        base_bytes as f64 / capacity::GB
    );
    let (mut free_bytes, mut adapters_resident) = (None, None);
    if let Some(gb) = a.accelerator_gb {
        anyhow::ensure!(
            gb.is_finite() && gb > 0.0,
            "--accelerator-gb must be a finite number > 0"
        );
        let total = (gb * capacity::GB) as u64;
        let Some(free) = total.checked_sub(base_bytes) else {
            anyhow::bail!(
                "the base ({:.2} GB) does not fit on an accelerator of {gb} GB",
                base_bytes as f64 / capacity::GB
            );
        };
        table.push_str(&format!(
            "{:.2} GB left on an accelerator of {gb} GB\n",
            free as f64 / capacity::GB
        ));
        free_bytes = Some(free);
        if let Some(mb) = a.adapter_mb {
            let n = capacity::resident(free as f64 / capacity::GB, mb)?;
            table.push_str(&format!("{n} adapters of {mb} MB fit beside it\n"));
            adapters_resident = Some(n);
        }
    }
    let report = Report {
        params: a.params,
        dtype,
        base_bytes,
        free_bytes,
        adapters_resident,
    };
    super::emit(a.json, &table, &report)
}

fn adapter(a: AdapterArgs) -> anyhow::Result<()> {
    let dtype = DType::parse(&a.dtype)?;
    let size = match &a.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let config = ModelConfig::from_json(&text)
                .with_context(|| format!("{}: not a Llama-family config.json", path.display()))?;
            let modules: Vec<&str> = a.modules.iter().map(String::as_str).collect();
            capacity::adapter_for_config(&config, &modules, a.rank, dtype)?
        }
        None => capacity::adapter_square(
            a.hidden.unwrap_or(0),
            a.layers.unwrap_or(0),
            a.targets.unwrap_or(0),
            a.rank,
            dtype,
        )?,
    };
    let table = format!(
        "params {}  bytes {}  ({:.3} MB)\n",
        size.params,
        size.bytes,
        size.bytes as f64 / 1e6
    );
    super::emit(a.json, &table, &size)
}
