//! Tiny generated models and adapters in throwaway directories.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use cx_provider::lora::write_random_adapter;
use cx_provider::model::{DType, GenModelOptions, ModelConfig, Projection, write_generated_model};

/// A directory removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cx-provider-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn tiny_options(seed: u64) -> GenModelOptions {
    GenModelOptions {
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 48,
        vocab: 300,
        max_positions: 64,
        tie: false,
        dtype: DType::F32,
        seed,
    }
}

/// Writes the tiny model into `dir/model`.
pub(crate) fn tiny_model(dir: &Path, seed: u64) -> (PathBuf, ModelConfig) {
    let path = dir.join("model");
    let config = write_generated_model(&path, &tiny_options(seed)).unwrap();
    (path, config)
}

/// Target sets that the mixed batches cycle through.
pub(crate) fn target_sets() -> Vec<Vec<Projection>> {
    vec![
        Projection::ALL.to_vec(),
        vec![Projection::Q, Projection::V],
        vec![Projection::K, Projection::O, Projection::Down],
        vec![Projection::Gate, Projection::Up],
    ]
}

/// Writes `count` adapters with ranks cycling through `ranks` and targets through
/// [`target_sets`]; returns their directories.
pub(crate) fn adapters(
    dir: &Path,
    config: &ModelConfig,
    count: usize,
    ranks: &[usize],
) -> Vec<PathBuf> {
    let sets = target_sets();
    (0..count)
        .map(|i| {
            let path = dir.join(format!("adapter-{i}"));
            let rank = ranks[i % ranks.len()];
            write_random_adapter(
                &path,
                config,
                rank,
                &sets[i % sets.len()],
                0.5 / rank as f32,
                40 + i as u64,
            )
            .unwrap();
            path
        })
        .collect()
}
