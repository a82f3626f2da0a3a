//! The coordinator's side of the committee: sessions to every signer, choosing any t available
//! signers under the diversity rule, the two FROST rounds, aggregation, and the DKG trigger.
//!
//! Signer-agnostic: the coordinator holds no share and prefers no signer. Any t reachable signers
//! whose operators number at least k make a signing set (SPEC §7: a committee that is not diverse
//! silently collapses to one operator).
//!
//! One misbehaving member must never stop the others from signing while t honest members of
//! enough operators answer, so every fault costs its author, not the round:
//! - a signer whose signature share does not verify is named by aggregation (RFC 9591 §5.3,
//!   frost-core's cheater detection) and left out; the others sign again with fresh nonces — a
//!   commitment is never reused;
//! - a signer that drops out of a round (no answer in time, an answer out of protocol) is left out
//!   of the next sets of the same signing, and both it and a cheater are cooled down: later
//!   signings choose them last, so the next settlement pass does not start with them again (they
//!   still sign when no set forms without them: a cool-down must not cost liveness);
//! - a signer that refuses is left out of the next sets of the same signing. Its reason is only
//!   its word: the refusals travel apart, one per signer ([`Error::Refused`]), and when no set is
//!   left the members not yet heard are asked too, so that a caller can tell a reason t signers
//!   give from one signer's claim.
//!
//! Cool-downs are not kept for refusals: a refusal concerns one message (a batch a lagging node
//! cannot see yet), not the signer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy::primitives::B256;
use cx_protocol::pq::Identity;
use cx_protocol::voucher::Voucher;
use frost_secp256k1 as frost;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use crate::config::Member;
use crate::error::{Error, Refusal, Result};
use crate::ledger;
use crate::transport::{Channel, Limits};
use crate::wire::{CheckVouchersRequest, CommitRequest, DkgRequest, Request, Response};

/// Rounds of one signing that may be lost to signers dropping out before a member that dropped
/// out is left out for good (until then it is asked again when no set forms without it: a drop
/// may be a passing network fault).
const ROUND_ATTEMPTS: usize = 3;

/// How long a signer that dropped out of a round is chosen last. Settlement passes run every few
/// seconds: this keeps the next ones from starting with it, and a signer restarted after a crash
/// is back in the first choice soon enough.
pub const DROPPED_COOL_DOWN: Duration = Duration::from_secs(300);

/// How long a signer whose share did not verify is chosen last. Such a share is a corrupted key
/// package or a hostile signer: either way its operator has to act.
pub const BAD_SHARE_COOL_DOWN: Duration = Duration::from_secs(3_600);

/// How long a signer may take to answer round 2 by default: it re-checks the batch against its
/// own view of the chain first.
const SIGN_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a member is out of the sets of one signing.
#[derive(Clone, Debug)]
enum Fault {
    /// It refused, at round 1 (`at_commit`) or round 2, with this reason.
    Refused { reason: String, at_commit: bool },
    /// Its signature share does not verify against its verifying share.
    BadShare,
    /// It did not answer in time, or answered out of protocol.
    Dropped(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Refused { reason, .. } => write!(f, "refused: {reason}"),
            Fault::BadShare => write!(f, "sent a signature share that does not verify"),
            Fault::Dropped(why) => write!(f, "dropped out: {why}"),
        }
    }
}

/// What one signing (one [`Committee::sign`] call) learnt about the members so far.
#[derive(Debug, Default)]
struct Signing {
    faults: BTreeMap<u16, Fault>,
    /// Members that gave a verdict on the message: a share (they approve) or a refusal.
    heard: BTreeSet<u16>,
    /// Rounds lost to members dropping out.
    lost_rounds: usize,
    /// Rounds run only to hear members not heard yet (see [`Committee::choose`]).
    consultations: usize,
}

impl Signing {
    fn refusals(&self) -> Vec<Refusal> {
        self.faults
            .iter()
            .filter_map(|(signer, fault)| match fault {
                Fault::Refused { reason, .. } => Some(Refusal {
                    signer: *signer,
                    reason: reason.clone(),
                }),
                _ => None,
            })
            .collect()
    }
}

