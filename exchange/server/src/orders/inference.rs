//! Inference, the first workload: a completion or a chat in a catalog model's market. Its job
//! is priced from the model's shape (`2 · parameters` FLOPs per token of context, the KV cache
//! as its memory), continues a conversation's prefix where it has one, may draw on its tab's
//! committed reserves, and is verified by re-execution (T1, T3) — never by T2, which is a
//! product's check. Its result is the text, hashed as it is.

use super::{Placing, Produced, WorkloadOrder};
use crate::error::{Error, Result};
use crate::intake::state::Intake;
use crate::jobs::placement::{Placed, Want};
use crate::task_router::Target;
use alloy::primitives::{Address, B256};
use cx_exchange::routing::features::estimate_tokens;
use cx_protocol::order::InferenceRequest;
use cx_protocol::wire::{Assignment, Output};
use cx_protocol::{Job, Tier};

/// Longest prompt accepted, bytes (the body limit bounds it too; this bounds the token estimate).
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

impl WorkloadOrder for InferenceRequest {
    const RETURNS: &'static [&'static str] = &[];
    type Then = ();

    /// Routed when it names a task; the tab's committed reserves in their window take it
    /// first, at no price of its own; else spot ([`Intake::place`]).
    async fn place(&self, intake: &Intake, want: &Want, placing: Placing) -> Result<Placed> {
        intake.place(want, self, placing).await
    }

    /// A verification run (or a job with runs) moves only to a provider not already in its
    /// group, or the replicas would check nothing.
    async fn place_again(
        &self,
        intake: &Intake,
        id: B256,
        want: &Want,
        placing: Placing,
    ) -> Result<Placed> {
        intake
            .place_apart(id, want, self, placing.account, placing.now_s)
            .await
    }

    async fn produced(&self, _: &Intake, _: &Assignment, output: &Output) -> Result<Produced<()>> {
        use sha2::{Digest, Sha256};
        Ok(Produced {
            output_hash: Sha256::digest(output.text.as_bytes()).into(),
            hashed: "output.text",
            tokens: u64::from(output.prompt_tokens) + u64::from(output.completion_tokens),
            tokens_are: "output.prompt_tokens + output.completion_tokens",
            then: (),
        })
    }
}

impl Intake {
    /// Where a job goes: as `want` says when it names a model (or was routed already: a
    /// fan-out's arm), else on the arms the task router ranks for it, in order — an arm no
    /// bundle takes when cleared is passed over for the next — with the route recorded in the
    /// decision. Each model's job is taken first by the tab's committed reserves in their
    /// window (at no price of its own), else cleared on spot ([`Intake::place_model`]).
    pub(crate) async fn place(
        &self,
        want: &Want,
        request: &InferenceRequest,
        placing: Placing,
    ) -> Result<Placed> {
        let Placing {
            account,
            now_s,
            tab,
        } = placing;
        // A want naming its model (the common case) is placed as it is, not copied.
        let routed: std::borrow::Cow<'_, [Want]> = match (&want.route, Target::parse(&want.model)?)
        {
            (Some(_), _) | (None, None) => std::borrow::Cow::Borrowed(std::slice::from_ref(want)),
            (None, Some(target)) if target.fan_out > 1 => {
                return Err(cx_protocol::Error::InvalidField {
                    field: "intent.order.want".to_owned(),
                    reason: "a fan-out answers with one of several jobs' outputs: it is the \
                             OpenAI door's (model cx/fanout:N); an order names one model or task"
                        .to_owned(),
                }
                .into());
            }
            (None, Some(target)) => self.route(&target, want, request, now_s)?.into(),
        };
        let mut passed_over = Vec::new();
        for (i, want) in routed.iter().enumerate() {
            let more = i + 1 < routed.len();
            let placed = match tab {
                Some(tab) => match self.drawn(want, request, account, tab, now_s).await? {
                    Some(drawn) => Ok(drawn),
                    None => self.place_model(want, request, account, now_s).await,
                },
                None => self.place_model(want, request, account, now_s).await,
            };
            match placed {
                Ok(mut placed) => {
                    if want.route.is_some() {
                        self.router().dispatched(&want.model);
                    }
                    placed.decision.route = want.route.as_deref().map(|r| {
                        let mut r = r.clone();
                        r.passed_over = passed_over;
                        r
                    });
                    return Ok(placed);
                }
                Err(Error::NoMatch { .. }) if more => passed_over.push(want.model.clone()),
                Err(err) => return Err(err),
            }
        }
        // The router ranks at least one arm or refuses: only an empty ranking ends here.
        Err(Error::NoMatch {
            detail: format!("no model can take {}", want.model),
        })
    }

    /// The arms the task router ranks for `target`, each as `want` routed to it.
    pub(crate) fn route(
        &self,
        target: &Target,
        want: &Want,
        request: &InferenceRequest,
        now_s: u64,
    ) -> Result<Vec<Want>> {
        self.checked(want, request, now_s)?;
        // Sounding the arms reads no account's state: the buyer is not needed.
        self.router()
            .route(self.market(), target, want, request, |want| {
                self.job(want, request, Address::ZERO, now_s)
            })
    }

