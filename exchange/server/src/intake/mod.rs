//! Orders in: verify, clear, commit — the path every signed order takes before it is
//! acknowledged, apart from HTTP so that it can be tested and benchmarked on its own.
//!
//! For an intent, cheapest check first:
//! 1. the domain is one of this exchange's chains (its Settlement contract);
//! 2. the order's fields, both signatures present, expiry and deadline against the clock;
//! 3. the EIP-712 signature recovers the account, and the ML-DSA co-signature verifies under the
//!    key bound to that account in the books;
//! 4. the request hashes to the signed `request_hash` ([`request_hash`]): an inference request
//!    (under its kind's key: `request`, `matmul`, `train`), and the kind places its job
//!    ([`crate::orders`]);
//! 5. the model is in the catalog with a shape, the job it makes is cleared (feasibility first,
//!    then the cost with the residency terms), and a bundle was chosen within the buyer's limit;
//! 6. one transaction spends the nonce, holds the bundle's charge on the tab and writes the job.
//!
//! Nothing is written unless every step passed, so a refused order leaves no row and spends no
//! nonce.

mod rent;
mod reserve;
mod reserve_tabs;
mod search;
mod standing;
pub(crate) mod state;

pub use rent::RENT_REPORT_FRESH_S;
pub use reserve::RESERVE_CLAIM_GRACE_S;
pub use search::{MAX_SEARCH_PREFIX_BYTES, SearchPrice};
pub use standing::{
    MAX_RENT_TERM_S, RentSubmission, ReserveSubmission, SearchSubmission, Standing,
    StandingAccepted,
};
pub use state::{Intake, PROVIDER_SILENCE_S};

use crate::books::{JobRecord, NewOrder, Session};
use crate::error::{Error, Result};
use crate::jobs::placement::{Placed, Want, cleared_tier, decision_record, no_match};
use crate::orders::{Placing, WorkloadOrder};
use alloy::primitives::{Address, B256};
use cx_protocol::decision::DecisionRecord;
use cx_protocol::each_workload;
use cx_protocol::order::{self, Order, SessionGrant, Signed, Verified};
use cx_protocol::pq::PublicIdentity;
use cx_protocol::wire::Accepted;
use cx_protocol::workload::Workload;
use cx_protocol::{Job, Tier};
use serde::Serialize;

/// Seconds a tab must stay open after a job's deadline, for its receipt to be verified and
/// settled before the buyer may reclaim the escrow.
pub const DEFAULT_SETTLE_MARGIN_S: u64 = 600;

pub use crate::orders::inference::MAX_PROMPT_BYTES;

pub use cx_protocol::order::{InferenceRequest, request_hash};

pub use cx_protocol::wire::IntentSubmission;

impl Intake {
    /// Checks a signed order at `now_s`, cheapest first: its domain is one of ours, its times,
    /// the EIP-712 signature (recovering the account), then the ML-DSA co-signature under the key
    /// the books bound to that account. `within` prefixes the error's field path.
    pub async fn verify<T: Order>(
        &self,
        signed: &Signed<T>,
        now_s: u64,
        within: &str,
    ) -> Result<Verified> {
        let domain = self
            .domain(signed.chain_id)
            .ok_or(Error::UnknownChain(signed.chain_id))?;
        signed
            .order
            .check_times(now_s)
            .map_err(|e| e.within(&format!("{within}.order")))?;
        let verified = signed.recover(domain).map_err(|e| e.within(within))?;
        let key = self.bound_key(verified.account).await?;
        signed
            .check_cosignature(&verified, &key)
            .map_err(|e| e.within(within))?;
        // Counted once both signatures hold: no one spends another account's allowance.
        self.limits.order_from(verified.account)?;
        Ok(verified)
    }

