//! Quantizers for the block formats of `quant` that `--quantize` writes (Q8_0, Q4_0, Q5_0 as
//! ggml's reference quantizers do; Q4_K by a weighted least-squares fit per sub-block): each
//! function fills one block's bytes from its elements.

use half::f16;

use crate::quant::{QK_K, half_at};

fn put_half(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = round(x / d)`.
pub(crate) fn q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_half(b, 0, d);
    for (q, v) in b[2..34].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

/// ggml's `quantize_row_q4_0_ref`: the signed extreme maps to −8.
pub(crate) fn q4_0(x: &[f32], b: &mut [u8]) {
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_half(b, 0, d);
    for j in 0..16 {
        let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let hi = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = lo | (hi << 4);
    }
}

/// ggml's `quantize_row_q5_0_ref`: the signed extreme maps to −16, the fifth bits packed into
/// `qh`.
pub(crate) fn q5_0(x: &[f32], b: &mut [u8]) {
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_half(b, 0, d);
    let mut qh = 0u32;
    for j in 0..16 {
        let lo = ((x[j] * id + 16.5) as i8).min(31) as u8;
        let hi = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
        b[6 + j] = (lo & 0xF) | ((hi & 0xF) << 4);
        qh |= u32::from((lo & 0x10) >> 4) << j;
        qh |= u32::from((hi & 0x10) >> 4) << (j + 16);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

/// A sub-block's affine 4-bit fit `x ≈ scale·q − min` (`q` in 0..=15, `min ≥ 0`), chosen as
/// ggml's reference chooses it: a few candidate grids around the plain min/max one, each with
/// its levels rounded and then the (scale, min) solved by weighted least squares, the one with
/// the least weighted squared error kept. Weights favour large magnitudes (`rms + |x|`), as the
/// reference's do, since they matter most to a product.
fn fit_sub_block(x: &[f32]) -> (f32, f32) {
    const NMAX: f32 = 15.0;
    let lo = x.iter().fold(0f32, |m, &v| m.min(v));
    let hi = x.iter().fold(f32::MIN, |m, &v| m.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    let w: Vec<f32> = x.iter().map(|v| rms + v.abs()).collect();
    let error = |scale: f32, min: f32| -> f32 {
        x.iter()
            .zip(&w)
            .map(|(&v, &wi)| {
                let q = if scale > 0.0 {
                    ((v - min) / scale).round().clamp(0.0, NMAX)
                } else {
                    0.0
                };
                let d = scale * q + min - v;
                wi * d * d
            })
            .sum()
    };
    // Candidates: `min` here is the (non-positive) offset `x ≈ scale·q + min`.
    let mut best = ((hi - lo) / NMAX, lo);
    let mut best_error = error(best.0, best.1);
    for step in 0..=20 {
        let iscale = (NMAX - 1.0 + 0.1 * step as f32) / (hi - lo);
        let (mut sw, mut sl, mut sl2, mut sxl, mut sx) = (0f32, 0f32, 0f32, 0f32, 0f32);
        for (&v, &wi) in x.iter().zip(&w) {
            let l = (iscale * (v - lo)).round().clamp(0.0, NMAX);
            sw += wi;
            sl += wi * l;
            sl2 += wi * l * l;
            sxl += wi * l * v;
            sx += wi * v;
        }
        let det = sw * sl2 - sl * sl;
        if det <= 0.0 {
            continue;
        }
        let mut scale = (sw * sxl - sx * sl) / det;
        let mut min = (sl2 * sx - sl * sxl) / det;
        if min > 0.0 {
            min = 0.0;
            scale = if sl2 > 0.0 { sxl / sl2 } else { 0.0 };
        }
        if scale <= 0.0 {
            continue;
        }
        let e = error(scale, min);
        if e < best_error {
            best = (scale, min);
            best_error = e;
        }
    }
    (best.0, -best.1)
}

/// Q4_K: each sub-block of 32 gets its fit ([`fit_sub_block`]), the 8 scales and mins are then
/// quantized to 6 bits against the super-block's largest (`d`, `dmin` in f16), and the nibbles
/// chosen against the scales as a reader rebuilds them.
pub(crate) fn q4_k(x: &[f32], b: &mut [u8]) {
    let mut scale = [0f32; 8];
    let mut mins = [0f32; 8];
    for s in 0..8 {
        (scale[s], mins[s]) = fit_sub_block(&x[32 * s..32 * s + 32]);
    }
    let max_scale = scale.iter().fold(0f32, |m, &v| m.max(v));
    let max_min = mins.iter().fold(0f32, |m, &v| m.max(v));
    let d = max_scale / 63.0;
    let dmin = max_min / 63.0;
    let (id, idmin) = (
        if d > 0.0 { 1.0 / d } else { 0.0 },
        if dmin > 0.0 { 1.0 / dmin } else { 0.0 },
    );
    let ls: [u8; 8] = std::array::from_fn(|s| (scale[s] * id).round().min(63.0) as u8);
    let lm: [u8; 8] = std::array::from_fn(|s| (mins[s] * idmin).round().min(63.0) as u8);
    put_half(b, 0, d);
    put_half(b, 2, dmin);
    let scales = &mut b[4..16];
    for j in 0..8 {
        if j < 4 {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            scales[j - 4] |= (ls[j] >> 4) << 6;
            scales[j] |= (lm[j] >> 4) << 6;
        }
    }
    // The nibbles against the scales as a reader will rebuild them (f16 d and dmin).
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let mut q = [0u8; QK_K];
    for s in 0..8 {
        let sd = d * f32::from(ls[s]);
        let sm = dmin * f32::from(lm[s]);
        for l in 0..32 {
            let v = x[32 * s + l];
            q[32 * s + l] = if sd > 0.0 {
                ((v + sm) / sd).round().clamp(0.0, 15.0) as u8
            } else {
                0
            };
        }
    }
    let qs = &mut b[16..144];
    for c in 0..4 {
        for l in 0..32 {
            qs[32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
        }
    }
}