    /// Where a job for a catalog model goes: the adapter's size from the store, the job from
    /// the catalog, and the clearing (at `min_tier`, else at the first stronger tier a bundle
    /// offers).
    pub(crate) async fn place_model(
        &self,
        want: &Want,
        request: &InferenceRequest,
        account: Address,
        now_s: u64,
    ) -> Result<Placed> {
        let job = self.job_of(want, request, account, now_s).await?;
        self.clear(job, want)
    }

    /// Clears inference job `job` (for `want`) at its tier, else at a stronger one.
    pub(crate) fn clear(&self, mut job: Job, want: &Want) -> Result<Placed> {
        // T2 is Freivalds' check of a product: no inference is verified at it, so an inference
        // asking T2 is cleared at the next stronger tier.
        if job.tier == Tier::T2 {
            job.tier = Tier::T3;
        }
        self.clear_placed(job, want, &[Tier::T1, Tier::T3])
    }

    /// The job a want describes, checked (a request with something to generate, bounded, a
    /// deadline ahead) and with its adapter's size from the store (an id the store lacks is
    /// refused): what clearing takes.
    pub(crate) async fn job_of(
        &self,
        want: &Want,
        request: &InferenceRequest,
        account: Address,
        now_s: u64,
    ) -> Result<Job> {
        self.checked(want, request, now_s)?;
        // The adapter's size is |a| of the feasibility test; an id the store lacks is refused.
        let adapter = match want.adapter_id {
            None => None,
            Some(id) => {
                let id = hex::encode(id);
                let bytes = self
                    .books()
                    .adapter_bytes(&id)
                    .await?
                    .ok_or(Error::UnknownAdapter)?;
                Some((id, bytes))
            }
        };
        let mut job = self.job(want, request, account, now_s)?;
        if let Some((id, bytes)) = adapter {
            job.adapter = Some(id);
            job.adapter_bytes = bytes;
        }
        job.prefix = continued_prefix(&job, request);
        Ok(job)
    }

    /// Refuses a request with nothing to generate, past [`MAX_PROMPT_BYTES`] or malformed, and
    /// a deadline that is not ahead.
    fn checked(&self, want: &Want, request: &InferenceRequest, now_s: u64) -> Result<()> {
        if request.max_tokens == 0 {
            return Err(Error::ZeroMaxTokens);
        }
        if request.input_bytes() > MAX_PROMPT_BYTES {
            return Err(Error::PromptTooLong {
                limit_bytes: MAX_PROMPT_BYTES,
            });
        }
        request.check()?;
        want.check_deadline(now_s)?;
        Ok(())
    }

    /// The job a want describes: the model's shape from the catalog, the context from the
    /// request, the deadline from now.
    fn job(
        &self,
        want: &Want,
        request: &InferenceRequest,
        account: Address,
        now_s: u64,
    ) -> Result<Job> {
        let model = self
            .market()
            .catalog()
            .resolve(&want.model)
            .map_err(|_| Error::UnknownModel(want.model.clone()))?;
        let shape = model
            .shape
            .ok_or_else(|| Error::NotClearable(model.name.clone()))?;
        let context_tokens = estimate_tokens(&request.text())
            .checked_add(request.max_tokens)
            .ok_or(Error::ContextTooLarge)?;
        let kv_bytes = shape
            .kv_bytes_per_token
            .checked_mul(u64::from(context_tokens))
            .ok_or(Error::ContextTooLarge)?;
        Ok(Job {
            agent: account.to_string(),
            base_model: model.name.clone(),
            adapter: None,
            base_bytes: shape.base_bytes,
            adapter_bytes: 0,
            kv_bytes,
            context_tokens,
            // `place` made sure the deadline is after now.
            deadline_s: (want.deadline_s - now_s) as f64,
            determinism: want.determinism,
            tier: want.min_tier,
            compute_flops: 2.0 * shape.parameters as f64 * f64::from(context_tokens),
            value_wei: want.max_price_wei,
            max_price_wei: Some(want.max_price_wei),
            prefix: None,
        })
    }
}

/// The conversation prefix a chat-shaped request continues (SPEC §4), as the provider that
/// served its last turn holds it ([`cx_protocol::prefix`]): the id, and the prefill work of the
/// prefix at the catalog's `2 · parameters` FLOPs per (estimated) token, the rate `job` is
/// priced at. `None` for a first turn or a plain prompt.
fn continued_prefix(job: &Job, request: &InferenceRequest) -> Option<cx_protocol::PrefixNeed> {
    // A chat's prefix is named over its messages in the protocol's role-tagged form, whatever
    // template the provider renders them with: both sides compute it from the messages alone.
    let text = request.text();
    let transcript = cx_protocol::prefix::continued_transcript(&text)?;
    let per_token = job.compute_flops / f64::from(job.context_tokens.max(1));
    let tokens = cx_exchange::routing::features::estimate_tokens(transcript);
    Some(cx_protocol::PrefixNeed {
        id: cx_protocol::prefix::prefix_id(&job.base_model, job.adapter.as_deref(), transcript),
        flops: (per_token * f64::from(tokens)).min(job.compute_flops),
    })
}
