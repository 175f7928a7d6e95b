// What every kernel family shares: the 64-bit index type, the grid-stride loop, the check that a
// loop fits 32-bit indices, and the fixed-order block reduction tree. Each .cu file includes it;
// src/engine/cuda/kernels.rs puts this text in place of that line for NVRTC, which is given no
// header files.

typedef unsigned long long u64;

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
