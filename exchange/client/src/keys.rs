//! An agent's keys and the file that keeps them.
//!
//! An agent is an Ethereum account (a secp256k1 key: it signs EIP-712 orders and its own
//! on-chain transactions) and an ML-DSA-65 identity bound to it (FIPS 204: it co-signs every
//! order). Both secrets are 32 bytes — ML-DSA's is the key-generation seed, from which the key
//! pair follows deterministically — so the file is small JSON:
//!
//! ```json
//! {
//!   "kind": "cx-agent-keys",
//!   "version": 1,
//!   "account": "0x…",
//!   "mldsa_key_hash": "0x…",
//!   "secp256k1_secret": "0x…32 bytes…",
//!   "mldsa65_seed": "0x…32 bytes…"
//! }
//! ```
//!
//! `account` and `mldsa_key_hash` are public and only there for people and for a check on load
//! (a file whose secret does not give its account is refused as corrupt).
//!
//! **Writing** ([`AgentKeys::write`]) never leaves a moment where the secret is readable by
//! others or half written: the bytes go to a new temporary file in the same directory, created
//! with mode 0600 (not chmod-ed after), synced, then moved into place — by `link` when the target
//! must not exist (which fails atomically if it does, so two writers cannot both win) or by
//! `rename` with `force`. **Reading** ([`AgentKeys::load`]) refuses a file other users can read,
//! as ssh does.

use crate::error::{Error, Result};
use cx_protocol::order::{
    self, Address, B256, Binding, Eip712Domain, Order, Signed, SigningKey, account_of,
};
use cx_protocol::pq::Identity;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The `kind` of a key file.
pub const KEY_FILE_KIND: &str = "cx-agent-keys";
/// The format version written.
pub const KEY_FILE_VERSION: u32 = 1;

/// An agent's two keys. `Debug` shows the public names only.
pub struct AgentKeys {
    account_key: SigningKey,
    identity: Identity,
}

impl fmt::Debug for AgentKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentKeys")
            .field("account", &self.account())
            .field("mldsa_key_hash", &self.mldsa_key_hash())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    kind: String,
    version: u32,
    account: Address,
    mldsa_key_hash: B256,
    secp256k1_secret: String,
    mldsa65_seed: String,
}

impl AgentKeys {
    /// Fresh keys from the operating system's random source.
    pub fn generate() -> Self {
        loop {
            let mut secret = Zeroizing::new([0u8; 32]);
            getrandom::fill(secret.as_mut()).expect("the operating system's random source");
            // A 32-byte string is a valid secp256k1 scalar unless it is 0 or ≥ n (p ≈ 2^-128).
            if let Ok(keys) = Self::from_secrets(&secret, Identity::generate()) {
                return keys;
            }
        }
    }

    /// Keys from a secp256k1 secret (an existing wallet's, say) and an ML-DSA-65 identity.
    pub fn from_secrets(secp256k1_secret: &[u8; 32], identity: Identity) -> Result<Self> {
        let account_key = SigningKey::from_slice(secp256k1_secret).map_err(|_| {
            cx_protocol::Error::InvalidField {
                field: "secp256k1_secret".to_owned(),
                reason: "not a valid secp256k1 secret key (0 or not below the curve order)"
                    .to_owned(),
            }
        })?;
        Ok(Self {
            account_key,
            identity,
        })
    }

    /// The Ethereum account.
    pub fn account(&self) -> Address {
        account_of(&self.account_key)
    }

    /// SHA-256 of the ML-DSA-65 verification key (what a binding names).
    pub fn mldsa_key_hash(&self) -> B256 {
        B256::from(self.identity.id().0)
    }

    /// The secp256k1 key (EIP-712 signatures; on-chain transactions).
    pub fn signing_key(&self) -> &SigningKey {
        &self.account_key
    }

