//! The adapter residency cache: a byte budget in front of the disk (SPEC §4).
//!
//! * A miss loads from disk (the caller does that off the batch thread, then [`insert`]s).
//! * Making room is a knapsack decision: evict the **least expected value per byte** first
//!   ([`EvictionPolicy::ValuePerByte`]), or the least recently used ([`EvictionPolicy::Lru`],
//!   the baseline). Pinned adapters (rent on state) are never evicted, nor adapters that a
//!   running sequence holds.
//! * The **shadow price** of a slot is the expected discounted value given up to make room for
//!   it ([`ResidencyCache::shadow_price`]); a provider reports it.
//!
//! The arithmetic is the one the exchange uses too ([`cx_protocol::inventory`]): an occupant hit
//! at rate `λ` per second, each hit saving `s` (the reload it avoids, in seconds of loading), is
//! worth `λ·s·(1 − e^{−rH})/r` over a horizon `H` at discount rate `r`; density is that over its
//! bytes. This module adds what only a provider knows: use counts, load times, pins and which
//! adapters running sequences hold.
//!
//! * **Reservations** hold bytes that are not adapters but live under the same budget: a
//!   training client's parameters, gradients and optimizer moments, and the activations of a
//!   running `forward_backward` ([`ResidencyCache::reserve`]). They are never evicted; making
//!   room for one evicts adapters like an insert does.
//!
//! * **Held prefixes** are conversations' KV caches kept between turns (SPEC §4): perishable
//!   inventory under the same budget. A finished turn is offered ([`ResidencyCache::offer_prefix`])
//!   and kept one more turn iff `γ·s > h` — γ the probability the conversation continues
//!   ([`ContinuationEstimate`]), s the prefill seconds a hit saves, h the shadow price of the
//!   bytes it would occupy. A kept prefix is worth `γ·s` in the knapsack, beside the adapters, so
//!   making room evicts adapters and prefixes alike by value per byte (pins never); at most
//!   `max_prefixes` are held. A continuation takes its prefix out ([`ResidencyCache::take_prefix`]):
//!   its own finished turn is the longer prefix offered next.
//!
//! Time is passed in (`now_s`, seconds on any monotonic clock), so the cache is pure and its
//! tests need no sleeping.
//!
//! [`insert`]: ResidencyCache::insert

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::lora::Adapter;
use crate::model::KvCache;
pub use cx_protocol::inventory::{Discount, EvictionPolicy};
use cx_protocol::inventory::{
    Occupant, discounted_value, keep_prefix, plan_eviction, shadow_price,
};

/// Tuning of a [`ResidencyCache`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CacheConfig {
    /// Bytes adapters may hold.
    pub budget_bytes: u64,
    /// Eviction rule.
    pub policy: EvictionPolicy,
    /// Discounting of future hits.
    pub discount: Discount,
    /// Time constant of the hit-rate estimate (an exponentially decayed count), seconds.
    pub rate_window_s: f64,
    /// Fixed cost of a load, seconds (file open, parse, checks).
    pub load_overhead_s: f64,
    /// Initial estimate of load throughput, bytes per second (refined by measured loads).
    pub load_bytes_per_s: f64,
    /// Conversation prefixes held at most.
    pub max_prefixes: usize,
}

impl CacheConfig {
    /// Defaults with `budget_bytes` and `policy`.
    pub fn new(budget_bytes: u64, policy: EvictionPolicy) -> Self {
        Self {
            budget_bytes,
            policy,
            discount: Discount::default(),
            rate_window_s: 300.0,
            load_overhead_s: 0.005,
            load_bytes_per_s: 1e9,
            max_prefixes: cx_protocol::prefix::MAX_REPORTED_PREFIXES,
        }
    }
}

/// Usage of an adapter, resident or not (kept across evictions so a returning adapter is
/// valued by its history).
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    /// Exponentially decayed count of uses at `last_s`.
    decayed_uses: f64,
    last_s: f64,
}

impl Usage {
    fn record(&mut self, now_s: f64, window_s: f64) {
        self.decayed_uses =
            self.decayed_uses * (-(now_s - self.last_s).max(0.0) / window_s).exp() + 1.0;
        self.last_s = now_s;
    }
    fn rate_per_s(&self, now_s: f64, window_s: f64) -> f64 {
        self.decayed_uses * (-(now_s - self.last_s).max(0.0) / window_s).exp() / window_s
    }
}

