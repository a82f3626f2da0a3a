//! The in-memory matching engine: live bundles indexed so that clearing a job does not scan the
//! fleet, with results equal to a brute-force argmin over every bundle.
//!
//! Three indexes, each a list ordered by the bundle's key — its ask per FLOP plus a fixed weight
//! × its seconds per FLOP ([`crate::objective::index_key`]): what its static numbers bound the
//! cost from below by:
//! - bundles holding a given **adapter** (α = 1),
//! - bundles holding a given **base** model (β = 1),
//! - every bundle by **capability** (the classes and tiers it offers).
//!
//! A clear walks them in that order. A bundle's cost is at least
//! `μ1·(1−β) + μ2·(1−α) + min(a, b/c)·key` ([`LowerBound`]: the compute with its verification
//! and the latency and deadline risk of t_compute, taken at its least, as if the bundle held the
//! job's conversation prefix, so the bound holds for holders and non-holders alike; every other
//! term is ≥ 0), and along a list that bound only grows, so each walk stops at the first bundle
//! whose bound exceeds the best cost found so far. Because μ1 ≫ μ2 ≫ the price terms, walks over the cold lists usually
//! stop at once: this is branch and bound, exact by construction, not a heuristic. A bundle whose
//! ask is above the price ceiling (the market's quote, the buyer's maximum) is skipped, which
//! cannot invalidate a bound.

use crate::candidate::{Candidate, View};
use crate::clearing::{self, Decision, rank};
use crate::error::{Error, Result};
use crate::feasibility::{PriceCeiling, completion_s, is_feasible, price_ceiling, price_eligible};
use crate::objective::{LowerBound, Terms, Weights, compute_flops_on, index_key, terms};
use crate::pricing::market::Quote;
use crate::ring::{affinity_distance, hash64};
use cx_protocol::{Bundle, ClassSet, Job, TierSet};
use std::collections::HashMap;

type Slot = u32;
/// Bundles ordered by (index key as ordered bits, slot): a sorted Vec, because clears walk
/// and probe these lists far more often than bundles come and go.
type Ordered = Vec<(u64, Slot)>;

/// The engine's answer for one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The chosen bundle.
    pub bundle_id: String,
    /// Its cost terms.
    pub terms: Terms,
}

#[derive(Debug, Clone)]
struct Entry {
    bundle: Bundle,
    bases: Vec<u32>,
    /// The bases it can load (interned); `None`: any.
    fetchable: Option<Vec<u32>>,
    adapters: Vec<u32>,
    /// Its index key as ordered bits (non-negative f64 bits sort like the numbers).
    key: u64,
}

impl Entry {
    /// Whether it can load base `base` (interned; `None`: a name no bundle mentions, which a
    /// bundle that loads any base can still fetch).
    fn can_fetch(&self, base: Option<u32>) -> bool {
        match (&self.fetchable, base) {
            (None, _) => true,
            (Some(list), Some(m)) => list.contains(&m),
            (Some(_), None) => false,
        }
    }
}

/// What a clear reads of a bundle, packed apart from its strings and lists into one cache line
/// (64 bytes, aligned), so that walking a few hundred candidates costs one miss each: the
/// job-independent part of its [`View`] (residency and t_compute are filled in per job) and the
/// throughput that gives t_compute. A clear reads the bundle's cold [`Entry`] only when the job
/// needs it — a prefix to look up, a bundle that loads only some bases, a base to load at a rate
/// other than B, an exact tie: the profile of `cx bench clearing` had a third of a clear waiting
/// on that second miss per bundle.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Hot {
    price_wei_per_s: u64,
    memory_bytes: u64,
    bandwidth_bps: f64,
    rtt_s: f64,
    queue_s: f64,
    failure_rate: f64,
    flops_per_s: f64,
    context_max: u32,
    determinism: ClassSet,
    tiers: TierSet,
    /// It names no list of bases it can load: it loads any.
    fetches_any: bool,
    /// It loads a base at its bandwidth B (it reports no other rate).
    loads_at_bandwidth: bool,
}

const _: () = assert!(std::mem::size_of::<Hot>() == 64);

