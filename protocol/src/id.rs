//! Content ids: an artifact is named by the SHA-256 of what it is made of, so two parties that
//! hold the same bytes agree on its name without asking anyone.

use sha2::{Digest, Sha256};

/// SHA-256 over a set of named files, as lowercase hex.
///
/// Files are hashed in name order, each as `len(name) ‖ name ‖ len(bytes) ‖ bytes` with 8-byte
/// big-endian lengths, so that neither the order given nor a shifted boundary between name and
/// content can produce the same id for different contents.
pub fn content_id(files: &[(&str, &[u8])]) -> String {
    let mut sorted: Vec<&(&str, &[u8])> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut hasher = ContentHasher::default();
    for (name, bytes) in sorted {
        hasher.file(name, bytes.len() as u64);
        hasher.update(bytes);
    }
    hasher.finish()
}

/// [`content_id`] fed piece by piece, for files too large to hold in memory (a base model's
/// weights): announce each file ([`ContentHasher::file`]) in name order, then stream its bytes.
#[derive(Default)]
pub struct ContentHasher(Sha256);

impl ContentHasher {
    /// Starts file `name` of `len` bytes; its bytes follow.
    pub fn file(&mut self, name: &str, len: u64) {
        self.0.update((name.len() as u64).to_be_bytes());
        self.0.update(name.as_bytes());
        self.0.update(len.to_be_bytes());
    }

    /// More of the current file's bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The id, lowercase hex.
    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_of_files_does_not_matter_but_content_does() {
        let a = content_id(&[("a", b"1"), ("b", b"2")]);
        assert_eq!(a, content_id(&[("b", b"2"), ("a", b"1")]));
        assert_ne!(a, content_id(&[("a", b"1"), ("b", b"3")]));
        // Moving a byte from the name into the content changes the id.
        assert_ne!(content_id(&[("ab", b"")]), content_id(&[("a", b"b")]));
        assert_eq!(a.len(), 64);
    }
}
