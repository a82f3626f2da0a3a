//! The request an intent commits to, and the one way its hash is computed: agents, the exchange
//! and anyone re-checking an order hash the same canonical bytes.

use super::B256;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The inference an intent asks for, sent beside the signed order; the intent's `request_hash`
/// commits to it ([`request_hash`]). Exactly one of `prompt` (a completion) and `messages` (a
/// chat, rendered by the provider with its model's own chat template: what is signed is what is
/// run) is given. Fields at their defaults are left out of the JSON, so a request written before
/// they existed hashes as it did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InferenceRequest {
    /// The prompt of a completion.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prompt: String,
    /// The messages of a chat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<ChatMessage>,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// How tokens are drawn; absent: greedy (argmax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingParams>,
}

/// Messages in a request at most.
pub const MAX_MESSAGES: usize = 256;

/// Stop sequences at most, and bytes of each (OpenAI's count; the provider checks each after
/// every token).
pub const MAX_STOP_SEQUENCES: usize = 4;
/// Bytes of one stop sequence at most.
pub const MAX_STOP_BYTES: usize = 512;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or another role the model's template takes).
    pub role: String,
    /// The text.
    pub content: String,
}

/// OpenAI's sampling parameters as integers (thousandths), so the signed canonical JSON holds
/// no floats whose text two JSON writers could print differently. A draw is keyed by
/// (`seed`, sequence position): the same request gives the same tokens on every provider of the
/// same kernels, so a sampled job is checked by byte equality like a greedy one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SamplingParams {
    /// Temperature × 1000 (700 is 0.7; 0 is greedy), at most 2000.
    pub temperature_milli: u32,
    /// Nucleus top-p × 1000, 1 to 1000 [default: 1000, all tokens].
    #[serde(default = "all_milli")]
    pub top_p_milli: u32,
    /// The likeliest tokens to sample from; 0 all [default: 0].
    #[serde(default)]
    pub top_k: u32,
    /// OpenAI's presence penalty × 1000, −2000 to 2000 [default: 0].
    #[serde(default)]
    pub presence_penalty_milli: i32,
    /// OpenAI's frequency penalty × 1000, −2000 to 2000 [default: 0].
    #[serde(default)]
    pub frequency_penalty_milli: i32,
    /// The draws' seed (required: a job's bytes must not depend on who runs it).
    pub seed: u64,
    /// Generation ends before the first of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

fn all_milli() -> u32 {
    1000
}

impl InferenceRequest {
    /// A completion of `prompt`, greedy.
    pub fn completion(prompt: impl Into<String>, max_tokens: u32) -> Self {
        Self {
            prompt: prompt.into(),
            max_tokens,
            ..Self::default()
        }
    }

    /// The text the exchange prices and routes by: the prompt, or the chat in the protocol's
    /// role-tagged form ([`chat_prompt`]) — a stand-in for the model's own template, which only
    /// the provider has (token estimates are within a few tokens per message of it).
    pub fn text(&self) -> String {
        if self.messages.is_empty() {
            self.prompt.clone()
        } else {
            chat_prompt(
                self.messages
                    .iter()
                    .map(|m| (m.role.as_str(), m.content.as_str())),
            )
        }
    }

    /// Bytes of what the request asks the model to read (prompt or messages, roles included).
    pub fn input_bytes(&self) -> usize {
        self.prompt.len()
            + self
                .messages
                .iter()
                .map(|m| m.role.len() + m.content.len())
                .sum::<usize>()
    }

    /// The request's own rules: one of `prompt` and `messages`, at most [`MAX_MESSAGES`]
    /// messages with non-empty roles, and sampling values in range. The error names the first
    /// field at fault (`request.…`).
    pub fn check(&self) -> Result<(), crate::Error> {
        self.rules()
            .map_err(|(field, reason)| crate::Error::InvalidField {
                field: format!("request.{field}"),
                reason,
            })
    }

    fn rules(&self) -> Result<(), (&'static str, String)> {
        match (self.prompt.is_empty(), self.messages.is_empty()) {
            (true, true) => return Err(("prompt", "give a prompt or messages".into())),
            (false, false) => {
                return Err(("messages", "give a prompt or messages, not both".into()));
            }
            _ => {}
        }
        if self.messages.len() > MAX_MESSAGES {
            return Err((
                "messages",
                format!(
                    "at most {MAX_MESSAGES} messages, got {}",
                    self.messages.len()
                ),
            ));
        }
        if self.messages.iter().any(|m| m.role.is_empty()) {
            return Err(("messages", "every message needs a role".into()));
        }
        if let Some(s) = &self.sampling {
            s.rules()?;
        }
        Ok(())
    }
}

