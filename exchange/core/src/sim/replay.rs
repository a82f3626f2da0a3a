//! Replaying a trace through one allocator and one eviction policy.

use super::scenario::{Scenario, capabilities};
use crate::candidate::View;
use crate::feasibility::{completion_s, is_feasible};
use crate::objective::{Weights, terms};
use cx_protocol::inventory::{Discount, EvictionPolicy, Occupant, plan_eviction};
use cx_protocol::{DeterminismClass, Job, Tier};
use serde::Serialize;

/// How a job is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Allocator {
    /// Ours: feasibility first (t̂ counts what must be fetched and the queue), then the SPEC §2
    /// objective.
    ResidencyAware,
    /// Rank by price, take the first bundle with the memory and capabilities, idle if any is
    /// (what SPEC §2 calls wrong, not approximate: it never asks what must be fetched).
    CheapestCapable,
    /// Any bundle with the memory and capabilities (idle if any is), uniformly.
    RandomCapable,
}

/// What one replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The allocator.
    pub allocator: Allocator,
    /// The eviction policy of the providers' caches.
    pub eviction: EvictionPolicy,
    /// Share of arrivals whose result came back by their deadline.
    pub deadline_hit_rate: f64,
    /// Mean price paid per placed job (accelerator time: loads plus compute), whole units of the asset.
    pub mean_cost: f64,
    /// Base models loaded onto a bundle that did not hold them.
    pub cold_base_loads: u64,
    /// Adapters loaded onto a bundle that did not hold them.
    pub cold_adapter_loads: u64,
    /// Arrivals refused up front because no bundle could meet them (counted as misses).
    pub refused: u64,
    /// Mean share of accelerators busy (loading or computing) over the trace.
    pub accelerators_busy: f64,
    /// Deadline hit rate over each tenth of the trace (for the chart).
    pub hit_rate_by_decile: Vec<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Base(usize),
    Adapter(usize),
}

#[derive(Debug, Clone)]
struct Resident {
    item: Item,
    bytes: u64,
    last_used_s: f64,
}

#[derive(Debug, Clone, Default)]
struct State {
    residents: Vec<Resident>,
    busy_until_s: f64,
}

impl State {
    fn holds(&self, item: Item) -> bool {
        self.residents.iter().any(|r| r.item == item)
    }
}

