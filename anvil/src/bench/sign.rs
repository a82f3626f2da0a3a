//! `cx-devnet bench sign`: the committee's latencies over real processes on loopback.
//!
//! - `handshake_ms`: one hybrid ML-KEM-768 + X25519 session with ML-DSA-65 authentication, TCP
//!   connect to first answered request (median of 21);
//! - `dkg_ms`: a full DKG among the n signer processes (each pair over its own session);
//! - `sign_p50_ms` / `sign_p99_ms`: commit + sign + aggregate + verify for one batch, with every
//!   signer re-checking the batch against the chain (Anvil) before it signs, its vouchers
//!   checked when the coordinator handed them over (`check_ahead_p50_ms`, all n signers, off the
//!   round) and named by id in the sign request, as settlement does;
//! - `sign_unchecked_p50_ms` / `sign_unchecked_p99_ms`: the same round when the request carries
//!   the vouchers and the signers check their signatures inside it (a batch cut before they were
//!   handed over).

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use cx_contracts::DeploymentsFile;
use cx_settlement::frost::{EvmGroupKey, EvmSignature};
use cx_settlement::ledger;
use cx_settlement::transport::{Channel, Limits};
use cx_settlement::wire::{PartToSign, Request, Response};

use crate::cluster::Cluster;
use crate::error::Result;
use crate::scenario::ScenarioChain;

/// Figures of one run.
#[derive(Clone, Debug, Serialize)]
pub struct SignBenchReport {
    /// Signers.
    pub n: u16,
    /// Threshold.
    pub t: u16,
    /// Receipts in the signed batch.
    pub receipts: usize,
    /// Signing rounds measured.
    pub rounds: usize,
    /// One session: connect, handshake, first request answered (median).
    pub handshake_ms: f64,
    /// The DKG among all n signers.
    pub dkg_ms: f64,
    /// Median of commit + sign + aggregate for one batch whose vouchers the signers checked as
    /// the coordinator took them in (its path: [`cx_settlement::checked`]).
    pub sign_p50_ms: f64,
    /// 99th percentile of the same.
    pub sign_p99_ms: f64,
    /// Median of the same when round 2 checks the vouchers' signatures itself.
    pub sign_unchecked_p50_ms: f64,
    /// 99th percentile of the same.
    pub sign_unchecked_p99_ms: f64,
    /// Median of handing a batch's vouchers to all n signers and every one checking them (off
    /// the signing round: the coordinator does it as it takes receipts in).
    pub check_ahead_p50_ms: f64,
    /// The fewest signers that checked a batch's vouchers ahead (n when every one always did).
    pub checked_ahead_by: usize,
    /// Whether every signed batch was then accepted by the contract.
    pub settled_on_chain: bool,
}