/// How one round ended.
enum Round {
    Signed(frost::Signature),
    /// Who failed it and how, and who gave a valid share (or would have: they committed and
    /// signed, and only another member's fault stopped the round).
    Failed {
        faults: Vec<(u16, Fault)>,
        approved: Vec<u16>,
    },
}

/// The variant of an answer, for a log line (its content may be anything a faulty signer sent).
fn kind(response: &Response) -> &'static str {
    match response {
        Response::Pong => "pong",
        Response::Info(_) => "info",
        Response::DkgDone(_) => "dkg_done",
        Response::Committed(_) => "committed (another round)",
        Response::Share(_) => "share (another round)",
        Response::Ack => "ack",
        Response::Refused { .. } => "refused",
    }
}

/// Counts a member of `chosen` that gave no answer at all (its task failed) as dropped out.
fn missing(chosen: &[u16], faults: &mut Vec<(u16, Fault)>, answered: impl Fn(u16) -> bool) {
    for &index in chosen {
        if !answered(index) && !faults.iter().any(|(i, _)| *i == index) {
            faults.push((index, Fault::Dropped("no answer".into())));
        }
    }
}

/// Sessions to the committee.
pub struct Committee {
    identity: Arc<Identity>,
    members: Vec<Member>,
    threshold: u16,
    min_operators: usize,
    limits: Limits,
    sign_timeout: Duration,
    channels: Mutex<HashMap<u16, Channel>>,
    last_signers: std::sync::Mutex<Vec<u16>>,
    /// Members left out of the last signing's sets, and why.
    last_left_out: std::sync::Mutex<Vec<(u16, String)>>,
    /// Members chosen last until the instant given, and why.
    cooling: std::sync::Mutex<HashMap<u16, (Instant, String)>>,
}

impl std::fmt::Debug for Committee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Committee({} of {}, ≥ {} operators)",
            self.threshold,
            self.members.len(),
            self.min_operators
        )
    }
}

/// A signing set chosen under the diversity rule: t signers, at least k distinct operators.
/// `None` when the available signers cannot form one. Operators are taken in the order of their
/// lowest index, one signer each, then the set is filled by index.
pub fn choose_signers(
    available: &[Member],
    threshold: u16,
    min_operators: usize,
) -> Option<Vec<u16>> {
    let mut order: Vec<&Member> = available.iter().collect();
    order.sort_by_key(|m| m.index);
    order.dedup_by_key(|m| m.index);
    choose_in_order(&order, threshold, min_operators)
}

/// A signing set from `order` (most preferred first, no member twice): one signer of each of the
/// first k operators met, then the set filled in order. Whoever comes first in `order` is in the
/// set (a consultation relies on it).
fn choose_in_order(order: &[&Member], threshold: u16, min_operators: usize) -> Option<Vec<u16>> {
    let size = threshold as usize;
    let mut chosen: Vec<u16> = Vec::with_capacity(size);
    let mut operators: BTreeSet<&str> = BTreeSet::new();
    for m in order {
        if operators.len() < min_operators
            && chosen.len() < size
            && operators.insert(m.operator.as_str())
        {
            chosen.push(m.index);
        }
    }
    for m in order {
        if chosen.len() == size {
            break;
        }
        if !chosen.contains(&m.index) {
            chosen.push(m.index);
        }
    }
    if chosen.len() < size || operators.len() < min_operators {
        return None;
    }
    chosen.sort_unstable();
    Some(chosen)
}

/// Refuses a threshold or diversity rule no signing set of `members` could ever meet.
pub(crate) fn check_rule(members: &[Member], threshold: u16, min_operators: usize) -> Result<()> {
    let operators: BTreeSet<&str> = members.iter().map(|m| m.operator.as_str()).collect();
    if min_operators > threshold as usize || min_operators > operators.len() {
        return Err(Error::ImpossibleRule {
            min_operators,
            threshold,
            operators: operators.into_iter().map(String::from).collect(),
        });
    }
    if threshold == 0 || threshold as usize > members.len() {
        return Err(Error::ImpossibleThreshold {
            threshold,
            members: members.len(),
        });
    }
    Ok(())
}

