//! An account's access credential: what lets an account act at one exchange without a session
//! key and without spending — read its own jobs (their outputs above all), or store content
//! (adapters, datasets) under its quota.
//!
//! The account signs a short text message with EIP-191 `personal_sign` (what every wallet and
//! `eth-account`'s `encode_defunct(text=…)` sign), naming what it allows, the account, the
//! exchange it is for (its ML-DSA key hash, `GET /v1/exchange`) and when it stops being good:
//!
//! ```text
//! compute-exchange read            (or: compute-exchange store)
//! account: 0x…   (EIP-55)
//! exchange: 0x…  (the exchange's ML-DSA key hash)
//! expires: 1767225600
//! ```
//!
//! and sends it as `Authorization: CX-Read account=0x…,expires=1767225600,signature=0x…` (or
//! `CX-Store …`). The scope is in the signed text, so a read credential never stores and a store
//! credential never reads; naming the exchange keeps one given to one exchange from acting at
//! another; the expiry, at most [`MAX_LIFETIME_S`] ahead, bounds what a leaked header can do.
//! Nothing it carries can spend.

use alloy_primitives::{Address, B256, eip191_hash_message};
use k256::ecdsa::SigningKey;

use crate::order::{recover_signer, sign_digest};

/// What a credential allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Reading the account's jobs.
    Read,
    /// Storing content (adapters, datasets) under the account's quota.
    Store,
}

impl Scope {
    /// The `Authorization` scheme that carries it.
    pub fn scheme(self) -> &'static str {
        match self {
            Scope::Read => "CX-Read",
            Scope::Store => "CX-Store",
        }
    }

    /// The word the signed message names it by.
    fn word(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Store => "store",
        }
    }

    /// The scope whose scheme `scheme` is (case-insensitive).
    pub fn of_scheme(scheme: &str) -> Option<Self> {
        [Scope::Read, Scope::Store]
            .into_iter()
            .find(|s| s.scheme().eq_ignore_ascii_case(scheme))
    }
}

/// Longest a credential may be good for, seconds from when it is presented.
pub const MAX_LIFETIME_S: u64 = 3600;

/// What a credential says: this account may do this, at this exchange, until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessGrant {
    /// What it allows.
    pub scope: Scope,
    /// The account it acts for.
    pub account: Address,
    /// The exchange it is good at (its ML-DSA-65 key hash).
    pub exchange: B256,
    /// Unix seconds after which it is refused.
    pub expires_s: u64,
}

/// Why a credential was refused (the HTTP door answers 401 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The header is not `<scheme> account=…,expires=…,signature=…` of the scope asked for.
    #[error("an access credential is `<scheme> account=0x…,expires=<unix s>,signature=0x…`: {0}")]
    Malformed(String),
    /// The signature is not the named account's over this exchange's message.
    #[error("the signature is not {0}'s over this exchange's message for this scope")]
    NotSigner(Address),
    /// It has expired.
    #[error("the credential expired at {0}")]
    Expired(u64),
    /// It is good for longer than [`MAX_LIFETIME_S`].
    #[error("a credential is good for at most {MAX_LIFETIME_S} s; this one until {0}")]
    TooLong(u64),
}

impl AccessGrant {
    /// The text the account signs.
    pub fn message(&self) -> String {
        format!(
            "compute-exchange {}\naccount: {}\nexchange: {}\nexpires: {}",
            self.scope.word(),
            self.account.to_checksum(None),
            self.exchange,
            self.expires_s
        )
    }

    /// The `Authorization` header value, signed with `key` (whose account must be `account`).
    pub fn authorization(&self, key: &SigningKey) -> String {
        let digest = eip191_hash_message(self.message());
        let signature = sign_digest(key, &digest);
        format!(
            "{} account={},expires={},signature=0x{}",
            self.scope.scheme(),
            self.account.to_checksum(None),
            self.expires_s,
            hex::encode(signature)
        )
    }

