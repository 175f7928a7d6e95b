// What every kernel family shares: the 64-bit index type, the grid-stride loop, the check that a
// loop fits 32-bit indices, the window of a convolution or a pooling, and the fixed-order block
// reduction tree. Each .cu file includes it;
// src/engine/cuda/kernels.rs puts this text in place of that line for NVRTC, which is given no
// header files.

typedef unsigned long long u64;

// The hyper table of a fused group (src/engine/fused_hyper.rs): one row of HYPER_LEN floats per trial,
// read by the batched optimizer steps and the fused dropout.
#define HYPER_LR 0u
#define HYPER_WD 1u
#define HYPER_MOMENTUM 2u
#define HYPER_BETA1 3u
#define HYPER_BETA2 4u
#define HYPER_EPS 5u
#define HYPER_LIVE 6u
#define HYPER_DROPOUT 7u
#define HYPER_SEED_LO 8u
#define HYPER_SEED_HI 9u
#define HYPER_STEP0 10u
#define HYPER_LEN 11u

// The most threads a block may have, and the size of the reductions' shared arrays.
#define MAX_THREADS 1024

// Grid-stride loop over 0..n with index type I, so any launch shape covers every element.
#define FOR_EACH(I, i, n) \
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (I)(n); i += (I)blockDim.x * gridDim.x)

// Whether a loop over 0..total (and its last stride past the end) fits 32-bit indices, whose
// divisions are much cheaper than 64-bit ones.
__device__ __forceinline__ bool fits32(u64 total)
{
    return total + (u64)blockDim.x * gridDim.x <= 0xffffffffULL;
}

// One window along one axis of a convolution or a pooling: k taps, a stride, and pad positions
// before the first input (engine::shapes::Window is its host side). T is the signed type the
// family computes indices in.
template <typename T>
struct Window {
    T k, stride, pad;

    // The input index that tap t of output o reads: o·stride + t − pad (outside [0, n) in the
    // padding).
    __device__ __forceinline__ T input(T o, T t) const { return o * stride + t - pad; }

    // The output, of `out`, whose tap t reads input i; −1 when none does.
    __device__ __forceinline__ T output(T i, T t, T out) const
    {
        const T to = i + pad - t;
        if (to < 0 || to % stride != 0 || to / stride >= out) {
            return -1;
        }
        return to / stride;
    }

    // The first and one-past-last output, of `out`, whose windows cover input i:
    // o·stride − pad ≤ i ≤ o·stride − pad + k − 1.
    __device__ __forceinline__ void covering(T i, T out, T* lo, T* hi) const
    {
        const T top = i + pad;
        const T first = top - k + 1;
        *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
        const T last = top / stride + 1;
        *hi = last < out ? last : out;
    }
};

// Adds the block's per-thread values of two shared arrays (one entry a thread, at most
// MAX_THREADS) with a fixed-order tree, so the totals, in a[0] and b[0], are the same on every run
// with the same blockDim. Starts and ends with a barrier.
template <typename A, typename B>
__device__ void block_tree2(A* a, B* b)
{
    const unsigned int tid = threadIdx.x, n = blockDim.x;
    __syncthreads();
    unsigned int half = 1;
    while (half < n) {
        half <<= 1;
    }
    for (half >>= 1; half > 0; half >>= 1) {
        if (tid < half && tid + half < n) {
            a[tid] += a[tid + half];
            b[tid] += b[tid + half];
        }
        __syncthreads();
    }
}
