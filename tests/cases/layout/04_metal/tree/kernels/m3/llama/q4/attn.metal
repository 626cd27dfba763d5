// kernels/m3/llama/q4/attn.metal
