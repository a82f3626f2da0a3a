//! A buyer's read credential: what lets an account read its own jobs (their outputs above all)
//! at one exchange, without a session key.
//!
//! The account signs a short text message with EIP-191 `personal_sign` (what every wallet and
//! `eth-account`'s `encode_defunct(text=…)` sign), naming the account, the exchange it is for
//! (its ML-DSA key hash, `GET /v1/exchange`) and when it stops being good:
//!
//! ```text
//! compute-exchange read
//! account: 0x…   (EIP-55)
//! exchange: 0x…  (the exchange's ML-DSA key hash)
//! expires: 1767225600
//! ```
//!
//! and sends it as `Authorization: CX-Read account=0x…,expires=1767225600,signature=0x…`. Naming
//! the exchange keeps a credential given to one exchange from reading at another; the expiry,
//! at most [`MAX_LIFETIME_S`] ahead, bounds what a leaked header can read. It authorises reads
//! only — nothing it carries can spend.

use alloy_primitives::{Address, B256, eip191_hash_message};
use k256::ecdsa::SigningKey;

use crate::order::{recover_signer, sign_digest};

/// The scheme of the `Authorization` header that carries a read credential.
pub const SCHEME: &str = "CX-Read";

/// Longest a credential may be good for, seconds from when it is presented.
pub const MAX_LIFETIME_S: u64 = 3600;

/// What a read credential says: this account, at this exchange, until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadGrant {
    /// The account whose jobs may be read.
    pub account: Address,
    /// The exchange it is good at (its ML-DSA-65 key hash).
    pub exchange: B256,
    /// Unix seconds after which it is refused.
    pub expires_s: u64,
}

/// Why a read credential was refused (the HTTP door answers 401 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The header is not `CX-Read account=…,expires=…,signature=…`.
    #[error("a read credential is `CX-Read account=0x…,expires=<unix s>,signature=0x…`: {0}")]
    Malformed(String),
    /// The signature is not the named account's over this exchange's message.
    #[error("the signature is not {0}'s over this exchange's read message")]
    NotSigner(Address),
    /// It has expired.
    #[error("the read credential expired at {0}")]
    Expired(u64),
    /// It is good for longer than [`MAX_LIFETIME_S`].
    #[error("a read credential is good for at most {MAX_LIFETIME_S} s; this one until {0}")]
    TooLong(u64),
}

impl ReadGrant {
    /// The text the account signs.
    pub fn message(&self) -> String {
        format!(
            "compute-exchange read\naccount: {}\nexchange: {}\nexpires: {}",
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
            "{SCHEME} account={},expires={},signature=0x{}",
            self.account.to_checksum(None),
            self.expires_s,
            hex::encode(signature)
        )
    }

    /// The account a header value proves, at exchange `exchange` at `now_s`: the parameters
    /// parse, the signature (canonical, low s) recovers the named account over the message for
    /// this exchange, and the expiry is ahead but no more than [`MAX_LIFETIME_S`].
    pub fn verify(value: &str, exchange: B256, now_s: u64) -> Result<Address, ReadError> {
        let malformed = |why: &str| ReadError::Malformed(why.to_owned());
        let (scheme, params) = value
            .trim()
            .split_once(' ')
            .ok_or_else(|| malformed("no parameters"))?;
        if !scheme.eq_ignore_ascii_case(SCHEME) {
            return Err(malformed("another scheme"));
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
                other => return Err(ReadError::Malformed(format!("unknown parameter `{other}`"))),
            };
            if slot.replace(value).is_some() {
                return Err(ReadError::Malformed(format!("`{name}` given twice")));
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
            return Err(ReadError::Expired(expires_s));
        }
        if expires_s - now_s > MAX_LIFETIME_S {
            return Err(ReadError::TooLong(expires_s));
        }
        let grant = ReadGrant {
            account,
            exchange,
            expires_s,
        };
        let digest = eip191_hash_message(grant.message());
        let signer = recover_signer("signature", &signature, &digest)
            .map_err(|e| ReadError::Malformed(e.to_string()))?;
        if signer != account {
            return Err(ReadError::NotSigner(account));
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

    fn grant(key: &SigningKey, expires_s: u64) -> ReadGrant {
        ReadGrant {
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
        assert_eq!(ReadGrant::verify(&header, g.exchange, 1_000), Ok(g.account));
        // Another exchange's credential does not read here.
        assert_eq!(
            ReadGrant::verify(&header, B256::repeat_byte(0xdd), 1_000),
            Err(ReadError::NotSigner(g.account))
        );
        assert_eq!(
            ReadGrant::verify(&header, g.exchange, 1_600),
            Err(ReadError::Expired(1_600))
        );
        let long = grant(&k, 1_000 + MAX_LIFETIME_S + 1);
        assert!(matches!(
            ReadGrant::verify(&long.authorization(&k), g.exchange, 1_000),
            Err(ReadError::TooLong(_))
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
            ReadGrant::verify(&header, g.exchange, 1_000),
            Err(ReadError::NotSigner(g.account))
        );
        let honest = grant(&k, 2_000).authorization(&k);
        let later = honest.replace("expires=2000", "expires=2001");
        assert!(ReadGrant::verify(&later, g.exchange, 1_000).is_err());
        for bad in [
            "",
            "CX-Read",
            "Bearer abc",
            "CX-Read account=0x1",
            "CX-Read account=0x00,expires=1,signature=0x00,extra=1",
        ] {
            assert!(
                matches!(
                    ReadGrant::verify(bad, g.exchange, 1_000),
                    Err(ReadError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
    }
}
