//! The GGUF container as llama.cpp writes it (`gguf.h`, version 2 and 3): the magic, a count of
//! tensors and of metadata pairs, the metadata (typed values, arrays of them), the tensor infos
//! (name, dimensions innermost first, `ggml_type`, offset), then the tensor data from the next
//! multiple of `general.alignment` (32 by default).
//!
//! # Why every length is checked before it is allocated
//! A GGUF is input from anyone (a provider downloads it; a fuzzer writes it): every count and
//! length it claims is checked against the bytes the file has left before anything of that size
//! is allocated, so a claimed 2 GB string in a 1 KB file is a one-line error, not an allocation
//! of 2 GB. Tensor sizes follow from their types and dimensions and must lie inside the file.

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use cx_kernels::QuantType;

use crate::error::{Error, Result};

/// The largest metadata string read (a chat template is kilobytes; a token a few bytes).
const MAX_STRING: u64 = 16 << 20;
/// Arrays nest at most this deep.
const MAX_DEPTH: u32 = 2;
/// The most elements an array may hold (a vocabulary of 256k tokens and its merges fit many
/// times over): each element is parsed into a value of a few dozen bytes, so a file's claim is
/// bounded by this, not by the file's size.
const MAX_ARRAY: u64 = 1 << 22;
/// The most tensors a file may describe (a 405B Llama has about 1,100).
const MAX_TENSORS: u64 = 1 << 16;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Any integer type, widened.
    Int(i128),
    /// `f32` or `f64`, widened.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    Str(String),
    /// `array`.
    Array(Vec<Value>),
}

/// A tensor's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    /// `GGML_TYPE_F32`.
    F32,
    /// `GGML_TYPE_F16`.
    F16,
    /// `GGML_TYPE_BF16`.
    Bf16,
    /// A block format.
    Quant(QuantType),
}

impl TensorType {
    fn from_ggml(t: u32) -> Option<Self> {
        match t {
            0 => Some(Self::F32),
            1 => Some(Self::F16),
            30 => Some(Self::Bf16),
            other => QuantType::from_ggml_type(other).map(Self::Quant),
        }
    }

    /// Bytes of `elements` elements (`ne[0]` must be whole blocks for a block format).
    fn bytes(self, ne0: u64, elements: u64) -> Option<u64> {
        match self {
            Self::F32 => elements.checked_mul(4),
            Self::F16 | Self::Bf16 => elements.checked_mul(2),
            Self::Quant(q) => {
                let be = q.block_elements() as u64;
                ne0.is_multiple_of(be)
                    .then(|| elements / be * q.block_bytes() as u64)
            }
        }
    }

    /// The name llama.cpp gives it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Quant(q) => q.name(),
        }
    }
}

/// A tensor's description: where its bytes are.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// As llama.cpp names it (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost first (`[d_in, d_out]` for a matrix).
    pub dims: Vec<u64>,
    /// Element type.
    pub kind: TensorType,
    /// Byte offset from the start of the data section.
    offset: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A GGUF file's metadata and tensor infos (the data is read tensor by tensor, on demand).
#[derive(Debug)]
pub struct Gguf {
    path: PathBuf,
    /// Key → value, as written.
    pub metadata: BTreeMap<String, Value>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    data_start: u64,
}

/// Reads the file's values with a running count of what is left.
struct Reader<R> {
    inner: R,
    left: u64,
    path: PathBuf,
}

impl<R: Read> Reader<R> {
    fn bad(&self, reason: String) -> Error {
        Error::Model(format!(
            "{}: not a valid GGUF file: {reason}",
            self.path.display()
        ))
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>> {
        if n > self.left {
            return Err(self.bad(format!(
                "{what} claims {n} bytes, the file has {} left",
                self.left
            )));
        }
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| Error::io(&self.path, e))?;
        self.left -= n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.bytes(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        if len > MAX_STRING {
            return Err(self.bad(format!(
                "{what}: a string of {len} bytes (at most {MAX_STRING})"
            )));
        }
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes).map_err(|_| self.bad(format!("{what}: not UTF-8")))
    }

