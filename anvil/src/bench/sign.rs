//! `cx-devnet bench sign`: the committee's latencies over real processes on loopback.
//!
//! - `handshake_ms`: one hybrid ML-KEM-768 + X25519 session with ML-DSA-65 authentication, TCP
//!   connect to first answered request (median of 21);
//! - `dkg_ms`: a full DKG among the n signer processes (each pair over its own session);
//! - `sign_p50_ms` / `sign_p99_ms`: commit + sign + aggregate + verify for one batch, with every
//!   signer re-checking the batch against the chain (Anvil) before it signs.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use cx_contracts::DeploymentsFile;
use cx_settlement::frost::{EvmGroupKey, EvmSignature};
use cx_settlement::ledger;
use cx_settlement::transport::{Channel, Limits};
use cx_settlement::wire::{Request, Response, SignBatchRequest};

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
    /// Median of commit + sign + aggregate for one batch.
    pub sign_p50_ms: f64,
    /// 99th percentile of the same.
    pub sign_p99_ms: f64,
    /// Whether the signed batch was then accepted by the contract.
    pub settled_on_chain: bool,
}

impl SignBenchReport {
    /// The human table, each latency beside its target.
    pub fn table(&self) -> String {
        let mut out = format!("{:<16} {:>10} {:>10}\n", "metric", "value", "target");
        for (name, value, target) in [
            ("handshake_ms", self.handshake_ms, "<= 2"),
            ("dkg_ms", self.dkg_ms, ""),
            ("sign_p50_ms", self.sign_p50_ms, "<= 10"),
            ("sign_p99_ms", self.sign_p99_ms, ""),
        ] {
            out += &format!("{name:<16} {value:>10.3} {target:>10}\n");
        }
        out += &format!(
            "({} of {} signers, {} receipts per batch, {} rounds, settled on chain: {})\n",
            self.t, self.n, self.receipts, self.rounds, self.settled_on_chain
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
    let ids = chain.open_jobs(receipts, 1_000).await?;
    let signed = chain.vouchers(&ids, 900, &cluster.exchange)?;
    let view = chain.view()?;
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
            key_epoch: view.group_key().await?.epoch,
            nonce: view.batch_nonce().await? + 1,
            fee: cluster.fee,
        },
        signed,
        &escrows,
        Vec::new(),
    )?;
    let digest = batch.digest();
    let mut times = Vec::with_capacity(rounds);
    let mut last = None;
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        let signature = committee
            .sign(digest.as_slice(), &package, |round_id, signing_package| {
                Request::SignBatch(SignBatchRequest {
                    round_id,
                    batch: batch.clone(),
                    previous_root: None,
                    signing_package,
                })
            })
            .await?;
        times.push(start.elapsed());
        last = Some(signature);
    }
    times.sort();
    let signature = last.expect("at least one round");
    chain
        .operator
        .settle_batch(&batch.message(), &EvmSignature::from_frost(&signature)?)
        .await?;
    let settled_on_chain = view.batch_nonce().await? == batch.nonce;
    Ok(SignBenchReport {
        n,
        t,
        receipts,
        rounds: times.len(),
        handshake_ms: ms(handshakes[handshakes.len() / 2]),
        dkg_ms: ms(dkg),
        sign_p50_ms: ms(percentile(&times, 0.50)),
        sign_p99_ms: ms(percentile(&times, 0.99)),
        settled_on_chain,
    })
}
