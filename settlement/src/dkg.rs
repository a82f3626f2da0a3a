//! Distributed key generation among the signers, over their post-quantum sessions.
//!
//! The protocol is the FROST DKG of RFC 9591's companion (Komlo–Goldberg, a Pedersen DKG with
//! proofs of knowledge) as `frost_secp256k1::keys::dkg` implements it: part 1 makes a secret
//! polynomial and a round-1 package (commitments + proof of knowledge) that every participant
//! must receive *identically*; part 2 makes one round-2 package (a secret share) per recipient;
//! part 3 checks every share against its sender's commitments and yields this participant's key
//! package and the group's public key package. No one ever holds the group secret.
//!
//! What the network adds:
//! - every message travels on an ML-KEM-768 + X25519 session authenticated by both ends' pinned
//!   ML-DSA keys ([`crate::transport`]), so round-2 shares are encrypted to their one recipient
//!   and a message's sender is the session's authenticated peer, not a claim in the message;
//! - the DKG needs round 1 to be a *broadcast*. Point-to-point sessions are not one, so after
//!   round 1 each participant sends every other one the SHA-256 of all round-1 packages it
//!   received (an echo round); any difference aborts before a share is sent, so a participant
//!   that showed different commitments to different peers cannot split the committee.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy::primitives::B256;
use cx_protocol::pq::Identity;
use frost_secp256k1 as frost;
use frost_secp256k1::keys::dkg;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::config::Member;
use crate::error::{Error, Result};
use crate::keyfile::StoredKey;
use crate::transport::{Channel, Limits};
use crate::wire::{DkgRequest, PeerBody, PeerMessage, Request, Response};

/// DKG messages received from peers: (sender index, body).
pub type Inbox = mpsc::UnboundedReceiver<(u16, PeerBody)>;

fn fail(reason: impl Into<String>) -> Error {
    Error::Dkg(reason.into())
}

/// A FROST identifier from a signer index.
pub fn identifier(index: u16) -> Result<frost::Identifier> {
    Ok(frost::Identifier::try_from(index)?)
}

/// A CSPRNG seeded from the operating system (ChaCha20, RFC 8439 core).
pub fn os_rng() -> rand_chacha::ChaCha20Rng {
    use rand_chacha::rand_core::SeedableRng;
    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    getrandom::fill(&mut seed[..]).expect("the operating system's random source is available");
    rand_chacha::ChaCha20Rng::from_seed(*seed)
}

/// 32 bytes from the operating system's random source (round ids).
pub fn random_bytes() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    bytes
}

#[derive(Default)]
struct Gathered {
    round1: BTreeMap<frost::Identifier, dkg::round1::Package>,
    echoes: BTreeMap<u16, B256>,
    round2: BTreeMap<frost::Identifier, dkg::round2::Package>,
}

impl Gathered {
    fn add(&mut self, from: u16, body: PeerBody) -> Result<()> {
        let id = identifier(from)?;
        let conflict = || {
            fail(format!(
                "signer {from} sent two different messages of one round"
            ))
        };
        match body {
            PeerBody::Round1(p) => {
                if self.round1.get(&id).is_some_and(|q| *q != p) {
                    return Err(conflict());
                }
                self.round1.insert(id, p);
            }
            PeerBody::Echo(h) => {
                if self.echoes.get(&from).is_some_and(|g| *g != h) {
                    return Err(conflict());
                }
                self.echoes.insert(from, h);
            }
            PeerBody::Round2(p) => {
                if self.round2.get(&id).is_some_and(|q| *q != p) {
                    return Err(conflict());
                }
                self.round2.insert(id, p);
            }
        }
        Ok(())
    }
}

async fn gather(
    inbox: &mut Inbox,
    gathered: &mut Gathered,
    done: impl Fn(&Gathered) -> bool,
    deadline: Instant,
    what: &str,
) -> Result<()> {
    while !done(gathered) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, inbox.recv()).await {
            Ok(Some((from, body))) => gathered.add(from, body)?,
            Ok(None) => return Err(fail("inbox closed")),
            Err(_) => return Err(fail(format!("timed out waiting for {what}"))),
        }
    }
    Ok(())
}

