//! Verification by tier (SPEC §7): T0 stake only, T1 agreement with a second provider (byte
//! equality for class D, the D∞ tolerance for class D∞), T2 Freivalds spot checks
//! (`cx-kernels`), T3 diverse majority. A receipt is paid only after its tier's check has passed.
//!
//! This module judges replication (T1 for classes D and D∞, T3 for any class); where the runs
//! go is `replicas.rs`'s:
//! - **At intake** (`Intake::plan_runs`) a job that needs runs gets them placed
//!   with it, each on a bundle of a provider not yet running the job (T1 prefers another
//!   operator, T3 requires distinct operators), priced by the engine within what the buyer's
//!   limit leaves after the job and the runs before it. The job, its runs and the tab hold of
//!   all of them are one transaction; when the fleet cannot place them the order is refused
//!   (`no_replica`, `no_diverse_committee`, field `min_tier`). A run's id is derived from the
//!   job's ([`cx_protocol::replica::run_job_id`]).
//! - **On each result** of the group ([`crate::intake::Intake::verify_group`]) the results are
//!   compared ([`judge`], [`Agreement`]): the output hashes of the signed receipts for classes D
//!   and S, the outputs' tokens within [`cx_protocol::tolerance`] for D∞ (a D∞ run may go to a
//!   D provider too: bit-exact output is within any tolerance); two agreeing decide; a T1 pair that
//!   disagrees (or a run that never answered) gets one more run — the referee — on a provider
//!   not yet in the group, priced within what the limit still leaves; with every run in and no
//!   two agreeing, nobody is paid (all refunded).
//! - **The verdict** is applied in one transaction: runs whose output is the majority's are
//!   `done` (paid), the outvoted `failed` (hold returned, never paid, counted in the observed
//!   failure rate φ), runs still out `cancelled`; the buyer's job carries the majority's output
//!   (its own provider may have been outvoted), and each run gets a `verified` or
//!   `verification_failed` event with `{tier, method: "replica", passed, runs, cost_wei,
//!   check_ms}`. `cost_wei` is what verification added to the buyer's bill (the paid runs
//!   besides the one whose output is delivered); `check_ms` the time from the first result to
//!   the verdict. For class D (never D∞) the outvoted receipt and the majority's are
//!   [`cx_settlement::slash::SlashEvidence::ReplicaDisagreement`], queued for the committee
//!   (the settlement loop has it signed and posted, and records the transaction as a `slashed`
//!   event).
//! - **By the deadline**, a group without a verdict is refunded by the deadline sweep like any
//!   unfinished job: nobody is paid.
//!
//! The buyer waiting on a replicated job is answered once the verdict is in: `verifying` is not
//! a terminal state.

use crate::books::{JobStatus, RunRecord, Verdict};
use crate::error::{Error, Result};
use crate::intake::Intake;
use alloy::primitives::B256;
use cx_protocol::decision::DecisionRecord;
use cx_protocol::receipt::SignedReceipt;
use cx_protocol::replica::MAX_RUNS;
use cx_protocol::tolerance::{d_inf_agree, words};
use cx_protocol::{DeterminismClass, Tier};
use cx_settlement::slash::SlashEvidence;
use std::collections::HashSet;

/// How many verification runs a job of `tier` and `class` needs besides itself: T1 re-executes
/// class-D work once (judged by byte equality) and class-D∞ work once (judged within the
/// tolerance of [`cx_protocol::tolerance`]); a sampled (S) output has nothing to agree with, so
/// T1 does not replicate it. T3 runs any class twice more.
pub fn runs_needed(tier: Tier, class: DeterminismClass) -> usize {
    match (tier, class) {
        (Tier::T3, _) => 2,
        (Tier::T1, DeterminismClass::D | DeterminismClass::DInf) => 1,
        _ => 0,
    }
}

