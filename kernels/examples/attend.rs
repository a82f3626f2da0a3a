//! One attention layer at decode (`cx_kernels::attend`): `cargo run --release -p cx-kernels
//! --example attend [positions] [rows] [threads] [repeats]` (defaults 512, 8, 2, 30), with
//! SmolLM2's heads (9 query heads sharing 3 key/value heads of 64). It prints the median time
//! of one layer and a checksum of the output, which two builds of the same corpus must print
//! alike. Compare two builds by alternating runs: the machines here are shared.

use cx_kernels::bench::median_seconds;
use cx_kernels::{AttendRow, CpuConfig, Heads, attend};

fn main() -> Result<(), cx_kernels::Error> {
    let mut args = std::env::args().skip(1);
    let mut next = |default: usize| args.next().and_then(|a| a.parse().ok()).unwrap_or(default);
    let (positions, rows, threads, repeats) = (next(512), next(8), next(2), next(30));
    let heads = Heads {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
    };
    let (q_width, kv_width) = (
        heads.heads * heads.head_dim,
        heads.kv_heads * heads.head_dim,
    );
    let q: Vec<f32> = (0..rows * q_width)
        .map(|i| (i as f32 * 0.013).sin())
        .collect();
    let caches: Vec<Vec<f32>> = (0..rows)
        .map(|r| {
            (0..positions * kv_width)
                .map(|i| ((i + r) as f32 * 0.007).cos())
                .collect()
        })
        .collect();
    let batch: Vec<AttendRow<'_>> = (0..rows)
        .map(|r| AttendRow {
            q: &q[r * q_width..][..q_width],
            keys: &caches[r],
            values: &caches[r],
            visible: positions,
        })
        .collect();
    let mut out = vec![0f32; rows * q_width];
    let config = CpuConfig::deterministic().with_threads(threads);
    let mut failed = None;
    let seconds = median_seconds(repeats, || {
        if let Err(e) = attend(&batch, heads, &mut out, &config) {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    println!(
        "attend: {positions} positions, {rows} rows, {threads} threads: {:.1} µs a layer (checksum {})",
        seconds * 1e6,
        out.iter().sum::<f32>()
    );
    Ok(())
}
