//! The figures of `cx-provider bench matmul`: what a `cx/matmul-f32` product costs against the Freivalds check
//! the exchange runs on it (tier T2), side by side on one machine, at `512³` and `1024³` (the
//! largest product a request may ask: every operand 2²⁰ elements).
//!
//! For each size: the product `C = A·B` on the CPU kernels (median time, GFLOP/s), the check
//! with `k` rounds (default 20: soundness 2⁻²⁰) as the exchange runs it — operands regenerated
//! from the seeds, then `B·R`, `A·(B·R)` and `C·R` — and the check's rounds alone. The
//! **bound** is the FLOP ratio `2k·(mk + kn + mn) / 2mkn`: the fraction of the product's time
//! the check would take if its thin products ran at the product's FLOP/s; the measured ratio of
//! the rounds differs from it by how the thin products' FLOP/s (`rounds_gflops`) compares with
//! the product's. Regenerating the operands (ChaCha20, `m·k + k·n` draws) is the larger part of
//! the whole check at these sizes: `check_s` includes it, `rounds_s` does not.

use crate::bench::median_seconds;
use crate::cpu::CpuConfig;
use crate::error::Result;
use crate::matmul::{check_flops, check_product, operands, product, product_flops};

/// What the bench runs.
#[derive(Clone, Debug)]
pub struct MatmulBenchOptions {
    /// Timed repeats per figure (median).
    pub repeats: usize,
    /// Freivalds rounds.
    pub rounds: usize,
    /// The kernels' threads and mode.
    pub cpu: CpuConfig,
    /// Square sizes `n` (products `n × n × n`).
    pub sizes: Vec<usize>,
}

/// One size's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulSize {
    /// `n` of the `n × n × n` product.
    pub n: usize,
    /// The product, median seconds.
    pub product_s: f64,
    /// The product's throughput, GFLOP/s (`2n³ / product_s`).
    pub product_gflops: f64,
    /// The check as the exchange runs it (operands regenerated, `k` rounds), median seconds.
    pub check_s: f64,
    /// The rounds alone (operands in hand), median seconds.
    pub rounds_s: f64,
    /// `check_s / product_s`.
    pub check_vs_product: f64,
    /// `rounds_s / product_s`.
    pub rounds_vs_product: f64,
    /// The bound: the check's FLOPs over the product's, `k·(3n²)/n³ = 3k/n`.
    pub flop_ratio_bound: f64,
    /// The rounds' throughput, GFLOP/s (against the product's, the rate the bound assumes).
    pub rounds_gflops: f64,
    /// Whether every timed check accepted the honest product.
    pub accepted: bool,
}

/// Every size's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulFigures {
    /// Freivalds rounds `k`.
    pub rounds: usize,
    /// Kernel threads.
    pub threads: usize,
    /// Each size, in order.
    pub sizes: Vec<MatmulSize>,
}

impl MatmulFigures {
    /// A human table: one row per size.
    pub fn table(&self) -> String {
        let mut out = format!(
            "Freivalds k = {} (soundness 2^-{}), {} threads\n{:>6} {:>11} {:>9} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}\n",
            self.rounds,
            self.rounds,
            self.threads,
            "n",
            "product_ms",
            "GFLOP/s",
            "check_ms",
            "rounds_ms",
            "check/p",
            "rounds/p",
            "bound",
            "r GFLOP/s"
        );
        for s in &self.sizes {
            out.push_str(&format!(
                "{:>6} {:>11.3} {:>9.2} {:>11.3} {:>11.3} {:>9.4} {:>9.4} {:>9.4} {:>9.2}\n",
                s.n,
                s.product_s * 1e3,
                s.product_gflops,
                s.check_s * 1e3,
                s.rounds_s * 1e3,
                s.check_vs_product,
                s.rounds_vs_product,
                s.flop_ratio_bound,
                s.rounds_gflops
            ));
        }
        out.push_str("bound = check FLOPs / product FLOPs (3k/n): the ratio at equal FLOP/s\n");
        out
    }
}

/// Times the product and its check at each size.
pub fn matmul(options: &MatmulBenchOptions) -> Result<MatmulFigures> {
    let config = &options.cpu;
    let rounds = options.rounds;
    let mut sizes = Vec::new();
    for &n in &options.sizes {
        let (a, b) = operands(n, n, n, 1, 2);
        let c = product(&a, &b, n, n, n, config)?;
        let mut failure = None;
        let product_s = median_seconds(options.repeats, || {
            if let Err(e) = product(&a, &b, n, n, n, config) {
                failure = Some(e);
            }
        });
        let mut accepted = true;
        let mut seed = 0u64;
        let check_s = median_seconds(options.repeats, || {
            seed += 1;
            let (a, b) = operands(n, n, n, 1, 2);
            match check_product(&a, &b, &c, n, n, n, rounds, seed, config) {
                Ok(report) => accepted &= report.accepted,
                Err(e) => failure = Some(e),
            }
        });
        let rounds_s = median_seconds(options.repeats, || {
            seed += 1;
            match check_product(&a, &b, &c, n, n, n, rounds, seed, config) {
                Ok(report) => accepted &= report.accepted,
                Err(e) => failure = Some(e),
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        sizes.push(MatmulSize {
            n,
            product_s,
            product_gflops: product_flops(n, n, n) / product_s / 1e9,
            check_s,
            rounds_s,
            check_vs_product: check_s / product_s,
            rounds_vs_product: rounds_s / product_s,
            flop_ratio_bound: check_flops(n, n, n, rounds) / product_flops(n, n, n),
            rounds_gflops: check_flops(n, n, n, rounds) / rounds_s / 1e9,
            accepted,
        });
    }
    Ok(MatmulFigures {
        rounds,
        threads: config.threads,
        sizes,
    })
}
