// Per-channel ops over NCHW data seen as n × c planes of hw (n·c·hw < 2^32, checked by the
// launchers): batch normalisation and global average pooling. CPU twins: ops::batchnorm_fwd, ops::batchnorm_bwd, ops::avgpool_fwd,
// ops::avgpool_bwd (statistics accumulated in double, as the twins do in f64).
// The batch-norm reductions run one block per channel (blocks loop over channels when there are
// more channels than blocks): thread t takes the channel's values t, t + blockDim.x, ... in order,
// then a fixed-order shared-memory tree adds the per-thread sums, so results are the same on every
// run with the same blockDim (at most MAX_THREADS). Layers with few channels and large planes split
// each channel over several blocks instead (the *_partial kernels), whose partial sums the
// channel's last block adds in a fixed order, in the backend's reduction scratch; the number of
// blocks depends on the shape alone, so the results are the same on every GPU.

#include "common.cuh"

// Sums a and b over the block's threads with a fixed-order tree; every thread gets the totals.
// Ends with a barrier, so the shared arrays can be reused by the next call.
__device__ void block_sum2(double& a, double& b)
{
    __shared__ double s_a[MAX_THREADS], s_b[MAX_THREADS];
    s_a[threadIdx.x] = a;
    s_b[threadIdx.x] = b;
    block_tree2(s_a, s_b);
    a = s_a[0];
    b = s_b[0];
    __syncthreads();
}

// Index of value j (0..n·hw) of channel ch: sample j / hw, position j % hw. The launchers check
// that n·c·hw fits 32 bits, so the division is a 32-bit one.
__device__ __forceinline__ u64 at(u64 j, unsigned int ch, unsigned int c, unsigned int hw)
{
    const unsigned int jj = (unsigned int)j, b = jj / hw;
    return ((u64)b * c + ch) * hw + (jj - b * hw);
}

// Training: per channel, mean and biased variance over its n·hw values (two passes, in double);
// saved = [mean; c] ++ [1/√(var+eps); c]; running = (1−momentum)·running + momentum·batch, the
// variance unbiased by m/(m−1) when m > 1; y = gamma·((x − mean)·invstd) + beta in float with
// mean and invstd rounded to float.
extern "C" __global__ void __launch_bounds__(MAX_THREADS) batchnorm_fwd_train(const float* x, const float* gamma, const float* beta,
                                               float* running, float* saved, float* y,
                                               unsigned int n, unsigned int c, unsigned int hw,
                                               float momentum, float eps)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const u64 m = (u64)n * hw;
    for (unsigned int ch = blockIdx.x; ch < c; ch += gridDim.x) {
        double sum = 0.0, unused = 0.0;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            sum += (double)x[at(j, ch, c, hw)];
        }
        block_sum2(sum, unused);
        const double mean = sum / (double)m;
        double sq = 0.0;
        unused = 0.0;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const double d = (double)x[at(j, ch, c, hw)] - mean;
            sq += d * d;
        }
        block_sum2(sq, unused);
        const double var = sq / (double)m;
        const double invstd_d = 1.0 / sqrt(var + (double)eps);
        if (threadIdx.x == 0) {
            const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
            const double mom = (double)momentum;
            running[ch] = (float)((1.0 - mom) * (double)running[ch] + mom * mean);
            running[c + ch] = (float)((1.0 - mom) * (double)running[c + ch] + mom * unbiased);
            saved[ch] = (float)mean;
            saved[c + ch] = (float)invstd_d;
        }
        const float mf = (float)mean, invstd = (float)invstd_d, g = gamma[ch], bt = beta[ch];
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            y[i] = g * ((x[i] - mf) * invstd) + bt;
        }
    }
}

// The same statistics over many blocks a channel, for layers with few channels and large planes
// (one block a channel would leave most SMs idle): block (k, ch) of a grid of K × c blocks takes
// chunk k of the channel's m = n·hw values (values k·per .. (k+1)·per), its threads as above, and
// writes its partial sum to partials[ch·K + k]; the channel's last block to finish (its ticket)
// adds the K partials in order, so the result is the same on every run with the same launch.
// pass 0 sums the values and leaves the mean in means[ch]; pass 1 sums (x − mean)² and writes
// the statistics and running ones as batchnorm_fwd_train does; batchnorm_normalize then writes y.
// The tickets are zero between launches (the last block resets its channel's).
__device__ __forceinline__ bool last_of_channel(unsigned int* tickets, unsigned int ch,
                                                unsigned int blocks)
{
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(tickets + ch, 1u) == blocks - 1u;
        if (last) {
            tickets[ch] = 0u;
            __threadfence();
        }
    }
    __syncthreads();
    return last;
}

