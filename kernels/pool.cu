// Max pooling with a k×k window and stride k; h_out = h/k, w_out = w/k (trailing rows and columns
// that fill no window are dropped). CPU twins: ops::maxpool_fwd, ops::maxpool_bwd.

typedef unsigned long long u64;

// Grid-stride loop over 0..n with index type I, so any launch shape covers every element.
#define FOR_EACH(I, i, n) \
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (I)(n); i += (I)blockDim.x * gridDim.x)

// Whether a loop over 0..total (and its last stride past the end) fits 32-bit indices, whose
// divisions are much cheaper than 64-bit ones.
__device__ __forceinline__ bool fits32(u64 total)
{
    return total + (u64)blockDim.x * gridDim.x <= 0xffffffffULL;
}

// The max of the window whose top-left element is `win` in a plane of row length w: the first
// element, replaced by each later one (row-major) that is greater (ops::maxpool_fwd's fold).
__device__ __forceinline__ float window_max(const float* win, unsigned int w, unsigned int k)
{
    float m = win[0];
    for (unsigned int dy = 0; dy < k; ++dy) {
        for (unsigned int dx = 0; dx < k; ++dx) {
            const float v = win[(u64)dy * w + dx];
            m = v > m ? v : m;
        }
    }
    return m;
}

template <typename I>
__device__ void maxpool_fwd_body(const float* x, float* y, I planes, unsigned int h, unsigned int w,
                                 unsigned int k)
{
    const unsigned int ho = h / k, wo = w / k;
    const I out_plane = (I)ho * wo;
    FOR_EACH(I, e, planes * out_plane)
    {
        const I p = e / out_plane;
        const unsigned int o = (unsigned int)(e - p * out_plane), oy = o / wo, ox = o - oy * wo;
        y[e] = window_max(x + (p * h + (I)oy * k) * w + (I)ox * k, w, k);
    }
}

// One thread per y element.
extern "C" __global__ void maxpool_fwd(const float* x, float* y, unsigned int n, unsigned int c,
                                       unsigned int h, unsigned int w, unsigned int k)
{
    if (k == 0) {
        return;
    }
    if (fits32((u64)n * c * h * w)) {
        maxpool_fwd_body<unsigned int>(x, y, (unsigned int)n * c, h, w, k);
    } else {
        maxpool_fwd_body<u64>(x, y, (u64)n * c, h, w, k);
    }
}

// Whether (iy, ix) is the first position (row-major) of the window at `win` holding `max`; a NaN
// max matches nothing, so such a window routes no gradient.
__device__ __forceinline__ bool first_max(const float* win, unsigned int w, unsigned int k,
                                          float max, unsigned int ry, unsigned int rx)
{
    for (unsigned int dy = 0; dy < k; ++dy) {
        for (unsigned int dx = 0; dx < k; ++dx) {
            if (win[(u64)dy * w + dx] == max) {
                return dy == ry && dx == rx;
            }
        }
    }
    return false;
}

template <typename I>
__device__ void maxpool_bwd_body(const float* x, const float* y, const float* dy, float* dx,
                                 I planes, unsigned int h, unsigned int w, unsigned int k)
{
    const unsigned int ho = h / k, wo = w / k;
    const I plane = (I)h * w;
    FOR_EACH(I, e, planes * plane)
    {
        const I p = e / plane;
        const unsigned int r = (unsigned int)(e - p * plane), iy = r / w, ix = r - iy * w;
        const unsigned int oy = iy / k, ox = ix / k;
        float g = 0.0f;
        if (oy < ho && ox < wo) {
            const I o = (p * ho + oy) * wo + ox;
            const float* win = x + (p * h + (I)oy * k) * w + (I)ox * k;
            if (first_max(win, w, k, y[o], iy - oy * k, ix - ox * k)) {
                g = dy[o];
            }
        }
        dx[e] = g;
    }
}

// One thread per dx element: dy of its window if it is the window's first max, else 0; overwrites
// dx, dropped edges included.
extern "C" __global__ void maxpool_bwd(const float* x, const float* y, const float* dy, float* dx,
                                       unsigned int n, unsigned int c, unsigned int h,
                                       unsigned int w, unsigned int k)
{
    if (k == 0) {
        return;
    }
    if (fits32((u64)n * c * h * w)) {
        maxpool_bwd_body<unsigned int>(x, y, dy, dx, (unsigned int)n * c, h, w, k);
    } else {
        maxpool_bwd_body<u64>(x, y, dy, dx, (u64)n * c, h, w, k);
    }
}
