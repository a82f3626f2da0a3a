//! The request an intent commits to, and the one way its hash is computed: agents, the exchange
//! and anyone re-checking an order hash the same canonical bytes.

use super::B256;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The inference an intent asks for, sent beside the signed order; the intent's `request_hash`
/// commits to it ([`request_hash`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InferenceRequest {
    /// The prompt.
    pub prompt: String,
    /// Most tokens to generate.
    pub max_tokens: u32,
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
        let request = InferenceRequest {
            prompt: "Say \"hi\"\n".into(),
            max_tokens: 16,
        };
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

    #[test]
    fn canonical_json_sorts_nested_keys_and_keeps_array_order() {
        let value = serde_json::json!({"b": [3, {"z": 1, "a": null}], "a": "x"});
        assert_eq!(
            canonical_json(&value),
            r#"{"a":"x","b":[3,{"a":null,"z":1}]}"#
        );
    }
}
