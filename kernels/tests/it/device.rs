//! Device selection without a GPU: clear errors, never a panic.

use cx_kernels::{CpuConfig, Device, Error};

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_names_the_flag() {
    let err = Device::cuda(0).unwrap_err();
    assert!(matches!(err, Error::CudaNotCompiled));
    assert!(err.to_string().contains("--features cuda"), "{err}");
}

/// cudarc panics when libcuda is missing; the probe must turn that into an error first.
#[cfg(feature = "cuda")]
#[test]
fn cuda_probe_reports_missing_library_instead_of_panicking() {
    match Device::cuda(0) {
        Ok(device) => eprintln!("a GPU is present ({}); nothing to check", device.name()),
        Err(e @ Error::CudaUnavailable(_)) => {
            let message = e.to_string();
            assert!(
                message.contains("libcuda") || message.contains("NVRTC") || message.contains("GPU"),
                "{message}"
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn best_device_falls_back_to_cpu_with_a_reason() {
    let (device, why) = Device::best(CpuConfig::default());
    match device {
        Device::Cpu(_) => assert!(why.is_some(), "fell back to the CPU without saying why"),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => assert!(why.is_none()),
    }
}

/// NVRTC needs no GPU: where `libnvrtc` is installed (the CUDA toolkit, or the
/// `nvidia-cuda-nvrtc` wheel's folder on LD_LIBRARY_PATH) this compiles `sgmv.cu` and checks
/// that every kernel the host code launches is in the PTX.
#[cfg(feature = "cuda")]
#[test]
fn nvrtc_compiles_every_sgmv_kernel() {
    match cx_kernels::cuda::compile_sgmv_ptx("sm_90") {
        Ok(ptx) => {
            for kernel in [
                "sgmv_shrink_f32_f32",
                "sgmv_shrink_f32_bf16",
                "sgmv_shrink_bf16_f32",
                "sgmv_shrink_bf16_bf16",
                "sgmv_expand_f32",
                "sgmv_expand_bf16",
            ] {
                assert!(
                    ptx.contains(&format!(".entry {kernel}")),
                    "{kernel} missing from the PTX"
                );
            }
        }
        Err(e @ Error::CudaUnavailable(_)) => eprintln!("skipping: {e}"),
        Err(e) => panic!("{e}"),
    }
}
