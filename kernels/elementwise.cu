// Elementwise kernels: fill, ReLU, adds, bias, dropout and the step counter.
// CPU twins: src/engine/cpu/ops/elementwise.rs (relu_*, add, add_assign, bias_*, dropout_*),
// src/rng.rs (mix64, uniform), src/engine/cpu/mod.rs (fill, advance).

#include "common.cuh"

// SplitMix64's finaliser (rng::mix64).
__device__ __forceinline__ u64 mix64(u64 z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// A uniform float in [0, 1) from (seed, counter, index), bit for bit rng::uniform.
__device__ __forceinline__ float uniform(u64 seed, u64 counter, u64 index)
{
    u64 h = mix64(seed ^ mix64((counter + 0x9e3779b97f4a7c15ULL) ^ mix64(index)));
    // The 24 high bits convert to float exactly; the scale is a power of two.
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

// The dropout stream of `layer` at the step the counter holds (engine::dropout_stream).
__device__ __forceinline__ u64 dropout_stream(const unsigned int* counter, unsigned int layer)
{
    return ((u64)*counter << 16) | (u64)layer;
}

// v/(1-p) where element i is kept, else 0; v itself when p == 0 (ops::dropout_one).
__device__ __forceinline__ float dropout_one(float v, float p, u64 seed, u64 stream, u64 i)
{
    if (p == 0.0f) {
        return v;
    }
    return uniform(seed, stream, i) >= p ? v / (1.0f - p) : 0.0f;
}

extern "C" __global__ void fill(float* x, float v, unsigned int n)
{
    FOR_EACH(u64, i, n) { x[i] = v; }
}

extern "C" __global__ void relu_fwd(const float* x, float* y, unsigned int n)
{
    // fmaxf, like f32::max, returns the other operand when one is NaN.
    FOR_EACH(u64, i, n) { y[i] = fmaxf(x[i], 0.0f); }
}

extern "C" __global__ void relu_bwd(const float* y, const float* dy, float* dx, unsigned int n)
{
    FOR_EACH(u64, i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// y = a + b (a residual connection; ops::add).
extern "C" __global__ void add(const float* a, const float* b, float* y, unsigned int n)
{
    FOR_EACH(u64, i, n) { y[i] = a[i] + b[i]; }
}

// y += x (a gradient reaching a tensor by a second path; ops::add_assign).
extern "C" __global__ void add_assign(float* y, const float* x, unsigned int n)
{
    FOR_EACH(u64, i, n) { y[i] += x[i]; }
}

template <typename I>
__device__ void bias_add_body(float* y, const float* b, I rows, I cols)
{
    FOR_EACH(I, i, rows * cols) { y[i] += b[i % cols]; }
}

extern "C" __global__ void bias_add(float* y, const float* b, unsigned int rows, unsigned int cols)
{
    if (fits32((u64)rows * cols)) {
        bias_add_body<unsigned int>(y, b, rows, cols);
    } else {
        bias_add_body<u64>(y, b, rows, cols);
    }
}

// One thread per column, rows summed in order from 0 (ops::bias_grad).
extern "C" __global__ void bias_grad(const float* dy, float* db, unsigned int rows,
                                     unsigned int cols)
{
    FOR_EACH(u64, c, cols)
    {
        float s = 0.0f;
        for (u64 r = 0; r < rows; ++r) {
            s += dy[r * cols + c];
        }
        db[c] = s;
    }
}

template <typename I>
__device__ void bias_add_fused_body(float* y, const float* b, I rows, I cols, I trials, I stride)
{
    const I per = rows * cols;
    FOR_EACH(I, i, per * trials) { y[i] += b[(i / per) * stride + i % cols]; }
}

// bias_add per trial t: y + t·rows·cols gets the bias at b + t·stride (ops::bias_add_fused).
extern "C" __global__ void bias_add_fused(float* y, const float* b, unsigned int rows,
                                          unsigned int cols, unsigned int trials,
                                          unsigned int stride)
{
    if (fits32((u64)rows * cols * trials) && fits32((u64)trials * stride)) {
        bias_add_fused_body<unsigned int>(y, b, rows, cols, trials, stride);
    } else {
        bias_add_fused_body<u64>(y, b, rows, cols, trials, stride);
    }
}

// bias_grad per trial t, one thread per (trial, column), rows summed in order from 0: the
// gradient of dy + t·rows·cols into db + t·stride (ops::bias_grad_fused).
extern "C" __global__ void bias_grad_fused(const float* dy, float* db, unsigned int rows,
                                           unsigned int cols, unsigned int trials,
                                           unsigned int stride)
{
    FOR_EACH(u64, j, (u64)cols * trials)
    {
        const u64 t = j / cols, c = j % cols;
        const float* d = dy + t * rows * cols;
        float s = 0.0f;
        for (u64 r = 0; r < rows; ++r) {
            s += d[r * cols + c];
        }
        db[t * stride + c] = s;
    }
}

// bias_add_fused, then with relu y = max(y, 0): a dense layer's epilogue after its GEMMs
// (ops::bias_act_fused), one pass over the trials' outputs.
template <typename I>
__device__ void bias_act_fused_body(float* y, const float* b, I rows, I cols, I trials, I stride,
                                    bool relu)
{
    const I per = rows * cols;
    FOR_EACH(I, i, per * trials)
    {
        const float v = y[i] + b[(i / per) * stride + i % cols];
        y[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

extern "C" __global__ void bias_act_fused(float* y, const float* b, unsigned int rows,
                                          unsigned int cols, unsigned int trials,
                                          unsigned int stride, unsigned int relu)
{
    if (fits32((u64)rows * cols * trials) && fits32((u64)trials * stride)) {
        bias_act_fused_body<unsigned int>(y, b, rows, cols, trials, stride, relu != 0u);
    } else {
        bias_act_fused_body<u64>(y, b, rows, cols, trials, stride, relu != 0u);
    }
}

// dx = dx · [y > 0] in place, then bias_grad_fused of it: one thread per (trial, column), rows
// in order from 0 (ops::relu_bias_grad_fused), so the sums match the twin's bit for bit.
extern "C" __global__ void relu_bias_grad_fused(const float* y, float* dx, float* db,
                                                unsigned int rows, unsigned int cols,
                                                unsigned int trials, unsigned int stride)
{
    FOR_EACH(u64, j, (u64)cols * trials)
    {
        const u64 t = j / cols, c = j % cols;
        const u64 base = t * rows * cols + c;
        float s = 0.0f;
        for (u64 r = 0; r < rows; ++r) {
            const u64 e = base + r * cols;
            const float d = y[e] > 0.0f ? dx[e] : 0.0f;
            dx[e] = d;
            s += d;
        }
        db[t * stride + c] = s;
    }
}

// Element i applies element first + i of the mask (a data-parallel shard's place in the batch).
extern "C" __global__ void dropout_fwd(const float* x, float* y, unsigned int n, float p,
                                       u64 seed, const unsigned int* counter, unsigned int layer,
                                       u64 first)
{
    const u64 stream = dropout_stream(counter, layer);
    FOR_EACH(u64, i, n) { y[i] = dropout_one(x[i], p, seed, stream, first + i); }
}

// dropout over a fused group: trial t = i / len with the rate and seed of its row of the hyper
// table, at its own step (the counter less its row's step0) (CpuBackend::dropout_fused:
// ops::dropout_fwd per trial, bit for bit).
extern "C" __global__ void dropout_fused(const float* src, float* dst, unsigned int len,
                                         unsigned int trials, const float* hyper,
                                         const unsigned int* counter, unsigned int layer,
                                         u64 first)
{
    if (len == 0) {
        return;
    }
    const unsigned int count = *counter;
    FOR_EACH(u64, i, (u64)len * trials)
    {
        const u64 t = i / len;
        const float* h = hyper + t * HYPER_LEN;
        const u64 seed = (u64)__float_as_uint(h[HYPER_SEED_LO]) |
                         ((u64)__float_as_uint(h[HYPER_SEED_HI]) << 32);
        const unsigned int steps = count - __float_as_uint(h[HYPER_STEP0]);
        const u64 stream = ((u64)steps << 16) | (u64)layer;
        dst[i] = dropout_one(src[i], h[HYPER_DROPOUT], seed, stream, first + (i - t * len));
    }
}

extern "C" __global__ void dropout_bwd(const float* dy, float* dx, unsigned int n, float p,
                                       u64 seed, const unsigned int* counter, unsigned int layer,
                                       u64 first)
{
    const u64 stream = dropout_stream(counter, layer);
    FOR_EACH(u64, i, n) { dx[i] = dropout_one(dy[i], p, seed, stream, first + i); }
}

// Adds one to the step counter (wrapping); only thread 0 of block 0 acts, whatever the launch.
extern "C" __global__ void advance(unsigned int* counter)
{
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0 &&
        threadIdx.y == 0 && threadIdx.z == 0) {
        *counter += 1u;
    }
}