    /// The account a header value proves for `scope`, at exchange `exchange` at `now_s`: the
    /// scheme is the scope's, the parameters parse, the signature (canonical, low s) recovers the
    /// named account over the message for this scope and exchange, and the expiry is ahead but
    /// no more than [`MAX_LIFETIME_S`].
    pub fn verify(
        value: &str,
        scope: Scope,
        exchange: B256,
        now_s: u64,
    ) -> Result<Address, AccessError> {
        let malformed = |why: &str| AccessError::Malformed(why.to_owned());
        let (scheme, params) = value
            .trim()
            .split_once(' ')
            .ok_or_else(|| malformed("no parameters"))?;
        if !scheme.eq_ignore_ascii_case(scope.scheme()) {
            return Err(AccessError::Malformed(format!(
                "this needs a `{}` credential",
                scope.scheme()
            )));
        }
        let (mut account, mut expires, mut signature) = (None, None, None);
        for param in params.split(',') {
            let (name, value) = param
                .trim()
                .split_once('=')
                .ok_or_else(|| malformed("a parameter without `=`"))?;
            let slot = match name {
                "account" => &mut account,
                "expires" => &mut expires,
                "signature" => &mut signature,
                other => {
                    return Err(AccessError::Malformed(format!(
                        "unknown parameter `{other}`"
                    )));
                }
            };
            if slot.replace(value).is_some() {
                return Err(AccessError::Malformed(format!("`{name}` given twice")));
            }
        }
        let account: Address = account
            .ok_or_else(|| malformed("`account` is missing"))?
            .parse()
            .map_err(|_| malformed("`account` is a 0x-hex address"))?;
        let expires_s: u64 = expires
            .ok_or_else(|| malformed("`expires` is missing"))?
            .parse()
            .map_err(|_| malformed("`expires` is unix seconds"))?;
        let signature = signature.ok_or_else(|| malformed("`signature` is missing"))?;
        let signature = signature
            .strip_prefix("0x")
            .and_then(|h| hex::decode(h).ok())
            .ok_or_else(|| malformed("`signature` is 0x-hex"))?;
        if expires_s <= now_s {
            return Err(AccessError::Expired(expires_s));
        }
        if expires_s - now_s > MAX_LIFETIME_S {
            return Err(AccessError::TooLong(expires_s));
        }
        let grant = AccessGrant {
            scope,
            account,
            exchange,
            expires_s,
        };
        let digest = eip191_hash_message(grant.message());
        let signer = recover_signer("signature", &signature, &digest)
            .map_err(|e| AccessError::Malformed(e.to_string()))?;
        if signer != account {
            return Err(AccessError::NotSigner(account));
        }
        Ok(account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SigningKey {
        SigningKey::from_bytes(&[byte; 32].into()).unwrap()
    }

    fn grant(key: &SigningKey, expires_s: u64) -> AccessGrant {
        AccessGrant {
            scope: Scope::Read,
            account: crate::order::account_of(key),
            exchange: B256::repeat_byte(0xee),
            expires_s,
        }
    }

    #[test]
    fn a_credential_proves_its_account_at_its_exchange_until_it_expires() {
        let k = key(7);
        let g = grant(&k, 1_000 + 600);
        let header = g.authorization(&k);
        assert_eq!(
            AccessGrant::verify(&header, Scope::Read, g.exchange, 1_000),
            Ok(g.account)
        );
        // Another exchange's credential does not read here.
        assert_eq!(
            AccessGrant::verify(&header, Scope::Read, B256::repeat_byte(0xdd), 1_000),
            Err(AccessError::NotSigner(g.account))
        );
        assert_eq!(
            AccessGrant::verify(&header, Scope::Read, g.exchange, 1_600),
            Err(AccessError::Expired(1_600))
        );
        let long = grant(&k, 1_000 + MAX_LIFETIME_S + 1);
        assert!(matches!(
            AccessGrant::verify(&long.authorization(&k), Scope::Read, g.exchange, 1_000),
            Err(AccessError::TooLong(_))
        ));
    }

    #[test]
    fn a_credential_naming_another_account_or_altered_is_refused() {
        let (k, other) = (key(7), key(8));
        let mut g = grant(&k, 2_000);
        g.account = crate::order::account_of(&other);
        // Signed by k, but naming `other`'s account.
        let header = g.authorization(&k);
        assert_eq!(
            AccessGrant::verify(&header, Scope::Read, g.exchange, 1_000),
            Err(AccessError::NotSigner(g.account))
        );
        let honest = grant(&k, 2_000).authorization(&k);
        let later = honest.replace("expires=2000", "expires=2001");
        assert!(AccessGrant::verify(&later, Scope::Read, g.exchange, 1_000).is_err());
        for bad in [
            "",
            "CX-Read",
            "Bearer abc",
            "CX-Read account=0x1",
            "CX-Read account=0x00,expires=1,signature=0x00,extra=1",
        ] {
            assert!(
                matches!(
                    AccessGrant::verify(bad, Scope::Read, g.exchange, 1_000),
                    Err(AccessError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_read_credential_never_stores_and_a_store_credential_never_reads() {
        let k = key(7);
        let read = grant(&k, 2_000);
        let store = AccessGrant {
            scope: Scope::Store,
            ..read
        };
        let (r, s) = (read.authorization(&k), store.authorization(&k));
        assert!(s.starts_with("CX-Store "), "{s}");
        assert_eq!(
            AccessGrant::verify(&s, Scope::Store, read.exchange, 1_000),
            Ok(read.account)
        );
        assert!(matches!(
            AccessGrant::verify(&r, Scope::Store, read.exchange, 1_000),
            Err(AccessError::Malformed(_))
        ));
        // The read signature under the store scheme: the signed text names another scope.
        let relabelled = r.replacen("CX-Read", "CX-Store", 1);
        assert_eq!(
            AccessGrant::verify(&relabelled, Scope::Store, read.exchange, 1_000),
            Err(AccessError::NotSigner(read.account))
        );
    }
}
