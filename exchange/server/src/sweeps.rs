//! The sweeps beside the API, every [`SWEEP_PERIOD`]: jobs past their deadline expired and
//! their holds returned, reserves awarded and unclaimed ones released, running rents observed,
//! standing orders that ended unfilled released, silent and unstaked providers' bundles taken
//! out of the engine ([`leave`], which re-clears their jobs), the live load read (every bundle's
//! queue for t̂, every market's load for the market maker), and the market maker's quotes
//! sampled. Each runs once per tick on the books as they are; a failed one is logged and runs
//! again at the next tick.

use std::time::Duration;

/// How often the sweeps run: a job's hold returns at most this long after its deadline.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// Runs, every [`SWEEP_PERIOD`], until the task is dropped: expires the jobs whose deadline
/// passed with no result (their holds return to their tabs and sessions; nothing is charged)
/// and wakes their waiters; observes the residency of every running rent; returns the holds of
/// standing orders that ended unfilled (or whose provider never claimed them); takes the
/// bundles of providers silent for [`crate::intake::PROVIDER_SILENCE_S`] (or the intake's own setting) out of
/// the engine, re-clearing their jobs; reads the open work from the books — each bundle's queue
/// goes to the engine (t̂ counts it), each market's load to the market maker (its regime and
/// price follow, [`crate::market::Market::observe_load`]); meters the routed jobs that ended
/// and teaches the task router ([`crate::task_router::TaskRouter::learn`]); stores the tenants'
/// preferences that changed; and samples the market maker's quotes every
/// [`QUOTE_SAMPLE_TICKS`] (the explorer's price history). A failed sweep is logged and retried
/// at the next tick.
pub async fn run_sweeps(intake: &crate::intake::Intake) {
    let mut tick = tokio::time::interval(SWEEP_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 1;
    loop {
        tick.tick().await;
        let now = crate::intake::now_s();
        let books = intake.books();
        match books.expire_due(now).await {
            Ok(expired) => {
                for id in expired {
                    tracing::info!(job = %id, "expired: no result by the deadline; hold released");
                    intake.waiters().notify(id);
                }
            }
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "deadline sweep failed"),
        }
        match intake.award_reserves(now).await {
            Ok(awarded) => {
                for (id, winner) in awarded {
                    match winner {
                        Some(bundle) => tracing::info!(reserve = %id, %bundle, "reserve committed"),
                        None => {
                            tracing::info!(reserve = %id, "reserve had no feasible bid; hold released")
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "reserve award sweep failed"),
        }
        match books
            .expire_unclaimed(now, intake.reserve_claim_grace_s())
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(reserves = n, "take-or-pay unclaimed; holds released"),
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "reserve claim sweep failed"),
        }
        if let Err(err) = intake.observe_rents(now).await {
            tracing::warn!(error = %format!("{err:#}"), "rent residency sweep failed");
        }
        match books.expire_standing(now).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(orders = n, "standing orders ended unfilled; holds released"),
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "standing-order sweep failed"),
        }
        let silent = match books.silent_bundles(now, intake.provider_silence_s()).await {
            Ok(ids) => leave(intake, &ids, now).await,
            Err(err) => Err(err),
        };
        log_left(silent, "providers went silent");
        let observed = match books.open_work().await {
            Ok(open) => intake.market().observe_load(&open, now),
            Err(err) => Err(err),
        };
        if let Err(err) = observed {
            tracing::warn!(error = %format!("{err:#}"), "load sweep failed");
        }
        if let Err(err) = intake.router().learn(books).await {
            // The ended jobs stay in the books: the next pass meters them.
            tracing::warn!(error = %format!("{err:#}"), "metering the routed jobs failed");
        }
        let changed = intake.market().changed_preferences();
        if !changed.is_empty()
            && let Err(err) = books.save_tenant_preferences(&changed).await
        {
            // Kept in memory; written again at the tenant's next market order.
            tracing::warn!(error = %format!("{err:#}"), "tenant preferences not stored");
        }
        if ticks.is_multiple_of(STAKE_SWEEP_TICKS) && !intake.registries().is_empty() {
            let unstaked = match unstaked_bundles(intake).await {
                Ok(ids) => leave(intake, &ids, now).await,
                Err(err) => Err(err),
            };
            log_left(unstaked, "stake fell short");
        }
        if ticks.is_multiple_of(QUOTE_SAMPLE_TICKS) {
            let sampled = match intake.market().quotes() {
                Ok(quotes) => books.record_quotes(&quotes).await,
                Err(err) => Err(err),
            };
            if let Err(err) = sampled {
                tracing::warn!(error = %format!("{err:#}"), "quote sample failed");
            }
        }
        ticks = ticks.wrapping_add(1);
        intake.waiters().prune();
    }
}

/// What [`leave`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Left {
    /// Bundles that left the engine now.
    pub bundles: usize,
    /// Their unfinished jobs moved to another bundle.
    pub moved: usize,
    /// Their unfinished jobs refunded (no bundle could take them by their deadline).
    pub refunded: usize,
}

fn log_left(left: crate::Result<Left>, why: &str) {
    match left {
        Ok(Left {
            bundles: 0,
            moved: 0,
            refunded: 0,
        }) => {}
        Ok(l) => tracing::info!(
            bundles = l.bundles,
            moved = l.moved,
            refunded = l.refunded,
            "{why}: bundles left the engine"
        ),
        Err(err) => tracing::warn!(error = %format!("{err:#}"), "{why}: sweep failed"),
    }
}

/// Takes bundles `ids` out of the engine and re-clears their unfinished jobs at `now_s` onto
/// the bundles left (SPEC §8: a provider that stops reporting leaves; its accepted jobs are
/// re-cleared if their deadline still allows, else refunded).
pub async fn leave(
    intake: &crate::intake::Intake,
    ids: &[String],
    now_s: u64,
) -> crate::Result<Left> {
    let mut left = Left {
        bundles: intake.market().drop_bundles(ids)?,
        ..Left::default()
    };
    if ids.is_empty() {
        return Ok(left);
    }
    for job in intake.books().stranded_jobs(ids).await? {
        match intake.reclear(&job, now_s).await? {
            Some(to) => {
                tracing::info!(job = %job.id, from = %job.bundle_id, %to, "re-cleared");
                left.moved += 1;
            }
            None => {
                tracing::info!(job = %job.id, from = %job.bundle_id, "refunded: no bundle left");
                left.refunded += 1;
            }
        }
    }
    Ok(left)
}

/// Sweeps between two samples of the market maker's quotes (the explorer's price history).
const QUOTE_SAMPLE_TICKS: u64 = 5;

/// Sweeps between two stake checks of every admitted provider.
const STAKE_SWEEP_TICKS: u64 = 30;

/// The bundles of providers no longer staked (or registered under another key) on some chain.
async fn unstaked_bundles(intake: &crate::intake::Intake) -> crate::Result<Vec<String>> {
    let mut out = Vec::new();
    for (key_hash, payout, bundles) in intake.books().provider_bundles().await? {
        match intake.registries().check(payout, key_hash).await {
            Ok(()) => {}
            Err(crate::Error::NotStaked { chain_id, reason }) => {
                tracing::info!(provider = %key_hash, chain_id, %reason, "provider dropped");
                out.extend(bundles);
            }
            Err(err) => return Err(err),
        }
    }
    Ok(out)
}
