//! The signer's own record of what it signed: append-only JSON lines, fsync'd before a share is
//! released, read back at start. It is the signer's memory of its promises, independent of the
//! exchange's tables and of the chain, so a coordinator cannot talk it into signing a second batch
//! at one nonce or settling a job twice.
//!
//! Promises are per deployment, keyed by (chain id, `Settlement` address): a contract redeployed
//! on one chain starts at nonce 1 with escrow ids from 0, and must not be blocked by what was
//! signed for the old one. (Records written before the contract was part of the key carry none;
//! they bind every deployment of their chain, which errs on the side of refusing.)
//!
//! A crash can tear only the last record: each is one `write` of compact JSON (which holds no
//! newline) and its `\n`, and the share leaves only after `fsync` returned. So a last line
//! without its `\n` that does not parse is a record whose share never left: it is cut off (and
//! the cut fsync'd) so the next record starts on a line of its own. A last line without `\n`
//! that does parse is kept and given its `\n` — never forgotten. Any other line that does not
//! parse is corruption, not a crash, and the signer refuses to start.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use alloy::primitives::{Address, B256};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ledger::ChainBatch;

/// Where a promise applies: chain id and `Settlement` contract (`None`: every contract of the
/// chain, for records from before the contract was recorded).
type Scope = (u64, Option<Address>);

/// One line of the signer's own record: a batch it signed.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SignedEntry {
    chain_id: u64,
    /// The `Settlement` contract (absent in records written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    contract: Option<Address>,
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
    signed: HashMap<(Scope, u64), Vec<SignedEntry>>,
    /// Escrow id in its scope → the nonce that settles it.
    escrows: HashMap<(Scope, u64), u64>,
    /// Job id → the scope and nonce that settle it.
    jobs: HashMap<B256, (Scope, u64)>,
}

/// The scopes whose promises bind a batch of `batch`'s deployment: its own and the
/// contract-less records of its chain.
fn scopes(batch: &ChainBatch) -> [Scope; 2] {
    [
        (batch.chain_id, Some(batch.contract)),
        (batch.chain_id, None),
    ]
}

