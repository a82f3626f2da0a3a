//! Post-quantum identities and sessions, shared by every party that talks to another.
//!
//! - [`identity`]: ML-DSA-65 (FIPS 204) signing identities. Providers sign receipts with them,
//!   agents co-sign orders, signers authenticate sessions.
//! - [`session`]: an authenticated key exchange, hybrid ML-KEM-768 (FIPS 203) + X25519, keys
//!   derived by HKDF-SHA-256 over the whole transcript, both sides authenticated by ML-DSA
//!   signatures on the transcript, then a ChaCha20-Poly1305 channel with sequence numbers.
//!
//! Implementations: libcrux (`libcrux-ml-dsa`, `libcrux-ml-kem`), whose portable and AVX2 code is
//! formally verified (hax/F*) and maintained by Cryspen — not the deprecated
//! `pqcrypto-dilithium`/`pqcrypto-kyber` PQClean wrappers (RUSTSEC advisories). X25519, HKDF and
//! the AEAD are RustCrypto's. The state machines here do no I/O: callers move the bytes.

pub mod identity;
pub mod session;

pub use identity::{Identity, IdentityId, PublicIdentity};
pub use session::{Initiator, Responder, Session};

/// Fills a fresh array from the operating system's CSPRNG.
pub(crate) fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // The OS generator failing is not a condition a party can recover from or should ignore.
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    bytes
}
