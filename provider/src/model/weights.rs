//! Weights from a Hugging Face directory: `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names; F32, BF16 or F16, read by candle and widened to `f32`,
//! under the names Hugging Face writes (`model.embed_tokens.weight`,
//! `model.layers.{i}.self_attn.q_proj.weight`, …).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::config::Architecture;
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
///
/// Read tensor by tensor, in bounded chunks, straight into the `f32` buffers the model keeps:
/// reading a whole file first (or a candle tensor per weight, then its `f32` copy) held two to
/// three copies of the weights at the peak. Now the peak is the steady state plus one chunk.
pub(super) fn load_tensors(dir: &Path) -> Result<NamedTensors> {
    let mut out = HashMap::new();
    for file in weight_files(dir)? {
        read_safetensors(&file, &mut out)?;
    }
    Ok(out)
}

/// Bytes read from the file at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// The header of a safetensors file: `u64` little-endian length, then JSON `name → {dtype,
/// shape, data_offsets}` (offsets relative to the end of the header), and `__metadata__`.
#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

fn read_safetensors(path: &Path, out: &mut NamedTensors) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    read_safetensors_from(path, file, file_len, out)
}

/// The tensors of one safetensors file held in memory, as [`Model::load`](super::Model::load)
/// reads them from disk (the same reader, over the bytes): name → (shape, data). `path` only
/// names the file in errors. The fuzz targets parse weight files through this.
pub fn tensors_from_bytes(path: &Path, bytes: &[u8]) -> Result<NamedTensors> {
    let mut out = HashMap::new();
    read_safetensors_from(
        path,
        std::io::Cursor::new(bytes),
        bytes.len() as u64,
        &mut out,
    )?;
    Ok(out)
}

/// Reads a safetensors file of `file_len` bytes from `file` (a file, or bytes in memory) into
/// `out`; `path` names it in errors.
fn read_safetensors_from(
    path: &Path,
    mut file: impl std::io::Read + std::io::Seek,
    file_len: u64,
    out: &mut NamedTensors,
) -> Result<()> {
    use std::io::SeekFrom;
    let bad = |reason: String| Error::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| Error::io(path, e))?;
    let header_len = u64::from_le_bytes(len);
    // safetensors' own limit on the header (100 MB).
    if header_len > 100_000_000 || header_len.saturating_add(8) > file_len {
        return Err(bad(format!(
            "header length {header_len} does not fit the file"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header)
        .map_err(|e| Error::io(path, e))?;
    let mut entries: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    entries.remove("__metadata__");
    let data_start = 8 + header_len;
    let mut sorted: Vec<(String, HeaderEntry)> = entries
        .into_iter()
        .map(|(name, v)| {
            serde_json::from_value::<HeaderEntry>(v)
                .map(|e| (name.clone(), e))
                .map_err(|e| bad(format!("{name}: {e}")))
        })
        .collect::<Result<_>>()?;
    // In file order: one forward pass over the file.
    sorted.sort_by_key(|(_, e)| e.data_offsets[0]);
    let mut chunk = vec![0u8; CHUNK_BYTES];
    for (name, entry) in sorted {
        let element = match entry.dtype.as_str() {
            "F32" => 4,
            "BF16" | "F16" => 2,
            other => {
                return Err(bad(format!(
                    "{name}: dtype {other} (expected F32, BF16 or F16)"
                )));
            }
        };
        let [start, end] = entry.data_offsets;
        let elements = entry
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("{name}: shape {:?} overflows", entry.shape)))?;
        let bytes = (elements as u64).checked_mul(element);
        if end < start || bytes != Some(end - start) || data_start.saturating_add(end) > file_len {
            return Err(bad(format!(
                "{name}: offsets {start}..{end} do not match shape {:?} × {element} bytes in a \
                 file of {file_len} bytes",
                entry.shape
            )));
        }
        file.seek(SeekFrom::Start(data_start + start))
            .map_err(|e| Error::io(path, e))?;
        let mut data: Vec<f32> = Vec::with_capacity(elements);
        let mut left = (end - start) as usize;
        while left > 0 {
            // Whole elements per chunk (CHUNK_BYTES is a multiple of 4).
            let take = left.min(CHUNK_BYTES);
            let buf = &mut chunk[..take];
            file.read_exact(buf).map_err(|e| Error::io(path, e))?;
            match entry.dtype.as_str() {
                "F32" => data.extend(
                    buf.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                ),
                "BF16" => data.extend(
                    buf.chunks_exact(2)
                        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
                ),
                _ => data.extend(
                    buf.chunks_exact(2)
                        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
                ),
            }
            left -= take;
        }
        if out.insert(name.clone(), (entry.shape, data)).is_some() {
            return Err(bad(format!("{name} appears in two files")));
        }
    }
    Ok(())
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

    /// Refuses what is left: a tensor `architecture`'s forward does not use (a bias its
    /// config does not announce, a norm of another architecture, …) changes the computation,
    /// so it is an error, never silently dropped. Old checkpoints store RoPE's `inv_freq`
    /// buffers; the config recomputes them.
    pub(super) fn finish(self, architecture: Architecture) -> Result<()> {
        let mut left: Vec<&String> = self
            .0
            .keys()
            .filter(|name| !name.ends_with("rotary_emb.inv_freq"))
            .collect();
        left.sort();
        match left.first() {
            None => Ok(()),
            Some(first) => Err(Error::Model(format!(
                "tensor {first} (and {} more) is not part of a `{}` forward as config.json \
                 describes it; this architecture or variant is not supported",
                left.len() - 1,
                architecture.model_type()
            ))),
        }
    }
}
