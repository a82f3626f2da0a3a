//! Searches (SPEC §3, Las Vegas work) priced on expected work, not measured time.
//!
//! **The price.** A search for `SHA-256(prefix ‖ nonce) < target` succeeds on one trial with
//! probability `q = target / 2²⁵⁶`; the buyer names the probability P it wants a witness with,
//! so the work it pays for is the `n = ⌈ln(1 − P) / ln(1 − q)⌉` trials that reach it
//! ([`Search::budget_trials`]). Providers that take searches report the trials a second their
//! worker runs (`offer.search_trials_per_s`), so a trial costs `ask / rate` wei at a provider's
//! lowest ask: the search is priced at the cheapest live provider that can run `n` trials
//! before the deadline, and `n` trials' price is held — at most the buyer's `max_price_wei`.
//!
//! **The payment.** Whoever finds a witness did, in expectation, the `⌈1/q⌉` trials a witness
//! implies ([`Search::witness_trials`]) wherever in the nonce space it looked, so that is what it
//! is paid — at the price per trial set when the search was accepted, never above the hold. A
//! buyer asking for P above `1 − 1/e` holds more than a witness costs and gets the rest back; one
//! asking for less pays its whole hold. The committee re-checks the bound from the signed order
//! alone ([`cx_protocol::voucher`]).

use super::state::Intake;
use crate::error::{Error, Result};
use alloy::primitives::{B256, U256};
use cx_protocol::order::{Search, Signed};
use cx_protocol::price::wei_string;
use serde::{Deserialize, Serialize};

/// Longest search prefix accepted, bytes.
pub const MAX_SEARCH_PREFIX_BYTES: usize = 1024;

/// What the exchange priced a search at when it accepted it, kept beside the signed order
/// (`price`): the provider reads what a witness is paid, the claim is checked against it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchPrice {
    /// The provider whose rate and ask priced it: the cheapest per trial that could run the
    /// budget before the deadline.
    pub provider_key_hash: B256,
    /// Its lowest ask, wei per compute-second.
    pub ask_wei_per_s: u64,
    /// Its search worker's trials per second at this search's prefix length (its offer reports
    /// the rate on a one-block message; a longer prefix hashes more blocks a trial).
    pub trials_per_s: u64,
    /// q: one trial's success probability.
    pub trial_probability: f64,
    /// n: the trials that find a witness with the buyer's P.
    #[serde(with = "wei_string")]
    pub budget_trials: u128,
    /// ⌈1/q⌉: the trials a witness implies.
    #[serde(with = "wei_string")]
    pub witness_trials: u128,
    /// n trials at the price: what is held.
    #[serde(with = "wei_string")]
    pub hold_wei: u128,
    /// ⌈1/q⌉ trials at the price, at most the hold: what a witness is paid.
    #[serde(with = "wei_string")]
    pub witness_wei: u128,
    /// How long n trials take at the rate, seconds.
    pub budget_s: f64,
}

/// `trials` at `ask_wei_per_s` and `trials_per_s`, wei, rounded up (saturating).
fn work_wei(trials: u128, ask_wei_per_s: u64, trials_per_s: u64) -> u128 {
    let wei =
        (U256::from(trials) * U256::from(ask_wei_per_s)).div_ceil(U256::from(trials_per_s.max(1)));
    u128::try_from(wei).unwrap_or(u128::MAX)
}

