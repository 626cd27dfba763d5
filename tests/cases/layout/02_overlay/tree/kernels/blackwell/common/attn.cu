// kernels/blackwell/common/attn.cu
