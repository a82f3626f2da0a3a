//! `cx/matmul-f32` jobs (tier T2): the provider's second bundle, which offers the market by
//! listing its name as a resident base, and the run of one job — operands regenerated from the
//! request's seeds (`cx_kernels::matmul::operands`), `C = A·B` on the model's device (the CPU
//! kernels, or cuBLAS with `--gpu` in a `cuda` build), returned as
//! `f32` little-endian bytes (base64) with a receipt whose `output_hash` is SHA-256 of those bytes,
//! `tokens` 0 and class D∞ (the fast kernels may differ in the last bits between CPUs; the
//! exchange checks products by Freivalds' test within a tolerance, not bit for bit).
//!
//! With `--fault wrong-product` (a testing aid) the provider moves one entry of `C` far beyond
//! the check's tolerance and signs an honest receipt over the wrong bytes: what a provider that
//! skips the work looks like, for tests to show it caught and never paid.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use cx_kernels::Device;
use cx_protocol::class::{ClassSet, Tier, TierSet};
use cx_protocol::matmul::{MATMUL_MODEL, MatmulRequest, product_hash, product_to_bytes};
use cx_protocol::receipt::Receipt;
use cx_protocol::{Bundle, DeterminismClass};

use super::{Link, Serve};
use crate::error::{Error, Result};
use cx_protocol::wire::{Assignment, Completed, Output};

/// How long the product self-benchmark runs at most.
const BENCH_BUDGET: Duration = Duration::from_millis(300);
/// The self-benchmark's shape (`n × n × n`).
const BENCH_N: usize = 256;

/// The suffix of the matmul bundle's id (after the inference bundle's).
pub(super) const BUNDLE_SUFFIX: &str = "-matmul";

/// FLOP/s of `C = A·B` on `device`: best of repeated `256³` products within [`BENCH_BUDGET`]
/// (at least one), `2·n³` FLOPs each — the count the exchange turns a product job into seconds
/// with.
pub(super) fn measure_flops(device: &Device) -> Result<f64> {
    let n = BENCH_N;
    let (a, b) = cx_kernels::matmul::operands(n, n, n, 1, 2);
    let started = Instant::now();
    let mut best = f64::INFINITY;
    while best.is_infinite() || started.elapsed() < BENCH_BUDGET {
        let t = Instant::now();
        device.matmul(&a, &b, n, n, n)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(cx_kernels::matmul::product_flops(n, n, n) / best.max(1e-9))
}

impl Link {
    /// The matmul bundle as offered: the `cx/matmul-f32` kernel resident, tier T2 only (no
    /// inference is verified at T2, so none is cleared onto it), classes D∞ and S.
    pub fn matmul_bundle(&self) -> Bundle {
        let determinism: ClassSet = [DeterminismClass::DInf, DeterminismClass::S]
            .into_iter()
            .collect();
        Bundle {
            id: format!("{}{BUNDLE_SUFFIX}", self.config.bundle_id),
            provider: self.config.operator.clone(),
            device: self.engine().model().device_name(),
            price_wei_per_s: self.ask.get(),
            memory_bytes: self.config.memory_bytes,
            bandwidth_bps: self.config.bandwidth_bps,
            rtt_s: self.config.rtt_s,
            flops_per_s: self.matmul_flops_per_s,
            context_max: 1,
            determinism,
            kernel_corpus: None,
            tiers: [Tier::T2].into_iter().collect::<TierSet>(),
            failure_rate: 0.0,
            resident_bases: vec![MATMUL_MODEL.to_owned()],
            resident_adapters: Vec::new(),
            // A kernel market loads no weights.
            fetchable_bases: Some(Vec::new()),
            base_load_bps: None,
            resident_prefixes: Vec::new(),
        }
    }

    /// Runs one product job and returns its result with a signed receipt.
    async fn serve_matmul(&self, job: &Assignment, request: MatmulRequest) -> Result<Completed> {
        request.validate()?;
        let wrong = self.config.fault == Some(super::Fault::WrongProduct);
        let device = self.engine().model().device().clone();
        let started = Instant::now();
        let bytes = tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
            let (m, k, n) = request.dims();
            let (a, b) = cx_kernels::matmul::operands(m, k, n, request.seed_a, request.seed_b);
            let mut c = device.matmul(&a, &b, m, k, n)?;
            if wrong {
                cx_kernels::matmul::perturb(&mut c, k, n);
            }
            Ok(product_to_bytes(&c))
        })
        .await
        .map_err(|_| Error::ForwardPanicked)??;
        let compute_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let receipt = Receipt {
            job_id: job.job_id.0,
            chain_id: job.chain_id,
            escrow_id: job.escrow_id,
            input_hash: job.workload.hash().0,
            output_hash: product_hash(&bytes),
            adapter_hash: [0; 32],
            tokens: 0,
            compute_ms,
            class: DeterminismClass::DInf,
            provider: self.config.payout.0.0,
            provider_key: self.identity.id().0,
            amount_owed_wei: job.price_wei,
            buyer: job.buyer.0.0,
        };
        let output = Output {
            product: Some(BASE64.encode(&bytes)),
            ..Output::text(String::new(), "product", 0, 0)
        };
        self.post_result(job, output, receipt).await
    }
}

impl Serve for MatmulRequest {
    async fn serve(&self, link: &Link, job: &Assignment) -> Result<Completed> {
        link.serve_matmul(job, *self).await
    }
}
