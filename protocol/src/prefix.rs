//! Conversation prefixes (SPEC §4): the id under which a provider holds a conversation's KV cache,
//! and the id a continuation names as its prefix — computed from text alone, so the exchange
//! routes a continuation to the provider holding its prefix without a tokenizer.
//!
//! # Definition
//! A chat renders as one prompt ([`chat_prompt`]): `<|role|>\ncontent\n` per message, then the
//! generation cue `<|assistant|>\n`. The **transcript** of a list of messages is that text without
//! the cue. The id of a conversation state is
//!
//! ```text
//! prefix_id = hex(SHA-256("cx-prefix-v1" ‖ 0x00 ‖ len₆₄(model) ‖ model ‖ len₆₄(adapter) ‖ adapter ‖ transcript))
//! ```
//!
//! with lengths as 8-byte big-endian integers (so no two (model, adapter, transcript) triples
//! share bytes), `adapter` the adapter's content id in lowercase hex (empty for none) and `model`
//! the catalog name of the base.
//!
//! The id is over the rendered transcript rather than over the messages' JSON because the KV
//! cache is a function of the text the model read: two message lists that render to the same
//! text have the same KV, and so the same prefix.
//!
//! * When a chat turn with prompt `P` (which ends in the cue) is answered with `reply`, the
//!   conversation's transcript becomes `P ‖ reply ‖ "\n"` — the transcript of the messages plus
//!   the assistant's reply. A provider holds the turn's KV under [`held_prefix_id`].
//! * A continuation sends the same messages, the reply, and a new message; its prompt is that
//!   transcript, the new message and the cue. Its prefix is the transcript of all its messages
//!   but the last ([`continued_prefix_id`]): the id the provider holds.
//!
//! The last message is found as the last line that opens with a role tag (`<|role|>`, the role
//! in `[a-z_]`); a last message whose content itself holds such a line names a shorter prefix,
//! which no provider holds: a miss, never a wrong hit (a hit is checked token by token).
//!
//! ```
//! use cx_protocol::order::chat_prompt;
//! use cx_protocol::prefix::{continued_prefix_id, held_prefix_id};
//!
//! let first = chat_prompt([("user", "Hi")]);
//! assert_eq!(continued_prefix_id("m", None, &first), None, "a first turn continues nothing");
//! let held = held_prefix_id("m", None, &first, "Hello!").unwrap();
//! let next = chat_prompt([("user", "Hi"), ("assistant", "Hello!"), ("user", "How are you?")]);
//! assert_eq!(continued_prefix_id("m", None, &next), Some(held));
//! ```
//!
//! [`chat_prompt`]: crate::order::chat_prompt

use sha2::{Digest, Sha256};

/// Domain tag of prefix ids.
pub const PREFIX_DOMAIN: &[u8] = b"cx-prefix-v1";

/// The generation cue a chat prompt ends with.
pub const ASSISTANT_CUE: &str = "<|assistant|>\n";

/// Most prefix ids one residency report carries (most valuable first).
pub const MAX_REPORTED_PREFIXES: usize = 64;

/// The id of a conversation state whose transcript is `transcript` (see the module docs).
pub fn prefix_id(model: &str, adapter: Option<&str>, transcript: &str) -> String {
    let adapter = adapter.unwrap_or("");
    let mut hash = Sha256::new();
    hash.update(PREFIX_DOMAIN);
    hash.update([0u8]);
    for part in [model, adapter] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hash.update(transcript.as_bytes());
    hex::encode(hash.finalize())
}

/// The id a chat turn is held under once answered: the transcript `prompt ‖ reply ‖ "\n"`.
/// `None` when `prompt` is not a chat prompt (does not end with [`ASSISTANT_CUE`]).
pub fn held_prefix_id(
    model: &str,
    adapter: Option<&str>,
    prompt: &str,
    reply: &str,
) -> Option<String> {
    if !prompt.ends_with(ASSISTANT_CUE) {
        return None;
    }
    let mut transcript = String::with_capacity(prompt.len() + reply.len() + 1);
    transcript.push_str(prompt);
    transcript.push_str(reply);
    transcript.push('\n');
    Some(prefix_id(model, adapter, &transcript))
}

/// The id of the prefix a chat prompt continues: the transcript of all its messages but the last.
/// `None` when `prompt` is not a chat prompt or has one message only.
pub fn continued_prefix_id(model: &str, adapter: Option<&str>, prompt: &str) -> Option<String> {
    continued_transcript(prompt).map(|t| prefix_id(model, adapter, t))
}

