//! The crate's one error type.

/// What is wrong with a value a party sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A field holds a value outside its domain (zero, negative, not finite, too large).
    #[error("{field}: {reason}")]
    InvalidField {
        /// Dotted path of the offending field, e.g. `job.deadline_s`.
        field: String,
        /// What the value must be instead.
        reason: String,
    },
    /// A post-quantum session handshake or frame was refused; nothing was accepted from it.
    #[error("session refused: {0}")]
    Session(String),
    /// Room cannot be made without evicting pinned occupants.
    #[error(
        "cannot free {needed_bytes} bytes: only {evictable_bytes} are evictable (the rest is pinned)"
    )]
    NotEnoughEvictable {
        /// Bytes asked for.
        needed_bytes: u64,
        /// Bytes that could be freed.
        evictable_bytes: u64,
    },
    /// The attested-execution tier exists in the registry, but no provider here can offer it.
    #[error(
        "{field}: tier `attested` (TEE) cannot be offered by any provider on this exchange; ask for T0–T3"
    )]
    AttestedUnavailable {
        /// Where the tier was named.
        field: String,
    },
    /// An order, grant or binding came without its EIP-712 (secp256k1) signature.
    #[error(
        "{field}: missing: sign the EIP-712 typed data (eth_signTypedData_v4) with the account"
    )]
    SignatureMissing {
        /// Where the signature belongs, e.g. `signature`.
        field: String,
    },
    /// The EIP-712 signature is not a well-formed, canonical 65-byte secp256k1 signature.
    #[error("{field}: {reason}")]
    SignatureMalformed {
        /// Where the signature was, e.g. `signature`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The EIP-712 signature recovers another account than the one the order names: it was made
    /// by another key, over other data, or under another domain (chain id, contract).
    #[error(
        "{field}: recovers {recovered}, not the account {claimed}: signed by another key, over other data, or for another chain or contract"
    )]
    SignerMismatch {
        /// Where the signature was.
        field: String,
        /// The account the order names.
        claimed: String,
        /// The account the signature recovers.
        recovered: String,
    },
    /// The order names an EIP-712 domain (chain id or verifying contract) other than the one this
    /// chain uses.
    #[error("{field}: the order is for {got}; this chain's domain uses {expected}")]
    WrongDomain {
        /// `chain_id` or `verifying_contract`.
        field: String,
        /// What this chain's domain holds.
        expected: String,
        /// What the order names.
        got: String,
    },
    /// The ML-DSA co-signature is absent.
    #[error("{field}: missing: co-sign the EIP-712 digest with the account's bound ML-DSA-65 key")]
    CosignatureMissing {
        /// Where the co-signature belongs, e.g. `mldsa_signature`.
        field: String,
    },
    /// The ML-DSA co-signature does not verify under the key bound to the account.
    #[error("{field}: {reason}")]
    CosignatureInvalid {
        /// Where the co-signature was.
        field: String,
        /// Why it does not verify.
        reason: String,
    },
    /// The account has no ML-DSA key bound to it, so its co-signature cannot be checked.
    #[error("account {account} has no bound ML-DSA key: bind one first (a signed PqBinding)")]
    Unbound {
        /// The account (0x-hex).
        account: String,
    },
    /// The order's expiry has passed.
    #[error(
        "{field}: the order expired at {expiry_s} (now {now_s}): sign it again with a later expiry"
    )]
    Expired {
        /// Where the expiry is, e.g. `order.expiry_s`.
        field: String,
        /// The expiry, unix seconds.
        expiry_s: u64,
        /// The time checked against, unix seconds.
        now_s: u64,
    },
    /// The order's deadline is not in the future.
    #[error(
        "{field}: the deadline {deadline_s} is not after now ({now_s}): choose a later deadline"
    )]
    DeadlinePassed {
        /// Where the deadline is, e.g. `order.deadline_s`.
        field: String,
        /// The deadline, unix seconds.
        deadline_s: u64,
        /// The time checked against, unix seconds.
        now_s: u64,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The field the error names (dotted path).
    pub fn field(&self) -> &str {
        match self {
            Error::InvalidField { field, .. }
            | Error::AttestedUnavailable { field }
            | Error::SignatureMissing { field }
            | Error::SignatureMalformed { field, .. }
            | Error::SignerMismatch { field, .. }
            | Error::WrongDomain { field, .. }
            | Error::CosignatureMissing { field }
            | Error::CosignatureInvalid { field, .. }
            | Error::Expired { field, .. }
            | Error::DeadlinePassed { field, .. } => field,
            Error::Session(_) => "session",
            Error::NotEnoughEvictable { .. } => "memory_bytes",
            Error::Unbound { .. } => "account",
        }
    }

    /// A stable machine-readable code for the error (snake case), for an API's
    /// `{ "error": { "code" } }`; the edge still chooses the status.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidField { .. } => "invalid_field",
            Error::Session(_) => "session_refused",
            Error::NotEnoughEvictable { .. } => "not_enough_evictable",
            Error::AttestedUnavailable { .. } => "tier_unavailable",
            Error::SignatureMissing { .. } => "signature_missing",
            Error::SignatureMalformed { .. } => "signature_malformed",
            Error::SignerMismatch { .. } => "signature_wrong",
            Error::WrongDomain { .. } => "wrong_domain",
            Error::CosignatureMissing { .. } => "cosignature_missing",
            Error::CosignatureInvalid { .. } => "cosignature_wrong",
            Error::Unbound { .. } => "cosignature_unbound",
            Error::Expired { .. } => "expired",
            Error::DeadlinePassed { .. } => "deadline_passed",
        }
    }

    /// Prefixes the field path, so nested validation names the whole path (`bundles[3].rtt_s`).
    pub fn within(self, prefix: &str) -> Self {
        match self {
            Error::InvalidField { field, reason } => Error::InvalidField {
                field: format!("{prefix}.{field}"),
                reason,
            },
            Error::AttestedUnavailable { field } => Error::AttestedUnavailable {
                field: format!("{prefix}.{field}"),
            },
            Error::Expired {
                field,
                expiry_s,
                now_s,
            } => Error::Expired {
                field: format!("{prefix}.{field}"),
                expiry_s,
                now_s,
            },
            Error::DeadlinePassed {
                field,
                deadline_s,
                now_s,
            } => Error::DeadlinePassed {
                field: format!("{prefix}.{field}"),
                deadline_s,
                now_s,
            },
            // Signature errors name envelope fields, which have no enclosing path.
            other @ (Error::Session(_)
            | Error::NotEnoughEvictable { .. }
            | Error::SignatureMissing { .. }
            | Error::SignatureMalformed { .. }
            | Error::SignerMismatch { .. }
            | Error::WrongDomain { .. }
            | Error::CosignatureMissing { .. }
            | Error::CosignatureInvalid { .. }
            | Error::Unbound { .. }) => other,
        }
    }
}

/// Checks that `value` is finite and strictly positive.
pub fn positive(field: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidField {
            field: field.to_owned(),
            reason: format!("must be a finite number > 0, got {value}"),
        })
    }
}

/// Checks that `value` is finite and not negative.
pub fn non_negative(field: &str, value: f64) -> Result<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidField {
            field: field.to_owned(),
            reason: format!("must be a finite number >= 0, got {value}"),
        })
    }
}

/// Checks that an integer is not zero.
pub fn nonzero(field: &str, value: u64) -> Result<()> {
    if value > 0 {
        Ok(())
    } else {
        Err(Error::InvalidField {
            field: field.to_owned(),
            reason: "must be > 0".to_owned(),
        })
    }
}
