//! Agents' identities: the binding of an Ethereum account to its ML-DSA-65 key, made once.

use super::store::{Books, json_text, to_i64};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};

/// A binding as the books keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBinding {
    /// The Ethereum account.
    pub account: Address,
    /// The chain whose domain the binding was signed under.
    pub chain_id: u64,
    /// The ML-DSA-65 public key (encoded).
    pub mldsa_key: Vec<u8>,
    /// SHA-256 of that key.
    pub mldsa_key_hash: B256,
    /// Both signatures, as received, so anyone can re-check them.
    pub binding: serde_json::Value,
}

impl Books {
    /// Stores a verified binding. Binding again with the same key is a no-op; another key for a
    /// bound account, or a key another account holds, is a conflict.
    pub async fn bind(&self, b: &StoredBinding) -> Result<()> {
        let done = sqlx::query(
            "INSERT INTO exchange_bindings (account, chain_id, mldsa_key, mldsa_key_hash, binding) \
             VALUES ($1, $2, $3, $4, $5::jsonb) ON CONFLICT DO NOTHING",
        )
        .bind(b.account.as_slice())
        .bind(to_i64(b.chain_id, "chain id")?)
        .bind(&b.mldsa_key)
        .bind(b.mldsa_key_hash.as_slice())
        .bind(json_text(&b.binding))
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        match self.binding(b.account).await? {
            Some(existing) if existing.mldsa_key_hash == b.mldsa_key_hash => Ok(()),
            Some(_) => Err(Error::AccountAlreadyBound(b.account)),
            None => Err(Error::KeyAlreadyBound),
        }
    }

    /// The binding of `account`, if it has one.
    pub async fn binding(&self, account: Address) -> Result<Option<StoredBinding>> {
        let row: Option<(i64, Vec<u8>, Vec<u8>, String)> = sqlx::query_as(
            "SELECT chain_id, mldsa_key, mldsa_key_hash, binding::text \
             FROM exchange_bindings WHERE account = $1",
        )
        .bind(account.as_slice())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(chain_id, mldsa_key, hash, binding)| {
            Ok(StoredBinding {
                account,
                chain_id: chain_id as u64,
                mldsa_key,
                mldsa_key_hash: B256::try_from(hash.as_slice()).map_err(|_| Error::Corrupt {
                    what: "a key hash",
                    value: hex::encode(&hash),
                })?,
                binding: serde_json::from_str(&binding)?,
            })
        })
        .transpose()
    }
}
