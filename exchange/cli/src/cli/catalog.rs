//! `cx catalog add DIR|FILE.gguf`: a catalog entry learned from a Hugging Face model directory's
//! `config.json` or a GGUF's metadata (read through cx-provider's door to a model's files), so
//! the exchange can price and place a real checkpoint (its shape: parameters, bytes as served —
//! quantized blocks at their size —, KV bytes per token, context) under the name providers serve
//! it by.

use anyhow::{Context, bail};
use cx_exchange::capacity::{ModelConfig, Projection};
use cx_exchange::routing::catalog::Catalog;
use cx_provider::model::{ModelFiles, read_config};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Append a model to a catalog file from its directory's config.json.
    Add(AddArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct AddArgs {
    /// The model: a directory (config.json as transformers writes it) or a GGUF file.
    dir: PathBuf,
    /// The catalog file to append to (created if missing).
    #[arg(long)]
    catalog: PathBuf,
    /// The name agents ask for and providers serve it by (as on the Hub, e.g.
    /// `HuggingFaceTB/SmolLM2-135M-Instruct`) [default: the directory's name].
    #[arg(long)]
    name: Option<String>,
    /// Other names it answers to.
    #[arg(long, value_delimiter = ',')]
    aliases: Vec<String>,
    /// Retail price per million input tokens, wei (the routing core's reference).
    #[arg(long, default_value_t = RETAIL_WEI_PER_MTOK.0)]
    input_wei_per_mtok: u64,
    /// Retail price per million output tokens, wei.
    #[arg(long, default_value_t = RETAIL_WEI_PER_MTOK.1)]
    output_wei_per_mtok: u64,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

/// The retail prices a model is added at unless told otherwise, wei per million (input,
/// output) tokens.
pub(super) const RETAIL_WEI_PER_MTOK: (u64, u64) = (60_000, 80_000);

/// What was added.
#[derive(Debug, Serialize)]
pub(super) struct Added {
    pub(super) name: String,
    pub(super) parameters: u64,
    pub(super) base_bytes: u64,
    pub(super) kv_bytes_per_token: u64,
    pub(super) context_limit_tokens: usize,
    pub(super) catalog: String,
}

/// Bytes of one KV element as a provider holds it (cx-provider computes in f32).
const SERVED_ELEMENT_BYTES: u64 = 4;

pub(crate) fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Add(args) => add(args),
    }
}

/// Parameters of a Llama-family checkpoint: embeddings, each layer's seven projections and two
/// norms, the final norm, and the head unless tied.
fn parameters(c: &ModelConfig) -> u64 {
    let per_layer: u64 = Projection::ALL
        .iter()
        .map(|&p| {
            let (d_in, d_out) = c.projection_shape(p);
            (d_in * d_out) as u64
        })
        .sum::<u64>()
        + 2 * c.hidden_size as u64;
    let embed = (c.vocab_size * c.hidden_size) as u64;
    let head = if c.tie_word_embeddings { 0 } else { embed };
    embed + per_layer * c.num_hidden_layers as u64 + c.hidden_size as u64 + head
}

fn add(args: AddArgs) -> anyhow::Result<()> {
    let added = append_model(
        &args.dir,
        &args.catalog,
        args.name,
        &args.aliases,
        (args.input_wei_per_mtok, args.output_wei_per_mtok),
    )?;
    let table = format!(
        "added {} to {}: {} parameters, {} bytes as served, {} KV bytes per token, \
         context {}\n",
        added.name,
        added.catalog,
        added.parameters,
        added.base_bytes,
        added.kv_bytes_per_token,
        added.context_limit_tokens
    );
    super::emit(args.json, &table, &added)
}

