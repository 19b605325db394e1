"""newtc.ops.matmul (stdlib/matmul.nk) against torch: in the interpreter on the CPU and on the GPU (marker gpu).

Odd sizes exercise every mask (M, N, K not multiples of the tiles, K shorter than the pipeline), transposed
views the column-major paths, bias and activations the epilogue. Outputs start as NaN.
"""
import pytest
import torch
import torch.nn.functional as F

import newtc
from newtc import ops

pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py
# relative Frobenius error: f32 runs as tf32 (10-bit mantissa), f16 and bf16 round the output
TOL = {torch.float32: 3e-3, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def reference(a, b, bias=None, activation=None, scale_a=None, scale_b=None):
    r = a.double() @ b.double()
    if scale_a is not None:
        r = r * scale_a.double()[:, None] * scale_b.double()[None, :]
    if bias is not None:
        r = r + bias.double()
    if activation == "relu":
        r = torch.relu(r)
    elif activation == "gelu":
        r = F.gelu(r)
    return r


def check(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype], f"relative error {err:.2e}"


SHAPES = {  # (M, N, K): the interpreter runs a program at a time in Python, so the CPU's stay small
    "cpu": [(1, 3, 8), (17, 45, 100), (64, 64, 64), (33, 1001, 40), (130, 140, 72)],
    "cuda": [(1, 3, 8), (17, 1001, 100), (1000, 1001, 4097), (1000, 3, 8), (16, 4096, 4096), (512, 768, 1024),
             (2048, 2048, 512), (257, 513, 33), (512, 4096, 1000),  # tiles 128x256, 64x64, 64x128, 128x128
             (1000, 1000, 1000),  # strides of an odd multiple of 8: TMA on sm_90a
             (2000, 4100, 4000), (1100, 3000, 1000),  # stream-K past 2 waves of 128x256 tiles; none under 2
             (1500, 5600, 1000),  # on sm_90a persistent, with a producer warpgroup: 264 tiles, two a program
             (300, 260, 8192)],  # split-K: 25 tiles, 5 programs each
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matmul(device, dtype):
    for m, n, k in SHAPES[device]:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        check(ops.matmul(a, b), reference(a, b), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("layout", ["a_t", "b_t", "both_t", "strided_rows"])
@pytest.mark.parametrize("size", ["small", "persistent", "persistent, odd N"])
def test_matmul_views(device, layout, size):
    """On sm_90a the persistent sizes take the producer warpgroup where A and B have a unit stride and the other a
    multiple of 8 (transposed ones too); with an odd N, C's rows are not 16-byte aligned (no TMA store)."""
    if device == "cpu" and size != "small":
        pytest.skip("the interpreter runs the small size")
    sizes = {"small": (1000, 1001, 516), "persistent": (1504, 5600, 264), "persistent, odd N": (1504, 5601, 264)}
    m, n, k = (70, 50, 40) if device == "cpu" else sizes[size]
    a = torch.randn(k, m, device=device).half().t() if layout in ("a_t", "both_t") else \
        torch.randn(m, k, device=device).half()
    b = torch.randn(n, k, device=device).half().t() if layout in ("b_t", "both_t") else \
        torch.randn(k, n, device=device).half()
    if layout == "strided_rows":  # every other row of a wider tensor
        a = torch.randn(m, 2 * k, device=device).half()[:, ::2][:, :k]
        b = torch.randn(k, n + 24, device=device).half()[:, :n]
    check(ops.matmul(a, b), reference(a, b), torch.float16)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_epilogue(device, activation, with_bias):
    for m, n, k in [(40, 72, 48)] if device == "cpu" else [(777, 1025, 320), (1500, 5600, 136)]:  # a program a tile,
        a, b = torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()  # and persistent
        bias = torch.randn(n, device=device).half() if with_bias else None
        check(ops.matmul(a, b, bias, activation), reference(a, b, bias, activation), torch.float16)


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("b_major", ["k", "n"])
def test_fp8_matmul(device, fp8, b_major):
    """fp8 operands, unscaled; the product in bf16 by default, or out_dtype. On sm_90a wgmma's fp8 form where B holds
    K contiguous (column-major: TMA boxes 128 K wide; a program a tile, and persistent), else mma.sync on pairs
    converted to f16; persistent and stream-K sizes; M under a wgmma block, K not a multiple of a step."""
    shapes = [(70, 50, 40)] if device == "cpu" else [(1000, 1001, 1024), (512, 768, 1024), (1504, 5600, 264),
                                                     (2000, 4100, 1024), (17, 1001, 100), (257, 513, 48),
                                                     (256, 512, 4096)]
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device).to(fp8)
        b = torch.randn(n, k, device=device).to(fp8).t() if b_major == "k" else torch.randn(k, n, device=device).to(fp8)
        for out_dtype in (None, torch.float32):
            check(ops.matmul(a, b, out_dtype=out_dtype), reference(a, b), out_dtype or torch.bfloat16)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("scales", ["tensor", "rows", "rows, flat"])
def test_fp8_matmul_scales(device, scales):
    """torch._scaled_mm's product, (a @ b) * scale_a * scale_b (+ bias, then the activation), with one scale each or
    one per row of a and column of b: a program a tile, persistent and stream-K (on sm_90a), with and without bias."""
    shapes = [(70, 50, 48)] if device == "cpu" else [(1000, 1001, 1024), (1504, 5600, 264), (2000, 4100, 1024)]
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=device).to(FP8[0]), torch.randn(n, k, device=device).to(FP8[0]).t()
        sa, sb = {"tensor": (torch.tensor(0.25), torch.tensor(3.0)),
                  "rows": (torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5),
                  "rows, flat": (torch.rand(m) + 0.5, torch.rand(n) + 0.5)}[scales]
        sa, sb = sa.to(device), sb.to(device)
        scaled = reference(a, b) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
        bias = torch.randn(n, device=device).bfloat16()
        check(ops.matmul(a, b, scale_a=sa, scale_b=sb), scaled, torch.bfloat16)
        check(ops.matmul(a, b, bias, "gelu", torch.float32, sa, sb), F.gelu(scaled + bias.double()), torch.float32)


@pytest.mark.parametrize("m, n, k, producer", [(1024, 2048, 4096, True), (512, 4096, 1024, True),
                                                (1536, 1024, 8192, True), (1024, 1024, 4096, False),
                                                (4096, 1024, 4096, False)])
def test_a_wave_of_tiles_on_one_warpgroup_takes_a_producer(m, n, k, producer):
    """A wave of 128x128 tiles or fewer on sm_90a: a program a tile, with a producer warpgroup (its one consumer
    warpgroup would wait on its own loads); 64-row tiles and two consumer warpgroups (128x256) go without."""
    a, b = torch.empty(m, k, dtype=torch.float16), torch.empty(k, n, dtype=torch.float16)
    meta, grid, sk, splits = ops._matmul_plan(a, b, 132, "sm_90a", 2)
    tiles = -(-m // meta["BM"]) * -(-n // meta["BN"])
    assert meta.get("WS", False) == producer and (sk, splits, grid) == (0, 1, tiles) and tiles <= 132
    assert ((meta["BM"], meta["num_warps"]) == (128, 4)) == producer


@pytest.mark.parametrize("arch, b_major, expect", [("sm_90a", "k", "QGMMA"), ("sm_80", "k", "HMMA"),
                                                   ("sm_80", "n", "HMMA")])
def test_fp8_matmul_runs_on_the_tensor_cores(arch, b_major, expect):
    """ops.matmul's 4096^3 fp8 kernel with scales: on sm_90a wgmma on fp8 (QGMMA) from TMA copies (persistent, with
    a producer warpgroup; ops copies a B that is not K-contiguous first); on sm_80 mma.sync in f16; no spills."""
    m = n = k = 4096
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn).t() if b_major == "k" else \
        torch.empty(k, n, dtype=torch.float8_e4m3fn)
    c, sa, sb = torch.empty(m, n, dtype=torch.bfloat16), torch.empty(m), torch.empty(n)
    meta = ops._matmul_plan(a, b, 132, arch, 2)[0]
    assert meta.get("WS", False) == (expect == "QGMMA")
    sass = ops._stdlib("matmul").matmul_fused.sass(a, b, c, c, sa, sb, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                                                   1, 1, arch=arch, BIAS=False, SCALE=True, **meta)
    assert expect in sass and "LDL" not in sass and "STL" not in sass
    assert ("UTMALDG" in sass) == (arch == "sm_90a")


@pytest.mark.parametrize("device", devices())
def test_fp8_operands_are_copied_k_contiguous_on_hopper(device, monkeypatch):
    """wgmma's fp8 form reads K-contiguous tiles: on sm_90a (the interpreter plans for it) an A column-major, a B
    row-major or strided both ways is first transposed into a copy whose rows are 16-byte aligned, and the product
    is planned on the copies; with bias and scales, a program a tile and stream-K."""
    planned, plan = [], ops._matmul_plan
    monkeypatch.setattr(ops, "_matmul_plan", lambda a, b, *rest: planned.append((a.stride(), b.stride())) or
                        plan(a, b, *rest))
    if device != "cpu" and ops._arch(torch.empty(0, device=device)) != "sm_90a":
        pytest.skip("the copies are for wgmma's fp8 form")
    shapes = [(70, 50, 40)] if device == "cpu" else [(1000, 1001, 1024), (2000, 4100, 1024), (4096, 4096, 256)]
    for m, n, k in shapes:  # (K-contiguous rows of 1024 and 256 bytes: TMA copies them as they are)
        kp = -(-k // 16) * 16
        for a_major, b_major in (("m", "n"), ("k", "n"), ("m", "k"), ("k", "strided")):
            a = torch.randn(k, m, device=device).to(FP8[0]).t() if a_major == "m" else \
                torch.randn(m, k, device=device).to(FP8[0])
            b = {"n": lambda: torch.randn(k, n, device=device).to(FP8[0]),
                 "k": lambda: torch.randn(n, k, device=device).to(FP8[0]).t(),
                 "strided": lambda: torch.randn(k, 2 * n, device=device).to(FP8[0])[:, ::2]}[b_major]()
            sa, sb = torch.rand(m, 1, device=device) + 0.5, torch.tensor(2.0, device=device)
            bias = torch.randn(n, device=device).bfloat16()
            want = reference(a, b) * sa.double() * 2 + bias.double()
            check(ops.matmul(a, b, bias, scale_a=sa, scale_b=sb), want, torch.bfloat16)
            assert planned[-1] == ((a.stride() if a_major == "k" else (kp, 1)), b.stride() if b_major == "k" else (1, kp))


@pytest.mark.parametrize("device", devices())
def test_operands_off_16_byte_rows_are_copied_aligned_on_hopper(device, monkeypatch):
    """On sm_90a the operands of a large product whose rows TMA cannot copy (off 16-byte boundaries) are first copied
    into aligned rows, laid out as they are (A row-major, B row-major or column-major; fp8 along K), and the product
    is planned on the copies (on the CPU, the size limits lowered); so are those of a small product of a long K loop (4
    steps of 128 bytes: 654x16x490 copies A, whose rows are 980 bytes apart, not B's of 32); one of a short K loop
    reads them as they are."""
    small = torch.randn(100, 101, device=device).half()
    assert ops._copies([small.t(), small.t()], 100, 100, 101, "sm_90a", None)[0] == []
    a, b = torch.randn(654, 490, device=device).bfloat16(), torch.randn(490, 16, device=device).bfloat16()
    assert [i for i, *_ in ops._copies([a.t(), b], 654, 16, 490, "sm_90a", None)[0]] == [0]
    check(ops.matmul(a, b), reference(a, b), torch.bfloat16)
    planned, plan = [], ops._matmul_plan
    monkeypatch.setattr(ops, "_matmul_plan", lambda a, b, *rest: planned.append((a.stride(), b.stride())) or
                        plan(a, b, *rest))
    if device == "cpu":
        monkeypatch.setattr(ops, "COPY_MIN", 1)
        monkeypatch.setattr(ops, "COPY_REUSE", 1)
    elif ops._arch(torch.empty(0, device=device)) != "sm_90a":
        pytest.skip("the copies are for TMA")
    up = lambda x, e: -(-x // e) * e  # noqa: E731
    for m, n, k in [(33, 41, 27)] if device == "cpu" else [(1001, 1001, 1001), (700, 2050, 999)]:
        for dtype, b_major in ((torch.float16, "n"), (torch.bfloat16, "k"), (FP8[0], "k")):
            a = torch.randn(m, k, device=device).to(dtype)
            b = torch.randn(k, n, device=device).to(dtype) if b_major == "n" else \
                torch.randn(n, k, device=device).to(dtype).t()
            e = 16 // a.element_size()
            want = reference(a, b)
            check(ops.matmul(a, b, out_dtype=torch.float32), want, torch.float32)
            assert planned[-1] == ((up(k, e), 1), (up(n, e), 1) if b_major == "n" else (1, up(k, e)))


@pytest.mark.parametrize("device", devices())
def test_decoding_copies_operands_off_16_byte_rows_whatever_the_size(device, monkeypatch):
    """A product of at most DECODE rows streams B: on sm_90a an operand off 16-byte rows is copied into aligned rows
    however small the product (plain loads that wait are slower than the copy and TMA), and the product matches."""
    if device != "cpu" and ops._arch(torch.empty(0, device=device)) != "sm_90a":
        pytest.skip("the copies are for TMA")
    planned, plan = [], ops._matmul_plan
    monkeypatch.setattr(ops, "_matmul_plan", lambda a, b, *rest: planned.append((a.stride(), b.stride())) or
                        plan(a, b, *rest))
    for m, n, k, dtype in [(1, 1001, 1001, torch.float16), (15, 3015, 1163, torch.bfloat16),
                           (64, 73, 41, torch.float16)]:
        a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
        assert [i for i, *_ in ops._copies([a.t(), b], m, n, k, "sm_90a", None)[0]] == [0, 1]
        check(ops.matmul(a, b), reference(a, b), dtype)
        assert planned[-1] == ((-(-k // 8) * 8, 1), (-(-n // 8) * 8, 1))
    wide = torch.randn(65, 101, device=device).half()  # past DECODE, a small product of a short K loop reads its
    assert ops._copies([wide.t(), wide.t()], 65, 65, 101, "sm_90a", None)[0] == []  # operands as they are


@pytest.mark.parametrize("device", devices())
def test_matmul_out_dtype(device):
    """A product in another dtype than its operands': f32 of f16 (on sm_90a, a program a tile and the persistent
    kernel, which stages the wider tile beside a slot fewer) and bf16 of f32."""
    for m, n, k in [(40, 72, 48)] if device == "cpu" else [(777, 1025, 320), (1504, 5600, 264)]:
        a, b = torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()
        check(ops.matmul(a, b, out_dtype=torch.float32), reference(a, b), torch.float32)
        check(ops.matmul(a.float(), b.float(), out_dtype=torch.bfloat16), reference(a, b), torch.bfloat16)


def test_the_tile_by_shape_fills_the_sms():
    """ops' tile weighs a big tile's rate against the SMs its last wave leaves idle and the part of it past C's edges:
    products of many tiles keep 128x256, a product that would leave most of an H200's 132 SMs idle takes a tile that
    fills 97% of them, and a narrow one a narrow tile."""
    def tiles(m, n):
        cfg = ops._matmul_config(m, n, 4096, 2, "sm_90a", 132)
        return (cfg["BM"], cfg["BN"]), -(-m // cfg["BM"]) * -(-n // cfg["BN"])
    assert tiles(4096, 4096) == ((128, 256), 512) and tiles(2048, 14336)[0] == (128, 256)
    for m, n in [(1024, 1024), (128, 8192), (8192, 128), (2048, 512), (256, 4096), (512, 4096), (1000, 1001)]:
        assert tiles(m, n)[1] >= 128, (m, n, tiles(m, n))
    assert tiles(65536, 64)[0] == (128, 64)  # a 128x256 tile would compute 4 columns for each one of C's (NARROW)
    assert tiles(4096, 64)[0] == (64, 64)  # a wave of 64x64 tiles: twice the programs of 128x64 pull A


@pytest.mark.parametrize("device", devices())
def test_narrow_products_stream_a_in_tiles_of_128_rows(device):
    """Products of B 64 columns wide or less, past a wave of 64x64 tiles, take 128x64 tiles 8 slots deep (NARROW), on
    sm_90a a program per SM walking them with a producer warpgroup where TMA can copy B (one column's rows are 2 bytes
    apart: a program per tile): right at ragged M, few columns and K off the step."""
    for m, n, k in ((8500, 64, 256), (17000, 8, 200), (9000, 48, 1000), (9000, 1, 300)):  # 67, 133 and 71 tiles
        a, b = torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()
        meta, grid, sk, splits = ops._matmul_plan(a, b, 132, "sm_90a", 2)
        ws = n > 1
        assert (meta["BM"], meta["BN"], meta.get("WS", False)) == (128, 64, ws), meta
        assert grid == (min(-(-m // 128), 132) if ws else -(-m // 128)) and meta["num_stages"] == (8 if ws else 6)
        check(ops.matmul(a, b), reference(a, b), torch.float16)


def test_a_short_k_loop_takes_tiles_that_share_an_sm_and_only_the_slots_it_fills():
    """With at most two K steps, a lone 128x256 program per SM leaves its first loads and its stores exposed: ops takes
    a tile two programs an SM can share, and (without a producer, whose ring also holds the next tile's steps) no more
    ring slots than K steps and one. Longer K loops keep 128x256 in 4 slots."""
    for k, slots in ((64, 2), (128, 3)):
        cfg = ops._matmul_config(4096, 4096, k, 2, "sm_90a", 132)
        assert (cfg["BM"], cfg["BN"], cfg["num_warps"], cfg["num_stages"]) == (128, 128, 4, slots), k
        assert ops._matmul_config(4096, 4096, k, 2, "sm_90a", 132, ws=2)["num_stages"] >= 3
    for k in (256, 4096):
        cfg = ops._matmul_config(4096, 4096, k, 2, "sm_90a", 132)
        assert (cfg["BM"], cfg["BN"], cfg["num_stages"]) == (128, 256, 4), k


@pytest.mark.parametrize("device", devices())
def test_stream_k_epilogue(device):
    """Stream-K tiles take the bias and the activation once, after their parts are added. On the GPU the second and
    third calls take the bound path, whose flags are made zero per call too (and B's rows, off 16 bytes, copied)."""
    m, n, k = (100, 70, 200) if device == "cpu" else (2000, 4100, 4000)
    a, b = torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()
    bias = torch.randn(n, device=device).half()
    if device == "cpu":  # ops plans an H200 on the CPU: 132 programs, too many for the interpreter; 5 here
        out, part = torch.empty(m, n).half(), torch.empty(5 * 32 * 32)
        ops._stdlib("matmul").matmul_sk[(5,)](a, b, out, bias, a, a, part, torch.zeros(5, dtype=torch.int32), m, n,
                                              k, k, 1, n, 1, n, 1, 0, 0, 4, BM=32, BN=32, BK=16, GROUP_M=2,
                                              ACTIVATION="gelu", BIAS=True)
        check(out, reference(a, b, bias, "gelu"), torch.float16)
        return
    assert ops._tile_rate(16 * 17, 63, 132, "sm_90a", (128, 256))[1] == 140  # 31% idle in 3 waves of 128x256
    for _ in range(3):
        check(ops.matmul(a, b, bias, "gelu"), reference(a, b, bias, "gelu"), torch.float16)
        a.normal_(), b.normal_(), bias.normal_()
    assert any(key[:2] == ("matmul", a.shape) for key in ops._fast)


@pytest.mark.parametrize("device", devices())
def test_split_k_epilogue(device):
    """Split-K tiles (ops plans an H200 on the CPU too) take the scales, the bias and the activation once, from the
    sum of their shares. On the GPU the second and third calls take the bound path, whose sums and counts are made
    zero per call too."""
    m, n, k = (100, 70, 4096) if device == "cpu" else (300, 260, 8192)
    a, b = torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()
    bias, sa, sb = torch.randn(n, device=device).half(), torch.rand(m, device=device) + 0.5, torch.rand(n, device=device)
    assert ops._matmul_plan(a, b, 132, "sm_90a", 2)[3] == (2 if device == "cpu" else 4)
    for _ in range(1 if device == "cpu" else 3):
        check(ops.matmul(a, b, bias, "gelu", scale_a=sa, scale_b=sb), reference(a, b, bias, "gelu", sa, sb),
              torch.float16)
        a.normal_(), b.normal_(), bias.normal_()
    assert device == "cpu" or any(key[:2] == ("matmul", a.shape) for key in ops._fast)


@pytest.mark.parametrize("m, n, k, splits", [(70, 50, 200, 3), (33, 65, 100, 4), (64, 64, 48, 5), (40, 30, 16, 2)])
def test_split_k_runs(m, n, k, splits):
    """matmul_split in the interpreter (its programs one after another): K steps of 16 shared out, a share of none
    where the splits outnumber the steps; every tile counted to `splits` once."""
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    tiles = -(-m // 32) * -(-n // 32)
    out, part = torch.full((m, n), float("nan")).half(), torch.zeros(tiles * 32 * 32 + tiles)
    ops._stdlib("matmul").matmul_split[(tiles * splits,)](a, b, out, a, a, a, part, m, n, k, k, 1, n, 1, n, 1, 0, 0,
                                                          splits, BM=32, BN=32, BK=16, GROUP_M=2)
    check(out, reference(a, b), torch.float16)
    assert part[-tiles:].tolist() == [splits] * tiles


def test_few_tiles_split_their_k_steps_over_the_sms():
    """Where the tiles fill half of the SMs or less, each tile's K goes to as many programs as fill one wave, a share
    SPLIT_BYTES of K at least; where an SM holds two programs of the tile, as many as fill both, a share twice as
    long; not off sm_90a. So 300x260x8192 f16 takes 25 tiles of 64x64, 4 programs each, and 768x512x12288 96, 2 each
    (64x64 in 6 slots of 16 KB: two an SM)."""
    assert [ops._splits(t, kb, 132) for t, kb in ((8, 65536), (33, 65536), (34, 65536), (66, 8192), (67, 65536),
                                                   (8, 8191), (1, 4096))] == [16, 4, 3, 2, 1, 1, 1]
    assert [ops._splits(t, kb, 132, 2) for t, kb in ((96, 16384), (96, 8192), (64, 32768), (64, 8192), (128, 16384),
                                                      (133, 65536))] == [2, 1, 4, 2, 2, 1]
    assert ops._splits(8, 65536, 132, 2, arch="sm_80") == 1
    assert ops._per_sm(64, 64, 4, 6 * 16384) == 2 and ops._per_sm(64, 128, 4, 6 * 24576) == 1
    for m, n, k, grid, splits in ((300, 260, 8192, 100, 4), (768, 512, 12288, 192, 2)):
        a, b = (torch.empty(shape, dtype=torch.float16, device="meta") for shape in ((m, k), (k, n)))
        meta, got_grid, sk, got_splits = ops._matmul_plan(a, b, 132, "sm_90a", 2)
        assert (meta["BM"], meta["BN"], got_grid, sk, got_splits) == (64, 64, grid, 0, splits)


@pytest.mark.parametrize("programs, sk_tiles, k", [(3, 2, 90), (4, 3, 40), (5, 6, 200), (7, 12, 33), (2, 12, 16),
                                                   (12, 20, 90), (13, 20, 33)])
def test_stream_k_runs(programs, sk_tiles, k):
    """matmul_sk in the interpreter, whose programs run one after another (the lowest first, as a GPU starts them): K
    step runs inside one tile, across several, whole tiles first, a K that is not a multiple of BK, and every tile
    stream-K over fewer programs than tiles (one to two waves). The flags raised are those of the programs whose runs
    end inside a tile."""
    m, n, BM, BN, BK = 100, 140, 32, 32, 16
    tiles, steps = -(-m // BM) * -(-n // BN), -(-k // BK)
    a, b, c = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    flags = torch.zeros(programs, dtype=torch.int32)
    ops._stdlib("matmul").matmul_sk[(programs,)](a, b, c, c, c, c, torch.empty(programs * BM * BN), flags, m, n, k,
                                                 k, 1, n, 1, n, 1, 0, 0, sk_tiles, BM=BM, BN=BN, BK=BK, GROUP_M=2)
    check(c, reference(a, b), torch.float32)
    units = sk_tiles * steps
    assert flags.tolist() == [int((p + 1) * units // programs % steps != 0) for p in range(programs)]


def test_stream_k_where_the_last_wave_is_part_empty():
    """Where stream-K's rate (its split tiles SK_COST steps longer) beats whole tiles' over their waves, the tiles past
    whole waves go stream-K (the last full wave's too, so that a run is a tile or two long), and all of them under two
    waves; none where the waves are nearly full (512 tiles: 4096^3), in one wave or less, with a short K loop, in tiles
    smaller than 128x256, or off sm_90a. 3072^3 keeps 128x256 tiles, and 3072x1536x4096 takes them over 144 tiles
    stream-K (H200: 1.28x the 64x128 tiles of whole waves it took before)."""
    def sk(tiles, steps=64, tile=(128, 256), arch="sm_90a"):
        return ops._tile_rate(tiles, steps, 132, arch, tile)[1]
    assert [sk(t) for t in (288, 561, 200, 512, 2048, 264, 131)] == [156, 165, 200, 0, 0, 0, 0]
    assert sk(288, steps=16) == sk(288, tile=(64, 128)) == sk(288, arch="sm_80") == 0
    for size in (4096, 3072):
        cfg = ops._matmul_config(size, size, size, 2, "sm_90a", 132)
        assert (cfg["BM"], cfg["BN"]) == (128, 256)
    a, b = torch.empty(3072, 4096, dtype=torch.float16), torch.empty(4096, 1536, dtype=torch.float16)
    meta, grid, tiles, _ = ops._matmul_plan(a, b, 132, "sm_90a", 2)
    assert (meta["BM"], meta["BN"], grid, tiles) == (128, 256, 132, 144)


def test_a_matmul_of_more_tiles_than_sms_goes_persistent_on_hopper():
    """With more tiles than SMs (and none stream-K) on sm_90a, ops launches a program per SM with a producer warpgroup,
    its tile stored in column halves beside a 4-slot ring, where A and B are 16-bit TMA copies (a unit stride, the
    other a multiple of 8; either may be transposed); else a program per tile. The persistent kernel it launches has
    its producer (setmaxnreg)."""
    def plan(a, b, arch="sm_90a", out=2):
        meta, grid, sk, _ = ops._matmul_plan(a, b, 132, arch, out)
        return meta.get("WS", False), grid, sk, meta["num_stages"]

    def empty(*shape, dtype=torch.float16):
        return torch.empty(*shape, dtype=dtype, device="meta")
    big = empty(4096, 4096)
    assert plan(big, big) == (True, 132, 0, 4)
    meta = ops._matmul_plan(big, big, 132, "sm_90a", 2)[0]
    x, n = torch.empty(256, 256, dtype=torch.float16), 4096
    args = (x, x, x, n, n, n, n, 1, n, 1, n, 1)
    assert "setmaxnreg" in ops._stdlib("matmul").matmul.output(args, meta, "cuda", "sm_90a").cuda.source
    assert plan(big, big, "sm_80")[:2] == (False, 512)
    assert plan(empty(4096, 4096, dtype=torch.float32), empty(4096, 4096, dtype=torch.float32))[:2] == (False, 512)
    assert plan(empty(4096, 4096).t(), big)[:2] == (True, 132)
    assert plan(empty(4096, 4100)[:, :4096], big)[:2] == (False, 512)  # rows 4100 apart: cp.async
    assert plan(empty(2048, 2048), empty(2048, 2048))[:2] == (False, 128)  # a wave of tiles
    assert plan(empty(3072, 3072), empty(3072, 3072))[:3] == (False, 132, 156)  # stream-K
    assert plan(big, big, out=4) == (True, 132, 0, 3)  # an f32 product staged beside the ring: a slot fewer
    f8 = torch.float8_e4m3fn  # fp8 as wgmma takes it (B column-major): 128 K a step; else converted to f16
    assert plan(empty(4096, 4096, dtype=f8), empty(4096, 4096, dtype=f8).t()) == (True, 132, 0, 4)
    assert plan(empty(4096, 4096, dtype=f8), empty(4096, 4096, dtype=f8))[:2] == (False, 512)


def test_matmul_rejects_bad_operands():
    with pytest.raises(newtc.NkError, match=r"matmul takes \[M, K\] @ \[K, N\]"):
        ops.matmul(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(newtc.NkError, match="share a dtype"):
        ops.matmul(torch.randn(3, 4), torch.randn(4, 6).half())
    with pytest.raises(newtc.NkError, match="f32, f16, bf16 or fp8"):
        ops.matmul(torch.ones(3, 4, dtype=torch.int32), torch.ones(4, 6, dtype=torch.int32))
    with pytest.raises(newtc.NkError, match="out_dtype is f32, f16 or bf16"):
        ops.matmul(torch.randn(3, 4), torch.randn(4, 6), out_dtype=torch.int32)
    with pytest.raises(newtc.NkError, match="activation is None, \"relu\" or \"gelu\", got 'tanh'"):
        ops.matmul(torch.randn(3, 4), torch.randn(4, 6), activation="tanh")
    with pytest.raises(newtc.NkError, match="scale_a and scale_b together"):
        ops.matmul(torch.randn(3, 4), torch.randn(4, 6), scale_a=torch.ones(()))
    for sa, sb in ((torch.ones(2), torch.ones(6)), (torch.ones(3, 6), torch.ones(6)), (torch.ones(3).half(), torch.ones(6))):
        with pytest.raises(newtc.NkError, match=r"scale_a is f32 with one value or 3"):
            ops.matmul(torch.randn(3, 4), torch.randn(4, 6), scale_a=sa, scale_b=sb)
    for bias in (torch.randn(5), torch.randn(3, 6)):  # too short (read past its end), or a whole C
        with pytest.raises(newtc.NkError, match=r"bias has one value per column of the product, \[6\]"):
            ops.matmul(torch.randn(3, 4), torch.randn(4, 6), bias)


I8 = """\
kernel i8dot(a, b, c, BM: constexpr, BN: constexpr, BK: constexpr):
    rm = arange(0, BM)
    rn = arange(0, BN)
    rk = arange(0, BK)
    x = load(a + rm[:, None] * BK + rk[None, :])
    y = load(b + rk[:, None] * BN + rn[None, :])
    store(c + rm[:, None] * BN + rn[None, :], dot(x, y))
"""


@pytest.mark.parametrize("device", devices())
def test_i8_dot_accumulates_in_i32(device):
    mod = newtc.compile(I8, "i8.nk")
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8, device=device)
    b = torch.randint(-128, 128, (64, 16), dtype=torch.int8, device=device)
    c = torch.full((32, 16), -1, dtype=torch.int32, device=device)
    mod.i8dot[(1,)](a, b, c, BM=32, BN=16, BK=64)
    assert torch.equal(c.cpu(), (a.cpu().long() @ b.cpu().long()).int())  # torch has no integer matmul on CUDA


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_i8_dot_runs_on_the_tensor_cores(arch):
    mod = newtc.compile(I8, "i8.nk")
    a, b = torch.zeros(32, 64, dtype=torch.int8), torch.zeros(64, 16, dtype=torch.int8)
    sass = mod.i8dot.sass(a, b, torch.zeros(32, 16, dtype=torch.int32), BM=32, BN=16, BK=64, arch=arch)
    assert "IMMA" in sass and "LDL" not in sass


def test_a_tile_stored_to_rows_off_16_bytes_keeps_a_warps_stores_on_consecutive_elements():
    """A tensor-core tile that TMA cannot store goes out through shared memory in the coalesced layout: 8 halves a
    lane where 16-byte groups fit the rows; to rows off 16 bytes (odd N, or N = 1004, 8-byte rows the analysis cannot
    prove) one element at a time, the lanes on consecutive ones (8 halves a lane stored one by one would spread each of
    a warp's stores over 16 sectors), while every thread keeps the rows of the 16-byte layout."""
    from newtc import ir
    from newtc.layout import blocked
    m = k = 1024
    for n in (1001, 1004):
        a, b, c = torch.empty(m, k).half(), torch.empty(k, n).half(), torch.empty(m, n).half()
        meta = ops._matmul_plan(a, b, 132, "sm_90a", 2)[0]
        kernel = ops._stdlib("matmul").matmul.output((a, b, c, m, n, k, k, 1, n, 1, n, 1),
                                                     dict(ACTIVATION="none", **meta), "ir", "sm_90a").kernel
        (lay,) = [op.args[1].layout for op in ir.walk(kernel.body) if op.kind == "store" and op.args[1].type.shape]
        bn, wide = meta["BN"], blocked((meta["BM"], meta["BN"]), meta["num_warps"], 8, (1, 0))
        columns = [bit for bit in lay.lane if bit < bn]
        assert len(columns) >= 4 and columns == [1, 2, 4, 8, 16][:len(columns)], (n, lay)
        assert [bit for bit in wide.lane if bit < bn][:4] == [8, 16, 32, 64]
        for held in ("reg", "lane", "warp"):
            assert [b for b in getattr(lay, held) if b >= bn] == [b for b in getattr(wide, held) if b >= bn], held


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, FP8[0]])
def test_rows_off_16_bytes_match_torch(dtype, monkeypatch):
    """Operands read as they are (the aligned copies off) with rows 2 to 14 bytes off 16 go through cp.async's run-time
    checked fallback (rows of a warp on and off 16 bytes, K's end inside a group of 16 bytes); decoding too."""
    monkeypatch.setattr(ops, "_copies", lambda views, m, n, k, arch, key: ([], key))
    fp8 = dtype in FP8
    for m, n, k in [(654, 16, 490), (300, 70, 130), (257, 40, 131), (130, 98, 202), (8, 1002, 1002), (3, 515, 77)]:
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(n, k, device="cuda").to(dtype).t() if fp8 else torch.randn(k, n, device="cuda").to(dtype)
        out = ops.matmul(a, b, out_dtype=torch.float32)
        check(out, reference(a, b), torch.float32)
