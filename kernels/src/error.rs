//! The crate's one error type.

/// Everything that can go wrong in `cx-kernels`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A buffer's length does not match the shape the call declared.
    #[error("{what}: expected {expected} elements, got {got} (check the shape arguments)")]
    Shape {
        /// Which argument is wrong, with its shape in words.
        what: &'static str,
        /// Elements the declared shape needs.
        expected: usize,
        /// Elements the buffer holds.
        got: usize,
    },
    /// A dimension is zero or the segments do not fit the batch.
    #[error("invalid batch: {0}")]
    Batch(String),
    /// A segment names an adapter index past the end of the adapter table.
    #[error("segment {segment} names adapter {adapter}, but only {available} adapters were passed")]
    UnknownAdapter {
        /// Index of the offending segment.
        segment: usize,
        /// The adapter index it names.
        adapter: usize,
        /// Length of the adapter table.
        available: usize,
    },
    /// CUDA was asked for, but this build has no CUDA support.
    #[error("CUDA support is not compiled in: rebuild with `--features cuda` (cx-kernels)")]
    CudaNotCompiled,
    /// The CUDA driver or NVRTC library could not be loaded on this machine.
    #[error(
        "CUDA unavailable: {0}; install the NVIDIA driver (libcuda.so.1) and NVRTC \
         (libnvrtc.so) or add their folder to LD_LIBRARY_PATH, or use the CPU device"
    )]
    CudaUnavailable(String),
    /// A CUDA driver, NVRTC or cuBLAS call failed.
    #[error("CUDA error in {context}: {message}")]
    Cuda {
        /// What we were doing.
        context: &'static str,
        /// The driver's message.
        message: String,
    },
}

/// `Result` with this crate's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that `buffer` holds exactly `expected` elements.
pub(crate) fn check_len(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::Shape {
            what,
            expected,
            got,
        })
    }
}