    /// Closes tab `(chain_id, escrow_id)` for new jobs at its buyer's request, so the next batch
    /// settles it: `signature` is the ML-DSA signature of the key bound to `account` over
    /// [`cx_protocol::tab_close::tab_close_message`]. A tab that is not `account`'s answers as
    /// unknown (whose it is stays private).
    pub async fn close_tab(
        &self,
        chain_id: u64,
        escrow_id: u64,
        account: Address,
        signature: &[u8],
    ) -> Result<crate::books::Tab> {
        use cx_protocol::tab_close::{TAB_CLOSE_CONTEXT, tab_close_message};
        let settlement = self
            .domain(chain_id)
            .and_then(|d| d.verifying_contract)
            .ok_or(Error::UnknownChain(chain_id))?;
        let key = self.bound_key(account).await?;
        key.verify(
            TAB_CLOSE_CONTEXT,
            &tab_close_message(chain_id, settlement, escrow_id),
            signature,
        )
        .map_err(|_| cx_protocol::Error::InvalidField {
            field: "mldsa_signature".to_owned(),
            reason: format!(
                "does not verify under the ML-DSA key bound to {account} (sign \"CXC1\" ‖ chain \
                 id ‖ Settlement ‖ escrow id with context cx-tab-close-v1)"
            ),
        })?;
        self.books
            .request_close(chain_id, escrow_id, account)
            .await?
            .ok_or(Error::UnknownTab {
                chain_id,
                escrow_id,
            })
    }

