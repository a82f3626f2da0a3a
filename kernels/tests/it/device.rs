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
