//! gpu-check: the CUDA SGMV kernels against the CPU ones on fresh random inputs (relative
//! error), and SGMV time against the cuBLAS base GEMM, printed as tables.
//!
//! Built here (`cargo build --release -p cx-kernels --features cuda --bin gpu-check`) and run
//! on a GPU machine through `kernels/gpu-check.sh`; that machine needs the NVIDIA driver,
//! NVRTC and cuBLAS libraries, no Rust toolchain. Options: `--seed N` (default: from the
//! clock, printed), `--iters N` (timed iterations, default 50).
//!
//! Exit status: 0 all checks passed, 1 a CUDA result disagreed with the CPU, 2 CUDA unusable.

use std::process::ExitCode;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cx_kernels::bench::{SgmvShape, random_batch};
use cx_kernels::cuda::{CudaAdapter, CudaBaseGemm, CudaKernels};
use cx_kernels::rng::{ChaCha20Rng, Rng, UniformVec, seeded};
use cx_kernels::{
    CpuConfig, Element, Error, LoraAdapter, Segment, bf16, gemm_xwt, segments_from_row_adapters,
    sgmv,
};

/// Largest accepted `max |cuda − cpu| / max |cpu delta|`: both accumulate in f32, in different
/// orders, over up to 4096 terms.
const MAX_REL_ERR: f64 = 1e-4;

/// The base GEMM check only guards the row-major mapping (a wrong one is off by O(1)); loose
/// enough for cuBLAS to use TF32 where the driver is told to.
const GEMM_MAX_REL_ERR: f64 = 5e-3;

struct Options {
    seed: u64,
    iters: usize,
}

fn options() -> Options {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut iters = 50;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).unwrap_or(seed),
            "--iters" => iters = args.next().and_then(|v| v.parse().ok()).unwrap_or(iters),
            other => eprintln!("gpu-check: ignoring unknown argument {other}"),
        }
    }
    Options {
        seed,
        iters: iters.max(1),
    }
}

/// A mixed-rank batch: ranks 1..64, segments of 1..13 rows, some rows without an adapter.
fn mixed_case<T: Element>(
    rng: &mut ChaCha20Rng,
    d_in: usize,
    d_out: usize,
) -> (Vec<LoraAdapter<T>>, Vec<Segment>, usize) {
    const RANKS: [usize; 10] = [1, 2, 3, 4, 7, 8, 16, 24, 32, 64];
    let adapters: Vec<LoraAdapter<T>> = RANKS
        .iter()
        .map(|&r| {
            let a: Vec<T> = rng
                .vec_f32(r * d_in, 0.05)
                .into_iter()
                .map(T::from_f32)
                .collect();
            let b: Vec<T> = rng
                .vec_f32(d_out * r, 0.05)
                .into_iter()
                .map(T::from_f32)
                .collect();
            LoraAdapter::from_peft(&a, &b, r, d_in, d_out, 2.0 * r as f32)
                .expect("consistent shapes")
        })
        .collect();
    let mut rows: Vec<Option<usize>> = Vec::new();
    for _ in 0..24 {
        let len = rng.gen_range(1..=13);
        let pick = rng.gen_range(0..=RANKS.len());
        let adapter = (pick < RANKS.len()).then_some(pick);
        rows.extend(std::iter::repeat_n(adapter, len));
    }
    let n = rows.len();
    (adapters, segments_from_row_adapters(&rows), n)
}

struct CheckRow {
    x: &'static str,
    w: &'static str,
    rows: usize,
    segments: usize,
    rel_err: f64,
}