extern "C" __global__ void __launch_bounds__(MAX_THREADS) batchnorm_fwd_partial(const float* x, float* running, float* saved,
                                                 double* partials, double* means,
                                                 unsigned int* tickets, unsigned int n,
                                                 unsigned int c, unsigned int hw, float momentum,
                                                 float eps, unsigned int pass)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const unsigned int k = blockIdx.x, K = gridDim.x;
    const u64 m = (u64)n * hw, per = (m + K - 1) / K;
    const u64 lo = (u64)k * per, hi = lo + per < m ? lo + per : m;
    for (unsigned int ch = blockIdx.y; ch < c; ch += gridDim.y) {
        const double mean = pass == 0 ? 0.0 : means[ch];
        double part = 0.0, unused = 0.0;
        for (u64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const double v = (double)x[at(j, ch, c, hw)];
            part += pass == 0 ? v : (v - mean) * (v - mean);
        }
        block_sum2(part, unused);
        if (threadIdx.x == 0) {
            partials[(u64)ch * K + k] = part;
        }
        if (!last_of_channel(tickets, ch, K)) {
            continue;
        }
        if (threadIdx.x == 0) {
            double total = 0.0;
            for (unsigned int i = 0; i < K; ++i) {
                total += ((volatile double*)partials)[(u64)ch * K + i];
            }
            if (pass == 0) {
                means[ch] = total / (double)m;
            } else {
                const double var = total / (double)m;
                const double invstd_d = 1.0 / sqrt(var + (double)eps);
                const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
                const double mom = (double)momentum;
                running[ch] = (float)((1.0 - mom) * (double)running[ch] + mom * mean);
                running[c + ch] = (float)((1.0 - mom) * (double)running[c + ch] + mom * unbiased);
                saved[ch] = (float)mean;
                saved[c + ch] = (float)invstd_d;
            }
        }
        __syncthreads();
    }
}

// y = gamma·((x − mean)·invstd) + beta from the saved statistics (rounded to float, as
// batchnorm_fwd_train applies them); one thread per element.
extern "C" __global__ void batchnorm_normalize(const float* x, const float* gamma,
                                               const float* beta, const float* saved, float* y,
                                               unsigned int n, unsigned int c, unsigned int hw)
{
    FOR_EACH(u64, e, (u64)n * c * hw)
    {
        const unsigned int ch = ((unsigned int)e / hw) % c;
        y[e] = gamma[ch] * ((x[e] - saved[ch]) * saved[c + ch]) + beta[ch];
    }
}

// Inference: y = gamma·((x − mean)·invstd) + beta with the running statistics,
// invstd = 1/√(var + eps) in float; one thread per element, nothing else written.
extern "C" __global__ void batchnorm_fwd_infer(const float* x, const float* gamma,
                                               const float* beta, const float* running, float* y,
                                               unsigned int n, unsigned int c, unsigned int hw,
                                               float eps)
{
    FOR_EACH(u64, e, (u64)n * c * hw)
    {
        const unsigned int ch = ((unsigned int)e / hw) % c;
        const float invstd = 1.0f / sqrtf(running[c + ch] + eps);
        y[e] = gamma[ch] * ((x[e] - running[ch]) * invstd) + beta[ch];
    }
}

// Gradients from the saved statistics: dbeta = Σ dy, dgamma = Σ dy·x̂ (in double, x̂ in float),
// dx = (gamma·invstd/m)·(m·dy − dbeta − x̂·dgamma) in float with the sums rounded to float.
// Overwrites dx, dgamma and dbeta.
extern "C" __global__ void __launch_bounds__(MAX_THREADS) batchnorm_bwd(const float* x, const float* gamma, const float* saved,
                                         const float* dy, float* dx, float* dgamma, float* dbeta,
                                         unsigned int n, unsigned int c, unsigned int hw)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const u64 m = (u64)n * hw;
    for (unsigned int ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const float mean = saved[ch], invstd = saved[c + ch];
        double sdy = 0.0, sdyx = 0.0;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            const float g = dy[i];
            sdy += (double)g;
            sdyx += (double)g * (double)((x[i] - mean) * invstd);
        }
        block_sum2(sdy, sdyx);
        if (threadIdx.x == 0) {
            dbeta[ch] = (float)sdy;
            dgamma[ch] = (float)sdyx;
        }
        const float mf = (float)m, k = gamma[ch] * invstd / mf;
        const float sdy_f = (float)sdy, sdyx_f = (float)sdyx;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            const float xhat = (x[i] - mean) * invstd;
            dx[i] = k * (mf * dy[i] - sdy_f - xhat * sdyx_f);
        }
    }
}

