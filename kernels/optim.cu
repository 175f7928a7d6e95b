// Optimiser steps, elementwise over the parameters. CPU twins: ops::sgd_step, ops::adam_step,
// ops::sgd_step_batched, ops::adam_step_batched (and, with `advance`, CpuBackend::advance after
// them).
// The module is compiled with --fmad=false, so each product and sum rounds separately in the
// twin's order of operations.

#include "common.cuh"

// With `advance` given (the step counter: [count, ticket]), the last block of the grid to finish
// adds one to the count, so that an optimizer step and the step's advance are one launch
// (Backend::update; ops::advance's twin). Each block, once all its threads are done, counts
// itself on the ticket; the one that makes it gridDim.x resets the ticket and advances the count,
// after every block has read the count it uses. Every thread of the block calls it.
__device__ void advance_when_done(unsigned int* advance)
{
    if (advance == 0) {
        return;
    }
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        __threadfence();
        const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
        const unsigned int done = atomicAdd(advance + 1, 1u);
        if (done == blocks - 1u) {
            advance[1] = 0u;
            advance[0] += 1u;
            __threadfence();
        }
    }
}

// PyTorch SGD: g' = g + wd·w; v = μ·v + g' (v = g' when μ == 0, v not read); w −= lr·v.
extern "C" __global__ void sgd_step(float* w, const float* g, float* v, unsigned int n, float lr,
                                    float momentum, float wd, unsigned int* advance)
{
    FOR_EACH(u64, i, n)
    {
        const float gi = g[i] + wd * w[i];
        const float vi = momentum == 0.0f ? gi : momentum * v[i] + gi;
        v[i] = vi;
        w[i] -= lr * vi;
    }
    advance_when_done(advance);
}

// x^t by binary powering, the algorithm (and rounding) of Rust's f32::powi.
__device__ float powi(float x, unsigned int t)
{
    float r = 1.0f;
    for (;;) {
        if (t & 1u) {
            r *= x;
        }
        t >>= 1;
        if (t == 0) {
            return r;
        }
        x *= x;
    }
}

// PyTorch Adam (L2 weight decay added to the gradient) at step t = *counter + 1:
// g' = g + wd·w; m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·g'²;
// w −= lr·(m/(1−β1^t)) / (sqrt(v/(1−β2^t)) + eps).
extern "C" __global__ void adam_step(float* w, const float* g, float* m, float* v, unsigned int n,
                                     float lr, float b1, float b2, float eps, float wd,
                                     const unsigned int* counter, unsigned int* advance)
{
    unsigned int t = *counter + 1u;
    // The twin converts t to i32, saturating.
    t = t > 0x7fffffffu ? 0x7fffffffu : t;
    const float bc1 = 1.0f - powi(b1, t), bc2 = 1.0f - powi(b2, t);
    FOR_EACH(u64, i, n)
    {
        const float gi = g[i] + wd * w[i];
        const float mi = b1 * m[i] + (1.0f - b1) * gi;
        const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
    advance_when_done(advance);
}

// The hyper table of a fused group: HYPER_* in common.cuh.

// sgd_step over n = trials·params elements: element i belongs to trial i / params and uses the
// lr, momentum and wd of that trial's row of hyper; a trial with live == 0 is left untouched.
extern "C" __global__ void sgd_step_batched(float* w, const float* g, float* v, unsigned int n,
                                            unsigned int params, const float* hyper,
                                            unsigned int* advance)
{
    FOR_EACH(u64, i, n)
    {
        const float* h = hyper + (i / params) * HYPER_LEN;
        if (h[HYPER_LIVE] == 0.0f) {
            continue;
        }
        const float lr = h[HYPER_LR], momentum = h[HYPER_MOMENTUM], wd = h[HYPER_WD];
        const float gi = g[i] + wd * w[i];
        const float vi = momentum == 0.0f ? gi : momentum * v[i] + gi;
        v[i] = vi;
        w[i] -= lr * vi;
    }
    advance_when_done(advance);
}

// adam_step over n = trials·params elements, each trial at its own step t = *counter - step0 + 1
// (step0: the counter when it started) with the lr, betas, eps and wd of its row of hyper; a
// trial with live == 0 is left untouched.
extern "C" __global__ void adam_step_batched(float* w, const float* g, float* m, float* v,
                                             unsigned int n, unsigned int params,
                                             const float* hyper, const unsigned int* counter,
                                             unsigned int* advance)
{
    const unsigned int count = *counter;
    FOR_EACH(u64, i, n)
    {
        const float* h = hyper + (i / params) * HYPER_LEN;
        if (h[HYPER_LIVE] == 0.0f) {
            continue;
        }
        unsigned int t = count - __float_as_uint(h[HYPER_STEP0]) + 1u;
        t = t > 0x7fffffffu ? 0x7fffffffu : t;
        const float lr = h[HYPER_LR], b1 = h[HYPER_BETA1], b2 = h[HYPER_BETA2];
        const float eps = h[HYPER_EPS], wd = h[HYPER_WD];
        const float bc1 = 1.0f - powi(b1, t), bc2 = 1.0f - powi(b2, t);
        const float gi = g[i] + wd * w[i];
        const float mi = b1 * m[i] + (1.0f - b1) * gi;
        const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
    advance_when_done(advance);
}