/// Replays `scenario` through `allocator`, providers evicting by `policy`.
pub fn replay(scenario: &Scenario, allocator: Allocator, policy: EvictionPolicy) -> Outcome {
    let weights = Weights::default();
    let discount = Discount::default();
    let (classes, tiers) = capabilities();
    let mut states: Vec<State> = scenario
        .bundles
        .iter()
        .map(|b| State {
            residents: b
                .initial_base
                .map(|m| Resident {
                    item: Item::Base(m),
                    bytes: scenario.models[m].bytes,
                    last_used_s: 0.0,
                })
                .into_iter()
                .collect(),
            busy_until_s: 0.0,
        })
        .collect();
    let mut by_price: Vec<usize> = (0..scenario.bundles.len()).collect();
    by_price.sort_by(|a, b| {
        scenario.bundles[*a]
            .price_wei_per_s
            .cmp(&scenario.bundles[*b].price_wei_per_s)
    });
    let mut model_demand = vec![0u64; scenario.models.len()];
    let mut agent_demand = vec![0u64; scenario.agents.len()];
    let mut out = Tally::default();
    let decile = scenario.arrivals.len().div_ceil(10).max(1);
    let mut deciles = [(0u64, 0u64); 10];

    for (n, arrival) in scenario.arrivals.iter().enumerate() {
        let now = arrival.at_s;
        let agent = &scenario.agents[arrival.agent];
        let model = &scenario.models[agent.model];
        model_demand[agent.model] += 1;
        agent_demand[arrival.agent] += 1;
        let job = Job {
            agent: format!("agent-{}", arrival.agent),
            base_model: model.id.clone(),
            adapter: Some(format!("adapter-{}", arrival.agent)),
            base_bytes: model.bytes,
            adapter_bytes: agent.adapter_bytes,
            // ~120 000 weight bytes per byte of KV per token across these models.
            kv_bytes: model.bytes / 120_000 * u64::from(arrival.tokens),
            context_tokens: arrival.tokens,
            deadline_s: arrival.deadline_s,
            determinism: DeterminismClass::S,
            tier: Tier::T1,
            compute_flops: 2.0 * model.params * f64::from(arrival.tokens),
            value_wei: 0,
            max_price_wei: None,
            prefix: None,
        };
        let base_item = Item::Base(agent.model);
        let adapter_item = Item::Adapter(arrival.agent);
        let view = |i: usize| {
            let b = &scenario.bundles[i];
            let s = &states[i];
            let beta = s.holds(base_item);
            let alpha = s.holds(adapter_item);
            // Everything not used by this job is evictable, so it counts as available.
            let in_use =
                if beta { job.base_bytes } else { 0 } + if alpha { job.adapter_bytes } else { 0 };
            View {
                price_wei_per_s: b.price_wei_per_s,
                memory_bytes: b.memory_bytes - in_use,
                bandwidth_bps: b.bandwidth_bps,
                base_resident: beta,
                // The simulated fleet can fetch every base, over its link.
                base_fetchable: true,
                base_load_bps: b.bandwidth_bps,
                adapter_resident: alpha,
                // Waiting for the bundle to free up is time before the job starts.
                prefix_resident: false,
                rtt_s: b.rtt_s + (s.busy_until_s - now).max(0.0),
                compute_s: job.compute_flops / b.flops_per_s,
                queue_s: 0.0,
                context_max: 32_768,
                determinism: classes,
                tiers,
                failure_rate: b.failure_rate,
            }
        };
        // The baselines are not naive about queues: among capable bundles they prefer idle
        // ones, and only wait when every capable bundle is busy. What they ignore is residency.
        let fits = |i: usize| {
            job.base_bytes + job.adapter_bytes + job.kv_bytes <= scenario.bundles[i].memory_bytes
        };
        let idle = |i: usize| states[i].busy_until_s <= now;
        let any_idle = (0..scenario.bundles.len()).any(|i| fits(i) && idle(i));
        let capable = |i: usize| fits(i) && (idle(i) || !any_idle);
        let chosen = match allocator {
            Allocator::ResidencyAware => (0..scenario.bundles.len())
                .filter_map(|i| {
                    let v = view(i);
                    let t = completion_s(&job, &v);
                    is_feasible(&job, &v, t).then(|| (terms(&job, &v, &weights, t).total, i))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .map(|(_, i)| i),
            Allocator::CheapestCapable => by_price.iter().copied().find(|i| capable(*i)),
            Allocator::RandomCapable => {
                let all: Vec<usize> = (0..scenario.bundles.len())
                    .filter(|i| capable(*i))
                    .collect();
                (!all.is_empty())
                    .then(|| all[((arrival.pick * all.len() as f64) as usize).min(all.len() - 1)])
            }
        };
        let hit = match chosen {
            None => {
                out.refused += 1;
                false
            }
            Some(i) => {
                let b = &scenario.bundles[i];
                let v = view(i);
                let load_bits = if v.base_resident {
                    0.0
                } else {
                    job.base_bytes as f64 * 8.0
                } + if v.adapter_resident {
                    0.0
                } else {
                    job.adapter_bytes as f64 * 8.0
                };
                let load_s = load_bits / b.bandwidth_bps;
                let compute_s = v.compute_s * arrival.compute_noise;
                let start = now.max(states[i].busy_until_s);
                let completion = (start - now) + b.rtt_s + load_s + compute_s;
                out.cost += v.price_units_per_s() * (load_s + compute_s);
                out.busy_s += load_s + compute_s;
                out.placed += 1;
                out.cold_base += u64::from(!v.base_resident);
                out.cold_adapter += u64::from(!v.adapter_resident);
                let values = Demand {
                    now,
                    model: &model_demand,
                    agent: &agent_demand,
                    states: &states,
                };
                let evicted = make_room(
                    &states[i],
                    &job,
                    base_item,
                    adapter_item,
                    b,
                    policy,
                    discount,
                    &values,
                );
                let s = &mut states[i];
                let mut k = 0;
                s.residents.retain(|_| {
                    k += 1;
                    !evicted.contains(&(k - 1))
                });
                for (item, bytes) in [
                    (base_item, job.base_bytes),
                    (adapter_item, job.adapter_bytes),
                ] {
                    match s.residents.iter_mut().find(|r| r.item == item) {
                        Some(r) => r.last_used_s = now,
                        None => s.residents.push(Resident {
                            item,
                            bytes,
                            last_used_s: now,
                        }),
                    }
                }
                s.busy_until_s = start + load_s + compute_s;
                completion <= arrival.deadline_s
            }
        };
        out.hits += u64::from(hit);
        let d = &mut deciles[(n / decile).min(9)];
        d.0 += u64::from(hit);
        d.1 += 1;
    }
    let horizon = scenario
        .arrivals
        .last()
        .map_or(1.0, |a| a.at_s)
        .max(states.iter().map(|s| s.busy_until_s).fold(0.0, f64::max));
    let jobs = scenario.arrivals.len().max(1) as f64;
    Outcome {
        allocator,
        eviction: policy,
        deadline_hit_rate: out.hits as f64 / jobs,
        mean_cost: out.cost / out.placed.max(1) as f64,
        cold_base_loads: out.cold_base,
        cold_adapter_loads: out.cold_adapter,
        refused: out.refused,
        accelerators_busy: out.busy_s / (horizon * scenario.bundles.len() as f64),
        hit_rate_by_decile: deciles
            .iter()
            .map(|(h, n)| if *n == 0 { 0.0 } else { *h as f64 / *n as f64 })
            .collect(),
    }
}

#[derive(Debug, Default)]
struct Tally {
    hits: u64,
    placed: u64,
    refused: u64,
    cost: f64,
    busy_s: f64,
    cold_base: u64,
    cold_adapter: u64,
}

/// What the exchange has seen of demand, from which providers value their residents.
struct Demand<'a> {
    now: f64,
    model: &'a [u64],
    agent: &'a [u64],
    states: &'a [State],
}

impl Demand<'_> {
    /// Hit rate one copy of `item` can expect: its arrival rate shared among the copies.
    fn rate_per_copy(&self, item: Item) -> f64 {
        let arrivals = match item {
            Item::Base(m) => self.model[m],
            Item::Adapter(a) => self.agent[a],
        };
        let copies = self.states.iter().filter(|s| s.holds(item)).count().max(1);
        arrivals as f64 / self.now.max(1.0) / copies as f64
    }
}

