//! Text ↔ token ids, as the model directory says: `tokenizer.json` through the Hugging Face
//! `tokenizers` crate, or a byte-level tokenizer for generated models (ids `0..256` are bytes,
//! then BOS and EOS); the model's chat template ([`ChatTemplate`]); and the ids a sequence
//! stops at.
//!
//! # Which ids stop a sequence
//! Every EOS id of `config.json` and of `generation_config.json` (either may be a list: Llama 3
//! Instruct stops at `<|end_of_text|>`, `<|eom_id|>` and `<|eot_id|>`), and the special token a
//! chat template closes an assistant's turn with (`<|im_end|>` in ChatML), found by rendering a
//! probe chat ([`ChatTemplate::after_assistant_turn`]): an instruct model ends its answer with
//! that token, and a server that did not stop there would run on into a made-up next turn.
//!
//! # Special tokens in text
//! Special tokens written in the text (by the template, or by a client in a raw completion)
//! are matched whole, as `tokenizers` does for added tokens: `<|im_start|>` is one id, never
//! its characters. A chat prompt is encoded without adding special tokens (the template writes
//! BOS itself, as transformers' `apply_chat_template` encodes); a raw completion prompt gets
//! them as the tokenizer's post-processor says (BOS for Llama).

use std::path::Path;

use crate::chat_template::{ChatMessage, ChatTemplate, GENERATED_CHAT_TEMPLATE, TokenizerConfig};
use crate::error::{Error, Result};
use crate::model::{
    GENERATED_BOS, GENERATED_EOS, ModelConfig, ModelFiles, generated_tokenizer_json,
};

/// Text of generated models' BOS and EOS (also in their `tokenizer.json`).
const GENERATED_SPECIALS: [(&str, u32); 2] = [("<s>", GENERATED_BOS), ("</s>", GENERATED_EOS)];

/// How text becomes ids.
enum Kind {
    /// One token per byte; BOS prepended when the config names one; special tokens matched
    /// whole by their text.
    Bytes {
        bos: Option<u32>,
        specials: Vec<(&'static str, u32)>,
    },
    /// `tokenizer.json`.
    Hf(Box<tokenizers::Tokenizer>),
}

/// A model's tokenizer, chat template and stop ids.
pub struct Tokenizer {
    kind: Kind,
    chat_template: Option<ChatTemplate>,
    /// Sorted, without repeats.
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.name())
            .field("chat_template", &self.chat_template)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

impl Tokenizer {
    /// The tokenizer of a model directory: `tokenizer.json` if present, else bytes (which only
    /// makes sense for a vocabulary of at least 256); its chat template and stop ids. The
    /// byte-level `tokenizer.json` that `gen-model` writes ([`generated_tokenizer_json`]) is
    /// recognised and served by the built-in byte tokenizer (same ids, no parsing per call).
    pub fn for_model(dir: &Path, config: &ModelConfig) -> Result<Self> {
        let files = ModelFiles::locate(dir)?;
        let kind = if let Some((path, text)) = files.read_text("tokenizer.json")? {
            if is_generated_tokenizer(&text, config) {
                Kind::Bytes {
                    bos: Some(GENERATED_BOS),
                    specials: GENERATED_SPECIALS.to_vec(),
                }
            } else {
                let tokenizer: tokenizers::Tokenizer = text
                    .parse()
                    .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
                if tokenizer.get_vocab_size(true) > config.vocab_size {
                    return Err(Error::Tokenizer(format!(
                        "{}: {} tokens, more than the model's vocabulary of {} (config.json \
                         `vocab_size`): is it this model's tokenizer?",
                        path.display(),
                        tokenizer.get_vocab_size(true),
                        config.vocab_size
                    )));
                }
                Kind::Hf(Box::new(tokenizer))
            }
        } else {
            if config.vocab_size < 256 {
                return Err(Error::Tokenizer(format!(
                    "no tokenizer.json and a vocabulary of {} (< 256) cannot hold bytes",
                    config.vocab_size
                )));
            }
            Kind::Bytes {
                bos: config
                    .bos_token_id
                    .filter(|&b| (b as usize) < config.vocab_size),
                specials: Vec::new(),
            }
        };
        let tokenizer_config = TokenizerConfig::read(dir)?;
        let chat_template = ChatTemplate::for_model(dir, &tokenizer_config)?;
        let mut stop_ids = config.eos_ids();
        stop_ids.extend(generation_config_eos(&files)?);
        let mut tokenizer = Self {
            kind,
            chat_template,
            stop_ids: Vec::new(),
        };
        if let Some(id) = tokenizer.end_of_turn_id() {
            stop_ids.push(id);
        }
        stop_ids.retain(|&id| (id as usize) < config.vocab_size);
        stop_ids.sort_unstable();
        stop_ids.dedup();
        tokenizer.stop_ids = stop_ids;
        Ok(tokenizer)
    }

