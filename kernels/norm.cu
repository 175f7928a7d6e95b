// Per-channel ops over NCHW data seen as n × c planes of hw (n·c·hw < 2^32, checked by the
// launchers, per trial): batch normalisation (of one trial, or of every trial of a fused group in
// one launch) and global average pooling. CPU twins: ops::batchnorm_fwd, ops::batchnorm_bwd, ops::avgpool_fwd,
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

// A fused group's batch norm runs every trial's channels in one launch: `trials` trials, trial t's
// x, y, dy and dx t·n·c·hw elements in, its gamma, beta, dgamma and dbeta `t·ps` elements in, its
// running statistics `t·rs` in and its saved ones `t·ss` in (one trial: trials = 1). A block
// takes channel g of the group's trials·c, trial g / c's channel g % c, and computes what it
// computes for that trial alone, bit for bit.
struct Trial {
    u64 x, param, running, saved;
};

__device__ __forceinline__ Trial trial_of(u64 t, unsigned int n, unsigned int c, unsigned int hw,
                                          u64 ps, u64 rs, u64 ss)
{
    return Trial{t * n * c * hw, t * ps, t * rs, t * ss};
}

// Trial and channel of element e of the group's trials·n·c·hw.
__device__ __forceinline__ void element_of(u64 e, unsigned int n, unsigned int c, unsigned int hw,
                                           unsigned int trials, u64& t, unsigned int& ch)
{
    const u64 per = (u64)n * c * hw;
    t = trials == 1 ? 0 : e / per;
    const unsigned int r = (unsigned int)(e - t * per);
    ch = (r / hw) % c;
}

// Training: per channel, mean and biased variance over its n·hw values (two passes, in double);
// saved = [mean; c] ++ [1/√(var+eps); c]; running = (1−momentum)·running + momentum·batch, the
// variance unbiased by m/(m−1) when m > 1; y = gamma·((x − mean)·invstd) + beta in float with
// mean and invstd rounded to float.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
    batchnorm_fwd_train(const float* x, const float* gamma, const float* beta, float* running,
                        float* saved, float* y, unsigned int n, unsigned int c, unsigned int hw,
                        float momentum, float eps, unsigned int trials, u64 ps, u64 rs, u64 ss)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const u64 m = (u64)n * hw;
    for (u64 g = blockIdx.x; g < (u64)trials * c; g += gridDim.x) {
        const u64 t = g / c;
        const unsigned int ch = (unsigned int)(g - t * c);
        const Trial o = trial_of(t, n, c, hw, ps, rs, ss);
        const float* xt = x + o.x;
        float* yt = y + o.x;
        double sum = 0.0, unused = 0.0;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            sum += (double)xt[at(j, ch, c, hw)];
        }
        block_sum2(sum, unused);
        const double mean = sum / (double)m;
        double sq = 0.0;
        unused = 0.0;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const double d = (double)xt[at(j, ch, c, hw)] - mean;
            sq += d * d;
        }
        block_sum2(sq, unused);
        const double var = sq / (double)m;
        const double invstd_d = 1.0 / sqrt(var + (double)eps);
        if (threadIdx.x == 0) {
            float* run = running + o.running;
            float* sv = saved + o.saved;
            const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
            const double mom = (double)momentum;
            run[ch] = (float)((1.0 - mom) * (double)run[ch] + mom * mean);
            run[c + ch] = (float)((1.0 - mom) * (double)run[c + ch] + mom * unbiased);
            sv[ch] = (float)mean;
            sv[c + ch] = (float)invstd_d;
        }
        const float mf = (float)mean, invstd = (float)invstd_d;
        const float gm = gamma[o.param + ch], bt = beta[o.param + ch];
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            yt[i] = gm * ((xt[i] - mf) * invstd) + bt;
        }
    }
}

// The same statistics over many blocks a channel, for layers with few channels and large planes
// (one block a channel would leave most SMs idle): block (k, g) of a grid of K × (trials·c) blocks
// takes chunk k of channel g's m = n·hw values (values k·per .. (k+1)·per), its threads as above,
// and writes its partial sum to partials[g·K + k]; the channel's last block to finish (its
// ticket) adds the K partials in order, so the result is the same on every run with the same
// launch. pass 0 sums the values and leaves the mean in means[g]; pass 1 sums (x − mean)² and
// writes the statistics and running ones as batchnorm_fwd_train does; batchnorm_normalize then
// writes y. The tickets are zero between launches (the last block resets its channel's).
__device__ __forceinline__ bool last_of_channel(unsigned int* tickets, u64 g, unsigned int blocks)
{
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(tickets + g, 1u) == blocks - 1u;
        if (last) {
            tickets[g] = 0u;
            __threadfence();
        }
    }
    __syncthreads();
    return last;
}