    fn value(&mut self, kind: u32, what: &str, depth: u32) -> Result<Value> {
        Ok(match kind {
            0 => Value::Int(self.array::<1>(what)?[0].into()),
            1 => Value::Int((self.array::<1>(what)?[0] as i8).into()),
            2 => Value::Int(u16::from_le_bytes(self.array(what)?).into()),
            3 => Value::Int(i16::from_le_bytes(self.array(what)?).into()),
            4 => Value::Int(self.u32(what)?.into()),
            5 => Value::Int(i32::from_le_bytes(self.array(what)?).into()),
            6 => Value::Float(f32::from_le_bytes(self.array(what)?).into()),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.bad(format!("{what}: bool byte {b}"))),
            },
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.bad(format!("{what}: arrays nested deeper than {MAX_DEPTH}")));
                }
                let inner = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte (a string at least eight).
                let least = if inner == 8 { 8 } else { 1 };
                if count > MAX_ARRAY || count.saturating_mul(least) > self.left {
                    return Err(self.bad(format!(
                        "{what}: an array of {count} elements (at most {MAX_ARRAY}), the file \
                         has {} bytes left",
                        self.left
                    )));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(inner, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::Int(self.u64(what)?.into()),
            11 => Value::Int(i64::from_le_bytes(self.array(what)?).into()),
            12 => Value::Float(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.bad(format!("{what}: unknown value type {other}"))),
        })
    }
}

