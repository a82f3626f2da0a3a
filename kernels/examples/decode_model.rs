//! A whole model's base projections at decode, past the caches: `cargo run --release -p
//! cx-kernels --example decode_model [hidden] [kv_dim] [intermediate] [layers] [threads]
//! [repeats] [bf16|f32|q8_0|q5_0|q4_k|…] [rows]` (defaults: SmolLM2-135M's shape in bf16, one
//! row: 576, 192, 1536, 30, 2, 20). A ggml type quantizes every matrix to it, or where a row is
//! not whole blocks of it to `q5_0`, as `llama-quantize` falls back. The deterministic kernels
//! run unless `FAST=1` (the fast mode's `f32` kernels), `INT8=1` (its eight-bit products,
//! `CpuConfig::int8`) or `BF16_DOT=1` (its bf16 products, `CpuConfig::bf16_dot`).
//!
//! Each layer's q/k/v and gate/up go through one [`gemm_xwt_many`] pass each (as the provider
//! runs them), o and down one each, then the head (`hidden × 49152`). It prints the step's
//! time, its weight bytes read per second, and a plain parallel read of the same bytes (one
//! sequential stream per thread) measured in the same run: what a step bound by reading the
//! weights could reach. The layers together are far larger than any cache, as in serving,
//! where [`decode_layer`](decode_layer.rs) times one layer again and again.

use cx_kernels::bench::median_seconds;
use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{CpuConfig, Mode, QuantMatrix, QuantType, WeightView, bf16, gemm_xwt_many};

enum Held {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    Quant(QuantMatrix),
}

impl Held {
    fn view(&self) -> WeightView<'_> {
        match self {
            Held::F32(w) => WeightView::F32(w),
            Held::Bf16(w) => WeightView::Bf16(w),
            Held::Quant(w) => WeightView::Quant(w),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Held::F32(w) => w.len() * 4,
            Held::Bf16(w) => w.len() * 2,
            Held::Quant(w) => w.data().len(),
        }
    }

    fn rows(&self, d_in: usize) -> usize {
        match self {
            Held::F32(w) => w.len() / d_in,
            Held::Bf16(w) => w.len() / d_in,
            Held::Quant(w) => w.d_out(),
        }
    }

    /// Reads every element once (an integer sum of the bits, which vectorises).
    fn read(&self, part: usize, parts: usize) -> u32 {
        fn sum<T: Copy>(w: &[T], part: usize, parts: usize, bits: impl Fn(T) -> u32) -> u32 {
            let chunk = w.len().div_ceil(parts);
            let range = (part * chunk).min(w.len())..((part + 1) * chunk).min(w.len());
            w[range].iter().fold(0u32, |s, &v| s.wrapping_add(bits(v)))
        }
        match self {
            Held::F32(w) => sum(w, part, parts, f32::to_bits),
            Held::Bf16(w) => sum(w, part, parts, |v| u32::from(v.to_bits())),
            Held::Quant(w) => sum(w.data(), part, parts, u32::from),
        }
    }
}