    /// The secp256k1 secret, for a chain client that signs transactions with it.
    pub fn secp256k1_secret(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.account_key.to_bytes().into())
    }

    /// The ML-DSA-65 identity (order co-signatures).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The binding of the ML-DSA key to the account under `domain`, both halves signed, for
    /// [`crate::Client::bind`].
    pub fn binding(&self, domain: &Eip712Domain, nonce: u64) -> Result<Binding> {
        Ok(Binding::sign(
            &self.account_key,
            &self.identity,
            domain,
            nonce,
        )?)
    }

    /// Signs `order` under `domain`: the account's EIP-712 signature and the ML-DSA-65
    /// co-signature over the same digest.
    pub fn sign<T: Order>(&self, order: T, domain: &Eip712Domain) -> Result<Signed<T>> {
        Ok(order::sign(
            order,
            domain,
            &self.account_key,
            &self.identity,
        )?)
    }

    /// Writes the key file at `path`: mode 0600 from its first byte, atomically (see the module
    /// notes); an existing file is replaced only with `force`.
    pub fn write(&self, path: &Path, force: bool) -> Result<()> {
        let file = KeyFile {
            kind: KEY_FILE_KIND.to_owned(),
            version: KEY_FILE_VERSION,
            account: self.account(),
            mldsa_key_hash: self.mldsa_key_hash(),
            secp256k1_secret: format!("0x{}", hex::encode(*self.secp256k1_secret())),
            mldsa65_seed: format!("0x{}", hex::encode(self.identity.seed())),
        };
        let text = Zeroizing::new(
            serde_json::to_string_pretty(&file).expect("a key file always serializes") + "\n",
        );
        drop(Zeroizing::new(file.secp256k1_secret));
        drop(Zeroizing::new(file.mldsa65_seed));
        if !force && path.exists() {
            // Checked again, atomically, by the link below; this early answer only avoids a
            // temporary file.
            return Err(Error::KeyFileExists {
                path: path.to_owned(),
            });
        }
        write_private(path, text.as_bytes(), force)
    }

    /// Reads the key file at `path`, refusing one that other users can read, or whose secret
    /// does not give the account it names.
    pub fn load(path: &Path) -> Result<Self> {
        let invalid = |reason: String| Error::KeyFileInvalid {
            path: path.to_owned(),
            reason,
        };
        let io = |source| Error::KeyFileIo {
            path: path.to_owned(),
            source,
        };
        check_private(path)?;
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(io)?);
        let file: KeyFile =
            serde_json::from_str(&text).map_err(|e| invalid(format!("not a key file: {e}")))?;
        let file_secret = Zeroizing::new(file.secp256k1_secret);
        let file_seed = Zeroizing::new(file.mldsa65_seed);
        if file.kind != KEY_FILE_KIND {
            return Err(invalid(format!(
                "kind is `{}`, expected `{KEY_FILE_KIND}`",
                file.kind
            )));
        }
        if file.version != KEY_FILE_VERSION {
            return Err(invalid(format!(
                "version {} is not one this cx reads (it reads {KEY_FILE_VERSION})",
                file.version
            )));
        }
        let secret = parse_secret(&file_secret)
            .map_err(|reason| invalid(format!("secp256k1_secret: {reason}")))?;
        let seed = parse_secret(&file_seed)
            .map_err(|reason| invalid(format!("mldsa65_seed: {reason}")))?;
        let keys = Self::from_secrets(&secret, Identity::from_seed(*seed))
            .map_err(|e| invalid(e.to_string()))?;
        if keys.account() != file.account {
            return Err(invalid(format!(
                "the secret is the key of {}, not of the account {} the file names",
                keys.account(),
                file.account
            )));
        }
        if keys.mldsa_key_hash() != file.mldsa_key_hash {
            return Err(invalid(
                "the ML-DSA seed does not give the key hash the file names".to_owned(),
            ));
        }
        Ok(keys)
    }
}

/// 32 bytes from `0x`-prefixed (or bare) hex.
pub fn parse_secret(text: &str) -> std::result::Result<Zeroizing<[u8; 32]>, String> {
    let hex_text = text.trim();
    let hex_text = hex_text.strip_prefix("0x").unwrap_or(hex_text);
    let mut out = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(hex_text, out.as_mut())
        .map_err(|e| format!("expected 32 bytes of hex: {e}"))?;
    Ok(out)
}