/// The price of `search` among `searchers` (key hash, lowest live ask, trials per second on a
/// one-block message) with
/// `seconds_left` to its deadline: the cheapest for its budget among those fast enough. The
/// error names the binding field.
pub(super) fn price_search(
    search: &Search,
    searchers: &[(B256, u64, u64)],
    seconds_left: u64,
) -> Result<SearchPrice> {
    let unpriced = |field, reason| Err(Error::SearchUnpriced { field, reason });
    // Rates are measured on a one-block message; a trial hashes the prefix and the nonce, and
    // SHA-256 costs one compression per 64-byte block (with 9 bytes of padding).
    let blocks = (search.prefix.len() as u64 + 8 + 9).div_ceil(64).max(1);
    let searchers: Vec<(B256, u64, u64)> = searchers
        .iter()
        .map(|&(key, ask, rate)| (key, ask, (rate / blocks).max(1)))
        .collect();
    let budget = search.budget_trials();
    let witness = search.witness_trials();
    let fast_enough = |rate: u64| budget as f64 / rate as f64 <= seconds_left as f64;
    let Some(&(key, ask, rate)) = searchers
        .iter()
        .filter(|(_, _, rate)| fast_enough(*rate))
        .min_by_key(|(key, ask, rate)| (work_wei(budget, *ask, *rate), *key))
    else {
        return match searchers.iter().map(|s| s.2).max() {
            None => unpriced("search.order", "no live provider takes searches".to_owned()),
            Some(fastest) => unpriced(
                "search.order.deadline_s",
                format!(
                    "{budget} trials (success probability {} at q = {:e}) take {:.1} s at the \
                     fastest live provider's {fastest} trials/s; {seconds_left} s are left",
                    f64::from(search.success_ppm) / 1e6,
                    search.trial_probability(),
                    budget as f64 / fastest as f64
                ),
            ),
        };
    };
    let hold_wei = work_wei(budget, ask, rate);
    if hold_wei > search.max_price_wei {
        return unpriced(
            "search.order.max_price_wei",
            format!(
                "{budget} trials cost {hold_wei} wei at the cheapest live provider ({ask} wei/s \
                 at {rate} trials/s), above max_price_wei {}",
                search.max_price_wei
            ),
        );
    }
    Ok(SearchPrice {
        provider_key_hash: key,
        ask_wei_per_s: ask,
        trials_per_s: rate,
        trial_probability: search.trial_probability(),
        budget_trials: budget,
        witness_trials: witness,
        hold_wei,
        witness_wei: work_wei(witness, ask, rate).min(hold_wei),
        budget_s: budget as f64 / rate as f64,
    })
}

impl Intake {
    /// A search: a SHA-256 preimage search priced on the work that finds a witness with the
    /// buyer's success probability (see the module), that price held on its tab.
    pub async fn submit_search(
        &self,
        signed: &Signed<Search>,
        now_s: u64,
    ) -> Result<super::StandingAccepted> {
        let verified = self.verify(signed, now_s, "search").await?;
        let search = &signed.order;
        if search.prefix.len() > MAX_SEARCH_PREFIX_BYTES {
            return Err(cx_protocol::Error::InvalidField {
                field: "search.order.prefix".into(),
                reason: format!("at most {MAX_SEARCH_PREFIX_BYTES} bytes"),
            }
            .into());
        }
        let searchers = self.searchers().await?;
        let price = price_search(search, &searchers, search.deadline_s.saturating_sub(now_s))?;
        self.standing(
            &verified,
            signed,
            price.hold_wei,
            Some(serde_json::to_value(&price)?),
            now_s,
        )
        .await
    }

    /// The live providers that take searches: key hash, lowest ask of their live bundles and
    /// trials per second.
    async fn searchers(&self) -> Result<Vec<(B256, u64, u64)>> {
        let live = self.market().bundles();
        Ok(self
            .books()
            .provider_offers()
            .await?
            .into_iter()
            .filter_map(|(key, offer)| {
                let rate = offer.search_trials_per_s?;
                let ask = live
                    .iter()
                    .filter(|b| offer.bundles.iter().any(|o| o.id == b.id))
                    .map(|b| b.price_wei_per_s)
                    .min()?;
                Some((key, ask, rate))
            })
            .collect())
    }