fn main() -> Result<(), cx_kernels::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num =
        |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (hidden, kv, inter, layers) = (num(0, 576), num(1, 192), num(2, 1536), num(3, 30));
    let (threads, repeats) = (num(4, 2), num(5, 20));
    let kind = args.get(6).map_or("bf16", String::as_str);
    let quant = QuantType::from_name(kind);
    let rows = num(7, 1);
    let mut rng = seeded(7);
    let mut make = |d_out: usize, d_in: usize| {
        let w = rng.vec_f32(d_out * d_in, 0.02);
        match (kind, quant) {
            ("f32", _) => Held::F32(w),
            (_, Some(q)) => {
                let q = if d_in.is_multiple_of(q.block_elements()) {
                    q
                } else {
                    QuantType::Q5_0
                };
                Held::Quant(QuantMatrix::quantize(q, &w, d_out, d_in).expect("whole blocks"))
            }
            _ => Held::Bf16(w.into_iter().map(bf16::from_f32).collect()),
        }
    };
    // Per layer: q, k, v, o, gate, up, down, as `d_out × d_in`.
    let model: Vec<[Held; 7]> = (0..layers)
        .map(|_| {
            [
                make(hidden, hidden),
                make(kv, hidden),
                make(kv, hidden),
                make(hidden, hidden),
                make(inter, hidden),
                make(inter, hidden),
                make(hidden, inter),
            ]
        })
        .collect();
    let head = make(
        std::env::var("HEAD")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(49152),
        hidden,
    );
    let bytes: usize = model.iter().flatten().map(Held::bytes).sum::<usize>() + head.bytes();
    let flag = |name| std::env::var_os(name).is_some_and(|v| v == "1");
    let (int8, bf16_dot) = (flag("INT8"), flag("BF16_DOT"));
    let config = CpuConfig {
        mode: if int8 || bf16_dot || flag("FAST") {
            Mode::Fast
        } else {
            Mode::Deterministic
        },
        int8,
        bf16_dot,
        ..CpuConfig::default()
    }
    .with_threads(threads);
    let x = rng.vec_f32(rows * inter, 1.0);
    let (mut q, mut k, mut v, mut o) = (
        vec![0f32; rows * hidden],
        vec![0f32; rows * kv],
        vec![0f32; rows * kv],
        vec![0f32; rows * hidden],
    );
    let (mut gate, mut up, mut down) = (
        vec![0f32; rows * inter],
        vec![0f32; rows * inter],
        vec![0f32; rows * hidden],
    );
    let head_rows = head.rows(hidden);
    let mut logits = vec![0f32; rows * head_rows];
    let mut error = None;
    let step_s = median_seconds(repeats, || {
        let (xh, xi) = (&x[..rows * hidden], &x[..rows * inter]);
        let mut run = |products: &mut [(WeightView<'_>, &mut [f32])], x: &[f32], d_in: usize| {
            if let Err(e) = gemm_xwt_many(x, rows, d_in, products, &config) {
                error = Some(e);
            }
        };
        for [wq, wk, wv, wo, wg, wu, wd] in &model {
            run(
                &mut [
                    (wq.view(), &mut q),
                    (wk.view(), &mut k),
                    (wv.view(), &mut v),
                ],
                xh,
                hidden,
            );
            run(&mut [(wo.view(), &mut o)], xh, hidden);
            run(
                &mut [(wg.view(), &mut gate), (wu.view(), &mut up)],
                xh,
                hidden,
            );
            run(&mut [(wd.view(), &mut down)], xi, inter);
        }
        run(&mut [(head.view(), &mut logits)], xh, hidden);
    });
    if let Some(e) = error {
        return Err(e);
    }
    let weights: Vec<&Held> = model.iter().flatten().chain([&head]).collect();
    let read_s = median_seconds(repeats, || {
        std::thread::scope(|scope| {
            for t in 0..threads {
                let weights = &weights;
                scope.spawn(move || {
                    std::hint::black_box(
                        weights
                            .iter()
                            .fold(0u32, |s, w| s.wrapping_add(w.read(t, threads))),
                    )
                });
            }
        });
    });
    println!(
        "{kind} ({:?}{}{}) weights {:.1} MB, {rows} row(s), {threads} threads: step {:.2} ms = {:.1} GB/s; parallel read {:.2} ms = {:.1} GB/s; step/read {:.2}",
        config.mode,
        if config.int8 { ", int8" } else { "" },
        if config.bf16_dot { ", bf16 dot" } else { "" },
        bytes as f64 / 1e6,
        step_s * 1e3,
        bytes as f64 / step_s / 1e9,
        read_s * 1e3,
        bytes as f64 / read_s / 1e9,
        read_s / step_s
    );
    Ok(())
}
