//! Fan-out: dispatch the top-N arms, then fuse their answers with a synthesiser that has no
//! weights of its own.
//!
//! - Class D (bit-reproducible): **majority** by byte equality; without a strict majority
//!   there is no answer to trust, and the caller learns that.
//! - Classes D∞ and S: the **medoid** — the answer most similar to all the others, by Jaccard
//!   similarity of their word sets — so one outlier cannot win, and no answer is invented.
//!
//! Ties go to the earlier (higher-ranked) arm, so fusion is deterministic.

use super::utility::Scored;
use cx_protocol::DeterminismClass;
use serde::Serialize;
use std::collections::BTreeSet;

/// The arms to dispatch: the first `n` of a ranking.
pub fn top_n(ranked: &[Scored], n: usize) -> Vec<usize> {
    ranked.iter().take(n).map(|s| s.arm).collect()
}

/// The fused answer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fused {
    /// Index (into the answers given) of the answer returned.
    pub chosen: usize,
    /// Class D: share of answers byte-equal to it; otherwise its mean similarity to the rest.
    pub agreement: f64,
    /// Class D: whether more than half agreed. Otherwise always true.
    pub majority: bool,
}

fn words(text: &str) -> BTreeSet<&str> {
    text.split_whitespace().collect()
}

fn jaccard(a: &BTreeSet<&str>, b: &BTreeSet<&str>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

/// Fuses answers (in rank order) for a job of determinism class `class`; `None` if empty.
pub fn synthesise(answers: &[&str], class: DeterminismClass) -> Option<Fused> {
    if answers.is_empty() {
        return None;
    }
    let n = answers.len();
    if class == DeterminismClass::D {
        let mut best = (0, 0usize);
        for (i, a) in answers.iter().enumerate() {
            let votes = answers
                .iter()
                .filter(|b| a.as_bytes() == b.as_bytes())
                .count();
            if votes > best.1 {
                best = (i, votes);
            }
        }
        return Some(Fused {
            chosen: best.0,
            agreement: best.1 as f64 / n as f64,
            majority: 2 * best.1 > n,
        });
    }
    let sets: Vec<BTreeSet<&str>> = answers.iter().map(|a| words(a)).collect();
    let mut best = (0, f64::NEG_INFINITY);
    for i in 0..n {
        let total: f64 = (0..n)
            .filter(|&j| j != i)
            .map(|j| jaccard(&sets[i], &sets[j]))
            .sum();
        let mean = if n > 1 { total / (n - 1) as f64 } else { 1.0 };
        if mean > best.1 {
            best = (i, mean);
        }
    }
    Some(Fused {
        chosen: best.0,
        agreement: best.1,
        majority: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_d_takes_the_byte_majority_or_says_there_is_none() {
        let f = synthesise(&["b", "a", "a"], DeterminismClass::D).unwrap();
        assert_eq!((f.chosen, f.majority), (1, true));
        let f = synthesise(&["a", "b", "c"], DeterminismClass::D).unwrap();
        assert!(!f.majority);
        // "a " and "a" differ in bytes: no majority by similarity for class D.
        let f = synthesise(&["a ", "a", "c"], DeterminismClass::D).unwrap();
        assert!(!f.majority);
    }

    #[test]
    fn sampled_answers_fuse_to_the_medoid_not_the_outlier() {
        let answers = [
            "completely unrelated rambling text",
            "the capital of france is paris",
            "paris is the capital of france",
            "the capital is paris",
        ];
        let f = synthesise(&answers, DeterminismClass::S).unwrap();
        assert_ne!(f.chosen, 0);
        assert!(f.agreement > 0.4);
        assert!(synthesise(&[], DeterminismClass::S).is_none());
    }

    #[test]
    fn top_n_keeps_rank_order() {
        let ranked = [
            Scored {
                arm: 4,
                utility: 3.0,
            },
            Scored {
                arm: 1,
                utility: 2.0,
            },
            Scored {
                arm: 2,
                utility: 1.0,
            },
        ];
        assert_eq!(top_n(&ranked, 2), vec![4, 1]);
        assert_eq!(top_n(&ranked, 9), vec![4, 1, 2]);
    }
}
