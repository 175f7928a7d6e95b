// Optimiser steps, elementwise over the parameters. CPU twins: ops::sgd_step, ops::adam_step.
// The module is compiled with --fmad=false, so each product and sum rounds separately in the
// twin's order of operations.

#include "common.cuh"

// PyTorch SGD: g' = g + wd·w; v = μ·v + g' (v = g' when μ == 0, v not read); w −= lr·v.
extern "C" __global__ void sgd_step(float* w, const float* g, float* v, unsigned int n, float lr,
                                    float momentum, float wd)
{
    FOR_EACH(u64, i, n)
    {
        const float gi = g[i] + wd * w[i];
        const float vi = momentum == 0.0f ? gi : momentum * v[i] + gi;
        v[i] = vi;
        w[i] -= lr * vi;
    }
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
                                     const unsigned int* counter)
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
}
