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
//! The arithmetic is the exchange's (`exchange/src/inventory.rs`), kept identical in spirit
//! without depending on the exchange: an occupant hit at rate `λ` per second, each hit saving
//! `s` (the reload it avoids, in seconds of loading), is worth `λ·s·(1 − e^{−rH})/r` over a
//! horizon `H` at discount rate `r`; density is that over its bytes.
//!
//! Time is passed in (`now_s`, seconds on any monotonic clock), so the cache is pure and its
//! tests need no sleeping.
//!
//! [`insert`]: ResidencyCache::insert

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::lora::Adapter;

/// How the cache picks what to evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicy {
    /// Least expected value per byte first (SPEC §4).
    ValuePerByte,
    /// Least recently used first: the baseline.
    Lru,
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "value-per-byte" | "value_per_byte" | "vpb" => Ok(Self::ValuePerByte),
            "lru" => Ok(Self::Lru),
            other => Err(format!("unknown policy `{other}` (value-per-byte or lru)")),
        }
    }
}

/// Discounting of future hits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Discount {
    /// `r`, per second.
    pub rate_per_s: f64,
    /// `H`, seconds.
    pub horizon_s: f64,
}

impl Default for Discount {
    fn default() -> Self {
        // An hour's horizon discounted at ~10 % an hour, as the exchange's default.
        Self {
            rate_per_s: 0.1 / 3600.0,
            horizon_s: 3600.0,
        }
    }
}

/// Expected discounted value of a flow `λ·s`: `λ·s·(1 − e^{−rH})/r` (`λ·s·H` when `r = 0`).
pub fn expected_value(hit_rate_per_s: f64, saving_per_hit: f64, discount: Discount) -> f64 {
    let flow = hit_rate_per_s.max(0.0) * saving_per_hit.max(0.0);
    if discount.rate_per_s > 0.0 {
        flow * -(-discount.rate_per_s * discount.horizon_s).exp_m1() / discount.rate_per_s
    } else {
        flow * discount.horizon_s
    }
}

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
}

/// Adapters held in memory under a byte budget.
#[derive(Debug)]
pub struct ResidencyCache {
    config: CacheConfig,
    entries: HashMap<String, Entry>,
    usage: HashMap<String, Usage>,
    resident_bytes: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    loads: u64,
    load_bytes_per_s: f64,
}

impl ResidencyCache {
    /// An empty cache.
    pub fn new(config: CacheConfig) -> Self {
        Self {
            load_bytes_per_s: config.load_bytes_per_s,
            config,
            entries: HashMap::new(),
            usage: HashMap::new(),
            resident_bytes: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            loads: 0,
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
        expected_value(rate, self.saving_per_hit(bytes), self.config.discount)
    }

    fn value_per_byte(&self, id: &str, bytes: u64, now_s: f64) -> f64 {
        self.value(id, bytes, now_s) / bytes.max(1) as f64
    }

    /// Ids to evict, in order, so that `needed_bytes` fit; pinned and in-use adapters are
    /// never chosen.
    fn plan_eviction(
        &self,
        needed_bytes: u64,
        policy: EvictionPolicy,
        now_s: f64,
    ) -> Result<Vec<String>> {
        let free = self.config.budget_bytes.saturating_sub(self.resident_bytes);
        if free >= needed_bytes {
            return Ok(Vec::new());
        }
        let mut candidates: Vec<(&String, &Entry)> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.pinned && e.in_use == 0)
            .collect();
        // Ties broken by id so the plan does not depend on hash order.
        match policy {
            EvictionPolicy::ValuePerByte => candidates.sort_by(|a, b| {
                self.value_per_byte(a.0, a.1.adapter.bytes(), now_s)
                    .total_cmp(&self.value_per_byte(b.0, b.1.adapter.bytes(), now_s))
                    .then(a.0.cmp(b.0))
            }),
            EvictionPolicy::Lru => candidates.sort_by(|a, b| {
                let last = |id: &str| self.usage.get(id).map_or(0.0, |u| u.last_s);
                last(a.0).total_cmp(&last(b.0)).then(a.0.cmp(b.0))
            }),
        }
        let mut freed = free;
        let mut chosen = Vec::new();
        for (id, entry) in &candidates {
            if freed >= needed_bytes {
                break;
            }
            freed = freed.saturating_add(entry.adapter.bytes());
            chosen.push((*id).clone());
        }
        if freed < needed_bytes {
            return Err(Error::CacheFull {
                needed_bytes: needed_bytes - free,
                evictable_bytes: candidates.iter().map(|(_, e)| e.adapter.bytes()).sum(),
            });
        }
        Ok(chosen)
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
        let evict = self.plan_eviction(bytes, self.config.policy, now_s)?;
        for id in &evict {
            self.remove(id);
            self.evictions += 1;
        }
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
        let evict = self
            .plan_eviction(slot_bytes, EvictionPolicy::ValuePerByte, now_s)
            .ok()?;
        // A fold from +0 (an empty `sum` of floats is −0).
        Some(evict.iter().fold(0.0, |total, id| {
            total + self.value(id, self.entries[id].adapter.bytes(), now_s)
        }))
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
        }
    }
}
