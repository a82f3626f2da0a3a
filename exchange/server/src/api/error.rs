//! [`ApiError`]: every failure a client sees, and the one place that picks its HTTP status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error as the API reports it: `{"error": {"code", "message", "field"}}`.
///
/// Statuses are chosen in [`ApiError::status`] alone. Internal causes (database, chain, I/O) are
/// logged and never echoed: a client learns that something failed, not how the server is built.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A field is missing, of the wrong type or out of range (400).
    #[error("{message}")]
    Invalid {
        /// The field's JSON path (`intent.max_price_wei`), if one field is to blame.
        field: Option<String>,
        /// What is wrong and what is accepted.
        message: String,
    },
    /// The body is not well-formed JSON (400).
    #[error("the body is not valid JSON: {message}")]
    MalformedJson {
        /// The parser's description, with line and column.
        message: String,
    },
    /// The body is not declared as `application/json` (415).
    #[error("expected a body with content-type: application/json")]
    UnsupportedMediaType,
    /// The body exceeds the server's limit (413).
    #[error("the body is larger than this server accepts")]
    PayloadTooLarge,
    /// No such route or resource (404).
    #[error("no such {what}")]
    NotFound {
        /// What was looked for (`route`, `order`, `tab`, ...).
        what: String,
    },
    /// The route exists but not with this method (405).
    #[error("this method is not allowed on this route")]
    MethodNotAllowed,
    /// The request conflicts with what exists (a reused nonce, an existing id) (409).
    #[error("{message}")]
    Conflict {
        /// The field that conflicts, if one does.
        field: Option<String>,
        /// What it conflicts with.
        message: String,
    },
    /// A signature, key or token is missing or does not verify (401).
    #[error("{message}")]
    Unauthorized {
        /// Which credential failed and why.
        message: String,
    },
    /// The service refused the request for a reason of its own (a signature, a tab, a nonce,
    /// no match, …): status and code chosen from the crate's error in `From<crate::Error>`.
    #[error("{message}")]
    Refused {
        /// The status.
        status: StatusCode,
        /// The machine-readable code.
        code: &'static str,
        /// What is wrong and what to do.
        message: String,
        /// The field to blame, if one is.
        field: Option<String>,
    },
    /// A client past its rate limit (429, with `Retry-After`).
    #[error("{message}")]
    RateLimited {
        /// Which limit and how long to wait.
        message: String,
        /// Seconds until the next request is allowed.
        retry_after_s: u64,
    },
    /// More requests are doing work than the server takes at once (503 `overloaded`, with
    /// `Retry-After: 1`): shed at once, nothing was done.
    #[error("{message}")]
    Overloaded {
        /// Which bound.
        message: String,
    },
    /// A part the service depends on (its database) is away for now (503, with
    /// `Retry-After`): nothing was done, and the same request may be sent again.
    #[error("the exchange's database is unavailable for now; nothing was done, send it again")]
    Unavailable {
        /// Seconds to wait before sending it again.
        retry_after_s: u64,
    },
    /// No node holds the writer lease now (a takeover is under way), so a node forwarding to
    /// it had nowhere to send the request (503, with `Retry-After`): nothing was done.
    #[error(
        "no exchange node writes the books right now (a takeover is under way); nothing was done, send it again"
    )]
    NoWriter,
    /// The writer node failed while this node forwarded the request to it (502): it may have
    /// been done. Signed orders are idempotent by nonce; look up the rest before sending again.
    #[error(
        "the exchange node that writes the books failed while answering; the request may have been done: look it up before sending it again"
    )]
    BadGateway,
    /// Something failed inside the server (500); the cause is logged, not returned.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    /// A 400 naming the field to blame.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    /// The HTTP status of this error — the one mapping in the service.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Invalid { .. } | Self::MalformedJson { .. } => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Self::Refused { status, .. } => *status,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable { .. } | Self::Overloaded { .. } | Self::NoWriter => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::BadGateway => StatusCode::BAD_GATEWAY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable, machine-readable code clients branch on.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid_field",
            Self::MalformedJson { .. } => "malformed_json",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::PayloadTooLarge => "payload_too_large",
            Self::NotFound { .. } => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::Conflict { .. } => "conflict",
            Self::Unauthorized { .. } => "unauthorized",
            Self::Refused { code, .. } => code,
            Self::RateLimited { .. } => "rate_limited",
            Self::Unavailable { .. } => "unavailable",
            Self::Overloaded { .. } => "overloaded",
            Self::NoWriter => "no_writer",
            Self::BadGateway => "bad_gateway",
            Self::Internal(_) => "internal",
        }
    }

    /// The same error with its field renamed by `rename` (a door whose fields are named
    /// otherwise than the intake's, such as the OpenAI-compatible one).
    pub fn map_field(mut self, rename: impl FnOnce(&str) -> String) -> Self {
        if let Self::Invalid { field, .. }
        | Self::Conflict { field, .. }
        | Self::Refused { field, .. } = &mut self
            && let Some(f) = field
        {
            *f = rename(f);
        }
        self
    }

    fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. }
            | Self::Conflict { field, .. }
            | Self::Refused { field, .. } => field.as_deref(),
            _ => None,
        }
    }
}