/// Indices of the residents to evict so the job's loads and KV cache fit.
#[allow(clippy::too_many_arguments)]
fn make_room(
    state: &State,
    job: &Job,
    base: Item,
    adapter: Item,
    bundle: &super::scenario::SimBundle,
    policy: EvictionPolicy,
    discount: Discount,
    demand: &Demand<'_>,
) -> Vec<usize> {
    let occupants: Vec<Occupant> = state
        .residents
        .iter()
        .map(|r| Occupant {
            id: String::new(),
            bytes: r.bytes,
            hit_rate_per_s: demand.rate_per_copy(r.item),
            // A hit saves reloading the bytes over this bundle's link, at its price.
            saving_per_hit: r.bytes as f64 * 8.0 / bundle.bandwidth_bps
                * cx_protocol::price::to_units(bundle.price_wei_per_s),
            // What this job runs on cannot be evicted to make room for it.
            pinned: r.item == base || r.item == adapter,
            last_used_s: r.last_used_s,
        })
        .collect();
    // First the adapter cache's own byte budget (the provider's residency cache), then the
    // device's memory for whatever must be loaded plus the KV cache.
    let is_adapter = |i: &usize| matches!(state.residents[*i].item, Item::Adapter(_));
    let adapter_bytes: u64 = (0..occupants.len())
        .filter(is_adapter)
        .map(|i| occupants[i].bytes)
        .sum();
    let mut evicted = Vec::new();
    if !state.holds(adapter) {
        let adapters: Vec<usize> = (0..occupants.len()).filter(is_adapter).collect();
        let subset: Vec<Occupant> = adapters.iter().map(|i| occupants[*i].clone()).collect();
        let free = bundle.adapter_budget_bytes.saturating_sub(adapter_bytes);
        if let Ok(plan) = plan_eviction(&subset, free, job.adapter_bytes, policy, discount) {
            evicted.extend(plan.into_iter().map(|k| adapters[k]));
        }
    }
    let used: u64 = (0..occupants.len())
        .filter(|i| !evicted.contains(i))
        .map(|i| occupants[i].bytes)
        .sum();
    let free = bundle.memory_bytes.saturating_sub(used);
    let needed = if state.holds(base) { 0 } else { job.base_bytes }
        + if state.holds(adapter) {
            0
        } else {
            job.adapter_bytes
        }
        + job.kv_bytes;
    let rest: Vec<usize> = (0..occupants.len())
        .filter(|i| !evicted.contains(i))
        .collect();
    let subset: Vec<Occupant> = rest.iter().map(|i| occupants[*i].clone()).collect();
    // Capability checks guarantee the job fits once everything else is gone.
    if let Ok(plan) = plan_eviction(&subset, free, needed, policy, discount) {
        evicted.extend(plan.into_iter().map(|k| rest[k]));
    }
    evicted
}