/// Results that must agree for a verdict: two, whichever tier, of distinct on-chain identities.
///
/// An identity is the payout account a receipt names (the exchange accepts a receipt only when
/// it is the provider's registered payout, and admits a provider only when that account has
/// its key registered and its stake in `ProviderRegistry`). ML-DSA keys and the `operator`
/// strings of offers cost nothing to make: counting them, one party with two keys could outvote
/// an honest third and have it failed and slashed.
const QUORUM: usize = 2;

/// How two runs of a group are compared, by the class the job was cleared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// Equal signed output hashes (class D; class S, which only T3 replicates).
    Bytes,
    /// Within the D∞ tolerance of [`cx_protocol::tolerance`] on the outputs' tokens (class D∞).
    Tolerance,
}

impl Agreement {
    /// How runs of a job of `class` are compared.
    pub fn of(class: DeterminismClass) -> Self {
        match class {
            DeterminismClass::DInf => Self::Tolerance,
            DeterminismClass::D | DeterminismClass::S => Self::Bytes,
        }
    }

    /// The name the verification events carry.
    fn name(self) -> &'static str {
        match self {
            Self::Bytes => "output_hash",
            Self::Tolerance => "d_inf_tolerance",
        }
    }

    /// Whether the results of runs `a` and `b` (both with a receipt) agree.
    fn agree(self, a: &RunRecord, b: &RunRecord) -> bool {
        let equal = matches!((output_hash(a), output_hash(b)), (Some(x), Some(y)) if x == y);
        match self {
            Self::Bytes => equal,
            Self::Tolerance => equal || within_tolerance(a, b),
        }
    }
}

/// Whether two D∞ runs' outputs agree within the tolerance ([`cx_protocol::tolerance`]): on
/// their token ids where both results report them, else on the words of their texts. Token ids
/// are not covered by the receipt (it signs the text's hash) and the text is what the buyer is
/// given, so where ids are compared the texts must agree as well: a run cannot pass with the
/// right ids beside another text. A result without a text agrees with nothing.
fn within_tolerance(a: &RunRecord, b: &RunRecord) -> bool {
    let (Some(a), Some(b)) = (a.result.as_ref(), b.result.as_ref()) else {
        return false;
    };
    let (Some(a_words), Some(b_words)) = (text_words(a), text_words(b)) else {
        return false;
    };
    let words_agree = d_inf_agree(&a_words, &b_words);
    match (token_ids(a), token_ids(b)) {
        (Some(a_ids), Some(b_ids)) => words_agree && d_inf_agree(&a_ids, &b_ids),
        _ => words_agree,
    }
}

/// The words of a result's `text`, if it has one.
fn text_words(result: &serde_json::Value) -> Option<Vec<&str>> {
    result.get("text")?.as_str().map(words)
}

/// A result's `token_ids` (the generated tokens' ids), when it reports them all as `u32`s.
fn token_ids(result: &serde_json::Value) -> Option<Vec<u32>> {
    result
        .get("token_ids")?
        .as_array()?
        .iter()
        .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect()
}

/// What the results of a group say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// A verdict was applied already (or every run ended without a result): nothing to do.
    Settled,
    /// Runs are still out and no output has a quorum yet.
    Wait,
    /// At least [`QUORUM`] results agree: these runs (by run number, ascending) are the
    /// agreeing group.
    Decided(Vec<u8>),
    /// Every run is in (or gone) and none agree: one more run may decide, if one is left.
    AnotherRun,
    /// Every run is in and no more can be placed: no majority.
    NoMajority,
}

/// The output hash of a run's signed receipt, once its result is in.
fn output_hash(run: &RunRecord) -> Option<[u8; 32]> {
    receipt(run).map(|r| r.receipt.output_hash)
}

fn receipt(run: &RunRecord) -> Option<SignedReceipt> {
    run.receipt
        .as_ref()
        .and_then(|r| serde_json::from_value(r.clone()).ok())
}

