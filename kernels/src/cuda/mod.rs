//! CUDA versions of SGMV shrink and expand (`sgmv.cu`), compiled at run time by NVRTC
//! through `cudarc`, which loads `libcuda`, `libnvrtc` and `libcublas` dynamically: the crate
//! builds without any CUDA install and a binary built here runs on a GPU machine.
//!
//! `cudarc` panics when a library it needs is missing, so [`probe`] dlopens them first and
//! every entry point here calls it: a machine without a GPU gets
//! [`Error::CudaUnavailable`] naming the missing library instead of a panic.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};

use crate::element::Element;
use crate::error::{Error, Result, check_len};
use crate::sgmv::{LoraAdapter, Segment, ShrinkLayout, check_batch};

/// The `.cu` source of the shrink and expand kernels.
pub const SGMV_SOURCE: &str = include_str!("sgmv.cu");

/// Threads per block for both kernels (8 warps).
const BLOCK: u32 = 256;
/// Ranks one shrink block computes (`RANKS_PER_BLOCK` in sgmv.cu).
const SHRINK_RANKS_PER_BLOCK: usize = 2;

fn cuda_err(context: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        context,
        message: e.to_string(),
    }
}

/// Checks that the CUDA driver library and NVRTC can be loaded, without touching any
/// `cudarc` call that would panic if they cannot.
pub fn probe() -> Result<()> {
    // SAFETY: these only try `dlopen` on the candidate library names; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "the CUDA driver library libcuda.so (libcuda.so.1) could not be loaded".into(),
        ));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "NVRTC (libnvrtc.so.13, from the CUDA toolkit or the nvidia-cuda-nvrtc package) \
             could not be loaded"
                .into(),
        ));
    }
    Ok(())
}

/// Compiles `sgmv.cu` to PTX for `arch` (e.g. `"sm_90"`) with NVRTC. Needs only
/// `libnvrtc`, no driver or GPU, so it also checks the kernel source on machines without one.
pub fn compile_sgmv_ptx(arch: &'static str) -> Result<String> {
    // SAFETY: only tries `dlopen` on NVRTC's candidate names; no symbol is called.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "NVRTC (libnvrtc.so.13, from the CUDA toolkit or the nvidia-cuda-nvrtc package) \
             could not be loaded"
                .into(),
        ));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        name: Some("sgmv.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SGMV_SOURCE, opts).map_err(|e| Error::Cuda {
        context: "NVRTC compiling sgmv.cu",
        message: e.to_string(),
    })?;
    Ok(ptx.to_src())
}

/// Device memory in the element type it was uploaded as (`bf16` kept as its 16 bits).
#[derive(Debug)]
pub enum DeviceBuffer {
    /// `f32` elements.
    F32(CudaSlice<f32>),
    /// `bf16` elements as raw bits.
    Bf16(CudaSlice<u16>),
}

impl DeviceBuffer {
    fn suffix(&self) -> &'static str {
        match self {
            Self::F32(_) => "f32",
            Self::Bf16(_) => "bf16",
        }
    }
    fn device_ptr_u64(&self, stream: &CudaStream) -> u64 {
        match self {
            Self::F32(s) => s.device_ptr(stream).0,
            Self::Bf16(s) => s.device_ptr(stream).0,
        }
    }
}

/// An adapter uploaded to the GPU (`A`: `rank × d_in`, `Bᵀ`: `rank × d_out`).
#[derive(Debug)]
pub struct CudaAdapter {
    a: DeviceBuffer,
    b_t: DeviceBuffer,
    rank: usize,
    d_in: usize,
    d_out: usize,
    scale: f32,
}

/// A batch's segment tables on the GPU, borrowing the adapters whose pointers it holds.
#[derive(Debug)]
pub struct CudaBatch<'a> {
    blk_seg: CudaSlice<i32>,
    blk_row: CudaSlice<i32>,
    seg_start: CudaSlice<i32>,
    seg_adapter: CudaSlice<i32>,
    v_off: CudaSlice<i64>,
    a_ptr: CudaSlice<u64>,
    bt_ptr: CudaSlice<u64>,
    ranks: CudaSlice<i32>,
    scales: CudaSlice<f32>,
    segment_rows: usize,
    max_rank: usize,
    weights: &'static str,
    layout: ShrinkLayout,
    d_in: usize,
    d_out: usize,
    _adapters: PhantomData<&'a CudaAdapter>,
}

impl CudaBatch<'_> {
    /// Where each segment's `len × rank` block of `v` lives.
    pub fn layout(&self) -> &ShrinkLayout {
        &self.layout
    }
}

/// The compiled SGMV kernels on one GPU.
#[derive(Debug)]
pub struct CudaKernels {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    name: String,
}

