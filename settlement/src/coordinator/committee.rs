//! The coordinator's side of the committee: sessions to every signer, choosing any t available
//! signers under the diversity rule, the two FROST rounds, aggregation, and the DKG trigger.
//!
//! Signer-agnostic: the coordinator holds no share and prefers no signer. Any t reachable signers
//! whose operators number at least k make a signing set (SPEC §7: a committee that is not diverse
//! silently collapses to one operator). A signer that drops out mid-round costs a new round with
//! fresh nonces — never a reuse of a commitment; one that refuses is left out of the next set.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use alloy::primitives::B256;
use cx_protocol::pq::Identity;
use frost_secp256k1 as frost;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use crate::config::Member;
use crate::error::{Error, Result};
use crate::transport::{Channel, Limits};
use crate::wire::{CommitRequest, DkgRequest, Request, Response};

/// How many times a signing round is restarted when a chosen signer drops out.
const ROUND_ATTEMPTS: usize = 3;

/// The refusal of a signing that no set of the signers left would make, naming every refuser.
fn refused(refusals: &[(u16, String)]) -> Error {
    Error::Refused {
        signer: refusals[0].0,
        reason: refusals
            .iter()
            .map(|(i, r)| format!("signer {i}: {r}"))
            .collect::<Vec<_>>()
            .join(" | "),
    }
}

/// Sessions to the committee.
pub struct Committee {
    identity: Arc<Identity>,
    members: Vec<Member>,
    threshold: u16,
    min_operators: usize,
    limits: Limits,
    channels: Mutex<HashMap<u16, Channel>>,
    last_signers: std::sync::Mutex<Vec<u16>>,
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
/// `None` when the available signers cannot form one.
pub fn choose_signers(
    available: &[Member],
    threshold: u16,
    min_operators: usize,
) -> Option<Vec<u16>> {
    let mut by_operator: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
    for m in available {
        by_operator.entry(&m.operator).or_default().push(m.index);
    }
    if available.len() < threshold as usize || by_operator.len() < min_operators {
        return None;
    }
    // One signer from each of k operators first, then the rest by index.
    let mut chosen: BTreeSet<u16> = by_operator
        .values()
        .take(min_operators)
        .map(|indices| indices[0])
        .collect();
    let mut rest: Vec<u16> = available.iter().map(|m| m.index).collect();
    rest.sort_unstable();
    for index in rest {
        if chosen.len() == threshold as usize {
            break;
        }
        chosen.insert(index);
    }
    Some(chosen.into_iter().collect())
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
            channels: Mutex::new(HashMap::new()),
            last_signers: std::sync::Mutex::new(Vec::new()),
        })
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
                            // use. Only a ping or an info request is repeated on a fresh one:
                            // other requests may have reached the signer and must not be sent
                            // twice.
                            Err(e) if !matches!(request, Request::Ping | Request::Info) => {
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

    /// Drops every open session (the next call reconnects).
    pub async fn disconnect(&self) {
        self.channels.lock().await.clear();
    }

    /// Runs both FROST rounds for `message` with any t available signers satisfying the
    /// diversity rule, aggregates and verifies. `sign_request` builds each signer's round-2
    /// request (it carries what the signer checks: the batch, or the rotation).
    ///
    /// A signer that refuses is left out and the round is run again with another set: one
    /// signer whose node lags behind the chain head (or that is simply wrong) must not stop the
    /// others from settling. Only when the signers left cannot make a set is the refusal
    /// returned, with every refuser's reason.
    pub async fn sign(
        &self,
        message: &[u8],
        public: &frost::keys::PublicKeyPackage,
        sign_request: impl Fn(B256, frost::SigningPackage) -> Request + Send + Sync,
    ) -> Result<frost::Signature> {
        let mut last_gap = String::new();
        let mut refusals: Vec<(u16, String)> = Vec::new();
        let mut dropped_rounds = 0;
        // Each refusal removes a member, so refused rounds end by themselves; only rounds lost
        // to a signer dropping out are counted.
        while dropped_rounds < ROUND_ATTEMPTS {
            let available: Vec<Member> = self
                .available()
                .await
                .into_iter()
                .filter(|m| !refusals.iter().any(|(i, _)| *i == m.index))
                .collect();
            let Some(chosen) = choose_signers(&available, self.threshold, self.min_operators)
            else {
                if !refusals.is_empty() {
                    return Err(refused(&refusals));
                }
                let operators: BTreeSet<&str> =
                    available.iter().map(|m| m.operator.as_str()).collect();
                return Err(Error::WaitingForSigners {
                    reachable: available.len(),
                    members: self.members.len(),
                    operators: operators.len(),
                    threshold: self.threshold,
                    min_operators: self.min_operators,
                });
            };
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
            let mut dropped = Vec::new();
            let refused_before = refusals.len();
            for (index, answer) in self.call_many(commits, self.limits.io_timeout).await {
                match answer {
                    Ok(Response::Committed(c)) if c.round_id == round_id => {
                        commitments.insert(crate::dkg::identifier(index)?, c.commitments);
                    }
                    Ok(Response::Refused { reason }) => refusals.push((index, reason)),
                    Ok(other) => dropped.push(format!("{index}: unexpected {other:?}")),
                    Err(e) => dropped.push(format!("{index}: {e}")),
                }
            }
            if refusals.len() > refused_before {
                continue;
            }
            if !dropped.is_empty() {
                last_gap = dropped.join("; ");
                dropped_rounds += 1;
                continue;
            }
            let package = frost::SigningPackage::new(commitments, message);
            let signs = chosen
                .iter()
                .map(|i| (*i, sign_request(round_id, package.clone())))
                .collect();
            let mut shares = BTreeMap::new();
            for (index, answer) in self.call_many(signs, Duration::from_secs(30)).await {
                match answer {
                    Ok(Response::Share(s)) if s.round_id == round_id => {
                        shares.insert(crate::dkg::identifier(index)?, s.share);
                    }
                    Ok(Response::Refused { reason }) => refusals.push((index, reason)),
                    Ok(other) => dropped.push(format!("{index}: unexpected {other:?}")),
                    Err(e) => dropped.push(format!("{index}: {e}")),
                }
            }
            // The shares given for this round are spent with its nonces (each signer removed
            // them when it answered); a new round draws fresh ones, so nothing is reused.
            if refusals.len() > refused_before {
                continue;
            }
            if !dropped.is_empty() {
                last_gap = dropped.join("; ");
                dropped_rounds += 1;
                continue;
            }
            // aggregate() checks every share against its verifying share (naming a cheater) and
            // the final signature against the group key (RFC 9591 §5.3).
            let signature = frost::aggregate(&package, &shares, public)?;
            public.verifying_key().verify(message, &signature)?;
            *self.last_signers.lock().unwrap_or_else(|p| p.into_inner()) = chosen.clone();
            return Ok(signature);
        }
        if !refusals.is_empty() {
            last_gap = format!("{last_gap}; {}", refused(&refusals));
        }
        Err(Error::SignersDropping { last_gap })
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
