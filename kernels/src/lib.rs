//! cx-kernels: the LoRA math of batched multi-adapter serving (SPEC §6) and the Freivalds
//! checks of verification tier T2 (SPEC §7).
//!
//! # Parts, in the order data flows through a LoRA projection
//! * [`gemm_xwt`] — the frozen base projection `y = x·Wᵀ` (`W` as Hugging Face stores a
//!   `Linear` weight, `d_out × d_in`), blocked and multi-threaded (on a persistent worker
//!   pool: a decode step is dozens of short products, and spawning threads for each cost as
//!   much as the product); [`gemm_xwt_many`] runs several weights that read the same input (a
//!   layer's q, k, v) in one pass over the pool.
//! * [`sgmv()`] — segmented gather-matmul: the batch's rows are cut into [`Segment`]s that
//!   share an adapter; each segment gathers its [`LoraAdapter`] from a table and adds
//!   `s·(x·Aᵀ)·Bᵀ` to its rows. Ranks differ freely between adapters; the delta is never merged
//!   into `W`. [`sgmv_shrink`] and [`sgmv_expand`] are the two halves on their own.
//! * [`attend`] — causal softmax attention of a batch's rows over their key/value caches, a
//!   (row, head) pair per work item on the same pool, with fixed-order scores.
//! * [`freivalds_check`] / [`freivalds_check_xwt`] — is a claimed product right? `k` rounds,
//!   soundness `2⁻ᵏ`. A verifier checking many products against the same weights keeps a
//!   [`FreivaldsSketch`] (its secret `R` and `Wᵀ·R`); each check of `y = x·Wᵀ` then costs
//!   `k·m·(d_in + d_out)`, about 1 % of the product for 20 rounds at `d = 4096`.
//! * [`matmul`] — the `matmul` job kind: operands generated from seeds, the product `C = A·B`,
//!   and its Freivalds check (what a provider runs and the exchange verifies at tier T2).
//! * [`Device`] — CPU or (feature `cuda`) GPU, one interface; the `cuda` module holds the NVRTC kernels.
//! * [`rng`] — seeded ChaCha20 (`rand_chacha`) for Freivalds vectors, benchmarks and test data.
//! * [`bench`](mod@bench) — the figures the provider's `bench` command prints (SGMV overhead, Freivalds
//!   overhead), as functions returning numbers.
//!
//! Inputs are `f32` or `bf16` ([`Element`]); products are always accumulated in `f32`.
//! [`Mode::Deterministic`] fixes every reduction order, so a row's output bits do not depend on
//! its neighbours, the segment order, the thread count or the CPU (determinism class D).
//!
//! # Example
//! ```
//! use cx_kernels::{CpuConfig, LoraAdapter, Segment, gemm_xwt, sgmv};
//!
//! let (d_in, d_out, rows) = (8, 6, 3);
//! let x = vec![0.5f32; rows * d_in];
//! let w = vec![0.1f32; d_out * d_in];
//! // Two adapters of different ranks, PEFT layout: A is r × d_in, B is d_out × r.
//! let a1 = LoraAdapter::from_peft(&vec![0.2f32; 2 * d_in], &vec![0.3f32; d_out * 2], 2, d_in, d_out, 4.0)?;
//! let a2 = LoraAdapter::from_peft(&vec![-0.1f32; 4 * d_in], &vec![0.2f32; d_out * 4], 4, d_in, d_out, 8.0)?;
//! // Row 0 uses adapter 0, rows 1..3 use adapter 1.
//! let segments = [Segment { start: 0, len: 1, adapter: 0 }, Segment { start: 1, len: 2, adapter: 1 }];
//!
//! let config = CpuConfig::deterministic();
//! let mut y = vec![0f32; rows * d_out];
//! gemm_xwt(&x, &w, &mut y, rows, d_in, d_out, &config)?; // y = x·Wᵀ
//! sgmv(&x, &mut y, d_in, d_out, &segments, &[&a1, &a2], &config)?; // y += s·B·A·x per segment
//!
//! // Row 0: base 8·0.5·0.1 = 0.4, delta (4/2)·(2·0.3)·(8·0.5·0.2) = 0.96.
//! assert!((y[0] - 1.36).abs() < 1e-5);
//! # Ok::<(), cx_kernels::Error>(())
//! ```
//!
//! # Features
//! * `cuda` — `cuda::CudaKernels` (shrink and expand from `src/cuda/sgmv.cu`, compiled by
//!   NVRTC when the program starts) and `Device::Cuda`; `cudarc` loads the CUDA libraries at
//!   run time, so this builds anywhere, and [`Device::cuda`] returns an error naming the
//!   missing library on machines without a GPU. Also builds the `gpu-check` binary.

mod attention;
pub mod bench;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod element;
mod error;
mod freivalds;
mod gemm;
pub mod matmul;
mod pool;
mod quant;
mod quantize;
pub mod rng;
mod sgmv;

pub use attention::{AttendRow, Heads, attend};
pub use cpu::{
    CpuConfig, DETERMINISTIC_CORPUS, Mode, bf16_dot_available, default_threads,
    int8_decode_available,
};
pub use device::Device;
pub use element::Element;
pub use error::{Error, Result};
pub use freivalds::{
    DEFAULT_REL_TOL, FreivaldsReport, FreivaldsSketch, freivalds_check, freivalds_check_xwt,
};
pub use gemm::{WeightView, gemm_xwt, gemm_xwt_many, gemm_xwt_quant, gemm_xwt_reference};
pub use half::bf16;
pub use quant::{QuantMatrix, QuantType};
pub use sgmv::{
    LoraAdapter, Segment, ShrinkLayout, check_batch, segments_from_row_adapters, sgmv, sgmv_expand,
    sgmv_reference, sgmv_shrink,
};
