//! The settlement loop: tabs that take no more jobs go, whole, to the committee's coordinator
//! (`cx-settlement`), which batches them per chain, has t of n signers check and FROST-sign each
//! batch, and posts it exactly once (outbox in PostgreSQL, the same database as the books).
//!
//! Each job goes as a [`Voucher`]: the buyer's signed order (its intent, the session grant the
//! call was made under, or the search with its witness), the exchange's assignment of it to the provider who ran it, and
//! that provider's signed receipt — the chain every signer checks on its own before it pays.
//! The assignment is signed again here for what the job was charged (at most the price the
//! provider was assigned; the same terms otherwise), so the voucher states what is paid.
//!
//! Batches are cut by size (the coordinator's part limit), by age (`max_age_s` after the first
//! tab waits) and by count (`min_jobs` waiting); every tab that closes is in the next cut. A
//! batch the committee refuses is given up and the jobs that at least t signers' refusals name
//! are taken out of settlement (their tabs settle without them), so one bad voucher never stops
//! the rest — and one lying signer never takes a job out (a job fewer than t name stays, and the
//! batch is asked again).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloy::primitives::Address;
use cx_contracts::ChainDeployment;
use cx_protocol::assignment::{Assignment, SignedAssignment};
use cx_protocol::order::binding::Binding;
use cx_protocol::order::request_value_hash;
use cx_protocol::pq::Identity;
use cx_protocol::receipt::SignedReceipt;
use cx_protocol::voucher::{Authority, Voucher};
use cx_settlement::Refusal;
use cx_settlement::config::{MarketTerms, Member};
use cx_settlement::coordinator::{Committee, Coordinator, EvmChain, PgStore, Store};
use cx_settlement::ledger::Fee;
use cx_settlement::onchain::ChainView;
use cx_settlement::slash::{SlashEvidence, SlashPolicy};
use serde::{Deserialize, Serialize};

use crate::books::{Books, PaidJob};
use crate::error::{Error, Result};

/// How `cx serve` reaches its committee and pays for posting (`--settlement FILE`, JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettlementConfig {
    /// The coordinator's ML-DSA identity seed file (0600), whose key every signer pins.
    pub coordinator_identity: PathBuf,
    /// Every signer of the committee (index, address, ML-DSA key, operator, region).
    pub committee: Vec<Member>,
    /// Signers per signature, t.
    pub threshold: u16,
    /// Distinct operators among them, at least.
    pub min_operators: usize,
    /// The exchange's fee (the same terms each signer pins).
    pub fee: Fee,
    /// File holding the hex secp256k1 key that pays for posting batches (0600). It moves no
    /// funds: only the committee's signature settles.
    pub poster_key_file: PathBuf,
    /// When a batch is cut.
    #[serde(default)]
    pub batching: Batching,
    /// What a slash takes and who receives it: the same terms each signer pins (default: 10x
    /// the accused job's price, burnt). Signers refuse a slash on any other terms.
    #[serde(default)]
    pub slash: SlashPolicy,
}

/// When waiting tabs are cut into a batch: as soon as `min_jobs` jobs wait, or `max_age_s` after
/// the first of them began to wait.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batching {
    /// Seconds the first waiting job waits at most.
    pub max_age_s: u64,
    /// Jobs waiting that cut a batch at once.
    pub min_jobs: usize,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            max_age_s: 5,
            min_jobs: 200,
        }
    }
}

impl SettlementConfig {
    /// Reads a configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Settlement(format!("cannot read {}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| Error::Settlement(format!("{}: {e}", path.display())))
    }
}

/// The loop's state: the coordinator over the books' pool, and what it signs vouchers with.
pub struct Settler {
    books: Books,
    coordinator: Coordinator<PgStore, EvmChain, Committee>,
    exchange: Arc<Identity>,
    settle_margin_s: u64,
    batching: Batching,
    waiting_since: Mutex<Option<Instant>>,
    /// Signers per signature, t: how many must name a job in their refusals to drop it.
    threshold: u16,
    /// What a slash takes and who receives it (the committee's market terms).
    slash: SlashPolicy,
}