/// Writes `bytes` through a 0600 temporary file in `path`'s directory, then links (no `force`:
/// fails if `path` exists) or renames (`force`) it into place.
fn write_private(path: &Path, bytes: &[u8], force: bool) -> Result<()> {
    let io = |at: &Path| {
        let at = at.to_owned();
        move |source| Error::KeyFileIo { path: at, source }
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| Error::KeyFileInvalid {
        path: path.to_owned(),
        reason: "names a directory, not a file".to_owned(),
    })?;
    let mut tag = [0u8; 6];
    getrandom::fill(&mut tag).expect("the operating system's random source");
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        hex::encode(tag)
    ));
    let mut options = std::fs::OpenOptions::new();
    // create_new: never write through a file (or a symlink) someone put at the temporary name.
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let result = (|| {
        let mut file = options.open(&tmp).map_err(io(&tmp))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(io(&tmp))?;
        drop(file);
        if force {
            std::fs::rename(&tmp, path).map_err(io(path))
        } else {
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    Err(Error::KeyFileExists {
                        path: path.to_owned(),
                    })
                }
                Err(e) => Err(io(path)(e)),
            }
        }
    })();
    // After a rename the temporary name is gone; after a link (or a failure) remove it.
    let _ = std::fs::remove_file(&tmp);
    result?;
    // The directory entry itself must survive a crash too.
    if let Ok(dir) = std::fs::File::open(&dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Refuses a key file that users other than its owner can read or write.
fn check_private(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|source| Error::KeyFileIo {
                path: path.to_owned(),
                source,
            })?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::KeyFilePermissions {
                path: path.to_owned(),
                mode,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let mut r = [0u8; 6];
            getrandom::fill(&mut r).unwrap();
            let path =
                std::env::temp_dir().join(format!("cx-client-keys-{tag}-{}", hex::encode(r)));
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn keys_round_trip_through_a_0600_file_and_are_not_overwritten_without_force() {
        let dir = TempDir::new("round-trip");
        let path = dir.0.join("agent.json");
        let keys = AgentKeys::generate();
        keys.write(&path, false).unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&path), 0o600);
        let back = AgentKeys::load(&path).unwrap();
        assert_eq!(back.account(), keys.account());
        assert_eq!(back.mldsa_key_hash(), keys.mldsa_key_hash());

        let other = AgentKeys::generate();
        let err = other.write(&path, false).unwrap_err();
        assert!(matches!(err, Error::KeyFileExists { .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        assert_eq!(AgentKeys::load(&path).unwrap().account(), keys.account());

        other.write(&path, true).unwrap();
        assert_eq!(AgentKeys::load(&path).unwrap().account(), other.account());
        // No temporary files left beside it.
        let names: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn the_link_refuses_a_file_that_appeared_after_the_early_check() {
        let dir = TempDir::new("race");
        let path = dir.0.join("agent.json");
        std::fs::write(&path, "someone else's").unwrap();
        let err = write_private(&path, b"ours", false).unwrap_err();
        assert!(matches!(err, Error::KeyFileExists { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "someone else's");
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_others_can_read_is_refused_with_its_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new("perm");
        let path = dir.0.join("agent.json");
        AgentKeys::generate().write(&path, false).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = AgentKeys::load(&path).unwrap_err();
        assert!(matches!(err, Error::KeyFilePermissions { mode: 0o644, .. }));
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn a_file_whose_secret_does_not_give_its_account_is_refused() {
        let dir = TempDir::new("corrupt");
        let path = dir.0.join("agent.json");
        AgentKeys::generate().write(&path, false).unwrap();
        let mut value: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        value["account"] = serde_json::json!(Address::repeat_byte(1));
        write_private(&path, value.to_string().as_bytes(), true).unwrap();
        let err = AgentKeys::load(&path).unwrap_err();
        assert!(matches!(err, Error::KeyFileInvalid { .. }), "{err}");
        assert!(err.to_string().contains("not of the account"), "{err}");
    }

    #[test]
    fn signed_orders_verify_under_the_bound_key() {
        let keys = AgentKeys::from_secrets(&[7; 32], Identity::from_seed([9; 32])).unwrap();
        let domain = order::domain(31337, Address::repeat_byte(0x5e));
        let binding = keys.binding(&domain, 0).unwrap();
        let bound = binding.verify(&domain).unwrap();
        assert_eq!(bound.account, keys.account());
        let terms = order::TabTerms {
            buyer: keys.account(),
            amount_wei: 1_000,
            deadline_s: 2_000,
            nonce: 1,
        };
        let signed = keys.sign(terms, &domain).unwrap();
        let verified = signed
            .verify(&domain, 1_000, |_| Some(keys.identity().public()))
            .unwrap();
        assert_eq!(verified.account, keys.account());
    }
}
