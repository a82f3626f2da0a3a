//! The featuriser: a request becomes a fixed-length feature vector x.
//!
//! It is a pure function behind the [`Classifier`] trait so that a learned classifier can
//! replace the heuristic one without touching the router: anything that maps a [`Request`] to
//! [`Features`] will do.

use serde::{Deserialize, Serialize};

/// Length of a feature vector.
pub const FEATURES: usize = 8;
/// x: `[bias, log tokens, long context, vision, audio, code, reasoning, extraction]`.
pub type Features = [f64; FEATURES];
/// Tokens beyond which a request counts as long context.
pub const LONG_CONTEXT_TOKENS: u32 = 8192;

/// What a request asks for, as the buyer hinted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// General conversation.
    Chat,
    /// Writing or reading code.
    Code,
    /// Multi-step reasoning or mathematics.
    Reasoning,
    /// Pulling structured data out of text.
    Extraction,
}

/// The modality a buyer hints at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Modality {
    /// Text only.
    Text,
    /// Images in the input.
    Vision,
    /// Audio in the input.
    Audio,
}

/// A request as the router sees it (before any model is chosen).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The prompt text.
    pub text: String,
    /// Images attached.
    #[serde(default)]
    pub images: u32,
    /// Seconds of audio attached.
    #[serde(default)]
    pub audio_s: f64,
    /// Tokens the buyer allows for the answer.
    #[serde(default)]
    pub max_output_tokens: u32,
    /// The buyer's task hint, if any.
    #[serde(default)]
    pub task: Option<Task>,
    /// The buyer's modality hint, if any.
    #[serde(default)]
    pub modality: Option<Modality>,
}

/// Token estimate of a text: ⌈bytes / 4⌉, the usual rule of thumb for BPE tokenisers on
/// English and code (a tokeniser-exact count would need the model's vocabulary).
pub fn estimate_tokens(text: &str) -> u32 {
    u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX)
}

/// Context a request needs: prompt tokens plus the answer allowance.
pub fn context_tokens(request: &Request) -> u32 {
    estimate_tokens(&request.text).saturating_add(request.max_output_tokens)
}

/// Maps a request to features.
pub trait Classifier {
    /// x for `request`; must be a pure function of it.
    fn features(&self, request: &Request) -> Features;
}

/// The hand-written classifier: hints win, keywords fill in when there is no hint.
#[derive(Debug, Clone, Copy, Default)]
pub struct Heuristic;

fn mentions(text: &str, words: &[&str]) -> bool {
    words.iter().any(|w| text.contains(w))
}

impl Classifier for Heuristic {
    fn features(&self, request: &Request) -> Features {
        let tokens = context_tokens(request);
        let lower = request.text.to_ascii_lowercase();
        let hint = |t: Task| request.task == Some(t);
        let no_hint = request.task.is_none();
        let code = hint(Task::Code)
            || (no_hint
                && mentions(
                    &lower,
                    &["```", "fn ", "def ", "class ", "compile", "stack trace"],
                ));
        let reasoning = hint(Task::Reasoning)
            || (no_hint
                && mentions(
                    &lower,
                    &["prove", "step by step", "why ", "derive", "solve"],
                ));
        let extraction = hint(Task::Extraction)
            || (no_hint && mentions(&lower, &["extract", "json", "fields", "table of"]));
        let vision = request.images > 0 || request.modality == Some(Modality::Vision);
        let audio = request.audio_s > 0.0 || request.modality == Some(Modality::Audio);
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        [
            1.0,
            // ln(1 + tokens) / ln(1 + 128 Ki): 0 for an empty prompt, ≈ 1 at a full long context.
            (f64::from(tokens)).ln_1p() / 131_072f64.ln_1p(),
            flag(tokens > LONG_CONTEXT_TOKENS),
            flag(vision),
            flag(audio),
            flag(code),
            flag(reasoning),
            flag(extraction),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_and_keywords_set_the_right_features() {
        let c = Heuristic;
        let plain = c.features(&Request {
            text: "hello there".into(),
            ..Request::default()
        });
        assert_eq!(plain[0], 1.0);
        assert_eq!(&plain[2..], &[0.0; 6]);
        let code = c.features(&Request {
            text: "why does this fn not compile?".into(),
            ..Request::default()
        });
        assert_eq!((code[5], code[6]), (1.0, 1.0));
        // A hint overrides keyword guessing.
        let hinted = c.features(&Request {
            text: "why does this fn not compile?".into(),
            task: Some(Task::Extraction),
            images: 2,
            ..Request::default()
        });
        assert_eq!(
            (hinted[3], hinted[5], hinted[6], hinted[7]),
            (1.0, 0.0, 0.0, 1.0)
        );
        let long = c.features(&Request {
            text: "x".repeat(40_000),
            ..Request::default()
        });
        assert_eq!(long[2], 1.0);
        assert!(long[1] > plain[1]);
    }

    #[test]
    fn token_estimate_rounds_up() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abcde"), 2);
    }
}
