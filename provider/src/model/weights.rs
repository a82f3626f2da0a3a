//! Weights from a Hugging Face directory: `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names, under the names Hugging Face writes
//! (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, …). BF16 and F16
//! matrices stay as stored (two bytes an element: memory is what residency costs, and the
//! kernels widen each weight exactly as they read it); F32 tensors, norms and biases are `f32`. A
//! GGUF's tensors come from `from_gguf` into the same [`Checkpoint`], ggml blocks kept as blocks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cx_kernels::{QuantMatrix, QuantType};
use serde::Deserialize;

use super::config::Architecture;
use crate::error::{Error, Result};

/// Named `f32` tensors: name → (shape, data), as Hugging Face names them.
pub type NamedTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// A checkpoint's tensors as loaded: those stored as BF16, F16 or in a ggml block format kept
/// so, the others as `f32`. A name is in one map only.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    pub(super) f32: NamedTensors,
    pub(super) bf16: HashMap<String, (Vec<usize>, Vec<half::bf16>)>,
    pub(super) f16: HashMap<String, (Vec<usize>, Vec<half::f16>)>,
    pub(super) quant: HashMap<String, (Vec<usize>, QuantMatrix)>,
}

impl From<NamedTensors> for Checkpoint {
    fn from(f32: NamedTensors) -> Self {
        Self {
            f32,
            ..Self::default()
        }
    }
}

impl Checkpoint {
    /// Every tensor as `f32` (bf16 and f16 widened, blocks dequantized, exactly).
    pub fn into_f32(self) -> NamedTensors {
        let mut all = self.f32;
        for (name, (shape, data)) in self.bf16 {
            all.insert(name, (shape, data.iter().map(|v| v.to_f32()).collect()));
        }
        for (name, (shape, data)) in self.f16 {
            all.insert(name, (shape, data.iter().map(|v| v.to_f32()).collect()));
        }
        for (name, (shape, data)) in self.quant {
            all.insert(name, (shape, data.to_f32()));
        }
        all
    }

    fn contains(&self, name: &str) -> bool {
        self.f32.contains_key(name)
            || self.bf16.contains_key(name)
            || self.f16.contains_key(name)
            || self.quant.contains_key(name)
    }

    /// Every weight matrix (the two-dimensional tensors, embeddings included; norms and biases
    /// stay `f32`) quantized to `kind` where its rows are whole blocks of it, else to
    /// `fallback` (llama.cpp's choice for rows that are not whole K-quant super-blocks), else
    /// left as it is; tensors already in a block format are kept.
    pub fn quantize(&mut self, kind: QuantType, fallback: QuantType) -> Result<()> {
        let names: Vec<String> = self
            .f32
            .iter()
            .filter(|(_, (shape, _))| shape.len() == 2)
            .map(|(n, _)| n.clone())
            .chain(
                self.bf16
                    .iter()
                    .filter(|(_, (shape, _))| shape.len() == 2)
                    .map(|(n, _)| n.clone()),
            )
            .chain(
                self.f16
                    .iter()
                    .filter(|(_, (shape, _))| shape.len() == 2)
                    .map(|(n, _)| n.clone()),
            )
            .collect();
        for name in names {
            let (shape, data) = match (self.f32.remove(&name), self.bf16.remove(&name)) {
                (Some(t), _) => t,
                (None, Some((shape, data))) => (shape, data.iter().map(|v| v.to_f32()).collect()),
                (None, None) => {
                    let (shape, data) = self.f16.remove(&name).expect("listed");
                    (shape, data.iter().map(|v| v.to_f32()).collect())
                }
            };
            let (d_out, d_in) = (shape[0], shape[1]);
            let chosen = [kind, fallback]
                .into_iter()
                .find(|k| d_in.is_multiple_of(k.block_elements()));
            match chosen {
                Some(k) => {
                    let m = QuantMatrix::quantize(k, &data, d_out, d_in)?;
                    self.quant.insert(name, (shape, m));
                }
                None => {
                    self.f32.insert(name, (shape, data));
                }
            }
        }
        Ok(())
    }
}

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

