"""Tile programs with deuteron: run each example of tiles.nk, check it against torch, show a generated kernel.

On a GPU each program is autotuned the first time it meets a shape (effort quick, tens of seconds; the winner
is stored on disk, so the next run starts at once). On a CPU the kernels run in newt's interpreter with the
default config. DEUTERON_EAGER=1 runs the tile programs eagerly with torch instead (the oracle).
"""
from pathlib import Path

import torch
import torch.nn.functional as F

import deuteron

prog = deuteron.load(Path(__file__).resolve().parent / "tiles.nk")
gpu = torch.cuda.is_available()
device, rows, cols, n = ("cuda", 4096, 1000, 1024) if gpu else ("cpu", 37, 100, 64)


def show(name, got, want):
    err = (got.double() - want.double()).abs().max().item()
    print(f"{name:12s} {tuple(got.shape)} {str(got.dtype):14s} max error {err:.2e}")
    assert err < 5e-2, f"{name} does not match torch"


x = torch.randn(rows, cols, device=device)
show("add", prog.add(x[0], x[1]), x[0] + x[1])
show("softmax", prog.softmax(x), torch.softmax(x, -1))
w, b = torch.randn(cols, device=device), torch.randn(cols, device=device)
show("layernorm", prog.layernorm(x, w, b, 1e-5), F.layer_norm(x, (cols,), w, b, 1e-5))
a = torch.randn(n, n, device=device, dtype=torch.float16) / 8
m = torch.randn(n, n // 2, device=device, dtype=torch.float16) / 8
show("matmul", prog.matmul(a, m), a @ m)
bias = torch.randn(n // 2, device=device, dtype=torch.float16)
show("linear_gelu", prog.linear_gelu(a, m, bias), F.gelu(a.float() @ m.float() + bias.float()).half())
q, k, v = (torch.randn(4, n // 4, 64, device=device, dtype=torch.float16) for _ in range(3))
show("attention", prog.attention(q, k, v, True), F.scaled_dot_product_attention(q, k, v, is_causal=True))

print("\n---- the newt kernel that softmax becomes for this call ----")
print(prog.softmax.source(x))
