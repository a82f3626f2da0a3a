//! β = 0 on a provider: bases loaded from its store when a job needs them, within the memory
//! budget for bases, the least valuable evicted first; a base a rent pins, or one serving a
//! job, is never evicted, and a load that would need it is refused by name.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cx_provider::bases::{BaseLease, BaseLoad, BaseSource, Bases, ServeOptions, start_engine};
use cx_provider::model::generate::write_generated_model;

use crate::common::{TempDir, tiny_model, tiny_options};

/// Another tiny base (other weights) in `dir/NAME`.
fn stored(dir: &Path, name: &str, seed: u64) -> (PathBuf, BaseSource) {
    let path = dir.join(name);
    write_generated_model(&path, &tiny_options(seed)).unwrap();
    let source = BaseSource::open(name, &path).unwrap();
    (path, source)
}

/// A load that may not wait for busy bases.
const NOW: Duration = Duration::ZERO;

fn options(root: &Path) -> ServeOptions {
    ServeOptions {
        cpu: cx_kernels::CpuConfig::deterministic(),
        device: None,
        cache_bytes: 10_000_000,
        eviction: cx_provider::cache::EvictionPolicy::Lru,
        engine: cx_provider::engine::EngineConfig::default(),
        adapter_roots: vec![root.to_path_buf()],
        quantize: None,
    }
}

/// Bases with the tiny primary `tiny`, stored bases `b` and `c`, and room for one of them.
fn bases(dir: &Path) -> (Bases, BaseSource, BaseSource) {
    let (primary_dir, _) = tiny_model(dir, 4);
    let engine = start_engine(&primary_dir, &options(dir)).unwrap();
    let primary = BaseSource::open("tiny", &primary_dir).unwrap();
    let (_, b) = stored(dir, "b", 5);
    let (_, c) = stored(dir, "c", 6);
    let size = engine.model().weight_bytes() as u64;
    assert_eq!(
        (b.bytes, c.bytes),
        (size, size),
        "held at their files' size"
    );
    let bases = Bases::new(
        (primary, engine, 0.1),
        vec![b.clone(), c.clone()],
        2 * size,
        options(dir),
    )
    .unwrap();
    (bases, b, c)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Eight jobs for base `name` at once, each willing to wait a minute for busy bases (a pinned
/// one is never waited for: it stays for the term).
fn burst(
    rt: &tokio::runtime::Runtime,
    bases: &Arc<Bases>,
    name: &'static str,
) -> Vec<cx_provider::Result<(BaseLease, Option<BaseLoad>)>> {
    rt.block_on(async {
        let mut jobs = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let bases = bases.clone();
            jobs.spawn(async move { bases.lease(name, Duration::from_secs(60)).await });
        }
        jobs.join_all().await
    })
}

fn held(bases: &Bases) -> Vec<String> {
    bases.resident().into_iter().map(|b| b.name).collect()
}

#[test]
fn a_stored_base_is_loaded_on_first_use_and_the_least_valuable_evicted_for_the_next() {
    let dir = TempDir::new("bases-load");
    let (bases, b, c) = bases(dir.path());
    let rt = runtime();
    assert_eq!(bases.fetchable(), ["b", "c"]);
    let (lease, load) = rt.block_on(bases.lease("b", NOW)).unwrap();
    let load = load.expect("b was not held: loaded now");
    assert_eq!((load.bytes, load.evicted.len()), (b.bytes, 0));
    assert_eq!(lease.source.id, b.id);
    assert_eq!(held(&bases), ["tiny", "b"]);
    assert_eq!(bases.fetchable(), ["c"]);
    // Served by its own engine: another model's logits for the same tokens.
    let logits = |engine: &cx_provider::engine::Engine| {
        let mut cache = cx_provider::model::KvCache::default();
        engine
            .model()
            .forward(&mut [cx_provider::model::SeqInput {
                tokens: &[256, 72, 105],
                cache: &mut cache,
                adapter: None,
            }])
            .unwrap()
            .remove(0)
    };
    assert_ne!(logits(&lease.engine), logits(bases.primary()));
    // A second job finds it held: no load.
    assert!(rt.block_on(bases.lease("b", NOW)).unwrap().1.is_none());
    // While a job holds b, c cannot take its room: a load that may not wait is refused by
    // name, nothing evicted.
    let err = rt.block_on(bases.lease("c", NOW)).unwrap_err().to_string();
    assert!(err.contains("no room for base `c`"), "{err}");
    assert!(err.contains("`b` (serving a job)"), "{err}");
    assert!(err.contains("`tiny` (served)"), "{err}");
    assert_eq!(held(&bases), ["tiny", "b"]);
    // One that may wait loads c as soon as b's job is done, evicting b (the primary never goes).
    let (_, load) = rt
        .block_on(async {
            let release = async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(lease);
            };
            let (loaded, ()) = tokio::join!(bases.lease("c", Duration::from_secs(30)), release);
            loaded
        })
        .unwrap();
    assert_eq!(load.unwrap().evicted, [b.id]);
    assert_eq!(held(&bases), ["tiny", "c"]);
    assert_eq!(bases.resident()[1].id, c.id);
    assert_eq!(bases.counts(), (3, 1));
    assert!(bases.load_bps() > 0.0);
    // A base neither held nor stored is refused by name.
    let err = rt
        .block_on(bases.lease("nope", NOW))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("neither holds nor stores a base named `nope`"),
        "{err}"
    );
}