/// Every tensor of a model directory: name → (shape, data), BF16 kept as stored.
///
/// Read tensor by tensor, in bounded chunks, straight into the buffers the model keeps:
/// reading a whole file first (or a candle tensor per weight, then its `f32` copy) held two to
/// three copies of the weights at the peak. Now the peak is the steady state plus one chunk.
pub(super) fn load_tensors(dir: &Path) -> Result<Checkpoint> {
    let mut out = Checkpoint::default();
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

/// The header of a safetensors file: where the data starts, and the tensors' entries.
fn read_header(
    path: &Path,
    file: &mut impl std::io::Read,
    file_len: u64,
) -> Result<(u64, Vec<(String, HeaderEntry)>)> {
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
    let sorted = entries
        .into_iter()
        .map(|(name, v)| {
            serde_json::from_value::<HeaderEntry>(v)
                .map(|e| (name.clone(), e))
                .map_err(|e| bad(format!("{name}: {e}")))
        })
        .collect::<Result<_>>()?;
    Ok((8 + header_len, sorted))
}

/// Bytes the model in `dir` takes as [`Model::load`](super::Model::load) holds it, from its
/// safetensors headers alone: BF16 and F16 matrices at 2 bytes an element, every other tensor
/// at 4; a tied model's stored copy of the head is not held.
pub(super) fn held_bytes(dir: &Path, tied: bool) -> Result<u64> {
    let mut total = 0u64;
    for file in weight_files(dir)? {
        let mut f = std::fs::File::open(&file).map_err(|e| Error::io(&file, e))?;
        let len = f.metadata().map_err(|e| Error::io(&file, e))?.len();
        let (_, entries) = read_header(&file, &mut f, len)?;
        for (name, entry) in entries {
            if tied && name == "lm_head.weight" {
                continue;
            }
            let elements: u64 = entry.shape.iter().map(|&d| d as u64).product();
            let element =
                if matches!(entry.dtype.as_str(), "BF16" | "F16") && entry.shape.len() == 2 {
                    2
                } else {
                    4
                };
            total = total.saturating_add(elements.saturating_mul(element));
        }
    }
    Ok(total)
}

fn read_safetensors(path: &Path, out: &mut Checkpoint) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    read_safetensors_from(path, file, file_len, out)
}

/// The tensors of one safetensors file held in memory, as [`Model::load`](super::Model::load)
/// reads them from disk (the same reader, over the bytes): name → (shape, data). `path` only
/// names the file in errors; every tensor as `f32` (BF16 and F16 widened exactly). The fuzz targets
/// parse weight files through this.
pub fn tensors_from_bytes(path: &Path, bytes: &[u8]) -> Result<NamedTensors> {
    let mut out = Checkpoint::default();
    read_safetensors_from(
        path,
        std::io::Cursor::new(bytes),
        bytes.len() as u64,
        &mut out,
    )?;
    Ok(out.into_f32())
}

/// Reads a safetensors file of `file_len` bytes from `file` (a file, or bytes in memory) into
/// `out`; `path` names it in errors.
fn read_safetensors_from(
    path: &Path,
    mut file: impl std::io::Read + std::io::Seek,
    file_len: u64,
    out: &mut Checkpoint,
) -> Result<()> {
    use std::io::SeekFrom;
    let bad = |reason: String| Error::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let (data_start, mut sorted) = read_header(path, &mut file, file_len)?;
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
        if out.contains(&name) {
            return Err(bad(format!("{name} appears in two files")));
        }
        let bytes = (end - start) as usize;
        match entry.dtype.as_str() {
            "BF16" => {
                let data = read_elements(&mut file, path, bytes, &mut chunk, |b: &[u8; 2]| {
                    half::bf16::from_le_bytes(*b)
                })?;
                out.bf16.insert(name, (entry.shape, data));
            }
            "F16" => {
                let data = read_elements(&mut file, path, bytes, &mut chunk, |b: &[u8; 2]| {
                    half::f16::from_le_bytes(*b)
                })?;
                out.f16.insert(name, (entry.shape, data));
            }
            _ => {
                let data = read_elements(&mut file, path, bytes, &mut chunk, |b: &[u8; 4]| {
                    f32::from_le_bytes(*b)
                })?;
                out.f32.insert(name, (entry.shape, data));
            }
        }
    }
    Ok(())
}

