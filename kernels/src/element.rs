//! Input element types: `f32` and `bf16`, always widened to `f32` before arithmetic.

use half::bf16;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// An input element type. Products and sums are always taken in `f32`.
///
/// Sealed: the kernels are written for exactly `f32` and `bf16`.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// Short name for tables (`"f32"`, `"bf16"`).
    const NAME: &'static str;
    /// Widens to `f32` (exact for both types).
    fn to_f32(self) -> f32;
    /// Narrows from `f32` (round to nearest even for `bf16`).
    fn from_f32(value: f32) -> Self;
    /// The slice itself when it already is `f32`, so callers can skip a conversion copy.
    fn as_f32_slice(values: &[Self]) -> Option<&[f32]>;
    /// The slice itself when it is `bf16`, for kernels that widen it in registers.
    fn as_bf16_slice(values: &[Self]) -> Option<&[bf16]>;
}

impl Element for f32 {
    const NAME: &'static str = "f32";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        value
    }
    fn as_f32_slice(values: &[Self]) -> Option<&[f32]> {
        Some(values)
    }
    fn as_bf16_slice(_values: &[Self]) -> Option<&[bf16]> {
        None
    }
}

impl Element for bf16 {
    const NAME: &'static str = "bf16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // bf16 is the top half of an f32: widening is a shift, which vectorises
        // (half's own conversion is also exact, but goes through a call on some targets).
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
    fn as_f32_slice(_values: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_bf16_slice(values: &[Self]) -> Option<&[bf16]> {
        Some(values)
    }
}

/// Widens `src` into `dst` (same length).
pub(crate) fn widen_into<T: Element>(src: &[T], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// `values` as `f32`, borrowed when it already is, widened into a fresh buffer otherwise.
pub(crate) fn as_f32<T: Element>(values: &[T]) -> std::borrow::Cow<'_, [f32]> {
    match T::as_f32_slice(values) {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(values.iter().map(|v| v.to_f32()).collect()),
    }
}
