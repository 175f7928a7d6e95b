// Convolution lowering over the whole batch: im2col/col2im and the layout changes around the GEMMs.
// CPU twins: src/engine/cpu/im2col.rs (im2col, col2im, per sample) and ops::conv2d_fwd/conv2d_bwd
// (bias add, bias gradient, and a fused group's weight gradient that split_k_sum adds up).
// Zero padding and a stride: h_out = (h + 2·pad − k)/stride + 1, and the same for w_out
// (engine::shapes).

#include "common.cuh"

// The sizes shared by im2col and col2im.
struct ConvSizes {
    unsigned int n, c_in, h, w, k, pad, stride, h_out, w_out;

    // The window along either axis (square kernels).
    __device__ __forceinline__ Window<long long> window() const
    {
        return Window<long long>{(long long)k, (long long)stride, (long long)pad};
    }
};

// The column-matrix entry `e` of im2col's `col`, from `x`.
template <typename I>
__device__ __forceinline__ float im2col_entry(const float* x, ConvSizes s, I e)
{
    const I cols = (I)s.n * s.h_out * s.w_out, kk = (I)s.k * s.k;
    {
        const I row = e / cols, j = e - row * cols;
        const I ci = row / kk;
        const unsigned int r = (unsigned int)(row - ci * kk), ky = r / s.k, kx = r - ky * s.k;
        const I bo = j / s.w_out, b = bo / s.h_out;
        const unsigned int ox = (unsigned int)(j - bo * s.w_out);
        const unsigned int oy = (unsigned int)(bo - b * s.h_out);
        const Window<long long> win = s.window();
        const long long iy = win.input(oy, ky), ix = win.input(ox, kx);
        float v = 0.0f;
        if (iy >= 0 && iy < s.h && ix >= 0 && ix < s.w) {
            v = x[((b * s.c_in + ci) * s.h + (I)iy) * s.w + (I)ix];
        }
        return v;
    }
}

template <typename I>
__device__ void im2col_body(const float* x, float* col, ConvSizes s)
{
    FOR_EACH(I, e, (I)s.c_in * s.k * s.k * s.n * s.h_out * s.w_out)
    {
        col[e] = im2col_entry<I>(x, s, e);
    }
}

// col[(ci·k·k + ky·k + kx)][(b·h_out + oy)·w_out + ox]
//   = x[b, ci, oy·stride + ky − pad, ox·stride + kx − pad], 0 outside.
// One thread per column-matrix entry, consecutive threads along ox.
extern "C" __global__ void im2col(const float* x, float* col, unsigned int n, unsigned int c_in,
                                  unsigned int h, unsigned int w, unsigned int k, unsigned int pad,
                                  unsigned int stride, unsigned int h_out, unsigned int w_out)
{
    if (stride == 0) {
        return;
    }
    const ConvSizes s = {n, c_in, h, w, k, pad, stride, h_out, w_out};
    if (fits32((u64)c_in * k * k * n * h_out * w_out)) {
        im2col_body<unsigned int>(x, col, s);
    } else {
        im2col_body<u64>(x, col, s);
    }
}

// The entry `e` of col2im's `dx`, from `col`.
template <typename I>
__device__ __forceinline__ float col2im_entry(const float* col, ConvSizes s, I e)
{
    const I cols = (I)s.n * s.h_out * s.w_out;
    {
        const I by = e / s.w, plane = by / s.h, b = plane / s.c_in;
        const long long ix = (long long)(e - by * s.w), iy = (long long)(by - plane * s.h);
        const I ci = plane - b * s.c_in;
        const Window<long long> win = s.window();
        float sum = 0.0f;
        for (unsigned int ky = 0; ky < s.k; ++ky) {
            // Read by output row oy when oy·stride + ky − pad = iy.
            const long long oy = win.output(iy, ky, s.h_out);
            if (oy < 0) {
                continue;
            }
            for (unsigned int kx = 0; kx < s.k; ++kx) {
                const long long ox = win.output(ix, kx, s.w_out);
                if (ox < 0) {
                    continue;
                }
                const I row = (ci * s.k + ky) * s.k + kx;
                sum += col[row * cols + (b * s.h_out + (I)oy) * s.w_out + (I)ox];
            }
        }
        return sum;
    }
}