/// `bytes` bytes of little-endian elements of `N` bytes each, read from `file` through `chunk`
/// (whole elements per read: its length is a multiple of 4) and decoded by `decode`.
fn read_elements<T, const N: usize>(
    file: &mut impl std::io::Read,
    path: &Path,
    bytes: usize,
    chunk: &mut [u8],
    decode: impl Fn(&[u8; N]) -> T,
) -> Result<Vec<T>> {
    let mut data = Vec::with_capacity(bytes / N);
    let mut left = bytes;
    while left > 0 {
        let take = left.min(chunk.len());
        let buf = &mut chunk[..take];
        file.read_exact(buf).map_err(|e| Error::io(path, e))?;
        data.extend(
            buf.chunks_exact(N)
                .map(|b| decode(b.try_into().expect("chunks of N bytes"))),
        );
        left -= take;
    }
    Ok(data)
}

/// Tensors handed out by name, each once, with the shape the config implies checked.
pub(super) struct TensorStore(pub(super) Checkpoint);

/// A weight matrix's elements as stored.
pub(super) enum WeightData {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
    F16(Vec<half::f16>),
    Quant(QuantMatrix),
}

impl TensorStore {
    /// Removes `name`, which must have `shape`, as `f32` (a BF16 or F16 tensor widened: norms
    /// and biases, which the forward reads as `f32`).
    pub(super) fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(match self.take_weight(name, shape)? {
            WeightData::F32(data) => data,
            WeightData::Bf16(data) => data.iter().map(|v| v.to_f32()).collect(),
            WeightData::F16(data) => data.iter().map(|v| v.to_f32()).collect(),
            WeightData::Quant(data) => data.to_f32(),
        })
    }

    /// Removes weight matrix `name`, which must have `shape`, as stored.
    pub(super) fn take_weight(&mut self, name: &str, shape: &[usize]) -> Result<WeightData> {
        let (got, data) = if let Some((got, data)) = self.0.f32.remove(name) {
            (got, WeightData::F32(data))
        } else if let Some((got, data)) = self.0.bf16.remove(name) {
            (got, WeightData::Bf16(data))
        } else if let Some((got, data)) = self.0.f16.remove(name) {
            (got, WeightData::F16(data))
        } else if let Some((got, data)) = self.0.quant.remove(name) {
            (got, WeightData::Quant(data))
        } else {
            return Err(Error::Model(format!("missing tensor {name}")));
        };
        if got != shape {
            return Err(Error::Model(format!(
                "{name} has shape {got:?}, config.json implies {shape:?}"
            )));
        }
        Ok(data)
    }

    /// Drops `name` if present (a tied checkpoint's stored copy of the head).
    pub(super) fn drop(&mut self, name: &str) {
        self.0.f32.remove(name);
        self.0.bf16.remove(name);
        self.0.f16.remove(name);
        self.0.quant.remove(name);
    }

    /// Refuses what is left: a tensor `architecture`'s forward does not use (a bias its
    /// config does not announce, a norm of another architecture, …) changes the computation,
    /// so it is an error, never silently dropped. Old checkpoints store RoPE's `inv_freq`
    /// buffers; the config recomputes them.
    pub(super) fn finish(self, architecture: Architecture) -> Result<()> {
        let mut left: Vec<&String> = self
            .0
            .f32
            .keys()
            .chain(self.0.bf16.keys())
            .chain(self.0.f16.keys())
            .chain(self.0.quant.keys())
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