#[derive(Debug)]
struct Entry {
    adapter: Arc<Adapter>,
    pinned: bool,
    in_use: usize,
}

/// A conversation's KV cache held between turns: what [`ResidencyCache::offer_prefix`] takes and
/// [`ResidencyCache::take_prefix`] gives back.
#[derive(Debug, Clone)]
pub struct HeldPrefix {
    /// Its prefix id ([`cx_protocol::prefix::held_prefix_id`]).
    pub id: String,
    /// The adapter (content id) the KV was computed with, if any.
    pub adapter: Option<String>,
    /// The tokens whose keys and values `kv` holds (`kv.len() == tokens.len()`).
    pub tokens: Vec<u32>,
    /// The keys and values.
    pub kv: KvCache,
    /// s: seconds of prefill a hit saves.
    pub saving_s: f64,
}

#[derive(Debug)]
struct PrefixEntry {
    prefix: HeldPrefix,
    bytes: u64,
    /// γ when it was kept: its value is γ·s.
    continuation_probability: f64,
    held_at_s: f64,
    /// Pinned by a rent on state: never evicted, and a continuation takes a copy of it.
    pinned: bool,
}

impl PrefixEntry {
    /// Its expected value, γ·s: one more turn's expected saving.
    fn value(&self) -> f64 {
        self.continuation_probability * self.prefix.saving_s
    }
}

/// γ: the probability that a conversation continues after a turn, estimated from what this
/// provider observed — turns it ended (`ended`) and requests that continued one of them
/// (`continued`) — with a Beta prior of `prior_continued` continuations in `prior_turns`
/// turns: `γ = (continued + prior_continued) / (ended + prior_turns)`. Turns are counted whether
/// or not their prefix was kept, so the estimate does not depend on the keep decisions.
#[derive(Debug, Clone)]
pub struct ContinuationEstimate {
    /// Pseudo-continuations of the prior.
    pub prior_continued: f64,
    /// Pseudo-turns of the prior.
    pub prior_turns: f64,
    ended: u64,
    continued: u64,
    /// Recently ended turns' ids (bounded), which a continuation is matched against.
    recent: VecDeque<String>,
    recent_set: HashSet<String>,
}

/// Ended turns remembered for matching continuations.
const RECENT_TURNS: usize = 4096;

impl Default for ContinuationEstimate {
    fn default() -> Self {
        // A prior of one continuation in two turns: γ = ½ until observations say otherwise.
        Self::new(1.0, 2.0)
    }
}

impl ContinuationEstimate {
    /// An estimate with no observations and the given Beta prior.
    pub fn new(prior_continued: f64, prior_turns: f64) -> Self {
        Self {
            prior_continued,
            prior_turns,
            ended: 0,
            continued: 0,
            recent: VecDeque::new(),
            recent_set: HashSet::new(),
        }
    }

    /// γ now.
    pub fn probability(&self) -> f64 {
        ((self.continued as f64 + self.prior_continued) / (self.ended as f64 + self.prior_turns))
            .clamp(0.0, 1.0)
    }

    /// A turn ended whose conversation state is `id`.
    pub fn turn_ended(&mut self, id: &str) {
        self.ended += 1;
        if self.recent_set.insert(id.to_string()) {
            self.recent.push_back(id.to_string());
            if self.recent.len() > RECENT_TURNS
                && let Some(old) = self.recent.pop_front()
            {
                self.recent_set.remove(&old);
            }
        }
    }

    /// A request arrived continuing the conversation state `id`; counted once per ended turn.
    pub fn request_continues(&mut self, id: &str) {
        if self.recent_set.remove(id) {
            self.recent.retain(|r| r != id);
            self.continued += 1;
        }
    }

    /// (turns ended, of which continued).
    pub fn counts(&self) -> (u64, u64) {
        (self.ended, self.continued)
    }
}