fn check_case<X: Element, T: Element>(
    gpu: Option<&CudaKernels>,
    seed: u64,
) -> Result<Option<CheckRow>, Error> {
    let (d_in, d_out) = (4096, 4096);
    let mut rng = seeded(seed);
    let (adapters, segments, rows) = mixed_case::<T>(&mut rng, d_in, d_out);
    let table: Vec<&LoraAdapter<T>> = adapters.iter().collect();
    let x: Vec<X> = rng
        .vec_f32(rows * d_in, 1.0)
        .into_iter()
        .map(X::from_f32)
        .collect();
    let y0 = rng.vec_f32(rows * d_out, 1.0);
    let mut cpu = y0.clone();
    let t = Instant::now();
    sgmv(
        &x,
        &mut cpu,
        d_in,
        d_out,
        &segments,
        &table,
        &CpuConfig::deterministic(),
    )?;
    let cpu_ms = t.elapsed().as_secs_f64() * 1e3;
    let delta_max = cpu
        .iter()
        .zip(&y0)
        .map(|(c, y)| f64::from((c - y).abs()))
        .fold(0.0, f64::max);
    println!(
        "  cpu  x {:<4} W {:<4}: {rows} rows, {} segments, max |delta| {delta_max:.3e}, {cpu_ms:.1} ms",
        X::NAME,
        T::NAME,
        segments.len()
    );
    let Some(gpu) = gpu else { return Ok(None) };
    let mut dev = y0.clone();
    gpu.sgmv_host(&x, &mut dev, d_in, d_out, &segments, &table)?;
    let err = dev
        .iter()
        .zip(&cpu)
        .map(|(g, c)| f64::from((g - c).abs()))
        .fold(0.0, f64::max);
    Ok(Some(CheckRow {
        x: X::NAME,
        w: T::NAME,
        rows,
        segments: segments.len(),
        rel_err: err / delta_max.max(1e-30),
    }))
}

struct TimeRow {
    case: &'static str,
    w: &'static str,
    shape: SgmvShape,
    base_us: f64,
    sgmv_us: f64,
}

fn gpu_time_ms(
    gpu: &CudaKernels,
    iters: usize,
    mut launch: impl FnMut() -> Result<(), Error>,
) -> Result<f64, Error> {
    let ctx = gpu.context();
    let err = |e: cudarc::driver::DriverError| Error::Cuda {
        context: "timing events",
        message: e.to_string(),
    };
    launch()?; // warm-up
    let start = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(err)?;
    let end = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(err)?;
    start.record(gpu.stream()).map_err(err)?;
    for _ in 0..iters {
        launch()?;
    }
    end.record(gpu.stream()).map_err(err)?;
    end.synchronize().map_err(err)?;
    Ok(f64::from(start.elapsed_ms(&end).map_err(err)?) / iters as f64)
}

fn time_case<T: Element>(
    gpu: &CudaKernels,
    blas: &CudaBaseGemm,
    case: &'static str,
    shape: SgmvShape,
    iters: usize,
    seed: u64,
) -> Result<TimeRow, Error> {
    let mut rng = seeded(seed);
    let x = rng.vec_f32(shape.tokens * shape.d_in, 1.0);
    let w = rng.vec_f32(shape.d_out * shape.d_in, 0.02);
    let (adapters, segments) = random_batch::<T>(&shape, seed ^ 0x5eed);
    let x_dev = gpu.upload_f32(&x)?;
    let x_buf = gpu.upload(&x)?;
    let w_dev = gpu.upload_f32(&w)?;
    let mut y_dev = gpu.upload_f32(&vec![0f32; shape.tokens * shape.d_out])?;
    let uploaded: Vec<CudaAdapter> = adapters
        .iter()
        .map(|a| gpu.upload_adapter(a))
        .collect::<Result<_, _>>()?;
    let table: Vec<&CudaAdapter> = uploaded.iter().collect();
    let batch = gpu.batch(shape.tokens, shape.d_in, shape.d_out, &segments, &table)?;
    let mut v = gpu
        .stream()
        .alloc_zeros::<f32>(batch.layout().total().max(1))
        .map_err(|e| Error::Cuda {
            context: "alloc v",
            message: e.to_string(),
        })?;
    let base_ms = gpu_time_ms(gpu, iters, || {
        blas.gemm_xwt(
            &x_dev,
            &w_dev,
            &mut y_dev,
            shape.tokens,
            shape.d_in,
            shape.d_out,
        )
    })?;
    let sgmv_ms = gpu_time_ms(gpu, iters, || {
        gpu.shrink(&x_buf, &batch, &mut v)?;
        gpu.expand(&v, &batch, &mut y_dev)
    })?;
    Ok(TimeRow {
        case,
        w: T::NAME,
        shape,
        base_us: base_ms * 1e3,
        sgmv_us: sgmv_ms * 1e3,
    })
}

