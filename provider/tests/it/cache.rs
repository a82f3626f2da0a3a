//! The residency cache: value-per-byte vs LRU, pins, in-use adapters, shadow price.

use std::sync::Arc;

use cx_protocol::inventory::discounted_value;
use cx_provider::Error;
use cx_provider::cache::{CacheConfig, Discount, EvictionPolicy, ResidencyCache};
use cx_provider::lora::{Adapter, load_adapter, write_random_adapter};
use cx_provider::model::Projection;

use crate::common::{TempDir, tiny_model};

fn four_adapters() -> (TempDir, Vec<Arc<Adapter>>) {
    let dir = TempDir::new("cache");
    let (_, config) = tiny_model(dir.path(), 1);
    // Same rank and targets: equal sizes, so only value decides.
    let loaded = (0..4)
        .map(|i| {
            let path = dir.path().join(format!("a{i}"));
            write_random_adapter(&path, &config, 8, &Projection::ALL, 0.05, i).unwrap();
            Arc::new(load_adapter(&path, &config, 64).unwrap())
        })
        .collect();
    (dir, loaded)
}

/// Fills a 3-slot cache with a (hot long ago), b (one use, recent), c (one use, most recent),
/// then inserts d at t = 10 and returns what was evicted.
fn scenario(policy: EvictionPolicy, a: &[Arc<Adapter>]) -> (Vec<String>, ResidencyCache) {
    let max = a[..3].iter().map(|x| x.bytes()).max().unwrap();
    let total: u64 = a[..3].iter().map(|x| x.bytes()).sum();
    assert!(a[3].bytes() <= max);
    let mut cache = ResidencyCache::new(CacheConfig::new(total, policy));
    for (t, x) in a[..3].iter().enumerate() {
        assert!(
            cache.lookup(x.id(), t as f64).is_none(),
            "a first lookup misses"
        );
        assert!(cache.insert(x.clone(), false, t as f64).unwrap().is_empty());
    }
    for k in 0..10 {
        assert!(cache.lookup(a[0].id(), 1.0 + 0.2 * k as f64).is_some());
    }
    cache.lookup(a[1].id(), 9.0).unwrap();
    cache.lookup(a[2].id(), 9.5).unwrap();
    let evicted = cache.insert(a[3].clone(), false, 10.0).unwrap();
    (evicted, cache)
}

#[test]
fn value_per_byte_keeps_the_hot_adapter_lru_does_not() {
    let (_dir, a) = four_adapters();
    let (evicted, cache) = scenario(EvictionPolicy::ValuePerByte, &a);
    // b and c have one use each; b's is older, so its decayed rate is lower.
    assert_eq!(evicted, vec![a[1].id().to_string()]);
    assert!(cache.contains(a[0].id()));
    let resident = cache.resident(10.0);
    assert_eq!(
        resident[0].id,
        a[0].id(),
        "the hot adapter has the highest value per byte"
    );
    let (evicted, _) = scenario(EvictionPolicy::Lru, &a);
    assert_eq!(
        evicted,
        vec![a[0].id().to_string()],
        "LRU throws out the oldest, however hot"
    );
    let stats = cache.stats();
    assert_eq!(
        (
            stats.hits,
            stats.misses,
            stats.evictions,
            stats.resident_adapters
        ),
        (12, 3, 1, 3)
    );
}

#[test]
fn pins_and_running_sequences_are_never_evicted() {
    let (_dir, a) = four_adapters();
    let total: u64 = a[..2].iter().map(|x| x.bytes()).sum();
    let mut cache = ResidencyCache::new(CacheConfig::new(total, EvictionPolicy::ValuePerByte));
    cache.insert(a[0].clone(), true, 0.0).unwrap(); // rent on state
    cache.insert(a[1].clone(), false, 0.0).unwrap();
    for k in 0..20 {
        cache.lookup(a[1].id(), k as f64 * 0.1).unwrap(); // far hotter than the pin
    }
    // The only evictable occupant goes, however hot.
    assert_eq!(
        cache.insert(a[2].clone(), false, 3.0).unwrap(),
        vec![a[1].id().to_string()]
    );
    // A running sequence holds a[2]: nothing can be evicted now.
    assert!(cache.acquire(a[2].id()).is_some());
    let err = cache.insert(a[3].clone(), false, 4.0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::CacheFull {
                evictable_bytes: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(cache.contains(a[0].id()) && cache.contains(a[2].id()) && !cache.contains(a[3].id()));
    assert_eq!(
        cache.shadow_price(a[3].bytes(), 4.0),
        None,
        "no room can be made"
    );
    cache.release(a[2].id());
    assert_eq!(
        cache.insert(a[3].clone(), false, 5.0).unwrap(),
        vec![a[2].id().to_string()]
    );
    assert!(cache.contains(a[0].id()), "the pin survived every eviction");
}

/// The shadow price of a slot is 0 while it fits, and otherwise the expected discounted value
/// of what would be evicted: λ·s·(1 − e^{−rH})/r with s the reload seconds.
#[test]
fn shadow_price_is_the_value_given_up() {
    let (_dir, a) = four_adapters();
    let bytes = a[0].bytes();
    let mut config = CacheConfig::new(bytes * 2, EvictionPolicy::ValuePerByte);
    config.discount = Discount {
        rate_per_s: 0.0,
        horizon_s: 100.0,
    };
    config.rate_window_s = 10.0;
    let mut cache = ResidencyCache::new(config);
    cache.lookup(a[0].id(), 0.0);
    cache.insert(a[0].clone(), false, 0.0).unwrap();
    assert_eq!(
        cache.shadow_price(bytes, 0.0),
        Some(0.0),
        "one slot is still free"
    );
    cache.insert(a[1].clone(), false, 0.0).unwrap();
    // a[1] has no uses: evicting it costs nothing; two slots cost a[0]'s value too.
    assert_eq!(cache.shadow_price(bytes, 0.0), Some(0.0));
    let saving = config.load_overhead_s + bytes as f64 / config.load_bytes_per_s;
    let a0 = discounted_value(1.0 / 10.0, saving, config.discount);
    let two = cache.shadow_price(2 * bytes, 0.0).unwrap();
    assert!((two - a0).abs() < 1e-12, "{two} vs {a0}");
    assert!(two > 0.0);
}