/// Judges a group (the verified job and its runs, any order) by the results that are in
/// (`verifying`), compared as `agreement` says: pure, so every rule is tested without a
/// database.
///
/// The results are grouped in run order: each joins the first group whose *first* run it
/// agrees with, else starts a group of its own. For byte equality that is grouping by output
/// hash; within a tolerance, which is not transitive, it makes the groups one function of the
/// results (a run between two others joins the earlier one's group). The first group, in that
/// order, holding results of [`QUORUM`] distinct on-chain identities decides.
pub fn judge(runs: &[RunRecord], agreement: Agreement) -> Judgement {
    if runs
        .iter()
        .any(|r| matches!(r.status, JobStatus::Done | JobStatus::Failed))
    {
        return Judgement::Settled;
    }
    // Each result in with the on-chain identity its receipt names, in run order.
    let mut results: Vec<(&RunRecord, [u8; 20])> = runs
        .iter()
        .filter(|r| r.status == JobStatus::Verifying)
        .filter_map(|r| receipt(r).map(|s| (r, s.receipt.provider)))
        .collect();
    results.sort_by_key(|(r, _)| r.run);
    let mut groups: Vec<Vec<(&RunRecord, [u8; 20])>> = Vec::new();
    for result in results.iter().copied() {
        match groups
            .iter_mut()
            .find(|g| agreement.agree(g[0].0, result.0))
        {
            Some(group) => group.push(result),
            None => groups.push(vec![result]),
        }
    }
    let pending = runs.iter().any(|r| r.status.is_open());
    if let Some(group) = groups.iter().find(|g| {
        let identities: HashSet<[u8; 20]> = g.iter().map(|(_, identity)| *identity).collect();
        identities.len() >= QUORUM
    }) {
        return Judgement::Decided(group.iter().map(|(r, _)| r.run).collect());
    }
    if pending {
        return Judgement::Wait;
    }
    if results.is_empty() {
        return Judgement::Settled;
    }
    if runs.len() <= usize::from(MAX_RUNS) {
        Judgement::AnotherRun
    } else {
        Judgement::NoMajority
    }
}

/// What the buyer's order allows and what the group was cleared for, from the verified job's
/// stored decision.
pub(crate) struct Terms {
    pub(crate) tier: Tier,
    pub(crate) determinism: DeterminismClass,
    pub(crate) limit_wei: u128,
}

fn terms(decision: &serde_json::Value) -> Result<Terms> {
    let d: DecisionRecord = serde_json::from_value(decision.clone())?;
    let tier = crate::jobs::placement::cleared_tier(&d)?;
    let limit_wei = match d.limit_wei {
        Some(text) => text.parse().map_err(|_| Error::Corrupt {
            what: "a verification limit",
            value: text,
        })?,
        None => 0,
    };
    Ok(Terms {
        tier,
        determinism: d.determinism,
        limit_wei,
    })
}

impl Intake {
    /// Judges the verification group of job `id` (a replicated job or one of its runs) after a
    /// result came in, and acts: waits, places a referee, or applies the verdict. A verdict that
    /// races another change of the group is judged again on the books as they then are.
    pub async fn verify_group(&self, id: B256) -> Result<Judgement> {
        for _ in 0..4 {
            let Some((head, runs)) = self.books().verification_group(id).await? else {
                return Ok(Judgement::Settled);
            };
            let Some(original) = runs.iter().find(|r| r.run == 0) else {
                return Ok(Judgement::Settled);
            };
            let original_id = original.id;
            let terms = terms(&original.decision)?;
            let judgement = judge(&runs, Agreement::of(terms.determinism));
            let verdict = match &judgement {
                Judgement::Settled | Judgement::Wait => return Ok(judgement),
                Judgement::Decided(agreeing) => decided(&runs, &terms, agreeing),
                Judgement::AnotherRun => {
                    if self.referee(&head, &runs, &terms).await? {
                        self.waiters().work_added();
                        return Ok(judgement);
                    }
                    no_majority(&runs, &terms)
                }
                Judgement::NoMajority => no_majority(&runs, &terms),
            };
            let judged: Vec<B256> = runs.iter().map(|r| r.id).collect();
            if self
                .books()
                .apply_verdict(original_id, &judged, &verdict)
                .await?
            {
                for run in &runs {
                    self.waiters().notify(run.id);
                }
                return Ok(judgement);
            }
        }
        Err(Error::Settlement(format!(
            "the verification of job {id} kept changing under its verdict; the next result or \
             the deadline decides it"
        )))
    }
}

