//! Where the coordinator records every step: the [`Store`] boundary, and an in-memory
//! implementation for unit tests (PostgreSQL's is [`super::postgres::PgStore`]).
//!
//! The outbox pattern: a batch part is written (`created`) before any signer is asked, its
//! signature is written (`signed`) before anything is sent to a chain, and it is marked `posted`
//! once the chain has it. A coordinator that restarts reads every unfinished part back and
//! carries it on from the step it reached; a post that went through but was not recorded is
//! recognised on chain (the contract's nonce has moved and the `BatchSettled` event is there), so
//! each batch lands exactly once.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use alloy::primitives::B256;
use cx_protocol::voucher::Voucher;
use frost_secp256k1 as frost;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ledger::ChainBatch;

/// Where a batch part is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartStatus {
    /// Built and recorded; not signed yet.
    Created,
    /// Signed (the signature is recorded); not yet on chain.
    Signed,
    /// On chain.
    Posted,
}

impl PartStatus {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Signed => "signed",
            Self::Posted => "posted",
        }
    }

    /// Parses a stored name.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "created" => Ok(Self::Created),
            "signed" => Ok(Self::Signed),
            "posted" => Ok(Self::Posted),
            other => Err(Error::UnknownStatus {
                status: other.to_string(),
            }),
        }
    }
}

/// One chain's part of a batch, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPart {
    /// The batch it belongs to.
    pub batch_id: i64,
    /// The part.
    pub batch: ChainBatch,
    /// Where it is.
    pub status: PartStatus,
    /// The aggregated FROST signature (65 bytes, SEC1 R ‖ z) once signed.
    pub signature: Option<Vec<u8>>,
    /// The transaction that carried it, when known.
    pub tx_hash: Option<B256>,
}