    /// Fills open search `id` with `witness`, found by `provider`, whose `receipt` claims it:
    /// the witness must satisfy the buyer's signed search (one hash), the receipt be signed by
    /// the provider's registered key and name exactly this search (its digest as job id and
    /// input, the witness's SHA-256 as output, the tab, the buyer, the payout) and claim what
    /// the search's price pays a witness. The first valid witness wins; a later one is refused
    /// as not open.
    pub async fn fill_search(
        &self,
        provider: &crate::books::Provider,
        id: B256,
        witness: u64,
        receipt: &cx_protocol::receipt::SignedReceipt,
        now_s: u64,
    ) -> Result<()> {
        use sha2::{Digest, Sha256};
        let order = self
            .books()
            .standing_order(id)
            .await?
            .filter(|o| o.kind == "search" && o.status == "open" && o.ends_s >= now_s)
            .ok_or(Error::SearchNotOpen)?;
        let corrupt = |what| Error::Corrupt {
            what,
            value: id.to_string(),
        };
        let signed: Signed<Search> = serde_json::from_value(
            order
                .order
                .get("search")
                .cloned()
                .ok_or(corrupt("a search order"))?,
        )?;
        let price: SearchPrice = serde_json::from_value(
            order
                .order
                .get("price")
                .cloned()
                .ok_or(corrupt("a search without its price"))?,
        )?;
        if !signed.order.is_witness(witness) {
            return Err(Error::NotAWitness { witness });
        }
        let key = cx_protocol::pq::PublicIdentity::from_bytes(&provider.mldsa_key)?;
        receipt.verify(&key).map_err(|e| e.within("receipt"))?;
        let r = &receipt.receipt;
        let output: [u8; 32] = Sha256::digest(witness.to_le_bytes()).into();
        let checks: [(&'static str, bool); 9] = [
            ("job_id", r.job_id == id.0),
            ("input_hash", r.input_hash == id.0),
            ("output_hash", r.output_hash == output),
            ("chain_id", r.chain_id == order.chain_id),
            ("escrow_id", r.escrow_id == order.escrow_id),
            ("buyer", r.buyer == order.account.0.0),
            ("adapter_hash", r.adapter_hash == [0; 32]),
            ("provider", r.provider == provider.payout.0.0),
            ("amount_owed_wei", r.amount_owed_wei == price.witness_wei),
        ];
        if let Some((field, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(Error::ReceiptMismatch {
                field,
                reason: format!(
                    "is not what this search and witness make it (job id and input: the \
                     search's digest; output: SHA-256 of the witness's 8 little-endian bytes; \
                     the tab, buyer and payout account; amount: {} wei, the {} trials a witness \
                     implies at the search's price)",
                    price.witness_wei, price.witness_trials
                ),
            });
        }
        if !self
            .books()
            .fill_search(
                id,
                provider.key_hash,
                witness,
                price.witness_wei,
                &serde_json::to_value(receipt)?,
                now_s,
            )
            .await?
        {
            return Err(Error::SearchNotOpen);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::Bytes;

    fn search(zero_bits: u32, success_ppm: u32, max_price_wei: u128) -> Search {
        Search {
            prefix: Bytes::from_static(b"cx"),
            target: B256::from(cx_exchange::lifecycle::search::target_for_zero_bits(
                zero_bits,
            )),
            success_ppm,
            deadline_s: 100,
            max_price_wei,
            tab_id: 1,
            nonce: 1,
            expiry_s: 100,
        }
    }

    #[test]
    fn a_witness_is_paid_the_work_it_implies_and_the_budget_is_held() {
        // q = 1/2: a witness implies 2 trials; 0.99 needs ⌈ln 0.01 / ln 0.5⌉ = 7.
        let key = B256::repeat_byte(1);
        let price = price_search(&search(1, 990_000, 10_000), &[(key, 1_000, 100)], 60).unwrap();
        assert_eq!((price.budget_trials, price.witness_trials), (7, 2));
        assert_eq!((price.hold_wei, price.witness_wei), (70, 20));
        // P = 1/2 at q = 2⁻¹⁰: 710 trials held, below the 1 024 a witness implies, so a witness
        // is paid the hold.
        let price = price_search(&search(10, 500_000, 10_000), &[(key, 1_000, 100)], 60).unwrap();
        assert_eq!(price.budget_trials, 710);
        assert_eq!(price.witness_wei, price.hold_wei);
        // A 100-byte prefix hashes two blocks a trial: half the rate, twice the price.
        let long = Search {
            prefix: Bytes::from(vec![7; 100]),
            ..search(1, 990_000, 10_000)
        };
        let price = price_search(&long, &[(key, 1_000, 100)], 60).unwrap();
        assert_eq!(
            (price.trials_per_s, price.hold_wei, price.witness_wei),
            (50, 140, 40)
        );
    }

    #[test]
    fn the_cheapest_fast_enough_provider_prices_it_and_refusals_name_the_field() {
        let (slow_cheap, fast_dear) = (B256::repeat_byte(1), B256::repeat_byte(2));
        let searchers = [(slow_cheap, 1, 10_000), (fast_dear, 1_000, 1_000_000)];
        // 2²⁰ × ln 100 ≈ 4.8 M trials: 483 s at the cheap one, 4.8 s at the fast one.
        let s = search(20, 990_000, u128::MAX);
        let price = price_search(&s, &searchers, 10_000).unwrap();
        assert_eq!(price.provider_key_hash, slow_cheap);
        let price = price_search(&s, &searchers, 60).unwrap();
        assert_eq!(price.provider_key_hash, fast_dear);
        let field = |r: Result<SearchPrice>| match r {
            Err(Error::SearchUnpriced { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(price_search(&s, &searchers, 1)),
            "search.order.deadline_s"
        );
        assert_eq!(
            field(price_search(&search(20, 990_000, 1), &searchers, 60)),
            "search.order.max_price_wei"
        );
        assert_eq!(field(price_search(&s, &[], 60)), "search.order");
    }
}
