//! Where SGMV runs: the CPU (always) or a CUDA GPU (feature `cuda`), behind one interface so
//! that both share one test suite.

use crate::cpu::CpuConfig;
use crate::element::Element;
use crate::error::Result;
use crate::sgmv::{LoraAdapter, Segment};

/// A device that can run SGMV on host buffers.
#[derive(Debug, Clone)]
pub enum Device {
    /// The blocked multi-threaded CPU kernels.
    Cpu(CpuConfig),
    /// NVRTC-compiled kernels on a GPU.
    #[cfg(feature = "cuda")]
    Cuda(std::sync::Arc<crate::cuda::CudaKernels>),
}

impl Device {
    /// The CPU with `config`.
    pub fn cpu(config: CpuConfig) -> Self {
        Self::Cpu(config)
    }

    /// GPU `ordinal`, or an error saying why not: [`crate::Error::CudaNotCompiled`] without
    /// the `cuda` feature, [`crate::Error::CudaUnavailable`] when the driver, NVRTC or a GPU
    /// is missing.
    pub fn cuda(ordinal: usize) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            Ok(Self::Cuda(std::sync::Arc::new(
                crate::cuda::CudaKernels::new(ordinal)?,
            )))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(crate::Error::CudaNotCompiled)
        }
    }

    /// The best device available: GPU 0 if CUDA works, otherwise the CPU with `config`, and
    /// the reason the GPU was not used.
    pub fn best(config: CpuConfig) -> (Self, Option<crate::Error>) {
        match Self::cuda(0) {
            Ok(device) => (device, None),
            Err(e) => (Self::Cpu(config), Some(e)),
        }
    }

    /// The kernel corpus whose bits this device reproduces (class D), if any: the CPU in
    /// [`crate::Mode::Deterministic`] is [`crate::DETERMINISTIC_CORPUS`]; the fast CPU mode
    /// (FMA where the CPU has it) and the GPU kernels are equal only up to float rounding
    /// (class D∞) and name none.
    pub fn kernel_corpus(&self) -> Option<&'static str> {
        match self {
            Self::Cpu(config) if config.mode == crate::Mode::Deterministic => {
                Some(crate::DETERMINISTIC_CORPUS)
            }
            _ => None,
        }
    }

    /// A short name for logs and tables.
    pub fn name(&self) -> String {
        match self {
            Self::Cpu(config) => format!(
                "cpu ({} threads, {:?}{}{})",
                config.threads,
                config.mode,
                if config.int8 { ", int8" } else { "" },
                if config.bf16_dot { ", bf16 dot" } else { "" }
            ),
            #[cfg(feature = "cuda")]
            Self::Cuda(kernels) => format!("cuda: {}", kernels.name()),
        }
    }

    /// `C = A·B` (the `matmul` job kind, [`crate::matmul::product`]); on a GPU through cuBLAS.
    ///
    /// Shapes: `a` is `m × k`, `b` is `k × n`; returns `m × n`, all row-major.
    pub fn matmul(&self, a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Result<Vec<f32>> {
        match self {
            Self::Cpu(config) => crate::matmul::product(a, b, m, k, n, config),
            #[cfg(feature = "cuda")]
            Self::Cuda(kernels) => crate::matmul::product_cuda(kernels, a, b, m, k, n),
        }
    }

    /// `y[i] += s_a · (x[i]·A_aᵀ)·B_aᵀ` for every row of every segment (see [`crate::sgmv()`]).
    ///
    /// Shapes: `x` is `rows × d_in`, `y` is `rows × d_out`.
    pub fn sgmv<X: Element, T: Element>(
        &self,
        x: &[X],
        y: &mut [f32],
        d_in: usize,
        d_out: usize,
        segments: &[Segment],
        adapters: &[&LoraAdapter<T>],
    ) -> Result<()> {
        match self {
            Self::Cpu(config) => crate::sgmv::sgmv(x, y, d_in, d_out, segments, adapters, config),
            #[cfg(feature = "cuda")]
            Self::Cuda(kernels) => kernels.sgmv_host(x, y, d_in, d_out, segments, adapters),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_deterministic_cpu_kernels_name_a_corpus() {
        let det = CpuConfig::deterministic();
        assert_eq!(
            Device::cpu(det).kernel_corpus(),
            Some(crate::DETERMINISTIC_CORPUS)
        );
        let mut fast = det;
        fast.mode = crate::Mode::Fast;
        assert_eq!(Device::cpu(fast).kernel_corpus(), None);
    }
}
