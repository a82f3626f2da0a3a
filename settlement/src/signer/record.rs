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
}

/// The signer's own record of what it signed (append-only JSON lines, fsync'd before a share
/// is released).
pub(super) struct SignedLog {
    path: PathBuf,
    digests: HashMap<(u64, u64), B256>,
    escrows: HashMap<(u64, u64), u64>,
    jobs: HashMap<B256, (u64, u64)>,
}

impl SignedLog {
    pub(super) fn open(path: PathBuf) -> Result<Self> {
        let mut log = Self {
            path,
            digests: HashMap::new(),
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
        self.digests.insert((e.chain_id, e.nonce), e.digest);
        for id in e.escrow_ids {
            self.escrows.insert((e.chain_id, id), e.nonce);
        }
        for job in e.job_ids {
            self.jobs.insert(job, (e.chain_id, e.nonce));
        }
    }

    /// Reasons the log forbids signing `batch` (empty when it may).
    pub(super) fn conflicts(&self, batch: &ChainBatch, digest: B256) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(d) = self.digests.get(&(batch.chain_id, batch.nonce))
            && *d != digest
        {
            out.push(format!(
                "already signed a different batch at nonce {} on chain {}",
                batch.nonce, batch.chain_id
            ));
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

    pub(super) fn record(&mut self, batch: &ChainBatch, digest: B256) -> Result<()> {
        if self.digests.get(&(batch.chain_id, batch.nonce)) == Some(&digest) {
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
