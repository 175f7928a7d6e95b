// Softmax cross-entropy over rows × classes logits with f32 labels, accumulated into stats[0..2] =
// [Σ loss, #correct]. CPU twins: ops::softmax_xent, ops::softmax_xent_fused, ops::eval_xent
// (per-row loss in f32, summed in f64 as the twin's XentStats does).
// Launch: one block of any size up to 1024 threads along x (other blocks return at once; the
// fused kernel takes a block per trial); each thread takes rows tid, tid + blockDim.x, ... and a
// fixed-order shared-memory tree adds the per-thread sums, so the result is the same on every
// run with the same blockDim.

#include "common.cuh"

// One row: its max logit, Σ exp(logit − max), loss, label, and whether the first argmax is the
// label. A label that is not a class (not a whole number below `classes`) gives a NaN loss, so the
// trial's loss check catches it. Labels come from the resident data set, whose labels were
// checked against its classes when it was loaded; the CPU backend also checks each batch's
// (`engine::contract::labels`), and the GPU reads none back.
struct XentRow {
    float max, sum, loss;
    unsigned int label;
    bool valid, correct;
};

__device__ XentRow xent_row(const float* row, float label, unsigned int classes)
{
    XentRow x;
    x.valid = label >= 0.0f && label < (float)classes && (float)(unsigned int)label == label;
    x.label = x.valid ? (unsigned int)label : 0u;
    unsigned int arg = 0;
    x.max = row[0];
    for (unsigned int j = 1; j < classes; ++j) {
        if (row[j] > x.max) {
            x.max = row[j];
            arg = j;
        }
    }
    x.sum = 0.0f;
    for (unsigned int j = 0; j < classes; ++j) {
        x.sum += expf(row[j] - x.max);
    }
    // logsumexp − logit[t] = ln(sum) + max − logit[t]
    x.loss = x.valid ? logf(x.sum) - (row[x.label] - x.max) : __int_as_float(0x7fc00000);
    x.correct = x.valid && arg == x.label;
    return x;
}

// Adds this block's [Σ loss, #correct] into stats with a fixed-order tree over the threads.
__device__ void block_add_stats(float* stats, double loss, unsigned int correct)
{
    __shared__ double s_loss[MAX_THREADS];
    __shared__ unsigned int s_correct[MAX_THREADS];
    s_loss[threadIdx.x] = loss;
    s_correct[threadIdx.x] = correct;
    block_tree2(s_loss, s_correct);
    if (threadIdx.x == 0) {
        stats[0] += (float)s_loss[0];
        stats[1] += (float)s_correct[0];
    }
}

// One block's softmax_xent over one trial's operands: dlogits = (softmax − onehot)/rows, and
// [Σ loss, #correct] added into stats. Every thread of the block calls it.
__device__ void xent_block(const float* logits, const float* labels, float* dlogits, float* stats,
                           unsigned int rows, unsigned int classes)
{
    double loss = 0.0;
    unsigned int correct = 0;
    for (u64 r = threadIdx.x; r < rows; r += blockDim.x) {
        const float* row = logits + r * classes;
        float* d = dlogits + r * classes;
        const XentRow x = xent_row(row, labels[r], classes);
        for (unsigned int j = 0; j < classes; ++j) {
            const float onehot = x.valid && j == x.label ? 1.0f : 0.0f;
            d[j] = (expf(row[j] - x.max) / x.sum - onehot) / (float)rows;
        }
        loss += (double)x.loss;
        correct += x.correct ? 1u : 0u;
    }
    block_add_stats(stats, loss, correct);
}

// Writes dlogits = (softmax − onehot)/rows and adds [Σ loss, #correct] into stats.
extern "C" __global__ void __launch_bounds__(MAX_THREADS) softmax_xent(const float* logits, const float* labels, float* dlogits,
                                        float* stats, unsigned int rows, unsigned int classes)
{
    if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0 || classes == 0) {
        return;
    }
    xent_block(logits, labels, dlogits, stats, rows, classes);
}

