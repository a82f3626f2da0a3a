//! FROST(secp256k1, SHA-256) keys and signatures in the form the contracts take.
//!
//! The ciphersuite is RFC 9591 §6.5 as implemented by the Zcash Foundation's `frost-secp256k1`
//! crate; `contracts/src/FrostVerifier.sol` verifies exactly these signatures. The contracts take
//! the group key as (x, y parity) and the signature's commitment R as affine (x, y), because their
//! ecrecover-based check needs R's full point (see the Solidity library's notes); this module
//! converts between the crate's SEC1-compressed encodings and that form.
//!
//! Keys in this module come from the crate's trusted dealer ([`DealerCommittee`]); the DKG
//! committee replaces it in production (the group secret is then never reconstructed).

use std::collections::BTreeMap;

use alloy::primitives::U256;
use frost_secp256k1 as frost;
use frost_secp256k1::rand_core::{CryptoRng, RngCore};
use k256::elliptic_curve::sec1::{FromEncodedPoint, ToEncodedPoint};

use crate::error::{Error, Result};

/// A group key as the contracts store it: the x-coordinate and the parity of y (0 even, 1 odd,
/// i.e. SEC1 prefix 0x02 / 0x03).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvmGroupKey {
    /// x-coordinate.
    pub x: U256,
    /// y parity (0 or 1).
    pub parity: u8,
}

impl EvmGroupKey {
    /// Converts a FROST verifying key (33-byte SEC1 compressed point).
    pub fn from_verifying_key(key: &frost::VerifyingKey) -> Result<Self> {
        let bytes = key.serialize()?;
        if bytes.len() != 33 || !(bytes[0] == 2 || bytes[0] == 3) {
            return Err(Error::KeyEncoding { len: bytes.len() });
        }
        Ok(Self {
            x: U256::from_be_slice(&bytes[1..]),
            parity: bytes[0] - 2,
        })
    }

    /// Parses a group key written as its 33-byte SEC1 compressed point in hex (`0x02…`/`0x03…`,
    /// what the committee's DKG publishes); a point not on the curve is refused.
    pub fn from_hex(text: &str) -> Result<Self> {
        let bytes = alloy::hex::decode(text.trim()).map_err(|_| Error::KeyEncoding { len: 0 })?;
        let key = frost::VerifyingKey::deserialize(&bytes)
            .map_err(|_| Error::KeyEncoding { len: bytes.len() })?;
        Self::from_verifying_key(&key)
    }

    /// The 33-byte SEC1 compressed point in hex, as [`EvmGroupKey::from_hex`] reads it.
    pub fn to_hex(&self) -> String {
        format!(
            "0x{:02x}{}",
            2 + self.parity,
            alloy::hex::encode(self.x.to_be_bytes::<32>())
        )
    }
}

/// A FROST signature as the contracts take it: R as affine (x, y), and z.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvmSignature {
    /// x-coordinate of the commitment R.
    pub r_x: U256,
    /// y-coordinate of R.
    pub r_y: U256,
    /// The response scalar z.
    pub z: U256,
}

impl EvmSignature {
    /// Converts a FROST signature (65 bytes: compressed R || z).
    pub fn from_frost(signature: &frost::Signature) -> Result<Self> {
        let bytes = signature.serialize()?;
        if bytes.len() != 65 {
            return Err(Error::SignatureLength { len: bytes.len() });
        }
        let encoded =
            k256::EncodedPoint::from_bytes(&bytes[..33]).map_err(|_| Error::InvalidCommitment {
                reason: "is not a SEC1 point",
            })?;
        let point =
            Option::<k256::AffinePoint>::from(k256::AffinePoint::from_encoded_point(&encoded))
                .ok_or(Error::InvalidCommitment {
                    reason: "is not on the curve",
                })?;
        let uncompressed = point.to_encoded_point(false);
        let (x, y) = match (uncompressed.x(), uncompressed.y()) {
            (Some(x), Some(y)) => (x, y),
            _ => {
                return Err(Error::InvalidCommitment {
                    reason: "is the identity",
                });
            }
        };
        Ok(Self {
            r_x: U256::from_be_slice(x),
            r_y: U256::from_be_slice(y),
            z: U256::from_be_slice(&bytes[33..]),
        })
    }
}

/// A t-of-n committee whose shares come from the crate's trusted dealer.
///
/// Signing runs both FROST rounds in-process with the first `min_signers` participants (or the
/// ones named); the result is a standard RFC 9591 signature under the group key.
pub struct DealerCommittee {
    key_packages: BTreeMap<frost::Identifier, frost::keys::KeyPackage>,
    public: frost::keys::PublicKeyPackage,
    min_signers: u16,
}

impl DealerCommittee {
    /// Deals shares of a fresh group key to `max_signers` participants, any `min_signers` of whom
    /// can sign.
    pub fn generate<R: RngCore + CryptoRng>(
        max_signers: u16,
        min_signers: u16,
        rng: &mut R,
    ) -> Result<Self> {
        let (shares, public) = frost::keys::generate_with_dealer(
            max_signers,
            min_signers,
            frost::keys::IdentifierList::Default,
            rng,
        )?;
        let mut key_packages = BTreeMap::new();
        for (id, share) in shares {
            key_packages.insert(id, frost::keys::KeyPackage::try_from(share)?);
        }
        Ok(Self {
            key_packages,
            public,
            min_signers,
        })
    }

    /// The group's verifying key.
    pub fn verifying_key(&self) -> &frost::VerifyingKey {
        self.public.verifying_key()
    }

    /// The group key in contract form.
    pub fn group_key(&self) -> Result<EvmGroupKey> {
        EvmGroupKey::from_verifying_key(self.verifying_key())
    }

    /// Signs `message` with the first `min_signers` participants.
    pub fn sign<R: RngCore + CryptoRng>(
        &self,
        message: &[u8],
        rng: &mut R,
    ) -> Result<frost::Signature> {
        let signers: Vec<_> = self
            .key_packages
            .keys()
            .take(self.min_signers as usize)
            .copied()
            .collect();
        self.sign_with(&signers, message, rng)
    }

    /// Signs `message` with exactly the participants `signers` (at least `min_signers`).
    pub fn sign_with<R: RngCore + CryptoRng>(
        &self,
        signers: &[frost::Identifier],
        message: &[u8],
        rng: &mut R,
    ) -> Result<frost::Signature> {
        let mut nonces = BTreeMap::new();
        let mut commitments = BTreeMap::new();
        for id in signers {
            let package = self
                .key_packages
                .get(id)
                .ok_or_else(|| Error::UnknownSigner {
                    identifier: hex::encode(id.serialize()),
                })?;
            let (n, c) = frost::round1::commit(package.signing_share(), rng);
            nonces.insert(*id, n);
            commitments.insert(*id, c);
        }
        let signing_package = frost::SigningPackage::new(commitments, message);
        let mut shares = BTreeMap::new();
        for id in signers {
            let share = frost::round2::sign(&signing_package, &nonces[id], &self.key_packages[id])?;
            shares.insert(*id, share);
        }
        Ok(frost::aggregate(&signing_package, &shares, &self.public)?)
    }

    /// Signs and converts to contract form.
    pub fn sign_evm<R: RngCore + CryptoRng>(
        &self,
        message: &[u8],
        rng: &mut R,
    ) -> Result<EvmSignature> {
        EvmSignature::from_frost(&self.sign(message, rng)?)
    }

    /// Participant identifiers, in order.
    pub fn identifiers(&self) -> Vec<frost::Identifier> {
        self.key_packages.keys().copied().collect()
    }
}
