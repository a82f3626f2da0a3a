//! ML-DSA-65 identities (FIPS 204).
//!
//! An identity is kept as its 32-byte key-generation seed: the key pair is a deterministic
//! function of it (FIPS 204 `ML-DSA.KeyGen_internal`), so a key file is 32 secret bytes, not
//! 4 KB. Its public name is the SHA-256 of the verification key.
//!
//! Every signature carries a *context* string (FIPS 204 §5.2) naming what is signed (a receipt,
//! a session transcript, an order), so a signature made for one purpose never verifies as another.

use crate::error::{Error, Result};
use libcrux_ml_dsa::ml_dsa_65::{self, MLDSA65KeyPair, MLDSA65Signature, MLDSA65VerificationKey};
use sha2::{Digest, Sha256};
use std::fmt;
use zeroize::Zeroizing;

/// Bytes of an ML-DSA-65 verification key.
pub const VERIFICATION_KEY_BYTES: usize = 1952;
/// Bytes of an ML-DSA-65 signature.
pub const SIGNATURE_BYTES: usize = 3309;

/// SHA-256 of a verification key: how parties name each other.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdentityId(pub [u8; 32]);

impl fmt::Display for IdentityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for IdentityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdentityId({self})")
    }
}

/// A signing identity. The secret never leaves it; `Debug` shows only the public id.
pub struct Identity {
    seed: Zeroizing<[u8; 32]>,
    keys: MLDSA65KeyPair,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.id())
    }
}

impl Identity {
    /// A fresh identity from the OS random source.
    pub fn generate() -> Self {
        Self::from_seed(super::random())
    }

    /// The identity a seed determines (what a key file stores).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let keys = ml_dsa_65::generate_key_pair(seed);
        Self {
            seed: Zeroizing::new(seed),
            keys,
        }
    }

    /// The seed, for writing a key file (0600) — the only way the secret leaves.
    pub fn seed(&self) -> &[u8; 32] {
        &self.seed
    }

    /// The public half.
    pub fn public(&self) -> PublicIdentity {
        PublicIdentity {
            key: MLDSA65VerificationKey::new(*self.keys.verification_key.as_ref()),
        }
    }

    /// Its public name.
    pub fn id(&self) -> IdentityId {
        self.public().id()
    }

    /// Signs `message` for the purpose named by `context` (≤ 255 bytes), hedged with fresh
    /// randomness as FIPS 204 recommends.
    pub fn sign(&self, context: &[u8], message: &[u8]) -> Result<[u8; SIGNATURE_BYTES]> {
        let signature = ml_dsa_65::sign(&self.keys.signing_key, message, context, super::random())
            .map_err(|e| Error::InvalidField {
                field: "context".to_owned(),
                reason: format!("ML-DSA signing refused: {e:?} (context must be ≤ 255 bytes)"),
            })?;
        Ok(*signature.as_ref())
    }
}

/// A verification key.
#[derive(Clone)]
pub struct PublicIdentity {
    key: MLDSA65VerificationKey,
}

impl fmt::Debug for PublicIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicIdentity({})", self.id())
    }
}

impl PartialEq for PublicIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.key.as_slice() == other.key.as_slice()
    }
}

impl Eq for PublicIdentity {}

impl PublicIdentity {
    /// From the encoded verification key.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let key: [u8; VERIFICATION_KEY_BYTES] =
            bytes.try_into().map_err(|_| Error::InvalidField {
                field: "verification_key".to_owned(),
                reason: format!(
                    "an ML-DSA-65 verification key is {VERIFICATION_KEY_BYTES} bytes, got {}",
                    bytes.len()
                ),
            })?;
        Ok(Self {
            key: MLDSA65VerificationKey::new(key),
        })
    }

    /// The encoded verification key.
    pub fn to_bytes(&self) -> [u8; VERIFICATION_KEY_BYTES] {
        *self.key.as_ref()
    }

    /// SHA-256 of the verification key.
    pub fn id(&self) -> IdentityId {
        IdentityId(Sha256::digest(self.key.as_slice()).into())
    }

    /// Checks a signature made with [`Identity::sign`] for the same context and message.
    pub fn verify(&self, context: &[u8], message: &[u8], signature: &[u8]) -> Result<()> {
        let bad = |reason: String| Error::InvalidField {
            field: "signature".to_owned(),
            reason,
        };
        let sig: [u8; SIGNATURE_BYTES] = signature.try_into().map_err(|_| {
            bad(format!(
                "an ML-DSA-65 signature is {SIGNATURE_BYTES} bytes, got {}",
                signature.len()
            ))
        })?;
        ml_dsa_65::verify(&self.key, message, context, &MLDSA65Signature::new(sig))
            .map_err(|e| bad(format!("does not verify under {}: {e:?}", self.id())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_key_context_and_message() {
        let alice = Identity::generate();
        let bob = Identity::generate();
        let sig = alice.sign(b"cx-receipt-v1", b"job 7").unwrap();
        let public = alice.public();
        public.verify(b"cx-receipt-v1", b"job 7", &sig).unwrap();
        assert!(public.verify(b"cx-receipt-v1", b"job 8", &sig).is_err());
        assert!(public.verify(b"cx-order-v1", b"job 7", &sig).is_err());
        assert!(
            bob.public()
                .verify(b"cx-receipt-v1", b"job 7", &sig)
                .is_err()
        );
        let mut tampered = sig;
        tampered[100] ^= 1;
        assert!(
            public
                .verify(b"cx-receipt-v1", b"job 7", &tampered)
                .is_err()
        );
        assert!(
            public
                .verify(b"cx-receipt-v1", b"job 7", &sig[..10])
                .is_err()
        );
    }

    #[test]
    fn seed_determines_the_identity_and_debug_hides_it() {
        let a = Identity::from_seed([7; 32]);
        let b = Identity::from_seed([7; 32]);
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), Identity::from_seed([8; 32]).id());
        let round = PublicIdentity::from_bytes(&a.public().to_bytes()).unwrap();
        assert_eq!(round, a.public());
        let shown = format!("{a:?}");
        assert!(!shown.contains(&hex::encode([7u8; 32])), "{shown}");
        assert!(PublicIdentity::from_bytes(&[0; 5]).is_err());
    }
}
