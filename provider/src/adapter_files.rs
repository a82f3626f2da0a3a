//! Where adapters may be read from, and how: only from the configured roots (`serve
//! --adapters` and each `--adapter-root`), only regular files, never more bytes than an adapter
//! of the largest accepted rank can hold.
//!
//! `POST /v1/load_lora_adapter` hands the server a path chosen by a client. Read as given, it
//! lets the client make the server open any file it can (a FIFO that blocks a loader thread
//! forever, `/dev/zero` that never ends, a secret whose parse error echoes its bytes) and learn
//! what exists where. So a requested path is canonicalised (symlinks resolved) and must lie
//! inside a root; a path that is missing and a path outside every root get the same answer, so
//! the answer says nothing about the rest of the filesystem.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The directories adapters may be loaded from (canonical paths).
#[derive(Clone, Debug, Default)]
pub struct AdapterRoots {
    roots: Vec<PathBuf>,
}

impl AdapterRoots {
    /// Roots from `dirs`, each of which must be an existing directory.
    pub fn new(dirs: &[PathBuf]) -> Result<Self> {
        let mut roots = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let canonical = std::fs::canonicalize(dir).map_err(|e| Error::io(dir, e))?;
            if !canonical.is_dir() {
                return Err(Error::AdapterPath(format!(
                    "adapter root {} is not a directory",
                    dir.display()
                )));
            }
            roots.push(canonical);
        }
        Ok(Self { roots })
    }

    /// Adds the roots of `other`.
    pub fn extend(&mut self, other: AdapterRoots) {
        for root in other.roots {
            if !self.roots.contains(&root) {
                self.roots.push(root);
            }
        }
    }

    /// No root: loading by path is off.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The canonical directory `requested` names, if it lies inside a root. A relative path is
    /// taken relative to each root in turn.
    pub fn resolve(&self, requested: &Path) -> Result<PathBuf> {
        if self.roots.is_empty() {
            return Err(Error::AdapterPath(
                "loading adapters by path is off: start the server with --adapter-root DIR \
                 (or --adapters DIR)"
                    .into(),
            ));
        }
        let candidates: Vec<PathBuf> = if requested.is_absolute() {
            vec![requested.to_path_buf()]
        } else {
            self.roots.iter().map(|r| r.join(requested)).collect()
        };
        for candidate in candidates {
            let Ok(canonical) = std::fs::canonicalize(&candidate) else {
                continue;
            };
            if self.roots.iter().any(|r| canonical.starts_with(r)) && canonical.is_dir() {
                return Ok(canonical);
            }
        }
        // One answer for "missing" and "outside": nothing is said about the filesystem.
        Err(Error::AdapterPath(format!(
            "lora_path `{}` is not an adapter directory under the configured adapter roots",
            requested.display()
        )))
    }
}

/// Reads `path`, which must be a regular file (not a FIFO, a device or a directory) of at most
/// `limit_bytes`. The type is checked before opening (opening a FIFO would block) and again on
/// the open handle (the path could have been swapped in between).
pub fn read_regular_file(path: &Path, limit_bytes: u64) -> Result<Vec<u8>> {
    let not_regular = || Error::AdapterFile {
        path: path.to_path_buf(),
        reason: "is not a regular file".into(),
    };
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    let too_large = |bytes: u64| Error::AdapterFile {
        path: path.to_path_buf(),
        reason: format!(
            "is {bytes} bytes, over the limit of {limit_bytes} (an adapter of the largest \
             accepted rank; raise --max-lora-rank if it is genuine)"
        ),
    };
    if meta.len() > limit_bytes {
        return Err(too_large(meta.len()));
    }
    // The file may grow after the check: read one byte past the limit at most.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limit_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_roots_and_missing_paths_get_one_answer() {
        let base = std::env::temp_dir().join(format!("cx-roots-{}", std::process::id()));
        let root = base.join("root");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(base.join("outside"), root.join("escape")).unwrap();
        let roots = AdapterRoots::new(std::slice::from_ref(&root)).unwrap();
        assert!(roots.resolve(&root.join("a")).is_ok());
        assert!(roots.resolve(Path::new("a")).is_ok());
        let outside = roots
            .resolve(&base.join("outside"))
            .unwrap_err()
            .to_string();
        let missing = roots
            .resolve(&base.join("nothing"))
            .unwrap_err()
            .to_string();
        let dotdot = roots
            .resolve(Path::new("../outside"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            outside.replace("outside", "X"),
            missing.replace("nothing", "X")
        );
        assert!(dotdot.contains("not an adapter directory"));
        #[cfg(unix)]
        assert!(roots.resolve(&root.join("escape")).is_err());
        assert!(AdapterRoots::default().resolve(&root).is_err());
        std::fs::write(root.join("a/f"), b"12345").unwrap();
        assert!(read_regular_file(&root.join("a/f"), 5).is_ok());
        assert!(read_regular_file(&root.join("a/f"), 4).is_err());
        assert!(read_regular_file(&root.join("a"), 4).is_err());
        #[cfg(target_os = "linux")]
        assert!(
            read_regular_file(Path::new("/dev/zero"), 4)
                .unwrap_err()
                .to_string()
                .contains("not a regular file")
        );
        std::fs::remove_dir_all(&base).ok();
    }
}