impl SamplingParams {
    /// The ranges of each field, as (field, reason) of the first one out of range.
    fn rules(&self) -> Result<(), (&'static str, String)> {
        if self.temperature_milli > 2000 {
            return Err((
                "sampling.temperature_milli",
                format!("{} is over 2000 (2.0)", self.temperature_milli),
            ));
        }
        if !(1..=1000).contains(&self.top_p_milli) {
            return Err((
                "sampling.top_p_milli",
                format!("{} is not in 1..=1000", self.top_p_milli),
            ));
        }
        for (field, value) in [
            (
                "sampling.presence_penalty_milli",
                self.presence_penalty_milli,
            ),
            (
                "sampling.frequency_penalty_milli",
                self.frequency_penalty_milli,
            ),
        ] {
            if !(-2000..=2000).contains(&value) {
                return Err((field, format!("{value} is not in -2000..=2000")));
            }
        }
        if self.stop.len() > MAX_STOP_SEQUENCES
            || self
                .stop
                .iter()
                .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err((
                "sampling.stop",
                format!(
                    "at most {MAX_STOP_SEQUENCES} non-empty stop sequences of at most \
                     {MAX_STOP_BYTES} bytes"
                ),
            ));
        }
        Ok(())
    }
}

/// The prompt a chat becomes: `<|role|>\ncontent\n` per message, then `<|assistant|>\n` — the
/// one fixed, role-tagged template of the exchange's OpenAI-compatible door and of the provider's
/// own chat endpoint (no Jinja chat templates), so a chat priced by the exchange is the prompt the
/// provider runs.
pub fn chat_prompt<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|");
        text.push_str(role);
        text.push_str("|>\n");
        text.push_str(content);
        text.push('\n');
    }
    text.push_str("<|assistant|>\n");
    text
}

/// SHA-256 of the request's canonical JSON — object keys sorted by byte order, no whitespace,
/// strings and numbers as serde_json writes them — which is what the exchange computes and
/// compares with the intent's signed `request_hash`.
pub fn request_hash(request: &InferenceRequest) -> B256 {
    request_value_hash(&serde_json::to_value(request).expect("a request always serializes"))
}

/// SHA-256 of any request's canonical JSON: what [`request_hash`] computes for an inference
/// request and [`crate::matmul::MatmulRequest::hash`] for a matmul one, and what the exchange and
/// the signers compute over a job's stored request whatever its kind.
pub fn request_value_hash(value: &serde_json::Value) -> B256 {
    B256::from(<[u8; 32]>::from(Sha256::digest(
        canonical_json(value).as_bytes(),
    )))
}

/// The canonical text of a JSON value: keys sorted, no whitespace.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_hash_is_sha256_of_sorted_compact_json() {
        let request = InferenceRequest::completion("Say \"hi\"\n", 16);
        // Keys sorted (max_tokens < prompt), no whitespace, JSON string escapes.
        let text = r#"{"max_tokens":16,"prompt":"Say \"hi\"\n"}"#;
        assert_eq!(
            canonical_json(&serde_json::to_value(&request).unwrap()),
            text
        );
        assert_eq!(
            request_hash(&request),
            B256::from(<[u8; 32]>::from(Sha256::digest(text.as_bytes())))
        );
    }

    /// A chat and its sampling are part of what is hashed; a request without them hashes as
    /// one written before they existed.
    #[test]
    fn messages_and_sampling_are_hashed_and_absent_ones_change_nothing() {
        let old = r#"{"max_tokens":16,"prompt":"hi"}"#;
        assert_eq!(
            request_hash(&InferenceRequest::completion("hi", 16)),
            B256::from(<[u8; 32]>::from(Sha256::digest(old.as_bytes())))
        );
        let chat = InferenceRequest {
            messages: vec![ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }],
            max_tokens: 16,
            sampling: Some(SamplingParams {
                temperature_milli: 700,
                top_p_milli: 950,
                top_k: 0,
                presence_penalty_milli: 0,
                frequency_penalty_milli: 0,
                seed: 42,
                stop: vec![],
            }),
            ..InferenceRequest::default()
        };
        assert_eq!(
            canonical_json(&serde_json::to_value(&chat).unwrap()),
            r#"{"max_tokens":16,"messages":[{"content":"hi","role":"user"}],"sampling":{"frequency_penalty_milli":0,"presence_penalty_milli":0,"seed":42,"temperature_milli":700,"top_k":0,"top_p_milli":950}}"#
        );
        assert!(chat.check().is_ok());
        let mut hot = chat.clone();
        hot.sampling.as_mut().unwrap().temperature_milli = 2001;
        assert_eq!(
            hot.check().unwrap_err().field(),
            "request.sampling.temperature_milli"
        );
        let mut both = chat.clone();
        both.prompt = "x".into();
        assert_eq!(both.check().unwrap_err().field(), "request.messages");
    }

    #[test]
    fn canonical_json_sorts_nested_keys_and_keeps_array_order() {
        let value = serde_json::json!({"b": [3, {"z": 1, "a": null}], "a": "x"});
        assert_eq!(
            canonical_json(&value),
            r#"{"a":"x","b":[3,{"a":null,"z":1}]}"#
        );
    }
}
