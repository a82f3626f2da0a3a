//! The model's own chat template: the Jinja text a model directory carries, rendered as
//! transformers renders it (`apply_chat_template`), so an instruct model gets the prompt it was
//! trained on.
//!
//! # Where a template comes from
//! `chat_template.jinja` (what transformers ≥ 4.43 writes), else `tokenizer_config.json`'s
//! `chat_template`, which older files hold as a string or as a list of named templates (the one
//! named `default` is the chat template, as transformers picks it). A model with neither has no
//! chat template: `/v1/chat/completions` is refused naming `chat_template`, completions work.
//!
//! # How it is rendered
//! minijinja with the environment transformers compiles templates in
//! (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with loop controls),
//! Python's string methods through minijinja-contrib's `pycompat` (`.strip()`, `.startswith()`,
//! as Hugging Face's text-generation-inference does), and the variables transformers passes:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `raise_exception`, whose
//! message becomes a 400 naming it. `strftime_now` is left undefined on purpose: templates
//! test `strftime_now is defined` and fall back to a fixed date, so the same request renders
//! the same bytes on every provider on every day (a replica's output must be byte-equal).

use std::path::Path;

use minijinja::value::{Serde, Value};
use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::ModelFiles;

/// The template's name in its environment.
const NAME: &str = "chat_template";

/// Prefix of the error message `raise_exception` produces, so a render failure that the
/// template raised on purpose is told apart from one of the template itself.
const RAISED: &str = "the model's chat template refused the messages: ";

/// One chat message as a template sees it (`message['role']`, `message['content']`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or any role the template accepts).
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special-token texts it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Where it was read from (for messages).
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// What `tokenizer_config.json` says that templates need.
#[derive(Debug, Default)]
pub struct TokenizerConfig {
    /// `chat_template` (the `default` one of a list).
    pub chat_template: Option<String>,
    /// `bos_token` as text (a string or an added-token object's `content`).
    pub bos_token: Option<String>,
    /// `eos_token` as text.
    pub eos_token: Option<String>,
}

impl TokenizerConfig {
    /// Reads the model's `tokenizer_config.json` (a folder's file, or a GGUF's metadata as
    /// that file); a missing file is an empty config.
    pub fn read(dir: &Path) -> Result<Self> {
        let Some((path, text)) = ModelFiles::locate(dir)?.read_text("tokenizer_config.json")?
        else {
            return Ok(Self::default());
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.clone(),
            what: "tokenizer_config.json",
            reason: e.to_string(),
        })?;
        let bad = |field: &str, reason: &str| Error::Config {
            path: path.clone(),
            what: "tokenizer_config.json",
            reason: format!("`{field}`: {reason}"),
        };
        let token = |field: &str| -> Result<Option<String>> {
            match value.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(object) => match object.get("content").and_then(serde_json::Value::as_str) {
                    Some(s) => Ok(Some(s.to_string())),
                    None => Err(bad(field, "must be a string or an object with `content`")),
                },
            }
        };
        let chat_template = match value.get("chat_template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(named)) => {
                let default = named
                    .iter()
                    .find(|t| t.get("name").and_then(serde_json::Value::as_str) == Some("default"));
                match default {
                    Some(t) => Some(
                        t.get("template")
                            .and_then(serde_json::Value::as_str)
                            .ok_or_else(|| {
                                bad("chat_template", "the `default` entry has no `template`")
                            })?
                            .to_string(),
                    ),
                    None => {
                        return Err(bad(
                            "chat_template",
                            "a list of named templates without one named `default`",
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(bad(
                    "chat_template",
                    "must be a string or a list of {name, template}",
                ));
            }
        };
        Ok(Self {
            chat_template,
            bos_token: token("bos_token")?,
            eos_token: token("eos_token")?,
        })
    }
}

/// `raise_exception(message)`: the template refuses the messages.
fn raise_exception(message: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

impl ChatTemplate {
    /// The chat template of a model directory (see the module doc), or `None` when it has none.
    pub fn for_model(dir: &Path, tokenizer_config: &TokenizerConfig) -> Result<Option<Self>> {
        let files = ModelFiles::locate(dir)?;
        let file = files.dir().join("chat_template.jinja");
        let (source, text) = if file.exists() {
            let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
            (file.display().to_string(), text)
        } else if let Some(text) = &tokenizer_config.chat_template {
            (
                format!(
                    "{} (chat_template)",
                    files.dir().join("tokenizer_config.json").display()
                ),
                text.clone(),
            )
        } else {
            return Ok(None);
        };
        Self::new(
            text,
            source,
            tokenizer_config.bos_token.clone(),
            tokenizer_config.eos_token.clone(),
        )
        .map(Some)
    }

    /// Compiles `text`; `source` names it in errors.
    pub fn new(
        text: String,
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        // transformers' own environment: a block tag's newline and leading blanks are not
        // output. Without these, every template renders extra newlines and spaces.
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("the default delimiters are valid"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, text)
            .map_err(|e| Error::ChatTemplate(format!("{source}: {e}")))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
            source,
        })
    }

    /// Where the template was read from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text of `messages`; with `add_generation_prompt`, ending where the assistant's
    /// answer starts. A template that raises, or fails on these messages, is
    /// [`Error::ChatTemplate`] with its message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .expect("added when the template was compiled");
        template
            .render(context! {
                messages => Value::from(Serde(messages)),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_deref(),
                eos_token => self.eos_token.as_deref(),
            })
            .map_err(|e| {
                let detail = e.detail().unwrap_or_default();
                match detail.strip_prefix(RAISED) {
                    Some(raised) => Error::ChatTemplate(format!("{RAISED}{raised}")),
                    None => Error::ChatTemplate(format!(
                        "the model's chat template failed on these messages: {e}"
                    )),
                }
            })
    }

    /// The text a template writes right after an assistant's message ends (its end-of-turn
    /// marker, e.g. `<|im_end|>` or `<|eot_id|>`), found by rendering a short chat whose
    /// answer is a sentinel and reading what follows it. `None` when the template writes
    /// nothing there or refuses both probe chats.
    pub fn after_assistant_turn(&self) -> Option<String> {
        const SENTINEL: &str = "CX_SENTINEL_ANSWER";
        let chats = [
            vec![
                ChatMessage::new("user", "hi"),
                ChatMessage::new("assistant", SENTINEL),
            ],
            vec![
                ChatMessage::new("system", "s"),
                ChatMessage::new("user", "hi"),
                ChatMessage::new("assistant", SENTINEL),
            ],
        ];
        chats.iter().find_map(|chat| {
            let text = self.render(chat, false).ok()?;
            let at = text.rfind(SENTINEL)? + SENTINEL.len();
            let after = &text[at..];
            (!after.is_empty()).then(|| after.to_string())
        })
    }
}