impl Committee {
    /// A committee of `members`, any `threshold` of whom sign, with at least `min_operators`
    /// distinct operators per signing set. Refuses a rule no set could ever meet.
    pub fn new(
        identity: Arc<Identity>,
        members: Vec<Member>,
        threshold: u16,
        min_operators: usize,
    ) -> Result<Self> {
        check_rule(&members, threshold, min_operators)?;
        Ok(Self {
            identity,
            members,
            threshold,
            min_operators,
            limits: Limits {
                io_timeout: Duration::from_secs(5),
                ..Limits::default()
            },
            sign_timeout: SIGN_TIMEOUT,
            channels: Mutex::new(HashMap::new()),
            last_signers: std::sync::Mutex::new(Vec::new()),
            last_left_out: std::sync::Mutex::new(Vec::new()),
            cooling: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Replaces how long a signer may take to answer: `io_timeout` for every request but round
    /// 2, `sign_timeout` for round 2 (5 s and 30 s by default). A signer slower than that is
    /// counted out of the round and cooled down, so on a fast network lower limits cost a
    /// stalling signer's victims less time.
    pub fn with_timeouts(mut self, io_timeout: Duration, sign_timeout: Duration) -> Self {
        self.limits.io_timeout = io_timeout;
        self.sign_timeout = sign_timeout;
        self
    }

    /// The members.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Threshold t.
    pub fn threshold(&self) -> u16 {
        self.threshold
    }

    /// Sends one request to each named signer concurrently (sessions are reused, or opened when
    /// missing; a failed one is dropped), with `timeout` per answer.
    async fn call_many(
        &self,
        requests: Vec<(u16, Request)>,
        timeout: Duration,
    ) -> Vec<(u16, Result<Response>)> {
        let mut tasks = JoinSet::new();
        for (index, request) in requests {
            let Some(member) = self.members.iter().find(|m| m.index == index).cloned() else {
                continue;
            };
            let existing = self.channels.lock().await.remove(&index);
            let identity = self.identity.clone();
            let limits = self.limits;
            tasks.spawn(async move {
                let result = async {
                    if let Some(mut channel) = existing {
                        channel.set_io_timeout(timeout);
                        match channel.call(&request).await {
                            Ok(response) => {
                                channel.set_io_timeout(limits.io_timeout);
                                return Ok((channel, response));
                            }
                            // A session cached from before the signer restarted fails on first
                            // use. Only a request that may be answered twice (a ping, an info
                            // request, vouchers to check) is repeated on a fresh one: the others
                            // may have reached the signer and must not be sent twice.
                            Err(e)
                                if !matches!(
                                    request,
                                    Request::Ping | Request::Info | Request::CheckVouchers(_)
                                ) =>
                            {
                                return Err(e);
                            }
                            Err(_) => {}
                        }
                    }
                    let mut channel = Channel::connect(
                        member.address.as_str(),
                        &identity,
                        member.public()?,
                        limits,
                    )
                    .await?;
                    channel.set_io_timeout(timeout);
                    let response: Response = channel.call(&request).await?;
                    channel.set_io_timeout(limits.io_timeout);
                    Ok::<_, Error>((channel, response))
                }
                .await;
                (index, result)
            });
        }
        let mut out = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((index, result)) = joined else {
                continue;
            };
            match result {
                Ok((channel, response)) => {
                    self.channels.lock().await.insert(index, channel);
                    out.push((index, Ok(response)));
                }
                Err(e) => out.push((index, Err(e))),
            }
        }
        out.sort_by_key(|(i, _)| *i);
        out
    }

    /// Members that answer now and declare the operator and region they are configured with (a
    /// signer whose declaration differs is left out: the diversity rule counts declarations).
    pub async fn available(&self) -> Vec<Member> {
        let requests = self
            .members
            .iter()
            .map(|m| (m.index, Request::Info))
            .collect();
        let answers = self.call_many(requests, self.limits.io_timeout).await;
        answers
            .into_iter()
            .filter_map(|(index, answer)| {
                let member = self.members.iter().find(|m| m.index == index)?;
                match answer {
                    Ok(Response::Info(info))
                        if info.index == member.index
                            && info.operator == member.operator
                            && info.region == member.region =>
                    {
                        Some(member.clone())
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// Hands `vouchers` to every member not cooling down, to check their signatures now rather
    /// than inside the round that signs their batch ([`crate::checked`]); returns how many
    /// members checked them all. Best effort: a member that refuses or does not answer within
    /// the io timeout checks them in round 2 instead, so nothing depends on this.
    pub async fn check_ahead(&self, vouchers: &[Voucher]) -> usize {
        let cooling = self.cooling_now();
        let mut checked: BTreeMap<u16, bool> = BTreeMap::new();
        for part in vouchers.chunks(ledger::MAX_RECEIPTS_PER_BATCH) {
            let requests = self
                .members
                .iter()
                .filter(|m| !cooling.contains(&m.index))
                .map(|m| {
                    let request = Request::CheckVouchers(CheckVouchersRequest {
                        vouchers: part.to_vec(),
                    });
                    (m.index, request)
                })
                .collect();
            for (index, answer) in self.call_many(requests, self.limits.io_timeout).await {
                let ok = matches!(answer, Ok(Response::Ack));
                if !ok {
                    tracing::debug!(signer = index, "vouchers not checked ahead: {answer:?}");
                }
                *checked.entry(index).or_insert(true) &= ok;
            }
        }
        checked.values().filter(|ok| **ok).count()
    }

    /// The members chosen last right now (a cool-down not yet over).
    fn cooling_now(&self) -> BTreeSet<u16> {
        let now = Instant::now();
        self.cooling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|(index, _)| *index)
            .collect()
    }

    /// Drops every open session (the next call reconnects).
    pub async fn disconnect(&self) {
        self.channels.lock().await.clear();
    }

    /// Runs both FROST rounds for `message` with any t available signers satisfying the
    /// diversity rule, aggregates and verifies. `sign_request` builds each signer's round-2
    /// request (it carries what the signer checks: the batch, or the rotation).
    ///
    /// A member that refuses, drops out or sends a share that does not verify is left out and
    /// the round is run again with another set (see the module's notes): one signer whose node
    /// lags behind the chain head, or that is simply wrong or hostile, must not stop the others
    /// from settling. Only when the members left cannot make a set does it fail: with every
    /// refusal ([`Error::Refused`], after hearing every member that answers), else with who
    /// dropped out and why ([`Error::SignersDropping`]), else waiting for signers.
    pub async fn sign(
        &self,
        message: &[u8],
        public: &frost::keys::PublicKeyPackage,
        sign_request: impl Fn(B256, frost::SigningPackage) -> Request + Send + Sync,
    ) -> Result<frost::Signature> {
        let mut signing = Signing::default();
        // Every round signs, leaves out a member not left out before (at most twice each: a
        // drop, then a refusal or a bad share), spends one of the rounds lost to drops, or is one
        // of at most n consultations; the cap only backs that up.
        let max_rounds = 3 * self.members.len() + ROUND_ATTEMPTS + 1;
        let mut available = Vec::new();
        for _ in 0..max_rounds {
            // A member with no verifying share of this key cannot sign under it.
            available = self
                .available()
                .await
                .into_iter()
                .filter(|m| {
                    crate::dkg::identifier(m.index)
                        .is_ok_and(|id| public.verifying_shares().contains_key(&id))
                })
                .collect();
            let Some((chosen, consultation)) = self.choose(&available, &signing) else {
                break;
            };
            if consultation {
                signing.consultations += 1;
            }
            match self.round(&chosen, message, public, &sign_request).await? {
                Round::Signed(signature) => {
                    let mut cooling = self.cooling.lock().unwrap_or_else(|p| p.into_inner());
                    for index in &chosen {
                        cooling.remove(index);
                    }
                    drop(cooling);
                    *self.last_signers.lock().unwrap_or_else(|p| p.into_inner()) = chosen;
                    *self.last_left_out.lock().unwrap_or_else(|p| p.into_inner()) = signing
                        .faults
                        .iter()
                        .map(|(index, fault)| (*index, fault.to_string()))
                        .collect();
                    return Ok(signature);
                }
                Round::Failed { faults, approved } => self.record(&mut signing, faults, approved),
            }
        }
        Err(self.no_set_left(&available, &signing))
    }

    /// The next set for `signing` among `available`, and whether it is a consultation.
    ///
    /// In order: members not left out, those cooling down last; then, while fewer than
    /// [`ROUND_ATTEMPTS`] rounds were lost to drops, members that dropped out too. When no set
    /// forms and some member refused, a set is made that leads with a member not heard yet,
    /// filled by refusers (those that refused at round 2 before those that refused to commit):
    /// it signs if the refusers changed their minds (a lagging node caught up), and otherwise
    /// every member that answers has given its verdict, so a refusal t signers agree on is told
    /// from one signer's claim.
    fn choose(&self, available: &[Member], signing: &Signing) -> Option<(Vec<u16>, bool)> {
        let cooling = self.cooling_now();
        let pick = |keep: &dyn Fn(&Member) -> bool| -> Vec<&Member> {
            available.iter().filter(|m| keep(m)).collect()
        };
        let clean = |m: &Member| !signing.faults.contains_key(&m.index);
        let mut order = pick(&|m| clean(m) && !cooling.contains(&m.index));
        order.extend(pick(&|m| clean(m) && cooling.contains(&m.index)));
        if let Some(set) = choose_in_order(&order, self.threshold, self.min_operators) {
            return Some((set, false));
        }
        if signing.lost_rounds < ROUND_ATTEMPTS {
            order.extend(pick(&|m| {
                matches!(signing.faults.get(&m.index), Some(Fault::Dropped(_)))
            }));
            if let Some(set) = choose_in_order(&order, self.threshold, self.min_operators) {
                return Some((set, false));
            }
        }
        let refused_at = |at: bool| {
            move |m: &Member| {
                matches!(
                    signing.faults.get(&m.index),
                    Some(Fault::Refused { at_commit, .. }) if *at_commit == at
                )
            }
        };
        let unheard = pick(&|m| clean(m) && !signing.heard.contains(&m.index));
        if signing.refusals().is_empty()
            || unheard.is_empty()
            || signing.consultations >= self.members.len()
        {
            return None;
        }
        let mut order = unheard;
        order.extend(pick(&|m| clean(m) && signing.heard.contains(&m.index)));
        order.extend(pick(&refused_at(false)));
        order.extend(pick(&refused_at(true)));
        choose_in_order(&order, self.threshold, self.min_operators).map(|set| (set, true))
    }

    /// Takes a failed round's faults into `signing`, and cools down cheaters and drop-outs.
    fn record(&self, signing: &mut Signing, faults: Vec<(u16, Fault)>, approved: Vec<u16>) {
        let mut cooling = self.cooling.lock().unwrap_or_else(|p| p.into_inner());
        let mut dropped = false;
        for (index, fault) in faults {
            match &fault {
                Fault::BadShare => {
                    cooling.insert(
                        index,
                        (Instant::now() + BAD_SHARE_COOL_DOWN, fault.to_string()),
                    );
                }
                Fault::Dropped(_) => {
                    dropped = true;
                    cooling.insert(
                        index,
                        (Instant::now() + DROPPED_COOL_DOWN, fault.to_string()),
                    );
                    // A refuser asked again in a consultation keeps its refusal: it stays heard.
                    if matches!(signing.faults.get(&index), Some(Fault::Refused { .. })) {
                        continue;
                    }
                }
                Fault::Refused { reason, .. } => {
                    signing.heard.insert(index);
                    // A refuser asked again (a consultation) keeps what it said first, and what
                    // it says new is added: one refusal per signer, whatever it names.
                    if let Some(Fault::Refused { reason: said, .. }) =
                        signing.faults.get_mut(&index)
                    {
                        if !said.contains(reason.as_str()) {
                            said.push_str("; then: ");
                            said.push_str(reason);
                        }
                        continue;
                    }
                }
            }
            signing.faults.insert(index, fault);
        }
        if dropped {
            signing.lost_rounds += 1;
        }
        signing.heard.extend(approved);
    }

    /// The error of a signing no set of the members left can make.
    fn no_set_left(&self, available: &[Member], signing: &Signing) -> Error {
        let refusals = signing.refusals();
        if !refusals.is_empty() {
            return Error::Refused { refusals };
        }
        if !signing.faults.is_empty() {
            return Error::SignersDropping {
                last_gap: signing
                    .faults
                    .iter()
                    .map(|(index, fault)| format!("signer {index} {fault}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            };
        }
        let operators: BTreeSet<&str> = available.iter().map(|m| m.operator.as_str()).collect();
        Error::WaitingForSigners {
            reachable: available.len(),
            members: self.members.len(),
            operators: operators.len(),
            threshold: self.threshold,
            min_operators: self.min_operators,
        }
    }

    /// One signing round with `chosen`: commitments, shares, aggregation. A member's fault ends
    /// the round (its nonces and everyone's are spent: a new round draws fresh ones); an error
    /// is returned only for what no other set would change.
    async fn round(
        &self,
        chosen: &[u16],
        message: &[u8],
        public: &frost::keys::PublicKeyPackage,
        sign_request: &(impl Fn(B256, frost::SigningPackage) -> Request + Send + Sync),
    ) -> Result<Round> {
        let round_id = B256::from(crate::dkg::random_bytes());
        let commits = chosen
            .iter()
            .map(|i| {
                (
                    *i,
                    Request::Commit(CommitRequest {
                        round_id,
                        group_key: *public.verifying_key(),
                    }),
                )
            })
            .collect();
        let mut commitments = BTreeMap::new();
        let mut faults = Vec::new();
        for (index, answer) in self.call_many(commits, self.limits.io_timeout).await {
            match answer {
                Ok(Response::Committed(c)) if c.round_id == round_id => {
                    commitments.insert(crate::dkg::identifier(index)?, c.commitments);
                }
                Ok(Response::Refused { reason }) => faults.push((
                    index,
                    Fault::Refused {
                        reason,
                        at_commit: true,
                    },
                )),
                Ok(other) => faults.push((
                    index,
                    Fault::Dropped(format!("answered {} to a commit request", kind(&other))),
                )),
                Err(e) => faults.push((index, Fault::Dropped(e.to_string()))),
            }
        }
        missing(chosen, &mut faults, |i| {
            crate::dkg::identifier(i).is_ok_and(|id| commitments.contains_key(&id))
        });
        if !faults.is_empty() {
            return Ok(Round::Failed {
                faults,
                approved: Vec::new(),
            });
        }
        let package = frost::SigningPackage::new(commitments, message);
        let signs = chosen
            .iter()
            .map(|i| (*i, sign_request(round_id, package.clone())))
            .collect();
        let mut shares = BTreeMap::new();
        let mut approved = Vec::new();
        for (index, answer) in self.call_many(signs, self.sign_timeout).await {
            match answer {
                Ok(Response::Share(s)) if s.round_id == round_id => {
                    shares.insert(crate::dkg::identifier(index)?, s.share);
                    approved.push(index);
                }
                Ok(Response::Refused { reason }) => faults.push((
                    index,
                    Fault::Refused {
                        reason,
                        at_commit: false,
                    },
                )),
                Ok(other) => faults.push((
                    index,
                    Fault::Dropped(format!("answered {} to a sign request", kind(&other))),
                )),
                Err(e) => faults.push((index, Fault::Dropped(e.to_string()))),
            }
        }
        missing(chosen, &mut faults, |i| approved.contains(&i));
        if !faults.is_empty() {
            return Ok(Round::Failed { faults, approved });
        }
        // Every share is checked against its signer's verifying share only when the sum does not
        // verify (RFC 9591 §5.3; free on the honest path), and all culprits are named at once:
        // one more round per cheater, not per cheater found.
        match frost::aggregate_custom(
            &package,
            &shares,
            public,
            frost::CheaterDetection::AllCheaters,
        ) {
            Ok(signature) => {
                public.verifying_key().verify(message, &signature)?;
                Ok(Round::Signed(signature))
            }
            Err(e) => {
                let culprits = e.culprits();
                let bad: Vec<u16> = chosen
                    .iter()
                    .copied()
                    .filter(|i| crate::dkg::identifier(*i).is_ok_and(|id| culprits.contains(&id)))
                    .collect();
                if bad.is_empty() {
                    return Err(e.into());
                }
                Ok(Round::Failed {
                    faults: bad.iter().map(|i| (*i, Fault::BadShare)).collect(),
                    approved: approved.into_iter().filter(|i| !bad.contains(i)).collect(),
                })
            }
        }
    }

    /// The members left out of the last signature's signing (a refusal, a share that did not
    /// verify, a dropped round), and why: for the record, next to [`Committee::last_signers`].
    pub fn last_left_out(&self) -> Vec<(u16, String)> {
        self.last_left_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Members currently chosen last, and why (a share that did not verify, a round dropped).
    /// They still sign when no set forms without them.
    pub fn cooling_down(&self) -> Vec<(u16, String)> {
        let now = Instant::now();
        let mut out: Vec<(u16, String)> = self
            .cooling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|(index, (_, why))| (*index, why.clone()))
            .collect();
        out.sort();
        out
    }

    /// The signers whose shares made the last signature (by index), for the record.
    pub fn last_signers(&self) -> Vec<u16> {
        self.last_signers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Has every member run a DKG for key `epoch`; returns the group's public key package once
    /// every member reports the same one.
    pub async fn dkg(&self, epoch: u32) -> Result<frost::keys::PublicKeyPackage> {
        // Refreshes every session first, so none cached from before a restart fails the DKG.
        let available = self.available().await;
        if available.len() != self.members.len() {
            return Err(Error::Dkg(format!(
                "a DKG needs every member: only {} of {} answer",
                available.len(),
                self.members.len()
            )));
        }
        let participants: Vec<u16> = self.members.iter().map(|m| m.index).collect();
        let request = DkgRequest {
            epoch,
            min_signers: self.threshold,
            participants: participants.clone(),
        };
        let requests = participants
            .iter()
            .map(|i| (*i, Request::Dkg(request.clone())))
            .collect();
        let mut agreed: Option<frost::keys::PublicKeyPackage> = None;
        for (index, answer) in self.call_many(requests, Duration::from_secs(90)).await {
            let done = match answer {
                Ok(Response::DkgDone(done)) if done.epoch == epoch => done,
                Ok(Response::Refused { reason }) => {
                    return Err(Error::Dkg(format!("signer {index}: {reason}")));
                }
                Ok(other) => return Err(Error::Dkg(format!("signer {index}: {other:?}"))),
                Err(e) => return Err(Error::Dkg(format!("signer {index}: {e}"))),
            };
            match &agreed {
                None => agreed = Some(done.public_key_package),
                Some(p) if *p == done.public_key_package => {}
                Some(_) => {
                    return Err(Error::Dkg(format!(
                        "signer {index} reports a different group key: the DKG is void"
                    )));
                }
            }
        }
        agreed.ok_or_else(|| Error::Dkg("no signer answered".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(index: u16, operator: &str) -> Member {
        Member {
            index,
            address: String::new(),
            verification_key: Vec::new(),
            operator: operator.into(),
            region: "r".into(),
        }
    }

    #[test]
    fn a_set_takes_distinct_operators_first() {
        let all = [
            member(1, "a"),
            member(2, "a"),
            member(3, "a"),
            member(4, "b"),
            member(5, "c"),
        ];
        // Index order alone would pick 1, 2, 3 — one operator.
        assert_eq!(choose_signers(&all, 3, 3), Some(vec![1, 4, 5]));
        assert_eq!(choose_signers(&all, 3, 2), Some(vec![1, 2, 4]));
        assert_eq!(choose_signers(&all[..3], 3, 2), None);
        assert_eq!(choose_signers(&all[3..], 3, 1), None);
    }

    #[test]
    fn an_impossible_rule_is_refused_up_front() {
        let members = vec![member(1, "a"), member(2, "a"), member(3, "b")];
        let err = Committee::new(Arc::new(Identity::generate()), members, 2, 3)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be met"), "{err}");
    }
}