impl SignedLog {
    pub(super) fn open(path: PathBuf) -> Result<Self> {
        let mut log = Self {
            path,
            signed: HashMap::new(),
            escrows: HashMap::new(),
            jobs: HashMap::new(),
        };
        if !log.path.exists() {
            return Ok(log);
        }
        let bytes = std::fs::read(&log.path).map_err(Error::io(&log.path))?;
        let bad = |line: usize, source| Error::JsonFile {
            path: log.path.with_extension(format!("jsonl (line {line})")),
            source,
        };
        let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let mut entries = Vec::new();
        for (i, line) in bytes[..complete].split(|b| *b == b'\n').enumerate() {
            if !line.iter().all(u8::is_ascii_whitespace) {
                entries.push(serde_json::from_slice(line).map_err(|e| bad(i + 1, e))?);
            }
        }
        let tail = &bytes[complete..];
        if !tail.iter().all(u8::is_ascii_whitespace) {
            match serde_json::from_slice::<SignedEntry>(tail) {
                // Whole but for its newline: a promise, kept; the newline is added.
                Ok(entry) => {
                    entries.push(entry);
                    log.append(b"\n")?;
                }
                // Torn by a crash before its fsync returned: its share never left.
                Err(_) => {
                    tracing::warn!(
                        "signer record {}: cutting off a torn last record of {} bytes (a crash \
                         before it was synced; its share was never released)",
                        log.path.display(),
                        tail.len()
                    );
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&log.path)
                        .map_err(Error::io(&log.path))?;
                    file.set_len(complete as u64)
                        .map_err(Error::io(&log.path))?;
                    file.sync_all().map_err(Error::io(&log.path))?;
                }
            }
        }
        for entry in entries {
            log.index(entry);
        }
        Ok(log)
    }

    /// Appends `bytes` and fsyncs.
    fn append(&self, bytes: &[u8]) -> Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(Error::io(&self.path))?;
        file.write_all(bytes).map_err(Error::io(&self.path))?;
        file.sync_all().map_err(Error::io(&self.path))
    }

    fn index(&mut self, e: SignedEntry) {
        let scope = (e.chain_id, e.contract);
        let at = (scope, e.nonce);
        // A replacement releases the jobs and escrows of the digests it replaces: those can
        // never land, so what only they named is free to settle in a later batch.
        for old in self.signed.get(&at).into_iter().flatten() {
            for id in &old.escrow_ids {
                if self.escrows.get(&(scope, *id)) == Some(&e.nonce) {
                    self.escrows.remove(&(scope, *id));
                }
            }
            for job in &old.job_ids {
                if self.jobs.get(job) == Some(&at) {
                    self.jobs.remove(job);
                }
            }
        }
        for id in &e.escrow_ids {
            self.escrows.insert((scope, *id), e.nonce);
        }
        for job in &e.job_ids {
            self.jobs.insert(*job, at);
        }
        self.signed.entry(at).or_default().push(e);
    }

    fn at_nonce<'a>(&'a self, batch: &ChainBatch) -> impl Iterator<Item = &'a SignedEntry> {
        let nonce = batch.nonce;
        scopes(batch)
            .into_iter()
            .flat_map(move |scope| self.signed.get(&(scope, nonce)).into_iter().flatten())
    }

    /// Digests other than `digest` this signer signed at `batch`'s nonce on its deployment,
    /// with the escrows each names: each must be shown dead before another digest is signed.
    pub(super) fn rivals(&self, batch: &ChainBatch, digest: B256) -> Vec<(B256, Vec<u64>)> {
        self.at_nonce(batch)
            .filter(|e| e.digest != digest)
            .map(|e| (e.digest, e.escrow_ids.clone()))
            .collect()
    }

    /// Reasons the log forbids signing `batch` (empty when it may). `dead` are rival digests
    /// at its nonce shown never to land.
    pub(super) fn conflicts(&self, batch: &ChainBatch, digest: B256, dead: &[B256]) -> Vec<String> {
        let mut out = Vec::new();
        for e in self.at_nonce(batch) {
            if e.digest != digest && !dead.contains(&e.digest) {
                out.push(format!(
                    "already signed a different batch at nonce {} on chain {} ({}), and no \
                     escrow of it was reclaimed: it can still land",
                    batch.nonce, batch.chain_id, e.digest
                ));
            }
        }
        for r in &batch.receipts {
            let r = &r.receipt.receipt;
            for scope in scopes(batch) {
                if let Some(n) = self.escrows.get(&(scope, r.escrow_id))
                    && *n != batch.nonce
                {
                    out.push(format!(
                        "escrow {} was already settled by batch {n}",
                        r.escrow_id
                    ));
                }
            }
            if let Some(((c, contract), n)) = self.jobs.get(&B256::from(r.job_id)) {
                let here = *c == batch.chain_id
                    && contract.is_none_or(|a| a == batch.contract)
                    && *n == batch.nonce;
                if !here {
                    out.push(format!(
                        "job {} was already settled by batch {n} on chain {c}",
                        hex::encode(r.job_id)
                    ));
                }
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
        let at = ((batch.chain_id, Some(batch.contract)), batch.nonce);
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
            contract: Some(batch.contract),
            nonce: batch.nonce,
            digest,
            // A tab pays many jobs: each escrow once.
            escrow_ids: batch
                .receipts
                .iter()
                .map(|r| r.receipt.receipt.escrow_id)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            job_ids: batch
                .receipts
                .iter()
                .map(|r| B256::from(r.receipt.receipt.job_id))
                .collect(),
            replaces,
        };
        self.append(format!("{}\n", serde_json::to_string(&entry)?).as_bytes())?;
        self.index(entry);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{self, Escrow};
    use alloy::primitives::U256;
    use cx_protocol::pq::Identity;
    use cx_protocol::voucher::Parties;

    fn batch(contract: u8, nonce: u64, escrow_ids: &[u64]) -> ChainBatch {
        let provider = Identity::from_seed([5; 32]);
        let exchange = Identity::from_seed([6; 32]);
        let buyer_identity = Identity::from_seed([7; 32]);
        let buyer = k256::ecdsa::SigningKey::from_slice(&[8; 32]).unwrap();
        let parties = Parties {
            buyer: &buyer,
            buyer_identity: &buyer_identity,
            exchange: &exchange,
            provider: &provider,
            payout: Address::repeat_byte(0xaa),
        };
        let domain = cx_protocol::order::domain(7, Address::repeat_byte(contract));
        let receipts = escrow_ids
            .iter()
            .map(|&escrow_id| {
                parties
                    .intent_job(&domain, escrow_id, escrow_id, 1, 1, 1)
                    .unwrap()
            })
            .collect();
        let escrows = escrow_ids
            .iter()
            .map(|&id| {
                let e = Escrow {
                    escrow_id: id,
                    buyer: cx_protocol::order::account_of(&buyer),
                    amount: 10,
                    reclaimable_at_s: u64::MAX,
                };
                (id, e)
            })
            .collect();
        ledger::assemble(
            ledger::Head {
                chain_id: 7,
                contract: Address::repeat_byte(contract),
                key_epoch: 0,
                nonce,
                fee: Default::default(),
            },
            receipts,
            &escrows,
            vec![(Address::repeat_byte(1), U256::from(1))],
        )
        .unwrap()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cx-record-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("signed.jsonl")
    }

    /// What broke: promises were keyed by chain alone, so after a redeploy on one chain (nonce
    /// 1 again, escrow ids from 0 again) the signer refused every batch of the new contract.
    #[test]
    fn a_redeployed_contract_is_not_blocked_by_the_old_ones_record() {
        let path = scratch("redeploy");
        let mut log = SignedLog::open(path.clone()).unwrap();
        let old = batch(0xa1, 1, &[0, 1]);
        log.record(&old, old.digest(), vec![]).unwrap();
        let new = batch(0xb2, 1, &[0, 1]);
        assert!(log.conflicts(&new, new.digest(), &[]).is_empty());
        // On the old contract the promise stands, before and after a restart.
        let other = batch(0xa1, 1, &[0]);
        assert!(!log.conflicts(&other, other.digest(), &[]).is_empty());
        let log = SignedLog::open(path.clone()).unwrap();
        assert!(!log.conflicts(&other, other.digest(), &[]).is_empty());
        assert!(log.conflicts(&new, new.digest(), &[]).is_empty());
        // A record from before contracts were kept binds every contract of its chain.
        let legacy = format!(
            "{{\"chain_id\":7,\"nonce\":2,\"digest\":\"{}\",\"escrow_ids\":[5],\"job_ids\":[]}}\n",
            B256::repeat_byte(9)
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(legacy.as_bytes())
            .unwrap();
        let log = SignedLog::open(path).unwrap();
        let next = batch(0xb2, 2, &[5]);
        assert_eq!(log.conflicts(&next, next.digest(), &[]).len(), 1);
    }

    /// What broke: a crash in the middle of appending left a torn last line, and the signer
    /// could not start (or, had it skipped bad lines, could forget a whole promise).
    #[test]
    fn a_torn_last_record_is_cut_off_and_a_whole_one_is_never_forgotten() {
        let path = scratch("torn");
        let mut log = SignedLog::open(path.clone()).unwrap();
        let first = batch(0xa1, 1, &[0]);
        log.record(&first, first.digest(), vec![]).unwrap();
        let good = std::fs::read(&path).unwrap();
        // Torn: a prefix of the next record, no newline.
        let second = batch(0xa1, 2, &[1]);
        let mut torn = good.clone();
        torn.extend_from_slice(b"{\"chain_id\":7,\"contract\":\"0xa1a1");
        std::fs::write(&path, &torn).unwrap();
        let mut log = SignedLog::open(path.clone()).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            good,
            "cut back to the whole records"
        );
        let rival = batch(0xa1, 1, &[0, 3]);
        assert!(!log.conflicts(&rival, rival.digest(), &[]).is_empty());
        log.record(&second, second.digest(), vec![]).unwrap();
        let log = SignedLog::open(path.clone()).unwrap();
        let rival2 = batch(0xa1, 2, &[2]);
        assert!(!log.conflicts(&rival2, rival2.digest(), &[]).is_empty());

        // Whole but for its newline: kept, and the newline added.
        let mut text = std::fs::read(&path).unwrap();
        text.pop();
        std::fs::write(&path, &text).unwrap();
        let log = SignedLog::open(path.clone()).unwrap();
        assert!(!log.conflicts(&rival2, rival2.digest(), &[]).is_empty());
        assert!(std::fs::read(&path).unwrap().ends_with(b"}\n"));

        // A bad line that is not the last is corruption: refused.
        let mut text = b"not json\n".to_vec();
        text.extend(std::fs::read(&path).unwrap());
        std::fs::write(&path, &text).unwrap();
        assert!(SignedLog::open(path).is_err());
    }

    #[test]
    fn a_replacement_frees_what_only_the_dead_digest_named() {
        let path = scratch("replace");
        let mut log = SignedLog::open(path.clone()).unwrap();
        let dead = batch(0xa1, 1, &[0, 1, 2]);
        log.record(&dead, dead.digest(), vec![]).unwrap();
        let replacement = batch(0xa1, 1, &[1]);
        assert_eq!(
            log.rivals(&replacement, replacement.digest()),
            vec![(dead.digest(), vec![0, 1, 2])]
        );
        assert!(
            !log.conflicts(&replacement, replacement.digest(), &[])
                .is_empty()
        );
        assert!(
            log.conflicts(&replacement, replacement.digest(), &[dead.digest()])
                .is_empty()
        );
        log.record(&replacement, replacement.digest(), vec![dead.digest()])
            .unwrap();
        // Escrow 2 was only in the dead digest: free at the next nonce, after a restart too.
        let log = SignedLog::open(path).unwrap();
        let next = batch(0xa1, 2, &[2]);
        assert!(log.conflicts(&next, next.digest(), &[]).is_empty());
        let again = batch(0xa1, 2, &[1]);
        assert!(!log.conflicts(&again, again.digest(), &[]).is_empty());
    }
}