/// The coordinator's durable state. Every method is one transaction.
pub trait Store: Send + Sync {
    /// Adds receipts not seen before (by job id); returns how many were new.
    fn add_receipts(&self, receipts: &[Voucher]) -> impl Future<Output = Result<usize>> + Send;
    /// Receipts in no batch yet, oldest first.
    fn pending_receipts(&self) -> impl Future<Output = Result<Vec<Voucher>>> + Send;
    /// Records a new batch of `parts` (status `created`) and assigns their receipts to it.
    fn create_batch(&self, parts: &[ChainBatch]) -> impl Future<Output = Result<i64>> + Send;
    /// `created` → `signed` with the signature.
    fn record_signature(
        &self,
        batch_id: i64,
        chain_id: u64,
        signature: &[u8],
    ) -> impl Future<Output = Result<()>> + Send;
    /// `signed` → `posted`.
    fn record_posted(
        &self,
        batch_id: i64,
        chain_id: u64,
        tx_hash: Option<B256>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Parts not yet posted, by batch id then chain id.
    fn unfinished(&self) -> impl Future<Output = Result<Vec<StoredPart>>> + Send;
    /// The latest part of `chain_id`, whatever its status.
    fn latest_part(&self, chain_id: u64)
    -> impl Future<Output = Result<Option<StoredPart>>> + Send;
    /// Every part of a batch.
    fn parts(&self, batch_id: i64) -> impl Future<Output = Result<Vec<StoredPart>>> + Send;
    /// Appends a line to a batch's history.
    fn log_step(
        &self,
        batch_id: i64,
        chain_id: Option<u64>,
        step: &str,
        detail: &str,
    ) -> impl Future<Output = Result<()>> + Send;
    /// A batch's history: (chain id, step, detail), oldest first.
    fn steps(
        &self,
        batch_id: i64,
    ) -> impl Future<Output = Result<Vec<(Option<u64>, String, String)>>> + Send;
    /// Gives up a batch none of whose parts is signed: its parts are deleted (their nonces are
    /// free again) and its receipts are pending again. Refuses once any part is signed.
    fn abandon_batch(&self, batch_id: i64) -> impl Future<Output = Result<()>> + Send;
    /// Replaces an unposted part that can never land (an escrow it names was reclaimed) with
    /// `replacement` at the same chain and nonce, `created` and unsigned; the old part's receipts
    /// that the replacement leaves out are pending again. `None` deletes the part (its nonce is
    /// free again). Refuses a posted part.
    fn replace_part(
        &self,
        batch_id: i64,
        chain_id: u64,
        replacement: Option<&ChainBatch>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Moves a pending receipt out of settlement with `reason`; false if no such pending receipt.
    fn reject_receipt(
        &self,
        job_id: [u8; 32],
        reason: &str,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Records the public key package of a key epoch (from a DKG).
    fn save_group_key(
        &self,
        epoch: u32,
        package: &frost::keys::PublicKeyPackage,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Every recorded key epoch's public key package.
    fn group_keys(
        &self,
    ) -> impl Future<Output = Result<Vec<(u32, frost::keys::PublicKeyPackage)>>> + Send;
}

#[derive(Default)]
struct Memory {
    receipts: Vec<(Voucher, Option<i64>)>,
    parts: BTreeMap<(i64, u64), StoredPart>,
    next_batch: i64,
    steps: Vec<(i64, Option<u64>, String, String)>,
    keys: BTreeMap<u32, frost::keys::PublicKeyPackage>,
    rejected: Vec<([u8; 32], String)>,
}

/// The store in memory (tests; a process restart loses it).
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Memory>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryStore")
    }
}

impl MemoryStore {
    fn with<T>(&self, f: impl FnOnce(&mut Memory) -> Result<T>) -> Result<T> {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn missing(batch_id: i64, chain_id: u64) -> Error {
    Error::MissingPart { batch_id, chain_id }
}

impl Store for MemoryStore {
    async fn add_receipts(&self, receipts: &[Voucher]) -> Result<usize> {
        self.with(|m| {
            let mut added = 0;
            for r in receipts {
                let k = &r.receipt.receipt;
                let known = m
                    .receipts
                    .iter()
                    .any(|(s, _)| s.receipt.receipt.job_id == k.job_id);
                if !known {
                    m.receipts.push((r.clone(), None));
                    added += 1;
                }
            }
            Ok(added)
        })
    }

    async fn pending_receipts(&self) -> Result<Vec<Voucher>> {
        self.with(|m| {
            Ok(m.receipts
                .iter()
                .filter(|(_, b)| b.is_none())
                .map(|(r, _)| r.clone())
                .collect())
        })
    }

    async fn create_batch(&self, parts: &[ChainBatch]) -> Result<i64> {
        self.with(|m| {
            for p in parts {
                if m.parts
                    .values()
                    .any(|q| q.batch.chain_id == p.chain_id && q.batch.nonce == p.nonce)
                {
                    return Err(Error::NonceInUse {
                        chain_id: p.chain_id,
                        nonce: p.nonce,
                    });
                }
            }
            m.next_batch += 1;
            let id = m.next_batch;
            for p in parts {
                m.parts.insert(
                    (id, p.chain_id),
                    StoredPart {
                        batch_id: id,
                        batch: p.clone(),
                        status: PartStatus::Created,
                        signature: None,
                        tx_hash: None,
                    },
                );
                for r in &p.receipts {
                    for (s, b) in &mut m.receipts {
                        if s.receipt.receipt.job_id == r.receipt.receipt.job_id {
                            *b = Some(id);
                        }
                    }
                }
            }
            Ok(id)
        })
    }

    async fn record_signature(&self, batch_id: i64, chain_id: u64, signature: &[u8]) -> Result<()> {
        self.with(|m| {
            let part = m
                .parts
                .get_mut(&(batch_id, chain_id))
                .ok_or_else(|| missing(batch_id, chain_id))?;
            if part.status == PartStatus::Created {
                part.status = PartStatus::Signed;
                part.signature = Some(signature.to_vec());
            }
            Ok(())
        })
    }

    async fn record_posted(
        &self,
        batch_id: i64,
        chain_id: u64,
        tx_hash: Option<B256>,
    ) -> Result<()> {
        self.with(|m| {
            let part = m
                .parts
                .get_mut(&(batch_id, chain_id))
                .ok_or_else(|| missing(batch_id, chain_id))?;
            part.status = PartStatus::Posted;
            part.tx_hash = tx_hash;
            Ok(())
        })
    }

    async fn unfinished(&self) -> Result<Vec<StoredPart>> {
        self.with(|m| {
            Ok(m.parts
                .values()
                .filter(|p| p.status != PartStatus::Posted)
                .cloned()
                .collect())
        })
    }

    async fn latest_part(&self, chain_id: u64) -> Result<Option<StoredPart>> {
        self.with(|m| {
            Ok(m.parts
                .values()
                .filter(|p| p.batch.chain_id == chain_id)
                .max_by_key(|p| p.batch.nonce)
                .cloned())
        })
    }

    async fn parts(&self, batch_id: i64) -> Result<Vec<StoredPart>> {
        self.with(|m| {
            Ok(m.parts
                .values()
                .filter(|p| p.batch_id == batch_id)
                .cloned()
                .collect())
        })
    }

    async fn log_step(
        &self,
        batch_id: i64,
        chain_id: Option<u64>,
        step: &str,
        detail: &str,
    ) -> Result<()> {
        self.with(|m| {
            m.steps
                .push((batch_id, chain_id, step.to_string(), detail.to_string()));
            Ok(())
        })
    }

    async fn steps(&self, batch_id: i64) -> Result<Vec<(Option<u64>, String, String)>> {
        self.with(|m| {
            Ok(m.steps
                .iter()
                .filter(|s| s.0 == batch_id)
                .map(|s| (s.1, s.2.clone(), s.3.clone()))
                .collect())
        })
    }

    async fn abandon_batch(&self, batch_id: i64) -> Result<()> {
        self.with(|m| {
            if m.parts
                .values()
                .any(|p| p.batch_id == batch_id && p.status != PartStatus::Created)
            {
                return Err(Error::SignedAlready { batch_id });
            }
            m.parts.retain(|_, p| p.batch_id != batch_id);
            for (_, b) in &mut m.receipts {
                if *b == Some(batch_id) {
                    *b = None;
                }
            }
            Ok(())
        })
    }

    async fn replace_part(
        &self,
        batch_id: i64,
        chain_id: u64,
        replacement: Option<&ChainBatch>,
    ) -> Result<()> {
        self.with(|m| {
            let part = m
                .parts
                .get(&(batch_id, chain_id))
                .ok_or_else(|| missing(batch_id, chain_id))?;
            if part.status == PartStatus::Posted {
                return Err(Error::PostedAlready { batch_id, chain_id });
            }
            let old: Vec<[u8; 32]> = part
                .batch
                .receipts
                .iter()
                .map(|r| r.receipt.receipt.job_id)
                .collect();
            for (r, b) in &mut m.receipts {
                if *b == Some(batch_id) && old.contains(&r.receipt.receipt.job_id) {
                    *b = None;
                }
            }
            match replacement {
                Some(batch) => {
                    for (r, b) in &mut m.receipts {
                        if batch
                            .receipts
                            .iter()
                            .any(|n| n.receipt.receipt.job_id == r.receipt.receipt.job_id)
                        {
                            *b = Some(batch_id);
                        }
                    }
                    m.parts.insert(
                        (batch_id, chain_id),
                        StoredPart {
                            batch_id,
                            batch: batch.clone(),
                            status: PartStatus::Created,
                            signature: None,
                            tx_hash: None,
                        },
                    );
                }
                None => {
                    m.parts.remove(&(batch_id, chain_id));
                }
            }
            Ok(())
        })
    }

    async fn reject_receipt(&self, job_id: [u8; 32], reason: &str) -> Result<bool> {
        self.with(|m| {
            let before = m.receipts.len();
            m.receipts
                .retain(|(r, b)| !(r.receipt.receipt.job_id == job_id && b.is_none()));
            let found = m.receipts.len() != before;
            if found {
                m.rejected.push((job_id, reason.to_string()));
            }
            Ok(found)
        })
    }

    async fn save_group_key(
        &self,
        epoch: u32,
        package: &frost::keys::PublicKeyPackage,
    ) -> Result<()> {
        self.with(|m| {
            m.keys.insert(epoch, package.clone());
            Ok(())
        })
    }

    async fn group_keys(&self) -> Result<Vec<(u32, frost::keys::PublicKeyPackage)>> {
        self.with(|m| Ok(m.keys.iter().map(|(e, p)| (*e, p.clone())).collect()))
    }
}
