//! The next token and the text streamed for it: greedy (class D) or seeded sampling, stop
//! strings, and holding back a tail that may still become a stop string.

use std::sync::Arc;

use cx_kernels::rng::{ChaCha20Rng, Rng, Standard};

use super::scheduler::Running;
use super::{Event, FinishReason, Sampling};
use crate::error::Error;
use crate::model::Model;
use crate::tokenizer::{Tokenizer, stable_prefix};

/// Greedy: the lowest id among the largest logits. Sampling: softmax at the temperature.
pub(crate) fn choose(logits: &[f32], sampling: Sampling, rng: &mut ChaCha20Rng) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    if sampling.temperature <= 0.0 {
        return best as u32;
    }
    let max = logits[best];
    let weights: Vec<f64> = logits
        .iter()
        .map(|&v| f64::from((v - max) / sampling.temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    // Uniform in [0, 1) from 53 random bits (rand's `Standard` for f64).
    let u: f64 = rng.sample::<f64, _>(Standard) * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if u < acc {
            return i as u32;
        }
    }
    best as u32
}

/// Appends `token`, streams the new text, and decides whether the sequence ends.
pub(super) fn advance(r: &mut Running, token: u32, model: &Model, tokenizer: &Tokenizer) {
    let config = model.config();
    let eos = config.eos_ids().contains(&token);
    if !eos {
        r.generated.push(token);
    }
    let text = match tokenizer.decode(&r.generated) {
        Ok(text) => text,
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
    };
    let mut finish = eos.then_some(FinishReason::Stop);
    let mut visible = text.as_str();
    // Only the new text, and the longest stop's length before it, can hold a first match:
    // what came before was searched at earlier tokens. Searching the whole text at every
    // token cost each step O(text × stops) on the batch thread, which every other request
    // waits for.
    let longest = r.request.stop.iter().map(String::len).max().unwrap_or(0);
    let from = floor_char_boundary(&text, r.stop_scanned_bytes.saturating_sub(longest));
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
    r.stop_scanned_bytes = stable_prefix(&text).len();
    if finish.is_none()
        && (r.generated.len() >= r.request.max_tokens
            || r.cache.len() + 1 >= config.max_position_embeddings)
    {
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
    let text = Event::Text { delta, token };
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
