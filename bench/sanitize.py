"""Every kind of newt kernel once, on small odd shapes, for compute-sanitizer:

    compute-sanitizer --tool memcheck python bench/sanitize.py
    compute-sanitizer --tool racecheck python bench/sanitize.py

Pipelined matmuls (cp.async rings, ldmatrix), a transposed operand, the epilogue, reductions across warps,
row kernels, the transpose, an atomic histogram."""
import torch

import common  # noqa: F401 - puts the checkout on sys.path
import newtc
from newtc import ops


def main() -> None:
    d = "cuda"
    for m, n, k in ((100, 70, 90), (17, 1001, 40), (300, 260, 130)):
        for dt in (torch.float16, torch.bfloat16, torch.float32):
            a, b = torch.randn(m, k, device=d, dtype=dt), torch.randn(k, n, device=d, dtype=dt)
            ops.matmul(a, b)
    a, b = torch.randn(90, 100, device=d).half().t(), torch.randn(90, 70, device=d).half()
    ops.matmul(a, b, torch.randn(70, device=d).half(), "gelu")
    x = torch.randn(33, 3000, device=d)
    ops.softmax(x), ops.log_softmax(x.half())
    ops.layernorm(x, torch.randn(3000, device=d), torch.randn(3000, device=d))
    ops.rmsnorm(x.bfloat16(), torch.randn(3000, device=d).bfloat16())
    ops.cross_entropy(torch.randn(9, 40000, device=d).half(), torch.randint(0, 40000, (9,), device=d))
    ops.sum(x), ops.amax(x)
    ops.transpose(torch.randn(100, 70, device=d).half())
    mod = newtc.compile("""
kernel hist(x, bins, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    atomic_add(bins + load(x + offs, mask=offs < n, other=0), 1, mask=offs < n)
""", "hist.nk")
    x = torch.randint(0, 16, (5000,), device=d, dtype=torch.int32)
    mod.hist[(5,)](x, torch.zeros(16, device=d, dtype=torch.int32), 5000, BLOCK=1024)
    torch.cuda.synchronize()
    print("sanitize: all kernels ran")


if __name__ == "__main__":
    main()