fn to_device_bits<T: Element>(values: &[T]) -> DeviceBits {
    if T::NAME == "bf16" {
        // Widening bf16 to f32 is exact, so its top 16 bits are the bf16 bits.
        DeviceBits::Bf16(
            values
                .iter()
                .map(|v| (v.to_f32().to_bits() >> 16) as u16)
                .collect(),
        )
    } else {
        DeviceBits::F32(values.iter().map(|v| v.to_f32()).collect())
    }
}

enum DeviceBits {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

fn to_i32(value: usize, what: &'static str) -> Result<i32> {
    i32::try_from(value)
        .map_err(|_| Error::Batch(format!("{what} = {value} does not fit a CUDA int")))
}

impl CudaKernels {
    /// Probes for the libraries, opens GPU `ordinal` and compiles `sgmv.cu` with NVRTC.
    pub fn new(ordinal: usize) -> Result<Self> {
        probe()?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| Error::CudaUnavailable(format!("no usable GPU {ordinal}: {e}")))?;
        let name = ctx.name().map_err(cuda_err("device name"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("compute capability"))?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let ptx = cudarc::nvrtc::Ptx::from_src(compile_sgmv_ptx(arch)?);
        let module = ctx
            .load_module(ptx)
            .map_err(cuda_err("loading the sgmv module"))?;
        let stream = ctx.default_stream();
        Ok(Self {
            ctx,
            stream,
            module,
            name: format!("{name} (sm_{major}{minor})"),
        })
    }

    /// The GPU's name and architecture.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn function(&self, name: &str) -> Result<CudaFunction> {
        self.module
            .load_function(name)
            .map_err(cuda_err("looking up a kernel"))
    }

    /// Copies host elements to the GPU (`bf16` as raw bits).
    pub fn upload<T: Element>(&self, values: &[T]) -> Result<DeviceBuffer> {
        Ok(match to_device_bits(values) {
            DeviceBits::F32(v) => {
                DeviceBuffer::F32(self.stream.clone_htod(&v).map_err(cuda_err("upload"))?)
            }
            DeviceBits::Bf16(v) => {
                DeviceBuffer::Bf16(self.stream.clone_htod(&v).map_err(cuda_err("upload"))?)
            }
        })
    }

    /// Copies `f32` values to the GPU.
    pub fn upload_f32(&self, values: &[f32]) -> Result<CudaSlice<f32>> {
        self.stream.clone_htod(values).map_err(cuda_err("upload"))
    }

    /// Copies `f32` values back to the host.
    pub fn download_f32(&self, values: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.stream.clone_dtoh(values).map_err(cuda_err("download"))
    }

    /// Uploads an adapter's `A` and `Bᵀ`.
    pub fn upload_adapter<T: Element>(&self, adapter: &LoraAdapter<T>) -> Result<CudaAdapter> {
        Ok(CudaAdapter {
            a: self.upload(adapter.a())?,
            b_t: self.upload(adapter.b_transposed())?,
            rank: adapter.rank(),
            d_in: adapter.d_in(),
            d_out: adapter.d_out(),
            scale: adapter.scale(),
        })
    }

