//! The signer's own copy of each deployment's cumulative balances, so a sign request can carry
//! the batch's receipts and the balances root it builds on instead of every party's balance.
//!
//! Per (chain, `Settlement` contract), the few most recent lists this signer knows, each under
//! the root it hashes to (computed here, never taken from a request): the contract's current
//! list, and the new lists of batches this signer signed (one of which lands next). A request
//! names the root it builds on; the signer checks that root against the chain as before, takes
//! the list from here, and stores the batch's new list once it signs. A signer that does not
//! know the root (it sat out a signing set, or is new) refuses with [`UNKNOWN_BALANCES`], and the
//! coordinator sends the full list once; the signer checks it against the chain's root and keeps
//! it. Kept in `balances.json` in the data folder (written atomically), so a restart does not
//! cost a full list.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use alloy::primitives::{Address, B256, U256};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ledger;

/// What a signer answers when it does not hold the balances a request builds on (the
/// coordinator then sends the full list).
pub const UNKNOWN_BALANCES: &str = "unknown balances root";

/// Lists kept per deployment (the current one and the candidates signed on top of it).
const KEPT_PER_DEPLOYMENT: usize = 4;

type Balances = Vec<(Address, U256)>;

#[derive(Default, Serialize, Deserialize)]
struct Book {
    /// "chain:contract" → (root, list), oldest first.
    deployments: HashMap<String, VecDeque<(B256, Balances)>>,
}

/// The balance lists this signer knows.
pub(super) struct BalanceBook {
    path: PathBuf,
    book: Book,
}

fn key(chain_id: u64, contract: Address) -> String {
    format!("{chain_id}:{contract}")
}

impl BalanceBook {
    pub(super) fn open(path: PathBuf) -> Result<Self> {
        let book = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| Error::JsonFile {
                path: path.clone(),
                source,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Book::default(),
            Err(e) => return Err(Error::io(&path)(e)),
        };
        Ok(Self { path, book })
    }

    /// The list with `root` on (chain, contract): the empty one for the contract's initial root.
    pub(super) fn get(&self, chain_id: u64, contract: Address, root: B256) -> Option<Balances> {
        if root == ledger::no_balances_root() {
            return Some(Vec::new());
        }
        self.book
            .deployments
            .get(&key(chain_id, contract))?
            .iter()
            .find(|(r, _)| *r == root)
            .map(|(_, list)| list.clone())
    }

    /// Keeps `list` under the root it hashes to (the oldest list goes when there are too many).
    pub(super) fn insert(
        &mut self,
        chain_id: u64,
        contract: Address,
        list: Balances,
    ) -> Result<()> {
        let root = ledger::balances_root(&list)?;
        if self.get(chain_id, contract, root).is_some() {
            return Ok(());
        }
        let kept = self
            .book
            .deployments
            .entry(key(chain_id, contract))
            .or_default();
        kept.push_back((root, list));
        while kept.len() > KEPT_PER_DEPLOYMENT {
            kept.pop_front();
        }
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&self.book)?).map_err(Error::io(&tmp))?;
        std::fs::rename(&tmp, &self.path).map_err(Error::io(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_kept_under_their_own_root_and_survive_a_restart() {
        let dir = std::env::temp_dir().join(format!("cx-balances-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("balances.json");
        let _ = std::fs::remove_file(&path);
        let contract = Address::repeat_byte(0xcc);
        let mut book = BalanceBook::open(path.clone()).unwrap();
        assert_eq!(
            book.get(7, contract, ledger::no_balances_root()),
            Some(vec![])
        );
        let lists: Vec<Balances> = (1..=6u64)
            .map(|i| vec![(Address::repeat_byte(1), U256::from(i))])
            .collect();
        for list in &lists {
            book.insert(7, contract, list.clone()).unwrap();
        }
        let root = |l: &Balances| ledger::balances_root(l).unwrap();
        let book = BalanceBook::open(path).unwrap();
        assert_eq!(
            book.get(7, contract, root(&lists[5])),
            Some(lists[5].clone())
        );
        assert_eq!(
            book.get(7, contract, root(&lists[2])),
            Some(lists[2].clone())
        );
        assert_eq!(
            book.get(7, contract, root(&lists[1])),
            None,
            "only the newest four"
        );
        assert_eq!(book.get(8, contract, root(&lists[5])), None, "per chain");
        assert_eq!(
            book.get(7, Address::ZERO, root(&lists[5])),
            None,
            "per contract"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
