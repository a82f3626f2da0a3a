//! The text streamed for each chosen token: incremental detokenization (never a broken
//! character in a chunk), stop ids, stop strings, and holding back a tail that may still become
//! a stop string.

use std::sync::Arc;

use super::sample::TokenLogprobs;
use super::scheduler::Running;
use super::{Event, FinishReason};
use crate::error::Error;
use crate::model::Model;
use crate::tokenizer::{Tokenizer, stable_prefix};

/// Appends `token`, streams the new text, and decides whether the sequence ends.
pub(super) fn advance(
    r: &mut Running,
    token: u32,
    logprobs: Option<TokenLogprobs>,
    model: &Model,
    tokenizer: &Tokenizer,
) {
    let config = model.config();
    let eos = tokenizer.is_stop(token);
    if !eos {
        r.generated.push(token);
    }
    let at_length = !eos
        && (r.generated.len() >= r.request.max_tokens
            || r.cache.len() + 1 >= config.max_position_embeddings);
    // The last step flushes what the detokenizer still holds.
    let piece = if eos || at_length {
        r.detokenizer.finish(tokenizer, &r.generated)
    } else {
        r.detokenizer.step(tokenizer, &r.generated)
    };
    match piece {
        Ok(piece) => r.text.push_str(&piece),
        Err(e) => {
            let _ = r
                .request
                .events
                .send(Event::Failed(Arc::new(Error::Generation {
                    stage: "decoding",
                    cause: Box::new(e),
                })));
            r.cancelled = true;
            return;
        }
    }
    // Borrowed field by field: `r`'s other fields are updated below while the text is read.
    let text = r.text.as_str();
    let mut finish = eos.then_some(FinishReason::Stop);
    let mut visible = text;
    // Only the new text, and the longest stop's length before it, can hold a first match:
    // what came before was searched at earlier tokens. Searching the whole text at every
    // token cost each step O(text × stops) on the batch thread, which every other request
    // waits for.
    let longest = r.request.stop.iter().map(String::len).max().unwrap_or(0);
    let from = floor_char_boundary(text, r.stop_scanned_bytes.saturating_sub(longest));
    if let Some(cut) = r
        .request
        .stop
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text[from..].find(s.as_str()).map(|at| from + at))
        .min()
    {
        visible = &text[..cut];
        finish = Some(FinishReason::Stop);
    }
    r.stop_scanned_bytes = stable_prefix(text).len();
    if finish.is_none() && at_length {
        finish = Some(FinishReason::Length);
    }
    let stable = if finish.is_some() {
        visible
    } else {
        // Hold back a tail that may be the start of a stop string, so streamed text never
        // shows what the non-streamed answer cuts.
        let stable = stable_prefix(visible);
        let held = r
            .request
            .stop
            .iter()
            .map(|stop| partial_stop_len(stable, stop))
            .max()
            .unwrap_or(0);
        &stable[..stable.len() - held]
    };
    let delta = stable.get(r.emitted_bytes..).unwrap_or("").to_string();
    r.emitted_bytes = r.emitted_bytes.max(stable.len());
    let text = Event::Text {
        delta,
        token,
        logprobs,
    };
    if r.request.stream {
        if r.request.events.send(text).is_err() {
            r.cancelled = true;
            return;
        }
    } else if r.request.events.is_closed() {
        r.cancelled = true;
        return;
    } else {
        r.held.push(text);
    }
    if let Some(reason) = finish {
        // Unsent text goes out now, before the scheduler sends `Done`.
        for event in r.held.drain(..) {
            if r.request.events.send(event).is_err() {
                r.cancelled = true;
                return;
            }
        }
        if r.request.conversation.is_some() {
            r.reply = Some(visible.to_string());
        }
        // Sent by the scheduler once the turn is held as a prefix, so a caller that hears
        // `Done` and sends the continuation at once finds it.
        r.done = Some(Event::Done {
            finish_reason: reason,
            prompt_tokens: r.request.prompt.len(),
            completion_tokens: r.generated.len() + usize::from(eos),
        });
        r.finished = Some(reason);
    }
}

/// The largest char boundary of `text` at or below `at`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Length of the longest proper prefix of `stop` that `text` ends with (0 if none).
fn partial_stop_len(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .filter(|&k| stop.is_char_boundary(k))
        .find(|&k| text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::partial_stop_len;

    #[test]
    fn holds_back_a_possible_stop_prefix() {
        assert_eq!(partial_stop_len("hello wo", "world"), 2);
        assert_eq!(partial_stop_len("hello", "world"), 0);
        assert_eq!(partial_stop_len("say ##", "###"), 2);
        assert_eq!(partial_stop_len("é", "éx"), "é".len());
    }
}
