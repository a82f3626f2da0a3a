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
//! Time is passed in (`now_s`, seconds on any monotonic clock), so the cache is pure and its
//! tests need no sleeping.
//!
//! [`insert`]: ResidencyCache::insert

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::lora::Adapter;
pub use cx_protocol::inventory::{Discount, EvictionPolicy};
use cx_protocol::inventory::{Occupant, discounted_value, plan_eviction, shadow_price};

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
    /// Bytes held by reservations (training clients), within the budget.
    pub reserved_bytes: u64,
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
            reservations: HashMap::new(),
            reserved_bytes: 0,
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
        discounted_value(rate, self.saving_per_hit(bytes), self.config.discount)
    }

    fn value_per_byte(&self, id: &str, bytes: u64, now_s: f64) -> f64 {
        self.value(id, bytes, now_s) / bytes.max(1) as f64
    }

    /// Resident adapters as occupants, in id order (so plans do not depend on hash order);
    /// pinned and in-use adapters count as pinned: neither may be evicted.
    fn occupants(&self, now_s: f64) -> Vec<(&String, Occupant)> {
        let mut ids: Vec<&String> = self.entries.keys().collect();
        ids.sort();
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
                (id, occupant)
            })
            .collect()
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
        let free = self.free_bytes();
        let occupants: Vec<Occupant> = self.occupants(now_s).into_iter().map(|(_, o)| o).collect();
        shadow_price(&occupants, free, slot_bytes, self.config.discount).ok()
    }

    /// Bytes under the budget held by neither adapters nor reservations.
    pub fn free_bytes(&self) -> u64 {
        self.config
            .budget_bytes
            .saturating_sub(self.resident_bytes)
            .saturating_sub(self.reserved_bytes)
    }

    /// Holds `bytes` under the budget for `key` (a training client's state), evicting adapters
    /// by the configured policy to make room; returns the evicted ids. A key already held is
    /// resized (growing evicts as needed). Nothing changes on error ([`Error::CacheFull`]).
    pub fn reserve(&mut self, key: &str, bytes: u64, now_s: f64) -> Result<Vec<String>> {
        let held = self.reservations.get(key).copied().unwrap_or(0);
        let extra = bytes.saturating_sub(held);
        let evict = if extra > 0 {
            self.plan_eviction(extra, self.config.policy, now_s)?
        } else {
            Vec::new()
        };
        for id in &evict {
            self.remove(id);
            self.evictions += 1;
        }
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
        }
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