/// `max |cuBLAS − CPU| / max |CPU|` for the base GEMM on a ragged shape: checks the
/// row-major ↔ column-major mapping the timing relies on.
fn check_base_gemm(gpu: &CudaKernels, blas: &CudaBaseGemm, seed: u64) -> Result<f64, Error> {
    let (m, d_in, d_out) = (77, 1030, 390);
    let mut rng = seeded(seed ^ 0x6e44);
    let x = rng.vec_f32(m * d_in, 1.0);
    let w = rng.vec_f32(d_out * d_in, 0.05);
    let mut cpu = vec![0f32; m * d_out];
    gemm_xwt(&x, &w, &mut cpu, m, d_in, d_out, &CpuConfig::default())?;
    let (x_dev, w_dev) = (gpu.upload_f32(&x)?, gpu.upload_f32(&w)?);
    let mut y_dev = gpu.upload_f32(&vec![0f32; m * d_out])?;
    blas.gemm_xwt(&x_dev, &w_dev, &mut y_dev, m, d_in, d_out)?;
    let dev = gpu.download_f32(&y_dev)?;
    let scale = cpu.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
    let err = dev
        .iter()
        .zip(&cpu)
        .map(|(g, c)| f64::from((g - c).abs()))
        .fold(0.0, f64::max);
    Ok(err / scale.max(1e-30))
}

fn cpu_overhead(shape: SgmvShape) -> Result<(f64, f64), Error> {
    let config = CpuConfig::default();
    let mut rng = seeded(5);
    let x = rng.vec_f32(shape.tokens * shape.d_in, 1.0);
    let w = rng.vec_f32(shape.d_out * shape.d_in, 0.02);
    let (adapters, segments) = random_batch::<bf16>(&shape, 6);
    let table: Vec<&LoraAdapter<bf16>> = adapters.iter().collect();
    let mut y = vec![0f32; shape.tokens * shape.d_out];
    let mut result = Ok(());
    let base = cx_kernels::bench::median_seconds(3, || {
        if let Err(e) = gemm_xwt(
            &x,
            &w,
            &mut y,
            shape.tokens,
            shape.d_in,
            shape.d_out,
            &config,
        ) {
            result = Err(e);
        }
    });
    let delta = cx_kernels::bench::median_seconds(3, || {
        if let Err(e) = sgmv(
            &x,
            &mut y,
            shape.d_in,
            shape.d_out,
            &segments,
            &table,
            &config,
        ) {
            result = Err(e);
        }
    });
    result?;
    Ok((base * 1e6, delta * 1e6))
}