/// What [`ResidencyCache::offer_prefix`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum PrefixDecision {
    /// Kept: `γ·s > h`. The ids evicted to make room (adapters and prefixes), in order.
    Kept {
        /// Adapter ids and `prefix:`-tagged prefix ids evicted.
        evicted: Vec<String>,
    },
    /// Dropped: `γ·s ≤ h` (or no room could be made at any price: `h` is `None`).
    Dropped {
        /// γ·s.
        value: f64,
        /// h.
        holding_cost: Option<f64>,
    },
}

/// One resident adapter as the metrics and `/v1/models` report it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResidentInfo {
    /// Adapter id.
    pub id: String,
    /// Bytes held.
    pub bytes: u64,
    /// Pinned by rent on state.
    pub pinned: bool,
    /// Running sequences holding it.
    pub in_use: usize,
    /// Estimated hits per second.
    pub hit_rate_per_s: f64,
    /// Expected discounted value per byte.
    pub value_per_byte: f64,
}

/// Counters and occupancy, for `/metrics`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CacheStats {
    /// Budget.
    pub budget_bytes: u64,
    /// Bytes held.
    pub resident_bytes: u64,
    /// Adapters held.
    pub resident_adapters: usize,
    /// Lookups that found the adapter resident.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Adapters evicted to make room.
    pub evictions: u64,
    /// Adapters inserted.
    pub loads: u64,
    /// Bytes held by reservations (training clients), within the budget.
    pub reserved_bytes: u64,
    /// Conversation prefixes held.
    pub held_prefixes: usize,
    /// Bytes their KV caches hold, within the budget.
    pub prefix_bytes: u64,
    /// Requests that found their prefix held (a prefill skipped).
    pub prefix_hits: u64,
    /// Finished turns kept as prefixes (`γ·s > h`).
    pub prefixes_kept: u64,
    /// Finished turns dropped (`γ·s ≤ h`).
    pub prefixes_dropped: u64,
    /// Held prefixes evicted to make room, or for a more valuable one.
    pub prefix_evictions: u64,
    /// γ, the continuation probability now.
    pub continuation_probability: f64,
}

/// Adapters held in memory under a byte budget.
#[derive(Debug)]
pub struct ResidencyCache {
    config: CacheConfig,
    entries: HashMap<String, Entry>,
    usage: HashMap<String, Usage>,
    resident_bytes: u64,
    /// Reservation key → bytes.
    reservations: HashMap<String, u64>,
    reserved_bytes: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    loads: u64,
    load_bytes_per_s: f64,
    prefixes: HashMap<String, PrefixEntry>,
    prefix_bytes: u64,
    continuation: ContinuationEstimate,
    prefix_hits: u64,
    prefixes_kept: u64,
    prefixes_dropped: u64,
    prefix_evictions: u64,
}

/// Eviction-plan names of held prefixes (adapter ids are bare content ids).
const PREFIX_TAG: &str = "prefix:";

