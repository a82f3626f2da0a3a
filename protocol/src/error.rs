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
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The field the error names (dotted path).
    pub fn field(&self) -> &str {
        match self {
            Error::InvalidField { field, .. } | Error::AttestedUnavailable { field } => field,
            Error::Session(_) => "session",
            Error::NotEnoughEvictable { .. } => "memory_bytes",
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
            other @ (Error::Session(_) | Error::NotEnoughEvictable { .. }) => other,
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
