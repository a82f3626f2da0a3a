//! One Llama layer's seven base projections at decode, against the machine's read bandwidth:
//! `cargo run --release -p cx-kernels --example decode_layer [hidden] [kv_dim] [intermediate]
//! [threads] [repeats]` (defaults: the llama_cpp.py comparison's hidden-2048 model: 2048, 1024,
//! 5632, 2, 20).
//!
//! For 1, 4 and 8 rows (decode steps) and 24 and 192 (one prompt, eight prompts), in both
//! modes, it prints the layer's time, the weight bytes read per second, that rate over a plain
//! parallel read of the same bytes (one sequential stream per thread over anonymous memory,
//! measured in the same run: the yardstick for a one-row step, not a hard bound; llama.cpp's
//! reads of page-cache pages have gone faster) and the arithmetic rate. The machines here are shared and
//! their bandwidth drifts by ±30 % within minutes, so compare two builds by alternating runs.

use cx_kernels::bench::median_seconds;
use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{CpuConfig, Mode, gemm_xwt};

fn main() -> Result<(), cx_kernels::Error> {
    let mut args = std::env::args().skip(1);
    let mut next = |default: usize| args.next().and_then(|a| a.parse().ok()).unwrap_or(default);
    let (hidden, kv, inter) = (next(2048), next(1024), next(5632));
    let (threads, repeats) = (next(2), next(20));
    // (d_in, d_out) of q, k, v, o, gate, up, down.
    let shapes = [
        (hidden, hidden),
        (hidden, kv),
        (hidden, kv),
        (hidden, hidden),
        (hidden, inter),
        (hidden, inter),
        (inter, hidden),
    ];
    let mut rng = seeded(7);
    let weights: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(i, o)| rng.vec_f32(i * o, 0.02))
        .collect();
    let bytes: usize = shapes.iter().map(|&(i, o)| i * o * 4).sum();
    let read_s = median_seconds(repeats, || {
        std::hint::black_box(read_all(&weights, threads));
    });
    let read_gbs = bytes as f64 / read_s / 1e9;
    println!(
        "layer {hidden}/{kv}/{inter}: {:.1} MB of f32 weights; parallel read on {threads} threads {:.2} ms = {read_gbs:.1} GB/s",
        bytes as f64 / 1e6,
        read_s * 1e3
    );
    println!(
        "{:<5} {:<5} {:>9} {:>9} {:>9} {:>9}",
        "rows", "mode", "ms", "GB/s", "of read", "GF/s"
    );
    for rows in [1, 4, 8, 24, 192] {
        let xs: Vec<Vec<f32>> = shapes
            .iter()
            .map(|&(i, _)| rng.vec_f32(rows * i, 1.0))
            .collect();
        let mut ys: Vec<Vec<f32>> = shapes.iter().map(|&(_, o)| vec![0f32; rows * o]).collect();
        for mode in [Mode::Deterministic, Mode::Fast] {
            let config = CpuConfig {
                threads,
                mode,
                ..CpuConfig::default()
            };
            let mut error = None;
            let s = median_seconds(repeats, || {
                for (((&(i, o), w), x), y) in shapes.iter().zip(&weights).zip(&xs).zip(&mut ys) {
                    if let Err(e) = gemm_xwt(x, w, y, rows, i, o, &config) {
                        error = Some(e);
                    }
                }
            });
            if let Some(e) = error {
                return Err(e);
            }
            let gbs = bytes as f64 / s / 1e9;
            println!(
                "{rows:<5} {:<5} {:>9.3} {:>9.1} {:>9.2} {:>9.1}",
                match mode {
                    Mode::Deterministic => "det",
                    Mode::Fast => "fast",
                },
                s * 1e3,
                gbs,
                gbs / read_gbs,
                (rows * bytes / 2) as f64 / s / 1e9
            );
        }
    }
    Ok(())
}

/// Reads every weight once on `threads` threads (integer sums of the bits, which the compiler
/// vectorises; a float sum it may not reorder).
fn read_all(weights: &[Vec<f32>], threads: usize) -> u32 {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut sum = 0u32;
                    for w in weights {
                        let chunk = w.len().div_ceil(threads);
                        let part = &w[(t * chunk).min(w.len())..((t + 1) * chunk).min(w.len())];
                        sum = part.iter().fold(sum, |s, v| s.wrapping_add(v.to_bits()));
                    }
                    sum
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .fold(0, u32::wrapping_add)
    })
}
