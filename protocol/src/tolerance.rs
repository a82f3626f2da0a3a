//! The check of determinism class D∞ (SPEC §7: "equal up to float rounding — agreement within a
//! stated tolerance"): when two runs of a D∞ job agree.
//!
//! Runs on kernels that differ only in float rounding (FMA on one CPU and not on another, a GPU's
//! reduction order) compute logits equal in all but the last bits; greedy decoding turns them
//! into the same tokens except where two candidates are within rounding of each other, and there
//! one token may flip and the text after it may drift. A cheat's output (another text, a cut-off
//! answer, a cheaper model's) differs in most tokens. The rule:
//!
//! **Two runs agree when the edit distance (Levenshtein: insertions, deletions, substitutions)
//! between their output token sequences is at most [`D_INF_MAX_EDIT_PERCENT`] % (10 %) of the
//! longer sequence's length, rounded up** — so one flip in a short answer is tolerated, and two
//! empty outputs agree.
//!
//! The tokens compared are the model's token ids where both runs report them, else the words of
//! the output texts (split on Unicode whitespace, [`words`]): the exchange does not tokenize.
//! A flip early in a long answer can make honest runs drift apart by more than the bound: they
//! then disagree, and the tier's rule applies (a referee at T1, the majority at T3; with no two
//! agreeing nobody is paid). D∞ disagreement is never slashing evidence: only class D's byte
//! equality is.

/// The largest edit distance two agreeing D∞ runs may have, in percent of the longer output.
pub const D_INF_MAX_EDIT_PERCENT: usize = 10;

/// The tokens of an output text as the exchange compares them: its whitespace-separated words.
pub fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

/// The edit distance allowed between two outputs of `a_len` and `b_len` tokens:
/// ⌈[`D_INF_MAX_EDIT_PERCENT`] % × max(a_len, b_len)⌉.
pub fn d_inf_max_edits(a_len: usize, b_len: usize) -> usize {
    (a_len.max(b_len) * D_INF_MAX_EDIT_PERCENT).div_ceil(100)
}

/// Whether two runs' output token sequences agree within the D∞ tolerance (module docs).
/// Costs O(|a|·|b|) time and O(min(|a|, |b|)) memory; it stops early once the bound is out of
/// reach, and at once when the lengths alone differ by more than the bound.
pub fn d_inf_agree<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    let bound = d_inf_max_edits(a.len(), b.len());
    if a.len().abs_diff(b.len()) > bound {
        return false;
    }
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    // One row of the Levenshtein table over the shorter sequence.
    let mut row: Vec<usize> = (0..=short.len()).collect();
    for (i, x) in long.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        let mut best = row[0];
        for (j, y) in short.iter().enumerate() {
            let substitute = diagonal + usize::from(x != y);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
            best = best.min(row[j + 1]);
        }
        if best > bound {
            return false;
        }
    }
    row[short.len()] <= bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_flipped_token_in_ten_agrees_and_two_do_not() {
        let a: Vec<u32> = (0..10).collect();
        let mut b = a.clone();
        b[9] = 99;
        assert!(d_inf_agree(&a, &b));
        b[3] = 98;
        assert!(!d_inf_agree(&a, &b));
    }

    #[test]
    fn a_cheats_other_text_disagrees_and_equal_texts_agree() {
        let honest = words("The capital of France is Paris, a city on the Seine.");
        let drifted = words("The capital of France is Paris, a city on the river Seine.");
        let cheat = words("I cannot help with that request today, sorry.");
        assert!(d_inf_agree(&honest, &honest));
        assert!(d_inf_agree(&honest, &drifted));
        assert!(!d_inf_agree(&honest, &cheat));
        assert!(!d_inf_agree(&honest, &honest[..5]), "a cut-off answer");
        assert!(d_inf_agree::<u32>(&[], &[]));
        assert!(
            d_inf_agree(&[1u32], &[]),
            "one token of one: within the rounded-up bound"
        );
        assert!(!d_inf_agree(&[1u32, 2], &[]));
    }

    #[test]
    fn the_bound_is_ten_percent_of_the_longer_output_rounded_up() {
        assert_eq!(d_inf_max_edits(0, 0), 0);
        assert_eq!(d_inf_max_edits(1, 0), 1);
        assert_eq!(d_inf_max_edits(10, 3), 1);
        assert_eq!(d_inf_max_edits(11, 11), 2);
        assert_eq!(d_inf_max_edits(100, 95), 10);
    }
}
