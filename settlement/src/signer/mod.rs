//! The signer: holds one share of the committee's FROST key, answers the coordinator's
//! commitment and signing requests, and signs a batch only after recomputing it on its own.
//!
//! Before a share leaves, the signer checks, against sources it reads itself (every chain read of
//! one check at one block, number and hash: [`ChainView::pinned`]):
//! - the chain is in its registry and the batch names that chain's `Settlement` contract;
//! - the nonce is the contract's last batch nonce + 1, and the contract's group key is the key of
//!   this round;
//! - every receipt carries a valid ML-DSA-65 signature under a key whose hash the provider
//!   registered on that chain's `ProviderRegistry`;
//! - every receipt comes with its voucher ([`cx_protocol::voucher`]; its signatures checked when
//!   the coordinator handed it over, [`crate::checked`], or here): the exchange's signed
//!   assignment under the exchange key pinned in its config (job, tab, buyer, provider key,
//!   input and adapter as the receipt says; the amount owed within the assigned price) and the
//!   buyer's EIP-712 signed order under this chain's domain (the intent the job is, within its
//!   limit; or the session grant the call was made under, whose jobs together stay within its
//!   cap) — a registered key cannot take an escrow it was never assigned;
//! - every escrow (a tab paying many jobs) is open on chain, with the receipts' buyer and at
//!   least what they are owed together; credits use the fee pinned in its config;
//! - the previous balances — its own copy when the request names only their root
//!   (its balance book, `balances.json`, kept per deployment) — hash to the contract's current balances root,
//!   and the proposed new
//!   balances and both roots equal [`ledger::assemble`]'s result on those checked inputs;
//! - every escrow is at least [`SIGN_RECLAIM_MARGIN_S`] from its reclaim time on the chain's
//!   clock (a reclaim between signing and mining would revert the batch forever);
//! - no job or escrow was already settled by a batch this signer signed under another nonce (its
//!   own append-only record, not the exchange's tables), and it never signs two different batches
//!   at one nonce unless each earlier one can never land: an escrow it names was reclaimed
//!   (`JobReclaimed` on chain). Then the replacement is signed at that nonce, and what only the
//!   dead digest named is free again;
//! - the FROST message is the digest of the recomputed batch;
//! - the signing set meets the committee rule pinned in its own config (t signers, k operators).
//!
//! The committee itself (members, t, the diversity rule) is the signer's configuration, not the
//! coordinator's request: a DKG whose participants or threshold differ is refused, and so is a
//! rotation to a key made by any other committee ([`crate::config::CommitteeRule`]).
//!
//! Otherwise it answers [`Response::Refused`] with the reasons. The own record errs on the side
//! of safety: a job in a batch this signer signed at nonce n is refused in any batch at another
//! nonce, even if batch n never landed (the chain's open-escrow check alone would allow it); the
//! other signers of the committee keep such a job settleable. FROST nonces (RFC 9591 §5.1) live
//! only in memory, keyed by the round that asked for them, and are removed when a sign request
//! names that round, whatever the outcome: a nonce is used at most once, and a restart forgets
//! every outstanding one rather than risk reusing it.
//!
//! Why this file is long (~1,000 lines): the checks above are one ordered procedure over one
//! signer's state (its share, its pending FROST nonces, its record), and each request's handler is
//! a few of those steps in order; the parts that stand alone live beside it (`record`: what it
//! signed; `balances`: its own copy of the balances). Splitting the handlers from the state they
//! guard would make a reader jump between files to follow one request.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alloy::primitives::{Address, B256};
use cx_protocol::order::Eip712Domain;
use cx_protocol::pq::{Identity, IdentityId};
use cx_protocol::voucher::Voucher;
use frost_secp256k1 as frost;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::batch::rotation_digest;
use crate::checked::{self, CheckedVouchers, UNKNOWN_VOUCHERS};
use crate::config::SignerConfig;
use crate::dkg::{self, Inbox};
use crate::error::{Error, Result};
use crate::frost::EvmGroupKey;
use crate::keyfile::{self, StoredKey};
use crate::ledger::{self, ChainBatch};
use crate::onchain::ChainView;
use crate::transport::{Channel, Directory, Limits};
mod balances;
mod record;

use balances::BalanceBook;
pub use balances::UNKNOWN_BALANCES;
use record::SignedLog;

use crate::wire::{
    Committed, DkgDone, PeerMessage, Request, Response, Share, SignBatchRequest,
    SignRotationRequest, SignerInfo,
};

/// How close to its reclaim time (`deadline + gracePeriod_s`, on the chain's clock) an escrow may
/// be for this signer to sign a batch naming it. Inside it, the buyer could reclaim before the
/// batch is mined, and the batch would revert forever. Smaller than the coordinator's
/// [`crate::coordinator::BUILD_RECLAIM_MARGIN_S`], so a batch built at the edge is still signed.
pub const SIGN_RECLAIM_MARGIN_S: u64 = 300;

/// Outstanding rounds a signer keeps at most (a coordinator that commits and never signs cannot
/// grow its memory without bound; the oldest is forgotten first).
const MAX_PENDING_ROUNDS: usize = 1024;
/// How long a session may wait for its next request.
const SESSION_IDLE: Duration = Duration::from_secs(120);
/// How long a DKG may take before it is abandoned.
const DKG_TIMEOUT: Duration = Duration::from_secs(60);

