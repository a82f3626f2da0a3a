//! Text ↔ token ids: a byte-level tokenizer for generated models (ids `0..256` are bytes,
//! then BOS and EOS), or `tokenizer.json` through the Hugging Face `tokenizers` crate when the
//! model directory has one (feature `hf-tokenizer`).

use std::path::Path;

use crate::error::{Error, Result};
use crate::model::{GENERATED_BOS, GENERATED_EOS, ModelConfig, generated_tokenizer_json};

/// A tokenizer.
pub enum Tokenizer {
    /// One token per byte; BOS prepended when the config names one.
    Bytes {
        /// Prepended to every prompt.
        bos: Option<u32>,
    },
    /// `tokenizer.json`.
    #[cfg(feature = "hf-tokenizer")]
    Hf(Box<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Tokenizer {
    /// The tokenizer of a model directory: `tokenizer.json` if present, else bytes (which only
    /// makes sense for a vocabulary of at least 256). The byte-level `tokenizer.json` that
    /// `gen-model` writes ([`generated_tokenizer_json`]) is recognised and served by the
    /// built-in byte tokenizer, with or without the `hf-tokenizer` feature (same ids).
    pub fn for_model(dir: &Path, config: &ModelConfig) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if path.exists() {
            if is_generated_tokenizer(&path, config)? {
                return Ok(Self::generated());
            }
            #[cfg(feature = "hf-tokenizer")]
            {
                let tokenizer = tokenizers::Tokenizer::from_file(&path)
                    .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
                return Ok(Self::Hf(Box::new(tokenizer)));
            }
            #[cfg(not(feature = "hf-tokenizer"))]
            return Err(Error::Tokenizer(format!(
                "{} needs the Hugging Face tokenizer: rebuild cx-provider with \
                 `--features hf-tokenizer`",
                path.display()
            )));
        }
        if config.vocab_size < 256 {
            return Err(Error::Tokenizer(format!(
                "no tokenizer.json and a vocabulary of {} (< 256) cannot hold bytes",
                config.vocab_size
            )));
        }
        Ok(Self::Bytes {
            bos: config
                .bos_token_id
                .filter(|&b| (b as usize) < config.vocab_size),
        })
    }

    /// The byte tokenizer of generated models.
    pub fn generated() -> Self {
        Self::Bytes {
            bos: Some(GENERATED_BOS),
        }
    }

    /// A short name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Bytes { .. } => "bytes",
            #[cfg(feature = "hf-tokenizer")]
            Self::Hf(_) => "tokenizer.json",
        }
    }

    /// Token ids of `text` (with BOS for the byte tokenizer; as `tokenizer.json`'s
    /// post-processor says otherwise).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Self::Bytes { bos } => Ok(bos
                .iter()
                .copied()
                .chain(text.bytes().map(u32::from))
                .collect()),
            #[cfg(feature = "hf-tokenizer")]
            Self::Hf(t) => Ok(t
                .encode(text, true)
                .map_err(|e| Error::Tokenizer(e.to_string()))?
                .get_ids()
                .to_vec()),
        }
    }

    /// The text of `ids`, special tokens skipped. May end inside a UTF-8 character (bytes)
    /// or with U+FFFD (an incomplete piece); [`stable_prefix`] cuts that off for streaming.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Self::Bytes { .. } => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .filter(|&&id| id < 256)
                    .map(|&id| id as u8)
                    .collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            #[cfg(feature = "hf-tokenizer")]
            Self::Hf(t) => t
                .decode(ids, true)
                .map_err(|e| Error::Tokenizer(e.to_string())),
        }
    }
}

/// Whether `path` holds exactly the byte-level `tokenizer.json` of a generated model of this
/// vocabulary (and the config names its BOS and EOS).
fn is_generated_tokenizer(path: &Path, config: &ModelConfig) -> Result<bool> {
    // The generated file is ~40 bytes per vocabulary entry; anything much larger is another
    // tokenizer, not worth parsing twice.
    let limit = 64 * config.vocab_size as u64 + 4096;
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    if size > limit
        || config.bos_token_id != Some(GENERATED_BOS)
        || !config.eos_ids().contains(&GENERATED_EOS)
    {
        return Ok(false);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(false);
    };
    Ok(value == generated_tokenizer_json(config.vocab_size))
}

/// The part of `text` that later tokens cannot change: everything before a trailing run of
/// U+FFFD (an incomplete UTF-8 character that the next token may complete).
pub fn stable_prefix(text: &str) -> &str {
    text.trim_end_matches('\u{FFFD}')
}
