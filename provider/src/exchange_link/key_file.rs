//! The provider's ML-DSA-65 identity on disk: a JSON file holding the 32-byte seed and the key
//! id it gives, mode 0600 from its first byte.
//!
//! Writing goes through a 0600 temporary file in the same directory (`create_new`, so nothing
//! planted at that name is written through), synced, then hard-linked into place — which fails if
//! the file exists, so a key is never replaced by accident — or renamed over it with `force`.
//! Reading refuses a file that other users can read or write, and one whose seed does not give
//! the key id it names (a file edited by hand, or another tool's). The seed is never printed.

use std::io::Write;
use std::path::{Path, PathBuf};

use cx_protocol::pq::Identity;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::error::{Error, Result};

const KIND: &str = "cx-provider-identity";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    kind: String,
    version: u32,
    /// SHA-256 of the ML-DSA-65 verification key (what `ProviderRegistry` and receipts name).
    key_hash: String,
    mldsa65_seed: String,
}

fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::KeyFile {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Writes `identity` to `path` (see the module notes); an existing file is replaced only with
/// `force`.
pub fn write_identity(path: &Path, identity: &Identity, force: bool) -> Result<()> {
    let file = KeyFile {
        kind: KIND.into(),
        version: VERSION,
        key_hash: format!("0x{}", hex::encode(identity.id().0)),
        mldsa65_seed: format!("0x{}", hex::encode(identity.seed())),
    };
    let text = Zeroizing::new(
        serde_json::to_string_pretty(&file).expect("a key file always serializes") + "\n",
    );
    drop(Zeroizing::new(file.mldsa65_seed));
    if !force && path.exists() {
        return Err(invalid(path, "exists; pass --force to replace it"));
    }
    write_private(path, text.as_bytes(), force)
}

/// Reads the identity at `path`.
pub fn read_identity(path: &Path) -> Result<Identity> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| Error::io(path, e))?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            return Err(invalid(
                path,
                format!("mode {mode:o} lets other users read it; chmod 600 it"),
            ));
        }
    }
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?);
    let file: KeyFile = serde_json::from_str(&text)
        .map_err(|e| invalid(path, format!("not a cx-provider identity file: {e}")))?;
    let seed_text = Zeroizing::new(file.mldsa65_seed);
    if file.kind != KIND || file.version != VERSION {
        return Err(invalid(
            path,
            format!(
                "kind `{}` version {} is not `{KIND}` version {VERSION} (make one with \
                 `cx-provider keygen --out FILE`)",
                file.kind, file.version
            ),
        ));
    }
    let hex_seed = seed_text.trim();
    let mut seed = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(
        hex_seed.strip_prefix("0x").unwrap_or(hex_seed),
        seed.as_mut(),
    )
    .map_err(|_| invalid(path, "mldsa65_seed is not 32 bytes of hex"))?;
    let identity = Identity::from_seed(*seed);
    if format!("0x{}", hex::encode(identity.id().0)) != file.key_hash.to_lowercase() {
        return Err(invalid(
            path,
            "the seed does not give the key_hash the file names",
        ));
    }
    Ok(identity)
}

fn write_private(path: &Path, bytes: &[u8], force: bool) -> Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| invalid(path, "names a directory, not a file"))?;
    let mut tag = [0u8; 6];
    getrandom::fill(&mut tag).expect("the operating system's random source");
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        hex::encode(tag)
    ));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let result = (|| {
        let mut file = options.open(&tmp).map_err(|e| Error::io(&tmp, e))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(&tmp, e))?;
        drop(file);
        if force {
            std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
        } else {
            std::fs::hard_link(&tmp, path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    invalid(path, "exists; pass --force to replace it")
                } else {
                    Error::io(path, e)
                }
            })
        }
    })();
    // After a rename the temporary name is gone; after a link (or a failure) remove it.
    let _ = std::fs::remove_file(&tmp);
    result?;
    if let Ok(dir) = std::fs::File::open(&dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_round_trips_through_a_0600_file_that_is_not_overwritten_without_force() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("cx-provider-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("provider.key");
        let _ = std::fs::remove_file(&path);
        let identity = Identity::from_seed([7; 32]);
        write_identity(&path, &identity, false).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read_identity(&path).unwrap().id(), identity.id());
        let err = write_identity(&path, &Identity::from_seed([8; 32]), false).unwrap_err();
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(read_identity(&path).unwrap().id(), identity.id());
        write_identity(&path, &Identity::from_seed([8; 32]), true).unwrap();
        assert_ne!(read_identity(&path).unwrap().id(), identity.id());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_identity(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
