//! The HTTP layer's error: OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
//! plus the house's `field`. [`ApiError::from`] on the crate's [`Error`] is the one place a
//! failure becomes a status; the engine and the model never pick one.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::Error;

/// An HTTP error in OpenAI's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// Status.
    pub status: StatusCode,
    /// OpenAI `type` (`invalid_request_error`, `not_found_error`, …).
    pub kind: &'static str,
    /// Machine-readable code.
    pub code: &'static str,
    /// What went wrong and what to do.
    pub message: String,
    /// The request field at fault.
    pub field: Option<&'static str>,
    /// Seconds after which trying again may succeed (the `Retry-After` header): set on the
    /// refusals that pass (a rate limit, an overload, a full batch or cache), never on a
    /// request that would be refused again.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let kind = match status {
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::UNPROCESSABLE_ENTITY => "unprocessable_entity_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        Self {
            status,
            kind,
            code,
            message: message.into(),
            field: None,
            retry_after_s: None,
        }
    }

    /// Says when to try again (`Retry-After`, whole seconds).
    pub(super) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// Names the request field at fault.
    pub(super) fn field(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }

    /// A 400 for input the HTTP layer itself refuses (malformed or out-of-range fields).
    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

impl From<&Error> for ApiError {
    fn from(e: &Error) -> Self {
        let message = e.to_string();
        match e {
            Error::UnknownAdapter(_) => {
                Self::new(StatusCode::NOT_FOUND, "model_not_found", message).field("model")
            }
            Error::Config { .. }
            | Error::Safetensors { .. }
            | Error::AdapterMismatch(_)
            | Error::RankOverLimit { .. }
            | Error::AdapterChanged { .. }
            | Error::AdapterFile { .. }
            | Error::Io { .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_adapter", message)
            }
            Error::AdapterPath(_) => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_lora_path", message).field("lora_path")
            }
            Error::AdapterConflict(_) => {
                Self::new(StatusCode::CONFLICT, "adapter_conflict", message).field("lora_name")
            }
            // The only tokenizer work a request triggers is encoding its prompt.
            Error::BadRequest(_) | Error::Tokenizer(_) => Self::bad_request(message),
            // The model's template decides what a chat may hold (roles, order, alternation).
            Error::ChatTemplate(_) => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_messages", message).field("messages")
            }
            Error::NoChatTemplate => {
                Self::new(StatusCode::BAD_REQUEST, "no_chat_template", message)
                    .field("chat_template")
            }
            Error::UnknownTrainingClient(_) => {
                Self::new(StatusCode::NOT_FOUND, "training_client_not_found", message).field("id")
            }
            Error::TrainingInput { field, .. } => {
                let error = Self::bad_request(message);
                match field {
                    Some(field) => error.field(field),
                    None => error,
                }
            }
            // The three refusals of a full server pass as others finish: each says when to
            // try again, as the HTTP layer's own `overloaded` does.
            Error::TrainingLimit(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "training_limit", message).retry_after(1)
            }
            Error::TrainingDiverged(_) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "training_diverged",
                message,
            ),
            Error::CacheFull { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "cache_full", message).retry_after(1)
            }
            Error::NotAdmitted(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).retry_after(1)
            }
            // The batch thread is gone: trying again will not help.
            Error::SchedulerStopped => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
            Error::Generation { .. } | Error::ForwardPanicked => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "generation_failed",
                message,
            ),
            Error::LoadPanicked => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
            }
            // Internal text is not echoed. The exchange link's errors never reach this API.
            Error::Model(_)
            | Error::Kernel(_)
            | Error::Candle(_)
            | Error::Exchange(_)
            | Error::ExchangeAway(_)
            | Error::KeyFile { .. }
            | Error::Protocol(_) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "internal error; see the provider's log",
            ),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        Self::from(&e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.field,
                "code": self.code,
                "field": self.field,
            }
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_admission_refusals_carry_retry_after() {
        let admission = [
            Error::NotAdmitted(Box::new(Error::TrainingLimit("full".into()))),
            Error::TrainingLimit("full".into()),
        ];
        for error in &admission {
            let response = ApiError::from(error).into_response();
            assert_eq!(
                response.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{error}"
            );
            assert_eq!(response.headers()[header::RETRY_AFTER], "1", "{error}");
        }
        // A stopped batch thread does not come back: no Retry-After.
        let response = ApiError::from(Error::SchedulerStopped).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }
}
