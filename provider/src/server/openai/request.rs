//! The bodies of `/v1/completions` and `/v1/chat/completions`, as the door reads them and
//! `/openapi.json` describes them, and OpenAI's parameters this server takes only at their
//! neutral value ([`NEUTRAL`]): a parameter it does not implement is never silently ignored.

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::super::ApiError;
use super::super::body::Request;
use super::super::openapi::fields;

/// `POST /v1/completions`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::server) struct CompletionRequest {
    /// The base model's name or an adapter's alias or id.
    #[schema(value_type = String)]
    pub(super) model: Option<String>,
    /// An adapter (alias or id); wins over `model`.
    pub(super) adapter: Option<String>,
    /// New tokens at most (prompt + max_tokens within the context) [default: 16].
    #[schema(minimum = 1)]
    pub(super) max_tokens: Option<u64>,
    /// OpenAI's newer name of `max_tokens`; wins over it.
    #[schema(minimum = 1)]
    pub(super) max_completion_tokens: Option<u64>,
    /// 0 is greedy [default: 0].
    #[schema(minimum = 0.0, maximum = 3.4028234663852886e38)]
    pub(super) temperature: Option<f64>,
    /// Nucleus sampling: the likeliest tokens whose probabilities add up to this [default: 1].
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub(super) top_p: Option<f64>,
    /// Sample from this many likeliest tokens; 0 or -1: all [default: 0].
    #[schema(minimum = -1)]
    pub(super) top_k: Option<i64>,
    /// Subtracted once from the logit of every token already generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub(super) presence_penalty: Option<f64>,
    /// Subtracted from a token's logit per time it was generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub(super) frequency_penalty: Option<f64>,
    /// The sampling seed: the same request and seed give the same text on every provider of
    /// the same kernels [default: drawn at random].
    pub(super) seed: Option<u64>,
    /// Choices to generate, each its own draw [default: 1].
    #[schema(minimum = 1, maximum = 8)]
    pub(super) n: Option<u64>,
    /// Log-probabilities of each chosen token and of this many likeliest alternatives.
    #[schema(value_type = Option<u8>, minimum = 0, maximum = 5)]
    pub(super) logprobs: Option<Logprobs>,
    #[schema(schema_with = fields::stop)]
    pub(super) stop: Option<Stop>,
    /// Server-sent events, `data: [DONE]` last.
    pub(super) stream: Option<bool>,
    #[schema(schema_with = fields::completion_prompt, required = true)]
    pub(super) prompt: Option<Prompt>,
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::server) struct ChatCompletionRequest {
    /// The base model's name or an adapter's alias or id.
    #[schema(value_type = String)]
    pub(super) model: Option<String>,
    /// An adapter (alias or id); wins over `model`.
    pub(super) adapter: Option<String>,
    /// New tokens at most (prompt + max_tokens within the context) [default: 16].
    #[schema(minimum = 1)]
    pub(super) max_tokens: Option<u64>,
    /// OpenAI's newer name of `max_tokens`; wins over it.
    #[schema(minimum = 1)]
    pub(super) max_completion_tokens: Option<u64>,
    /// 0 is greedy [default: 0].
    #[schema(minimum = 0.0, maximum = 3.4028234663852886e38)]
    pub(super) temperature: Option<f64>,
    /// Nucleus sampling: the likeliest tokens whose probabilities add up to this [default: 1].
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub(super) top_p: Option<f64>,
    /// Sample from this many likeliest tokens; 0 or -1: all [default: 0].
    #[schema(minimum = -1)]
    pub(super) top_k: Option<i64>,
    /// Subtracted once from the logit of every token already generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub(super) presence_penalty: Option<f64>,
    /// Subtracted from a token's logit per time it was generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub(super) frequency_penalty: Option<f64>,
    /// The sampling seed: the same request and seed give the same text on every provider of
    /// the same kernels [default: drawn at random].
    pub(super) seed: Option<u64>,
    /// Choices to generate, each its own draw [default: 1].
    #[schema(minimum = 1, maximum = 8)]
    pub(super) n: Option<u64>,
    /// Log-probabilities of each chosen token [default: false].
    #[schema(value_type = Option<bool>)]
    pub(super) logprobs: Option<Logprobs>,
    /// With `logprobs`, this many likeliest alternatives per token [default: 0].
    // Read whole, so that a count past 20 gets our message rather than serde's `u8` one.
    #[schema(value_type = Option<u8>, minimum = 0, maximum = 20)]
    pub(super) top_logprobs: Option<u64>,
    #[schema(schema_with = fields::stop)]
    pub(super) stop: Option<Stop>,
    /// Server-sent events, `data: [DONE]` last.
    pub(super) stream: Option<bool>,
    /// The conversation, rendered by the model's own chat template.
    #[schema(value_type = Vec<ChatMessage>, min_items = 1)]
    pub(super) messages: Option<Vec<ChatMessage>>,
}

