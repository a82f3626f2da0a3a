// SGMV shrink and expand for batched multi-adapter LoRA, compiled at run time by NVRTC.
//
// No headers: bf16 is passed as its 16 raw bits (unsigned short) and widened by a shift, so
// NVRTC needs no CUDA include path on the machine that runs this.
//
// Work is indexed by "batch rows": for each row of each segment the host builds
// blk_seg[b] (segment of that row) and blk_row[b] (the row in the batch). Per segment:
// seg_start, seg_adapter, v_off (offset of its len × rank block in v). Per adapter: a_ptr
// (rank × d_in), bt_ptr (rank × d_out, B transposed), rank, scale.
//
// Every output element is reduced in a fixed order that depends only on d_in / rank (lane
// stride, then a fixed shuffle tree), never on the batch around it: same bits for the same row
// whatever its neighbours, on a given GPU and NVRTC version.

typedef unsigned short bf16_bits;

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(bf16_bits v) { return __uint_as_float(((unsigned int)v) << 16); }

// v[row, k] = sum_d x[row, d] * A[k, d].
// Grid (batch rows, ceil(max rank / RANKS_PER_BLOCK)); a block of 256 threads is 8 warps:
// RANKS_PER_BLOCK ranks, each split over SPLIT warps that take fixed quarters of d_in, the
// quarters added in a fixed order. Splitting d_in keeps enough warps in flight for decode
// batches (few rows), where one warp per rank would leave most of the GPU idle.
#define RANKS_PER_BLOCK 2
#define SPLIT 4
template <typename X, typename W>
__device__ void shrink(const X* __restrict__ x, int d_in, const int* __restrict__ blk_seg,
                       const int* __restrict__ blk_row, const int* __restrict__ seg_start,
                       const int* __restrict__ seg_adapter, const long long* __restrict__ v_off,
                       const unsigned long long* __restrict__ a_ptr, const int* __restrict__ ranks,
                       float* __restrict__ v) {
    __shared__ float partial[RANKS_PER_BLOCK * SPLIT];
    const int b = blockIdx.x;
    const int s = blk_seg[b];
    const int row = blk_row[b];
    const int ad = seg_adapter[s];
    const int r = ranks[ad];
    const W* A = reinterpret_cast<const W*>(a_ptr[ad]);
    const X* xr = x + (long long)row * d_in;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int k = blockIdx.y * RANKS_PER_BLOCK + warp / SPLIT;
    const int part = warp % SPLIT;
    const int chunk = (d_in + SPLIT - 1) / SPLIT;
    const int d0 = part * chunk;
    const int d1 = min(d_in, d0 + chunk);
    float acc = 0.f;
    if (k < r) {
        const W* ak = A + (long long)k * d_in;
        for (int d = d0 + lane; d < d1; d += 32) acc = fmaf(widen(xr[d]), widen(ak[d]), acc);
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    }
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (threadIdx.x < RANKS_PER_BLOCK) {
        const int kk = blockIdx.y * RANKS_PER_BLOCK + threadIdx.x;
        if (kk < r) {
            const float* p = partial + threadIdx.x * SPLIT;
            float* vr = v + v_off[s] + (long long)(row - seg_start[s]) * r;
            vr[kk] = (p[0] + p[1]) + (p[2] + p[3]);  // the SPLIT (= 4) quarters, fixed order
        }
    }
}

// y[row, j] += scale * sum_k v[row, k] * Bt[k, j]; grid (batch rows, ceil(d_out / blockDim.x)):
// rows on x, whose limit is 2^31 - 1 (y is limited to 65535).
template <typename W>
__device__ void expand(const float* __restrict__ v, int d_out, const int* __restrict__ blk_seg,
                       const int* __restrict__ blk_row, const int* __restrict__ seg_start,
                       const int* __restrict__ seg_adapter, const long long* __restrict__ v_off,
                       const unsigned long long* __restrict__ bt_ptr, const int* __restrict__ ranks,
                       const float* __restrict__ scales, float* __restrict__ y) {
    const int b = blockIdx.x;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= d_out) return;
    const int s = blk_seg[b];
    const int row = blk_row[b];
    const int ad = seg_adapter[s];
    const int r = ranks[ad];
    const W* Bt = reinterpret_cast<const W*>(bt_ptr[ad]);
    const float* vr = v + v_off[s] + (long long)(row - seg_start[s]) * r;
    float acc = 0.f;
    for (int k = 0; k < r; ++k) acc = fmaf(vr[k], widen(Bt[(long long)k * d_out + j]), acc);
    y[(long long)row * d_out + j] += scales[ad] * acc;
}

#define SHRINK(NAME, X, W)                                                                      \
    extern "C" __global__ void NAME(const X* x, int d_in, const int* blk_seg, const int* blk_row, \
                                    const int* seg_start, const int* seg_adapter,                \
                                    const long long* v_off, const unsigned long long* a_ptr,     \
                                    const int* ranks, float* v) {                                \
        shrink<X, W>(x, d_in, blk_seg, blk_row, seg_start, seg_adapter, v_off, a_ptr, ranks, v); \
    }

SHRINK(sgmv_shrink_f32_f32, float, float)
SHRINK(sgmv_shrink_f32_bf16, float, bf16_bits)
SHRINK(sgmv_shrink_bf16_f32, bf16_bits, float)
SHRINK(sgmv_shrink_bf16_bf16, bf16_bits, bf16_bits)

#define EXPAND(NAME, W)                                                                         \
    extern "C" __global__ void NAME(const float* v, int d_out, const int* blk_seg,               \
                                    const int* blk_row, const int* seg_start,                    \
                                    const int* seg_adapter, const long long* v_off,              \
                                    const unsigned long long* bt_ptr, const int* ranks,          \
                                    const float* scales, float* y) {                             \
        expand<W>(v, d_out, blk_seg, blk_row, seg_start, seg_adapter, v_off, bt_ptr, ranks,     \
                  scales, y);                                                                    \
    }

EXPAND(sgmv_expand_f32, float)
EXPAND(sgmv_expand_bf16, bf16_bits)
