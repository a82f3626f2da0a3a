//! Where a model's files are: the one door every reader of a model goes through.
//!
//! A model is a Hugging Face folder (`config.json` beside safetensors), or a llama.cpp GGUF: a
//! `.gguf` file, or a folder holding exactly one (and no `config.json`). For a GGUF, the files
//! a Hugging Face folder would have are taken from beside it when they are there
//! (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`,
//! `generation_config.json`) and otherwise derived from its metadata
//! ([`super::from_gguf`]); `config.json` always comes from the metadata, which describes the
//! weights in the file.

use std::path::{Path, PathBuf};

use super::from_gguf;
use super::gguf::Gguf;
use crate::error::{Error, Result};

/// A model's location.
#[derive(Clone, Debug)]
pub struct ModelFiles {
    dir: PathBuf,
    gguf: Option<PathBuf>,
}

/// The files beside a GGUF that are read when present (and hashed into its content id).
pub(super) const BESIDE_GGUF: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
];

impl ModelFiles {
    /// The model at `path` (a folder or a `.gguf` file).
    pub fn locate(path: &Path) -> Result<Self> {
        if path.is_file() {
            if path.extension().is_some_and(|e| e == "gguf") {
                let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
                return Ok(Self {
                    dir,
                    gguf: Some(path.to_path_buf()),
                });
            }
            return Err(Error::Model(format!(
                "{}: a model is a checkpoint folder or a .gguf file",
                path.display()
            )));
        }
        if path.join("config.json").exists() || !path.is_dir() {
            return Ok(Self {
                dir: path.to_path_buf(),
                gguf: None,
            });
        }
        let mut ggufs: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| Error::io(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "gguf"))
            .collect();
        ggufs.sort();
        match ggufs.len() {
            0 => Ok(Self {
                dir: path.to_path_buf(),
                gguf: None,
            }),
            1 => Ok(Self {
                dir: path.to_path_buf(),
                gguf: ggufs.pop(),
            }),
            n => Err(Error::Model(format!(
                "{} holds {n} GGUF files and no config.json: name the one to serve",
                path.display()
            ))),
        }
    }

    /// The folder the model's files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The GGUF file, when the model is one.
    pub fn gguf(&self) -> Option<&Path> {
        self.gguf.as_deref()
    }

    /// Bytes its weights take as [`Model::load`](super::Model::load) holds them, read from the
    /// files' headers (nothing is loaded): what residency of this base costs, and what the
    /// exchange's catalog prices (`cx catalog add`). Quantized tensors count their blocks.
    pub fn held_bytes(&self) -> Result<u64> {
        let config = super::read_config(self.gguf.as_deref().unwrap_or(&self.dir))?;
        match &self.gguf {
            None => super::weights::held_bytes(&self.dir, config.tie_word_embeddings),
            Some(path) => Ok(Gguf::open(path)?
                .tensors
                .iter()
                .map(from_gguf::held_bytes)
                .sum()),
        }
    }

    /// The text of the model's file `name` and where it came from (for messages): the file in
    /// the folder, or for a GGUF one derived from its metadata; `None` when there is neither.
    pub fn read_text(&self, name: &str) -> Result<Option<(PathBuf, String)>> {
        let beside = self.dir.join(name);
        let from_metadata = self.gguf.is_some() && (name == "config.json" || !beside.exists());
        if !from_metadata {
            if !beside.exists() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&beside).map_err(|e| Error::io(&beside, e))?;
            return Ok(Some((beside, text)));
        }
        let path = self.gguf.as_deref().expect("a GGUF");
        let g = Gguf::open(path)?;
        let text = match name {
            "config.json" => from_gguf::config_json(&g)?,
            "tokenizer.json" => from_gguf::tokenizer_json(&g)?,
            "tokenizer_config.json" => from_gguf::tokenizer_config_json(&g)?,
            "generation_config.json" => from_gguf::generation_config_json(&g)?,
            _ => return Ok(None),
        };
        Ok(Some((
            PathBuf::from(format!("{} ({name} from its metadata)", path.display())),
            text,
        )))
    }
}