    /// The byte tokenizer and chat template of generated models; EOS stops.
    pub fn generated() -> Self {
        let template = ChatTemplate::new(
            GENERATED_CHAT_TEMPLATE.to_string(),
            "generated".to_string(),
            Some(GENERATED_SPECIALS[0].0.to_string()),
            Some(GENERATED_SPECIALS[1].0.to_string()),
        )
        .expect("the generated template compiles");
        Self {
            kind: Kind::Bytes {
                bos: Some(GENERATED_BOS),
                specials: GENERATED_SPECIALS.to_vec(),
            },
            chat_template: Some(template),
            stop_ids: vec![GENERATED_EOS],
        }
    }

    /// A short name.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Bytes { .. } => "bytes",
            Kind::Hf(_) => "tokenizer.json",
        }
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The ids that end a sequence (see the module doc), sorted.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether `id` ends a sequence.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.binary_search(&id).is_ok()
    }

    /// Token ids of a raw prompt: special tokens added as the tokenizer says (BOS for Llama and
    /// the byte tokenizer), special tokens in the text matched whole.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// The prompt of a chat, rendered by the model's template with the generation prompt, and
    /// its ids (encoded without adding special tokens: the template writes them).
    /// [`Error::NoChatTemplate`] when the model has none; [`Error::ChatTemplate`] when the
    /// template refuses the messages.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<(String, Vec<u32>)> {
        let template = self.chat_template.as_ref().ok_or(Error::NoChatTemplate)?;
        let text = template.render(messages, true)?;
        let ids = self.encode_with(&text, false)?;
        Ok((text, ids))
    }

    /// Token ids of `text`; `add_special_tokens` as in transformers.
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match &self.kind {
            Kind::Bytes { bos, specials } => {
                let mut ids = Vec::with_capacity(text.len() + 1);
                if add_special_tokens {
                    ids.extend(bos.iter().copied());
                }
                let mut rest = text;
                while !rest.is_empty() {
                    // The earliest special token's text, the longest at one place.
                    let next = specials
                        .iter()
                        .filter_map(|&(s, id)| {
                            rest.find(s).map(|at| (at, std::cmp::Reverse(s.len()), id))
                        })
                        .min();
                    match next {
                        Some((at, std::cmp::Reverse(len), id)) => {
                            ids.extend(rest[..at].bytes().map(u32::from));
                            ids.push(id);
                            rest = &rest[at + len..];
                        }
                        None => {
                            ids.extend(rest.bytes().map(u32::from));
                            rest = "";
                        }
                    }
                }
                Ok(ids)
            }
            Kind::Hf(t) => Ok(t
                .encode(text, add_special_tokens)
                .map_err(|e| Error::Tokenizer(e.to_string()))?
                .get_ids()
                .to_vec()),
        }
    }

    /// The text of `ids`, special tokens skipped. May end inside a UTF-8 character (bytes)
    /// or with U+FFFD (an incomplete piece); [`stable_prefix`] cuts that off for streaming.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.kind {
            Kind::Bytes { .. } => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .filter(|&&id| id < 256)
                    .map(|&id| id as u8)
                    .collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Kind::Hf(t) => t
                .decode(ids, true)
                .map_err(|e| Error::Tokenizer(e.to_string())),
        }
    }

    /// The text of one token as the API's logprobs show it (special tokens included).
    pub fn token_text(&self, id: u32) -> String {
        match &self.kind {
            Kind::Bytes { specials, .. } => match specials.iter().find(|(_, s)| *s == id) {
                Some((text, _)) => (*text).to_string(),
                None if id < 256 => String::from_utf8_lossy(&[id as u8]).into_owned(),
                None => format!("<{id}>"),
            },
            Kind::Hf(t) => t.decode(&[id], false).unwrap_or_else(|_| format!("<{id}>")),
        }
    }

    /// The id of the special token the chat template ends an assistant's turn with.
    fn end_of_turn_id(&self) -> Option<u32> {
        let after = self.chat_template.as_ref()?.after_assistant_turn()?;
        match &self.kind {
            Kind::Bytes { specials, .. } => specials
                .iter()
                .filter(|(s, _)| after.starts_with(s))
                .max_by_key(|(s, _)| s.len())
                .map(|&(_, id)| id),
            Kind::Hf(t) => t
                .get_added_tokens_decoder()
                .into_iter()
                .filter(|(_, token)| token.special && after.starts_with(&token.content))
                .max_by_key(|(_, token)| token.content.len())
                .map(|(id, _)| id),
        }
    }
}

