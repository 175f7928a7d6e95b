// The SM probe: which streaming multiprocessor each block ran on, to show that green-context
// partitions are disjoint. No CPU twin (a CPU has no SMs).

// out[blockIdx.x] = %smid, written by thread 0 of each block; launch one block per entry of out.
extern "C" __global__ void sm_probe(unsigned int* out)
{
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        unsigned int smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        out[blockIdx.x] = smid;
    }
}
