// Max pooling with a k×k window, a stride and pad positions each side that never win;
// h_out = (h + 2·pad − k)/stride + 1 (trailing rows and columns that fill no window are dropped).
// CPU twins: ops::maxpool_fwd, ops::maxpool_bwd (the launchers check pad < k and that every
// window holds a real position).

#include "common.cuh"

struct PoolSizes {
    unsigned int h, w, k, stride, pad, h_out, w_out;

    // The window along either axis (square windows).
    __device__ __forceinline__ Window<int> window() const
    {
        return Window<int>{(int)k, (int)stride, (int)pad};
    }
};

// The max of the window of output (oy, ox) in a plane: its first real position (row-major), then
// each later one that is greater replaces it (ops::maxpool_fwd's fold; a NaN first value stays).
__device__ __forceinline__ float window_max(const float* plane, PoolSizes s, unsigned int oy,
                                            unsigned int ox)
{
    const Window<int> win = s.window();
    bool have = false;
    float m = 0.0f;
    for (unsigned int ky = 0; ky < s.k; ++ky) {
        const int iy = win.input((int)oy, (int)ky);
        if (iy < 0 || iy >= (int)s.h) {
            continue;
        }
        for (unsigned int kx = 0; kx < s.k; ++kx) {
            const int ix = win.input((int)ox, (int)kx);
            if (ix < 0 || ix >= (int)s.w) {
                continue;
            }
            const float v = plane[(u64)iy * s.w + ix];
            if (!have) {
                m = v;
                have = true;
            } else if (v > m) {
                m = v;
            }
        }
    }
    return have ? m : __int_as_float(0xff800000); // −∞ for a window with no real position
}

template <typename I>
__device__ void maxpool_fwd_body(const float* x, float* y, I planes, PoolSizes s)
{
    const I out_plane = (I)s.h_out * s.w_out;
    FOR_EACH(I, e, planes * out_plane)
    {
        const I p = e / out_plane;
        const unsigned int o = (unsigned int)(e - p * out_plane), oy = o / s.w_out,
                           ox = o - oy * s.w_out;
        y[e] = window_max(x + p * s.h * s.w, s, oy, ox);
    }
}

// One thread per y element.
extern "C" __global__ void maxpool_fwd(const float* x, float* y, unsigned int n, unsigned int c,
                                       unsigned int h, unsigned int w, unsigned int k,
                                       unsigned int stride, unsigned int pad, unsigned int h_out,
                                       unsigned int w_out)
{
    if (k == 0 || stride == 0) {
        return;
    }
    const PoolSizes s = {h, w, k, stride, pad, h_out, w_out};
    if (fits32((u64)n * c * h * w) && fits32((u64)n * c * h_out * w_out)) {
        maxpool_fwd_body<unsigned int>(x, y, (unsigned int)n * c, s);
    } else {
        maxpool_fwd_body<u64>(x, y, (u64)n * c, s);
    }
}

// Whether (iy, ix) is the first real position (row-major) of the window of (oy, ox) holding
// `max`; a NaN max matches nothing, so such a window routes no gradient.
__device__ __forceinline__ bool first_max(const float* plane, PoolSizes s, unsigned int oy,
                                          unsigned int ox, float max, int iy, int ix)
{
    const Window<int> win = s.window();
    for (unsigned int ky = 0; ky < s.k; ++ky) {
        const int wy = win.input((int)oy, (int)ky);
        if (wy < 0 || wy >= (int)s.h) {
            continue;
        }
        for (unsigned int kx = 0; kx < s.k; ++kx) {
            const int wx = win.input((int)ox, (int)kx);
            if (wx < 0 || wx >= (int)s.w) {
                continue;
            }
            if (plane[(u64)wy * s.w + wx] == max) {
                return wy == iy && wx == ix;
            }
        }
    }
    return false;
}

template <typename I>
__device__ void maxpool_bwd_body(const float* x, const float* y, const float* dy, float* dx,
                                 I planes, PoolSizes s)
{
    const I plane = (I)s.h * s.w, out_plane = (I)s.h_out * s.w_out;
    FOR_EACH(I, e, planes * plane)
    {
        const I p = e / plane;
        const unsigned int r = (unsigned int)(e - p * plane);
        const int iy = (int)(r / s.w), ix = (int)(r - (unsigned int)iy * s.w);
        const Window<int> win = s.window();
        int oy0, oy1, ox0, ox1;
        win.covering(iy, (int)s.h_out, &oy0, &oy1);
        win.covering(ix, (int)s.w_out, &ox0, &ox1);
        const float* xp = x + p * plane;
        // Windows in row-major order, each adding its gradient when this is its first max: the
        // order in which ops::maxpool_bwd adds into this element.
        float g = 0.0f;
        for (int oy = oy0; oy < oy1; ++oy) {
            for (int ox = ox0; ox < ox1; ++ox) {
                const I o = p * out_plane + (I)oy * s.w_out + (I)ox;
                if (first_max(xp, s, (unsigned int)oy, (unsigned int)ox, y[o], iy, ix)) {
                    g += dy[o];
                }
            }
        }
        dx[e] = g;
    }
}

// One thread per dx element: the sum, over the windows holding it in row-major order, of the
// window's dy where it is the window's first max; 0 elsewhere (dropped edges included).
// Overwrites dx.
extern "C" __global__ void maxpool_bwd(const float* x, const float* y, const float* dy, float* dx,
                                       unsigned int n, unsigned int c, unsigned int h,
                                       unsigned int w, unsigned int k, unsigned int stride,
                                       unsigned int pad, unsigned int h_out, unsigned int w_out)
{
    if (k == 0 || stride == 0) {
        return;
    }
    const PoolSizes s = {h, w, k, stride, pad, h_out, w_out};
    if (fits32((u64)n * c * h * w) && fits32((u64)n * c * h_out * w_out)) {
        maxpool_bwd_body<unsigned int>(x, y, dy, dx, (unsigned int)n * c, s);
    } else {
        maxpool_bwd_body<u64>(x, y, dy, dx, (u64)n * c, s);
    }
}