fn echo_hash(all: &BTreeMap<frost::Identifier, dkg::round1::Package>) -> Result<B256> {
    let mut h = Sha256::new();
    for (id, package) in all {
        h.update(id.serialize());
        let bytes = package.serialize()?;
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    }
    Ok(B256::from(<[u8; 32]>::from(h.finalize())))
}

async fn send(channel: &mut Channel, message: PeerMessage) -> Result<()> {
    match channel.call(&Request::Peer(message)).await? {
        Response::Ack => Ok(()),
        Response::Refused { reason } => Err(fail(format!("peer refused a DKG message: {reason}"))),
        other => Err(fail(format!(
            "unexpected answer to a DKG message: {other:?}"
        ))),
    }
}

/// Runs this signer's side of the DKG `request` with the other members, reading their messages
/// from `inbox`. Returns the key to store.
pub async fn run(
    identity: Arc<Identity>,
    me: u16,
    committee: &[Member],
    request: &DkgRequest,
    mut inbox: Inbox,
    limits: Limits,
    timeout: Duration,
) -> Result<StoredKey> {
    let deadline = Instant::now() + timeout;
    let n = request.participants.len() as u16;
    if !request.participants.contains(&me) {
        return Err(fail(format!("this signer ({me}) is not a participant")));
    }
    let mut peers = Vec::new();
    for index in &request.participants {
        if *index == me {
            continue;
        }
        let member = committee
            .iter()
            .find(|m| m.index == *index)
            .ok_or_else(|| {
                fail(format!(
                    "participant {index} is not in this signer's committee"
                ))
            })?;
        peers.push(member.clone());
    }
    let mut rng = os_rng();
    let (secret1, package1) = dkg::part1(identifier(me)?, n, request.min_signers, &mut rng)?;

    // Sessions to every peer, initiated by us (we send on ours; we receive on theirs).
    let mut channels = Vec::new();
    for peer in &peers {
        let channel =
            Channel::connect(peer.address.as_str(), &identity, peer.public()?, limits).await?;
        channels.push((peer.index, channel));
    }
    let message = |body| PeerMessage {
        epoch: request.epoch,
        from: me,
        body,
    };
    for (_, channel) in &mut channels {
        send(channel, message(PeerBody::Round1(package1.clone()))).await?;
    }
    let mut gathered = Gathered::default();
    let others = peers.len();
    gather(
        &mut inbox,
        &mut gathered,
        |g| g.round1.len() == others,
        deadline,
        "round-1 packages",
    )
    .await?;

    let mut all = gathered.round1.clone();
    all.insert(identifier(me)?, package1);
    let mine = echo_hash(&all)?;
    for (_, channel) in &mut channels {
        send(channel, message(PeerBody::Echo(mine))).await?;
    }
    gather(
        &mut inbox,
        &mut gathered,
        |g| g.echoes.len() == others,
        deadline,
        "round-1 echoes",
    )
    .await?;
    if let Some((from, _)) = gathered.echoes.iter().find(|(_, h)| **h != mine) {
        return Err(fail(format!(
            "signer {from} saw different round-1 packages than this signer: the broadcast was \
             not one, aborting before any share is sent"
        )));
    }

    let round1 = gathered.round1.clone();
    let (secret2, outgoing) = dkg::part2(secret1, &round1)?;
    for (index, channel) in &mut channels {
        let package = outgoing
            .get(&identifier(*index)?)
            .ok_or_else(|| fail(format!("no round-2 package for {index}")))?;
        send(channel, message(PeerBody::Round2(package.clone()))).await?;
    }
    gather(
        &mut inbox,
        &mut gathered,
        |g| g.round2.len() == others,
        deadline,
        "round-2 packages",
    )
    .await?;
    let (key_package, public_key_package) = dkg::part3(&secret2, &round1, &gathered.round2)?;
    Ok(StoredKey {
        epoch: request.epoch,
        key_package,
        public_key_package,
    })
}