// batchnorm_bwd's sums over many blocks a channel (as batchnorm_fwd_partial): block (k, ch)
// adds its chunk's dy and dy·x̂ into partials[ch·K + k]; the channel's last block adds the K pairs
// in order into dbeta and dgamma. batchnorm_bwd_dx then writes dx from them.
extern "C" __global__ void __launch_bounds__(MAX_THREADS) batchnorm_bwd_partial(const float* x, const float* saved, const float* dy,
                                                 float* dgamma, float* dbeta, double* partials,
                                                 unsigned int* tickets, unsigned int n,
                                                 unsigned int c, unsigned int hw)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const unsigned int k = blockIdx.x, K = gridDim.x;
    const u64 m = (u64)n * hw, per = (m + K - 1) / K;
    const u64 lo = (u64)k * per, hi = lo + per < m ? lo + per : m;
    for (unsigned int ch = blockIdx.y; ch < c; ch += gridDim.y) {
        const float mean = saved[ch], invstd = saved[c + ch];
        double sdy = 0.0, sdyx = 0.0;
        for (u64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            const float g = dy[i];
            sdy += (double)g;
            sdyx += (double)g * (double)((x[i] - mean) * invstd);
        }
        block_sum2(sdy, sdyx);
        if (threadIdx.x == 0) {
            partials[2 * ((u64)ch * K + k)] = sdy;
            partials[2 * ((u64)ch * K + k) + 1] = sdyx;
        }
        if (!last_of_channel(tickets, ch, K)) {
            continue;
        }
        if (threadIdx.x == 0) {
            double a = 0.0, b = 0.0;
            for (unsigned int i = 0; i < K; ++i) {
                a += ((volatile double*)partials)[2 * ((u64)ch * K + i)];
                b += ((volatile double*)partials)[2 * ((u64)ch * K + i) + 1];
            }
            dbeta[ch] = (float)a;
            dgamma[ch] = (float)b;
        }
        __syncthreads();
    }
}

// dx = (gamma·invstd/m)·(m·dy − dbeta − x̂·dgamma) from the sums batchnorm_bwd_partial left in
// dbeta and dgamma (batchnorm_bwd's arithmetic); one thread per element.
extern "C" __global__ void batchnorm_bwd_dx(const float* x, const float* gamma, const float* saved,
                                            const float* dy, const float* dgamma,
                                            const float* dbeta, float* dx, unsigned int n,
                                            unsigned int c, unsigned int hw)
{
    const float mf = (float)((u64)n * hw);
    FOR_EACH(u64, e, (u64)n * c * hw)
    {
        const unsigned int ch = ((unsigned int)e / hw) % c;
        const float mean = saved[ch], invstd = saved[c + ch];
        const float k = gamma[ch] * invstd / mf;
        const float xhat = (x[e] - mean) * invstd;
        dx[e] = k * (mf * dy[e] - dbeta[ch] - xhat * dgamma[ch]);
    }
}

// y[p] = (Σ_j x[p·hw + j]) / hw, summed in double in order; one thread per plane p of n·c.
extern "C" __global__ void avgpool_fwd(const float* x, float* y, unsigned int planes,
                                       unsigned int hw)
{
    FOR_EACH(u64, p, planes)
    {
        const float* plane = x + p * hw;
        double sum = 0.0;
        for (unsigned int j = 0; j < hw; ++j) {
            sum += (double)plane[j];
        }
        y[p] = (float)(sum / (double)hw);
    }
}

// dx[p·hw + j] = dy[p]·(1/hw), the scale rounded to float first; one thread per dx element.
extern "C" __global__ void avgpool_bwd(const float* dy, float* dx, unsigned int planes,
                                       unsigned int hw)
{
    const float scale = 1.0f / (float)hw;
    FOR_EACH(u64, e, (u64)planes * hw)
    {
        dx[e] = dy[(unsigned int)e / hw] * scale;
    }
}