fn main() -> ExitCode {
    let opts = options();
    println!(
        "gpu-check: seed {} (rerun with --seed {} to repeat), {} timed iterations",
        opts.seed, opts.seed, opts.iters
    );
    let gpu = match CudaKernels::new(0) {
        Ok(gpu) => {
            println!("device: {}", gpu.name());
            Some(gpu)
        }
        Err(e) => {
            println!("device: none — {e}");
            None
        }
    };
    match run(gpu.as_ref(), &opts) {
        Ok(true) if gpu.is_some() => ExitCode::SUCCESS,
        Ok(true) => ExitCode::from(2),
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("gpu-check: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(gpu: Option<&CudaKernels>, opts: &Options) -> Result<bool, Error> {
    println!("\n== correctness: CUDA vs CPU (deterministic) SGMV, 4096→4096, ranks 1..64 mixed ==");
    let checks = [
        check_case::<f32, f32>(gpu, opts.seed)?,
        check_case::<f32, bf16>(gpu, opts.seed.wrapping_add(1))?,
        check_case::<bf16, bf16>(gpu, opts.seed.wrapping_add(2))?,
        check_case::<bf16, f32>(gpu, opts.seed.wrapping_add(3))?,
    ];
    let mut all_ok = true;
    if gpu.is_some() {
        println!("\n| x    | W    | rows | segments | max rel err | limit  | ok  |");
        println!("|------|------|------|----------|-------------|--------|-----|");
        for row in checks.iter().flatten() {
            let ok = row.rel_err <= MAX_REL_ERR;
            all_ok &= ok;
            println!(
                "| {:<4} | {:<4} | {:>4} | {:>8} | {:>11.2e} | {:.0e} | {:<3} |",
                row.x,
                row.w,
                row.rows,
                row.segments,
                row.rel_err,
                MAX_REL_ERR,
                if ok { "yes" } else { "NO" }
            );
        }
    }

    println!(
        "\n== time: SGMV (shrink + expand) vs base GEMM y = x·Wᵀ (f32), 4096×4096, rank 16 =="
    );
    let mut cpu_rows = Vec::new();
    for (case, shape) in [
        ("prefill", SgmvShape::prefill()),
        ("decode", SgmvShape::decode()),
    ] {
        let (base_us, sgmv_us) = cpu_overhead(shape)?;
        cpu_rows.push((case, shape, base_us, sgmv_us));
    }
    let mut gpu_rows = Vec::new();
    if let Some(gpu) = gpu {
        let blas = CudaBaseGemm::new(gpu)?;
        let gemm_err = check_base_gemm(gpu, &blas, opts.seed)?;
        let ok = gemm_err <= GEMM_MAX_REL_ERR;
        all_ok &= ok;
        println!(
            "\ncuBLAS y = x·Wᵀ vs CPU gemm_xwt (77×1030×390): max rel err {gemm_err:.2e} ({})",
            if ok {
                "ok"
            } else {
                "MISMATCH: the row-major mapping is wrong"
            }
        );
        for (case, shape) in [
            ("prefill", SgmvShape::prefill()),
            ("decode", SgmvShape::decode()),
        ] {
            gpu_rows.push(time_case::<f32>(
                gpu, &blas, case, shape, opts.iters, opts.seed,
            )?);
            gpu_rows.push(time_case::<bf16>(
                gpu, &blas, case, shape, opts.iters, opts.seed,
            )?);
        }
    }
    println!(
        "\n| device | case    | tokens | adapters | rank | adapter W | base µs   | sgmv µs   | (base+sgmv)/base |"
    );
    println!(
        "|--------|---------|--------|----------|------|-----------|-----------|-----------|------------------|"
    );
    for (case, shape, base_us, sgmv_us) in cpu_rows {
        println!(
            "| cpu    | {case:<7} | {:>6} | {:>8} | {:>4} | bf16      | {base_us:>9.1} | {sgmv_us:>9.1} | {:>16.4} |",
            shape.tokens,
            shape.adapters,
            shape.rank,
            (base_us + sgmv_us) / base_us
        );
    }
    for row in &gpu_rows {
        println!(
            "| cuda   | {:<7} | {:>6} | {:>8} | {:>4} | {:<9} | {:>9.1} | {:>9.1} | {:>16.4} |",
            row.case,
            row.shape.tokens,
            row.shape.adapters,
            row.shape.rank,
            row.w,
            row.base_us,
            row.sgmv_us,
            (row.base_us + row.sgmv_us) / row.base_us
        );
    }
    if gpu.is_none() {
        println!("\nno CUDA device: only the CPU half ran (exit status 2)");
    }
    Ok(all_ok)
}