// softmax_xent per trial t of a fused group (ops::softmax_xent_fused): block b takes trials b,
// b + gridDim.x, ..., each as softmax_xent's one block does (the same fixed-order reduction), on
// logits and dlogits at t·rows·classes, labels at t·rows and stats at t·2.
extern "C" __global__ void __launch_bounds__(MAX_THREADS) softmax_xent_fused(const float* logits, const float* labels,
                                              float* dlogits, float* stats, unsigned int rows,
                                              unsigned int classes, unsigned int trials)
{
    if (blockIdx.y != 0 || blockIdx.z != 0 || classes == 0) {
        return;
    }
    const u64 per = (u64)rows * classes;
    for (u64 t = blockIdx.x; t < trials; t += gridDim.x) {
        xent_block(logits + t * per, labels + t * rows, dlogits + t * per, stats + t * 2, rows,
                   classes);
    }
}

// The sums of softmax_xent without the gradient.
extern "C" __global__ void __launch_bounds__(MAX_THREADS) eval_xent(const float* logits, const float* labels, float* stats,
                                     unsigned int rows, unsigned int classes)
{
    if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0 || classes == 0) {
        return;
    }
    double loss = 0.0;
    unsigned int correct = 0;
    for (u64 r = threadIdx.x; r < rows; r += blockDim.x) {
        const XentRow x = xent_row(logits + r * classes, labels[r], classes);
        loss += (double)x.loss;
        correct += x.correct ? 1u : 0u;
    }
    block_add_stats(stats, loss, correct);
}

// softmax_xent_fused that also writes the bias gradient of the layer that made the logits: after
// a trial's block has written its dlogits, thread j sums column j over the rows in order from 0
// into db + t·stride (ops::softmax_xent_fused then ops::bias_grad_fused, bit for bit).
extern "C" __global__ void __launch_bounds__(MAX_THREADS) softmax_xent_bias(const float* logits, const float* labels,
                                             float* dlogits, float* stats, unsigned int rows,
                                             unsigned int classes, unsigned int trials, float* db,
                                             unsigned int stride)
{
    if (blockIdx.y != 0 || blockIdx.z != 0 || classes == 0) {
        return;
    }
    const u64 per = (u64)rows * classes;
    for (u64 t = blockIdx.x; t < trials; t += gridDim.x) {
        float* d = dlogits + t * per;
        xent_block(logits + t * per, labels + t * rows, d, stats + t * 2, rows, classes);
        // xent_block ends with a barrier: every row of d is written.
        for (unsigned int j = threadIdx.x; j < classes; j += blockDim.x) {
            float s = 0.0f;
            for (u64 r = 0; r < rows; ++r) {
                s += d[r * classes + j];
            }
            db[t * stride + j] = s;
        }
        __syncthreads();
    }
}

// eval_xent per trial t of a fused group: block b takes trials b, b + gridDim.x, ..., each as
// eval_xent's one block does, on the first `rows` rows of logits at t·batch·classes and labels at
// t·batch, into stats at t·2 (eval_xent trial by trial, bit for bit).
extern "C" __global__ void __launch_bounds__(MAX_THREADS) eval_xent_fused(const float* logits, const float* labels,
                                           float* stats, unsigned int rows, unsigned int batch,
                                           unsigned int classes, unsigned int trials)
{
    if (blockIdx.y != 0 || blockIdx.z != 0 || classes == 0) {
        return;
    }
    for (u64 t = blockIdx.x; t < trials; t += gridDim.x) {
        const float* l = logits + t * batch * classes;
        const float* y = labels + t * batch;
        double loss = 0.0;
        unsigned int correct = 0;
        for (u64 r = threadIdx.x; r < rows; r += blockDim.x) {
            const XentRow x = xent_row(l + r * classes, y[r], classes);
            loss += (double)x.loss;
            correct += x.correct ? 1u : 0u;
        }
        block_add_stats(stats + t * 2, loss, correct);
    }
}