struct Pending {
    nonces: frost::round1::SigningNonces,
    commitments: frost::round1::SigningCommitments,
    epoch: u32,
    opened: std::time::Instant,
}

/// The inbox of one DKG epoch: its sending half, the receiving half until the DKG takes it, and
/// how many messages each peer sent to it.
struct InboxSlot {
    sender: mpsc::UnboundedSender<(u16, crate::wire::PeerBody)>,
    inbox: Option<Inbox>,
    sent: HashMap<u16, u32>,
}

/// Whether a DKG (or a peer message of one) for `epoch` is admissible when this signer holds
/// keys of `held` epochs: after the newest, at most `gap` ahead (from 0 with no key). Without
/// the upper bound a DKG at `u32::MAX` would end all future ones, and peer messages could open
/// an inbox per epoch without limit.
fn epoch_admissible(held: &[u32], epoch: u32, gap: u32) -> std::result::Result<(), String> {
    let (low, high) = match held.iter().max() {
        Some(&newest) => (newest.checked_add(1), newest.saturating_add(gap)),
        None => (Some(0), gap.saturating_sub(1)),
    };
    match low {
        Some(low) if (low..=high).contains(&epoch) => Ok(()),
        Some(low) => Err(format!(
            "key epoch {epoch} is outside the admissible {low}..={high} (the newest key's epoch \
             + 1, at most {gap} ahead)"
        )),
        None => Err("no key epoch follows the newest one".into()),
    }
}

/// One authenticated session of a peer, counted while it lives.
struct SessionSlot {
    signer: Arc<Signer>,
    peer: IdentityId,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut sessions = lock(&self.signer.sessions);
        if let Some(count) = sessions.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                sessions.remove(&self.peer);
            }
        }
    }
}

/// A running signer.
pub struct Signer {
    config: SignerConfig,
    identity: Arc<Identity>,
    directory: Directory,
    coordinator: IdentityId,
    members: HashMap<IdentityId, u16>,
    keys: Mutex<Vec<StoredKey>>,
    pending: Mutex<HashMap<B256, Pending>>,
    inboxes: Mutex<HashMap<u32, InboxSlot>>,
    /// Connections open now (a permit each, authenticated or not).
    connections: Arc<tokio::sync::Semaphore>,
    /// Handshakes started in the current one-second window: (window start, count).
    handshakes: Mutex<(std::time::Instant, u32)>,
    /// Sessions open per authenticated peer.
    sessions: Mutex<HashMap<IdentityId, usize>>,
    log: Mutex<SignedLog>,
    balances: Mutex<BalanceBook>,
    chains: Mutex<HashMap<u64, ChainView>>,
    /// Vouchers whose signatures passed, checked as they arrived ([`crate::checked`]).
    checked: Arc<Mutex<CheckedVouchers>>,
    limits: Limits,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({}, {})", self.config.index, self.identity.id())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn refused(reason: impl Into<String>) -> Response {
    Response::Refused {
        reason: reason.into(),
    }
}