impl std::fmt::Debug for Settler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Settler({:?})", self.coordinator)
    }
}

/// What `Escrow.claim` takes for one account on one chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Claim {
    /// The chain.
    pub chain_id: u64,
    /// The account credited.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    pub account: Address,
    /// Everything ever credited to it on this chain, wei (`Escrow.claim` pays the difference
    /// to what it already withdrew).
    pub cumulative_wei: String,
    /// Sibling hashes from its leaf to the chain's balances root.
    #[schema(value_type = Vec<String>)]
    pub proof: Vec<alloy::primitives::B256>,
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Tabs that stopped taking jobs.
    pub closed: u64,
    /// Tabs handed to the coordinator.
    pub submitted: usize,
    /// The batch cut and posted, if any.
    pub batch: Option<i64>,
    /// Jobs now settled on chain.
    pub settled: usize,
    /// Slashes the committee signed and that landed on chain.
    pub slashed: usize,
}

/// How long a slash signature stays valid on chain, seconds.
pub const SLASH_VALIDITY_S: u64 = 3_600;

/// Slashes tried per pass.
const SLASHES_PER_PASS: i64 = 8;

impl Settler {
    /// The settler of an exchange whose identity is `exchange`, settling on `chains` under
    /// `config`. Tabs close `settle_margin_s` before their deadline (the margin every hold
    /// leaves after its job's deadline).
    pub fn new(
        books: Books,
        config: &SettlementConfig,
        chains: &[ChainDeployment],
        exchange: Arc<Identity>,
        settle_margin_s: u64,
    ) -> Result<Self> {
        let s = |e: cx_settlement::Error| Error::Settlement(e.to_string());
        let coordinator_identity =
            cx_settlement::keyfile::load_or_create_identity(&config.coordinator_identity)
                .map_err(s)?;
        let poster = read_poster_key(&config.poster_key_file)?;
        let committee = Committee::new(
            Arc::new(coordinator_identity),
            config.committee.clone(),
            config.threshold,
            config.min_operators,
        )
        .map_err(s)?;
        let mut evm = Vec::with_capacity(chains.len());
        for chain in chains {
            let view = ChainView::connect(chain).map_err(s)?;
            // The poster's offers in the books: a restarted exchange knows what holds its nonce.
            let book = cx_settlement::evm::offers::OfferBook::new(books.pool().clone());
            evm.push(
                EvmChain::new(view, poster.clone())
                    .map_err(s)?
                    .with_book(book),
            );
        }
        config
            .slash
            .validate()
            .map_err(|e| Error::Settlement(format!("settlement config: slash: {e}")))?;
        let market = MarketTerms {
            exchange_key: exchange.public().to_bytes().to_vec(),
            fee: config.fee,
            slash: config.slash,
        };
        let coordinator =
            Coordinator::new(PgStore::new(books.pool().clone()), committee, evm, &market)
                .map_err(s)?;
        Ok(Self {
            books,
            coordinator,
            exchange,
            settle_margin_s,
            batching: config.batching,
            // Whatever a previous process left pending waits one `max_age_s` from now.
            waiting_since: Mutex::new(Some(Instant::now())),
            threshold: config.threshold,
            slash: config.slash,
        })
    }

    /// The coordinator (claims, its store).
    pub fn coordinator(&self) -> &Coordinator<PgStore, EvmChain, Committee> {
        &self.coordinator
    }