/// The verdict when the runs `agreeing` (run numbers) have a quorum: they are paid, the
/// other results outvoted; pure, so it is tested without a database.
fn decided(runs: &[RunRecord], terms: &Terms, agreeing: &[u8]) -> Verdict {
    let mut verdict = Verdict::default();
    let mut majority = Vec::new();
    for run in runs {
        match run.status {
            JobStatus::Verifying if agreeing.contains(&run.run) => {
                verdict.passed.push(run.id);
                // One receipt per identity: the evidence's majority is distinct providers.
                if let Some(r) = receipt(run)
                    && !majority
                        .iter()
                        .any(|m: &SignedReceipt| m.receipt.provider == r.receipt.provider)
                {
                    majority.push(r);
                }
            }
            JobStatus::Verifying => verdict.failed.push(run.id),
            JobStatus::Assigned | JobStatus::Running => verdict.cancelled.push(run.id),
            _ => {}
        }
    }
    // The output the buyer gets: the original's (run 0) when it is among the agreeing, else
    // the lowest-numbered agreeing run's. Within a D∞ tolerance the agreeing outputs may differ
    // in a token; the original's is the one the buyer's order cleared onto and the one its
    // job's receipt signs, so keeping it leaves the job's result and receipt one pair. Only
    // when it was outvoted is another run's output carried, and the lowest number makes that
    // choice one function of the group.
    let delivered = runs
        .iter()
        .filter(|r| verdict.passed.contains(&r.id))
        .min_by_key(|r| r.run);
    let original = runs.iter().find(|r| r.run == 0);
    if let (Some(original), Some(delivered)) = (original, delivered)
        && delivered.id != original.id
    {
        verdict.result = delivered.result.clone();
    }
    let paid: u128 = runs
        .iter()
        .filter(|r| verdict.passed.contains(&r.id))
        .map(|r| r.held_wei)
        .sum();
    let cost_wei = paid.saturating_sub(delivered.map_or(0, |d| d.held_wei));
    let detail = detail(runs, terms, cost_wei);
    for run in runs {
        let passed = verdict.passed.contains(&run.id);
        if passed || verdict.failed.contains(&run.id) {
            let mut d = detail.clone();
            d["passed"] = passed.into();
            let status = if passed {
                "verified"
            } else {
                "verification_failed"
            };
            verdict.events.push((run.id, status, d));
        }
    }
    // Evidence against each outvoted class-D receipt: the majority's receipts beside it. Only
    // byte equality is slashing evidence: outvoted within a D∞ tolerance (an honest fast run
    // may drift past the bound after one flipped token) a run is not paid, and nothing more.
    if let Some(original) = original
        && Agreement::of(terms.determinism) == Agreement::Bytes
    {
        for run in runs.iter().filter(|r| verdict.failed.contains(&r.id)) {
            let Some(accused) = receipt(run) else {
                continue;
            };
            if accused.receipt.class != DeterminismClass::D
                || terms.determinism != DeterminismClass::D
            {
                continue;
            }
            let evidence = SlashEvidence::ReplicaDisagreement {
                original: original.id,
                accused,
                majority: majority
                    .iter()
                    .take(usize::from(MAX_RUNS))
                    .cloned()
                    .collect(),
            };
            match (evidence.check(), serde_json::to_value(&evidence)) {
                (Ok(()), Ok(json)) => {
                    verdict
                        .slashes
                        .push((evidence.hash(), run.id, evidence.chain_id(), json))
                }
                (Err(why), _) => {
                    tracing::warn!(job = %run.id, %why, "outvoted, but no evidence the committee would take")
                }
                (_, Err(err)) => tracing::warn!(job = %run.id, %err, "evidence not encoded"),
            }
        }
    }
    verdict
}