impl Hot {
    fn of(b: &Bundle) -> Self {
        Self {
            price_wei_per_s: b.price_wei_per_s,
            memory_bytes: b.memory_bytes,
            bandwidth_bps: b.bandwidth_bps,
            rtt_s: b.rtt_s,
            queue_s: 0.0,
            failure_rate: b.failure_rate,
            flops_per_s: b.flops_per_s,
            context_max: b.context_max,
            determinism: b.determinism,
            tiers: b.tiers,
            fetches_any: b.fetchable_bases.is_none(),
            loads_at_bandwidth: b.base_load_bps.is_none_or(|r| r == b.bandwidth_bps),
        }
    }
}

/// The matching engine. Not thread-safe by itself: one writer per market shard.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    weights: Weights,
    slots: Vec<Option<Entry>>,
    hot: Vec<Hot>,
    free_slots: Vec<Slot>,
    by_id: HashMap<String, Slot>,
    names: HashMap<String, u32>,
    by_base: HashMap<u32, Ordered>,
    by_adapter: HashMap<u32, Ordered>,
    by_capability: HashMap<(u8, u8), Ordered>,
}

/// A walk's view of another index list: whether that list holds the walked item. Both lists
/// ascend by (key, slot) and a walk's items only grow, so the cursor moves forward with the
/// walk: a test is a compare or two, not a binary search with a cache miss at each probe.
struct Cursor<'a> {
    rest: &'a [(u64, Slot)],
}

impl<'a> Cursor<'a> {
    fn new(list: Option<&'a Ordered>) -> Self {
        Self {
            rest: list.map_or(&[][..], Vec::as_slice),
        }
    }

    /// Whether the list holds `item`; a later call must ask for a larger item (calls may be
    /// skipped: the cursor jumps).
    fn holds(&mut self, item: (u64, Slot)) -> bool {
        // A few steps forward first (dense lists move by one or two), then a binary search
        // over what is left (a sparse walk may jump far).
        for _ in 0..4 {
            match self.rest.first() {
                Some(&x) if x < item => self.rest = &self.rest[1..],
                Some(&x) => return x == item,
                None => return false,
            }
        }
        let skip = self.rest.partition_point(|&x| x < item);
        self.rest = &self.rest[skip..];
        self.rest.first() == Some(&item)
    }
}

/// What one clear carries through its walks.
struct Probe<'a> {
    job: &'a Job,
    /// The job's base, interned (`None`: no bundle named it yet).
    base: Option<u32>,
    key_hash: u64,
    /// The price gates (quote, buyer's limit).
    ceiling: PriceCeiling,
    /// The cost bound of the walks.
    bound: LowerBound,
}

struct Best {
    slot: Slot,
    terms: Terms,
    distance: Option<u64>,
}

impl Engine {
    /// An empty engine with the given objective weights.
    pub fn new(weights: Weights) -> Result<Self> {
        weights.validate()?;
        Ok(Self {
            weights,
            ..Self::default()
        })
    }

    /// The objective weights.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Number of live bundles.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no bundle is live.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// A registered bundle.
    pub fn bundle(&self, id: &str) -> Option<&Bundle> {
        self.by_id
            .get(id)
            .and_then(|s| self.slots[*s as usize].as_ref())
            .map(|e| &e.bundle)
    }

    /// Every live bundle, in slot order.
    pub fn bundles(&self) -> impl Iterator<Item = &Bundle> {
        self.slots.iter().flatten().map(|e| &e.bundle)
    }