/// The chat template written beside generated models (`gen-model`): the role-tagged form of
/// [`cx_protocol::order::chat_prompt`] — `<|role|>`, a newline, the content and a newline per
/// message, then `<|assistant|>` and a newline — after the BOS token, so a generated model's
/// chat renders to the same tokens an exchange's door prices.
pub const GENERATED_CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}\
{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

#[cfg(test)]
mod tests {
    use super::*;

    fn template(text: &str) -> ChatTemplate {
        ChatTemplate::new(
            text.into(),
            "test".into(),
            Some("<s>".into()),
            Some("</s>".into()),
        )
        .unwrap()
    }

    #[test]
    fn generated_template_is_the_protocols_chat_prompt_after_bos() {
        let t = template(GENERATED_CHAT_TEMPLATE);
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "2+2?"),
        ];
        let want = cx_protocol::order::chat_prompt([("system", "Be brief."), ("user", "2+2?")]);
        assert_eq!(t.render(&messages, true).unwrap(), format!("<s>{want}"));
    }

    /// A ChatML template as Qwen and SmolLM write it, with the blank-trimming transformers
    /// applies (`trim_blocks`, `lstrip_blocks`) and Python string methods.
    #[test]
    fn chatml_renders_as_transformers_does() {
        let t = template(concat!(
            "{% for message in messages %}\n",
            "    {% if loop.first and message['role'] != 'system' %}",
            "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}\n",
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + \
             '<|im_end|>' + '\\n' }}{% endfor %}\n",
            "{% if add_generation_prompt %}\n{{ '<|im_start|>assistant\\n' }}{% endif %}",
        ));
        let out = t
            .render(&[ChatMessage::new("user", "  What is 2+2? ")], true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?\
             <|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.after_assistant_turn().as_deref(), Some("<|im_end|>\n"));
    }

    #[test]
    fn raise_exception_is_an_error_with_the_templates_message() {
        let t = template(
            "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('Conversation must \
             start with a user message') }}{% endif %}{{ messages[0]['content'] }}",
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("Conversation must start with a user message"),
            "{err}"
        );
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], true).unwrap(),
            "x"
        );
    }

    #[test]
    fn a_template_that_does_not_compile_is_refused_naming_its_source() {
        let err = ChatTemplate::new(
            "{% for %}".into(),
            "dir/chat_template.jinja".into(),
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("dir/chat_template.jinja"), "{err}");
    }

    #[test]
    fn tokenizer_config_templates_and_tokens_in_every_form() {
        let dir = std::env::temp_dir().join(format!("cx-chat-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |v: serde_json::Value| {
            std::fs::write(dir.join("tokenizer_config.json"), v.to_string()).unwrap();
            TokenizerConfig::read(&dir)
        };
        let c = write(serde_json::json!({
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
            "bos_token": {"content": "<|begin_of_text|>", "special": true},
            "eos_token": "<|eot_id|>",
        }))
        .unwrap();
        assert_eq!(c.chat_template.as_deref(), Some("D"));
        assert_eq!(c.bos_token.as_deref(), Some("<|begin_of_text|>"));
        assert_eq!(c.eos_token.as_deref(), Some("<|eot_id|>"));
        let err = write(serde_json::json!({"chat_template": [{"name": "rag", "template": "R"}]}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("chat_template"), "{err}");
        // chat_template.jinja wins over tokenizer_config.json.
        write(serde_json::json!({"chat_template": "old"})).unwrap();
        std::fs::write(dir.join("chat_template.jinja"), "new").unwrap();
        let c = TokenizerConfig::read(&dir).unwrap();
        let t = ChatTemplate::for_model(&dir, &c).unwrap().unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "new");
        std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
        let t = ChatTemplate::for_model(&dir, &c).unwrap().unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "old");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