template <typename I>
__device__ void col2im_body(const float* col, float* dx, ConvSizes s)
{
    FOR_EACH(I, e, (I)s.n * s.c_in * s.h * s.w)
    {
        dx[e] = col2im_entry<I>(col, s, e);
    }
}

// The adjoint of im2col: one thread per dx element, summing (from 0) the column entries read from
// it in (ky, kx) order, the order of the CPU twin; overwrites dx.
extern "C" __global__ void col2im(const float* col, float* dx, unsigned int n, unsigned int c_in,
                                  unsigned int h, unsigned int w, unsigned int k, unsigned int pad,
                                  unsigned int stride, unsigned int h_out, unsigned int w_out)
{
    if (stride == 0) {
        return;
    }
    const ConvSizes s = {n, c_in, h, w, k, pad, stride, h_out, w_out};
    // The column matrix is indexed too, and it may be larger than dx.
    const u64 col_len = (u64)c_in * k * k * n * h_out * w_out, dx_len = (u64)n * c_in * h * w;
    if (fits32(col_len > dx_len ? col_len : dx_len)) {
        col2im_body<unsigned int>(col, dx, s);
    } else {
        col2im_body<u64>(col, dx, s);
    }
}

template <typename I>
__device__ void nchw_to_cnhw_body(const float* src, float* dst, I n, I c, I hw)
{
    const I nhw = n * hw;
    FOR_EACH(I, e, nhw * c)
    {
        const I ch = e / nhw, rest = e - ch * nhw, b = rest / hw, j = rest - b * hw;
        dst[e] = src[(b * c + ch) * hw + j];
    }
}

// dst[ch][b·hw + j] = src[b][ch][j]; one thread per dst element.
extern "C" __global__ void nchw_to_cnhw(const float* src, float* dst, unsigned int n,
                                        unsigned int c, unsigned int hw)
{
    if (fits32((u64)n * c * hw)) {
        nchw_to_cnhw_body<unsigned int>(src, dst, n, c, hw);
    } else {
        nchw_to_cnhw_body<u64>(src, dst, n, c, hw);
    }
}

template <typename I>
__device__ void cnhw_to_nchw_bias_body(const float* src, const float* bias, float* dst, I n, I c,
                                       I hw)
{
    FOR_EACH(I, e, n * c * hw)
    {
        const I plane = e / hw, j = e - plane * hw, b = plane / c, ch = plane - b * c;
        const float v = src[(ch * n + b) * hw + j];
        dst[e] = bias ? v + bias[ch] : v;
    }
}

// dst[b][ch][j] = src[ch][b·hw + j] + bias[ch], or without the bias when `bias` is null; one
// thread per dst element.
extern "C" __global__ void cnhw_to_nchw_bias(const float* src, const float* bias, float* dst,
                                             unsigned int n, unsigned int c, unsigned int hw)
{
    if (fits32((u64)n * c * hw)) {
        cnhw_to_nchw_bias_body<unsigned int>(src, bias, dst, n, c, hw);
    } else {
        cnhw_to_nchw_bias_body<u64>(src, bias, dst, n, c, hw);
    }
}

// cnhw_to_nchw_bias over a fused group of `trials` trials of `n` samples each, its channel-major
// `src` over the whole group (`src[ch][(t·n + b)·hw + j]`): trial t's bias starts
// `t·bias_stride` elements in (none when `bias` is null), its `dst` t·n·c·hw elements in. One
// thread per element of every trial's `dst`.
extern "C" __global__ void cnhw_to_nchw_bias_fused(const float* src, const float* bias,
                                                   float* dst, unsigned int trials,
                                                   u64 bias_stride, unsigned int n, unsigned int c,
                                                   unsigned int hw)
{
    const u64 per = (u64)n * c * hw, row = (u64)trials * n * hw;
    FOR_EACH(u64, g, per * trials)
    {
        const u64 t = g / per, e = g - t * per;
        const u64 plane = e / hw, j = e - plane * hw, b = plane / c, ch = plane - b * c;
        const float v = src[ch * row + (t * n + b) * hw + j];
        dst[g] = bias ? v + bias[t * bias_stride + ch] : v;
    }
}