/// The EOS ids of the model's `generation_config.json` (a number or a list), if it names any.
fn generation_config_eos(files: &ModelFiles) -> Result<Vec<u32>> {
    let Some((path, text)) = files.read_text("generation_config.json")? else {
        return Ok(Vec::new());
    };
    let bad = |reason: String| Error::Config {
        path: path.clone(),
        what: "generation_config.json",
        reason,
    };
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let id = |v: &serde_json::Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(format!("`eos_token_id`: {v} is not a token id")))
    };
    match value.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(ids)) => ids.iter().map(id).collect(),
        Some(one) => Ok(vec![id(one)?]),
    }
}

/// Whether `text` is exactly the byte-level `tokenizer.json` of a generated model of this
/// vocabulary (and the config names its BOS and EOS).
fn is_generated_tokenizer(text: &str, config: &ModelConfig) -> bool {
    // The generated file is ~40 bytes per vocabulary entry; anything much larger is another
    // tokenizer, not worth parsing twice.
    let limit = 64 * config.vocab_size + 4096;
    if text.len() > limit
        || config.bos_token_id != Some(GENERATED_BOS)
        || !config.eos_ids().contains(&GENERATED_EOS)
    {
        return false;
    }
    serde_json::from_str::<serde_json::Value>(text)
        .is_ok_and(|value| value == generated_tokenizer_json(config.vocab_size))
}

/// The part of `text` that later tokens cannot change: everything before a trailing run of
/// U+FFFD (an incomplete UTF-8 character that the next token may complete).
pub fn stable_prefix(text: &str) -> &str {
    text.trim_end_matches('\u{FFFD}')
}

/// Streaming detokenization over a growing list of ids (as Hugging Face's
/// text-generation-inference does it): each step decodes only a short window — the ids since
/// the last complete piece — twice, with and without the newest ids, and emits the difference
/// once it is a whole character. Decoding the window rather than one token keeps what a
/// tokenizer does across tokens (SentencePiece's leading-space strip, byte-fallback pieces
/// that only make a character together); emitting only whole characters means a chunk never
/// holds a broken UTF-8 character or a U+FFFD that a later token would have completed.
#[derive(Clone, Debug, Default)]
pub struct Detokenizer {
    /// Where the window starts.
    prefix_offset: usize,
    /// Ids before this are emitted.
    read_offset: usize,
}

impl Detokenizer {
    /// The text that `ids` (all generated so far, the newest last) adds to what was emitted;
    /// empty while the newest ids make no whole character yet.
    pub fn step(&mut self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String> {
        let before = tokenizer.decode(&ids[self.prefix_offset..self.read_offset])?;
        let now = tokenizer.decode(&ids[self.prefix_offset..])?;
        if now.len() > before.len()
            && !now.ends_with('\u{FFFD}')
            && let Some(new) = now.get(before.len()..)
        {
            let new = new.to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = ids.len();
            Ok(new)
        } else {
            Ok(String::new())
        }
    }

    /// What is still held when the sequence ends (an incomplete character shows as U+FFFD,
    /// as a whole decode would show it).
    pub fn finish(&mut self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String> {
        let before = tokenizer.decode(&ids[self.prefix_offset..self.read_offset])?;
        let now = tokenizer.decode(&ids[self.prefix_offset..])?;
        self.prefix_offset = ids.len();
        self.read_offset = ids.len();
        Ok(now.get(before.len()..).unwrap_or_default().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokenizer_matches_special_tokens_whole() {
        let t = Tokenizer::generated();
        assert_eq!(t.encode("Hé").unwrap(), vec![256, 72, 0xC3, 0xA9]);
        assert_eq!(
            t.encode_with("<s>a</s>b<s", false).unwrap(),
            vec![256, 97, 257, 98, 60, 115]
        );
        let (text, ids) = t.encode_chat(&[ChatMessage::new("user", "hi")]).unwrap();
        assert_eq!(text, "<s><|user|>\nhi\n<|assistant|>\n");
        let want: Vec<u32> = std::iter::once(256)
            .chain("<|user|>\nhi\n<|assistant|>\n".bytes().map(u32::from))
            .collect();
        assert_eq!(ids, want);
        assert!(t.is_stop(GENERATED_EOS));
    }

    #[test]
    fn detokenizer_never_emits_a_broken_character() {
        let t = Tokenizer::generated();
        let text = "aé€😀b";
        let ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let mut d = Detokenizer::default();
        let mut out = String::new();
        for n in 1..=ids.len() {
            let piece = d.step(&t, &ids[..n]).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "{piece:?} at {n}");
            out.push_str(&piece);
        }
        assert_eq!(out, text);
    }
}
