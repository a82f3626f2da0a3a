//! Secret files: written owner-only (0600) and refused when anyone else could read them.
//!
//! A signer holds two kinds of secret: its ML-DSA-65 identity (the 32-byte FIPS 204 key-generation
//! seed, hex) and its FROST key packages, one per key epoch (JSON: the share of the group secret,
//! the group's public key package). Both are written to a temporary file created with mode 0600,
//! flushed to disk and renamed over the target, so a crash never leaves a half-written key and
//! the secret never exists with wider permissions, not even for an instant. Reading refuses a
//! file that group or others may read, as `ssh` does for private keys: a key that leaked through
//! permissions must be replaced, not silently used. Secrets never reach `Debug` or the logs.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cx_protocol::pq::Identity;
use frost_secp256k1 as frost;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::error::{Error, Result};

/// Writes `bytes` to `path` with mode 0600, atomically (temporary file, fsync, rename),
/// replacing what was there.
pub fn write_secret(path: &Path, bytes: &[u8]) -> Result<()> {
    write_secret_with(path, bytes, Replace::Yes)
}

/// Like [`write_secret`], but refuses when `path` exists: the final step is a hard link, which
/// fails atomically on an existing file, so two writers cannot both win.
pub fn create_secret(path: &Path, bytes: &[u8]) -> Result<()> {
    write_secret_with(path, bytes, Replace::No)
}

#[derive(Clone, Copy, PartialEq)]
enum Replace {
    Yes,
    No,
}

fn write_secret_with(path: &Path, bytes: &[u8], replace: Replace) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    }
    if replace == Replace::No && std::fs::symlink_metadata(path).is_ok() {
        return Err(exists(path));
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = write_temporary(&tmp, bytes).and_then(|()| match replace {
        Replace::Yes => std::fs::rename(&tmp, path).map_err(Error::io(path)),
        Replace::No => std::fs::hard_link(&tmp, path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                exists(path)
            } else {
                Error::io(path)(e)
            }
        }),
    });
    // The temporary file never outlives the call, whatever failed (after a rename it is gone
    // already; after a link or an error it is removed here).
    let _ = std::fs::remove_file(&tmp);
    written
}

fn write_temporary(tmp: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(Error::io(tmp))?;
    file.write_all(bytes).map_err(Error::io(tmp))?;
    file.sync_all().map_err(Error::io(tmp))
}

fn exists(path: &Path) -> Error {
    Error::KeyFile {
        path: path.to_path_buf(),
        reason: "already exists; refusing to overwrite a key (pass --force to replace it, and \
                 the old key is lost)"
            .into(),
    }
}

/// Reads a secret file, refusing one whose mode lets group or others read or write it.
pub fn read_secret(path: &Path) -> Result<Zeroizing<Vec<u8>>> {
    let mode = std::fs::metadata(path)
        .map_err(Error::io(path))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(Error::KeyFile {
            path: path.to_path_buf(),
            reason: format!(
                "mode {:o} lets others read it; run `chmod 600 {}` (and rotate the key if it may \
                 have leaked)",
                mode & 0o777,
                path.display()
            ),
        });
    }
    Ok(Zeroizing::new(
        std::fs::read(path).map_err(Error::io(path))?,
    ))
}

/// Writes an ML-DSA identity's seed (hex) to `path`, 0600, replacing what was there.
pub fn write_identity(path: &Path, identity: &Identity) -> Result<()> {
    let text = Zeroizing::new(hex::encode(identity.seed()));
    write_secret(path, text.as_bytes())
}

/// Writes an ML-DSA identity's seed (hex) to a new file `path`, 0600; refuses an existing one
/// (an identity overwritten by mistake is a signer lost).
pub fn create_identity(path: &Path, identity: &Identity) -> Result<()> {
    let text = Zeroizing::new(hex::encode(identity.seed()));
    create_secret(path, text.as_bytes())
}