extern "C" __global__ void __launch_bounds__(MAX_THREADS)
    batchnorm_fwd_partial(const float* x, float* running, float* saved, double* partials,
                          double* means, unsigned int* tickets, unsigned int n, unsigned int c,
                          unsigned int hw, float momentum, float eps, unsigned int pass,
                          unsigned int trials, u64 ps, u64 rs, u64 ss)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const unsigned int k = blockIdx.x, K = gridDim.x;
    const u64 m = (u64)n * hw, per = (m + K - 1) / K;
    const u64 lo = (u64)k * per, hi = lo + per < m ? lo + per : m;
    for (u64 g = blockIdx.y; g < (u64)trials * c; g += gridDim.y) {
        const u64 t = g / c;
        const unsigned int ch = (unsigned int)(g - t * c);
        const Trial o = trial_of(t, n, c, hw, ps, rs, ss);
        const float* xt = x + o.x;
        const double mean = pass == 0 ? 0.0 : means[g];
        double part = 0.0, unused = 0.0;
        for (u64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const double v = (double)xt[at(j, ch, c, hw)];
            part += pass == 0 ? v : (v - mean) * (v - mean);
        }
        block_sum2(part, unused);
        if (threadIdx.x == 0) {
            partials[g * K + k] = part;
        }
        if (!last_of_channel(tickets, g, K)) {
            continue;
        }
        if (threadIdx.x == 0) {
            double total = 0.0;
            for (unsigned int i = 0; i < K; ++i) {
                total += ((volatile double*)partials)[g * K + i];
            }
            if (pass == 0) {
                means[g] = total / (double)m;
            } else {
                float* run = running + o.running;
                float* sv = saved + o.saved;
                const double var = total / (double)m;
                const double invstd_d = 1.0 / sqrt(var + (double)eps);
                const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
                const double mom = (double)momentum;
                run[ch] = (float)((1.0 - mom) * (double)run[ch] + mom * mean);
                run[c + ch] = (float)((1.0 - mom) * (double)run[c + ch] + mom * unbiased);
                sv[ch] = (float)mean;
                sv[c + ch] = (float)invstd_d;
            }
        }
        __syncthreads();
    }
}

// y = gamma·((x − mean)·invstd) + beta from the saved statistics (rounded to float, as
// batchnorm_fwd_train applies them); one thread per element of every trial.
extern "C" __global__ void batchnorm_normalize(const float* x, const float* gamma,
                                               const float* beta, const float* saved, float* y,
                                               unsigned int n, unsigned int c, unsigned int hw,
                                               unsigned int trials, u64 ps, u64 ss)
{
    FOR_EACH(u64, e, (u64)trials * n * c * hw)
    {
        u64 t;
        unsigned int ch;
        element_of(e, n, c, hw, trials, t, ch);
        const float* sv = saved + t * ss;
        const u64 pc = t * ps + ch;
        y[e] = gamma[pc] * ((x[e] - sv[ch]) * sv[c + ch]) + beta[pc];
    }
}

// Inference: y = gamma·((x − mean)·invstd) + beta with the running statistics,
// invstd = 1/√(var + eps) in float; one thread per element of every trial, nothing else written.
extern "C" __global__ void batchnorm_fwd_infer(const float* x, const float* gamma,
                                               const float* beta, const float* running, float* y,
                                               unsigned int n, unsigned int c, unsigned int hw,
                                               float eps, unsigned int trials, u64 ps, u64 rs)
{
    FOR_EACH(u64, e, (u64)trials * n * c * hw)
    {
        u64 t;
        unsigned int ch;
        element_of(e, n, c, hw, trials, t, ch);
        const float* run = running + t * rs;
        const u64 pc = t * ps + ch;
        const float invstd = 1.0f / sqrtf(run[c + ch] + eps);
        y[e] = gamma[pc] * ((x[e] - run[ch]) * invstd) + beta[pc];
    }
}