    /// Checks a batch and uploads its segment tables.
    ///
    /// Shapes: `rows × d_in` activations, `rows × d_out` outputs; all adapters must hold the
    /// same element type.
    pub fn batch<'a>(
        &self,
        rows: usize,
        d_in: usize,
        d_out: usize,
        segments: &[Segment],
        adapters: &[&'a CudaAdapter],
    ) -> Result<CudaBatch<'a>> {
        // The same rules as the CPU path, on shapes alone.
        let offsets = crate::sgmv::layout(rows, d_in, d_out, segments, adapters.len(), |i| {
            let a = adapters[i];
            (a.d_in, a.d_out, a.rank)
        })?
        .offsets;
        let mut blk_seg = Vec::new();
        let mut blk_row = Vec::new();
        for (s, seg) in segments.iter().enumerate() {
            for r in seg.start..seg.start + seg.len {
                blk_seg.push(to_i32(s, "segment index")?);
                blk_row.push(to_i32(r, "row")?);
            }
        }
        let weights = match adapters.first() {
            Some(first) => first.a.suffix(),
            None => "f32",
        };
        if adapters.iter().any(|a| a.a.suffix() != weights) {
            return Err(Error::Batch(
                "all adapters of a CUDA batch must have one element type".into(),
            ));
        }
        let st = &self.stream;
        let up_i32 = |v: &[i32]| st.clone_htod(v).map_err(cuda_err("upload batch tables"));
        let seg_start: Vec<i32> = segments
            .iter()
            .map(|s| to_i32(s.start, "row"))
            .collect::<Result<_>>()?;
        let seg_adapter: Vec<i32> = segments
            .iter()
            .map(|s| to_i32(s.adapter, "adapter index"))
            .collect::<Result<_>>()?;
        let v_off: Vec<i64> = offsets[..segments.len()]
            .iter()
            .map(|&o| o as i64)
            .collect();
        let a_ptr: Vec<u64> = adapters.iter().map(|a| a.a.device_ptr_u64(st)).collect();
        let bt_ptr: Vec<u64> = adapters.iter().map(|a| a.b_t.device_ptr_u64(st)).collect();
        let ranks: Vec<i32> = adapters
            .iter()
            .map(|a| to_i32(a.rank, "rank"))
            .collect::<Result<_>>()?;
        let scales: Vec<f32> = adapters.iter().map(|a| a.scale).collect();
        // Empty tables still need a valid allocation to pass as a kernel argument.
        let pad_i64 = |mut v: Vec<i64>| {
            if v.is_empty() {
                v.push(0);
            }
            v
        };
        let pad_i32 = |mut v: Vec<i32>| {
            if v.is_empty() {
                v.push(0);
            }
            v
        };
        let pad_u64 = |mut v: Vec<u64>| {
            if v.is_empty() {
                v.push(0);
            }
            v
        };
        let max_rank = segments
            .iter()
            .map(|s| adapters[s.adapter].rank)
            .max()
            .unwrap_or(0);
        Ok(CudaBatch {
            segment_rows: blk_seg.len(),
            max_rank,
            blk_seg: up_i32(&pad_i32(blk_seg))?,
            blk_row: up_i32(&pad_i32(blk_row))?,
            seg_start: up_i32(&pad_i32(seg_start))?,
            seg_adapter: up_i32(&pad_i32(seg_adapter))?,
            v_off: st
                .clone_htod(&pad_i64(v_off))
                .map_err(cuda_err("upload batch tables"))?,
            a_ptr: st
                .clone_htod(&pad_u64(a_ptr))
                .map_err(cuda_err("upload batch tables"))?,
            bt_ptr: st
                .clone_htod(&pad_u64(bt_ptr))
                .map_err(cuda_err("upload batch tables"))?,
            ranks: up_i32(&pad_i32(ranks))?,
            scales: st
                .clone_htod(&if scales.is_empty() { vec![0.0] } else { scales })
                .map_err(cuda_err("upload batch tables"))?,
            weights,
            layout: ShrinkLayout { offsets },
            d_in,
            d_out,
            _adapters: PhantomData,
        })
    }

    /// Launches the shrink: `v_seg = x_seg·A_aᵀ` into `v` (packed per the batch layout).
    ///
    /// Shapes: `x` is `rows × d_in`, `v` holds at least `batch.layout().total()` elements.
    pub fn shrink(
        &self,
        x: &DeviceBuffer,
        batch: &CudaBatch<'_>,
        v: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if batch.segment_rows == 0 {
            return Ok(());
        }
        if v.len() < batch.layout.total().max(1) {
            return Err(Error::Shape {
                what: "v (packed shrink output)",
                expected: batch.layout.total(),
                got: v.len(),
            });
        }
        let func = self.function(&format!("sgmv_shrink_{}_{}", x.suffix(), batch.weights))?;
        let d_in = to_i32(batch.d_in, "d_in")?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_i32(batch.segment_rows, "rows")? as u32,
                to_i32(
                    batch.max_rank.div_ceil(SHRINK_RANKS_PER_BLOCK),
                    "rank blocks",
                )? as u32,
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&func);
        match x {
            DeviceBuffer::F32(s) => launch.arg(s),
            DeviceBuffer::Bf16(s) => launch.arg(s),
        };
        launch
            .arg(&d_in)
            .arg(&batch.blk_seg)
            .arg(&batch.blk_row)
            .arg(&batch.seg_start)
            .arg(&batch.seg_adapter)
            .arg(&batch.v_off)
            .arg(&batch.a_ptr)
            .arg(&batch.ranks)
            .arg(v);
        // SAFETY: the argument list matches `sgmv_shrink_*` in sgmv.cu; every index the kernel
        // forms was bounds-checked by `batch` (rows, segments, adapters) and `v`'s length above;
        // the adapter pointers stay valid while `batch` borrows the adapters.
        unsafe { launch.launch(cfg) }.map_err(cuda_err("launching sgmv_shrink"))?;
        Ok(())
    }

    /// Launches the expand: `y_seg += s_a · v_seg·B_aᵀ`.
    ///
    /// Shapes: `v` packed per the batch layout, `y` is `rows × d_out`.
    pub fn expand(
        &self,
        v: &CudaSlice<f32>,
        batch: &CudaBatch<'_>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if batch.segment_rows == 0 {
            return Ok(());
        }
        let func = self.function(&format!("sgmv_expand_{}", batch.weights))?;
        let d_out = to_i32(batch.d_out, "d_out")?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_i32(batch.segment_rows, "rows")? as u32,
                (batch.d_out as u32).div_ceil(BLOCK),
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&func);
        launch
            .arg(v)
            .arg(&d_out)
            .arg(&batch.blk_seg)
            .arg(&batch.blk_row)
            .arg(&batch.seg_start)
            .arg(&batch.seg_adapter)
            .arg(&batch.v_off)
            .arg(&batch.bt_ptr)
            .arg(&batch.ranks)
            .arg(&batch.scales)
            .arg(y);
        // SAFETY: the argument list matches `sgmv_expand_*` in sgmv.cu; indices were checked
        // by `batch`; `y` must be `rows × d_out`, which the host-side callers check.
        unsafe { launch.launch(cfg) }.map_err(cuda_err("launching sgmv_expand"))?;
        Ok(())
    }

    /// Host-to-host SGMV on the GPU: uploads, runs shrink then expand, downloads into `y`.
    ///
    /// Shapes as [`crate::sgmv`].
    pub fn sgmv_host<X: Element, T: Element>(
        &self,
        x: &[X],
        y: &mut [f32],
        d_in: usize,
        d_out: usize,
        segments: &[Segment],
        adapters: &[&LoraAdapter<T>],
    ) -> Result<()> {
        if d_in == 0 || !x.len().is_multiple_of(d_in) {
            return Err(Error::Shape {
                what: "x (rows × d_in)",
                expected: d_in,
                got: x.len(),
            });
        }
        let rows = x.len() / d_in;
        check_len("y (rows × d_out)", y.len(), rows * d_out)?;
        let layout = check_batch(rows, d_in, d_out, segments, adapters)?;
        let uploaded: Vec<CudaAdapter> = adapters
            .iter()
            .map(|a| self.upload_adapter(a))
            .collect::<Result<_>>()?;
        let table: Vec<&CudaAdapter> = uploaded.iter().collect();
        let batch = self.batch(rows, d_in, d_out, segments, &table)?;
        let x_dev = self.upload(x)?;
        let mut v = self
            .stream
            .alloc_zeros::<f32>(layout.total().max(1))
            .map_err(cuda_err("alloc v"))?;
        let mut y_dev = self.upload_f32(y)?;
        self.shrink(&x_dev, &batch, &mut v)?;
        self.expand(&v, &batch, &mut y_dev)?;
        let out = self.download_f32(&y_dev)?;
        y.copy_from_slice(&out);
        Ok(())
    }
}

