// Batch gathers from the resident dataset into a trial's arena. CPU twins: CpuBackend::gather and
// CpuBackend::gather_train (src/engine/cpu/mod.rs).

#include "common.cuh"

// x[r] = images[order[start + r]] (rows of row_len), y[r] = labels[order[start + r]]; one thread
// per x element, the first `rows` of them also copying a label.
template <typename I>
__device__ void gather_body(const float* images, const float* labels, const unsigned int* order,
                            float* x, float* y, I row_len, u64 start, I rows)
{
    FOR_EACH(I, e, rows * row_len)
    {
        const I r = e / row_len, j = e - r * row_len;
        x[e] = images[(u64)order[start + r] * row_len + j];
    }
    FOR_EACH(I, r, rows) { y[r] = labels[order[start + r]]; }
}

__device__ void gather_from(const float* images, const float* labels, const unsigned int* order,
                            float* x, float* y, unsigned int row_len, u64 start, unsigned int rows)
{
    if (row_len == 0) {
        FOR_EACH(u64, r, rows) { y[r] = labels[order[start + r]]; }
    } else if (fits32((u64)rows * row_len)) {
        gather_body<unsigned int>(images, labels, order, x, y, row_len, start, rows);
    } else {
        gather_body<u64>(images, labels, order, x, y, row_len, start, rows);
    }
}

// Samples order[start..start+rows] (order is the identity for the test split).
extern "C" __global__ void gather(const float* images, const float* labels,
                                  const unsigned int* order, float* x, float* y,
                                  unsigned int row_len, unsigned int start, unsigned int rows)
{
    gather_from(images, labels, order, x, y, row_len, start, rows);
}

// Training batch number (*counter % steps_per_epoch) of the epoch's order: start = that · batch.
extern "C" __global__ void gather_train(const float* images, const float* labels,
                                        const unsigned int* order, const unsigned int* counter,
                                        float* x, float* y, unsigned int row_len,
                                        unsigned int steps_per_epoch, unsigned int batch)
{
    if (steps_per_epoch == 0) {
        return;
    }
    const u64 start = (u64)(*counter % steps_per_epoch) * batch;
    gather_from(images, labels, order, x, y, row_len, start, batch);
}