impl SignBenchReport {
    /// The human table, each latency beside its target.
    pub fn table(&self) -> String {
        let mut out = format!("{:<22} {:>10} {:>10}\n", "metric", "value", "target");
        for (name, value, target) in [
            ("handshake_ms", self.handshake_ms, "<= 2"),
            ("dkg_ms", self.dkg_ms, ""),
            ("sign_p50_ms", self.sign_p50_ms, "<= 10"),
            ("sign_p99_ms", self.sign_p99_ms, ""),
            ("sign_unchecked_p50_ms", self.sign_unchecked_p50_ms, ""),
            ("sign_unchecked_p99_ms", self.sign_unchecked_p99_ms, ""),
            ("check_ahead_p50_ms", self.check_ahead_p50_ms, ""),
        ] {
            out += &format!("{name:<22} {value:>10.3} {target:>10}\n");
        }
        out += &format!(
            "({} of {} signers, {} receipts per batch, {} rounds alternating checked ahead (by \
             at least {} signers) and not, every batch posted: {})\n",
            self.t,
            self.n,
            self.receipts,
            self.rounds,
            self.checked_ahead_by,
            self.settled_on_chain
        );
        out
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs the bench with signer processes started from `binary`.
pub async fn sign_bench(
    binary: &Path,
    n: u16,
    t: u16,
    rounds: usize,
    receipts: usize,
) -> Result<SignBenchReport> {
    let operators: Vec<String> = (1..=n).map(|i| format!("operator-{i}")).collect();
    let operators: Vec<&str> = operators.iter().map(String::as_str).collect();
    let rule = cx_settlement::config::CommitteeRule {
        threshold: t,
        min_operators: 1,
    };
    let cluster = Cluster::start(binary, &operators, rule)?;
    let committee = cluster.committee(t, 1)?;

    let first = &cluster.members[0];
    let mut handshakes = Vec::new();
    for _ in 0..21 {
        let start = Instant::now();
        let mut channel = Channel::connect(
            first.address.as_str(),
            &cluster.coordinator,
            first.public()?,
            Limits::default(),
        )
        .await?;
        let _: Response = channel
            .call(&Request::Ping)
            .await
            .map_err(crate::Error::from)?;
        handshakes.push(start.elapsed());
    }
    handshakes.sort();

    let start = Instant::now();
    let package = committee.dkg(0).await?;
    let dkg = start.elapsed();

    let chain = ScenarioChain::start(
        31337,
        EvmGroupKey::from_verifying_key(package.verifying_key())?,
    )
    .await?;
    DeploymentsFile {
        chains: vec![chain.entry()],
    }
    .write(&cluster.deployments_file)?;
    // Every round signs a fresh batch at the next nonce and posts it, as settlement does: a
    // signer never signs two batches at one nonce, and repeating one batch would let its
    // vouchers' checks be remembered from the round before. Rounds alternate between the
    // coordinator's path (the vouchers handed to the signers as they were taken in, so round 2
    // finds their signatures checked) and round 2 checking them itself (a signer that missed
    // them, or a batch cut before they arrived).
    let view = chain.view()?;
    let key_epoch = view.group_key().await?.epoch;
    let mut previous = Vec::new();
    let (mut ahead, mut unchecked, mut checking) = (Vec::new(), Vec::new(), Vec::new());
    let mut settled_on_chain = true;
    let mut checked_ahead_by = usize::from(n);
    for round in 0..2 * rounds.max(1) {
        let ids = chain.open_jobs(receipts, 1_000).await?;
        let signed = chain.vouchers(&ids, 900, &cluster.exchange)?;
        let mut escrows = std::collections::HashMap::new();
        for id in &ids {
            if let Some(e) = view.open_escrow(*id).await? {
                escrows.insert(*id, e);
            }
        }
        let batch = ledger::assemble(
            ledger::Head {
                chain_id: chain.anvil.chain_id,
                contract: chain.deployment.settlement,
                key_epoch,
                nonce: view.batch_nonce().await? + 1,
                fee: cluster.fee,
            },
            signed,
            &escrows,
            previous,
        )?;
        let checked_ahead = round % 2 == 0;
        if checked_ahead {
            let start = Instant::now();
            let members = committee.check_ahead(&batch.receipts).await;
            checking.push(start.elapsed());
            checked_ahead_by = checked_ahead_by.min(members);
        }
        // The balance lists travel whole either way (two signers of five did not sign the
        // previous part and do not hold its list); the vouchers travel as ids when they were
        // checked ahead, as the coordinator sends them.
        let part = if checked_ahead {
            PartToSign::whole(&batch).vouchers_by_id()
        } else {
            PartToSign::whole(&batch)
        };
        let digest = batch.digest();
        let start = Instant::now();
        let signature = committee
            .sign(digest.as_slice(), &package, |round, signing_package| {
                part.request(round, signing_package)
            })
            .await?;
        let took = start.elapsed();
        if checked_ahead {
            ahead.push(took);
        } else {
            unchecked.push(took);
        }
        chain
            .operator
            .settle_batch(&batch.message(), &EvmSignature::from_frost(&signature)?)
            .await?;
        settled_on_chain &= view.batch_nonce().await? == batch.nonce;
        previous = batch.new_balances;
    }
    for times in [&mut ahead, &mut unchecked, &mut checking] {
        times.sort();
    }
    Ok(SignBenchReport {
        n,
        t,
        receipts,
        rounds: ahead.len() + unchecked.len(),
        handshake_ms: ms(handshakes[handshakes.len() / 2]),
        dkg_ms: ms(dkg),
        sign_p50_ms: ms(percentile(&ahead, 0.50)),
        sign_p99_ms: ms(percentile(&ahead, 0.99)),
        sign_unchecked_p50_ms: ms(percentile(&unchecked, 0.50)),
        sign_unchecked_p99_ms: ms(percentile(&unchecked, 0.99)),
        check_ahead_p50_ms: ms(percentile(&checking, 0.50)),
        checked_ahead_by,
        settled_on_chain,
    })
}
