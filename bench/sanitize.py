"""Every kind of newt kernel once, on small odd shapes, for compute-sanitizer:

    compute-sanitizer --tool memcheck python bench/sanitize.py
    compute-sanitizer --tool racecheck python bench/sanitize.py

Pipelined matmuls (cp.async rings, ldmatrix), a transposed operand, the epilogue, reductions across warps, row
kernels, the transpose, an atomic histogram; TMA copies into an mbarrier ring, a warp-specialized one, and one in
clusters; stream-K's parts and flags; split-K's atomic sums; attention forward and backward; scans, a sort and a
histogram across warps; a spin lock on a scalar atomic in a `while` loop; block pointers; fp8 conversions and
products. Without a GPU it runs the same kernels through the interpreter (a check that the script itself is right)."""
import itertools

import torch

import common  # noqa: F401 - puts the checkout on sys.path
import newtc
from newtc import ops


def main() -> None:
    d = "cuda" if torch.cuda.is_available() else "cpu"
    for m, n, k in ((100, 70, 90), (17, 1001, 40), (300, 260, 130)):
        for dt in (torch.float16, torch.bfloat16, torch.float32):
            a, b = torch.randn(m, k, device=d, dtype=dt), torch.randn(k, n, device=d, dtype=dt)
            ops.matmul(a, b)
    a, b = torch.randn(700, 999, device=d).half(), torch.randn(999, 1030, device=d).half()
    ops.matmul(a, b)  # rows off 16 bytes in a large product: copied into aligned rows first (on sm_90a)
    for (m, n, k), fmt in itertools.product(((100, 70, 96), (300, 260, 272)), (torch.float8_e4m3fn, torch.float8_e5m2)):
        a, bt = torch.randn(m, k, device=d).to(fmt), torch.randn(n, k, device=d).to(fmt)  # fp8: wgmma's own on sm_90a
        ops.matmul(a, bt.t()), ops.matmul(a.t().contiguous().t(), bt.t().contiguous())  # others copied K-major first
        b, c = bt.t().contiguous(), torch.empty(m, n, device=d).bfloat16()  # the kernel's own on B row-major: as f16
        ops._stdlib("matmul").matmul[(-(-m // 64) * -(-n // 64),)](a, b, c, m, n, k, k, 1, n, 1, n, 1, BM=64, BN=64,
                                                                   BK=64, GROUP_M=8, num_warps=4, num_stages=3)
    for m, n, k in ((100, 72, 88), (300, 264, 136)):  # the descriptor matmul: TMA copies and mbarriers on sm_90a
        a, b, c = torch.randn(m, k, device=d).half(), torch.randn(k, n, device=d).half(), torch.empty(m, n, device=d).half()
        ops._stdlib("matmul").matmul_tma[(-(-m // 64) * -(-n // 64),)](a, b, c, m, n, k, k, n, n, BM=64, BN=64, BK=32,
                                                                       GROUP_M=8, num_warps=4, num_stages=3)
    # warp-specialized or not: the producer's empty-barrier waits, and none; a program per tile, and 2 walking 9 tiles
    # (without WS the next tile's ring reuses the bytes that staged this tile's output); the tile whole and in halves
    # (of 256 columns: each in two quarters, through staging buffers that alternate); and 128 rows on one warpgroup,
    # 128 or 64 columns (ops' NARROW tile)
    for (m, n, k, grid), (bn, warps, halves), ws in itertools.product(
            ((300, 264, 136, 9), (300, 264, 136, 2), (100, 72, 40, 1)),
            ((128, 8, False), (256, 8, True), (128, 4, True), (64, 4, True)), (False, True)):
        a, b, c = torch.randn(m, k, device=d).half(), torch.randn(k, n, device=d).half(), torch.empty(m, n, device=d).half()
        ops._stdlib("matmul").matmul[(grid,)](a, b, c, m, n, k, k, 1, n, 1, n, 1, BM=128, BN=bn, BK=32, GROUP_M=8, WS=ws,
                                              HALVES=halves, num_warps=warps, num_stages=3)
    for grid in (6, 2):  # clusters of 2 sharing B's copies: a program per tile, and one cluster walking them
        m, n, k = 300, 264, 136
        a, b, c = torch.randn(m, k, device=d).half(), torch.randn(k, n, device=d).half(), torch.empty(m, n, device=d).half()
        ops._stdlib("matmul").matmul[(grid,)](a, b, c, m, n, k, k, 1, n, 1, n, 1, BM=128, BN=128, BK=32, GROUP_M=8,
                                              WS=True, CTAS=2, num_warps=8, num_stages=3, num_ctas=2)
    m, n, k = 300, 264, 136  # stream-K: 9 tiles' K steps over 6 programs, parts through memory and flags
    a, b, c = torch.randn(m, k, device=d).half(), torch.randn(k, n, device=d).half(), torch.empty(m, n, device=d).half()
    ops._stdlib("matmul").matmul_sk[(6,)](a, b, c, c, c, c, torch.empty(6 * 128 * 128, device=d),
                                          torch.zeros(6, device=d, dtype=torch.int32), m, n, k, k, 1, n, 1, n, 1, 0, 0, 9,
                                          BM=128, BN=128, BK=32, GROUP_M=8, num_warps=8, num_stages=3)
    assert torch.allclose(c.float(), a.float() @ b.float(), atol=0.1, rtol=0.02)
    m, n, k = 300, 260, 2048  # split-K: 6 tiles' K steps over 4 programs each, summed by atomics, the last one stores
    a, b, c = torch.randn(m, k, device=d).half(), torch.randn(k, n, device=d).half(), torch.empty(m, n, device=d).half()
    ops._stdlib("matmul").matmul_split[(24,)](a, b, c, c, c, c, torch.zeros(6 * 128 * 256 + 6, device=d), m, n, k, k,
                                              1, n, 1, n, 1, 0, 0, 4, BM=128, BN=256, BK=64, GROUP_M=8, num_warps=8,
                                              num_stages=4)
    assert torch.allclose(c.float(), a.float() @ b.float(), atol=0.2, rtol=0.02)
    a, b = torch.randn(90, 100, device=d).half().t(), torch.randn(90, 70, device=d).half()
    ops.matmul(a, b, torch.randn(70, device=d).half(), "gelu")
    x = torch.randn(33, 3000, device=d)
    ops.softmax(x), ops.log_softmax(x.half())
    # rows off 16-byte boundaries: whole, split and looped (7x262143: a split's last chunk past some rows' ends)
    for rows, n in ((7, 1001), (3, 50257), (300, 50257), (7, 262143)):
        y = torch.randn(rows, n, device=d)
        ops.softmax(y), ops.rmsnorm(y, torch.randn(n, device=d)), ops.rmsnorm(y.half(), torch.randn(n, device=d).half())
    for rows, n, dt in ((1024, 1283, torch.bfloat16), (2048, 1025, torch.half)):  # softmax's rows alone on 1-2 warps
        ops.softmax(torch.randn(rows, n, device=d, dtype=dt))
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
    q, k, v = (torch.randn(2, 4, 77, 64, device=d, dtype=torch.float16, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        ops.attention(q, k[:, :2], v[:, :2], causal=causal).sum().backward()
    mod = newtc.compile("""
def add(a, b):
    return a + b

kernel moves(x, out, lock, total, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    v = load(x + offs, mask=offs < n, other=0.0)
    c = cumsum(v, axis=0) + associative_scan(v, 0, add, reverse=True)
    s = sort(v, descending=True)
    h = histogram(minimum((abs(v) * 4).to(i32), 7), 8, mask=offs < n)
    while atomic_cas(lock, 0, 1) == 1:
        pass
    store(total, load(total) + sum(h, axis=0))
    atomic_xchg(lock, 0)
    p = make_block_ptr(out, (n,), (1,), (0,), (BLOCK,), (0,))
    store(p, (c + s).to(f8e4m3).to(f32), boundary_check=(0,))
""", "moves.nk")
    x = torch.randn(1000, device=d)
    out, lock, total = torch.empty_like(x), torch.zeros(1, device=d, dtype=torch.int32), torch.zeros(1, device=d,
                                                                                                      dtype=torch.int32)
    mod.moves[(4,)](x, out, lock, total, 1000, BLOCK=1024, num_warps=8)
    assert int(total[0]) == 4 * 1000, int(total[0])  # every program counted its 1000 values under the lock
    if d == "cuda":
        torch.cuda.synchronize()
    print("sanitize: all kernels ran")


if __name__ == "__main__":
    main()