    /// Runs [`Settler::pass`] every `every` until `stop` resolves, logging what fails (the next
    /// pass carries on from the outbox).
    pub async fn run(&self, every: Duration, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            if let Err(err) = self.pass(crate::intake::now_s()).await {
                tracing::warn!("settlement pass: {err}");
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// One pass at `now_s`: close tabs that are due, hand ready ones to the coordinator, cut a
    /// batch when one is due, and record what landed.
    pub async fn pass(&self, now_s: u64) -> Result<Pass> {
        let s = |e: cx_settlement::Error| Error::Settlement(e.to_string());
        let mut pass = Pass {
            closed: self
                .books
                .close_due_tabs(now_s, self.settle_margin_s)
                .await?,
            ..Pass::default()
        };
        for (chain_id, escrow_id) in self.books.tabs_ready_to_settle(64).await? {
            // One tab that cannot go (a corrupt row, a voucher the coordinator refuses) is
            // logged and retried; it never holds up the others.
            match self.submit_tab(chain_id, escrow_id).await {
                Ok(()) => pass.submitted += 1,
                Err(err) => tracing::warn!(chain_id, escrow_id, "tab not submitted: {err}"),
            }
        }
        let pending = self
            .coordinator
            .store()
            .pending_receipts()
            .await
            .map_err(s)?;
        let since = *self.waiting_since.lock().unwrap_or_else(|p| p.into_inner());
        let due = !pending.is_empty()
            && (pending.len() >= self.batching.min_jobs
                || since.is_none_or(|t| t.elapsed().as_secs() >= self.batching.max_age_s));
        if due {
            pass.batch = match self.coordinator.run_once().await {
                Err(cx_settlement::Error::Refused { refusals }) => {
                    self.drop_refused(&refusals).await?;
                    None
                }
                other => other.map_err(s)?,
            };
            let left = self
                .coordinator
                .store()
                .pending_receipts()
                .await
                .map_err(s)?;
            *self.waiting_since.lock().unwrap_or_else(|p| p.into_inner()) =
                (!left.is_empty()).then(Instant::now);
        } else if pending.is_empty() {
            // Finish what an earlier pass signed but could not post.
            self.coordinator.resume().await.map_err(s)?;
        }
        pass.settled = self.books.record_settled().await?.len();
        pass.slashed = self.post_slashes().await?;
        Ok(pass)
    }

    /// Has the committee sign and post the slashes verification found (each signer checks the
    /// evidence on its own), on the market's slash terms: a bounded multiple of the accused
    /// job's price, paid to the account the terms name (never the buyer: a buyer able to outvote
    /// an honest provider must gain nothing by it);
    /// records each transaction as a `slashed` event of the accused job. A slash the committee
    /// or the chain refuses is retried with backoff for as long as the accused could still
    /// answer for it ([`crate::books::SLASH_RETRY_HORIZON_S`]), then given up with its
    /// reason.
    async fn post_slashes(&self) -> Result<usize> {
        let mut posted = 0;
        for slash in self.books.pending_slashes(SLASHES_PER_PASS).await? {
            let evidence: cx_settlement::slash::SlashEvidence =
                match serde_json::from_value(slash.evidence.clone()) {
                    Ok(e) => e,
                    Err(err) => {
                        self.books
                            .slash_given_up(slash.evidence_hash, &err.to_string())
                            .await?;
                        continue;
                    }
                };
            if !matches!(evidence, SlashEvidence::ReplicaDisagreement { .. }) {
                continue;
            }
            let (amount, recipient) = match self.slash.terms(&evidence) {
                Ok(terms) => terms,
                Err(err) => {
                    self.books.slash_given_up(slash.evidence_hash, &err).await?;
                    continue;
                }
            };
            match self
                .coordinator
                .slash(&evidence, amount, recipient, SLASH_VALIDITY_S)
                .await
            {
                Ok((_, tx)) => {
                    tracing::info!(job = %slash.job_id, %tx, provider = %evidence.provider(), "slashed");
                    self.books.slash_posted(&slash, tx).await?;
                    posted += 1;
                }
                Err(err) => {
                    tracing::warn!(job = %slash.job_id, attempts = slash.attempts + 1, "slash not posted: {err}");
                    self.books
                        .slash_attempt_failed(slash.evidence_hash, &err.to_string())
                        .await?;
                }
            }
        }
        Ok(posted)
    }

    /// Hands tab `(chain_id, escrow_id)` to the coordinator: every job it paid, as vouchers.
    async fn submit_tab(&self, chain_id: u64, escrow_id: u64) -> Result<()> {
        let jobs = self.books.paid_jobs(chain_id, escrow_id).await?;
        // A tab is one buyer's: its binding (both halves, as the buyer sent them) rides in each
        // voucher, so every signer checks the order's ML-DSA co-signature itself.
        let mut bindings: HashMap<Address, Binding> = HashMap::new();
        for job in &jobs {
            if let std::collections::hash_map::Entry::Vacant(slot) = bindings.entry(job.buyer) {
                let stored = self.books.binding(job.buyer).await?.ok_or(Error::Corrupt {
                    what: "a paid job's buyer binding",
                    value: format!("account {} has no key binding", job.buyer),
                })?;
                slot.insert(serde_json::from_value(stored.binding)?);
            }
        }
        let vouchers = jobs
            .iter()
            .map(|job| self.voucher(chain_id, escrow_id, job, &bindings[&job.buyer]))
            .collect::<Result<Vec<_>>>()?;
        if !vouchers.is_empty() {
            self.coordinator
                .submit(&vouchers)
                .await
                .map_err(|e| Error::Settlement(e.to_string()))?;
            self.waiting_since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(Instant::now);
        }
        self.books
            .mark_tab_submitted(chain_id, escrow_id, vouchers.len())
            .await
    }

    /// The committee refused the batch being signed. The jobs at least t signers' refusals name
    /// (a provider whose key is no longer registered, say) are taken out of settlement with the
    /// reasons — their tabs settle without them, the buyer credited what they held — and the
    /// batch is given up, so the next one settles the rest.
    ///
    /// A reason is only its signer's word, and a job dropped is a provider's pay lost, so fewer
    /// than t refusals naming a job do not drop it: t is the committee's own trust assumption
    /// (any t sign, so fewer than t are taken to lie). Such a job, and a refusal that names no
    /// job, is logged and the batch left to be asked again: the committee leaves the refusers out
    /// when it can still form a set without them.
    async fn drop_refused(&self, refusals: &[Refusal]) -> Result<()> {
        let s = |e: cx_settlement::Error| Error::Settlement(e.to_string());
        for refusal in refusals {
            tracing::warn!(
                signer = refusal.signer,
                "a signer refused a batch: {}",
                refusal.reason
            );
        }
        let (agreed, disputed) = jobs_named(refusals, self.threshold);
        for (job, signers) in &disputed {
            tracing::warn!(
                job = %hex::encode(job),
                ?signers,
                threshold = self.threshold,
                "named by fewer signers than the threshold: the job stays, the batch is asked again"
            );
        }
        if agreed.is_empty() {
            return Ok(());
        }
        let store = self.coordinator.store();
        let Some(batch_id) = store
            .unfinished()
            .await
            .map_err(s)?
            .first()
            .map(|p| p.batch_id)
        else {
            return Ok(());
        };
        let why = |signers: &[u16]| {
            let reasons = refusals
                .iter()
                .filter(|r| signers.contains(&r.signer))
                .map(|r| format!("signer {}: {}", r.signer, r.reason))
                .collect::<Vec<_>>();
            format!("refused by signers {signers:?}: {}", reasons.join(" | "))
        };
        let all: Vec<u16> = agreed.iter().flat_map(|(_, s)| s.iter().copied()).collect();
        self.coordinator
            .abandon(batch_id, &why(&all))
            .await
            .map_err(s)?;
        for (job, signers) in &agreed {
            self.coordinator
                .reject(*job, &why(signers))
                .await
                .map_err(s)?;
        }
        Ok(())
    }

    /// The voucher of `job` on tab `(chain_id, escrow_id)`.
    fn voucher(
        &self,
        chain_id: u64,
        escrow_id: u64,
        job: &PaidJob,
        binding: &Binding,
    ) -> Result<Voucher> {
        let corrupt = |what: &'static str| Error::Corrupt {
            what,
            value: job.job_id.to_string(),
        };
        let receipt: SignedReceipt = serde_json::from_value(job.receipt.clone())?;
        let order =
            |key: &str, what: &'static str| job.order.get(key).cloned().ok_or(corrupt(what));
        // What the assignment names as the job's input: the request's hash, or for a search, a
        // reserve's take-or-pay or a rent's term the order's digest (its job id).
        let (authority, input_hash) = match job.kind.as_str() {
            "intent" | "session_grant" => {
                // The stored request's canonical hash, whatever its kind (inference, product).
                let request = job.request.clone().ok_or(corrupt("a job's request"))?;
                let authority = if job.kind == "intent" {
                    Authority::Intent(serde_json::from_value(order("intent", "an intent order")?)?)
                } else {
                    Authority::Session(serde_json::from_value(order("grant", "a session order")?)?)
                };
                // A verification run is paid under the order of the job it verifies.
                let authority = match job.verifies {
                    Some((original, run)) => Authority::Verification {
                        of: Box::new(authority),
                        original,
                        run,
                    },
                    None => authority,
                };
                (authority, request_value_hash(&request).0)
            }
            "search" => {
                let witness = job
                    .decision
                    .get("witness")
                    .and_then(serde_json::Value::as_u64)
                    .ok_or(corrupt("a search's witness"))?;
                let authority = Authority::Search {
                    order: serde_json::from_value(order("search", "a search order")?)?,
                    witness,
                };
                (authority, job.job_id.0)
            }
            "reserve" => (
                Authority::Reserve(serde_json::from_value(order(
                    "reserve",
                    "a reserve order",
                )?)?),
                job.job_id.0,
            ),
            // Each holder's term is a job of its own; its input is the rent's digest.
            "rent" => (
                Authority::Rent(serde_json::from_value(order("rent", "a rent order")?)?),
                job.order_digest.0,
            ),
            _ => return Err(corrupt("an order kind")),
        };
        let assignment = SignedAssignment::sign(
            Assignment {
                job_id: job.job_id.0,
                chain_id,
                escrow_id,
                buyer: job.buyer.0.0,
                provider_key: job.provider_key_hash.0,
                price_wei: job.charged_wei,
                deadline_s: job.deadline_s,
                input_hash,
                adapter_hash: crate::jobs::dispatch::adapter_hash(job.adapter.as_deref())?,
            },
            &self.exchange,
        )?;
        Ok(Voucher {
            authority,
            binding: binding.clone(),
            assignment,
            receipt,
        })
    }

    /// `account`'s cumulative credit on `chain_id` and its Merkle proof against the chain's
    /// balances root (what `Escrow.claim` takes); `None` when no batch on that chain credited it.
    pub async fn claim(&self, chain_id: u64, account: Address) -> Result<Option<Claim>> {
        match self.coordinator.claim_proof(chain_id, account).await {
            Ok((cumulative_wei, proof)) => Ok(Some(Claim {
                chain_id,
                account,
                cumulative_wei: cumulative_wei.to_string(),
                proof,
            })),
            Err(
                cx_settlement::Error::NoBatchYet { .. }
                | cx_settlement::Error::PartyNotInTree { .. },
            ) => Ok(None),
            Err(e) => Err(Error::Settlement(e.to_string())),
        }
    }
}

/// The jobs `refusals` name with the signers naming each, split into those at least `threshold`
/// distinct signers name (to drop) and the rest (one signer's claim, or fewer than t agreeing).
/// Each signer counts once per job however often it names it.
type Named = Vec<([u8; 32], Vec<u16>)>;
fn jobs_named(refusals: &[Refusal], threshold: u16) -> (Named, Named) {
    let mut by_job: std::collections::BTreeMap<[u8; 32], Vec<u16>> = Default::default();
    for refusal in refusals {
        for job in named_jobs(&refusal.reason) {
            let signers = by_job.entry(job).or_default();
            if !signers.contains(&refusal.signer) {
                signers.push(refusal.signer);
            }
        }
    }
    by_job
        .into_iter()
        .partition(|(_, signers)| signers.len() >= usize::from(threshold))
}

/// The job ids one refusal names (`… of job <64 hex digits>: …`).
fn named_jobs(reason: &str) -> Vec<[u8; 32]> {
    let mut out = Vec::new();
    for (at, _) in reason.match_indices("job ") {
        let hex_id = reason[at + 4..]
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect::<String>();
        let mut id = [0u8; 32];
        if hex_id.len() == 64
            && hex::decode_to_slice(&hex_id, &mut id).is_ok()
            && !out.contains(&id)
        {
            out.push(id);
        }
    }
    out
}

/// The poster's key: one line of hex (a `0x` prefix allowed), in a file only its owner reads.
fn read_poster_key(path: &Path) -> Result<alloy::signers::local::PrivateKeySigner> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Settlement(format!("cannot read {}: {e}", path.display())))?;
    text.trim()
        .parse()
        .map_err(|_| Error::Settlement(format!("{}: not a hex secp256k1 key", path.display())))
}