// Gradients from the saved statistics: dbeta = Σ dy, dgamma = Σ dy·x̂ (in double, x̂ in float),
// dx = (gamma·invstd/m)·(m·dy − dbeta − x̂·dgamma) in float with the sums rounded to float.
// Overwrites dx, dgamma and dbeta.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
    batchnorm_bwd(const float* x, const float* gamma, const float* saved, const float* dy,
                  float* dx, float* dgamma, float* dbeta, unsigned int n, unsigned int c,
                  unsigned int hw, unsigned int trials, u64 ps, u64 ss)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const u64 m = (u64)n * hw;
    for (u64 g = blockIdx.x; g < (u64)trials * c; g += gridDim.x) {
        const u64 t = g / c;
        const unsigned int ch = (unsigned int)(g - t * c);
        const Trial o = trial_of(t, n, c, hw, ps, 0, ss);
        const float *xt = x + o.x, *dyt = dy + o.x, *sv = saved + o.saved;
        float* dxt = dx + o.x;
        const float mean = sv[ch], invstd = sv[c + ch];
        double sdy = 0.0, sdyx = 0.0;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            const float gr = dyt[i];
            sdy += (double)gr;
            sdyx += (double)gr * (double)((xt[i] - mean) * invstd);
        }
        block_sum2(sdy, sdyx);
        if (threadIdx.x == 0) {
            dbeta[o.param + ch] = (float)sdy;
            dgamma[o.param + ch] = (float)sdyx;
        }
        const float mf = (float)m, k = gamma[o.param + ch] * invstd / mf;
        const float sdy_f = (float)sdy, sdyx_f = (float)sdyx;
        for (u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            const float xhat = (xt[i] - mean) * invstd;
            dxt[i] = k * (mf * dyt[i] - sdy_f - xhat * sdyx_f);
        }
    }
}

// batchnorm_bwd's sums over many blocks a channel (as batchnorm_fwd_partial): block (k, g) adds
// its chunk's dy and dy·x̂ into partials[g·K + k]; the channel's last block adds the K pairs in
// order into dbeta and dgamma. batchnorm_bwd_dx then writes dx from them.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
    batchnorm_bwd_partial(const float* x, const float* saved, const float* dy, float* dgamma,
                          float* dbeta, double* partials, unsigned int* tickets, unsigned int n,
                          unsigned int c, unsigned int hw, unsigned int trials, u64 ps, u64 ss)
{
    if (blockDim.x > MAX_THREADS) {
        return;
    }
    const unsigned int k = blockIdx.x, K = gridDim.x;
    const u64 m = (u64)n * hw, per = (m + K - 1) / K;
    const u64 lo = (u64)k * per, hi = lo + per < m ? lo + per : m;
    for (u64 g = blockIdx.y; g < (u64)trials * c; g += gridDim.y) {
        const u64 t = g / c;
        const unsigned int ch = (unsigned int)(g - t * c);
        const Trial o = trial_of(t, n, c, hw, ps, 0, ss);
        const float *xt = x + o.x, *dyt = dy + o.x, *sv = saved + o.saved;
        const float mean = sv[ch], invstd = sv[c + ch];
        double sdy = 0.0, sdyx = 0.0;
        for (u64 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const u64 i = at(j, ch, c, hw);
            const float gr = dyt[i];
            sdy += (double)gr;
            sdyx += (double)gr * (double)((xt[i] - mean) * invstd);
        }
        block_sum2(sdy, sdyx);
        if (threadIdx.x == 0) {
            partials[2 * (g * K + k)] = sdy;
            partials[2 * (g * K + k) + 1] = sdyx;
        }
        if (!last_of_channel(tickets, g, K)) {
            continue;
        }
        if (threadIdx.x == 0) {
            double a = 0.0, b = 0.0;
            for (unsigned int i = 0; i < K; ++i) {
                a += ((volatile double*)partials)[2 * (g * K + i)];
                b += ((volatile double*)partials)[2 * (g * K + i) + 1];
            }
            dbeta[o.param + ch] = (float)a;
            dgamma[o.param + ch] = (float)b;
        }
        __syncthreads();
    }
}

// dx = (gamma·invstd/m)·(m·dy − dbeta − x̂·dgamma) from the sums batchnorm_bwd_partial left in
// dbeta and dgamma (batchnorm_bwd's arithmetic); one thread per element of every trial.
extern "C" __global__ void batchnorm_bwd_dx(const float* x, const float* gamma, const float* saved,
                                            const float* dy, const float* dgamma,
                                            const float* dbeta, float* dx, unsigned int n,
                                            unsigned int c, unsigned int hw, unsigned int trials,
                                            u64 ps, u64 ss)
{
    const float mf = (float)((u64)n * hw);
    FOR_EACH(u64, e, (u64)trials * n * c * hw)
    {
        u64 t;
        unsigned int ch;
        element_of(e, n, c, hw, trials, t, ch);
        const float* sv = saved + t * ss;
        const u64 pc = t * ps + ch;
        const float mean = sv[ch], invstd = sv[c + ch];
        const float k = gamma[pc] * invstd / mf;
        const float xhat = (x[e] - mean) * invstd;
        dx[e] = k * (mf * dy[e] - dbeta[pc] - xhat * dgamma[pc]);
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