    /// Adds a bundle, or replaces the one with the same id. Invalid bundles change nothing.
    pub fn upsert(&mut self, bundle: Bundle) -> Result<()> {
        bundle.validate().map_err(|e| e.within("bundle"))?;
        // The queue is the exchange's count, not the bundle's: a re-offer keeps it.
        let queue_s = self.queue_s(&bundle.id).unwrap_or(0.0);
        if self.by_id.contains_key(&bundle.id) {
            self.remove(&bundle.id)?;
        }
        let bases = bundle
            .resident_bases
            .iter()
            .map(|m| self.intern(m))
            .collect();
        let fetchable = bundle
            .fetchable_bases
            .as_ref()
            .map(|l| l.iter().map(|m| self.intern(m)).collect());
        let adapters = bundle
            .resident_adapters
            .iter()
            .map(|a| self.intern(a))
            .collect();
        let key = index_key(
            cx_protocol::price::to_units(bundle.price_wei_per_s),
            bundle.flops_per_s,
            &self.weights,
        )
        .to_bits();
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.hot.push(Hot::of(&bundle));
                (self.slots.len() - 1) as Slot
            }
        };
        self.hot[slot as usize] = Hot {
            queue_s,
            ..Hot::of(&bundle)
        };
        self.by_id.insert(bundle.id.clone(), slot);
        let entry = Entry {
            bundle,
            bases,
            fetchable,
            adapters,
            key,
        };
        self.index(&entry, slot, true);
        self.slots[slot as usize] = Some(entry);
        Ok(())
    }

    /// Removes a bundle and returns it.
    pub fn remove(&mut self, id: &str) -> Result<Bundle> {
        let slot = self
            .by_id
            .remove(id)
            .ok_or_else(|| Error::UnknownBundle(id.to_owned()))?;
        let entry = self.slots[slot as usize]
            .take()
            .expect("by_id points at live slots");
        self.index(&entry, slot, false);
        self.free_slots.push(slot);
        Ok(entry.bundle)
    }

    /// Records that `model` became resident (or was evicted) on a bundle: β changes.
    pub fn set_base_resident(&mut self, id: &str, model: &str, resident: bool) -> Result<()> {
        self.update(id, |b| toggle(&mut b.resident_bases, model, resident))
    }

    /// Records that `adapter` became resident (or was evicted) on a bundle: α changes.
    pub fn set_adapter_resident(&mut self, id: &str, adapter: &str, resident: bool) -> Result<()> {
        self.update(id, |b| toggle(&mut b.resident_adapters, adapter, resident))
    }

    /// Records a bundle's free memory after loads, evictions or running work.
    pub fn set_free_memory(&mut self, id: &str, memory_bytes: u64) -> Result<()> {
        self.update(id, |b| b.memory_bytes = memory_bytes)
    }

    /// Sets the work queued on bundle `id`, seconds at its throughput (what the exchange assigned
    /// it and has not seen done); t̂ of every later clear counts it. Not finite or negative is
    /// refused.
    pub fn set_queue_s(&mut self, id: &str, queue_s: f64) -> Result<()> {
        if !(queue_s.is_finite() && queue_s >= 0.0) {
            return Err(crate::error::invalid(
                "queue_s",
                format!("must be a finite number >= 0, got {queue_s}"),
            ));
        }
        let slot = *self
            .by_id
            .get(id)
            .ok_or_else(|| Error::UnknownBundle(id.to_owned()))?;
        self.hot[slot as usize].queue_s = queue_s;
        Ok(())
    }

    /// The work queued on bundle `id`, seconds.
    pub fn queue_s(&self, id: &str) -> Option<f64> {
        self.by_id.get(id).map(|s| self.hot[*s as usize].queue_s)
    }

    fn update(&mut self, id: &str, change: impl FnOnce(&mut Bundle)) -> Result<()> {
        let mut bundle = self
            .bundle(id)
            .cloned()
            .ok_or_else(|| Error::UnknownBundle(id.to_owned()))?;
        change(&mut bundle);
        self.upsert(bundle)
    }

    fn intern(&mut self, name: &str) -> u32 {
        let next = self.names.len() as u32;
        *self.names.entry(name.to_owned()).or_insert(next)
    }

    fn index(&mut self, entry: &Entry, slot: Slot, add: bool) {
        let item = (entry.key, slot);
        let apply = |list: &mut Ordered| match (list.binary_search(&item), add) {
            (Err(at), true) => list.insert(at, item),
            (Ok(at), false) => {
                list.remove(at);
            }
            _ => {}
        };
        for m in &entry.bases {
            apply(self.by_base.entry(*m).or_default());
        }
        for a in &entry.adapters {
            apply(self.by_adapter.entry(*a).or_default());
        }
        let capability = (entry.bundle.determinism.bits(), entry.bundle.tiers.bits());
        apply(self.by_capability.entry(capability).or_default());
    }

    /// Clears one job: the feasible bundle of least cost, or `None` when nothing is feasible.
    /// With a market `quote`, bundles asking more than it are not eligible (nor those asking
    /// a charge for the job over its own `max_price_wei`).
    pub fn clear(&self, job: &Job, quote: Option<&Quote>) -> Result<Option<Choice>> {
        job.validate()?;
        let ceiling = price_ceiling(job, quote);
        let base = self.names.get(&job.base_model).copied();
        let base_list = base.and_then(|m| self.by_base.get(&m));
        let adapter_list = job
            .adapter
            .as_ref()
            .and_then(|a| self.names.get(a))
            .and_then(|a| self.by_adapter.get(a));
        let probe = Probe {
            job,
            base,
            key_hash: hash64(job.affinity_key()),
            ceiling,
            bound: LowerBound::new(job, &self.weights),
        };
        let no_adapter_needed = !job.needs_adapter();
        let mut best: Option<Best> = None;

        // α = 1: whatever else they hold, these skip the adapter fetch.
        let mut in_base = Cursor::new(base_list);
        self.walk(&probe, adapter_list, (true, true), &mut best, |item| {
            Some((in_base.holds(item), true))
        });
        // β = 1 and α = 0 (those with α = 1 were just seen).
        let mut in_adapter = Cursor::new(adapter_list);
        self.walk(
            &probe,
            base_list,
            (true, no_adapter_needed),
            &mut best,
            |item| (!in_adapter.holds(item)).then_some((true, false)),
        );
        // β = 0 and α = 0: usually cut at once by the μ1 in the bound — for every list at once
        // when even a free bundle's bound passes the best cost (the bound grows with the price).
        let cold_floor = probe.bound.at(0.0, false, no_adapter_needed);
        if best.as_ref().is_some_and(|b| cold_floor > b.terms.total) {
            return Ok(best.map(|b| self.choice(b)));
        }
        for ((classes, tiers), list) in &self.by_capability {
            let offers_class = classes & (1 << job.determinism as u8) != 0;
            let offers_tier = tiers & (1 << job.tier as u8) != 0;
            if offers_class && offers_tier {
                let (mut in_base, mut in_adapter) =
                    (Cursor::new(base_list), Cursor::new(adapter_list));
                self.walk(
                    &probe,
                    Some(list),
                    (false, no_adapter_needed),
                    &mut best,
                    |item| {
                        (!in_base.holds(item) && !in_adapter.holds(item)).then_some((false, false))
                    },
                );
            }
        }
        Ok(best.map(|b| self.choice(b)))
    }

    /// Walks one ordered list until the lower bound passes the best cost. `bound_residency` is
    /// the (β, α-or-not-needed) the bound may assume for every member of the list; `residency`
    /// gives a member's (β, α), or `None` to skip a bundle an earlier walk already evaluated; it
    /// is asked about the members in order, each once, until the walk stops.
    fn walk(
        &self,
        probe: &Probe<'_>,
        list: Option<&Ordered>,
        bound_residency: (bool, bool),
        best: &mut Option<Best>,
        mut residency: impl FnMut((u64, Slot)) -> Option<(bool, bool)>,
    ) {
        let items = list.map_or(&[][..], Vec::as_slice);
        for (i, &(key, slot)) in items.iter().enumerate() {
            if let Some(b) = best {
                let bound =
                    probe
                        .bound
                        .at(f64::from_bits(key), bound_residency.0, bound_residency.1);
                if bound > b.terms.total {
                    break;
                }
            }
            // The walk goes on, and its next bundles are known: their lines load while this
            // one is judged.
            if let Some(&(_, ahead)) = items.get(i + PREFETCH_AHEAD) {
                prefetch(&self.hot[ahead as usize]);
            }
            if let Some((beta, alpha)) = residency((key, slot))
                && !self.cut(probe, key, slot, (beta, alpha), best.as_ref())
            {
                self.consider(probe, slot, beta, alpha, best);
            }
        }
    }

    /// Bundle `slot` as `job` sees it, with (β, α) given; `base` is the job's base, interned.
    /// The cold entry is read only where the job needs it (see [`Hot`]); a resident base's load
    /// rate is not (t̂ does not read it), so such a view says B.
    #[inline(always)]
    fn view(&self, slot: Slot, job: &Job, base: Option<u32>, beta: bool, alpha: bool) -> View {
        let hot = &self.hot[slot as usize];
        let prefix_resident = job.prefix.is_some() && holds_prefix(&self.entry(slot).bundle, job);
        let base_load_bps = if hot.loads_at_bandwidth || beta {
            hot.bandwidth_bps
        } else {
            self.entry(slot)
                .bundle
                .base_load_bps
                .unwrap_or(hot.bandwidth_bps)
        };
        View {
            price_wei_per_s: hot.price_wei_per_s,
            memory_bytes: hot.memory_bytes,
            bandwidth_bps: hot.bandwidth_bps,
            base_resident: beta,
            base_fetchable: hot.fetches_any || self.entry(slot).can_fetch(base),
            base_load_bps,
            adapter_resident: alpha,
            prefix_resident,
            rtt_s: hot.rtt_s,
            compute_s: compute_flops_on(job, prefix_resident) / hot.flops_per_s,
            queue_s: hot.queue_s,
            context_max: hot.context_max,
            determinism: hot.determinism,
            tiers: hot.tiers,
            failure_rate: hot.failure_rate,
        }
    }

    /// Whether bundle `slot` (index key bits `key`, residency (β, α)) cannot beat `best` by its
    /// own bound ([`LowerBound::at_bundle`]): cut before its t̂ and terms are computed.
    fn cut(
        &self,
        probe: &Probe<'_>,
        key: u64,
        slot: Slot,
        (beta, alpha): (bool, bool),
        best: Option<&Best>,
    ) -> bool {
        best.is_some_and(|b| {
            let hot = &self.hot[slot as usize];
            let residency = (beta, alpha || !probe.job.needs_adapter());
            let bound = probe.bound.at_bundle(
                f64::from_bits(key),
                residency,
                hot.rtt_s + hot.queue_s,
                hot.failure_rate,
            );
            bound > b.terms.total
        })
    }

    fn consider(
        &self,
        probe: &Probe<'_>,
        slot: Slot,
        beta: bool,
        alpha: bool,
        best: &mut Option<Best>,
    ) {
        let job = probe.job;
        let view = self.view(slot, job, probe.base, beta, alpha);
        if !price_eligible(&view, &probe.ceiling) {
            return;
        }
        let t_hat = completion_s(job, &view);
        if !is_feasible(job, &view, t_hat) {
            return;
        }
        let cost = terms(job, &view, &self.weights, t_hat);
        let key_hash = probe.key_hash;
        let better = match best {
            None => true,
            Some(b) if cost.total < b.terms.total => true,
            Some(b) if cost.total > b.terms.total => false,
            Some(b) => {
                // An exact tie: consistent hashing decides, computed only now.
                let incumbent = &self.entry(b.slot).bundle.id;
                let d_best = *b
                    .distance
                    .get_or_insert_with(|| affinity_distance(key_hash, incumbent));
                let id = &self.entry(slot).bundle.id;
                let d = affinity_distance(key_hash, id);
                rank((cost.total, d, id), (b.terms.total, d_best, incumbent)).is_lt()
            }
        };
        if better {
            *best = Some(Best {
                slot,
                terms: cost,
                distance: None,
            });
        }
    }

    fn choice(&self, best: Best) -> Choice {
        Choice {
            bundle_id: self.entry(best.slot).bundle.id.clone(),
            terms: best.terms,
        }
    }

    fn entry(&self, slot: Slot) -> &Entry {
        self.slots[slot as usize]
            .as_ref()
            .expect("indexes point at live slots")
    }

    /// Every live bundle with the job's (β, α), in slot order.
    fn residency<'a>(
        &'a self,
        job: &'a Job,
    ) -> impl Iterator<Item = (Slot, &'a Entry, bool, bool)> + 'a {
        let base = self.names.get(&job.base_model).copied();
        let adapter = job
            .adapter
            .as_ref()
            .and_then(|a| self.names.get(a))
            .copied();
        self.slots.iter().enumerate().filter_map(move |(slot, e)| {
            let e = e.as_ref()?;
            let beta = base.is_some_and(|m| e.bases.contains(&m));
            let alpha = adapter.is_some_and(|a| e.adapters.contains(&a));
            Some((slot as Slot, e, beta, alpha))
        })
    }

    /// Clears by evaluating every bundle (no index): the baseline the benchmark compares with.
    pub fn clear_by_scan(&self, job: &Job, quote: Option<&Quote>) -> Result<Option<Choice>> {
        job.validate()?;
        let probe = Probe {
            job,
            base: self.names.get(&job.base_model).copied(),
            key_hash: hash64(job.affinity_key()),
            ceiling: price_ceiling(job, quote),
            bound: LowerBound::new(job, &self.weights),
        };
        let mut best = None;
        for (slot, _, beta, alpha) in self.residency(job) {
            self.consider(&probe, slot, beta, alpha, &mut best);
        }
        Ok(best.map(|b| self.choice(b)))
    }

    /// Every bundle as this job sees it (β, α, π, t_compute resolved), in registration-slot order.
    pub fn candidates(&self, job: &Job) -> Vec<Candidate> {
        let base = self.names.get(&job.base_model).copied();
        self.residency(job)
            .map(|(slot, e, beta, alpha)| Candidate {
                id: e.bundle.id.clone(),
                view: self.view(slot, job, base, beta, alpha),
            })
            .collect()
    }

    /// The full explanation over every bundle: what a refused buyer is shown.
    pub fn explain(&self, job: &Job, quote: Option<&Quote>) -> Result<Decision> {
        self.explain_with(job, quote, clearing::Policy::ResidencyAware)
    }

    /// [`Engine::explain`], the feasible bundles ranked by `policy`.
    pub fn explain_with(
        &self,
        job: &Job,
        quote: Option<&Quote>,
        policy: clearing::Policy,
    ) -> Result<Decision> {
        job.validate()?;
        Ok(clearing::explain_with(
            job,
            &self.candidates(job),
            &self.weights,
            &price_ceiling(job, quote),
            policy,
        ))
    }

    /// [`clearing::explain_kept`] over the live bundles `accept` takes, under the price gates
    /// `ceiling`: the decision a job keeps, from the engine's own ids and views (nothing is
    /// copied for a bundle that is not kept).
    pub fn explain_kept(
        &self,
        job: &Job,
        ceiling: &PriceCeiling,
        policy: clearing::Policy,
        keep: usize,
        accept: impl Fn(&Bundle) -> bool,
    ) -> Result<Decision> {
        job.validate()?;
        let base = self.names.get(&job.base_model).copied();
        let candidates = self
            .residency(job)
            .filter(|(_, e, _, _)| accept(&e.bundle))
            .map(|(slot, e, beta, alpha)| {
                (
                    e.bundle.id.as_str(),
                    self.view(slot, job, base, beta, alpha),
                )
            });
        Ok(clearing::explain_kept(
            job,
            candidates,
            &self.weights,
            ceiling,
            policy,
            keep,
        ))
    }
}

/// How many members ahead of the one it judges a walk asks the CPU to load: far enough to
/// cover a miss to L3 or memory with the work on the bundles between.
const PREFETCH_AHEAD: usize = 4;

/// A hint that `item`'s cache line is wanted soon.
#[inline(always)]
fn prefetch<T>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and cannot fault, whatever the address
    // (this one is a live reference besides); SSE is in every x86_64.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(item).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

/// π: whether the bundle reports holding the prefix the job continues. Prefix ids are compared
/// as strings, not interned: they churn every turn, and a bundle reports a bounded few.
pub fn holds_prefix(bundle: &Bundle, job: &Job) -> bool {
    job.prefix
        .as_ref()
        .is_some_and(|p| bundle.resident_prefixes.contains(&p.id))
}

fn toggle(list: &mut Vec<String>, name: &str, present: bool) {
    list.retain(|n| n != name);
    if present {
        list.push(name.to_owned());
    }
}