/// Every refusal's body.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

/// What was refused and why.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail<'a> {
    code: &'static str,
    message: String,
    field: Option<&'a str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(cause) = &self {
            // The whole chain of causes, for the operator; the client sees none of it.
            let mut chain = cause.to_string();
            let mut source = cause.source();
            while let Some(inner) = source {
                chain.push_str(": ");
                chain.push_str(&inner.to_string());
                source = inner.source();
            }
            tracing::error!(error = %chain, "request failed inside the server");
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
                field: self.field(),
            },
        };
        let mut response = (self.status(), Json(body)).into_response();
        let retry_after_s = match self {
            Self::RateLimited { retry_after_s, .. } | Self::Unavailable { retry_after_s } => {
                Some(retry_after_s)
            }
            // A slot frees as soon as any request in flight ends; a takeover is a lease period.
            Self::Overloaded { .. } | Self::NoWriter => Some(1),
            _ => None,
        };
        if let Some(retry_after_s) = retry_after_s {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(retry_after_s),
            );
        }
        response
    }
}

/// What a 503 for a database outage tells the client to wait, seconds: about what a
/// PostgreSQL restart takes; the pool reconnects on the first request after it.
const UNAVAILABLE_RETRY_AFTER_S: u64 = 2;

impl From<crate::Error> for ApiError {
    /// The one place a service error becomes a status. Failures of the service's own parts
    /// (database, chain, corrupt rows) are internal: logged, never echoed; the database being
    /// away (restarting, unreachable) is 503 with `Retry-After`.
    fn from(err: crate::Error) -> Self {
        use crate::Error as E;
        let refuse = |status, code, field: Option<&str>, err: &E| Self::Refused {
            status,
            code,
            message: err.to_string(),
            field: field.map(str::to_owned),
        };
        match &err {
            E::Protocol(p) => {
                let status = match p {
                    cx_protocol::Error::SignatureMissing { .. }
                    | cx_protocol::Error::SignatureMalformed { .. }
                    | cx_protocol::Error::SignerMismatch { .. }
                    | cx_protocol::Error::WrongDomain { .. }
                    | cx_protocol::Error::CosignatureMissing { .. }
                    | cx_protocol::Error::CosignatureInvalid { .. }
                    | cx_protocol::Error::Unbound { .. } => StatusCode::UNAUTHORIZED,
                    _ => StatusCode::BAD_REQUEST,
                };
                let field = p.field();
                refuse(status, p.code(), (!field.is_empty()).then_some(field), &err)
            }
            E::Market(cx_exchange::Error::Invalid(p)) => {
                let field = p.field();
                refuse(
                    StatusCode::BAD_REQUEST,
                    "invalid_field",
                    (!field.is_empty()).then_some(field),
                    &err,
                )
            }
            E::AccountAlreadyBound(_) => {
                refuse(StatusCode::CONFLICT, "account_bound", Some("account"), &err)
            }
            E::KeyAlreadyBound => {
                refuse(StatusCode::CONFLICT, "key_bound", Some("mldsa_key"), &err)
            }
            E::UnknownTab { .. } => refuse(
                StatusCode::NOT_FOUND,
                "unknown_tab",
                Some("intent.order.tab_id"),
                &err,
            ),
            E::TabClosed { .. } => refuse(
                StatusCode::CONFLICT,
                "tab_closed",
                Some("intent.order.tab_id"),
                &err,
            ),
            E::TabEndsTooSoon { .. } => refuse(
                StatusCode::CONFLICT,
                "tab_ends_too_soon",
                Some("intent.order.deadline_s"),
                &err,
            ),
            E::TabOverspent { .. } => refuse(
                StatusCode::PAYMENT_REQUIRED,
                "tab_overspent",
                Some("intent.order.tab_id"),
                &err,
            ),
            E::NonceReused { .. } => refuse(
                StatusCode::CONFLICT,
                "nonce_reused",
                Some("intent.order.nonce"),
                &err,
            ),
            E::OrderExists => refuse(StatusCode::CONFLICT, "order_exists", None, &err),
            E::UnknownChain(_) => refuse(
                StatusCode::BAD_REQUEST,
                "unknown_chain",
                Some("intent.chain_id"),
                &err,
            ),
            E::RequestHashMismatch => refuse(
                StatusCode::BAD_REQUEST,
                "request_hash_mismatch",
                Some("request"),
                &err,
            ),
            E::PromptTooLong { .. } => refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "prompt_too_long",
                Some("request.prompt"),
                &err,
            ),
            E::UnknownAdapter => refuse(
                StatusCode::NOT_FOUND,
                "unknown_adapter",
                Some("intent.order.adapter_id"),
                &err,
            ),
            E::UnknownDataset => refuse(
                StatusCode::NOT_FOUND,
                "unknown_dataset",
                Some("train.data"),
                &err,
            ),
            E::UnknownModel(_) => refuse(
                StatusCode::NOT_FOUND,
                "unknown_model",
                Some("intent.order.want"),
                &err,
            ),
            E::NotClearable(_) => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "model_not_clearable",
                Some("intent.order.want"),
                &err,
            ),
            E::ContextTooLarge => refuse(
                StatusCode::BAD_REQUEST,
                "context_too_large",
                Some("request.max_tokens"),
                &err,
            ),
            E::NoMatch { .. } => refuse(StatusCode::UNPROCESSABLE_ENTITY, "no_match", None, &err),
            E::NoReplica { diverse, .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                if *diverse {
                    "no_diverse_committee"
                } else {
                    "no_replica"
                },
                Some("min_tier"),
                &err,
            ),
            E::ZeroMaxTokens => refuse(
                StatusCode::BAD_REQUEST,
                "invalid_field",
                Some("request.max_tokens"),
                &err,
            ),
            // OpenAI's clients know `invalid_api_key`; the message says which case it is.
            E::UnknownSession => refuse(StatusCode::UNAUTHORIZED, "invalid_api_key", None, &err),
            E::SessionRevoked => refuse(StatusCode::UNAUTHORIZED, "session_revoked", None, &err),
            E::SessionExpired { .. } => {
                refuse(StatusCode::UNAUTHORIZED, "session_expired", None, &err)
            }
            E::SessionCapReached { .. } => refuse(
                StatusCode::PAYMENT_REQUIRED,
                "session_cap_reached",
                None,
                &err,
            ),
            E::BearerReused => refuse(
                StatusCode::CONFLICT,
                "bearer_reused",
                Some("grant.order.bearer_hash"),
                &err,
            ),
            E::BundleOwned(_) => refuse(
                StatusCode::CONFLICT,
                "bundle_owned",
                Some("offer.bundles"),
                &err,
            ),
            E::OperatorChanged { .. } => refuse(
                StatusCode::CONFLICT,
                "operator_changed",
                Some("offer.operator"),
                &err,
            ),
            E::UnknownProvider => refuse(StatusCode::UNAUTHORIZED, "unknown_provider", None, &err),
            E::StoreQuota { .. } => refuse(StatusCode::FORBIDDEN, "store_quota", None, &err),
            E::SearchNotOpen => refuse(StatusCode::CONFLICT, "search_not_open", None, &err),
            E::ReserveNotOpen { .. } => {
                refuse(StatusCode::CONFLICT, "reserve_not_open", None, &err)
            }
            E::RentNotOpen { .. } => refuse(StatusCode::CONFLICT, "rent_not_open", None, &err),
            E::NoRentHolder { field, .. } => {
                refuse(StatusCode::CONFLICT, "no_capable_bundle", Some(field), &err)
            }
            E::SearchUnpriced { field, .. } => {
                refuse(StatusCode::CONFLICT, "no_capable_bundle", Some(field), &err)
            }
            E::BidRefused { field, .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bid_refused",
                Some(&format!("bid.{field}")),
                &err,
            ),
            E::NotAWitness { .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_a_witness",
                Some("witness"),
                &err,
            ),
            E::TabFull { .. } => refuse(StatusCode::CONFLICT, "tab_full", Some("tab_id"), &err),
            E::NotStaked { .. } => refuse(
                StatusCode::FORBIDDEN,
                "not_staked",
                Some("offer.payout"),
                &err,
            ),
            E::UnknownJob => refuse(StatusCode::NOT_FOUND, "unknown_job", None, &err),
            E::JobNotRunning { .. } => refuse(StatusCode::CONFLICT, "job_not_running", None, &err),
            E::ResultLate { .. } => refuse(StatusCode::CONFLICT, "result_late", None, &err),
            E::OverCharged { .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "over_charged",
                Some("receipt.receipt.amount_owed_wei"),
                &err,
            ),
            E::ReceiptMismatch { field, .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "receipt_mismatch",
                Some(&format!("receipt.receipt.{field}")),
                &err,
            ),
            E::InvalidOutput { field, .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_output",
                Some(&format!("output.{field}")),
                &err,
            ),
            E::ProductRejected { .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "verification_failed",
                Some("output.product"),
                &err,
            ),
            E::Unsupported { field, .. } => refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unsupported",
                Some(field),
                &err,
            ),
            // A number a client sent (an id, a nonce) past what the books can hold: no such
            // row can exist, and nothing was written.
            E::OutOfRange { .. } => refuse(StatusCode::BAD_REQUEST, "out_of_range", None, &err),
            E::Overloaded { .. } => Self::Overloaded {
                message: err.to_string(),
            },
            E::RateLimited { retry_after_s, .. } => Self::RateLimited {
                message: err.to_string(),
                retry_after_s: *retry_after_s,
            },
            E::Refunded { .. } => refuse(StatusCode::SERVICE_UNAVAILABLE, "refunded", None, &err),
            E::DeadlineMissed { .. } => {
                refuse(StatusCode::GATEWAY_TIMEOUT, "deadline_missed", None, &err)
            }
            // PostgreSQL restarting or unreachable is not a bug to log as one: the client is
            // told to come back (a 500 would say the request itself broke something).
            E::Database(_) if err.is_outage() => {
                tracing::warn!(error = %format!("{err:#}"), "the database is unavailable");
                Self::Unavailable {
                    retry_after_s: UNAVAILABLE_RETRY_AFTER_S,
                }
            }
            // Another transaction's locks in the way after the books' own retries (a deadlock
            // PostgreSQL broke by aborting this request's statement): nothing was written, and
            // the request may be sent again as it is.
            E::Database(_) if err.is_contention() => {
                tracing::warn!(error = %format!("{err:#}"), "contention in the database");
                Self::Unavailable {
                    retry_after_s: UNAVAILABLE_RETRY_AFTER_S,
                }
            }
            // This node is not (or no longer) the database's writer: another one serves.
            E::WriterTaken { .. } | E::LeaseLost(_) => {
                tracing::warn!(error = %err, "not the writer");
                Self::Unavailable {
                    retry_after_s: UNAVAILABLE_RETRY_AFTER_S,
                }
            }
            E::Database(_)
            | E::Migrate(_)
            | E::Json(_)
            | E::Corrupt { .. }
            | E::Market(_)
            | E::BadRpcUrl(_)
            | E::Chain(_)
            | E::ReorgBelowHolds { .. }
            | E::Verification(_)
            | E::NoRandomness(_)
            | E::Settlement(_) => Self::Internal(Box::new(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ApiError;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    /// A database that is away is 503 `unavailable` with `Retry-After` (the request may be sent
    /// again); a query that fails otherwise stays 500. A PostgreSQL restart under `cx serve`
    /// answered 500 (`faults` test `postgres_restarted_under_load…`).
    #[test]
    fn a_database_outage_is_503_with_retry_after_and_other_database_errors_500() {
        let outage = ApiError::from(crate::Error::Database(sqlx::Error::PoolTimedOut));
        assert_eq!(outage.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(outage.code(), "unavailable");
        let response = outage.into_response();
        assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "2");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let io = ApiError::from(crate::Error::Database(sqlx::Error::Io(refused)));
        assert_eq!(io.status(), StatusCode::SERVICE_UNAVAILABLE);
        let bug = ApiError::from(crate::Error::Database(sqlx::Error::RowNotFound));
        assert_eq!(bug.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