/// cuBLAS `y = x·Wᵀ` in `f32`, the base GEMM SGMV is timed against on the GPU.
#[derive(Debug)]
pub struct CudaBaseGemm {
    blas: CudaBlas,
}

impl CudaBaseGemm {
    /// Loads cuBLAS on the kernels' stream.
    pub fn new(kernels: &CudaKernels) -> Result<Self> {
        // SAFETY: only tries `dlopen` on cuBLAS's candidate names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::CudaUnavailable(
                "cuBLAS (libcublas.so.13) could not be loaded".into(),
            ));
        }
        let blas = CudaBlas::new(kernels.stream.clone()).map_err(|e| Error::Cuda {
            context: "creating a cuBLAS handle",
            message: e.to_string(),
        })?;
        Ok(Self { blas })
    }

    /// `y = x·Wᵀ`.
    ///
    /// Shapes: `x` is `m × d_in`, `w` is `d_out × d_in`, `y` is `m × d_out`, all row-major.
    pub fn gemm_xwt(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        d_in: usize,
        d_out: usize,
    ) -> Result<()> {
        check_len("x (m × d_in)", x.len(), m * d_in)?;
        check_len("w (d_out × d_in)", w.len(), d_out * d_in)?;
        check_len("y (m × d_out)", y.len(), m * d_out)?;
        // Row-major y (m × d_out) is column-major yᵀ (d_out × m) = W·xᵀ: W row-major is
        // column-major Wᵀ (d_in × d_out), hence op(A) = transpose.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: to_i32(d_out, "d_out")?,
            n: to_i32(m, "m")?,
            k: to_i32(d_in, "d_in")?,
            alpha: 1.0f32,
            lda: to_i32(d_in, "d_in")?,
            ldb: to_i32(d_in, "d_in")?,
            beta: 0.0f32,
            ldc: to_i32(d_out, "d_out")?,
        };
        // SAFETY: the lengths checked above match the dimensions and leading dimensions.
        unsafe { self.blas.gemm(cfg, w, x, y) }.map_err(|e| Error::Cuda {
            context: "cuBLAS sgemm",
            message: e.to_string(),
        })
    }
}
