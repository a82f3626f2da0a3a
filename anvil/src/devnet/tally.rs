//! What settled on chain: the tabs the agents closed are watched until the exchange reports them
//! `settled`; then each of their jobs' `settled` event names its batch and chain
//! (`GET /v1/tabs/…`, anyone's to read; `GET /v1/jobs/{id}` as the tab's buyer reads it).

use super::traffic::Closed;
use cx_client::Client;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Settled jobs and batches so far.
#[derive(Debug)]
pub(super) struct Tally {
    started: Instant,
    pending: Vec<Closed>,
    /// Jobs with a `settled` event.
    pub(super) jobs: u64,
    /// (chain, batch) parts that landed.
    parts: BTreeSet<(u64, i64)>,
    /// Per chain: seconds from the devnet's start to its first settled batch.
    first_batch: BTreeMap<u64, Duration>,
}

/// The summary `--exit-after-settled` prints (its JSON is the last line).
#[derive(Debug, Serialize)]
pub(super) struct Summary {
    pub(super) settled_jobs: u64,
    pub(super) batches: usize,
    pub(super) batch_parts_per_chain: BTreeMap<u64, usize>,
    pub(super) first_batch_s: BTreeMap<u64, f64>,
    pub(super) ready_s: f64,
    pub(super) chats: u64,
    pub(super) intents: u64,
    pub(super) searches: u64,
    pub(super) matmuls: u64,
    pub(super) trains: u64,
    pub(super) reserves: u64,
    pub(super) rents: u64,
    pub(super) tabs_closed: u64,
    pub(super) errors: u64,
    pub(super) processes: usize,
    pub(super) peak_rss_bytes_sum: u64,
    pub(super) cpu_s: f64,
}

impl Tally {
    pub(super) fn new(started: Instant) -> Self {
        Self {
            started,
            pending: Vec::new(),
            jobs: 0,
            parts: BTreeSet::new(),
            first_batch: BTreeMap::new(),
        }
    }

    pub(super) fn closed(&mut self, tab: Closed) {
        self.pending.push(tab);
    }

    /// Asks the exchange about every closed tab not yet settled.
    pub(super) async fn poll(&mut self, client: &Client) {
        let mut still = Vec::new();
        for tab in std::mem::take(&mut self.pending) {
            let status = match client.tab(tab.chain_id, tab.escrow_id).await {
                Ok(t) => t.status,
                Err(_) => {
                    still.push(tab);
                    continue;
                }
            };
            match status.as_str() {
                "settled" => {
                    for id in &tab.jobs {
                        let Ok(job) = tab.reader.job(*id).await else {
                            continue;
                        };
                        if let Some(event) = job.events.iter().find(|e| e.status == "settled") {
                            self.jobs += 1;
                            let chain = event.detail["chain_id"].as_u64().unwrap_or(job.chain_id);
                            let batch = event.detail["batch_id"].as_i64().unwrap_or(-1);
                            self.parts.insert((chain, batch));
                            self.first_batch
                                .entry(chain)
                                .or_insert_with(|| self.started.elapsed());
                        }
                    }
                }
                // Nothing spent (or reclaimed): nothing to settle.
                "unspent" | "reclaimed" => {}
                _ => still.push(tab),
            }
        }
        self.pending = still;
    }

    /// Seconds to the first batch on `chain`, if one landed.
    pub(super) fn first_batch_s(&self, chain: u64) -> Option<f64> {
        self.first_batch.get(&chain).map(Duration::as_secs_f64)
    }

    pub(super) fn summary_base(&self) -> (usize, BTreeMap<u64, usize>, BTreeMap<u64, f64>) {
        let batches: BTreeSet<i64> = self.parts.iter().map(|(_, b)| *b).collect();
        let mut per_chain = BTreeMap::new();
        for (chain, _) in &self.parts {
            *per_chain.entry(*chain).or_insert(0) += 1;
        }
        let first = self
            .first_batch
            .iter()
            .map(|(c, d)| (*c, (d.as_secs_f64() * 10.0).round() / 10.0))
            .collect();
        (batches.len(), per_chain, first)
    }
}
