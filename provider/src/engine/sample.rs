//! The next token from a sequence's logits, as OpenAI defines the parameters: presence and
//! frequency penalties, then the temperature (0: greedy), top-k, top-p, and a draw; and the
//! log-probabilities a request may ask for.
//!
//! # Reproducible draws
//! A draw is keyed by (seed, choice, position): the uniform number for the token at sequence
//! position `p` of choice `c` is word `2p` of ChaCha20 seeded with `seed` on stream `c`
//! (RFC 8439's counter-based construction, through `rand_chacha`). Nothing depends on what
//! was drawn before, on the batch or on the thread, and every step here walks the vocabulary
//! in one fixed order (ties broken by the lower id), so two providers of the same kernel corpus
//! — whose logits are equal bit for bit in class D — choose the same tokens for the same
//! request and seed: a seeded sampled job is still checkable by byte equality (T1/T3).

use cx_kernels::rng::{ChaCha20Rng, RngCore, SeedableRng};

/// How the next token is chosen (OpenAI's parameters, checked by the HTTP layer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy (argmax, lowest id on ties; determinism class D). Otherwise softmax at this
    /// temperature.
    pub temperature: f32,
    /// Nucleus: sample from the most likely tokens whose probabilities add up to at least this
    /// (`(0, 1]`; 1 keeps all).
    pub top_p: f32,
    /// Sample from the `top_k` most likely tokens only (0: all).
    pub top_k: u32,
    /// Subtracted from a token's logit once it has been generated (`[-2, 2]`).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time it has been generated (`[-2, 2]`).
    pub frequency_penalty: f32,
    /// Seed of the draws.
    pub seed: u64,
    /// Which of a request's `n` choices this sequence is: its own stream of draws.
    pub choice: u32,
    /// Log-probabilities to report per chosen token: `None` none, `Some(k)` the chosen
    /// token's and the `k` most likely ones (OpenAI's `top_logprobs`).
    pub logprobs: Option<u8>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            choice: 0,
            logprobs: None,
        }
    }
}

/// The log-probabilities of one chosen token (of the model's distribution, before penalties
/// and temperature, as vLLM reports them by default).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// The token at sequence position `position` after `generated` (this sequence's tokens so
/// far, for the penalties).
pub(crate) fn choose(
    logits: &[f32],
    sampling: &Sampling,
    generated: &[u32],
    position: usize,
) -> u32 {
    let penalised;
    let logits = if sampling.presence_penalty != 0.0 || sampling.frequency_penalty != 0.0 {
        penalised = penalise(logits, sampling, generated);
        &penalised[..]
    } else {
        logits
    };
    let best = argmax(logits);
    if sampling.temperature <= 0.0 {
        return best as u32;
    }
    let t = sampling.temperature;
    let max = logits[best];
    // Candidates in the order the draw walks them: most likely first when cut by top-k or
    // top-p (lower id first on ties), else by id.
    let mut candidates: Vec<u32> = (0..logits.len() as u32).collect();
    let by_likelihood = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = sampling.top_k as usize;
    if k > 0 && k < candidates.len() {
        candidates.select_nth_unstable_by(k - 1, by_likelihood);
        candidates.truncate(k);
        candidates.sort_unstable_by(by_likelihood);
    } else if sampling.top_p < 1.0 {
        candidates.sort_unstable_by(by_likelihood);
    }
    let weights: Vec<f64> = candidates
        .iter()
        .map(|&i| f64::from((logits[i as usize] - max) / t).exp())
        .collect();
    let mut total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    if sampling.top_p < 1.0 {
        let want = f64::from(sampling.top_p) * total;
        let mut acc = 0.0;
        for (n, w) in weights.iter().enumerate() {
            acc += w;
            if acc >= want {
                keep = n + 1;
                break;
            }
        }
        total = weights[..keep].iter().sum();
    }
    let u = uniform(sampling.seed, sampling.choice, position) * total;
    let mut acc = 0.0;
    for (&i, w) in candidates.iter().zip(&weights[..keep]) {
        acc += w;
        if u < acc {
            return i;
        }
    }
    // Rounding left `u` past the last sum: the last kept candidate.
    candidates[keep - 1]
}