    /// The ML-DSA key bound to `account`, from memory when seen before (a binding never changes:
    /// another key for a bound account is refused), else from the books.
    async fn bound_key(&self, account: Address) -> Result<PublicIdentity> {
        if let Some(key) = self
            .bound
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&account)
        {
            return Ok(key.clone());
        }
        let binding = self
            .books
            .binding(account)
            .await?
            .ok_or(cx_protocol::Error::Unbound {
                account: account.to_string(),
            })?;
        let key = PublicIdentity::from_bytes(&binding.mldsa_key)?;
        let mut bound = self.bound.write().unwrap_or_else(|e| e.into_inner());
        if bound.len() >= state::BOUND_KEYS_CACHED {
            // Bounded memory: start over rather than track recency; the books have them all.
            bound.clear();
        }
        bound.insert(account, key.clone());
        Ok(key)
    }

    /// Verifies, clears and commits one intent at `now_s` (unix seconds).
    pub async fn submit_intent(
        &self,
        submission: &IntentSubmission,
        now_s: u64,
    ) -> Result<Accepted> {
        let signed = &submission.intent;
        let verified = self.verify(signed, now_s, "intent").await?;
        let intent = &signed.order;
        let want = Want {
            model: intent.want.clone(),
            adapter_id: intent.adapter_id,
            deadline_s: intent.deadline_s,
            max_price_wei: intent.max_price_wei,
            min_tier: intent.min_tier,
            determinism: intent.determinism,
            market_limit: intent.market_limit,
            route: None,
            min_quality: 0.0,
        };
        let workload = submission.workload()?;
        // The request's JSON once: hashed against the signed hash, and kept with the order.
        let request = workload.request_value();
        if order::request_value_hash(&request) != intent.request_hash {
            return Err(Error::RequestHashMismatch);
        }
        let placing = Placing {
            account: verified.account,
            now_s,
            tab: Some((signed.chain_id, intent.tab_id)),
        };
        let placed = each_workload!(workload, r => r.place(self, &want, placing).await)?;
        let (bare, mldsa_signature) = NewOrder::split_cosignature(signed);
        let order = NewOrder {
            digest: verified.digest,
            kind: "intent",
            account: verified.account,
            chain_id: signed.chain_id,
            nonce: intent.nonce,
            body: {
                let key = workload.kind().key();
                serde_json::json!({ "intent": bare, key: request })
            },
            mldsa_signature,
            limit_wei: Some(intent.max_price_wei),
        };
        let mut placed = placed;
        let runs = self
            .plan_runs(&mut placed, verified.digest, want.max_price_wei)
            .await?;
        let new_job = placed.new_job(
            verified.digest,
            intent.tab_id,
            workload,
            self.settle_margin_s,
        )?;
        match placed.drawn {
            // The reserve's rest went to a concurrent intent: this one goes to spot.
            Some(drawn)
                if !self
                    .books
                    .accept_drawing(&order, &new_job, &runs, drawn.reserve, drawn.compute_ms)
                    .await? =>
            {
                let spot = Placing {
                    tab: None,
                    ..placing
                };
                let mut placed = each_workload!(workload, r => r.place(self, &want, spot).await)?;
                let runs = self
                    .plan_runs(&mut placed, verified.digest, want.max_price_wei)
                    .await?;
                let new_job = placed.new_job(
                    verified.digest,
                    intent.tab_id,
                    workload,
                    self.settle_margin_s,
                )?;
                self.books.accept_with_runs(&order, &new_job, &runs).await?;
                self.placed(&placed, &runs);
                return Ok(placed.accepted(verified.digest, &runs));
            }
            Some(_) => {}
            None => self.books.accept_with_runs(&order, &new_job, &runs).await?,
        }
        self.placed(&placed, &runs);
        Ok(placed.accepted(verified.digest, &runs))
    }

    /// Work `placed` (and its replicas `runs`) was committed: its bundles' queues count it at
    /// once, and the providers' waiting polls wake.
    fn placed(&self, placed: &Placed, runs: &[crate::books::NewRun]) {
        self.market
            .placed(&placed.bundle_id, placed.terms.compute_s);
        for run in runs {
            let compute_s = run.decision["terms"]["compute_s"].as_f64().unwrap_or(0.0);
            self.market.placed(&run.bundle_id, compute_s);
        }
        self.waiters.work_added();
    }

    /// Verifies and stores a session grant at `now_s`: the bearer of its secret may then spend
    /// from its tab within its cap, until its expiry.
    pub async fn open_session(
        &self,
        signed: &Signed<SessionGrant>,
        now_s: u64,
    ) -> Result<SessionOpened> {
        let verified = self.verify(signed, now_s, "grant").await?;
        let grant = &signed.order;
        let (bare, mldsa_signature) = NewOrder::split_cosignature(signed);
        let order = NewOrder {
            digest: verified.digest,
            kind: "session_grant",
            account: verified.account,
            chain_id: signed.chain_id,
            nonce: grant.nonce,
            body: serde_json::json!({ "grant": bare }),
            mldsa_signature,
            limit_wei: None,
        };
        self.books.open_session(&order, grant).await?;
        Ok(SessionOpened {
            session_id: verified.digest,
            account: verified.account,
            chain_id: signed.chain_id,
            tab_id: grant.tab_id,
            spend_cap_wei: grant.spend_cap_wei,
            expiry_s: grant.expiry_s,
        })
    }

    /// The live session whose bearer secret is `bearer` at `now_s`: unknown, revoked and expired
    /// keys are refused (the same answer for a key that never existed and one of another
    /// exchange, so a probe learns nothing).
    pub async fn authorize(&self, bearer: &str, now_s: u64) -> Result<Session> {
        let hash = SessionGrant::bearer_hash_of(bearer.as_bytes());
        let session = self
            .books
            .session_by_bearer(hash)
            .await?
            .ok_or(Error::UnknownSession)?;
        session.check_live(now_s)?;
        Ok(session)
    }

    /// One call of a session at `now_s`: `want` (the grant's defaults with the call's overrides)
    /// cleared like any intent, held on the session's tab and counted against its cap.
    pub async fn submit_call(
        &self,
        session: &Session,
        want: &Want,
        request: &InferenceRequest,
        now_s: u64,
    ) -> Result<Accepted> {
        // A session's calls are its account's orders, under the same limit.
        self.limits.order_from(session.account)?;
        let spot = crate::orders::Placing {
            account: session.account,
            now_s,
            tab: None,
        };
        let mut placed = self.place(want, request, spot).await?;
        let mut id = [0u8; 32];
        getrandom::fill(&mut id).map_err(|e| Error::Chain(format!("no randomness: {e}")))?;
        let id = B256::from(id);
        let runs = self.plan_runs(&mut placed, id, want.max_price_wei).await?;
        let new_job = placed.new_job(
            id,
            session.grant.tab_id,
            &Workload::Inference(request.clone()),
            self.settle_margin_s,
        )?;
        self.books
            .accept_call_with_runs(session.id, now_s, &new_job, &runs)
            .await?;
        self.placed(&placed, &runs);
        Ok(placed.accepted(id, &runs))
    }

    /// Waits until job `id` reaches a state it never leaves, or until `until` passes; returns
    /// the job as the books then hold it (`None` if there is no such job).
    pub async fn wait(&self, id: B256, until: tokio::time::Instant) -> Result<Option<JobRecord>> {
        let mut changed = self.waiters.subscribe(id);
        loop {
            let Some(job) = self.books.job(id).await? else {
                return Ok(None);
            };
            if job.status.is_terminal() || tokio::time::Instant::now() >= until {
                return Ok(Some(job));
            }
            // A notification, or a poll every few seconds in case one was lost with a lagging
            // receiver (the books are read again either way).
            let poll = (tokio::time::Instant::now() + POLL).min(until);
            let _ = tokio::time::timeout_at(poll, changed.recv()).await;
        }
    }

    /// Places stranded job `job` again, on the engine as it is now (its old bundle has left):
    /// the same model, adapter, request, deadline, tier and class, within the buyer's limit
    /// ([`crate::books::Stranded::limit_wei`]; more than it holds only if its tab has it).
    /// Returns the new bundle, or `None` when it was refunded (no bundle can take it in time).
    pub async fn reclear(
        &self,
        job: &crate::books::Stranded,
        now_s: u64,
    ) -> Result<Option<String>> {
        self.reclear_avoiding(job, now_s, None).await
    }

    /// [`Intake::reclear`], and when `avoid` names a bundle (one whose provider gave the job
    /// up) never onto it or another bundle of its operator: the same provider would give it up
    /// again. A job in a verification group keeps its own placement rule (apart from the group).
    async fn reclear_avoiding(
        &self,
        job: &crate::books::Stranded,
        now_s: u64,
        avoid: Option<&str>,
    ) -> Result<Option<String>> {
        let decided: DecisionRecord = serde_json::from_value(job.decision.clone())?;
        let want = Want::of_stored(
            &job.model,
            job.adapter.as_deref(),
            job.deadline_s,
            job.limit_wei,
            cleared_tier(&decided)?,
            decided.determinism,
        )?;
        let placing = Placing {
            account: job.account,
            now_s,
            tab: None,
        };
        let placed =
            each_workload!(&job.workload, r => r.place_again(self, job.id, &want, placing).await);
        let grouped = self
            .books
            .verification_group(job.id)
            .await?
            .is_some_and(|(_, runs)| runs.len() > 1);
        let placed = match (placed, avoid) {
            (Ok(placed), Some(avoid)) if !grouped => {
                let operator = self.market.operator_of(avoid);
                if placed.bundle_id == avoid
                    || operator.is_some() && self.market.operator_of(&placed.bundle_id) == operator
                {
                    self.clear_avoiding(placed.job, avoid, operator.as_deref(), job.deadline_s)
                } else {
                    Ok(placed)
                }
            }
            (placed, _) => placed,
        };
        let outcome = match placed {
            Ok(placed) if placed.held_wei <= job.limit_wei && placed.bundle_id != job.bundle_id => {
                let moved = self
                    .books
                    .reassign(
                        job.id,
                        &job.bundle_id,
                        &placed.bundle_id,
                        &serde_json::to_value(&placed.decision)?,
                        placed.held_wei,
                    )
                    .await?;
                match moved {
                    crate::books::Reassigned::Moved => {
                        self.placed(&placed, &[]);
                        self.waiters.notify(job.id);
                        Ok(Some(placed.bundle_id))
                    }
                    crate::books::Reassigned::Gone => Ok(None),
                    crate::books::Reassigned::NoFunds => {
                        self.books.refund_stranded(job.id).await?;
                        self.waiters.notify(job.id);
                        Ok(None)
                    }
                }
            }
            Ok(_) | Err(Error::NoMatch { .. }) | Err(Error::Protocol(_)) => {
                self.books.refund_stranded(job.id).await?;
                self.waiters.notify(job.id);
                Ok(None)
            }
            Err(e) => Err(e),
        };
        if grouped && matches!(outcome, Ok(None)) {
            // A refunded run: its group may now need a referee, or a verdict.
            if let Err(err) = self.verify_group(job.id).await {
                tracing::warn!(job = %job.id, error = %format!("{err:#}"), "verification not judged");
            }
        }
        outcome
    }

    /// A provider gives up job `id` it was assigned (it cannot run it: out of memory, input
    /// its model refuses, …), saying why: the reason is the job's `released` event, and the
    /// job is re-cleared at once onto another bundle within the buyer's limit, or refunded —
    /// instead of holding the buyer's money until its deadline. Returns the new bundle, if any.
    pub async fn release(
        &self,
        provider: &crate::books::Provider,
        id: B256,
        reason: &str,
        now_s: u64,
    ) -> Result<Option<String>> {
        let job = self
            .books
            .release(id, provider.key_hash, reason)
            .await?
            .ok_or(Error::UnknownJob)?;
        tracing::info!(job = %id, provider = %provider.key_hash, reason, "released by its provider");
        let from = job.bundle_id.clone();
        self.reclear_avoiding(&job, now_s, Some(&from)).await
    }

    /// Clears `job` (due at `deadline_s`) over the live bundles other than `avoid` and those of
    /// `operator`.
    fn clear_avoiding(
        &self,
        job: Job,
        avoid: &str,
        operator: Option<&str>,
        deadline_s: u64,
    ) -> Result<Placed> {
        let (decision, charge) = self.market.clear_among(&job, |b| {
            b.id != avoid && operator.is_none_or(|o| b.provider != o)
        })?;
        let (Some(bundle_id), Some(terms), Some(held_wei)) =
            (decision.chosen.clone(), decision.terms, charge)
        else {
            return Err(no_match(&decision));
        };
        Ok(Placed {
            decision: decision_record(decision, &job),
            job,
            bundle_id,
            terms,
            held_wei,
            deadline_s,
            drawn: None,
        })
    }

    /// Clears `job` (for `want`) at its tier, and only when no bundle takes it there at each
    /// tier of `stronger` above it in turn.
    pub(crate) fn clear_placed(
        &self,
        mut job: Job,
        want: &Want,
        stronger: &[Tier],
    ) -> Result<Placed> {
        // `min_tier` is the lowest tier the buyer accepts: cleared at it first, and only when no
        // bundle takes the job there at each stronger tier in turn (dearer to verify, never
        // weaker than asked). The refusal explains the buyer's own tier.
        self.market.arrived(&job, now_s());
        let (decision, charge, quote) = self.clear_quoted(&job, want)?;
        let (decision, charge, quote) = if decision.chosen.is_some() {
            (decision, charge, quote)
        } else {
            let mut found = None;
            for tier in stronger.iter().copied().filter(|t| *t > job.tier) {
                let stronger = Job {
                    tier,
                    ..job.clone()
                };
                let (d, c, q) = self.clear_quoted(&stronger, want)?;
                if d.chosen.is_some() {
                    job = stronger;
                    found = Some((d, c, q));
                    break;
                }
            }
            match found {
                Some(cleared) => cleared,
                None => return Err(no_match(&decision)),
            }
        };
        let (Some(bundle_id), Some(terms), Some(held_wei)) =
            (decision.chosen.clone(), decision.terms, charge)
        else {
            return Err(no_match(&decision));
        };
        let mut decision = decision_record(decision, &job);
        decision.quote = quote.map(|q| cx_protocol::decision::QuotedLimit {
            bid_wei_per_s: q.quote.bid_wei_per_s,
            ask_wei_per_s: q.quote.ask_wei_per_s,
            regime: q.quote.regime.to_string(),
            tenant_log_multiplier: q.log_multiplier,
        });
        Ok(Placed {
            decision,
            job,
            bundle_id,
            terms,
            held_wei,
            deadline_s: want.deadline_s,
            drawn: None,
        })
    }

    /// [`Market::clear`](crate::market::Market::clear) of `job`, under the market's quote for it
    /// (through its buyer's preference, which the outcome then teaches) when `want` left its
    /// limit to the market (a market with no quote yet is refused, naming `max_price_wei`: there
    /// is nothing to price the order at).
    fn clear_quoted(
        &self,
        job: &Job,
        want: &Want,
    ) -> Result<(
        cx_exchange::clearing::Decision,
        Option<u128>,
        Option<crate::market::Quoted>,
    )> {
        let quote = if want.market_limit {
            let quote =
                self.market
                    .quote_for(job)?
                    .ok_or_else(|| cx_protocol::Error::InvalidField {
                        field: "max_price_wei".to_owned(),
                        reason: format!(
                            "no market quote for {} at {} yet (no live bundle offers it): give a \
                         limit in wei",
                            job.base_model, job.tier
                        ),
                    })?;
            Some(quote)
        } else {
            None
        };
        let (decision, charge) = self.market.clear(job, quote.as_ref().map(|q| &q.quote))?;
        if let Some(quoted) = &quote {
            self.market.learn(job, quoted, &decision);
        }
        Ok((decision, charge, quote))
    }
}

/// How long a waiter sleeps at most between reads of the books.
const POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// What a stored session grant allows.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SessionOpened {
    /// The session's id (the grant's EIP-712 digest).
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub session_id: B256,
    /// The account that signed it.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    pub account: Address,
    /// The chain of its tab.
    pub chain_id: u64,
    /// The tab it spends from.
    pub tab_id: u64,
    /// What all its calls together may spend, wei.
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    pub spend_cap_wei: u128,
    /// When the bearer token stops working, unix seconds.
    pub expiry_s: u64,
}

/// The exchange's clock, unix seconds: expiries and deadlines are judged against it.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
