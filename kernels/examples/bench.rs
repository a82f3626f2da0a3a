//! Prints the kernel figures on this CPU: `cargo run --release -p cx-kernels --example bench
//! [repeats] [freivalds_n]`. The provider's `bench` command prints the same functions' numbers.
//!
//! The SGMV table and the base GEMM's cost per row are printed for both modes: the
//! deterministic one (no FMA) should stay within about 2× of the fast one, and a row should
//! cost much less in a 32-row call than alone (the weight panel is reused across rows).

use cx_kernels::bench::{SgmvShape, freivalds_overhead, median_seconds, sgmv_overhead};
use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{CpuConfig, Mode, bf16, gemm_xwt};

fn main() -> Result<(), cx_kernels::Error> {
    let mut args = std::env::args().skip(1);
    let repeats: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let freivalds_n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let config = CpuConfig::default();
    println!("threads {}, repeats {repeats}", config.threads);
    let modes = [config, CpuConfig::deterministic()];
    println!(
        "{:<8} {:<6} {:<5} {:>10} {:>10} {:>10} {:>9} {:>11}",
        "case", "W", "mode", "base ms", "sgmv ms", "overhead", "floor", "base GF/s"
    );
    for (name, shape) in [
        ("prefill", SgmvShape::prefill()),
        ("decode", SgmvShape::decode()),
    ] {
        for dtype in ["f32", "bf16"] {
            for mode_config in &modes {
                let f = if dtype == "f32" {
                    sgmv_overhead::<f32>(&shape, repeats, mode_config)?
                } else {
                    sgmv_overhead::<bf16>(&shape, repeats, mode_config)?
                };
                println!(
                    "{name:<8} {dtype:<6} {:<5} {:>10.2} {:>10.3} {:>10.4} {:>9.4} {:>11.1}",
                    mode_name(mode_config.mode),
                    f.base_s * 1e3,
                    f.sgmv_s * 1e3,
                    f.overhead,
                    f.bytes_floor,
                    f.base_gflops
                );
            }
        }
    }
    gemm_per_row(repeats, &modes)?;
    let n = freivalds_n;
    for (m, d) in [(256, n), (n, n)] {
        let f = freivalds_overhead(m, d, d, 20, repeats, &config)?;
        println!(
            "freivalds 20 rounds on {m}×{d}×{d}: gemm {:.1} ms, check {:.2} ms = {:.2} % (sketch of W kept); \
             sketch {:.2} ms = {:.2} % once per W; fresh sketch + check {:.2} %; honest accepted: {}",
            f.gemm_s * 1e3,
            f.check_s * 1e3,
            f.overhead * 100.0,
            f.sketch_s * 1e3,
            f.sketch_overhead * 100.0,
            f.fresh_overhead * 100.0,
            f.accepted
        );
    }
    Ok(())
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Fast => "fast",
        Mode::Deterministic => "det",
    }
}

/// Base GEMM `4096 × 4096` (f32) for 1 to 256 rows: milliseconds per row in each mode.
fn gemm_per_row(repeats: usize, modes: &[CpuConfig]) -> Result<(), cx_kernels::Error> {
    const D: usize = 4096;
    let mut rng = seeded(5);
    let w = rng.vec_f32(D * D, 0.02);
    println!(
        "{:<12} {:<5} {:>10} {:>10} {:>10}",
        "gemm rows", "mode", "ms", "ms/row", "GF/s"
    );
    for rows in [1, 4, 32, 256] {
        let x = rng.vec_f32(rows * D, 1.0);
        let mut y = vec![0f32; rows * D];
        for config in modes {
            let mut error = None;
            let s = median_seconds(repeats, || {
                if let Err(e) = gemm_xwt(&x, &w, &mut y, rows, D, D, config) {
                    error = Some(e);
                }
            });
            if let Some(e) = error {
                return Err(e);
            }
            println!(
                "{:<12} {:<5} {:>10.2} {:>10.3} {:>10.1}",
                rows,
                mode_name(config.mode),
                s * 1e3,
                s * 1e3 / rows as f64,
                2.0 * (rows * D * D) as f64 / s / 1e9
            );
        }
    }
    Ok(())
}
