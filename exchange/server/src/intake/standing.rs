//! Standing orders in: reserves, rents on state and searches. Each is checked as an intent is
//! (domain, times, both signatures against the bound key, then its own fields) and accepted with
//! the most it can cost held on its tab; providers fill them (the providers' issue), and one that
//! ends unfilled returns its hold at the sweep.

use super::state::Intake;
use crate::books::{NewOrder, StandingTerms};
use crate::error::{Error, Result};
use cx_protocol::order::{Order, Rent, Reserve, Search, Signed, Verified};
use serde::Deserialize;

/// Longest rent term accepted, seconds (30 days).
pub const MAX_RENT_TERM_S: u64 = 30 * 24 * 3600;

/// `POST /v1/reserves`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveSubmission {
    /// The reserve with both signatures.
    pub reserve: Signed<Reserve>,
}

/// `POST /v1/rents`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RentSubmission {
    /// The rent with both signatures.
    pub rent: Signed<Rent>,
}

/// `POST /v1/searches`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchSubmission {
    /// The search with both signatures.
    pub search: Signed<Search>,
}

pub use cx_protocol::wire::StandingAccepted;

/// A kind of standing order: the terms the books keep of it in columns, read from the signed
/// order once, when it is accepted ([`StandingTerms`]).
pub trait Standing: Order {
    /// Its terms when accepted at `now_s` (a rent's term runs from then).
    fn terms(&self, now_s: u64) -> StandingTerms;
}

impl Standing for Reserve {
    fn terms(&self, _now_s: u64) -> StandingTerms {
        StandingTerms {
            ends_s: self.window_end_s,
            starts_s: Some(self.window_start_s),
            model: Some(self.model.clone()),
            compute_ms: Some(self.compute_ms),
            ..StandingTerms::default()
        }
    }
}

impl Standing for Rent {
    fn terms(&self, now_s: u64) -> StandingTerms {
        StandingTerms {
            ends_s: now_s.saturating_add(self.term_s),
            target: Some(self.target),
            target_kind: Some(self.target_kind),
            epsilon_ppm: Some(self.epsilon_ppm),
            ..StandingTerms::default()
        }
    }
}

impl Standing for Search {
    fn terms(&self, _now_s: u64) -> StandingTerms {
        StandingTerms {
            ends_s: self.deadline_s,
            ..StandingTerms::default()
        }
    }
}

impl Intake {
    /// A reserve: capacity for a catalog model over a window, take-or-pay, so the whole
    /// `compute_ms × max_price_wei_per_s` is held.
    pub async fn submit_reserve(
        &self,
        signed: &Signed<Reserve>,
        now_s: u64,
    ) -> Result<StandingAccepted> {
        let verified = self.verify(signed, now_s, "reserve").await?;
        let reserve = &signed.order;
        self.market()
            .catalog()
            .resolve(&reserve.model)
            .map_err(|_| Error::UnknownModel(reserve.model.clone()))?;
        let held_wei = reserve.most_wei();
        self.standing(&verified, signed, held_wei, None, now_s)
            .await
    }

    /// A rent: an adapter, a base or a conversation prefix kept resident for a term at most
    /// `max_rent_wei`, committed at once to the live bundles that hold it most cheaply, as many
    /// as its ε needs (see [`super::rent`]), with their terms' rent held; with no such bundles
    /// it is refused and nothing is held.
    pub async fn submit_rent(&self, signed: &Signed<Rent>, now_s: u64) -> Result<StandingAccepted> {
        let verified = self.verify(signed, now_s, "rent").await?;
        let rent = &signed.order;
        if rent.term_s > MAX_RENT_TERM_S {
            return Err(cx_protocol::Error::InvalidField {
                field: "rent.order.term_s".into(),
                reason: format!("at most {MAX_RENT_TERM_S} seconds"),
            }
            .into());
        }
        let (holders, size_bytes) = self.rent_terms(rent, now_s).await?;
        // The price is known now: the holders' terms are the most it can cost.
        let held_wei = holders.iter().map(|h| h.rent_wei).sum();
        let mut accepted = self
            .standing(&verified, signed, held_wei, None, now_s)
            .await?;
        if self
            .books()
            .commit_rent(accepted.order_id, size_bytes, now_s, &holders)
            .await?
        {
            accepted.status = "committed".into();
        }
        Ok(accepted)
    }

    /// Commits a verified standing order accepted at `now_s` with its hold; the tab must stay
    /// open until it ends plus the settlement margin. `price` is what the exchange set (kept
    /// beside the signed order as `price`, for the provider that fills it and for the claim).
    pub(super) async fn standing<T: Standing>(
        &self,
        verified: &Verified,
        signed: &Signed<T>,
        held_wei: u128,
        price: Option<serde_json::Value>,
        now_s: u64,
    ) -> Result<StandingAccepted> {
        let terms = signed.order.terms(now_s);
        let ends_s = terms.ends_s;
        let kind = T::KIND.as_str();
        let escrow_id = signed.order.tab_id().ok_or(Error::Corrupt {
            what: "a standing order without a tab",
            value: kind.to_owned(),
        })?;
        let (bare, mldsa_signature) = NewOrder::split_cosignature(signed);
        let order = NewOrder {
            digest: verified.digest,
            kind,
            account: verified.account,
            chain_id: signed.chain_id,
            nonce: signed.order.nonce(),
            body: match price {
                Some(price) => serde_json::json!({ kind: bare, "price": price }),
                None => serde_json::json!({ kind: bare }),
            },
            mldsa_signature,
            limit_wei: None,
        };
        if T::KIND == cx_protocol::order::Kind::Reserve {
            self.reserve_tabs
                .add(self.books(), (signed.chain_id, escrow_id), now_s)
                .await?;
        }
        self.books()
            .accept_standing(
                &order,
                escrow_id,
                held_wei,
                &terms,
                ends_s.saturating_add(self.settle_margin_s),
            )
            .await?;
        Ok(StandingAccepted {
            order_id: verified.digest,
            kind: T::KIND,
            status: "open".into(),
            held_wei,
            ends_s,
        })
    }
}
