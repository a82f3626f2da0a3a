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
            Self::Internal(_) => "internal",
        }
    }

    fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } | Self::Conflict { field, .. } => field.as_deref(),
            _ => None,
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    code: &'static str,
    message: String,
    field: Option<&'a str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(cause) = &self {
            tracing::error!(error = %cause, "request failed inside the server");
        }
        let body = Body {
            error: Detail {
                code: self.code(),
                message: self.to_string(),
                field: self.field(),
            },
        };
        (self.status(), Json(body)).into_response()
    }
}

impl From<crate::Error> for ApiError {
    /// A failure of the service's own parts is internal: logged, never echoed.
    fn from(err: crate::Error) -> Self {
        Self::Internal(Box::new(err))
    }
}