/// Reads the identity a seed file holds.
pub fn read_identity(path: &Path) -> Result<Identity> {
    let bytes = read_secret(path)?;
    let bad = |reason: &str| Error::KeyFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| bad("not hex text"))?;
    let mut seed = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(text.trim(), &mut seed[..])
        .map_err(|_| bad("expected 64 hex digits (a 32-byte ML-DSA seed)"))?;
    Ok(Identity::from_seed(*seed))
}

/// Reads the identity at `path`, or generates one and writes it (first start of a signer).
pub fn load_or_create_identity(path: &Path) -> Result<Identity> {
    if path.exists() {
        return read_identity(path);
    }
    let identity = Identity::generate();
    write_identity(path, &identity)?;
    Ok(identity)
}

/// What a signer keeps from one DKG: its share and the group's public keys.
#[derive(Clone, Serialize, Deserialize)]
pub struct StoredKey {
    /// Key epoch: 0 for the first DKG, +1 per rotation.
    pub epoch: u32,
    /// This signer's key package (secret share, verifying share, group key, threshold).
    pub key_package: frost::keys::KeyPackage,
    /// Every participant's verifying share and the group key.
    pub public_key_package: frost::keys::PublicKeyPackage,
}

impl std::fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The signing share is secret: show only public facts.
        write!(
            f,
            "StoredKey(epoch {}, group {})",
            self.epoch,
            hex::encode(
                self.public_key_package
                    .verifying_key()
                    .serialize()
                    .unwrap_or_default()
            )
        )
    }
}

/// The file of the key package of `epoch` in `dir`.
pub fn key_path(dir: &Path, epoch: u32) -> PathBuf {
    dir.join(format!("frost-key-epoch-{epoch}.json"))
}

/// Writes a key package file (0600).
pub fn write_key(dir: &Path, key: &StoredKey) -> Result<()> {
    let json = Zeroizing::new(serde_json::to_vec_pretty(key)?);
    write_secret(&key_path(dir, key.epoch), &json)
}

/// Reads every key package in `dir`, by epoch.
pub fn read_keys(dir: &Path) -> Result<Vec<StoredKey>> {
    let mut keys = Vec::new();
    if !dir.exists() {
        return Ok(keys);
    }
    for entry in std::fs::read_dir(dir).map_err(Error::io(dir))? {
        let path = entry.map_err(Error::io(dir))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("frost-key-epoch-") && name.ends_with(".json") {
            let bytes = read_secret(&path)?;
            keys.push(
                serde_json::from_slice(&bytes).map_err(|source| Error::JsonFile {
                    path: path.clone(),
                    source,
                })?,
            );
        }
    }
    keys.sort_by_key(|k: &StoredKey| k.epoch);
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_files_are_owner_only_and_loose_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("cx-keyfile-{}", std::process::id()));
        let path = dir.join("identity.key");
        let identity = load_or_create_identity(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_identity(&path).unwrap().id(), identity.id());
        // The same file, once readable by others, is refused with the fix in the message.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_identity(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        // Debug output names the public id, never the seed.
        let debug = format!("{identity:?}");
        assert!(!debug.contains(&hex::encode(identity.seed())));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Guards `cx-signer keygen` overwriting an identity without `--force`.
    #[test]
    fn create_identity_refuses_an_existing_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("cx-keyfile-new-{}", std::process::id()));
        let path = dir.join("identity.key");
        let first = Identity::generate();
        create_identity(&path, &first).unwrap();
        let err = create_identity(&path, &Identity::generate())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("already exists") && err.contains("identity.key"),
            "{err}"
        );
        assert_eq!(read_identity(&path).unwrap().id(), first.id());
        // A directory in the way fails naming the path, and no temporary file is left.
        let blocked = dir.join("blocked");
        std::fs::create_dir_all(&blocked).unwrap();
        assert!(
            write_identity(&blocked, &first)
                .unwrap_err()
                .to_string()
                .contains("blocked")
        );
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains("tmp")), "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