/// The transcript of all the prompt's messages but the last (see [`continued_prefix_id`]).
pub fn continued_transcript(prompt: &str) -> Option<&str> {
    let transcript = prompt.strip_suffix(ASSISTANT_CUE)?;
    // The last message starts on a line opening with a role tag, after at least one message.
    let bytes = transcript.as_bytes();
    let mut at = transcript.len();
    while let Some(newline) = transcript[..at].rfind('\n') {
        let start = newline + 1;
        if start < transcript.len() && opens_message(&bytes[start..]) {
            return Some(&transcript[..start]);
        }
        at = newline;
    }
    None
}

/// Whether `line` starts with `<|role|>\n`, the role in `[a-z_]` (non-empty).
fn opens_message(line: &[u8]) -> bool {
    let Some(rest) = line.strip_prefix(b"<|") else {
        return false;
    };
    let role = rest
        .iter()
        .take_while(|b| b.is_ascii_lowercase() || **b == b'_')
        .count();
    role > 0 && rest[role..].starts_with(b"|>\n")
}

/// Checks a reported list of prefix ids: at most [`MAX_REPORTED_PREFIXES`], each of the form of
/// an id, none twice.
pub fn validate_ids(field: &str, ids: &[String]) -> crate::Result<()> {
    let invalid = |reason: String| crate::Error::InvalidField {
        field: field.to_owned(),
        reason,
    };
    if ids.len() > MAX_REPORTED_PREFIXES {
        return Err(invalid(format!("at most {MAX_REPORTED_PREFIXES} prefixes")));
    }
    for (i, id) in ids.iter().enumerate() {
        if !is_prefix_id(id) {
            return Err(invalid(format!(
                "[{i}] `{id}` is not a prefix id (64 lowercase hex digits)"
            )));
        }
        if ids[..i].contains(id) {
            return Err(invalid(format!("[{i}] `{id}` appears twice")));
        }
    }
    Ok(())
}

/// Whether `id` has the form of a prefix id (64 lowercase hex digits).
pub fn is_prefix_id(id: &str) -> bool {
    id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::chat_prompt;

    #[test]
    fn a_continuation_names_the_id_its_first_turn_is_held_under() {
        let turn1 = chat_prompt([("system", "Be brief."), ("user", "2+2?")]);
        let held = held_prefix_id("tiny", Some("ab"), &turn1, "4").unwrap();
        let turn2 = chat_prompt([
            ("system", "Be brief."),
            ("user", "2+2?"),
            ("assistant", "4"),
            ("user", "and 3+3?"),
        ]);
        assert_eq!(
            continued_prefix_id("tiny", Some("ab"), &turn2).as_deref(),
            Some(held.as_str())
        );
        // The prefix of the first turn is its system message alone.
        assert_eq!(
            continued_transcript(&turn1),
            Some("<|system|>\nBe brief.\n")
        );
        // Another model, adapter or reply is another prefix.
        assert_ne!(
            continued_prefix_id("other", Some("ab"), &turn2),
            Some(held.clone())
        );
        assert_ne!(
            continued_prefix_id("tiny", None, &turn2),
            Some(held.clone())
        );
        assert_ne!(held_prefix_id("tiny", Some("ab"), &turn1, "5"), Some(held));
    }

    #[test]
    fn plain_prompts_and_single_messages_have_no_prefix() {
        assert_eq!(continued_prefix_id("m", None, "Once upon a time"), None);
        assert_eq!(held_prefix_id("m", None, "Once upon a time", "x"), None);
        assert_eq!(
            continued_prefix_id("m", None, &chat_prompt([("user", "hi")])),
            None
        );
    }

    #[test]
    fn a_role_tag_inside_the_last_message_only_shortens_the_prefix() {
        let turn = chat_prompt([
            ("user", "a"),
            ("assistant", "b"),
            ("user", "x\n<|user|>\ny"),
        ]);
        assert_eq!(
            continued_transcript(&turn),
            Some("<|user|>\na\n<|assistant|>\nb\n<|user|>\nx\n")
        );
        assert!(!opens_message(b"<||>\n") && !opens_message(b"<|User|>\n"));
    }

    #[test]
    fn the_id_is_sha256_over_length_prefixed_parts() {
        let mut hash = Sha256::new();
        hash.update(b"cx-prefix-v1\0");
        hash.update(1u64.to_be_bytes());
        hash.update(b"m");
        hash.update(0u64.to_be_bytes());
        hash.update(b"t");
        assert_eq!(prefix_id("m", None, "t"), hex::encode(hash.finalize()));
        assert!(is_prefix_id(&prefix_id("m", None, "t")));
        // Moving a byte between the parts changes the id.
        assert_ne!(prefix_id("ab", None, "c"), prefix_id("a", None, "bc"));
    }
}