/// One chat message.
#[derive(Deserialize, ToSchema)]
pub(in crate::server) struct ChatMessage {
    /// `system`, `user`, `assistant`, …
    pub(super) role: String,
    #[schema(schema_with = fields::chat_content)]
    pub(super) content: Value,
}

/// `prompt` of `/v1/completions`: one text or token ids, or a batch of either.
#[derive(Deserialize)]
#[serde(untagged)]
pub(in crate::server) enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

/// `stop`: one sequence or several.
#[derive(Deserialize)]
#[serde(untagged)]
pub(in crate::server) enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub(in crate::server) fn into_vec(stop: Option<Self>) -> Vec<String> {
        match stop {
            None => Vec::new(),
            Some(Self::One(s)) => vec![s],
            Some(Self::Many(v)) => v,
        }
    }
}

/// `logprobs`: a flag on chat, the number of alternatives on the legacy completions.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Logprobs {
    Flag(bool),
    Count(u8),
}

/// The fields both completions read besides the prompt, however each request holds them.
pub(super) struct Common {
    pub(super) model: Option<String>,
    pub(super) adapter: Option<String>,
    pub(super) max_tokens: Option<u64>,
    pub(super) max_completion_tokens: Option<u64>,
    pub(super) temperature: Option<f64>,
    pub(super) top_p: Option<f64>,
    pub(super) top_k: Option<i64>,
    pub(super) presence_penalty: Option<f64>,
    pub(super) frequency_penalty: Option<f64>,
    pub(super) seed: Option<u64>,
    pub(super) n: Option<u64>,
    pub(super) logprobs: Option<Logprobs>,
    pub(super) top_logprobs: Option<u64>,
    pub(super) stop: Option<Stop>,
    pub(super) stream: Option<bool>,
}

impl CompletionRequest {
    /// The shared fields, and the prompt.
    pub(super) fn split(self) -> (Common, Option<Prompt>) {
        let common = Common {
            model: self.model,
            adapter: self.adapter,
            max_tokens: self.max_tokens,
            max_completion_tokens: self.max_completion_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            n: self.n,
            logprobs: self.logprobs,
            top_logprobs: None,
            stop: self.stop,
            stream: self.stream,
        };
        (common, self.prompt)
    }
}

impl ChatCompletionRequest {
    /// The shared fields, and the messages.
    pub(super) fn split(self) -> (Common, Option<Vec<ChatMessage>>) {
        let common = Common {
            model: self.model,
            adapter: self.adapter,
            max_tokens: self.max_tokens,
            max_completion_tokens: self.max_completion_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            n: self.n,
            logprobs: self.logprobs,
            top_logprobs: self.top_logprobs,
            stop: self.stop,
            stream: self.stream,
        };
        (common, self.messages)
    }
}

impl Request for CompletionRequest {
    fn take_unknown(body: &mut Map<String, Value>, fields: &[&str]) -> Result<(), ApiError> {
        take_unsupported(body, fields)
    }
}

impl Request for ChatCompletionRequest {
    fn take_unknown(body: &mut Map<String, Value>, fields: &[&str]) -> Result<(), ApiError> {
        take_unsupported(body, fields)
    }
}

/// Takes out of `body` every parameter that is none of the route's `fields` but one of
/// [`NEUTRAL`] at its neutral value (or null, as is any unknown one); refuses the others.
fn take_unsupported(body: &mut Map<String, Value>, fields: &[&str]) -> Result<(), ApiError> {
    let mut taken = Vec::new();
    for (key, value) in body.iter() {
        if fields.contains(&key.as_str()) {
            continue;
        }
        if value.is_null() {
            taken.push(key.clone());
            continue;
        }
        let Some(&(name, neutral, _)) = NEUTRAL.iter().find(|(n, _, _)| n == key) else {
            return Err(unsupported(
                None,
                format!(
                    "unknown parameter `{key}`; this server implements {}",
                    fields.join(", ")
                ),
            ));
        };
        if !neutral(value) {
            return Err(unsupported(
                Some(name),
                format!("`{name}` = {value} is not implemented by this server (only its default)"),
            ));
        }
        taken.push(key.clone());
    }
    for key in taken {
        body.remove(&key);
    }
    Ok(())
}

