//! Integration tests of cx-kernels, gathered in one binary to save link time.
//!
//! SGMV cases run on every device through `test_device!` (candle's idea): a `_cpu` test always,
//! a `_cuda` test with the `cuda` feature that skips, with a message, where CUDA is absent.

/// Defines `$cpu` (and `$cuda` with the `cuda` feature) running `$body(&Device)`.
macro_rules! test_device {
    ($body:ident, $cpu:ident, $cuda:ident) => {
        #[test]
        fn $cpu() {
            let device = cx_kernels::Device::cpu(cx_kernels::CpuConfig::default());
            $body(&device).unwrap();
        }

        #[cfg(feature = "cuda")]
        #[test]
        fn $cuda() {
            match cx_kernels::Device::cuda(0) {
                Ok(device) => $body(&device).unwrap(),
                Err(e @ cx_kernels::Error::CudaUnavailable(_)) => {
                    eprintln!("skipping {}: {e}", stringify!($cuda));
                }
                Err(e) => panic!("CUDA device failed: {e}"),
            }
        }
    };
}

mod attention;
mod common;
mod determinism;
mod device;
mod freivalds;
mod gemm;
mod sgmv;
