//! Authenticated sessions with post-quantum and classical key exchange.
//!
//! Three messages, initiator I to responder R, each side knowing the other's ML-DSA identity in
//! advance (pinned; nothing is trusted on first use):
//!
//! ```text
//! M1  I → R   "CXS1" ‖ id_I ‖ X25519 e_I ‖ ML-KEM-768 ek_I ‖ nonce_I
//! M2  R → I   id_R ‖ X25519 e_R ‖ ML-KEM ct = Encaps(ek_I) ‖ nonce_R ‖ Sig_R(H(M1 ‖ M2 body))
//! M3  I → R   Sig_I(H(M1 ‖ M2))
//! keys = HKDF-SHA-256(salt = H(M1 ‖ M2), ikm = ss_ML-KEM ‖ ss_X25519) → k_I→R ‖ k_R→I
//! ```
//!
//! Why hybrid: the session stays confidential as long as *either* ML-KEM-768 (FIPS 203) or
//! X25519 (RFC 7748) holds — the same construction as TLS's X25519MLKEM768 group. Both ephemeral
//! keys are fresh per session, so recorded traffic stays secret if an identity key later leaks.
//! Why sign the transcript: each side's ML-DSA signature covers every byte both sent, so a
//! man in the middle, a swapped key or a replayed message breaks a signature; signatures carry
//! distinct FIPS 204 contexts per role so one role's signature is useless in the other.
//! The channel is ChaCha20-Poly1305 (RFC 8439) with one key per direction and the 64-bit
//! sequence number as nonce: a replayed, reordered, dropped or altered frame fails to open.

use super::identity::{Identity, IdentityId, PublicIdentity, SIGNATURE_BYTES};
use crate::error::{Error, Result};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hkdf::Hkdf;
use libcrux_ml_kem::mlkem768::{self, MlKem768Ciphertext, MlKem768KeyPair, MlKem768PublicKey};
use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey as XPublic, StaticSecret as XSecret};
use zeroize::Zeroizing;

const MAGIC: &[u8; 4] = b"CXS1";
const KEM_PUBLIC_BYTES: usize = 1184;
const KEM_CIPHERTEXT_BYTES: usize = 1088;
/// Bytes of the first handshake message.
pub const M1_BYTES: usize = 4 + 32 + 32 + KEM_PUBLIC_BYTES + 32;
const M2_BODY_BYTES: usize = 32 + 32 + KEM_CIPHERTEXT_BYTES + 32;
/// Bytes of the second handshake message.
pub const M2_BYTES: usize = M2_BODY_BYTES + SIGNATURE_BYTES;
/// Bytes of the third handshake message.
pub const M3_BYTES: usize = SIGNATURE_BYTES;
const CONTEXT_RESPONDER: &[u8] = b"cx-session-v1/responder";
const CONTEXT_INITIATOR: &[u8] = b"cx-session-v1/initiator";

fn refuse<T>(reason: impl Into<String>) -> Result<T> {
    Err(Error::Session(reason.into()))
}

/// The initiator between sending M1 and receiving M2.
pub struct Initiator<'a> {
    identity: &'a Identity,
    peer: PublicIdentity,
    x_secret: XSecret,
    kem: MlKem768KeyPair,
    m1: Vec<u8>,
}

impl std::fmt::Debug for Initiator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Initiator(to {})", self.peer.id())
    }
}

impl<'a> Initiator<'a> {
    /// Starts a session with `peer` (its pinned public identity); returns M1 to send.
    pub fn start(identity: &'a Identity, peer: PublicIdentity) -> (Self, Vec<u8>) {
        let x_secret = XSecret::from(super::random::<32>());
        let kem = mlkem768::generate_key_pair(super::random::<64>());
        let mut m1 = Vec::with_capacity(M1_BYTES);
        m1.extend_from_slice(MAGIC);
        m1.extend_from_slice(&identity.id().0);
        m1.extend_from_slice(XPublic::from(&x_secret).as_bytes());
        m1.extend_from_slice(kem.public_key().as_slice());
        m1.extend_from_slice(&super::random::<32>());
        let state = Self {
            identity,
            peer,
            x_secret,
            kem,
            m1: m1.clone(),
        };
        (state, m1)
    }