impl Signer {
    /// Loads identity, key packages and the signer's own record from `config`'s files.
    pub fn new(config: SignerConfig) -> Result<Self> {
        let identity = Arc::new(keyfile::load_or_create_identity(&config.identity_file)?);
        std::fs::create_dir_all(&config.data_dir).map_err(Error::io(&config.data_dir))?;
        // Key packages live here: owner-only, like the files in it.
        std::fs::set_permissions(
            &config.data_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(Error::io(&config.data_dir))?;
        let coordinator = cx_protocol::pq::PublicIdentity::from_bytes(&config.coordinator_key)?;
        let mut directory: Directory = HashMap::new();
        directory.insert(coordinator.id(), coordinator.clone());
        let mut members = HashMap::new();
        for m in &config.committee {
            let public = m.public()?;
            members.insert(public.id(), m.index);
            directory.insert(public.id(), public);
        }
        if members.get(&identity.id()) != Some(&config.index) {
            return Err(Error::KeyMismatch {
                index: config.index,
                key: identity.id().to_string(),
            });
        }
        let keys = keyfile::read_keys(&config.data_dir)?;
        let log = SignedLog::open(config.data_dir.join("signed.jsonl"))?;
        let balances = BalanceBook::open(config.data_dir.join("balances.json"))?;
        Ok(Self {
            identity,
            directory,
            coordinator: coordinator.id(),
            members,
            keys: Mutex::new(keys),
            pending: Mutex::new(HashMap::new()),
            inboxes: Mutex::new(HashMap::new()),
            connections: Arc::new(tokio::sync::Semaphore::new(config.limits.max_connections)),
            handshakes: Mutex::new((std::time::Instant::now(), 0)),
            sessions: Mutex::new(HashMap::new()),
            log: Mutex::new(log),
            balances: Mutex::new(balances),
            chains: Mutex::new(HashMap::new()),
            checked: Arc::new(Mutex::new(CheckedVouchers::new(
                checked::SIGNER_CAPACITY,
                checked::SIGNER_HELD,
            ))),
            limits: Limits::default(),
            config,
        })
    }

    /// This signer's public identity id.
    pub fn id(&self) -> IdentityId {
        self.identity.id()
    }

    /// Accepts sessions on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<()> {
        loop {
            let (stream, _) = listener.accept().await.map_err(|source| Error::Socket {
                address: listener
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                source,
            })?;
            // Admission before any cryptography: a connection over the limit, or a handshake
            // over this second's budget, is closed at once (dropping the stream).
            let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                continue;
            };
            if !self.handshake_admitted() {
                continue;
            }
            let me = self.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match Channel::accept(stream, &me.identity, &me.directory, me.limits).await {
                    Ok(channel) => {
                        let peer = channel.peer();
                        match me.clone().session_slot(peer) {
                            Some(_slot) => me.session(channel).await,
                            None => tracing::warn!(
                                "signer {}: {peer} already holds {} sessions; closing a new one",
                                me.config.index,
                                me.config.limits.max_sessions_per_peer
                            ),
                        }
                    }
                    // A connection that closes or stalls before a handshake (a port probe) is
                    // not worth a line; a refused handshake is.
                    Err(Error::Transport(_)) => {}
                    // Log who/what was refused, never key material.
                    Err(e) => tracing::warn!("signer {}: session refused: {e}", me.config.index),
                }
            });
        }
    }

    /// Counts a handshake against the current one-second window; false when over budget.
    fn handshake_admitted(&self) -> bool {
        let mut window = lock(&self.handshakes);
        let now = std::time::Instant::now();
        if now.duration_since(window.0) >= Duration::from_secs(1) {
            *window = (now, 0);
        }
        if window.1 >= self.config.limits.max_handshakes_per_s {
            return false;
        }
        window.1 += 1;
        true
    }

    /// A session slot for `peer`, or `None` when it holds its share already.
    fn session_slot(self: Arc<Self>, peer: IdentityId) -> Option<SessionSlot> {
        {
            let mut sessions = lock(&self.sessions);
            let count = sessions.entry(peer).or_default();
            if *count >= self.config.limits.max_sessions_per_peer {
                return None;
            }
            *count += 1;
        }
        Some(SessionSlot { signer: self, peer })
    }

    async fn session(self: Arc<Self>, mut channel: Channel) {
        let peer = channel.peer();
        // Between requests a session may idle (a DKG peer waits for the slowest member); a
        // session idle for longer is closed and the other side opens a new one.
        channel.set_io_timeout(SESSION_IDLE);
        loop {
            let request: Request = match channel.recv().await {
                Ok(r) => r,
                Err(Error::Transport(_)) => return,
                Err(e) => {
                    tracing::warn!(
                        "signer {}: closing session with {peer}: {e}",
                        self.config.index
                    );
                    return;
                }
            };
            let response = self.clone().handle(peer, request).await;
            if channel.send(&response).await.is_err() {
                return;
            }
        }
    }

    async fn handle(self: Arc<Self>, peer: IdentityId, request: Request) -> Response {
        let from_coordinator = peer == self.coordinator;
        match request {
            Request::Ping => Response::Pong,
            Request::Peer(message) => match self.members.get(&peer) {
                Some(&index) if index == message.from => self.peer_message(message),
                _ => refused("a DKG message must come from the member it names"),
            },
            _ if !from_coordinator => refused("only the coordinator may ask this"),
            Request::Info => {
                let me = self.config.me().cloned();
                match me {
                    Ok(me) => Response::Info(SignerInfo {
                        index: me.index,
                        operator: me.operator,
                        region: me.region,
                        epochs: lock(&self.keys).iter().map(|k| k.epoch).collect(),
                    }),
                    Err(e) => refused(e.to_string()),
                }
            }
            Request::Dkg(request) => match self.dkg(request).await {
                Ok(done) => Response::DkgDone(done),
                Err(e) => refused(e.to_string()),
            },
            Request::Commit(request) => self.commit(request.round_id, &request.group_key),
            Request::CheckVouchers(request) => match self.check_ahead(request.vouchers).await {
                Ok(()) => Response::Ack,
                Err(reasons) => refused(reasons),
            },
            Request::SignBatch(request) => {
                let round = request.round_id;
                match self.sign_batch(request).await {
                    Ok(share) => Response::Share(Share {
                        round_id: round,
                        share,
                    }),
                    Err(reasons) => refused(reasons),
                }
            }
            Request::SignSlash(request) => {
                let round = request.round_id;
                match self.sign_slash(*request).await {
                    Ok(share) => Response::Share(Share {
                        round_id: round,
                        share,
                    }),
                    Err(reasons) => refused(reasons),
                }
            }
            Request::SignRotation(request) => {
                let round = request.round_id;
                match self.sign_rotation(request).await {
                    Ok(share) => Response::Share(Share {
                        round_id: round,
                        share,
                    }),
                    Err(reasons) => refused(reasons),
                }
            }
        }
    }

    fn held_epochs(&self) -> Vec<u32> {
        lock(&self.keys).iter().map(|k| k.epoch).collect()
    }

    fn open_inbox(inboxes: &mut HashMap<u32, InboxSlot>, epoch: u32) -> &mut InboxSlot {
        inboxes.entry(epoch).or_insert_with(|| {
            let (sender, inbox) = mpsc::unbounded_channel();
            InboxSlot {
                sender,
                inbox: Some(inbox),
                sent: HashMap::new(),
            }
        })
    }

    fn peer_message(&self, message: PeerMessage) -> Response {
        let limits = self.config.limits;
        if let Err(reason) =
            epoch_admissible(&self.held_epochs(), message.epoch, limits.max_epoch_gap)
        {
            return refused(reason);
        }
        let mut inboxes = lock(&self.inboxes);
        let slot = Self::open_inbox(&mut inboxes, message.epoch);
        let sent = slot.sent.entry(message.from).or_default();
        if *sent >= limits.max_peer_messages_per_epoch {
            return refused(format!(
                "signer {} already sent {} messages for key epoch {}",
                message.from, sent, message.epoch
            ));
        }
        *sent += 1;
        match slot.sender.send((message.from, message.body)) {
            Ok(()) => Response::Ack,
            Err(_) => refused("that DKG is over"),
        }
    }

    /// Refuses a DKG whose threshold or participants are not the committee this signer's
    /// operator pinned (see [`crate::config::CommitteeRule`]).
    fn check_dkg_request(&self, request: &crate::wire::DkgRequest) -> Result<()> {
        let pinned = self.config.member_indices();
        let mut asked = request.participants.clone();
        asked.sort_unstable();
        if asked != pinned {
            return Err(Error::Dkg(format!(
                "participants {:?} are not this signer's pinned committee {pinned:?}",
                request.participants
            )));
        }
        if request.min_signers != self.config.rule.threshold {
            return Err(Error::Dkg(format!(
                "threshold {} is not this signer's pinned threshold {}",
                request.min_signers, self.config.rule.threshold
            )));
        }
        Ok(())
    }

    /// Refuses a key that was not made by the pinned committee at the pinned threshold: a key
    /// this signer holds a share of is not enough to rotate to (its shareholders or t could be
    /// a coordinator's choice from a DKG this signer's operator never agreed to).
    fn check_key_rule(&self, key: &StoredKey) -> std::result::Result<(), String> {
        let threshold = *key.key_package.min_signers();
        if threshold != self.config.rule.threshold
            || key
                .public_key_package
                .min_signers()
                .is_some_and(|t| t != threshold)
        {
            return Err(format!(
                "the key of epoch {} has threshold {threshold}; this signer's pinned threshold is {}",
                key.epoch, self.config.rule.threshold
            ));
        }
        let mut holders = Vec::new();
        for index in self.config.member_indices() {
            holders.push(dkg::identifier(index).map_err(|e| e.to_string())?);
        }
        let shares: Vec<_> = key
            .public_key_package
            .verifying_shares()
            .keys()
            .copied()
            .collect();
        if shares != holders {
            return Err(format!(
                "the key of epoch {} is shared among {} holders that are not this signer's pinned \
                 committee of {}",
                key.epoch,
                shares.len(),
                holders.len()
            ));
        }
        Ok(())
    }

    /// The committee indices of a signing package's signers, refused unless they meet the
    /// pinned rule (t signers, k operators): the diversity rule is the signer's to enforce too.
    fn check_signing_set(
        &self,
        package: &frost::SigningPackage,
    ) -> std::result::Result<(), String> {
        let mut signers = Vec::new();
        for id in package.signing_commitments().keys() {
            let index = self
                .config
                .committee
                .iter()
                .map(|m| m.index)
                .find(|i| dkg::identifier(*i).is_ok_and(|mine| mine == *id))
                .ok_or("the signing package names a signer outside this signer's committee")?;
            signers.push(index);
        }
        match self.config.signing_set_gap(&signers) {
            Some(gap) => Err(format!("signing set {signers:?} refused: {gap}")),
            None => Ok(()),
        }
    }

    async fn dkg(&self, request: crate::wire::DkgRequest) -> Result<DkgDone> {
        self.check_dkg_request(&request)?;
        epoch_admissible(
            &self.held_epochs(),
            request.epoch,
            self.config.limits.max_epoch_gap,
        )
        .map_err(Error::Dkg)?;
        let inbox = Self::open_inbox(&mut lock(&self.inboxes), request.epoch)
            .inbox
            .take()
            .ok_or_else(|| Error::Dkg(format!("a DKG of epoch {} is running", request.epoch)))?;
        let key = dkg::run(
            self.identity.clone(),
            self.config.index,
            &self.config.committee,
            &request,
            inbox,
            self.limits,
            DKG_TIMEOUT,
        )
        .await;
        lock(&self.inboxes).remove(&request.epoch);
        let key = key?;
        keyfile::write_key(&self.config.data_dir, &key)?;
        let done = DkgDone {
            epoch: key.epoch,
            public_key_package: key.public_key_package.clone(),
        };
        lock(&self.keys).push(key);
        Ok(done)
    }

    fn commit(&self, round_id: B256, group_key: &frost::VerifyingKey) -> Response {
        let (share, epoch) = {
            let keys = lock(&self.keys);
            match keys
                .iter()
                .find(|k| k.public_key_package.verifying_key() == group_key)
            {
                Some(k) => (*k.key_package.signing_share(), k.epoch),
                None => return refused("this signer holds no share of that group key"),
            }
        };
        let mut pending = lock(&self.pending);
        if pending.contains_key(&round_id) {
            return refused("round id already used: nonces are single-use");
        }
        if pending.len() >= MAX_PENDING_ROUNDS {
            // Rounds a coordinator abandoned (a co-signer dropped out) are never signed: forget
            // the oldest. Dropping unused nonces is always safe; reusing them never is.
            if let Some(oldest) = pending
                .iter()
                .min_by_key(|(_, p)| p.opened)
                .map(|(round, _)| *round)
            {
                pending.remove(&oldest);
            }
        }
        let (nonces, commitments) = frost::round1::commit(&share, &mut dkg::os_rng());
        pending.insert(
            round_id,
            Pending {
                nonces,
                commitments,
                epoch,
                opened: std::time::Instant::now(),
            },
        );
        Response::Committed(Committed {
            round_id,
            commitments,
        })
    }

    fn take_round(
        &self,
        round_id: B256,
        package: &frost::SigningPackage,
    ) -> std::result::Result<(Pending, StoredKey), String> {
        // Removed first: whatever happens next, these nonces are never used again.
        let pending = lock(&self.pending).remove(&round_id).ok_or(
            "no commitment of this signer for that round (nonces are single-use; start a new round)",
        )?;
        let key = lock(&self.keys)
            .iter()
            .find(|k| k.epoch == pending.epoch)
            .cloned()
            .ok_or("the key of that round is gone")?;
        if package.signing_commitment(key.key_package.identifier()) != Some(pending.commitments) {
            return Err("the signing package does not carry this signer's commitment".into());
        }
        self.check_signing_set(package)?;
        Ok((pending, key))
    }

    /// The view of `chain_id` from the registry file. With `contract`, a cached view of another
    /// `Settlement` is read again from the file first: after a redeploy, the registry names the
    /// new contract and this signer follows it (what it signed stays bound to the old one).
    async fn chain(
        &self,
        chain_id: u64,
        contract: Option<Address>,
    ) -> std::result::Result<ChainView, String> {
        if let Some(view) = lock(&self.chains).get(&chain_id)
            && contract.is_none_or(|c| c == view.deployment.settlement)
        {
            return Ok(view.clone());
        }
        let file = cx_contracts::DeploymentsFile::load(&self.config.deployments_file)
            .map_err(|e| e.to_string())?;
        let entry = file
            .chain(chain_id)
            .ok_or_else(|| format!("chain {chain_id} is not in this signer's registry"))?;
        let view = ChainView::connect(entry).map_err(|e| e.to_string())?;
        lock(&self.chains).insert(chain_id, view.clone());
        Ok(view)
    }

    /// The domains of the chains `vouchers`' bindings name. A binding may name another chain
    /// than its receipt's (an account binds its key once): each domain comes from this signer's
    /// own registry; a chain missing there is missing here, and its vouchers are refused.
    async fn binding_domains(&self, vouchers: &[Voucher]) -> HashMap<u64, Eip712Domain> {
        let mut domains = HashMap::new();
        for voucher in vouchers {
            let id = voucher.binding.chain_id;
            if let std::collections::hash_map::Entry::Vacant(slot) = domains.entry(id)
                && let Ok(view) = self.chain(id, None).await
            {
                slot.insert(cx_protocol::order::domain(id, view.deployment.settlement));
            }
        }
        domains
    }

    /// Checks the signatures of vouchers the coordinator took in, ahead of the batch that will
    /// hold them, and keeps those that pass, whole ([`crate::checked`]). Only the signatures: the
    /// chain (keys registered, escrows open) is read when the batch is signed, at its block.
    async fn check_ahead(&self, vouchers: Vec<Voucher>) -> std::result::Result<(), String> {
        if vouchers.len() > ledger::MAX_RECEIPTS_PER_BATCH {
            return Err(format!(
                "{} vouchers is over the {} one request may hold",
                vouchers.len(),
                ledger::MAX_RECEIPTS_PER_BATCH
            ));
        }
        let exchange = self.config.market.exchange().map_err(|e| e.to_string())?;
        let binding_domains = self.binding_domains(&vouchers).await;
        let mut by_chain: HashMap<u64, Vec<Voucher>> = HashMap::new();
        for voucher in vouchers {
            by_chain
                .entry(voucher.receipt.receipt.chain_id)
                .or_default()
                .push(voucher);
        }
        let mut reasons = Vec::new();
        for (chain_id, vouchers) in by_chain {
            let chain = match self.chain(chain_id, None).await {
                Ok(chain) => chain,
                Err(e) => {
                    reasons.push(e);
                    continue;
                }
            };
            let domain = cx_protocol::order::domain(chain_id, chain.deployment.settlement);
            let (exchange, binding_domains) = (exchange.clone(), binding_domains.clone());
            let checked = self.checked.clone();
            let found = tokio::task::spawn_blocking(move || {
                let ids: Vec<B256> = vouchers.iter().map(checked::voucher_id).collect();
                let reasons = ledger::check_vouchers_once(
                    &vouchers,
                    &ids,
                    &exchange,
                    &domain,
                    |id| binding_domains.get(&id).cloned(),
                    &checked,
                );
                let mut memo = lock(&checked);
                for (id, voucher) in ids.into_iter().zip(vouchers) {
                    let passed = binding_domains
                        .get(&voucher.binding.chain_id)
                        .is_some_and(|b| {
                            memo.get(&CheckedVouchers::key(&id, &domain, b)).is_some()
                        });
                    if passed {
                        memo.hold(id, voucher);
                    }
                }
                reasons
            })
            .await
            .map_err(|j| j.to_string())?;
            reasons.extend(found);
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("; "))
        }
    }

    /// Checks `batch` against the chain and recomputes it. With `slim`, the request carried no
    /// balance lists: the previous list is this signer's own (already in `batch`), and the new
    /// list is what it recomputes (only the root is signed, and it is compared). `ids` are the
    /// receipts' voucher ids when the request named them (else they are computed here).
    async fn check_batch(
        &self,
        batch: &ChainBatch,
        key: &StoredKey,
        slim: bool,
        ids: Option<Vec<B256>>,
    ) -> std::result::Result<ChainBatch, String> {
        if batch.receipts.len() > ledger::MAX_RECEIPTS_PER_BATCH {
            return Err(format!(
                "{} receipts is over the {} a batch part may hold",
                batch.receipts.len(),
                ledger::MAX_RECEIPTS_PER_BATCH
            ));
        }
        let chain = self.chain(batch.chain_id, Some(batch.contract)).await?;
        let e = |e: Error| e.to_string();
        // Each job's chain of signatures — the buyer's binding and order, the exchange's
        // assignment under the key pinned in this signer's config, the provider's receipt — is
        // checked here, not taken from the coordinator. It is the check's CPU work (a few ML-DSA
        // verifications per job), so it runs on a blocking thread while the chain is read.
        let exchange = self.config.market.exchange().map_err(e)?;
        let domain = cx_protocol::order::domain(batch.chain_id, chain.deployment.settlement);
        let binding_domains = self.binding_domains(&batch.receipts).await;
        let vouchers = batch.receipts.clone();
        let checked = self.checked.clone();
        let voucher_check = tokio::task::spawn_blocking(move || {
            let ids = ids.unwrap_or_else(|| vouchers.iter().map(checked::voucher_id).collect());
            ledger::check_vouchers_once(
                &vouchers,
                &ids,
                &exchange,
                &domain,
                |id| binding_domains.get(&id).cloned(),
                &checked,
            )
        });
        // Every read below is made at this one block (see `crate::onchain`).
        let chain = chain.pinned().await.map_err(e)?;
        if batch.contract != chain.deployment.settlement {
            return Err(format!(
                "contract {} is not chain {}'s Settlement ({})",
                batch.contract, batch.chain_id, chain.deployment.settlement
            ));
        }
        // Every chain read of the check goes in one request (a JSON-RPC batch): the reads are
        // independent, and a signer's latency is what the coordinator waits for.
        let mut providers: BTreeSet<Address> = BTreeSet::new();
        let mut escrow_ids: BTreeSet<u64> = BTreeSet::new();
        for voucher in &batch.receipts {
            providers.insert(Address::from(voucher.receipt.receipt.provider));
            escrow_ids.insert(voucher.receipt.receipt.escrow_id);
        }
        let providers: Vec<Address> = providers.into_iter().collect();
        let escrow_ids: Vec<u64> = escrow_ids.into_iter().collect();
        let state = chain.part_state(&escrow_ids, &providers).await.map_err(e)?;
        let (last, on_chain, root) = (state.nonce, state.group_key, state.balances_root);
        let now = chain.now_s().await.map_err(e)?;
        if batch.nonce != last + 1 {
            return Err(format!(
                "nonce {} is not the next one: chain {} is at {last}",
                batch.nonce, batch.chain_id
            ));
        }
        let ours =
            EvmGroupKey::from_verifying_key(key.public_key_package.verifying_key()).map_err(e)?;
        if on_chain.key != ours {
            return Err(format!(
                "chain {}'s group key is not the key of this round (epoch {})",
                batch.chain_id, key.epoch
            ));
        }
        if ledger::balances_root(&batch.previous_balances).map_err(e)? != root {
            return Err(format!(
                "previous balances do not hash to chain {}'s balances root {root}",
                batch.chain_id
            ));
        }
        let mut reasons = voucher_check.await.map_err(|j| j.to_string())?;
        let registered: HashMap<Address, B256> = state.provider_keys.into_iter().collect();
        let mut escrows = HashMap::new();
        for (id, escrow) in state.escrows {
            match escrow {
                Some(escrow) if escrow.reclaimable_at_s <= now.saturating_add(SIGN_RECLAIM_MARGIN_S) => {
                    reasons.push(format!(
                        "escrow {id} becomes reclaimable at {} (chain time {now}): inside this \
                         signer's {SIGN_RECLAIM_MARGIN_S} s margin, a reclaim could revert the batch",
                        escrow.reclaimable_at_s
                    ))
                }
                Some(escrow) => {
                    escrows.insert(id, escrow);
                }
                None => reasons.push(format!(
                    "escrow {id} is not open on chain {} (settled, reclaimed or never opened)",
                    batch.chain_id
                )),
            }
        }
        for voucher in &batch.receipts {
            let r = &voucher.receipt.receipt;
            let provider = Address::from(r.provider);
            if registered.get(&provider) != Some(&B256::from(r.provider_key)) {
                reasons.push(format!(
                    "receipt of job {}: provider {provider} has not registered key {}",
                    hex::encode(r.job_id),
                    hex::encode(r.provider_key)
                ));
            }
        }
        if !reasons.is_empty() {
            return Err(reasons.join("; "));
        }
        let recomputed = ledger::assemble(
            ledger::Head {
                chain_id: batch.chain_id,
                contract: chain.deployment.settlement,
                key_epoch: on_chain.epoch,
                nonce: batch.nonce,
                fee: self.config.market.fee,
            },
            batch.receipts.clone(),
            &escrows,
            batch.previous_balances.clone(),
        )
        .map_err(e)?;
        let differences = if slim {
            let proposed = ChainBatch {
                new_balances: recomputed.new_balances.clone(),
                ..batch.clone()
            };
            ledger::differences(&proposed, &recomputed)
        } else {
            ledger::differences(batch, &recomputed)
        };
        if !differences.is_empty() {
            return Err(differences.join("; "));
        }
        Ok(recomputed)
    }

    async fn sign_batch(
        &self,
        request: SignBatchRequest,
    ) -> std::result::Result<frost::round2::SignatureShare, String> {
        let (pending, key) = self.take_round(request.round_id, &request.signing_package)?;
        let mut proposed = request.batch;
        let ids = match request.held_receipts {
            None => None,
            Some(_) if !proposed.receipts.is_empty() => {
                return Err("a part names its vouchers by id or carries them, not both".into());
            }
            Some(ids) if ids.len() > ledger::MAX_RECEIPTS_PER_BATCH => {
                return Err(format!(
                    "{} receipts is over the {} a batch part may hold",
                    ids.len(),
                    ledger::MAX_RECEIPTS_PER_BATCH
                ));
            }
            Some(ids) => {
                let memo = lock(&self.checked);
                for id in &ids {
                    proposed.receipts.push(memo.held(id).ok_or_else(|| {
                        format!("{UNKNOWN_VOUCHERS} {id}: send the part's vouchers")
                    })?);
                }
                Some(ids)
            }
        };
        let slim = request.previous_root.is_some();
        if let Some(root) = request.previous_root {
            proposed.previous_balances = lock(&self.balances)
                .get(proposed.chain_id, proposed.contract, root)
                .ok_or_else(|| {
                    format!(
                        "{UNKNOWN_BALANCES} {root} on chain {}: send the full list",
                        proposed.chain_id
                    )
                })?;
        }
        let batch = self.check_batch(&proposed, &key, slim, ids).await?;
        if !slim {
            // A full list that hashes to the chain's root (checked above): worth keeping.
            lock(&self.balances)
                .insert(
                    batch.chain_id,
                    batch.contract,
                    batch.previous_balances.clone(),
                )
                .map_err(|e| e.to_string())?;
        }
        let digest = batch.digest();
        if request.signing_package.message() != digest.as_slice() {
            return Err(format!(
                "the message to sign is not this batch's digest {digest}"
            ));
        }
        // Another digest signed at this nonce must be dead before this one is signed: one of its
        // escrows was reclaimed (the `JobReclaimed` event is on chain), and a closed escrow never
        // opens again, so `settleBatch` can never accept it. Only then is a replacement signed —
        // never two digests at one nonce that could both land.
        let rivals = lock(&self.log).rivals(&batch, digest);
        let mut dead = Vec::new();
        if !rivals.is_empty() {
            let chain = self.chain(batch.chain_id, Some(batch.contract)).await?;
            for (rival, escrow_ids) in rivals {
                for id in escrow_ids {
                    if chain.reclaimed(id).await.map_err(|e| e.to_string())? {
                        dead.push(rival);
                        break;
                    }
                }
            }
        }
        {
            let mut log = lock(&self.log);
            let conflicts = log.conflicts(&batch, digest, &dead);
            if !conflicts.is_empty() {
                return Err(conflicts.join("; "));
            }
            // Recorded before the share leaves: a crash after this line cannot lead to signing
            // another batch at this nonce or these jobs again.
            log.record(&batch, digest, dead)
                .map_err(|e| e.to_string())?;
        }
        // The list this batch leads to, for the next request (which names its root).
        lock(&self.balances)
            .insert(batch.chain_id, batch.contract, batch.new_balances.clone())
            .map_err(|e| e.to_string())?;
        frost::round2::sign(&request.signing_package, &pending.nonces, &key.key_package)
            .map_err(|e| format!("FROST round 2: {e}"))
    }

    /// Signs a slash only on evidence it checked itself (see [`crate::slash`]): the receipts,
    /// each signer's key as registered on chain, a majority of distinct staked providers, the
    /// amount and recipient its market terms give ([`crate::slash::SlashPolicy`]), evidence not
    /// used yet, and an expiry
    /// ahead of the chain's clock by at most [`crate::slash::MAX_SLASH_VALIDITY_S`].
    async fn sign_slash(
        &self,
        request: crate::wire::SignSlashRequest,
    ) -> std::result::Result<frost::round2::SignatureShare, String> {
        let (pending, key) = self.take_round(request.round_id, &request.signing_package)?;
        let e = |e: Error| e.to_string();
        let evidence = &request.evidence;
        evidence.check()?;
        if evidence.chain_id() != request.chain_id {
            return Err(format!(
                "the evidence is about chain {}, the slash is for chain {}",
                evidence.chain_id(),
                request.chain_id
            ));
        }
        // The amount and recipient are the market's terms applied to this evidence, whatever
        // the coordinator asks: a bounded multiple of the accused's price, to the pinned account.
        self.config
            .market
            .slash
            .check(evidence, request.amount, request.recipient)?;
        let chain = self
            .chain(request.chain_id, None)
            .await?
            .pinned()
            .await
            .map_err(e)?;
        let hash = evidence.hash();
        let (now, used, on_chain) =
            tokio::join!(chain.now_s(), chain.evidence_used(hash), chain.group_key());
        // Whether every key that signed the evidence (the accused's, and for a replica
        // disagreement each of the majority's) answers for its provider on chain — its key, or
        // one it replaced within the unbonding delay, so a key change after a wrong result does
        // not void the evidence — and what each has at stake: a majority counts distinct
        // registered providers with stake, never throwaway accounts.
        let mut answers = Vec::new();
        let mut staked = Vec::new();
        for (provider, key) in evidence.signers() {
            let (answering, (stake, _)) = tokio::try_join!(
                chain.key_answers(provider, key),
                chain.provider_standing(provider)
            )
            .map_err(e)?;
            answers.push((provider, key, answering));
            staked.push((provider, stake));
        }
        let now = now.map_err(e)?;
        if request.expires_at_s <= now {
            return Err(format!(
                "the slash expired at {} (chain time {now}): stale",
                request.expires_at_s
            ));
        }
        if request.expires_at_s > now + crate::slash::MAX_SLASH_VALIDITY_S {
            return Err(format!(
                "the slash would stay valid until {}, more than {} s past chain time {now}",
                request.expires_at_s,
                crate::slash::MAX_SLASH_VALIDITY_S
            ));
        }
        evidence.check_keys_answer(&answers)?;
        if !evidence.witnesses().is_empty() {
            evidence.check_staked(&staked, chain.min_stake().await.map_err(e)?)?;
        }
        if used.map_err(e)? {
            return Err(format!("evidence {hash} was already used for a slash"));
        }
        let current =
            EvmGroupKey::from_verifying_key(key.public_key_package.verifying_key()).map_err(e)?;
        if on_chain.map_err(e)?.key != current {
            return Err(format!(
                "chain {}'s group key is not the key of this round",
                request.chain_id
            ));
        }
        let digest = crate::batch::slash_digest(
            request.chain_id,
            chain.deployment.registry,
            evidence.provider(),
            request.amount,
            request.recipient,
            hash,
            request.expires_at_s,
        );
        if request.signing_package.message() != digest.as_slice() {
            return Err("the message is not the slash digest of this evidence and terms".into());
        }
        frost::round2::sign(&request.signing_package, &pending.nonces, &key.key_package)
            .map_err(|e| format!("FROST round 2: {e}"))
    }

    async fn sign_rotation(
        &self,
        request: SignRotationRequest,
    ) -> std::result::Result<frost::round2::SignatureShare, String> {
        let (pending, key) = self.take_round(request.round_id, &request.signing_package)?;
        if request.new_epoch <= key.epoch {
            return Err(format!(
                "new epoch {} must follow the current key's epoch {}",
                request.new_epoch, key.epoch
            ));
        }
        let new_key = lock(&self.keys)
            .iter()
            .find(|k| k.epoch == request.new_epoch)
            .cloned()
            .ok_or_else(|| {
                format!(
                    "this signer took part in no DKG of epoch {}: it will not install a key it \
                     does not hold a share of",
                    request.new_epoch
                )
            })?;
        self.check_key_rule(&new_key)?;
        let e = |e: Error| e.to_string();
        let chain = self
            .chain(request.chain_id, None)
            .await?
            .pinned()
            .await
            .map_err(e)?;
        let on_chain = chain.group_key().await.map_err(e)?;
        let current =
            EvmGroupKey::from_verifying_key(key.public_key_package.verifying_key()).map_err(e)?;
        if on_chain.key != current {
            return Err(format!(
                "chain {}'s group key is not the key of this round",
                request.chain_id
            ));
        }
        let new = EvmGroupKey::from_verifying_key(new_key.public_key_package.verifying_key())
            .map_err(e)?;
        let expected = rotation_digest(
            request.chain_id,
            chain.deployment.settlement,
            on_chain.epoch,
            new.x,
            new.parity,
        );
        if request.signing_package.message() != expected.as_slice() {
            return Err("the message is not the rotation to this signer's new key".into());
        }
        frost::round2::sign(&request.signing_package, &pending.nonces, &key.key_package)
            .map_err(|e| format!("FROST round 2: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::epoch_admissible;

    /// What broke: a DKG at epoch `u32::MAX` left a key no later epoch could follow, and peer
    /// messages could open an inbox for every epoch. Epochs are admissible only just ahead of
    /// the newest key.
    #[test]
    fn key_epochs_are_admissible_only_just_ahead_of_the_newest() {
        assert!(epoch_admissible(&[], 0, 16).is_ok());
        assert!(epoch_admissible(&[], 15, 16).is_ok());
        assert!(epoch_admissible(&[], 16, 16).is_err());
        assert!(epoch_admissible(&[], u32::MAX, 16).is_err());
        assert!(epoch_admissible(&[0, 3], 3, 16).is_err(), "not again");
        assert!(epoch_admissible(&[0, 3], 4, 16).is_ok());
        assert!(epoch_admissible(&[0, 3], 19, 16).is_ok());
        assert!(epoch_admissible(&[0, 3], 20, 16).is_err());
        assert!(epoch_admissible(&[u32::MAX], 0, 16).is_err());
    }
}
