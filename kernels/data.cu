// Batch gathers from the resident dataset into a trial's arena. CPU twins: CpuBackend::gather,
// CpuBackend::gather_train and CpuBackend::gather_train_fused (src/engine/cpu/mod.rs).

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

// gather into each of `trials` trials' rows: the same samples order[start..start+rows] into
// x + t·batch·row_len and y + t·batch (CpuBackend's gather_fused: gather trial by trial).
extern "C" __global__ void gather_fused(const float* images, const float* labels,
                                        const unsigned int* order, float* x, float* y,
                                        unsigned int row_len, unsigned int start,
                                        unsigned int rows, unsigned int batch,
                                        unsigned int trials)
{
    const u64 per = (u64)rows * row_len;
    FOR_EACH(u64, e, per * trials)
    {
        const u64 t = e / per, k = e - t * per;
        const u64 r = k / row_len, j = k - r * row_len;
        x[t * batch * row_len + k] = images[(u64)order[start + r] * row_len + j];
    }
    FOR_EACH(u64, k, (u64)rows * trials)
    {
        const u64 t = k / rows, r = k - t * rows;
        y[t * batch + r] = labels[order[start + r]];
    }
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

// Sample index of row r (of trials·batch) of a fused gather: trial t = r / batch reads element
// start + r % batch of its order, which starts t·n_train into `orders`.
template <typename I>
__device__ __forceinline__ unsigned int fused_index(const unsigned int* orders, I r, I batch,
                                                    unsigned int n_train, u64 start)
{
    const I t = r / batch, b = r - t * batch;
    return orders[(u64)t * n_train + start + b];
}

// One thread per x element over trials·batch·row_len, the first trials·batch of them also copying
// a label. An index ≥ n_train writes zeros rather than reading out of bounds: the host checks the
// orders before writing them into the arena, and this keeps a bad one from reaching past the
// dataset.
template <typename I>
__device__ void gather_fused_body(const float* images, const float* labels,
                                  const unsigned int* orders, float* x, float* y, I row_len,
                                  unsigned int n_train, u64 start, I batch, I trials)
{
    FOR_EACH(I, e, trials * batch * row_len)
    {
        const I r = e / row_len, j = e - r * row_len;
        const unsigned int i = fused_index(orders, r, batch, n_train, start);
        x[e] = i < n_train ? images[(u64)i * row_len + j] : 0.0f;
    }
    FOR_EACH(I, r, trials * batch)
    {
        const unsigned int i = fused_index(orders, r, batch, n_train, start);
        y[r] = i < n_train ? labels[i] : 0.0f;
    }
}

// gather_train for each of `trials` trials of a fused group, each from its own order: `orders`
// holds the trials' permutations of the n_train training samples one after another (u32 indices
// stored in the arena as float bits). Trial t's batch number (*counter % steps_per_epoch) goes to
// x at t·batch·row_len and its labels to y at t·batch.
extern "C" __global__ void gather_train_fused(const float* images, const float* labels,
                                              const unsigned int* orders,
                                              const unsigned int* counter, float* x, float* y,
                                              unsigned int row_len, unsigned int n_train,
                                              unsigned int steps_per_epoch, unsigned int batch,
                                              unsigned int trials)
{
    if (steps_per_epoch == 0 || batch == 0) {
        return;
    }
    const u64 start = (u64)(*counter % steps_per_epoch) * batch;
    const u64 rows = (u64)trials * batch;
    if (row_len != 0 && fits32(rows * row_len)) {
        gather_fused_body<unsigned int>(images, labels, orders, x, y, row_len, n_train, start,
                                        batch, trials);
    } else {
        gather_fused_body<u64>(images, labels, orders, x, y, row_len, n_train, start, batch,
                               trials);
    }
}