    /// Checks M2 and returns the session and M3 to send.
    pub fn finish(self, m2: &[u8]) -> Result<(Session, Vec<u8>)> {
        if m2.len() != M2_BYTES {
            return refuse(format!("M2 must be {M2_BYTES} bytes, got {}", m2.len()));
        }
        let (body, signature) = m2.split_at(M2_BODY_BYTES);
        if body[..32] != self.peer.id().0 {
            return refuse(format!(
                "responder claims identity {}, expected {}",
                hex::encode(&body[..32]),
                self.peer.id()
            ));
        }
        let mut transcript = Sha256::new();
        transcript.update(&self.m1);
        transcript.update(body);
        let body_hash: [u8; 32] = transcript.clone().finalize().into();
        self.peer
            .verify(CONTEXT_RESPONDER, &body_hash, signature)
            .or_else(|_| refuse("responder's transcript signature does not verify"))?;
        transcript.update(signature);
        let transcript_hash: [u8; 32] = transcript.finalize().into();

        let x_peer: [u8; 32] = body[32..64].try_into().expect("length checked");
        let x_shared = self.x_secret.diffie_hellman(&XPublic::from(x_peer));
        if !x_shared.was_contributory() {
            return refuse("responder's X25519 key is a low-order point");
        }
        let ct: [u8; KEM_CIPHERTEXT_BYTES] = body[64..64 + KEM_CIPHERTEXT_BYTES]
            .try_into()
            .expect("length checked");
        let kem_shared =
            mlkem768::decapsulate(self.kem.private_key(), &MlKem768Ciphertext::from(ct));
        let m3 = self
            .identity
            .sign(CONTEXT_INITIATOR, &transcript_hash)?
            .to_vec();
        let session = Session::derive(
            &kem_shared,
            x_shared.as_bytes(),
            &transcript_hash,
            Role::Initiator,
            self.peer.id(),
        );
        Ok((session, m3))
    }
}

/// The responder between sending M2 and receiving M3.
pub struct Responder {
    peer: PublicIdentity,
    transcript_hash: [u8; 32],
    keys: Zeroizing<[u8; 64]>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Responder(from {})", self.peer.id())
    }
}

impl Responder {
    /// Answers M1 from a peer found in `directory` (by the id M1 names); returns M2 to send.
    pub fn respond(
        identity: &Identity,
        directory: impl Fn(&IdentityId) -> Option<PublicIdentity>,
        m1: &[u8],
    ) -> Result<(Self, Vec<u8>)> {
        if m1.len() != M1_BYTES || &m1[..4] != MAGIC {
            return refuse(format!("M1 must be {M1_BYTES} bytes starting with CXS1"));
        }
        let peer_id = IdentityId(m1[4..36].try_into().expect("length checked"));
        let Some(peer) = directory(&peer_id) else {
            return refuse(format!("initiator {peer_id} is not a known identity"));
        };
        let x_peer: [u8; 32] = m1[36..68].try_into().expect("length checked");
        let ek: [u8; KEM_PUBLIC_BYTES] = m1[68..68 + KEM_PUBLIC_BYTES]
            .try_into()
            .expect("length checked");
        let ek = MlKem768PublicKey::from(ek);
        // FIPS 203 §7.2 input check: a malformed encapsulation key is refused, not used.
        if !mlkem768::validate_public_key(&ek) {
            return refuse("initiator's ML-KEM-768 key fails the FIPS 203 modulus check");
        }
        let (ct, kem_shared) = mlkem768::encapsulate(&ek, super::random::<32>());
        let x_secret = XSecret::from(super::random::<32>());
        let x_shared = x_secret.diffie_hellman(&XPublic::from(x_peer));
        if !x_shared.was_contributory() {
            return refuse("initiator's X25519 key is a low-order point");
        }
        let mut body = Vec::with_capacity(M2_BYTES);
        body.extend_from_slice(&identity.id().0);
        body.extend_from_slice(XPublic::from(&x_secret).as_bytes());
        body.extend_from_slice(ct.as_slice());
        body.extend_from_slice(&super::random::<32>());
        let mut transcript = Sha256::new();
        transcript.update(m1);
        transcript.update(&body);
        let body_hash: [u8; 32] = transcript.clone().finalize().into();
        let signature = identity.sign(CONTEXT_RESPONDER, &body_hash)?;
        transcript.update(signature);
        let transcript_hash: [u8; 32] = transcript.finalize().into();
        body.extend_from_slice(&signature);
        let keys = expand(&kem_shared, x_shared.as_bytes(), &transcript_hash);
        Ok((
            Self {
                peer,
                transcript_hash,
                keys,
            },
            body,
        ))
    }