/// Appends the model of directory `dir` to the catalog file `catalog_path` (created if
/// missing) under `name` (default: the directory's name) and `aliases`, at retail `prices`
/// (input, output wei per million tokens); refuses a name the catalog already has. `cx devnet
/// --model` adds its checkpoint the same way.
pub(super) fn append_model(
    dir: &Path,
    catalog_path: &Path,
    name: Option<String>,
    aliases: &[String],
    prices: (u64, u64),
) -> anyhow::Result<Added> {
    let (input_wei_per_mtok, output_wei_per_mtok) = prices;
    // The provider's own door to a model's files: a folder's config.json, or a GGUF's metadata.
    let files = ModelFiles::locate(dir)?;
    let config: ModelConfig = read_config(dir)?;
    let name = match name {
        Some(name) => name,
        None => dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_stem().map(|n| n.to_string_lossy().into_owned()))
            .context("name the model with --name")?,
    };
    if name.is_empty() || name.contains('"') || name.contains('\n') {
        bail!("--name {name:?} is not a model name");
    }
    let parameters = parameters(&config);
    // As a provider holds it (bf16 matrices at 2 bytes, quantized blocks at theirs, the rest
    // widened to f32), from the weight files' headers; a folder without weights at f32.
    let has_weights = files.gguf().is_some()
        || dir.join("model.safetensors").exists()
        || dir.join("model.safetensors.index.json").exists();
    let base_bytes = if has_weights {
        files.held_bytes()?
    } else {
        parameters * SERVED_ELEMENT_BYTES
    };
    let kv_bytes_per_token = 2
        * config.num_hidden_layers as u64
        * (config.kv_heads() * config.head_dim()) as u64
        * SERVED_ELEMENT_BYTES;
    let existing = match std::fs::read_to_string(catalog_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| catalog_path.display().to_string()),
    };
    if !existing.is_empty() {
        let catalog = Catalog::from_toml_str(&existing)
            .with_context(|| catalog_path.display().to_string())?;
        if catalog.resolve(&name).is_ok() {
            bail!(
                "{} already has a model named {name}",
                catalog_path.display()
            );
        }
    }
    let provider = "cx-fleet";
    let mut entry = String::new();
    if !existing.contains(&format!("name = \"{provider}\"")) {
        entry.push_str(&format!(
            "[[providers]]\nname = \"{provider}\"\ndescription = \"providers on this market\"\n\n"
        ));
    }
    let aliases: Vec<String> = aliases.iter().map(|a| format!("{a:?}")).collect();
    entry.push_str(&format!(
        "[[models]]\nname = {name:?}\naliases = [{}]\nquality = 0.3\nlatency_s = 0.5\ncode = 0.1\n\
         vision = 0.0\nshape = {{ base_bytes = {base_bytes}, parameters = {parameters}, \
         kv_bytes_per_token = {kv_bytes_per_token} }}\n\n[[models.rungs]]\nupstream = {:?}\n\
         provider = \"{provider}\"\ncontext_limit_tokens = {}\nretail = {{ input_wei_per_mtok = \
         {}, output_wei_per_mtok = {} }}\ncost = {{ input_wei_per_mtok = {}, output_wei_per_mtok = \
         {} }}\n",
        aliases.join(", "),
        format!("cx/{name}"),
        config.max_position_embeddings,
        input_wei_per_mtok,
        output_wei_per_mtok,
        input_wei_per_mtok * 2 / 3,
        output_wei_per_mtok * 5 / 8,
    ));
    let mut updated = existing.clone();
    if !updated.is_empty() && !updated.ends_with("\n\n") {
        updated.push_str(if updated.ends_with('\n') {
            "\n"
        } else {
            "\n\n"
        });
    }
    updated.push_str(&entry);
    // The whole file must still be a catalog the exchange takes, with the name once.
    let catalog = Catalog::from_toml_str(&updated)
        .with_context(|| format!("{} with {name} added", catalog_path.display()))?;
    if !existing.is_empty()
        && Catalog::from_toml_str(&existing)
            .map(|c| c.resolve(&name).is_ok())
            .unwrap_or(false)
    {
        bail!(
            "{} already has a model named {name}",
            catalog_path.display()
        );
    }
    catalog.resolve(&name).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::write(catalog_path, updated)
        .with_context(|| format!("cannot write {}", catalog_path.display()))?;
    Ok(Added {
        name,
        parameters,
        base_bytes,
        kv_bytes_per_token,
        context_limit_tokens: config.max_position_embeddings,
        catalog: catalog_path.display().to_string(),
    })
}
