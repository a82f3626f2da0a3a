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
//! equality is. The exchange judges T1 and T3 groups of D∞ jobs by this rule
//! (`exchange/server/src/verification.rs`).

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

/// The most cells of the edit-distance table one comparison fills (2²⁸: about half a second on
/// one core). The exchange compares results as they come in, and a provider chooses its
/// output's length (up to 1 MiB of text); without a bound, two long outputs could hold a worker
/// for minutes. The cost grows with the length of the outputs' differing middle (the common
/// prefix and suffix are not tabled) times their edit distance, so honest outputs a few flips
/// apart cost next to nothing; only outputs differing over many thousands of tokens reach the
/// bound, and they are then taken as disagreeing (a referee or the majority decides, and D∞
/// disagreement slashes nobody).
pub const D_INF_MAX_CELLS: usize = 1 << 28;

/// Whether two runs' output token sequences agree within the D∞ tolerance (module docs).
///
/// The common prefix and suffix are set aside first (they change no edit distance); then the
/// Levenshtein table is filled only within a band around its diagonal, the band doubling from
/// the lengths' difference up to the bound until the distance is found within it (a path
/// leaving a band of width k costs more than k). That is O(n + d·min(D, bound)) time for a
/// middle of d differing tokens at edit distance D, and O(d) memory; a comparison that would
/// fill more than [`D_INF_MAX_CELLS`] cells is a disagreement.
pub fn d_inf_agree<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    let bound = d_inf_max_edits(a.len(), b.len());
    if a.len().abs_diff(b.len()) > bound {
        return false;
    }
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[prefix..], &b[prefix..]);
    let suffix = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a, b) = (&a[..a.len() - suffix], &b[..b.len() - suffix]);
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    let mut cells = 0usize;
    let mut band = (long.len() - short.len()).max(1).min(bound);
    loop {
        cells = cells.saturating_add(long.len().saturating_mul(short.len().min(2 * band) + 1));
        if cells > D_INF_MAX_CELLS {
            return false;
        }
        if within_band(long, short, band) {
            return true;
        }
        if band >= bound {
            return false;
        }
        band = (band * 2).min(bound);
    }
}

/// Whether the edit distance of `long` and `short` (`long.len() - short.len() ≤ band`) is at
/// most `band`, filling only the cells within `band` of the table's diagonal.
fn within_band<T: PartialEq>(long: &[T], short: &[T], band: usize) -> bool {
    // Cells outside the band, or above it in cost, hold `over`: no path through them is within.
    let over = band + 1;
    let m = short.len();
    let mut prev: Vec<usize> = (0..=m).map(|j| j.min(over)).collect();
    let mut row = vec![over; m + 1];
    for (i, x) in long.iter().enumerate().map(|(i, x)| (i + 1, x)) {
        // Row i's band: columns lo..=hi (lo ≤ m, as long.len() - m ≤ band).
        let lo = i.saturating_sub(band);
        let hi = (i + band).min(m);
        let mut best = over;
        if lo == 0 {
            row[0] = i.min(over);
            best = row[0];
        } else {
            row[lo - 1] = over;
        }
        for j in lo.max(1)..=hi {
            let substitute = prev[j - 1] + usize::from(*x != short[j - 1]);
            let cell = substitute.min(prev[j] + 1).min(row[j - 1] + 1).min(over);
            row[j] = cell;
            best = best.min(cell);
        }
        // The next row reads one column past this band: outside it.
        if hi < m {
            row[hi + 1] = over;
        }
        if best > band {
            return false;
        }
        std::mem::swap(&mut prev, &mut row);
    }
    prev[m] <= band
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

    /// The full Levenshtein table, the definition the banded, trimmed one must equal.
    fn distance(a: &[u8], b: &[u8]) -> usize {
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, x) in a.iter().enumerate() {
            let mut diagonal = row[0];
            row[0] = i + 1;
            for (j, y) in b.iter().enumerate() {
                let substitute = diagonal + usize::from(x != y);
                diagonal = row[j + 1];
                row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
            }
        }
        row[b.len()]
    }

    #[test]
    fn the_banded_comparison_agrees_with_the_full_table_on_every_small_pair() {
        // A fixed xorshift stream: pairs of up to 40 tokens over 3 symbols (many near misses),
        // the second often an edit or a few of the first.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..20_000 {
            let a: Vec<u8> = (0..next(41)).map(|_| next(3) as u8).collect();
            let mut b = a.clone();
            for _ in 0..next(6) {
                let at = next(b.len() as u64 + 1) as usize;
                match next(3) {
                    0 => b.insert(at, next(3) as u8),
                    1 if at < b.len() => drop(b.remove(at)),
                    _ if at < b.len() => b[at] = next(3) as u8,
                    _ => {}
                }
            }
            if next(4) == 0 {
                b = (0..next(41)).map(|_| next(3) as u8).collect();
            }
            let expected = distance(&a, &b) <= d_inf_max_edits(a.len(), b.len());
            assert_eq!(d_inf_agree(&a, &b), expected, "{a:?} {b:?}");
        }
    }

    #[test]
    fn long_outputs_a_few_edits_apart_cost_little_and_a_costly_comparison_is_refused() {
        // 500 000 tokens one flip apart: the common prefix and suffix are not tabled.
        let a: Vec<u32> = (0..500_000).collect();
        let mut b = a.clone();
        b[250_000] = u32::MAX;
        assert!(d_inf_agree(&a, &b));
        // One token dropped at the start and one added at the end: the middle differs
        // throughout (no common prefix or suffix), the distance is 2, and a band of 2 finds it.
        let shifted: Vec<u32> = (1..500_001).collect();
        assert!(d_inf_agree(&a, &shifted));
        // Outputs differing throughout at a distance near the bound would need more than
        // D_INF_MAX_CELLS cells: refused, at a bounded cost.
        let c: Vec<u32> = a
            .iter()
            .map(|x| if x % 11 == 0 { u32::MAX } else { *x })
            .collect();
        assert!(!d_inf_agree(&a, &c));
    }
}