impl ResidencyCache {
    /// An empty cache.
    pub fn new(config: CacheConfig) -> Self {
        Self {
            load_bytes_per_s: config.load_bytes_per_s,
            config,
            entries: HashMap::new(),
            usage: HashMap::new(),
            resident_bytes: 0,
            reservations: HashMap::new(),
            reserved_bytes: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            loads: 0,
            prefixes: HashMap::new(),
            prefix_bytes: 0,
            continuation: ContinuationEstimate::default(),
            prefix_hits: 0,
            prefixes_kept: 0,
            prefixes_dropped: 0,
            prefix_evictions: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Records a use of `id` at `now_s` and returns the adapter when resident (a hit).
    pub fn lookup(&mut self, id: &str, now_s: f64) -> Option<Arc<Adapter>> {
        self.usage
            .entry(id.to_string())
            .or_default()
            .record(now_s, self.config.rate_window_s);
        match self.entries.get(id) {
            Some(entry) => {
                self.hits += 1;
                Some(entry.adapter.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// The adapter when resident, without counting a use.
    pub fn peek(&self, id: &str) -> Option<Arc<Adapter>> {
        self.entries.get(id).map(|e| e.adapter.clone())
    }

    /// Whether `id` is resident.
    pub fn contains(&self, id: &str) -> bool {
        self.entries.contains_key(id)
    }

    /// A running sequence starts holding `id` (not evictable until [`release`](Self::release)).
    pub fn acquire(&mut self, id: &str) -> Option<Arc<Adapter>> {
        let entry = self.entries.get_mut(id)?;
        entry.in_use += 1;
        Some(entry.adapter.clone())
    }

    /// A running sequence stopped holding `id`.
    pub fn release(&mut self, id: &str) {
        if let Some(entry) = self.entries.get_mut(id) {
            entry.in_use = entry.in_use.saturating_sub(1);
        }
    }

    /// Pins or unpins a resident adapter; false when it is not resident.
    pub fn set_pinned(&mut self, id: &str, pinned: bool) -> bool {
        match self.entries.get_mut(id) {
            Some(entry) => {
                entry.pinned = pinned;
                true
            }
            None => false,
        }
    }

    /// Removes `id` (unload). Running sequences keep their `Arc` until they finish.
    pub fn remove(&mut self, id: &str) -> bool {
        match self.entries.remove(id) {
            Some(entry) => {
                self.resident_bytes -= entry.adapter.bytes();
                true
            }
            None => false,
        }
    }

    /// Folds a measured load (`bytes` in `seconds`) into the load-throughput estimate.
    pub fn record_load_time(&mut self, bytes: u64, seconds: f64) {
        if seconds > 0.0 && bytes > 0 {
            let observed = bytes as f64 / seconds;
            self.load_bytes_per_s = 0.8 * self.load_bytes_per_s + 0.2 * observed;
        }
    }

    /// Saving of one hit on an occupant of `bytes`: the load it avoids, in seconds.
    fn saving_per_hit(&self, bytes: u64) -> f64 {
        self.config.load_overhead_s + bytes as f64 / self.load_bytes_per_s
    }

    fn value(&self, id: &str, bytes: u64, now_s: f64) -> f64 {
        let rate = self
            .usage
            .get(id)
            .map_or(0.0, |u| u.rate_per_s(now_s, self.config.rate_window_s));
        discounted_value(rate, self.saving_per_hit(bytes), self.config.discount)
    }

    fn value_per_byte(&self, id: &str, bytes: u64, now_s: f64) -> f64 {
        self.value(id, bytes, now_s) / bytes.max(1) as f64
    }

    /// Resident adapters as occupants, in id order (so plans do not depend on hash order);
    /// pinned and in-use adapters count as pinned: neither may be evicted.
    fn occupants(&self, now_s: f64) -> Vec<(String, Occupant)> {
        let mut ids: Vec<&String> = self.entries.keys().collect();
        ids.sort();
        let mut prefixes: Vec<&String> = self.prefixes.keys().collect();
        prefixes.sort();
        let discount = self.config.discount;
        let held = prefixes.into_iter().map(|id| {
            let entry = &self.prefixes[id];
            let name = format!("{PREFIX_TAG}{id}");
            let occupant = prefix_occupant(&name, entry, discount);
            (name, occupant)
        });
        ids.into_iter()
            .map(|id| {
                let entry = &self.entries[id];
                let bytes = entry.adapter.bytes();
                let usage = self.usage.get(id);
                let occupant = Occupant {
                    id: id.clone(),
                    bytes,
                    hit_rate_per_s: usage
                        .map_or(0.0, |u| u.rate_per_s(now_s, self.config.rate_window_s)),
                    saving_per_hit: self.saving_per_hit(bytes),
                    pinned: entry.pinned || entry.in_use > 0,
                    last_used_s: usage.map_or(0.0, |u| u.last_s),
                };
                (id.clone(), occupant)
            })
            .chain(held)
            .collect()
    }

    /// Evicts `name` from a plan: an adapter id or a tagged prefix id.
    fn evict(&mut self, name: &str) {
        match name.strip_prefix(PREFIX_TAG) {
            Some(id) => {
                if self.remove_prefix(id).is_some() {
                    self.prefix_evictions += 1;
                }
            }
            None => {
                if self.remove(name) {
                    self.evictions += 1;
                }
            }
        }
    }

    /// Ids to evict, in order, so that `needed_bytes` fit under the budget.
    fn plan_eviction(
        &self,
        needed_bytes: u64,
        policy: EvictionPolicy,
        now_s: f64,
    ) -> Result<Vec<String>> {
        let free = self.free_bytes();
        let named = self.occupants(now_s);
        let occupants: Vec<Occupant> = named.iter().map(|(_, o)| o.clone()).collect();
        let plan = plan_eviction(&occupants, free, needed_bytes, policy, self.config.discount)
            .map_err(|e| cache_full(needed_bytes, e))?;
        Ok(plan.into_iter().map(|i| named[i].0.clone()).collect())
    }

    /// Carries out an eviction plan; returns the adapter ids evicted (what callers report).
    fn evict_all(&mut self, plan: &[String]) -> Vec<String> {
        for name in plan {
            self.evict(name);
        }
        plan.iter()
            .filter(|n| !n.starts_with(PREFIX_TAG))
            .cloned()
            .collect()
    }

    /// Makes `adapter` resident, evicting by the configured policy; returns the evicted ids.
    /// Already resident: only updates the pin. Nothing changes on error.
    pub fn insert(
        &mut self,
        adapter: Arc<Adapter>,
        pinned: bool,
        now_s: f64,
    ) -> Result<Vec<String>> {
        if let Some(entry) = self.entries.get_mut(adapter.id()) {
            entry.pinned |= pinned;
            return Ok(Vec::new());
        }
        let bytes = adapter.bytes();
        let plan = self.plan_eviction(bytes, self.config.policy, now_s)?;
        let evict = self.evict_all(&plan);
        self.usage.entry(adapter.id().to_string()).or_insert(Usage {
            decayed_uses: 0.0,
            last_s: now_s,
        });
        self.resident_bytes += bytes;
        self.loads += 1;
        self.entries.insert(
            adapter.id().to_string(),
            Entry {
                adapter,
                pinned,
                in_use: 0,
            },
        );
        Ok(evict)
    }

    /// The shadow price of room for `slot_bytes` now: the expected discounted value given up by
    /// evicting least value per byte first (0 while it fits in what is free; `None` when it
    /// cannot be made at all). The unit is seconds of loading saved over the horizon.
    pub fn shadow_price(&self, slot_bytes: u64, now_s: f64) -> Option<f64> {
        let free = self.free_bytes();
        let occupants: Vec<Occupant> = self.occupants(now_s).into_iter().map(|(_, o)| o).collect();
        shadow_price(&occupants, free, slot_bytes, self.config.discount).ok()
    }

    /// Bytes under the budget held by neither adapters, prefixes nor reservations.
    pub fn free_bytes(&self) -> u64 {
        self.config
            .budget_bytes
            .saturating_sub(self.resident_bytes)
            .saturating_sub(self.reserved_bytes)
            .saturating_sub(self.prefix_bytes)
    }

    /// γ as the provider's observations estimate it now.
    pub fn continuation_probability(&self) -> f64 {
        self.continuation.probability()
    }

    /// A request arrived that continues conversation state `id`: counted for γ.
    pub fn note_continuation(&mut self, id: &str) {
        self.continuation.request_continues(id);
    }

    /// Offers a finished turn's KV cache at `now_s` (γ is the estimate before it; the turn is
    /// then counted for γ whatever is decided): kept one more turn iff `γ·s > h`, with h the shadow price of its bytes (SPEC §4),
    /// evicting by the configured policy to make room; with `max_prefixes` held, the least
    /// valuable held prefix makes way if it is worth less. A prefix held under the same id is
    /// replaced.
    pub fn offer_prefix(&mut self, prefix: HeldPrefix, now_s: f64) -> PrefixDecision {
        // γ from the turns seen before this one: its own outcome is not known yet.
        let gamma = self.continuation.probability();
        self.continuation.turn_ended(&prefix.id);
        // A pinned one is kept as it is: the same id is the same conversation state.
        if self.prefixes.get(&prefix.id).is_some_and(|e| e.pinned) {
            return PrefixDecision::Kept {
                evicted: Vec::new(),
            };
        }
        // The same id again (a retried turn) replaces the one held: its bytes are not a cost.
        self.remove_prefix(&prefix.id);
        let value = gamma * prefix.saving_s;
        let bytes = prefix.kv.bytes() as u64;
        let holding_cost = self.shadow_price(bytes, now_s);
        let count_full = self.prefixes.len() >= self.config.max_prefixes.max(1);
        let weakest = count_full
            .then(|| {
                self.prefixes
                    .iter()
                    .filter(|(_, e)| !e.pinned)
                    .min_by(|a, b| a.1.value().total_cmp(&b.1.value()).then(a.0.cmp(b.0)))
                    .map(|(id, e)| (id.clone(), e.value()))
            })
            .flatten();
        let keep = holding_cost.is_some_and(|h| keep_prefix(gamma, prefix.saving_s, h))
            && weakest.as_ref().is_none_or(|(_, v)| *v < value)
            && self.config.max_prefixes > 0;
        if !keep {
            self.prefixes_dropped += 1;
            return PrefixDecision::Dropped {
                value,
                holding_cost,
            };
        }
        let mut evicted = Vec::new();
        if let Some((id, _)) = weakest {
            self.remove_prefix(&id);
            self.prefix_evictions += 1;
            evicted.push(format!("{PREFIX_TAG}{id}"));
        }
        let Ok(plan) = self.plan_eviction(bytes, self.config.policy, now_s) else {
            self.prefixes_dropped += 1;
            return PrefixDecision::Dropped {
                value,
                holding_cost,
            };
        };
        for name in &plan {
            self.evict(name);
        }
        evicted.extend(plan);
        self.prefix_bytes += bytes;
        self.prefixes_kept += 1;
        self.prefixes.insert(
            prefix.id.clone(),
            PrefixEntry {
                prefix,
                bytes,
                continuation_probability: gamma,
                held_at_s: now_s,
                pinned: false,
            },
        );
        PrefixDecision::Kept { evicted }
    }

    /// Takes out the prefix `id` held for `adapter` (a hit: the caller extends its KV); `None`
    /// when it is not held, or was computed with another adapter. A pinned prefix stays held
    /// and the caller gets a copy (the rent keeps this conversation state, whatever follows).
    pub fn take_prefix(&mut self, id: &str, adapter: Option<&str>) -> Option<HeldPrefix> {
        let entry = self.prefixes.get(id)?;
        if entry.prefix.adapter.as_deref() != adapter {
            return None;
        }
        let prefix = if entry.pinned {
            entry.prefix.clone()
        } else {
            self.remove_prefix(id)?
        };
        self.prefix_hits += 1;
        Some(prefix)
    }

    /// Pins (or unpins) held prefix `id`: a pinned prefix is never evicted (a rent on it keeps
    /// it). False when it is not held.
    pub fn set_prefix_pinned(&mut self, id: &str, pinned: bool) -> bool {
        match self.prefixes.get_mut(id) {
            Some(entry) => {
                entry.pinned = pinned;
                true
            }
            None => false,
        }
    }

    /// The bytes prefix `id` holds, if held.
    pub fn prefix_bytes(&self, id: &str) -> Option<u64> {
        self.prefixes.get(id).map(|e| e.bytes)
    }

    /// How many leading positions of prefix `id` (held for `adapter`) a prompt of `tokens` can
    /// reuse: the tokens they share, at most all but the prompt's last (whose logits the first
    /// step needs); 0 when it is not held.
    pub fn prefix_shared_len(&self, id: &str, adapter: Option<&str>, tokens: &[u32]) -> usize {
        let Some(entry) = self.prefixes.get(id) else {
            return 0;
        };
        if entry.prefix.adapter.as_deref() != adapter {
            return 0;
        }
        entry
            .prefix
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1))
    }

    fn remove_prefix(&mut self, id: &str) -> Option<HeldPrefix> {
        let entry = self.prefixes.remove(id)?;
        self.prefix_bytes -= entry.bytes;
        Some(entry.prefix)
    }

    /// Whether prefix `id` is held.
    pub fn holds_prefix(&self, id: &str) -> bool {
        self.prefixes.contains_key(id)
    }

    /// Held prefix ids, pinned first, then most valuable first (value per byte, then the most
    /// recent), at most `limit`: what a residency report names.
    pub fn held_prefixes(&self, limit: usize) -> Vec<String> {
        let mut held: Vec<(&String, &PrefixEntry)> = self.prefixes.iter().collect();
        held.sort_by(|a, b| {
            let density = |e: &PrefixEntry| e.value() / e.bytes.max(1) as f64;
            b.1.pinned
                .cmp(&a.1.pinned)
                .then(density(b.1).total_cmp(&density(a.1)))
                .then(b.1.held_at_s.total_cmp(&a.1.held_at_s))
                .then(a.0.cmp(b.0))
        });
        held.into_iter()
            .take(limit)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Holds `bytes` under the budget for `key` (a training client's state), evicting adapters
    /// by the configured policy to make room; returns the evicted ids. A key already held is
    /// resized (growing evicts as needed). Nothing changes on error ([`Error::CacheFull`]).
    pub fn reserve(&mut self, key: &str, bytes: u64, now_s: f64) -> Result<Vec<String>> {
        let held = self.reservations.get(key).copied().unwrap_or(0);
        let extra = bytes.saturating_sub(held);
        let plan = if extra > 0 {
            self.plan_eviction(extra, self.config.policy, now_s)?
        } else {
            Vec::new()
        };
        let evict = self.evict_all(&plan);
        self.reserved_bytes = self.reserved_bytes - held + bytes;
        self.reservations.insert(key.to_string(), bytes);
        Ok(evict)
    }

    /// Frees the reservation `key`; false when none was held.
    pub fn release_reservation(&mut self, key: &str) -> bool {
        match self.reservations.remove(key) {
            Some(bytes) => {
                self.reserved_bytes -= bytes;
                true
            }
            None => false,
        }
    }

    /// Resident adapters, highest value per byte first.
    pub fn resident(&self, now_s: f64) -> Vec<ResidentInfo> {
        let mut out: Vec<ResidentInfo> = self
            .entries
            .iter()
            .map(|(id, e)| ResidentInfo {
                id: id.clone(),
                bytes: e.adapter.bytes(),
                pinned: e.pinned,
                in_use: e.in_use,
                hit_rate_per_s: self
                    .usage
                    .get(id)
                    .map_or(0.0, |u| u.rate_per_s(now_s, self.config.rate_window_s)),
                value_per_byte: self.value_per_byte(id, e.adapter.bytes(), now_s),
            })
            .collect();
        out.sort_by(|a, b| {
            b.value_per_byte
                .total_cmp(&a.value_per_byte)
                .then(a.id.cmp(&b.id))
        });
        out
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            budget_bytes: self.config.budget_bytes,
            resident_bytes: self.resident_bytes,
            resident_adapters: self.entries.len(),
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            loads: self.loads,
            reserved_bytes: self.reserved_bytes,
            held_prefixes: self.prefixes.len(),
            prefix_bytes: self.prefix_bytes,
            prefix_hits: self.prefix_hits,
            prefixes_kept: self.prefixes_kept,
            prefixes_dropped: self.prefixes_dropped,
            prefix_evictions: self.prefix_evictions,
            continuation_probability: self.continuation.probability(),
        }
    }
}

/// A held prefix as a knapsack occupant: worth `γ·s` (one more turn's expected saving), written
/// as the hit rate whose discounted flow over the cache's horizon is that value, so one eviction
/// plan ranks it beside the adapters by value per byte.
fn prefix_occupant(name: &str, entry: &PrefixEntry, discount: Discount) -> Occupant {
    let per_unit_rate = discounted_value(1.0, 1.0, discount);
    Occupant {
        id: name.to_string(),
        bytes: entry.bytes,
        hit_rate_per_s: if per_unit_rate > 0.0 {
            entry.continuation_probability / per_unit_rate
        } else {
            0.0
        },
        saving_per_hit: entry.prefix.saving_s,
        pinned: entry.pinned,
        last_used_s: entry.held_at_s,
    }
}

/// The cache's refusal, from the shared planner's: only `NotEnoughEvictable` can come back.
fn cache_full(needed_bytes: u64, err: cx_protocol::Error) -> Error {
    match err {
        cx_protocol::Error::NotEnoughEvictable {
            needed_bytes,
            evictable_bytes,
        } => Error::CacheFull {
            needed_bytes,
            evictable_bytes,
        },
        _ => Error::CacheFull {
            needed_bytes,
            evictable_bytes: 0,
        },
    }
}