#[test]
fn a_base_rent_keeps_the_base_resident_through_a_burst_that_would_evict_it() {
    let dir = TempDir::new("bases-rent");
    let (bases, b, c) = bases(dir.path());
    let bases = Arc::new(bases);
    let rt = runtime();
    drop(rt.block_on(bases.lease("b", NOW)).unwrap());
    // The rent's term: b pinned. A burst of jobs for c, which would need b's room.
    assert!(bases.set_pins(&HashSet::from([b.id.clone()])));
    assert!(bases.fetchable().is_empty(), "no room left to load into");
    for result in burst(&rt, &bases, "c") {
        let err = result.unwrap_err().to_string();
        assert!(err.contains("`b` (pinned by a rent)"), "{err}");
    }
    assert_eq!(held(&bases), ["tiny", "b"]);
    assert!(bases.resident()[1].pinned);
    // The term over, the same burst loads c in b's place (once).
    assert!(bases.set_pins(&HashSet::new()));
    let loads: Vec<_> = burst(&rt, &bases, "c")
        .into_iter()
        .filter_map(|r| r.unwrap().1)
        .collect();
    assert_eq!(loads.len(), 1);
    assert_eq!(loads[0].evicted, [b.id]);
    assert_eq!(loads[0].bytes, c.bytes);
    assert_eq!(held(&bases), ["tiny", "c"]);
}

#[test]
fn a_budget_that_cannot_hold_a_stored_base_beside_the_served_one_is_refused_at_start() {
    let dir = TempDir::new("bases-budget");
    let (primary_dir, _) = tiny_model(dir.path(), 4);
    let engine = start_engine(&primary_dir, &options(dir.path())).unwrap();
    let size = engine.model().weight_bytes() as u64;
    let primary = BaseSource::open("tiny", &primary_dir).unwrap();
    let (_, b) = stored(dir.path(), "b", 5);
    let err = Bases::new(
        (primary.clone(), engine.clone(), 0.1),
        vec![b],
        size + 10,
        options(dir.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("stored base `b`"), "{err}");
    assert!(err.contains("does not fit"), "{err}");
    let err = Bases::new(
        (primary, engine, 0.1),
        vec![],
        size - 1,
        options(dir.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("smaller than the served model `tiny`"),
        "{err}"
    );
}

#[test]
fn a_stored_base_that_fails_to_load_is_refused_by_name_and_no_longer_offered() {
    let dir = TempDir::new("bases-broken");
    let (bases, b, _) = bases(dir.path());
    // The folder broke after the start: its weights cut short.
    let weights = b.dir.join("model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let rt = runtime();
    let err = rt.block_on(bases.lease("b", NOW)).unwrap_err().to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    assert_eq!(bases.fetchable(), ["c"]);
    let err = rt.block_on(bases.lease("b", NOW)).unwrap_err().to_string();
    assert!(err.contains("failed to load earlier"), "{err}");
    // Nothing else changed: the served base alone is held, and c still loads.
    assert_eq!(held(&bases), ["tiny"]);
    assert!(rt.block_on(bases.lease("c", NOW)).unwrap().1.is_some());
}
