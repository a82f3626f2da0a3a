//! The signer's own record of what it signed: append-only JSON lines, fsync'd before a share is
//! released, read back at start. It is the signer's memory of its promises, independent of the
//! exchange's tables and of the chain, so a coordinator cannot talk it into signing a second batch
//! at one nonce or settling a job twice.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use alloy::primitives::B256;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ledger::ChainBatch;

/// One line of the signer's own record: a batch it signed.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SignedEntry {
    chain_id: u64,
    nonce: u64,
    digest: B256,
    escrow_ids: Vec<u64>,
    job_ids: Vec<B256>,
    /// Digests signed earlier at this nonce that can never land (an escrow each names was
    /// reclaimed, `JobReclaimed` on chain): this entry replaces them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    replaces: Vec<B256>,
}

/// The signer's own record of what it signed (append-only JSON lines, fsync'd before a share
/// is released).
pub(super) struct SignedLog {
    path: PathBuf,
    /// Every digest signed at (chain, nonce), oldest first; all but the last were shown dead
    /// before the next was signed.
    signed: HashMap<(u64, u64), Vec<SignedEntry>>,
    escrows: HashMap<(u64, u64), u64>,
    jobs: HashMap<B256, (u64, u64)>,
}

impl SignedLog {
    pub(super) fn open(path: PathBuf) -> Result<Self> {
        let mut log = Self {
            path,
            signed: HashMap::new(),
            escrows: HashMap::new(),
            jobs: HashMap::new(),
        };
        if log.path.exists() {
            let text = std::fs::read_to_string(&log.path).map_err(Error::io(&log.path))?;
            for line in text.lines() {
                if !line.trim().is_empty() {
                    log.index(
                        serde_json::from_str(line).map_err(|source| Error::JsonFile {
                            path: log.path.clone(),
                            source,
                        })?,
                    );
                }
            }
        }
        Ok(log)
    }

    fn index(&mut self, e: SignedEntry) {
        let at = (e.chain_id, e.nonce);
        // A replacement releases the jobs and escrows of the digests it replaces: those can
        // never land, so what only they named is free to settle in a later batch.
        for old in self.signed.get(&at).into_iter().flatten() {
            for id in &old.escrow_ids {
                if self.escrows.get(&(e.chain_id, *id)) == Some(&e.nonce) {
                    self.escrows.remove(&(e.chain_id, *id));
                }
            }
            for job in &old.job_ids {
                if self.jobs.get(job) == Some(&at) {
                    self.jobs.remove(job);
                }
            }
        }
        for id in &e.escrow_ids {
            self.escrows.insert((e.chain_id, *id), e.nonce);
        }
        for job in &e.job_ids {
            self.jobs.insert(*job, at);
        }
        self.signed.entry(at).or_default().push(e);
    }

    /// Digests other than `digest` this signer signed at `batch`'s nonce, with the escrows
    /// each names: each must be shown dead before another digest is signed there.
    pub(super) fn rivals(&self, batch: &ChainBatch, digest: B256) -> Vec<(B256, Vec<u64>)> {
        self.signed
            .get(&(batch.chain_id, batch.nonce))
            .into_iter()
            .flatten()
            .filter(|e| e.digest != digest)
            .map(|e| (e.digest, e.escrow_ids.clone()))
            .collect()
    }

    /// Reasons the log forbids signing `batch` (empty when it may). `dead` are rival digests
    /// at its nonce shown never to land.
    pub(super) fn conflicts(&self, batch: &ChainBatch, digest: B256, dead: &[B256]) -> Vec<String> {
        let mut out = Vec::new();
        for e in self
            .signed
            .get(&(batch.chain_id, batch.nonce))
            .into_iter()
            .flatten()
        {
            if e.digest != digest && !dead.contains(&e.digest) {
                out.push(format!(
                    "already signed a different batch at nonce {} on chain {} ({}), and no \
                     escrow of it was reclaimed: it can still land",
                    batch.nonce, batch.chain_id, e.digest
                ));
            }
        }
        for r in &batch.receipts {
            let r = &r.receipt;
            if let Some(n) = self.escrows.get(&(batch.chain_id, r.escrow_id))
                && *n != batch.nonce
            {
                out.push(format!(
                    "escrow {} was already settled by batch {n}",
                    r.escrow_id
                ));
            }
            if let Some((c, n)) = self.jobs.get(&B256::from(r.job_id))
                && (*c, *n) != (batch.chain_id, batch.nonce)
            {
                out.push(format!(
                    "job {} was already settled by batch {n} on chain {c}",
                    hex::encode(r.job_id)
                ));
            }
        }
        out
    }

    /// Appends `batch` (replacing the dead digests `replaces` at its nonce) and fsyncs.
    pub(super) fn record(
        &mut self,
        batch: &ChainBatch,
        digest: B256,
        replaces: Vec<B256>,
    ) -> Result<()> {
        let at = (batch.chain_id, batch.nonce);
        if self
            .signed
            .get(&at)
            .and_then(|entries| entries.last())
            .is_some_and(|e| e.digest == digest)
        {
            return Ok(());
        }
        let entry = SignedEntry {
            chain_id: batch.chain_id,
            nonce: batch.nonce,
            digest,
            escrow_ids: batch.receipts.iter().map(|r| r.receipt.escrow_id).collect(),
            job_ids: batch
                .receipts
                .iter()
                .map(|r| B256::from(r.receipt.job_id))
                .collect(),
            replaces,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(Error::io(&self.path))?;
        file.write_all(format!("{}\n", serde_json::to_string(&entry)?).as_bytes())
            .map_err(Error::io(&self.path))?;
        file.sync_all().map_err(Error::io(&self.path))?;
        self.index(entry);
        Ok(())
    }
}