    /// Checks M3 (the initiator's transcript signature) and opens the session.
    pub fn finish(self, m3: &[u8]) -> Result<Session> {
        self.peer
            .verify(CONTEXT_INITIATOR, &self.transcript_hash, m3)
            .or_else(|_| refuse("initiator's transcript signature does not verify"))?;
        Ok(Session::from_keys(
            &self.keys,
            Role::Responder,
            self.peer.id(),
        ))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Initiator,
    Responder,
}

fn expand(kem_shared: &[u8], x_shared: &[u8], transcript_hash: &[u8; 32]) -> Zeroizing<[u8; 64]> {
    let mut ikm = Zeroizing::new([0u8; 64]);
    ikm[..32].copy_from_slice(kem_shared);
    ikm[32..].copy_from_slice(x_shared);
    let mut okm = Zeroizing::new([0u8; 64]);
    Hkdf::<Sha256>::new(Some(transcript_hash), &ikm[..])
        .expand(b"cx-session-v1 traffic keys", &mut okm[..])
        .expect("64 bytes is a valid HKDF-SHA-256 output length");
    okm
}

/// An open session: one AEAD key and sequence number per direction.
pub struct Session {
    peer: IdentityId,
    send: ChaCha20Poly1305,
    recv: ChaCha20Poly1305,
    send_seq: u64,
    recv_seq: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Session(peer {}, sent {}, received {})",
            self.peer, self.send_seq, self.recv_seq
        )
    }
}

impl Session {
    fn derive(kem: &[u8], x: &[u8], transcript: &[u8; 32], role: Role, peer: IdentityId) -> Self {
        Self::from_keys(&expand(kem, x, transcript), role, peer)
    }

    fn from_keys(keys: &[u8; 64], role: Role, peer: IdentityId) -> Self {
        let (i_to_r, r_to_i) = keys.split_at(32);
        let (send, recv) = match role {
            Role::Initiator => (i_to_r, r_to_i),
            Role::Responder => (r_to_i, i_to_r),
        };
        Self {
            peer,
            send: ChaCha20Poly1305::new(Key::from_slice(send)),
            recv: ChaCha20Poly1305::new(Key::from_slice(recv)),
            send_seq: 0,
            recv_seq: 0,
        }
    }

    /// The authenticated peer.
    pub fn peer(&self) -> IdentityId {
        self.peer
    }