/// A 400 `unsupported_parameter`, naming the field when it is one of [`NEUTRAL`] (a name
/// the client made up is quoted in the message only).
fn unsupported(field: Option<&'static str>, message: String) -> ApiError {
    let error = ApiError::new(StatusCode::BAD_REQUEST, "unsupported_parameter", message);
    match field {
        Some(name) => error.field(name),
        None => error,
    }
}

type Neutral = fn(&Value) -> bool;

/// Parameters of the OpenAI and vLLM APIs this server does not implement, each with the test
/// for its neutral value (the one that changes nothing) and the JSON schema of what that test
/// accepts (for `/openapi.json`). Anything else is refused.
pub(in crate::server) const NEUTRAL: &[(&str, Neutral, &str)] = &[
    (
        "best_of",
        |v| v.as_u64() == Some(1),
        r#"{"type": "integer", "const": 1}"#,
    ),
    (
        "echo",
        |v| v == &Value::Bool(false),
        r#"{"type": "boolean", "const": false}"#,
    ),
    (
        "min_p",
        |v| v.as_f64() == Some(0.0),
        r#"{"type": "number", "const": 0}"#,
    ),
    (
        "repetition_penalty",
        |v| v.as_f64() == Some(1.0),
        r#"{"type": "number", "const": 1}"#,
    ),
    (
        "logit_bias",
        |v| v.as_object().is_some_and(|o| o.is_empty()),
        r#"{"type": "object", "maxProperties": 0}"#,
    ),
    (
        "suffix",
        |v| v.as_str() == Some(""),
        r#"{"type": "string", "const": ""}"#,
    ),
    (
        "min_tokens",
        |v| v.as_u64() == Some(0),
        r#"{"type": "integer", "const": 0}"#,
    ),
    (
        "ignore_eos",
        |v| v == &Value::Bool(false),
        r#"{"type": "boolean", "const": false}"#,
    ),
    (
        "stop_token_ids",
        |v| v.as_array().is_some_and(|a| a.is_empty()),
        r#"{"type": "array", "maxItems": 0}"#,
    ),
    (
        "tools",
        |v| v.as_array().is_some_and(|a| a.is_empty()),
        r#"{"type": "array", "maxItems": 0}"#,
    ),
    (
        "tool_choice",
        |v| v.as_str() == Some("none"),
        r#"{"type": "string", "const": "none"}"#,
    ),
    (
        "response_format",
        |v| v.get("type").and_then(Value::as_str) == Some("text"),
        r#"{"type": "object", "required": ["type"], "properties": {"type": {"const": "text"}}}"#,
    ),
    (
        "stream_options",
        |v| {
            v.get("include_usage")
                .is_none_or(|u| u == &Value::Bool(false))
        },
        r#"{"type": "object", "properties": {"include_usage": {"const": false}}}"#,
    ),
    // Informational: they change nothing the server computes.
    ("user", |_| true, "{}"),
    ("parallel_tool_calls", |_| true, "{}"),
    (
        "skip_special_tokens",
        |v| v == &Value::Bool(true),
        r#"{"type": "boolean", "const": true}"#,
    ),
];

#[cfg(test)]
mod tests {
    use super::super::super::body::read;
    use super::*;

    #[test]
    fn a_neutral_value_or_null_is_taken_and_any_other_refused_by_name() {
        let request: CompletionRequest = read(
            br#"{"prompt": "x", "best_of": 1.0, "echo": null, "user": "me", "frobnicate": null}"#,
        )
        .unwrap();
        assert!(matches!(request.prompt, Some(Prompt::Text(_))));
        let Err(refused) = read::<ChatCompletionRequest>(br#"{"best_of": 2}"#) else {
            panic!("best_of = 2 was taken");
        };
        assert_eq!(
            (refused.code, refused.field),
            ("unsupported_parameter", Some("best_of"))
        );
        let Err(unknown) = read::<CompletionRequest>(br#"{"frobnicate": 1}"#) else {
            panic!("an unknown parameter was taken");
        };
        assert_eq!(
            (unknown.code, unknown.field),
            ("unsupported_parameter", None)
        );
        assert!(unknown.message.contains("`frobnicate`"), "{unknown:?}");
    }
}