// dst[t·dst_stride + e] = Σ_{j < splits} part[(t·splits + j)·len + e], the parts added in order:
// a fused group's weight gradient from the partial sums of its split GEMM
// (src/engine/cuda/conv_group.rs). One thread per element of every trial's `dst`.
extern "C" __global__ void split_k_sum(const float* part, float* dst, unsigned int trials,
                                       unsigned int splits, unsigned int len, u64 dst_stride)
{
    FOR_EACH(u64, g, (u64)trials * len)
    {
        const u64 t = g / len, e = g - t * len;
        const float* p = part + t * splits * (u64)len + e;
        float sum = 0.0f;
        for (unsigned int j = 0; j < splits; ++j) {
            sum += p[(u64)j * len];
        }
        dst[t * dst_stride + e] = sum;
    }
}

template <typename I>
__device__ void channel_bias_body(float* y, const float* bias, I c, I hw, I total)
{
    FOR_EACH(I, e, total) { y[e] += bias[(e / hw) % c]; }
}

// y[b][ch][j] += bias[ch] over n·c·hw elements (the bias of a pointwise convolution, whose GEMMs
// write NCHW directly); one thread per element.
extern "C" __global__ void channel_bias(float* y, const float* bias, unsigned int n, unsigned int c,
                                        unsigned int hw)
{
    if (fits32((u64)n * c * hw)) {
        channel_bias_body<unsigned int>(y, bias, c, hw, n * c * hw);
    } else {
        channel_bias_body<u64>(y, bias, c, hw, (u64)n * c * hw);
    }
}

// Threads of a channel_sum block: one per sample of a chunk of the batch.
#define CHANNEL_SUM_THREADS 128

// The sum of channel `ch` over the `n` planes of NCHW `dy`, in sample order: each thread sums
// one sample's plane, and thread 0 adds the plane sums of the chunk in sample order (batches above
// blockDim.x go chunk by chunk). Every thread of the block calls it; thread 0's result is the sum.
__device__ float channel_total(const float* dy, unsigned int n, unsigned int c, unsigned int hw,
                               u64 ch, float* plane_sums)
{
    const unsigned int threads = blockDim.x;
    float total = 0.0f;
    for (u64 b0 = 0; b0 < n; b0 += threads) {
        const u64 b = b0 + threadIdx.x;
        float sum = 0.0f;
        if (b < n) {
            const float* plane = dy + (b * c + ch) * hw;
            for (unsigned int j = 0; j < hw; ++j) {
                sum += plane[j];
            }
        }
        plane_sums[threadIdx.x] = sum;
        __syncthreads();
        if (threadIdx.x == 0) {
            const u64 m = n - b0 < threads ? n - b0 : threads;
            for (u64 i = 0; i < m; ++i) {
                total += plane_sums[i];
            }
        }
        __syncthreads();
    }
    return total;
}

// db[ch] = Σ_b (Σ_j dy[b][ch][j]): each sample's plane summed in order, those sums added in
// sample order (ops::conv2d_bwd's bias gradient, bit for bit), over NCHW. One block per channel
// (grid-stride over channels), summed by channel_total.
extern "C" __global__ void __launch_bounds__(CHANNEL_SUM_THREADS)
    channel_sum(const float* dy, float* db, unsigned int n, unsigned int c, unsigned int hw)
{
    // __launch_bounds__ makes a launch of more than CHANNEL_SUM_THREADS threads fail.
    __shared__ float plane_sums[CHANNEL_SUM_THREADS];
    for (u64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const float total = channel_total(dy, n, c, hw, ch, plane_sums);
        if (threadIdx.x == 0) {
            db[ch] = total;
        }
    }
}

// channel_sum per trial `t < trials` of a fused group: trial t's `dy` starts t·n·c·hw elements
// in, its `db` `t·db_stride` elements in. One block per (trial, channel), each summed as
// channel_sum sums a channel (bit for bit).
extern "C" __global__ void __launch_bounds__(CHANNEL_SUM_THREADS)
    channel_sum_fused(const float* dy, float* db, unsigned int trials, u64 db_stride,
                      unsigned int n, unsigned int c, unsigned int hw)
{
    __shared__ float plane_sums[CHANNEL_SUM_THREADS];
    for (u64 tc = blockIdx.x; tc < (u64)trials * c; tc += gridDim.x) {
        const u64 t = tc / c, ch = tc - t * c;
        const float total = channel_total(dy + t * ((u64)n * c * hw), n, c, hw, ch, plane_sums);
        if (threadIdx.x == 0) {
            db[t * db_stride + ch] = total;
        }
    }
}