/// The logits less OpenAI's penalties: `presence` once and `frequency` per occurrence of each
/// token already generated.
fn penalise(logits: &[f32], sampling: &Sampling, generated: &[u32]) -> Vec<f32> {
    let mut counts = std::collections::BTreeMap::<u32, u32>::new();
    for &t in generated {
        *counts.entry(t).or_default() += 1;
    }
    let mut out = logits.to_vec();
    for (t, n) in counts {
        if let Some(v) = out.get_mut(t as usize) {
            *v -= sampling.presence_penalty + sampling.frequency_penalty * n as f32;
        }
    }
    out
}

/// The first index of the largest value.
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Uniform in `[0, 1)` from 53 bits of word `2·position` of ChaCha20(seed) on stream `choice`.
fn uniform(seed: u64, choice: u32, position: usize) -> f64 {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(u64::from(choice));
    rng.set_word_pos(position as u128 * 2);
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The log-softmax of `logits` at `token`, and the `top` most likely tokens with theirs.
pub(crate) fn logprobs(logits: &[f32], token: u32, top: u8) -> TokenLogprobs {
    let max = logits[argmax(logits)];
    let sum: f64 = logits.iter().map(|&v| f64::from(v - max).exp()).sum();
    let log_z = f64::from(max) + sum.ln();
    let logprob = |i: u32| (f64::from(logits[i as usize]) - log_z) as f32;
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let k = usize::from(top).min(ids.len());
    let by_likelihood = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, by_likelihood);
    }
    ids.truncate(k);
    ids.sort_unstable_by(by_likelihood);
    TokenLogprobs {
        logprob: logprob(token),
        top: ids.into_iter().map(|i| (i, logprob(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(temperature: f32) -> Sampling {
        Sampling {
            temperature,
            seed: 7,
            ..Sampling::default()
        }
    }

    #[test]
    fn greedy_takes_the_lowest_id_among_ties() {
        assert_eq!(
            choose(&[1.0, 3.0, 3.0, 2.0], &Sampling::default(), &[], 0),
            1
        );
    }

    #[test]
    fn a_draw_depends_on_seed_choice_and_position_only() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let s = sampled(1.0);
        let at = |s: &Sampling, p| choose(&logits, s, &[], p);
        let run: Vec<u32> = (0..64).map(|p| at(&s, p)).collect();
        // The same again, in another order: nothing is carried between draws.
        let backwards: Vec<u32> = (0..64).rev().map(|p| at(&s, p)).collect();
        assert_eq!(run, backwards.into_iter().rev().collect::<Vec<_>>());
        let other_choice = Sampling { choice: 1, ..s };
        let other: Vec<u32> = (0..64).map(|p| at(&other_choice, p)).collect();
        assert_ne!(run, other);
        assert!(run.iter().collect::<std::collections::BTreeSet<_>>().len() > 5);
    }

    #[test]
    fn top_k_and_top_p_keep_only_the_likeliest() {
        let logits = [0.0, 5.0, 4.9, 0.1, 4.8];
        for p in 0..200 {
            let k2 = Sampling {
                top_k: 2,
                ..sampled(1.0)
            };
            assert!([1, 2].contains(&choose(&logits, &k2, &[], p)));
            let nucleus = Sampling {
                top_p: 0.5,
                ..sampled(1.0)
            };
            assert!([1, 2].contains(&choose(&logits, &nucleus, &[], p)));
        }
        // A tiny top_p is greedy.
        let tiny = Sampling {
            top_p: 1e-6,
            ..sampled(1.0)
        };
        assert_eq!(choose(&logits, &tiny, &[], 3), 1);
    }

    #[test]
    fn penalties_lower_what_was_generated() {
        let logits = [1.0, 1.5];
        let s = Sampling {
            frequency_penalty: 0.4,
            ..Sampling::default()
        };
        assert_eq!(choose(&logits, &s, &[1], 0), 1);
        assert_eq!(choose(&logits, &s, &[1, 1], 0), 0);
        let s = Sampling {
            presence_penalty: 0.6,
            ..Sampling::default()
        };
        assert_eq!(choose(&logits, &s, &[1], 0), 0);
    }

    #[test]
    fn logprobs_are_the_log_softmax() {
        let lp = logprobs(&[0.0, (3f32).ln(), 0.0], 1, 2);
        assert!((lp.logprob - (0.6f32).ln()).abs() < 1e-6);
        assert_eq!(lp.top.len(), 2);
        assert_eq!(lp.top[0].0, 1);
        assert_eq!(lp.top[1].0, 0);
        assert!((lp.top[1].1 - (0.2f32).ln()).abs() < 1e-6);
    }
}
