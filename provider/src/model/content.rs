//! A checkpoint's content id (SPEC §4: residency is reported by content id): the protocol's
//! [`cx_protocol::content_id`] of the checkpoint folder's top-level configuration (`*.json`),
//! chat template (`*.jinja`) and weights (`*.safetensors`), streamed from disk so that weights
//! larger than memory hash too. Two providers holding the same files report the same id; a
//! buyer computes it from the files it downloaded.

use std::io::Read;
use std::path::Path;

use cx_protocol::id::ContentHasher;

use super::ModelFiles;
use crate::error::{Error, Result};

/// Whether `name` is part of a checkpoint's identity.
fn counts(name: &str) -> bool {
    [".json", ".jinja", ".safetensors"]
        .iter()
        .any(|ext| name.ends_with(ext))
}

/// The content id of the checkpoint at `path`: a folder's files as above; for a GGUF
/// ([`ModelFiles`]) the file and the files beside it that are read with it.
pub fn checkpoint_id(path: &Path) -> Result<String> {
    let model = ModelFiles::locate(path)?;
    let dir = model.dir();
    let mut files: Vec<(String, std::path::PathBuf, u64)> = Vec::new();
    let mut add = |name: String, path: std::path::PathBuf| -> Result<()> {
        let meta = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
        if meta.is_file() {
            files.push((name, path, meta.len()));
        }
        Ok(())
    };
    match model.gguf() {
        Some(gguf) => {
            let name = gguf.file_name().unwrap_or_default().to_string_lossy();
            add(name.into_owned(), gguf.to_path_buf())?;
            for name in super::files::BESIDE_GGUF {
                if dir.join(name).exists() {
                    add(name.to_string(), dir.join(name))?;
                }
            }
        }
        None => {
            for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
                let entry = entry.map_err(|e| Error::io(dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if counts(&name) {
                    add(name, entry.path())?;
                }
            }
        }
    }
    files.sort();
    let mut hasher = ContentHasher::default();
    let mut buf = vec![0u8; 1 << 20];
    for (name, path, len) in &files {
        hasher.file(name, *len);
        let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut read = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
            if n == 0 {
                break;
            }
            read += n as u64;
            hasher.update(&buf[..n]);
        }
        if read != *len {
            return Err(Error::io(
                path,
                std::io::Error::other(format!("changed while hashed ({len} → {read} bytes)")),
            ));
        }
    }
    Ok(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_the_protocols_over_the_checkpoint_files_alone() {
        let dir = std::env::temp_dir().join(format!("cx-checkpoint-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), b"{}").unwrap();
        std::fs::write(dir.join("model.safetensors"), b"weights").unwrap();
        std::fs::write(dir.join("README.md"), b"not part of it").unwrap();
        let id = checkpoint_id(&dir).unwrap();
        assert_eq!(
            id,
            cx_protocol::content_id(&[("model.safetensors", b"weights"), ("config.json", b"{}")])
        );
        std::fs::write(dir.join("model.safetensors"), b"weightz").unwrap();
        assert_ne!(checkpoint_id(&dir).unwrap(), id);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