#[cfg(test)]
mod tests {
    use cx_settlement::Refusal;

    fn refusal(signer: u16, jobs: &[[u8; 32]]) -> Refusal {
        let reason = jobs
            .iter()
            .map(|j| {
                format!(
                    "receipt of job {}: provider 0x11 has not registered key",
                    hex::encode(j)
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        Refusal { signer, reason }
    }

    /// What broke: the refusal's text was scanned for job ids whoever wrote it, so one lying
    /// signer naming a job took it out of settlement for good and its provider was never paid.
    /// A job is dropped only when at least t signers' refusals name it.
    #[test]
    fn one_lying_signer_cannot_drop_a_job_from_settlement() {
        let (good, bad) = ([0xab; 32], [0x0c; 32]);
        // 3 of 5: signer 1 lies about `good` (and names it twice); 2 and 3 name `bad`.
        let refusals = [
            refusal(1, &[good, good]),
            refusal(2, &[bad]),
            refusal(3, &[bad]),
        ];
        let (agreed, disputed) = super::jobs_named(&refusals, 3);
        assert!(agreed.is_empty(), "{agreed:?}");
        assert_eq!(disputed, vec![(bad, vec![2, 3]), (good, vec![1])]);
        // A third signer naming `bad` makes t: it goes; the liar's job still stays.
        let refusals = [
            refusals[0].clone(),
            refusals[1].clone(),
            refusals[2].clone(),
            refusal(4, &[bad]),
        ];
        let (agreed, disputed) = super::jobs_named(&refusals, 3);
        assert_eq!(agreed, vec![(bad, vec![2, 3, 4])]);
        assert_eq!(disputed, vec![(good, vec![1])]);
        // The same signer repeating itself is one voice.
        let refusals = [
            refusal(1, &[good]),
            refusal(1, &[good]),
            refusal(1, &[good]),
        ];
        assert!(super::jobs_named(&refusals, 3).0.is_empty());
    }

    #[test]
    fn a_refusal_names_its_jobs() {
        let a = "ab".repeat(32);
        let b = "0c".repeat(32);
        let reason = format!(
            "receipt of job {a}: provider 0x11 has not registered key 0x22; voucher of job {b}: \
             broken | signer 2: receipt of job {a}: same; job 1234 is too short"
        );
        let named = super::named_jobs(&reason);
        assert_eq!(named, vec![[0xab; 32], [0x0c; 32]]);
    }
}
