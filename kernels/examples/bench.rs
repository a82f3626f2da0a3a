//! Prints the kernel figures on this CPU: `cargo run --release -p cx-kernels --example bench
//! [repeats] [freivalds_n]`. The provider's `bench` command prints the same functions' numbers.

use cx_kernels::bench::{SgmvShape, freivalds_overhead, sgmv_overhead};
use cx_kernels::{CpuConfig, bf16};

fn main() -> Result<(), cx_kernels::Error> {
    let mut args = std::env::args().skip(1);
    let repeats: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let freivalds_n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let config = CpuConfig::default();
    println!("threads {}, repeats {repeats}", config.threads);
    println!(
        "{:<8} {:<6} {:>10} {:>10} {:>10} {:>9} {:>11}",
        "case", "W", "base ms", "sgmv ms", "overhead", "floor", "base GF/s"
    );
    for (name, shape) in [
        ("prefill", SgmvShape::prefill()),
        ("decode", SgmvShape::decode()),
    ] {
        for dtype in ["f32", "bf16"] {
            let f = if dtype == "f32" {
                sgmv_overhead::<f32>(&shape, repeats, &config)?
            } else {
                sgmv_overhead::<bf16>(&shape, repeats, &config)?
            };
            println!(
                "{name:<8} {dtype:<6} {:>10.2} {:>10.3} {:>10.4} {:>9.4} {:>11.1}",
                f.base_s * 1e3,
                f.sgmv_s * 1e3,
                f.overhead,
                f.bytes_floor,
                f.base_gflops
            );
        }
    }
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