/// The verification event's detail (`passed` set per run).
fn detail(runs: &[RunRecord], terms: &Terms, cost_wei: u128) -> serde_json::Value {
    let first_ms = runs.iter().filter_map(|r| r.result_at_ms).min();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    serde_json::json!({
        "tier": terms.tier,
        "method": "replica",
        "agreement": Agreement::of(terms.determinism).name(),
        "passed": false,
        "runs": runs
            .iter()
            .map(|r| serde_json::json!({
                "job": r.id.to_string(),
                "run": r.run,
                "provider": r.provider_key_hash.map(|k| k.to_string()),
                "operator": r.operator,
                "status": r.status,
                "output_hash": output_hash(r).map(|h| format!("0x{}", hex::encode(h))),
            }))
            .collect::<Vec<_>>(),
        "cost_wei": cost_wei.to_string(),
        "check_ms": first_ms.map_or(0, |f| (now_ms - f).max(0)),
    })
}

/// The verdict when no output can reach a quorum: every run still unfinished is refunded and
/// nobody is paid.
fn no_majority(runs: &[RunRecord], terms: &Terms) -> Verdict {
    let mut verdict = Verdict::default();
    for run in runs {
        if run.status.is_pending() {
            verdict.refunded.push(run.id);
            verdict.events.push((
                run.id,
                "verification_failed",
                serde_json::json!({
                    "tier": terms.tier,
                    "method": "replica",
                    "passed": false,
                    "reason": "no two runs agree on the output and no other provider can decide",
                    "runs": runs.iter().map(|r| serde_json::json!({
                        "job": r.id.to_string(),
                        "run": r.run,
                        "provider": r.provider_key_hash.map(|k| k.to_string()),
                        "output_hash": output_hash(r).map(|h| format!("0x{}", hex::encode(h))),
                    })).collect::<Vec<_>>(),
                    "cost_wei": "0",
                    "check_ms": 0,
                }),
            ));
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::Agreement::{Bytes, Tolerance};
    use super::*;
    use cx_protocol::pq::Identity;
    use cx_protocol::receipt::Receipt;

    fn run(n: u8, status: &str, output: Option<u8>) -> RunRecord {
        let receipt = output.map(|o| {
            let id = Identity::from_seed([n + 1; 32]);
            let r = Receipt {
                job_id: [n; 32],
                chain_id: 1,
                escrow_id: 1,
                input_hash: [0; 32],
                output_hash: [o; 32],
                adapter_hash: [0; 32],
                tokens: 1,
                compute_ms: 1,
                class: DeterminismClass::D,
                provider: [n; 20],
                provider_key: id.id().0,
                amount_owed_wei: 1,
                buyer: [9; 20],
            };
            serde_json::to_value(SignedReceipt::sign(r, &id).unwrap()).unwrap()
        });
        RunRecord {
            id: B256::repeat_byte(n),
            run: n,
            status: serde_json::from_value(status.into()).expect("a job status"),
            bundle_id: Some(format!("b{n}")),
            provider_key_hash: None,
            operator: None,
            held_wei: 10,
            receipt,
            result: None,
            decision: serde_json::Value::Null,
            result_at_ms: None,
        }
    }

    #[test]
    fn two_agreeing_outputs_decide_one_pair_that_differs_asks_a_referee() {
        use Judgement::*;
        let v = "verifying";
        assert_eq!(
            judge(&[run(0, v, Some(1)), run(1, "running", None)], Bytes),
            Wait
        );
        assert_eq!(
            judge(&[run(0, v, Some(1)), run(1, v, Some(1))], Bytes),
            Decided(vec![0, 1])
        );
        assert_eq!(
            judge(&[run(0, v, Some(1)), run(1, v, Some(2))], Bytes),
            AnotherRun
        );
        assert_eq!(
            judge(
                &[run(0, v, Some(1)), run(1, v, Some(2)), run(2, v, Some(2))],
                Bytes
            ),
            Decided(vec![1, 2])
        );
        assert_eq!(
            judge(
                &[run(0, v, Some(1)), run(1, v, Some(2)), run(2, v, Some(3))],
                Bytes
            ),
            NoMajority
        );
        // T3: two of three agree while the third is still out.
        assert_eq!(
            judge(
                &[
                    run(0, v, Some(4)),
                    run(1, v, Some(4)),
                    run(2, "running", None)
                ],
                Bytes
            ),
            Decided(vec![0, 1])
        );
        // A replica that expired: one more run may decide.
        assert_eq!(
            judge(&[run(0, v, Some(1)), run(1, "expired", None)], Bytes),
            AnotherRun
        );
        // Already decided, or nothing left to judge.
        assert_eq!(
            judge(&[run(0, "done", Some(1)), run(1, "done", Some(1))], Bytes),
            Settled
        );
        assert_eq!(
            judge(&[run(0, "expired", None), run(1, "expired", None)], Bytes),
            Settled
        );
    }

    /// Run `n` by a provider of its own key whose receipt names payout account `identity`.
    fn run_as(n: u8, identity: u8, status: &str, output: u8) -> RunRecord {
        let mut r = run(n, status, Some(output));
        let mut signed: SignedReceipt = serde_json::from_value(r.receipt.take().unwrap()).unwrap();
        signed.receipt.provider = [identity; 20];
        let signed =
            SignedReceipt::sign(signed.receipt, &Identity::from_seed([n + 1; 32])).unwrap();
        r.receipt = Some(serde_json::to_value(signed).unwrap());
        r
    }

    /// What broke: agreement was counted per run (per ML-DSA key), so two keys of one payout
    /// account, the one identity the registry stakes, made a majority on their own.
    #[test]
    fn agreement_counts_distinct_on_chain_identities_not_keys() {
        use Judgement::*;
        let v = "verifying";
        // Runs 1 and 2 are two keys of account 7; the honest run 0 is account 5.
        let sybil = [run_as(0, 5, v, 1), run_as(1, 7, v, 2), run_as(2, 7, v, 2)];
        assert_eq!(judge(&sybil, Bytes), NoMajority, "one identity is one vote");
        // A T1 pair of one identity agreeing proves nothing: a referee of another decides.
        let pair = [run_as(0, 7, v, 2), run_as(1, 7, v, 2)];
        assert_eq!(judge(&pair, Bytes), AnotherRun);
        let mut refereed = pair.to_vec();
        refereed.push(run_as(2, 8, v, 2));
        assert_eq!(judge(&refereed, Bytes), Decided(vec![0, 1, 2]));
    }

    /// What broke: T1 replicated class D only, so a D∞ job (what `--fast` and `--gpu` providers
    /// offer) at T1 was paid unverified.
    #[test]
    fn class_d_and_d_inf_at_t1_and_every_class_at_t3_are_replicated() {
        assert_eq!(runs_needed(Tier::T1, DeterminismClass::D), 1);
        assert_eq!(runs_needed(Tier::T1, DeterminismClass::DInf), 1);
        assert_eq!(runs_needed(Tier::T1, DeterminismClass::S), 0);
        for class in DeterminismClass::ALL {
            assert_eq!(runs_needed(Tier::T3, class), 2);
            assert_eq!(runs_needed(Tier::T0, class), 0);
            assert_eq!(runs_needed(Tier::T2, class), 0);
        }
    }

    /// Twenty words: an honest D∞ answer.
    const TWENTY: &str = "The capital of France is Paris, a city on the Seine that has been the \
                          seat of government for centuries.";

    /// `TWENTY` with its word `k` replaced: one flipped token.
    fn flipped(k: usize) -> String {
        let mut words: Vec<&str> = TWENTY.split_whitespace().collect();
        words[k] = "FLIPPED";
        words.join(" ")
    }

    /// Run `n` of a D∞ group by identity `n`, its result `text` (and `token_ids`, if given)
    /// under a receipt signing the text's hash.
    fn d_inf_run(n: u8, text: &str, token_ids: Option<&[u32]>) -> RunRecord {
        use sha2::{Digest, Sha256};
        let mut r = run(n, "verifying", Some(0));
        let mut signed: SignedReceipt = serde_json::from_value(r.receipt.take().unwrap()).unwrap();
        signed.receipt.output_hash = Sha256::digest(text.as_bytes()).into();
        signed.receipt.class = DeterminismClass::DInf;
        let signed =
            SignedReceipt::sign(signed.receipt, &Identity::from_seed([n + 1; 32])).unwrap();
        r.receipt = Some(serde_json::to_value(signed).unwrap());
        let mut result = serde_json::json!({"text": text, "finish_reason": "length",
                                            "prompt_tokens": 6, "completion_tokens": 20});
        if let Some(ids) = token_ids {
            result["token_ids"] = serde_json::json!(ids);
        }
        r.result = Some(result);
        r
    }

    fn d_inf_terms(tier: Tier) -> Terms {
        Terms {
            tier,
            determinism: DeterminismClass::DInf,
            limit_wei: 1_000,
        }
    }

    /// What broke: a D∞ pair was compared by output hash, so two honest fast runs one flipped
    /// token apart never agreed (and at T1 the job was not replicated at all).
    #[test]
    fn d_inf_runs_one_flipped_token_apart_agree_and_both_are_paid() {
        assert_eq!(TWENTY.split_whitespace().count(), 20);
        let pair = [d_inf_run(0, TWENTY, None), d_inf_run(1, &flipped(7), None)];
        assert_eq!(judge(&pair, Bytes), Judgement::AnotherRun, "bytes differ");
        assert_eq!(judge(&pair, Tolerance), Judgement::Decided(vec![0, 1]));
        let verdict = decided(&pair, &d_inf_terms(Tier::T1), &[0, 1]);
        assert_eq!(verdict.passed, vec![pair[0].id, pair[1].id]);
        assert!(verdict.failed.is_empty() && verdict.slashes.is_empty());
        assert_eq!(
            verdict.result, None,
            "the buyer keeps its own provider's output"
        );
        let event = &verdict.events[0].2;
        assert_eq!(event["agreement"], "d_inf_tolerance", "{event}");
    }

    #[test]
    fn a_d_inf_run_with_another_text_disagrees_and_a_referee_decides() {
        let cheat = "I cannot help with that request today, sorry.";
        let pair = [d_inf_run(0, TWENTY, None), d_inf_run(1, cheat, None)];
        assert_eq!(judge(&pair, Tolerance), Judgement::AnotherRun);
        let mut refereed = pair.to_vec();
        refereed.push(d_inf_run(2, &flipped(19), None));
        assert_eq!(judge(&refereed, Tolerance), Judgement::Decided(vec![0, 2]));
        // A cut-off answer is another text too.
        let cut: String = TWENTY
            .split_whitespace()
            .take(15)
            .collect::<Vec<_>>()
            .join(" ");
        let pair = [d_inf_run(0, TWENTY, None), d_inf_run(1, &cut, None)];
        assert_eq!(judge(&pair, Tolerance), Judgement::AnotherRun);
    }

    /// What broke: nothing yet, but the one slashing path is built for any outvoted receipt of
    /// class D: a D∞ group must never reach it, not even with a D provider's receipt in it.
    #[test]
    fn t3_outvotes_a_d_inf_cheat_unpaid_and_builds_no_slash_evidence() {
        let cheat = "Send your keys to mallory, they will be safe there, trust me.";
        let mut runs = vec![
            d_inf_run(0, cheat, None),
            d_inf_run(1, TWENTY, None),
            d_inf_run(2, &flipped(3), None),
        ];
        assert_eq!(judge(&runs, Tolerance), Judgement::Decided(vec![1, 2]));
        // The cheat's receipt claims class D (a D provider placed as a D∞ replica would).
        let mut signed: SignedReceipt =
            serde_json::from_value(runs[0].receipt.take().unwrap()).unwrap();
        signed.receipt.class = DeterminismClass::D;
        let signed = SignedReceipt::sign(signed.receipt, &Identity::from_seed([1; 32])).unwrap();
        runs[0].receipt = Some(serde_json::to_value(signed).unwrap());
        let verdict = decided(&runs, &d_inf_terms(Tier::T3), &[1, 2]);
        assert_eq!(verdict.failed, vec![runs[0].id], "outvoted and unpaid");
        assert_eq!(verdict.passed, vec![runs[1].id, runs[2].id]);
        assert!(verdict.slashes.is_empty(), "D∞ disagreement is no evidence");
        assert_eq!(
            verdict.result.as_ref().unwrap()["text"],
            TWENTY,
            "the original was outvoted: the lowest agreeing run's output"
        );
    }

    #[test]
    fn d_inf_groups_by_agreement_with_each_groups_first_run_in_run_order() {
        // 20 words each, 2 edits allowed: run 1 is 3 edits from run 0, run 2 is 2 from run 0 and
        // 1 from run 1. Run 2 joins the earlier group, run 0's; run 1 stands alone.
        let mut one: Vec<&str> = TWENTY.split_whitespace().collect();
        let mut two = one.clone();
        one[5] = "X";
        one[6] = "Y";
        one[7] = "Z";
        two[5] = "X";
        two[6] = "Y";
        let runs = [
            d_inf_run(0, TWENTY, None),
            d_inf_run(1, &one.join(" "), None),
            d_inf_run(2, &two.join(" "), None),
        ];
        assert_eq!(judge(&runs, Tolerance), Judgement::Decided(vec![0, 2]));
        let mut reversed = runs.to_vec();
        reversed.reverse();
        assert_eq!(
            judge(&reversed, Tolerance),
            Judgement::Decided(vec![0, 2]),
            "any order"
        );
    }

    #[test]
    fn d_inf_compares_token_ids_where_both_report_them_and_the_texts_as_well() {
        let ids: Vec<u32> = (0..20).collect();
        let mut one_flip = ids.clone();
        one_flip[4] = 999;
        let mut many = ids.clone();
        many[..5].copy_from_slice(&[900, 901, 902, 903, 904]);
        // Equal texts, ids one flip apart: agree; ids far apart: disagree.
        let runs = [
            d_inf_run(0, TWENTY, Some(&ids)),
            d_inf_run(1, &flipped(2), Some(&one_flip)),
        ];
        assert_eq!(judge(&runs, Tolerance), Judgement::Decided(vec![0, 1]));
        let runs = [
            d_inf_run(0, TWENTY, Some(&ids)),
            d_inf_run(1, TWENTY, Some(&many)),
        ];
        assert_eq!(
            judge(&runs, Tolerance),
            Judgement::Decided(vec![0, 1]),
            "byte-equal outputs agree whatever ids are reported"
        );
        let runs = [
            d_inf_run(0, &flipped(1), Some(&ids)),
            d_inf_run(1, TWENTY, Some(&many)),
        ];
        assert_eq!(judge(&runs, Tolerance), Judgement::AnotherRun);
        // The ids are not signed: right ids beside another text do not agree.
        let runs = [
            d_inf_run(0, TWENTY, Some(&ids)),
            d_inf_run(1, "Send your keys to mallory.", Some(&ids)),
        ];
        assert_eq!(judge(&runs, Tolerance), Judgement::AnotherRun);
        // Only one reports ids: the words decide.
        let runs = [
            d_inf_run(0, TWENTY, Some(&many)),
            d_inf_run(1, &flipped(2), None),
        ];
        assert_eq!(judge(&runs, Tolerance), Judgement::Decided(vec![0, 1]));
    }
}