    fn nonce(seq: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&seq.to_be_bytes());
        *Nonce::from_slice(&n)
    }

    /// Encrypts one frame: `seq (8 bytes, big-endian) ‖ ciphertext ‖ tag`.
    pub fn seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>> {
        let seq = self.send_seq;
        let header = seq.to_be_bytes();
        let body = self
            .send
            .encrypt(
                &Self::nonce(seq),
                Payload {
                    msg: plaintext,
                    aad: &header,
                },
            )
            .or_else(|_| refuse("frame too large to seal"))?;
        self.send_seq = seq.checked_add(1).ok_or_else(|| {
            Error::Session("sequence numbers exhausted: open a new session".into())
        })?;
        let mut frame = header.to_vec();
        frame.extend_from_slice(&body);
        Ok(frame)
    }

    /// Decrypts the next frame. A replayed, reordered or altered frame is refused and the
    /// session's state does not move.
    pub fn open(&mut self, frame: &[u8]) -> Result<Vec<u8>> {
        if frame.len() < 8 + 16 {
            return refuse("frame shorter than its header and tag");
        }
        let (header, body) = frame.split_at(8);
        let seq = u64::from_be_bytes(header.try_into().expect("8 bytes"));
        if seq != self.recv_seq {
            return refuse(format!(
                "frame {seq} out of order: expected {} (replayed, reordered or dropped)",
                self.recv_seq
            ));
        }
        let plaintext = self
            .recv
            .decrypt(
                &Self::nonce(seq),
                Payload {
                    msg: body,
                    aad: header,
                },
            )
            .or_else(|_| {
                refuse(format!(
                    "frame {seq} fails authentication (altered or wrong key)"
                ))
            })?;
        self.recv_seq += 1;
        Ok(plaintext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake(i: &Identity, r: &Identity) -> Result<(Session, Session)> {
        let r_public = r.public();
        let i_public = i.public();
        let (initiator, m1) = Initiator::start(i, r_public);
        let directory = |id: &IdentityId| (*id == i_public.id()).then(|| i_public.clone());
        let (responder, m2) = Responder::respond(r, directory, &m1)?;
        let (a, m3) = initiator.finish(&m2)?;
        let b = responder.finish(&m3)?;
        Ok((a, b))
    }

    #[test]
    fn both_sides_agree_and_frames_flow_both_ways() {
        let (i, r) = (Identity::generate(), Identity::generate());
        let (mut a, mut b) = handshake(&i, &r).unwrap();
        assert_eq!(a.peer(), r.id());
        assert_eq!(b.peer(), i.id());
        for n in 0..3u8 {
            let f = a.seal(&[n; 40]).unwrap();
            assert_eq!(b.open(&f).unwrap(), vec![n; 40]);
            let g = b.seal(b"ack").unwrap();
            assert_eq!(a.open(&g).unwrap(), b"ack");
        }
    }

    #[test]
    fn replayed_reordered_and_altered_frames_are_refused() {
        let (i, r) = (Identity::generate(), Identity::generate());
        let (mut a, mut b) = handshake(&i, &r).unwrap();
        let f0 = a.seal(b"zero").unwrap();
        let f1 = a.seal(b"one").unwrap();
        let err = b.open(&f1).unwrap_err();
        assert!(err.to_string().contains("out of order"), "{err}");
        b.open(&f0).unwrap();
        assert!(
            b.open(&f0)
                .unwrap_err()
                .to_string()
                .contains("out of order")
        );
        let mut altered = f1.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert!(
            b.open(&altered)
                .unwrap_err()
                .to_string()
                .contains("authentication")
        );
        // The refusals moved nothing: the genuine frame still opens.
        assert_eq!(b.open(&f1).unwrap(), b"one");
        // A frame sealed in one direction does not open as the other direction's.
        let mine = a.seal(b"x").unwrap();
        assert!(a.open(&mine).is_err());
    }

    #[test]
    fn a_wrong_identity_is_refused() {
        let (i, r, mallory) = (
            Identity::generate(),
            Identity::generate(),
            Identity::generate(),
        );
        // The initiator expects r, but mallory answers.
        let i_public = i.public();
        let (initiator, m1) = Initiator::start(&i, r.public());
        let directory = |id: &IdentityId| (*id == i_public.id()).then(|| i_public.clone());
        let (_, m2) = Responder::respond(&mallory, directory, &m1).unwrap();
        let err = initiator.finish(&m2).unwrap_err();
        assert!(err.to_string().contains("expected"), "{err}");
        // An unknown initiator is refused by the responder.
        let (_, m1) = Initiator::start(&mallory, r.public());
        let err = Responder::respond(&r, |_| None, &m1).unwrap_err();
        assert!(err.to_string().contains("not a known identity"), "{err}");
        // mallory claims to be i but cannot sign as i: the responder refuses M3.
        let (impostor, mut m1) = Initiator::start(&mallory, r.public());
        m1[4..36].copy_from_slice(&i.id().0);
        let directory = |id: &IdentityId| (*id == i_public.id()).then(|| i_public.clone());
        let (responder, m2) = Responder::respond(&r, directory, &m1).unwrap();
        // The responder signed the altered M1, so the impostor cannot even check M2…
        assert!(impostor.finish(&m2).is_err());
        // …and whatever mallory signs, the responder checks it under i's key.
        let forged = mallory.sign(CONTEXT_INITIATOR, &[0; 32]).unwrap();
        assert!(responder.finish(&forged).is_err());
    }

    #[test]
    fn altered_handshake_messages_are_refused() {
        let (i, r) = (Identity::generate(), Identity::generate());
        let i_public = i.public();
        let directory = |id: &IdentityId| (*id == i_public.id()).then(|| i_public.clone());
        let (initiator, m1) = Initiator::start(&i, r.public());
        let (_, mut m2) = Responder::respond(&r, directory, &m1).unwrap();
        m2[100] ^= 1; // inside the KEM ciphertext
        assert!(initiator.finish(&m2).is_err());
        assert!(Responder::respond(&r, directory, &m1[..10]).is_err());
    }
}
