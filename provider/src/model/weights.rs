//! Weights from a Hugging Face directory: `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names; F32, BF16 or F16, read by candle and widened to `f32`,
//! under the names Hugging Face writes (`model.embed_tokens.weight`,
//! `model.layers.{i}.self_attn.q_proj.weight`, …).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::DType;
use serde::Deserialize;

use crate::error::{Error, Result};

/// Named `f32` tensors: name → (shape, data), as Hugging Face names them.
pub type NamedTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// The safetensors files of a model directory: the shards named by
/// `model.safetensors.index.json`, or `model.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        #[derive(Deserialize)]
        struct Index {
            weight_map: HashMap<String, String>,
        }
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let parsed: Index = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: index.clone(),
            what: "safetensors index",
            reason: e.to_string(),
        })?;
        let mut files: Vec<String> = parsed.weight_map.into_values().collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        Ok(vec![single])
    } else {
        Err(Error::Model(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )))
    }
}

/// Every tensor of a model directory, widened to `f32`: name → (shape, data).
pub(super) fn load_tensors(dir: &Path) -> Result<NamedTensors> {
    let mut out = HashMap::new();
    for file in weight_files(dir)? {
        let tensors =
            candle_core::safetensors::load(&file, &candle_core::Device::Cpu).map_err(|e| {
                Error::Safetensors {
                    path: file.clone(),
                    reason: e.to_string(),
                }
            })?;
        for (name, tensor) in tensors {
            let shape = tensor.dims().to_vec();
            let data = tensor
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            out.insert(name, (shape, data));
        }
    }
    Ok(out)
}

/// Tensors handed out by name, each once, with the shape the config implies checked.
pub(super) struct TensorStore(pub(super) NamedTensors);

impl TensorStore {
    /// Removes `name`, which must have `shape`.
    pub(super) fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (got, data) = self
            .0
            .remove(name)
            .ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
        if got != shape {
            return Err(Error::Model(format!(
                "{name} has shape {got:?}, config.json implies {shape:?}"
            )));
        }
        Ok(data)
    }

    /// Refuses what is left: a tensor the forward does not use (a bias, a norm of another
    /// architecture, …) changes the computation, so it is an error, never silently dropped.
    /// Old checkpoints store RoPE's `inv_freq` buffers; the config recomputes them.
    pub(super) fn finish(self) -> Result<()> {
        let mut left: Vec<&String> = self
            .0
            .keys()
            .filter(|name| !name.ends_with("rotary_emb.inv_freq"))
            .collect();
        left.sort();
        match left.first() {
            None => Ok(()),
            Some(first) => Err(Error::Model(format!(
                "tensor {first} (and {} more) is not part of a Llama forward; this \
                 architecture is not supported",
                left.len() - 1
            ))),
        }
    }
}
