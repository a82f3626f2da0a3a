//! The workload kinds, one file each: what the exchange does with an intent's request of that
//! kind — where its job goes (`WorkloadOrder::place`), and what a provider's result of it
//! must carry and pass before the job is `done` (`WorkloadOrder::produced`,
//! `WorkloadOrder::confirm`).
//!
//! The rest of the path is the same for every kind and never names one: intake verifies the
//! intent and commits the job ([`crate::intake`]), dispatch hands it out, the result's receipt
//! is compared field by field ([`crate::jobs::dispatch`]), verification and settlement follow. Each
//! of them reaches a kind's code through [`cx_protocol::each_workload!`], the protocol's one
//! list of kinds, so a kind is an impl of `WorkloadOrder` for its request type, written in
//! `orders/<kind>.rs` — never an arm in those files (`docs/adding-an-order-kind.md`).

pub mod inference;
pub mod matmul;
pub mod train;

use crate::error::Result;
use crate::intake::state::Intake;
use crate::jobs::placement::{Placed, Want};
use alloy::primitives::{Address, B256};
use cx_protocol::wire::{Assignment, Output};
use cx_protocol::workload::Request;

/// Who places an order, when, and on which tab: what every kind's placement is given.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placing {
    /// The buyer.
    pub(crate) account: Address,
    /// The exchange's clock, unix seconds.
    pub(crate) now_s: u64,
    /// The tab it is held on (chain, tab id): a tab's committed reserves may take the job
    /// first. `None` where it must go to spot (a session call, a reserve's rest gone).
    pub(crate) tab: Option<(u64, u64)>,
}

/// What a result of a kind produced, before its receipt is compared with the job.
pub(crate) struct Produced<C> {
    /// The output hash the receipt must sign.
    pub(crate) output_hash: [u8; 32],
    /// What the hash is taken over, as a refusal names it.
    pub(crate) hashed: &'static str,
    /// The tokens the receipt must count.
    pub(crate) tokens: u64,
    /// What those tokens are, as a refusal names them.
    pub(crate) tokens_are: &'static str,
    /// What `WorkloadOrder::confirm` checks once the receipt matched.
    pub(crate) then: C,
}

/// One workload kind on the exchange, implemented by its request type.
pub(crate) trait WorkloadOrder: Request {
    /// The output fields beside `text` ([`Output`]) a result of this kind returns; any other
    /// is refused by name.
    const RETURNS: &'static [&'static str];

    /// What a matched receipt leaves for [`Self::confirm`] to check.
    type Then: Send;

    /// Where a new order's job goes: the request checked, the job it makes for clearing
    /// (model, compute, memory) and the clearing.
    async fn place(&self, intake: &Intake, want: &Want, placing: Placing) -> Result<Placed>;

    /// Where stranded job `id` goes again (its bundle left, or its provider gave it up). Like
    /// a new order unless the kind says otherwise.
    async fn place_again(
        &self,
        intake: &Intake,
        _id: B256,
        want: &Want,
        placing: Placing,
    ) -> Result<Placed> {
        self.place(intake, want, placing).await
    }

    /// What `output`, a provider's result of assigned job `job`, produced: what its receipt
    /// must sign and count. Refuses, by field, an output this kind cannot have made.
    async fn produced(
        &self,
        intake: &Intake,
        job: &Assignment,
        output: &Output,
    ) -> Result<Produced<Self::Then>>;

    /// The check of a result whose receipt matched, before the job is `done`: `Some` is what
    /// the job's `verified` event records. A result that fails is refused (and may end the job).
    /// None unless the kind has one (an inference is checked by its tier's replicas, if any).
    async fn confirm(
        &self,
        _intake: &Intake,
        _job_id: B256,
        _provider: &crate::books::Provider,
        _then: Self::Then,
        _now_s: u64,
    ) -> Result<Option<serde_json::Value>> {
        Ok(None)
    }
}

/// The optional fields of `output` that are set: what `WorkloadOrder::RETURNS` is checked
/// against.
pub(crate) fn returned(output: &Output) -> impl Iterator<Item = &'static str> {
    [
        ("product", output.product.is_some()),
        ("trained", output.trained.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
}
