"""Quick start: run the stdlib softmax kernel, check it against torch, show the CUDA it becomes.

On a machine with an NVIDIA GPU the kernel is compiled with NVRTC and launched on the GPU; on a
CPU-only machine the same kernel runs in newt's interpreter.
"""
from pathlib import Path

import torch

import newtc

here = Path(__file__).resolve().parent.parent
mod = newtc.load(here / "stdlib" / "softmax.nk")

device = "cuda" if torch.cuda.is_available() else "cpu"
rows, cols = (4096, 1000) if device == "cuda" else (37, 1000)
x = torch.randn(rows, cols, device=device)
out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
block = 1024  # the whole row in one block: a power of two >= cols

# one program per row (the kernel can also take ROWS rows per program, as newtc.ops does for short rows)
mod.softmax[(rows,)](x, out, rows, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=4)

err = (out - torch.softmax(x, dim=-1)).abs().max().item()
print(f"softmax of {rows}x{cols} on {device}{' (interpreter)' if device == 'cpu' else ''}: max error {err:.2e}")
assert err < 1e-5, "softmax does not match torch"

print("\n---- the typed tile IR ----")
print(mod.softmax.ir(x, out, rows, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=4))
print("---- the generated CUDA C++ ----")
print(mod.softmax.source(x, out, rows, cols, x.stride(0), out.stride(0), BLOCK=block, num_warps=4))
