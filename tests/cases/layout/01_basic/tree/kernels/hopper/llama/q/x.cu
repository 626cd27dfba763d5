// kernels/hopper/llama/q/x.cu