impl Gguf {
    /// Reads the header, metadata and tensor infos of `path`, checking every tensor lies inside
    /// the file and has a type this provider computes with (others refused by name, with the
    /// tensor they were found in).
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut r = Reader {
            inner: BufReader::with_capacity(1 << 16, file),
            left: len,
            path: path.to_path_buf(),
        };
        if r.bytes(4, "the magic").ok().as_deref() != Some(b"GGUF") {
            return Err(r.bad("it does not start with the magic `GGUF`".into()));
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(r.bad(format!("version {version} (2 and 3 are read)")));
        }
        let tensor_count = r.u64("the tensor count")?;
        let kv_count = r.u64("the metadata count")?;
        // A pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8 + 4 + 4 + 8.
        if tensor_count > MAX_TENSORS {
            return Err(r.bad(format!("{tensor_count} tensors (at most {MAX_TENSORS})")));
        }
        if kv_count.saturating_mul(13) > r.left || tensor_count.saturating_mul(24) > r.left {
            return Err(r.bad(format!(
                "{kv_count} metadata pairs and {tensor_count} tensors do not fit in {len} bytes"
            )));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string("a metadata key")?;
            let kind = r.u32(&key)?;
            let value = r.value(kind, &format!("metadata `{key}`"), 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(r.bad(format!("metadata `{key}` appears twice")));
            }
        }
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        for _ in 0..tensor_count {
            let name = r.string("a tensor name")?;
            let n_dims = r.u32(&name)?;
            if !(1..=4).contains(&n_dims) {
                return Err(r.bad(format!("tensor {name}: {n_dims} dimensions")));
            }
            let dims = (0..n_dims)
                .map(|_| r.u64(&name))
                .collect::<Result<Vec<u64>>>()?;
            let ggml_type = r.u32(&name)?;
            let offset = r.u64(&name)?;
            let kind = TensorType::from_ggml(ggml_type).ok_or_else(|| {
                Error::Model(format!(
                    "{}: tensor {name} has ggml type {ggml_type}, which is not supported (f32, \
                     f16, bf16, {})",
                    path.display(),
                    QuantType::ALL.map(QuantType::name).join(", ")
                ))
            })?;
            let elements = dims
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .ok_or_else(|| r.bad(format!("tensor {name}: dimensions {dims:?} overflow")))?;
            let bytes = kind.bytes(dims[0], elements).ok_or_else(|| {
                r.bad(format!(
                    "tensor {name}: rows of {} elements are not whole {} blocks",
                    dims[0],
                    kind.name()
                ))
            })?;
            tensors.push(TensorInfo {
                name,
                dims,
                kind,
                offset,
                bytes,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(Value::Int(a)) if *a > 0 && (*a as u64).is_power_of_two() => *a as u64,
            Some(other) => {
                return Err(r.bad(format!(
                    "`general.alignment` is {other:?}, not a power of two"
                )));
            }
        };
        let data_start = (len - r.left).next_multiple_of(alignment);
        let data_len = len.saturating_sub(data_start);
        for t in &tensors {
            if !t.offset.is_multiple_of(alignment)
                || t.offset
                    .checked_add(t.bytes)
                    .is_none_or(|end| end > data_len)
            {
                return Err(r.bad(format!(
                    "tensor {} ({} bytes of {} at offset {}) does not lie inside the {data_len} \
                     bytes of data",
                    t.name,
                    t.bytes,
                    t.kind.name(),
                    t.offset
                )));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            metadata,
            tensors,
            data_start,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An integer value.
    pub fn int(&self, key: &str) -> Result<Option<i128>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Int(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong(key, "an integer", other)),
        }
    }

    /// A number (integer or float).
    pub fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Float(v)) => Ok(Some(*v)),
            Some(Value::Int(v)) => Ok(Some(*v as f64)),
            Some(other) => Err(self.wrong(key, "a number", other)),
        }
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Str(v)) => Ok(Some(v)),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    /// A bool value.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong(key, "a bool", other)),
        }
    }

    /// An array value.
    pub fn array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(Value::Array(v)) => Ok(Some(v)),
            Some(other) => Err(self.wrong(key, "an array", other)),
        }
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> Error {
        let got = match got {
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Bool(_) => "a bool",
            Value::Str(_) => "a string",
            Value::Array(_) => "an array",
        };
        Error::Model(format!(
            "{}: metadata `{key}` is {got}, expected {want}",
            self.path.display()
        ))
    }

    /// The bytes of tensor `info` (read from the file now).
    pub fn read(&self, info: &TensorInfo) -> Result<Vec<u8>> {
        let mut file = std::fs::File::open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        file.seek(SeekFrom::Start(self.data_start + info.offset))
            .map_err(|e| Error::io(&self.path, e))?;
        let mut buf = vec![0u8; info.bytes as usize];
        file.read_exact(&mut buf)
            .map_err(|e| Error::io(&self.path, e))?;
        Ok(buf)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A GGUF file: `(key, type, value bytes)` pairs, then `(name, dims, ggml type, data)`.
    pub(crate) fn write(
        path: &Path,
        kv: &[(&str, u32, Vec<u8>)],
        tensors: &[(&str, Vec<u64>, u32, Vec<u8>)],
    ) {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((kv.len() as u64).to_le_bytes());
        for (key, kind, value) in kv {
            out.extend((key.len() as u64).to_le_bytes());
            out.extend(key.as_bytes());
            out.extend(kind.to_le_bytes());
            out.extend(value);
        }
        let mut offset = 0u64;
        for (name, dims, kind, data) in tensors {
            out.extend((name.len() as u64).to_le_bytes());
            out.extend(name.as_bytes());
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(kind.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = (offset + data.len() as u64).next_multiple_of(32);
        }
        out.resize(out.len().next_multiple_of(32), 0);
        for (_, _, _, data) in tensors {
            out.extend(data);
            out.resize(out.len().next_multiple_of(32), 0);
        }
        std::fs::write(path, out).unwrap();
    }

    pub(crate) fn string(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend(s.as_bytes());
        v
    }

    /// The error opening `path` gives, which must be one line.
    fn error(path: &Path) -> String {
        let e = Gguf::open(path).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    }

    #[test]
    fn bad_files_are_refused_in_one_line_naming_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("cx-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        let q8 = vec![0u8; 34];
        write(
            &p,
            &[("general.architecture", 8, string("llama"))],
            &[("t", vec![32], 8, q8.clone())],
        );
        let ok = Gguf::open(&p).unwrap();
        assert_eq!(ok.str("general.architecture").unwrap(), Some("llama"));
        assert_eq!(ok.tensors[0].kind, TensorType::Quant(QuantType::Q8_0));
        assert_eq!(ok.read(&ok.tensors[0]).unwrap(), q8);

        // Truncated: the tensor's bytes are not all there.
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 40]).unwrap();
        assert!(error(&p).contains("does not lie inside"), "{}", error(&p));
        std::fs::write(&p, &bytes[..60]).unwrap();
        assert!(error(&p).contains("claims"), "{}", error(&p));

        // A tensor whose size disagrees with its type: 33 elements of q8_0.
        write(&p, &[], &[("odd", vec![33], 8, vec![0; 34])]);
        assert!(
            error(&p).contains("tensor odd: rows of 33 elements"),
            "{}",
            error(&p)
        );

        // An unknown type (Q2_K, 10), named with its tensor.
        write(
            &p,
            &[],
            &[("blk.0.ffn_up.weight", vec![256], 10, vec![0; 84])],
        );
        let e = error(&p);
        assert!(
            e.contains("tensor blk.0.ffn_up.weight has ggml type 10"),
            "{e}"
        );

        // A metadata string claiming 2 GB: refused before anything of that size is allocated.
        let mut huge = (2u64 << 30).to_le_bytes().to_vec();
        huge.extend(b"short");
        write(&p, &[("tokenizer.chat_template", 8, huge)], &[]);
        let e = error(&p);
        assert!(
            e.contains("tokenizer.chat_template") && e.contains("2147483648"),
            "{e}"
        );
        // An array claiming more elements than the file has bytes.
        let mut arr = 4u32.to_le_bytes().to_vec();
        arr.extend(u64::MAX.to_le_bytes());
        write(&p, &[("tokenizer.ggml.token_type", 9, arr)], &[]);
        assert!(error(&p).contains("an array of"), "{}", error(&p));
        std::fs::write(&p, b"GGML....").unwrap();
        assert!(error(&p).contains("magic"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
