"""CUDA generation, NVRTC and SASS for every stdlib kernel (no GPU needed: NVRTC and cuobjdump run anywhere).

Each stdlib kernel has representative specializations (the dtypes and constexprs newtc/ops.py launches
with), each compiled for sm_80 and sm_90a and checked in its SASS: no local memory, and the instructions
that make it fast (128-bit loads, warp shuffles, shared memory).
"""
from __future__ import annotations

import functools
import re
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import newtc
from newtc import compiler, ir, nvrtc, ops, syntax
from newtc.ops import _matmul_config
from newtc.types import Ptr, bf16, f16, f32, f64, i32, i64

STDLIB = Path(__file__).resolve().parents[1] / "stdlib"
ARCHS = ["sm_80", "sm_90a"]


def ptrs(dt, *names):
    return {n: Ptr(dt) for n in names}


@dataclass(frozen=True)
class Spec:
    file: str  # stem of stdlib/<file>.nk
    kernel: str
    label: str
    sig: tuple  # ((name, DType/Ptr), ...): hashable, for the compile cache
    consts: tuple
    num_warps: int
    num_stages: int
    expect: frozenset = field(default_factory=frozenset)  # SASS opcodes (prefixes) that must appear
    aligned: frozenset = frozenset()  # parameters specialized as 16-byte aligned / multiples of 16
    ones: frozenset = frozenset()  # int parameters specialized as equal to 1
    positive: frozenset = frozenset()  # int parameters specialized as above 0
    archs: tuple = ("sm_80", "sm_90a")  # what it is compiled for (a launch's configuration may fit only one)

    @property
    def id(self) -> str:
        return f"{self.file}.{self.kernel}-{self.label}"

    def compiler(self, arch: str) -> compiler.Spec:
        return compiler.Spec(self.sig, self.consts, self.num_warps, self.num_stages, aligned=self.aligned,
                             ones=self.ones, positive=self.positive, arch=arch)


def spec(file, kernel, label, sig, consts, num_warps, *expect, aligned=None, num_stages=1, ones=(), positive=()):
    """`aligned` defaults to the pointers: what a launch with freshly allocated torch tensors specializes on
    (sizes such as 1000 are not multiples of 16)."""
    if aligned is None:
        aligned = [n for n, t in sig.items() if isinstance(t, Ptr)]
    return Spec(file, kernel, label, tuple(sig.items()), tuple(consts.items()), num_warps, num_stages, frozenset(expect),
                frozenset(aligned), frozenset(ones), frozenset(positive))


def add_sig(dt):
    return {**ptrs(dt, "x", "y", "out"), "n": i32}


def rows_sig(dt):
    return {**ptrs(dt, "x", "out"), "n_cols": i32, "stride": i32}


def gelu_sig(dt):
    return {**ptrs(dt, "x", "bias", "out"), "n": i32, "n_cols": i32}


MATMUL_INTS = "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()


def matmul(kernel, label, dt, m, n, k, *expect, activation="none", transposed=False, archs=("sm_80", "sm_90a"),
           ws=False):
    """The specializations newtc.ops.matmul launches on contiguous tensors of these sizes (or A transposed), on
    each arch (the ring's depth follows the arch's shared memory); with `ws`, its persistent launch: the loop
    warp-specialized, on sm_90a the tile stored in column halves beside the ring."""
    sk = kernel == "matmul_sk"  # stream-K: its bias, parts and flags, and the tiles it deals out as K steps
    split = kernel == "matmul_split"  # split-K: its bias, f32 sums and counts, and the programs a tile's K goes to
    fused = kernel != "matmul"  # a bias (and scales, not taken: ops passes A for them, their strides 0)
    sig = {**ptrs(dt, "a", "b", "c"), **({"bias": Ptr(dt), "scale_a": Ptr(dt), "scale_b": Ptr(dt)} if fused else {}),
           **({"part": Ptr(f32), "flags": Ptr(i32)} if sk else {"part": Ptr(f32)} if split else {}),
           **{name: i32 for name in MATMUL_INTS}, **({"stride_sa": i32, "stride_sb": i32} if fused else {}),
           **({"sk_tiles": i32} if sk else {"splits": i32} if split else {})}
    strides = dict(stride_am=1 if transposed else k, stride_ak=m if transposed else 1, stride_bk=n, stride_bn=1,
                   stride_cm=n, stride_cn=1, **(dict(stride_sa=0, stride_sb=0) if fused else {}))
    values = dict(M=m, N=n, K=k, **strides, **({"sk_tiles": 156} if sk else {"splits": 5} if split else {}))
    aligned = [name for name, t in sig.items() if isinstance(t, Ptr)] + [x for x, v in values.items() if v % 16 == 0]
    out = []
    for arch in archs:
        cfg = _matmul_config(m, n, k, dt.itemsize, arch, ws=dt.itemsize * ws)
        nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
        consts = {**cfg, "GROUP_M": 8, "ACTIVATION": activation, **({"BIAS": True} if sk or split else {"WS": ws}),
                  **({"HALVES": True} if ws and arch == "sm_90a" else {})}  # (mma.sync's halves are not selections)
        s = spec("matmul", kernel, f"{label}-{arch}", sig, consts, nw,
                 *expect, aligned=aligned, num_stages=ns, ones=[x for x, v in values.items() if v == 1],
                 positive=[x for x, v in values.items() if v > 0])
        out.append(dataclasses.replace(s, archs=(arch,)))
    return out


ATTENTION_INTS = "L_q L_k H H_kv".split()
ATTENTION_STRIDES = [f"stride_{t}{d}" for t in "qkvo" for d in ("b", "h", "m" if t in "qo" else "n")]


def attention(label, dt, d, causal, bm, bn, warps, stages, *expect):
    """The forward kernel on contiguous (B, H, L, D) tensors, lengths multiples of 16."""
    sig = {**ptrs(dt, "q", "k", "v", "o"), "lse": Ptr(f32), **{n: i32 for n in ATTENTION_INTS}, "scale": f32,
           **{n: i32 for n in ATTENTION_STRIDES}}
    return spec("attention", "attention_fwd", label, sig, {"BM": bm, "BN": bn, "D": d, "CAUSAL": causal}, warps,
                *expect, aligned=[n for n in sig if n != "scale"], num_stages=stages)


MMA = ("sm_80:HMMA", "sm_80:LDSM", "sm_90a:HGMMA", "LDGSTS", "BAR.SYNC")
TMA = ("sm_80:HMMA", "sm_80:LDSM", "sm_80:LDGSTS", "sm_90a:HGMMA", "sm_90a:UTMALDG", "sm_90a:SYNCS", "BAR.SYNC")


def matmul_tma(label, dt, m, n, k) -> list:
    """stdlib/matmul.nk's descriptor kernel on row-major tensors: TMA copies on sm_90a, cp.async on sm_80."""
    sig = {**ptrs(dt, "a", "b", "c"), **{x: i32 for x in ("M", "N", "K", "stride_am", "stride_bk", "stride_cm")}}
    values = dict(M=m, N=n, K=k, stride_am=k, stride_bk=n, stride_cm=n)
    aligned = ["a", "b", "c"] + [x for x, v in values.items() if v % 16 == 0]
    out = []
    for arch, expect in (("sm_80", ("HMMA", "LDGSTS")), ("sm_90a", ("HGMMA", "UTMALDG", "SYNCS"))):
        cfg = _matmul_config(m, n, k, dt.itemsize, arch)
        nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
        s = spec("matmul", "matmul_tma", f"{label}-{arch}", sig, {**cfg, "GROUP_M": 8}, nw, *expect, aligned=aligned,
                 num_stages=ns, positive=values)
        out.append(dataclasses.replace(s, archs=(arch,)))
    return out


def attention_launched(kernel, label, dt, d, causal, *expect, archs=("sm_80", "sm_90a")):
    """An attention kernel as newtc.ops.attention launches it on contiguous (B, H, 4096, D) tensors, per arch: its
    parameters typed from the source (lse and delta f32, the other tensors dt), sizes and strides above 0, blocks
    from ops' rule. On sm_90a its streamed tiles are then TMA copies (4-D maps: the program's head and batch)."""
    module = syntax.parse((STDLIB / "attention.nk").read_text())
    params = [p.name for p in next(x for x in module.defs if x.name == kernel).params if p.default is None and
              not (p.annotation and getattr(p.annotation, "id", "") == "constexpr")]
    sig = {n: Ptr(f32) if n in ("lse", "delta") else f32 if n == "scale" else i32 if n[0] in "LHs" else Ptr(dt)
           for n in params}
    which = kernel.rsplit("_", 1)[-1]
    out = []
    for arch in archs:
        cfg = ops._attention_blocks(d, 4096, 4096, which, arch)
        nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
        consts = {**cfg, "CAUSAL": causal}
        s = spec("attention", kernel, f"{label}-{arch}", sig, consts, nw, *expect,
                 aligned=[n for n in sig if n != "scale"], num_stages=ns, positive=[n for n in sig if sig[n] == i32])
        out.append(dataclasses.replace(s, archs=(arch,)))
    return out


def transpose_sig(dt):
    return {**ptrs(dt, "x", "out"), "M": i32, "N": i32, "x_stride": i32, "out_stride": i32}


BWD = ("sm_80:HMMA", "sm_90a:HGMMA", "sm_80:LDGSTS", "sm_90a:UTMALDG", "BAR.SYNC")
# the backward's specs that do not spill, by (kernel, D); the others are in ATTENTION_SPILLING
BWD_ARCHS = {("attention_bwd_dkdv", 256): (), ("attention_bwd_dkdv", 64): ("sm_80",),
             ("attention_bwd_dq", 256): ("sm_90a",)}
# (spec, arch) that compile and run on the tensor cores but spill, kept out of SPECS (whose test forbids it): dK/dV
# at D 256 on both archs and dQ at D 256 on sm_80 (each holds two [rows, D] tiles beside its f32 accumulators), dK/dV
# at D 128 causal on sm_80 and the forward at D 256 on sm_80 (mma.sync's fragments take more registers). On sm_90a the forward's blocks measured
# fastest on the H200 spill a few values and stay fastest (bench/RESULTS.md, third session): one warpgroup holding
# 128 queries (D 64: 20-28 local accesses; D 128: one value across the loop; 1.09x and 1.15x of two warpgroups).
ATTENTION_SPILLING = [(s, s.archs[0]) for s in [
    *attention_launched("attention_bwd_dkdv", "f16-d256-causal", f16, 256, True),
    *attention_launched("attention_bwd_dq", "f16-d256-causal", f16, 256, True, archs=("sm_80",)),
    *attention_launched("attention_bwd_dkdv", "f16-d128-causal", f16, 128, True, archs=("sm_80",)),
    *attention_launched("attention_fwd", "f16-d256", f16, 256, True, archs=("sm_80",)),
    *(s for d in (64, 128) for s in attention_launched("attention_fwd", f"f16-d{d}", f16, d, True, archs=("sm_90a",))),
    # dK/dV at D 64 on sm_90a streams 128 queries (9-13 local accesses): 551 TFLOP/s against 476 for 64 (RESULTS.md,
    # twelfth session)
    *(s for causal in (False, True) for s in attention_launched(
        "attention_bwd_dkdv", "f16-d64" + ("-causal" if causal else ""), f16, 64, causal, archs=("sm_90a",)))]]
VEC = ("LDG.E.128", "STG.E.128")
RED = ("SHFL.BFLY",)
SMEM = ("STS", "LDS", "BAR.SYNC")
TORCH = {f32: torch.float32, f16: torch.float16, bf16: torch.bfloat16}


def launched(op: str, dt, shape: tuple, *expect_per_kernel, stride: int | None = None, **kw) -> list[Spec]:
    """The specializations newtc.ops launches for `op` on a [rows, n] tensor of `dt` (row `stride`, default
    n): one per kernel of the plan the model makes for that shape, each with its own SASS expectations."""
    rows, n = shape
    x = torch.empty(rows, stride or n, dtype=TORCH[dt])[:, :n]
    x2 = ops._rows(x)
    if op == "cross_entropy":
        (steps, alloc), inputs = ops._cross_entropy_steps(x2), (x2, torch.zeros(rows, dtype=torch.int64))
    elif op in ("layernorm", "rmsnorm"):
        w = torch.empty(n, dtype=TORCH[dt])
        (steps, alloc), inputs = ops._norm_steps(x2, op == "rmsnorm", op == "layernorm"), (x2, w, w, 1e-5)
    else:
        (steps, alloc), inputs = ops._softmax_steps(x2, op == "log_softmax"), (x2,)
    values = inputs + alloc(x)
    assert len(steps) == len(expect_per_kernel), [k.name for k, *_ in steps]
    out = []
    for (kernel, grid, args, meta), expect in zip(steps, expect_per_kernel):
        s = kernel.specialize([values[a.i] if isinstance(a, ops._In) else a for a in args], meta)
        label = f"{op}-{dt.name}-{rows}x{n}" + (f"-stride{stride}" if stride else "")
        file = Path(kernel.module.filename).stem
        out.append(Spec(file, kernel.name, label, s.sig, s.constexprs, s.num_warps, s.num_stages, frozenset(expect),
                        frozenset(s.aligned), frozenset(s.ones), frozenset(s.positive)))
    return out


LOOP = (*RED, "LDG.E.128")  # a loop over blocks of the row: per-lane state, merged by shuffles at the end
# SHIFT_STORES: stores to rows off 16-byte boundaries check each group's masks at run time (the row's ends are
# masked), and NVRTC turns the vector branch of those 16-bit stores into 32-bit ones (STG.E): still coalesced.
# The row ops on shapes that reach every kernel and kind of plan of ops.plan (each comment names the plan the
# model makes; test_ops checks the kinds themselves): whole rows (several per program for short rows), looped,
# split (partial statistics, then the merge), with rows on 16-byte boundaries and off them (SHIFT).
ROW_SPECS = [
    *launched("softmax", f32, (32768, 1000), (*RED, *VEC)),  # whole rows
    *launched("log_softmax", bf16, (8192, 4096), (*RED, *VEC)),
    *launched("softmax", f32, (32768, 64), (*RED, *VEC)),  # several rows per program
    *launched("softmax", f16, (4096, 1001), (*RED, "LDG.E.128")),  # rows off 16-byte boundaries (SHIFT_STORES)
    *launched("softmax", f32, (1024, 32768), (*RED, *VEC)),  # 32 warps, the widest whole row
    *launched("softmax", bf16, (4096, 65536), (*LOOP, "STG.E.128")),  # looped
    *launched("log_softmax", bf16, (4096, 50257), LOOP),  # looped, off boundaries (SHIFT_STORES)
    *launched("softmax", f32, (1, 262144), LOOP, VEC),  # split
    *launched("cross_entropy", f16, (4096, 32000), LOOP),  # looped
    *launched("cross_entropy", bf16, (32768, 1000), (*RED, "LDG.E.128")),  # whole rows
    *launched("cross_entropy", f32, (8, 50257), LOOP, RED),  # split, off boundaries
    *launched("layernorm", f16, (16384, 4096), (*RED, *VEC)),  # whole rows
    *launched("rmsnorm", bf16, (32768, 128), (*RED, *VEC)),  # several rows per program
    *launched("layernorm", bf16, (4096, 5120), (*RED, *VEC)),  # a block and a tail (4096 + 1024)
    *launched("softmax", f16, (4096, 11008), (*RED, *VEC)),
    *launched("cross_entropy", bf16, (4096, 3000), (*RED, "LDG.E.128")),
    *launched("layernorm", f32, (1024, 32768), (*LOOP, "STG.E.128")),  # looped
    *launched("rmsnorm", bf16, (1024, 50257), LOOP),  # looped, off boundaries (SHIFT_STORES)
    *launched("layernorm", bf16, (8, 128256), LOOP, VEC),  # split
]
SPECS = [
    spec("add", "add", "f32", add_sig(f32), {"BLOCK": 1024}, 4, *VEC),
    spec("add", "add", "f16", add_sig(f16), {"BLOCK": 1024}, 4, *VEC),
    spec("add", "add", "f32-all-aligned", add_sig(f32), {"BLOCK": 1024}, 4, *VEC, aligned=add_sig(f32)),
    *ROW_SPECS,
    spec("reduce", "row_reduce", "f32-sum", rows_sig(f32), {"BLOCK": 1024, "OP": "sum"}, 4, *RED, "LDG.E.128"),
    spec("reduce", "row_reduce", "f16-amax", rows_sig(f16), {"BLOCK": 4096, "OP": "amax"}, 4, *RED, "LDG.E.128"),
    spec("reduce", "row_reduce", "bf16-mean", rows_sig(bf16), {"BLOCK": 1024, "OP": "mean"}, 4, *RED),
    spec("gelu", "bias_gelu", "f32", gelu_sig(f32), {"BLOCK": 1024}, 4, *VEC),
    spec("gelu", "bias_gelu", "f16", gelu_sig(f16), {"BLOCK": 1024}, 4, *VEC),
    spec("transpose", "transpose", "f32", transpose_sig(f32), {"BM": 32, "BN": 32}, 4, *SMEM, "LDG.E.128"),
    # f16: the transposed read is whole 8x8 matrices, one ldmatrix.trans each
    spec("transpose", "transpose", "f16", transpose_sig(f16), {"BM": 32, "BN": 32}, 4, "STS", "LDSM", "BAR.SYNC"),
    # the bench's shapes; an LLM decode shape; odd sizes (run-time checked copies); A transposed; tf32
    # row-major tiles with aligned rows: TMA copies on sm_90a (passes/pipeline.py reads the pointers as descriptors)
    *matmul("matmul", "f16-4096", f16, 4096, 4096, 4096, *TMA),  # on an A100, a 3-slot ring (163 KB)
    *matmul("matmul", "bf16-4096", bf16, 4096, 4096, 4096, *TMA),
    *matmul("matmul", "f16-16x4096", f16, 16, 4096, 4096, "HMMA", "LDSM", "sm_80:LDGSTS", "sm_90a:UTMALDG"),  # 16 rows:
    # below wgmma's 64
    *matmul("matmul", "f16-odd", f16, 1000, 1001, 100, *MMA),
    *matmul("matmul", "f16-a-transposed", f16, 4096, 4096, 4096, *TMA, transposed=True),  # A too: its boxes transposed
    *matmul("matmul", "f32-tf32", f32, 1024, 1024, 1024, "HMMA", "sm_80:LDGSTS", "sm_90a:UTMALDG"),
    *matmul("matmul", "f16-512x4096", f16, 512, 4096, 1024, *TMA, archs=("sm_80",)),  # the tiles by shape: 128x128
    # on 4 warps; on sm_90a a wave of them takes a producer warpgroup too
    *matmul("matmul", "f16-512x4096-ws", f16, 512, 4096, 1024, *TMA, "USETMAXREG", ws=True, archs=("sm_90a",)),
    *matmul("matmul", "f16-512", f16, 512, 512, 512, *TMA),  # 64x64, 6 slots
    *matmul("matmul", "f16-16384x64-ws", f16, 16384, 64, 4096, *TMA, "USETMAXREG", ws=True,  # NARROW: 128x64 on
            archs=("sm_90a",)),  # one consumer warpgroup, 8 slots
    *matmul("matmul_fused", "f16-gelu", f16, 4096, 4096, 4096, *TMA, activation="gelu"),
    *matmul("matmul_sk", "f16-3072-gelu", f16, 3072, 3072, 3072, *TMA, activation="gelu",  # stream-K
            archs=("sm_90a",)),
    *matmul("matmul_split", "f16-300x260x8192-gelu", f16, 300, 260, 8192, *TMA, "REDG.E.ADD.F32",  # split-K
            activation="gelu", archs=("sm_90a",)),
    # a producer warpgroup, the tile stored in column halves, so that 4 slots fit beside the staging (225 KB; the
    # whole tile: 257)
    *matmul("matmul", "f16-4096-ws", f16, 4096, 4096, 4096, *TMA, "sm_90a:USETMAXREG", ws=True),
    *matmul_tma("f16-4096", f16, 4096, 4096, 4096),
    # P stays in the registers S was computed in: mma.sync's A on sm_80, wgmma's on sm_90a (test_attention_p_...)
    attention("f16-d128", f16, 128, False, 128, 64, 8, 2, *MMA),
    attention("bf16-d64-causal", bf16, 64, True, 128, 64, 8, 3, *MMA),
    *attention_launched("attention_fwd", "f16-d256", f16, 256, True, "HGMMA", "UTMALDG", "SYNCS", archs=("sm_90a",)),
    # the backward pass: dQ (and delta), then dK/dV, at each head dim (every dot on the tensor cores)
    *(s for kernel in ("attention_bwd_dkdv", "attention_bwd_dq")
      for dt, d, causal in ((f16, 64, True), (bf16, 128, False), (bf16, 256, False))
      for s in attention_launched(kernel, f"{dt.name}-d{d}" + ("-causal" if causal else ""), dt, d, causal, *BWD,
                                  archs=BWD_ARCHS.get((kernel, d), ARCHS))),
]


# ---- compiling, cached per process -------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def stdlib_module(stem: str):
    path = STDLIB / f"{stem}.nk"
    return syntax.parse(path.read_text(), str(path)), str(path)


@functools.lru_cache(maxsize=None)
def generated(s: Spec, arch: str = "sm_90a"):
    module, path = stdlib_module(s.file)
    spec = s.compiler(arch)
    return compiler.compile(module, s.kernel, spec, until="cuda").cuda


def cuda(module, kernel: str, sig: dict, consts: dict):
    return compiler.compile(module, kernel, compiler.Spec.of(sig, consts), until="cuda").cuda


@functools.lru_cache(maxsize=None)
def compiled(s: Spec, arch: str):
    out = compiler.compile_cuda(generated(s, arch), arch)  # as a launch builds it
    return out, nvrtc.disassemble(out.cubin)


_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def opcodes(sass: str) -> set[str]:
    return set(_OPCODE.findall(sass))


def has(ops: set[str], prefix: str) -> bool:
    """An opcode equal to `prefix` or extending it with modifiers (LDS matches LDS.128, not LDSM)."""
    return any(op == prefix or op.startswith(prefix + ".") for op in ops)


def stdlib_kernels() -> set[tuple[str, str]]:
    out = set()
    for path in sorted(STDLIB.glob("*.nk")):
        module = syntax.parse(path.read_text(), str(path))
        out |= {(path.stem, d.name) for d in module.defs if d.kind == "kernel"}
    return out


# ---- every stdlib kernel, both archs ------------------------------------------------------------
def test_every_stdlib_kernel_has_a_specialization():
    kernels = stdlib_kernels()
    assert len(kernels) >= 9
    covered = {(s.file, s.kernel) for s in SPECS}
    missing = sorted(kernels - covered)
    assert not missing, f"stdlib kernels with no entry in test_codegen.SPECS: {missing}"
    assert not covered - kernels, f"SPECS names kernels that no longer exist: {sorted(covered - kernels)}"
    assert len({s.id for s in SPECS}) == len(SPECS)


@pytest.mark.parametrize("s,arch", [(s, a) for s in SPECS for a in ARCHS if a in s.archs],
                         ids=lambda v: v.id if isinstance(v, Spec) else v)
def test_stdlib_sass(s, arch):
    out, sass = compiled(s, arch)
    assert out.cubin.startswith(b"\x7fELF")
    gen = generated(s, arch)
    assert f"Function : {gen.name}" in sass
    ops = opcodes(sass)
    assert ops, "no instructions parsed from the SASS"
    assert not has(ops, "LDL") and not has(ops, "STL"), f"local memory (spills) in {s.id} for {arch}"
    # ptxas waits for every wgmma group in flight where a register they write is touched (passes.overlap)
    assert "C7517" not in out.log and "serialized" not in out.log, out.log
    wanted = [p.split(":")[-1] for p in s.expect if ":" not in p or p.startswith(arch + ":")]  # "sm_90a:HGMMA"
    missing = sorted(p for p in wanted if not has(ops, p))
    assert not missing, f"{s.id} on {arch} lacks {missing}; has {sorted(ops)}"


GROUPED = [*launched("softmax", bf16, (2048, 640), ()), *launched("layernorm", f32, (1024, 640), ()),
           *launched("cross_entropy", bf16, (4096, 640), ())]


@pytest.mark.parametrize("s", GROUPED, ids=lambda s: s.id)
def test_grouped_rows_reduce_inside_their_warps(s):
    """Several rows a program (8 and 4 rows of 512 + a tail of 128, 8 of 1024, on 4 warps): a row, or two, a warp, and
    the block and its tail hold their row statistics alike, so neither the reductions nor their merge go through shared
    memory (layout.blocked's keep and spread), nor cross-entropy's loads of a value a row (the target and its logit),
    which take the statistics' layout (passes.layouts.Plan.default)."""
    assert dict(s.consts)["ROWS"] > 1 and s.num_warps > 1
    found = opcodes(compiled(s, "sm_90a")[1])
    assert has(found, "SHFL.BFLY") and not any(has(found, p) for p in SMEM), sorted(found)


def test_matmul_quarters_are_register_selections():
    """A tile stored in column quarters (HALVES) splits wgmma's accumulator without moving it: the transposed views it
    splits are the accumulator's registers permuted, so shared memory stages a quarter at a time, never the tile, in
    two buffers that alternate (one is written while TMA still reads the other)."""
    s = next(s for s in SPECS if s.label == "f16-4096-ws-sm_90a")
    module, _ = stdlib_module(s.file)
    k = compiler.compile(module, s.kernel, s.compiler("sm_90a"), until="ir").kernel
    staged = [op for op in ir.walk(k.body) if op.kind == "alloc" and op.result.type.shape not in ((4,), (128, 64), (64, 256))]
    quarters = [op.attrs["offset"] for op in ir.walk(k.body) if op.kind == "alloc" and op.result.type.shape == (128, 64)]
    assert not staged, [op.result.type.shape for op in staged]  # no half, tile or 3-D view staged
    assert len(quarters) == 5 and quarters[1] == quarters[3] != quarters[2] == quarters[4], quarters  # A's slot first


def test_matmul_quarters_go_out_while_the_next_is_written():
    """A TMA store goes on reading its staging buffer after it is issued: the next write of those bytes waits for that
    read only (`wait_group.read 1`: the newest store, from the other buffer, reads on), then a barrier; the kernel's
    end waits for every read. So each quarter is written while the one before it goes out."""
    s = next(s for s in SPECS if s.label == "f16-4096-ws-sm_90a")
    src = generated(s).source
    consumer = src[src.index("setmaxnreg.inc"):]
    tokens = re.findall(r"wait_group\.read \d|cp\.async\.bulk\.tensor|bar\.sync 1, 256|fence\.proxy\.async", consumer)
    short = {"cp.async.bulk.tensor": "TMA", "bar.sync 1, 256": "BAR", "fence.proxy.async": "FENCE"}
    quarter = ["wait_group.read 1", "BAR", "FENCE", "BAR", "TMA"]
    assert [short.get(t, t) for t in tokens] == quarter * 4 + ["BAR", "BAR", "wait_group.read 0"], tokens


def by_id(ident: str) -> Spec:
    return next(s for s in SPECS if s.id == ident)


SOFTMAX = "softmax.softmax-softmax-f32-32768x1000"
CE_LOOPED = "softmax.cross_entropy_looped-cross_entropy-f16-4096x32000"


def test_add_sm90a_is_vectorized():
    ops = opcodes(compiled(by_id("add.add-f32"), "sm_90a")[1])
    assert has(ops, "LDG.E.128") and has(ops, "STG.E.128")


def test_softmax_f32_1024_sm90a():
    s = by_id(SOFTMAX)
    assert dict(s.consts)["BLOCK"] == 1024 and dict(s.sig)["x"] == Ptr(f32)
    ops = opcodes(compiled(s, "sm_90a")[1])
    assert has(ops, "SHFL.BFLY") and has(ops, "LDG.E.128")
    assert not has(ops, "LDL") and not has(ops, "STL")


def test_transpose_store_is_vectorized():
    s = spec("transpose", "transpose", "f32-all-aligned", transpose_sig(f32), {"BM": 32, "BN": 32}, 4,
             aligned=transpose_sig(f32))
    ops_ = opcodes(compiled(s, "sm_90a")[1])
    assert has(ops_, "STG.E.128"), sorted(ops_)


@pytest.mark.parametrize("s", [s for s in SPECS + [s for s, _ in ATTENTION_SPILLING] if s.file == "attention"], ids=lambda s: s.id)
def test_attention_dots_on_tensor_cores(s):
    """Every dot of the attention kernels, transposed operands included, runs on mma.sync (sm_80) or wgmma or
    mma.sync (sm_90a), never on the FMA fallback."""
    from newtc import ir
    module, _ = stdlib_module(s.file)
    for arch in ARCHS:
        spec_ = s.compiler(arch)
        dots = [op for op in ir.walk(compiler.compile(module, s.kernel, spec_, until="ir").kernel.body)
                if op.kind == "dot"]
        assert dots and all("mma" in op.attrs or "wgmma" in op.attrs for op in dots), (arch, len(dots))


@pytest.mark.parametrize("s,arch", ATTENTION_SPILLING, ids=lambda v: v.id if isinstance(v, Spec) else v)
def test_attention_spilling_compiles(s, arch):
    ops_ = opcodes(compiled(s, arch)[1])
    assert has(ops_, "HMMA") or has(ops_, "HGMMA"), sorted(ops_)  # at 32 rows, below wgmma's 64: mma.sync


@pytest.mark.parametrize("d,dt", [(64, bf16), (64, f16), (128, f16), (128, bf16)], ids=lambda v: str(v))
def test_attention_p_stays_in_registers(d, dt):
    """The forward as ops launches it: on sm_90a P, computed in S's accumulator registers, is P V's wgmma operand A
    as it is (HGMMA reads A from registers, B from a descriptor) and nothing in the K/V loop stores to shared memory
    but the async copies; sm_80 keeps mma.sync, without spills (sm_90a's few: ATTENTION_SPILLING)."""
    from newtc import ir
    s80, s = attention_launched("attention_fwd", f"{dt.name}-d{d}", dt, d, d == 64)
    spec_ = s.compiler("sm_90a")
    kernel = compiler.compile(stdlib_module("attention")[0], s.kernel, spec_, until="ir").kernel
    loop = next(op for op in ir.walk(kernel.body) if op.kind == "for")
    body = list(ir.walk(loop.regions[0]))
    *_, pv = [op for op in body if op.kind == "dot"]
    assert "wgmma" in pv.attrs and not isinstance(pv.args[0].type.dtype, ir.Buffer)
    assert not [op for op in body if op.kind == "local_store"]
    for arch, launched in zip(ARCHS, (s80, s)):
        sass = compiled(launched, arch)[1]
        ops_ = opcodes(sass)
        if arch == "sm_90a":
            assert re.search(r"HGMMA\.64x\d+x16\.F32\S* R\d+, R\d+, gdesc", sass)
        else:
            assert has(ops_, "HMMA") and not has(ops_, "HGMMA") and not has(ops_, "LDL") and not has(ops_, "STL")


def test_generated_kernel_shape():
    s = by_id(SOFTMAX)
    gen = generated(s)
    assert gen.threads == 32 * s.num_warps
    assert f'extern "C" __global__ void __launch_bounds__({gen.threads}) nk_softmax(' in gen.source
    assert "__shfl_xor_sync" in gen.source


# ---- #line directives ---------------------------------------------------------------------------
_LINE = re.compile(r'^#line (\d+) "(.*)"$')


def nk_lines(source: str) -> list[tuple[str | None, int | None, str]]:
    """(file, .nk line, text) for every code line of generated CUDA, as #line directives assign them."""
    out, file, line = [], None, None
    for text in source.splitlines():
        m = _LINE.match(text)
        if m:
            line, file = int(m[1]), m[2]
            continue
        out.append((file, line, text))
        if line is not None:
            line += 1
    return out


def lines_of(source: str, needle: str) -> set[int | None]:
    """The .nk lines of the kernel's code lines containing `needle` (the prelude above is left out)."""
    body = source[source.index('extern "C" __global__'):]
    return {line for _, line, text in nk_lines(body) if needle in text}


def line_of(stem: str, needle: str, after: str = "") -> int:
    """The 1-based line of stdlib/<stem>.nk holding `needle`, the first after the line holding `after` if
    given, else the only one (found, not hard-coded: stdlib files change)."""
    lines = (STDLIB / f"{stem}.nk").read_text().splitlines()
    start = next(i for i, t in enumerate(lines) if after in t) if after else 0
    found = [i + 1 for i, t in enumerate(lines) if needle in t and i >= start]
    assert found and (after or len(found) == 1), (needle, found)
    return found[0]


def test_line_directives_point_at_the_nk_source():
    s = by_id("add.add-f32")
    src = generated(s).source
    path = stdlib_module("add")[1]
    directives = [_LINE.match(t) for t in src.splitlines() if t.startswith("#line")]
    assert directives and all(m for m in directives)
    assert {m[2] for m in directives} == {path}
    pid, load = line_of("add", "program_id(0)"), line_of("add", "load(")
    assert load == 5
    text = (STDLIB / "add.nk").read_text().splitlines()
    code = {i + 1 for i, t in enumerate(text) if t.strip() and not t.lstrip().startswith(("#", "kernel"))}
    assert {int(m[1]) for m in directives} <= code  # only lines of add.nk that hold statements
    assert lines_of(src, "blockIdx.x") == {pid}  # program_id(0)
    assert lines_of(src, "u.w = *(const decltype(u.w)*)") == {load}  # the vector loads
    assert lines_of(src, ") = u.w;") == {load}  # the vector store
    # the prelude and the kernel's prologue come before the first directive; every statement after it is mapped
    first = src.index("#line")
    assert "__global__" in src[:first]
    assert all(line is not None for _, line, t in nk_lines(src[first:]) if ";" in t)


def test_line_directives_in_softmax():
    src = generated(by_id(SOFTMAX)).source
    exp = line_of("softmax", "num = exp(v - mx[:, None])")
    vmax = line_of("softmax", "mx = max(v, axis=1)", after="kernel softmax(")
    vsum = line_of("softmax", "total = sum(num, axis=1)")
    div = line_of("softmax", "num / total[:, None]")
    assert lines_of(src, "nk_exp(") == {exp}
    assert lines_of(src, "__shfl_xor_sync") == {vmax, vsum}  # max(v) and sum(num)
    assert lines_of(src, "nk_div(") == {div}
    log = generated(by_id("softmax.softmax-log_softmax-bf16-8192x4096")).source
    assert lines_of(log, "nk_log(") == {line_of("softmax", "(v - mx[:, None]) - log(total)[:, None]")}


def test_nvrtc_error_names_the_nk_line():
    src = 'extern "C" __global__ void k(float* x) {\n#line 3 "k.nk"\n  x[0] = undefined_name;\n}\n'
    with pytest.raises(nvrtc.NvrtcError) as info:
        nvrtc.compile(src, "k.cu", "sm_90a")
    assert "k.nk(3)" in str(info.value)
    assert ("k.nk", 3) in [(e.file, e.line) for e in info.value.entries]


# ---- f16 / bf16 through the prelude -------------------------------------------------------------
def test_unread_values_are_dropped():
    """Ops with no effect but their results go where nothing reads them: an unused sort of a tile (thousands of
    lines of CUDA) and load cost nothing; the store and what it reads stay."""
    mod = newtc.compile("""
kernel k(x, y, out, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    v = load(x + offs)
    s = sort(load(y + offs) * 2.0)
    store(out + offs, v + 1.0)
""")
    t = torch.randn(256)
    text = mod.k.ir(t, t, t, BLOCK=256)
    assert "sort" not in text and "exchange" not in text and text.count("load(") == 1 and "store(" in text


def test_prelude_needs_no_headers():
    src = generated(by_id("add.add-f16")).source
    assert "#include" not in src
    assert "cuda_fp16" not in src and "__half" not in src


@pytest.mark.parametrize("dt, to", [(f16, "nk_to_f16"), (bf16, "nk_to_bf16")])
def test_half_math_goes_through_f32(dt, to):
    module, path = stdlib_module("add")
    src = cuda(module, "add", add_sig(dt), {"BLOCK": 1024}).source
    ctype = {"f16": "nk_f16", "bf16": "nk_bf16"}[dt.name]
    assert f"{ctype}* x" in src
    body = src.split("__launch_bounds__")[1]
    assert "nk_tof(" in body and f"{to}(" in body
    out = nvrtc.compile(src, "nk_add", "sm_90a")
    assert out.cubin.startswith(b"\x7fELF")


def test_f16_math_in_stdlib_uses_conversions():
    body = generated(by_id("norm.norm-layernorm-f16-16384x4096")).source.split("__launch_bounds__")[1]
    assert "nk_tof(" in body and "nk_to_f16(" in body
    body = generated(by_id("norm.norm_looped-rmsnorm-bf16-1024x50257")).source.split("__launch_bounds__")[1]
    assert "nk_tof(" in body and "nk_to_bf16(" in body


# ---- atomics ------------------------------------------------------------------------------------
ATOMIC_BLOCK = """\
kernel k(dst, val, old, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    mask = offs < n
    r = OP(dst + offs % 7, load(val + offs, mask=mask), mask=mask)
    store(old + offs, r, mask=mask)
"""
ATOMIC_CAS = """\
kernel k(dst, cmp, val, old, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    mask = offs < n
    r = atomic_cas(dst + offs % 7, load(cmp + offs, mask=mask), load(val + offs, mask=mask), mask=mask)
    store(old + offs, r, mask=mask)
"""


def atomic_sass(text: str, sig: dict, arch: str = "sm_90a") -> set[str]:
    module = syntax.parse(text, "atomic.nk")
    gen = cuda(module, "k", sig, {"BLOCK": 128})
    return opcodes(nvrtc.disassemble(nvrtc.compile(gen.source, gen.name, arch).cubin))


def atomic_sig(dt, *names):
    return {**ptrs(dt, *names), "n": i32}


@pytest.mark.parametrize("op, dt, instr", [("atomic_add", f32, "ATOMG.E.ADD.F32"), ("atomic_add", i32, "ATOMG.E.ADD")])
def test_atomic_add_compiles(op, dt, instr):
    ops = atomic_sass(ATOMIC_BLOCK.replace("OP", op), atomic_sig(dt, "dst", "val", "old"))
    assert any(o.startswith(instr) for o in ops), sorted(ops)


def test_atomic_cas_i32_compiles():
    ops = atomic_sass(ATOMIC_CAS, atomic_sig(i32, "dst", "cmp", "val", "old"))
    assert has(ops, "ATOMG.E.CAS"), sorted(ops)


def test_atomic_max_f32_compiles_as_a_cas_loop():
    ops = atomic_sass(ATOMIC_BLOCK.replace("OP", "atomic_max"), atomic_sig(f32, "dst", "val", "old"))
    assert has(ops, "ATOMG.E.CAS"), sorted(ops)


@pytest.mark.parametrize("op, dt", [("atomic_add", i64), ("atomic_xchg", f64)])
def test_64bit_atomics_compile(op, dt):
    text = "kernel k(dst, val, old, n, BLOCK: constexpr):\n    store(old, OP(dst, load(val)))\n".replace("OP", op)
    ops = atomic_sass(text, atomic_sig(dt, "dst", "val", "old"))
    assert has(ops, "ATOMG.E")


def test_bitcast_compiles():
    text = ("kernel k(x, out, n, BLOCK: constexpr):\n    offs = arange(0, BLOCK)\n"
            "    store(out + offs, load(x + offs).to(i32, bitcast=True))\n")
    sig = {"x": Ptr(f32), "out": Ptr(i32), "n": i32}
    module = syntax.parse(text, "bitcast.nk")
    gen = cuda(module, "k", sig, {"BLOCK": 128})
    nvrtc.compile(gen.source, gen.name, "sm_90a")


# ---- codegen bugs found while writing these tests -----------------------------------------------
MASKED_COPY = """\
kernel k(x, out, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)
"""


@pytest.mark.parametrize("dt", ["i64", "u8"])
def test_masked_load_of_multiword_c_types_compiles(dt):
    from newtc.types import DTYPES
    t = DTYPES[dt]
    module = syntax.parse(MASKED_COPY, "masked.nk")
    gen = cuda(module, "k", {**ptrs(t, "x", "out"), "n": i32}, {"BLOCK": 128})
    nvrtc.compile(gen.source, gen.name, "sm_90a")


@pytest.mark.parametrize("name", ["L0", "v_1", "nk_tid"])
def test_parameter_names_cannot_clash_with_generated_names(name):
    text = f"kernel k({name}, out, BLOCK: constexpr):\n    offs = arange(0, BLOCK)\n" \
           f"    store(out + offs, load({name} + offs))\n"
    module = syntax.parse(text, "names.nk")
    gen = cuda(module, "k", {name: Ptr(f32), "out": Ptr(f32)}, {"BLOCK": 64})
    nvrtc.compile(gen.source, gen.name, "sm_90a")


def test_file_name_with_a_quote():
    text = "kernel k(x, BLOCK: constexpr):\n    store(x + arange(0, BLOCK), 1.0)\n"
    filename = 'my "kernels".nk'
    module = syntax.parse(text, filename)
    gen = cuda(module, "k", {"x": Ptr(f32)}, {"BLOCK": 64})
    nvrtc.compile(gen.source, gen.name, "sm_90a")


def test_f64_max_reduction_stays_double():
    text = "kernel k(x, out, BLOCK: constexpr):\n    store(out, max(load(x + arange(0, BLOCK)), axis=0))\n"
    module = syntax.parse(text, "dmax.nk")
    gen = cuda(module, "k", ptrs(f64, "x", "out"), {"BLOCK": 1024})
    ops = opcodes(nvrtc.disassemble(nvrtc.compile(gen.source, gen.name, "sm_90a").cubin))
    assert not has(ops, "F2F.F32.F64"), "double rounded to float inside the reduction"


def test_module_compile_path_matches_table():
    """newtc.compile + Kernel.source gives the same CUDA as the typed_ir/cuda_source path used above."""
    s = by_id("add.add-f32")
    module, path = stdlib_module("add")
    mod = newtc.compile((STDLIB / "add.nk").read_text(), path)
    import torch
    x = torch.empty(1001)  # torch's allocations are 16-byte aligned, 1001 is not a multiple of 8
    assert mod.add.source(x, x, x, 1001, BLOCK=1024) == generated(s).source


# ---- the streamed row loop: what keeps it fast ---------------------------------------------------
def loop_body(source: str, var: str = "") -> str:
    """The text of the kernel's first runtime `for` loop (over `var`, if given), braces matched."""
    start = source.index("{", re.search(rf"  for \(int {var}" if var else r"  for \(", source).start())
    depth = 0
    for i in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[start:i]
    raise AssertionError("unbalanced braces")


def test_row_stats_loop_has_no_barrier_and_no_shuffle():
    """The per-lane running state of row_stats: the reshape keeps the load's registers and the carried
    state takes the reduction's layout, so nothing in the loop crosses threads."""
    src = generated(by_id(CE_LOOPED)).source
    body = loop_body(src)
    assert "__syncthreads" not in body and "nk_smem" not in body and "__shfl" not in body
    assert "__shfl_xor_sync" in src  # the lanes' states merge once, after the loop


def test_masked_vector_load_fills_then_loads():
    """A proven-aligned masked group: `other` fills the registers, one predicated 128-bit load follows."""
    s = by_id(CE_LOOPED)
    assert s.aligned == frozenset(dict(s.sig))  # 32000 columns: every pointer and int is
    body = loop_body(generated(s).source)
    assert re.search(r"u\.e\[7\] = [^;]+; if \([^)]+\) u\.w = \*", body), body[:2000]
    assert "} else {" not in body


def test_rows_off_boundaries_load_whole_groups_and_check_only_masks():
    """Rows off 16-byte boundaries (SHIFT): every group is addressed from an aligned `first`, so the analysis
    proves it contiguous and aligned; only the masks differ at the row's ends. Loads take the group's 16 bytes
    where any lane is in and keep the lanes that are (no branch, no address check); stores check the masks."""
    s = by_id("softmax.softmax_looped-log_softmax-bf16-4096x50257")
    assert dict(s.consts)["SHIFT"] and dict(s.consts)["DIV"] == 1
    src = generated(s).source
    body = loop_body(src)
    assert re.search(r"if \(\([^)]+\) \|\| \([^)]+\)", body) and "} else {" not in body, body[:2000]
    assert "unsigned long long)(" not in src[src.index("__global__"):] and "u.e[7] : " in body


def test_64_bit_indices_keep_vector_groups():
    """On a tensor of 2 GiB or more every index is i64, and the block's i32 offsets are widened: the widening
    keeps what is known of them, so the loop still loads whole proven groups (no per-element run-time check)."""
    s = by_id(CE_LOOPED)
    sig = tuple((n, i64 if t == i32 else t) for n, t in s.sig)
    spec = compiler.Spec(sig, s.consts, s.num_warps, s.num_stages, aligned=s.aligned, ones=s.ones, idx64=True)
    body = loop_body(compiler.compile(stdlib_module(s.file)[0], s.kernel, spec, until="cuda").cuda.source)
    assert "long long" in body and re.search(r"u\.e\[7\] = [^;]+; if \([^)]+\) u\.w = \*", body), body[:2000]
    assert "} else {" not in body



@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_parameters_named_like_cpp_keywords_and_cuda_functions_compile(arch):
    """Names a .nk program may use that C++ or the generated source reserves: keywords (do, new, class),
    CUDA's types (uint4) and the functions that the source calls (sqrtf): renamed, never a clash, also when
    a parameter is specialized as 1."""
    module = syntax.parse("kernel k(do, new, uint4, sqrtf, max, n, BLOCK: constexpr):\n"
                          "    int = arange(0, BLOCK)\n"
                          "    class = load(do + int * n) * max\n"
                          "    store(new + int, sqrt(class) + sqrtf)\n"
                          "    store(uint4 + int, maximum(class, 0.5))\n", "names.nk")
    sig = dict(do=Ptr(f32), new=Ptr(f32), uint4=Ptr(f32), sqrtf=f32, max=f32, n=i32)
    for ones in ((), ("n",)):
        spec = compiler.Spec(sig, {"BLOCK": 128}, arch=arch, ones=ones)
        gen = compiler.compile(module, "k", spec, until="cuda").cuda
        assert "float* do_arg" in gen.source and "float sqrtf_arg" in gen.source
        assert nvrtc.compile(gen.source, gen.name, arch).cubin


def test_a_scalar_atomic_is_read_by_every_thread_before_the_next():
    """Thread 0 performs a scalar atomic and leaves the old value in shared memory for all: a barrier after
    the read, or in a loop (a spin lock) thread 0 overwrites it before slow threads have read it."""
    module = syntax.parse("kernel k(lock, out, n):\n"
                          "    total = 0\n"
                          "    for i in range(0, n):\n"
                          "        total += atomic_add(lock, 1)\n"
                          "    store(out, total)\n", "spin.nk")
    src = cuda(module, "k", dict(lock=Ptr(i32), out=Ptr(i32), n=i32), {}).source
    lines = [line.strip() for line in src.splitlines() if not line.startswith("#line")]
    read = next(i for i, line in enumerate(lines) if re.match(r"int const \w+ = \(\(int\*\)\(nk_smem", line))
    assert lines[read - 1] == "__syncthreads();" and lines[read + 1] == "__syncthreads();"


def test_warp_specialized_loop_releases_slots_instead_of_a_cta_barrier():
    """range(warp_specialize=True) on sm_90a, in the stdlib matmul's loop over tiles: a fourth warpgroup (the
    producer) gives up registers and its first thread issues every copy of every tile, each once the consumers'
    warps have released the slot; the consumers' K loop has no CTA barrier, and every barrier after the split counts
    the consumers' 256 threads only. On sm_80 (no TMA, no setmaxnreg) the option changes nothing."""
    s = next(x for x in SPECS if x.id.endswith("f16-4096-ws-sm_90a"))
    g = generated(s)
    src = g.source
    assert g.threads == 384 and "__launch_bounds__(384, 1)" in src
    producer = src[src.index("if (nk_tid >= 256) {"):src.index("setmaxnreg.inc")]
    assert "setmaxnreg.dec.sync.aligned.u32 40" in producer and "if (nk_tid == 256) {" in producer
    assert producer.count("mbarrier.try_wait") == 1 and "cp.async.bulk.tensor" in producer and "return;" in producer
    assert "__syncthreads" not in producer and "bar.sync" not in producer  # one thread runs it: a barrier would hang
    tiles = loop_body(src[src.index("setmaxnreg.inc"):])  # the consumers' loop over tiles
    consumer = loop_body(tiles)  # its K loop
    assert "mbarrier.arrive.shared::cta.b64" in consumer and "cp.async.bulk.tensor" not in consumer
    assert "__syncthreads" not in consumer and "bar.sync" not in consumer
    # one ring for all of a program's tiles: made before either role's loop over tiles, invalidated after the
    # consumers', and each tile's last slot released after its K loop (the producer fills it for the next tile)
    assert src.rindex("mbarrier.init") < src.index("for (int t_") and "mbarrier.init" not in tiles
    assert "mbarrier.inval" not in tiles and src.index("mbarrier.inval") > src.index(tiles)
    assert tiles.count("mbarrier.arrive.shared::cta.b64") == 2
    after = src[src.index("setmaxnreg.inc"):]
    assert "__syncthreads" not in after and "bar.sync 1, 256;" in after
    plain = generated(next(x for x in SPECS if x.id.endswith("f16-4096-ws-sm_80")), "sm_80").source
    assert "setmaxnreg" not in plain and "__launch_bounds__(256)" in plain


def cluster_source(ctas_constexpr: int, arch: str = "sm_90a"):
    """The stdlib's warp-specialized 128x256 matmul launched in clusters of 2, its tile loop by clusters (CTAS=2)
    or by programs (CTAS=1)."""
    s = next(x for x in SPECS if x.id.endswith("f16-4096-ws-sm_90a"))
    module, _ = stdlib_module(s.file)
    spec = dataclasses.replace(s.compiler(arch), constexprs=s.consts + (("CTAS", ctas_constexpr),), num_ctas=2)
    return compiler.compile(module, s.kernel, spec, until="cuda").cuda


def test_a_cluster_multicasts_the_tiles_its_ctas_share():
    """In clusters of 2 whose CTAs walk the same tiles of C two rows apart, the stdlib matmul's copies of B (the same
    in both) are multicast, each CTA copying half of its boxes into both; A's stay each CTA's own. A slot is free once
    both CTAs' 8 consumer warps have released it: each warp arrives on the empty barrier of both. A cluster barrier
    follows the barriers' setup and precedes their invalidation. ptxas takes it, without spills."""
    src = cluster_source(2).source
    assert "__cluster_dims__(2, 1, 1)" in src
    copies = [line for line in src.splitlines() if "cp.async.bulk.tensor.2d.shared::cluster" in line]
    a, b = (next(line for line in copies if f"nk_map{i})" in line) for i in (0, 1))
    assert "multicast" not in a and b.count(".multicast::cluster") == 4 == b.count('"h"((unsigned short)3)')
    assert [b.count(f"if (nk_rank == {r})") for r in (0, 1)] == [2, 2]
    assert src.count("mbarrier.init.shared::cta.b64 [%0], 16;") == 4  # empty: 2 CTAs x 8 consumer warps per slot
    arrivals = [line for line in src.splitlines() if "mbarrier.arrive.shared::cluster" in line]
    assert len(arrivals) == 2 and all("mapa.shared::cluster.u32 ra, %0, 0;" in x and ", %0, 1;" in x for x in arrivals)
    syncs = [i for i, line in enumerate(src.splitlines()) if "barrier.cluster.arrive" in line]
    lines = src.splitlines()
    assert len(syncs) == 2 and syncs[0] < next(i for i, x in enumerate(lines) if "setmaxnreg.dec" in x)
    assert syncs[1] < next(i for i, x in enumerate(lines) if "mbarrier.inval" in x)
    out = nvrtc.compile(src, cluster_source(2).name, "sm_90a")
    sass = nvrtc.disassemble(out.cubin)
    assert "UTMALDG.2D.MULTICAST" in sass and "UCGABAR_ARV" in sass and not re.search(r"\b(STL|LDL)\b", sass)


def test_a_cluster_shares_nothing_it_cannot_prove_the_same():
    """A cluster launch of a tile loop from program_id(0) (CTAS=1): the CTAs' tiles differ, so every copy stays the
    CTA's own and no barrier counts another CTA's warps; the launch still asks for clusters."""
    src = cluster_source(1).source
    assert "__cluster_dims__(2, 1, 1)" in src and "multicast" not in src and "shared::cluster.b64" not in src
    assert "barrier.cluster" not in src and src.count("mbarrier.init.shared::cta.b64 [%0], 8;") == 4


def test_warp_specialization_registers_come_from_the_programs_own_pool():
    """setmaxnreg moves registers within the pool a program got at launch (threads x the launch bounds' count):
    the consumers grow only by what the producer gives back, or keep theirs; a launch past 1024 threads is not
    specialized. The counts at launch are ptxas's for those bounds (cuobjdump: 255, 168, 96)."""
    from newtc.passes.pipeline import producer_registers
    assert [producer_registers(w) for w in (4, 8, 16, 32)] == [(40, None), (40, 232), (40, 104), None]
    for warps, pool in ((8, 384 * 168), (16, 640 * 96)):
        producer, consumer = producer_registers(warps)
        assert 128 * producer + 32 * warps * consumer <= pool


def test_replicated_copies_into_shared_memory_are_issued_once():
    """A tile smaller than its copy layout (16x16 f16 over 4 warps of 16-byte vectors) is held by several threads:
    only one of them issues each cp.async (others would race on the same bytes, racecheck's complaint)."""
    module, _ = stdlib_module("matmul")
    sig = dict(zip(("a", "b", "c"), [Ptr(f16)] * 3)) | dict.fromkeys(
        ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn"), i32)
    spec = compiler.Spec(sig, dict(BM=16, BN=16, BK=16, GROUP_M=8), num_warps=4, num_stages=3, arch="sm_80")
    src = compiler.compile(module, "matmul", spec, until="cuda").cuda.source
    copies = [line for line in src.splitlines() if "nk_cp_async<" in line and "__device__" not in line]
    gated = r"if \(\(nk_(lane|warp) & \d+\) == 0[^{]*\{ nk_cp_async<"  # each copy under the owner's condition
    assert copies and all(len(re.findall(gated, line)) == line.count("nk_cp_async<") for line in copies), copies[:2]


def test_attention_streams_its_tiles_by_tma_on_sm_90a():
    """As ops launches it on sm_90a, the forward's K and V blocks (K read transposed: memory's rows are the tile's
    columns) are TMA copies through 4-D maps: D, the keys up to L_k, then the base's index * stride terms (the
    program's batch and K/V head, unbounded). The masked and unmasked loops share them; no cp.async is left. Each
    element of a transposed box lands where the ring's layout puts it. O, staged in shared memory, goes out by TMA
    through a map of the same form (its rows up to L_q)."""
    from newtc import ir
    from newtc.layout import _swizzle, inverse, to_flat, xor_span
    s = attention_launched("attention_fwd", "f16-d128", f16, 128, False, archs=("sm_90a",))[0]
    out = compiler.compile(stdlib_module("attention")[0], s.kernel, s.compiler("sm_90a"), until="cuda")
    names = [p.name for p in out.kernel.params]
    bn, big = dict(s.consts)["BN"], ["const", 2**31 - 1]
    assert out.kernel.tmaps == [
        {"itemsize": 2, "base": names.index(t), "dims": [["const", 128], ["arg", names.index("L_k")], big, big],
         "strides": [["arg", names.index(f"stride_{t}{d}")] for d in "nbh"], "box": [64, bn, 1, 1], "swizzle": 128}
        for t in "kv"] + [
        {"itemsize": 2, "base": names.index("o"), "dims": [["const", 128], ["arg", names.index("L_q")], big, big],
         "strides": [["arg", names.index(f"stride_o{d}")] for d in "mbh"], "box": [64, dict(s.consts)["BM"], 1, 1],
         "swizzle": 128}]
    assert [op.attrs["map"] for op in ir.walk(out.kernel.body) if op.kind == "tma_store"] == [2]
    assert "nk_cp_async<" not in out.cuda.source and "cp.async.bulk.tensor.4d" in out.cuda.source
    loads = [op for op in ir.walk(out.kernel.body) if op.kind == "tma_load"]
    assert {op.attrs["map"] for op in loads} == {0, 1}
    k = next(op for op in loads if op.attrs["map"] == 0)
    lay = k.args[0].layout
    assert lay.shape == (128, bn)  # [D, keys]: K transposed
    inv = inverse(lay)
    for r, c, at in k.attrs["boxes"]:
        for i in range(bn):
            for j in range(64):
                want = 2 * xor_span(inv, to_flat(lay.shape, (c + j, r + i)))
                assert _swizzle(at + (i * 64 + j) * 2, 128) == want


@pytest.mark.parametrize("d,arch", [(64, "sm_90a"), (128, "sm_90a"), (64, "sm_80")], ids=str)
def test_attention_dkdv_tiles_stored_once(d, arch):
    """dK/dV reads Q and dO each as a dot's B and, transposed, as another's: each lands once in a ring slot by
    cp.async (TMA on sm_90a) and both dots read it there (wgmma through a transposed view of the slot, mma.sync by ldmatrix),
    with no 2-D tile stored from registers in the loop (the inner loop had 7 stores and 8 barriers)."""
    from newtc import ir
    s = attention_launched("attention_bwd_dkdv", f"f16-d{d}", f16, d, False, archs=(arch,))[0]
    spec_ = s.compiler(arch)
    kernel = compiler.compile(stdlib_module("attention")[0], s.kernel, spec_, until="ir").kernel
    *_, loop = [op for op in ir.walk(kernel.body) if op.kind == "for"]
    body = list(ir.walk(loop.regions[0]))
    kinds = [op.kind for op in body]
    assert not [op for op in body if op.kind == "local_store" and len(op.args[1].type.shape) == 2]
    copies = [op.args[0].type.shape for op in body if op.kind in ("async_copy", "tma_load")]
    assert copies.count((s.consts[0][1], d)) == 2
    assert kinds.count("barrier") <= 2, kinds.count("barrier")
    if arch == "sm_90a":
        defs = {id(r): op for op in body for r in op.results}
        views = [defs[id(op.args[1])] for op in body if op.kind == "dot" and id(op.args[1]) in defs]
        assert sorted(v.kind for v in views) == ["slot", "slot", "trans", "trans"]


FOLD = """\
kernel acc_plus_dot(a, b, c, K, BLOCK: constexpr, TWICE: constexpr):
    r = arange(0, BLOCK)
    acc = zeros([BLOCK, BLOCK], f32)
    for k in range(0, K, BLOCK):
        x = load(a + r[:, None] * K + k + r[None, :])
        y = load(b + (k + r[:, None]) * BLOCK + r[None, :])
        d = dot(x, y)
        acc = acc + d
        if TWICE:
            acc = acc + d * 0.5
    store(c + r[:, None] * BLOCK + r[None, :], acc)
"""


@pytest.mark.parametrize("twice", [False, True])
def test_an_added_dot_accumulates_in_place(twice):
    """`acc + dot(x, y)` is `dot(x, y, acc)` after the passes (the tensor cores add into acc, no second tile of
    f32 registers); a dot read twice keeps its own accumulator and the add."""
    from newtc import ir
    module = syntax.parse(FOLD, "fold.nk")
    spec_ = compiler.Spec.of({"a": Ptr(f16), "b": Ptr(f16), "c": Ptr(f32), "K": i32}, {"BLOCK": 64, "TWICE": twice})
    kernel = compiler.compile(module, "acc_plus_dot", dataclasses.replace(spec_, arch="sm_90a"), until="ir").kernel
    loop = next(op for op in ir.walk(kernel.body) if op.kind == "for")
    carried = ir.carried(loop)[1][0]
    dots = [op for op in ir.walk(loop.regions[0]) if op.kind == "dot"]
    adds = [op for op in ir.walk(loop.regions[0]) if op.kind == "add" and op.result.type.shape == (64, 64)]
    assert len(dots) == 1 and (dots[0].args[2] is carried) != twice and len(adds) == 2 * twice


@pytest.mark.parametrize("kernel,order", [("attention_bwd_dq", ["S", "dP", "wait 1", "exp2", "wait 0", "dQ", "wait 0"]),
                                          ("attention_bwd_dkdv", ["S", "wait 0", "exp2", "dP", "dV", "wait 1", "dK",
                                                                  "wait 0"])])
def test_wgmma_runs_beside_the_math_that_does_not_need_it(kernel, order):
    """passes.overlap on sm_90a: in the backward's loops a dot is waited for where its result is first read, so dQ's
    dP = dO V^T runs while P's exponentials are computed and dK/dV's dV += P^T dO while dS is; everything has landed
    before the iteration ends. `order`: each dot's commit (by name), the waits, and the run of exp2 between them."""
    s = next(s for s in SPECS if s.kernel == kernel and s.label == "bf16-d128-sm_90a")
    body = loop_body(generated(s, "sm_90a").source, "start")
    events = [f"wait {m[1]}" if m[1] else "exp2" if m[0] == "nk_exp2(" else "commit"
              for m in re.findall(r"(wgmma\.commit_group|wgmma\.wait_group\.sync\.aligned (\d)|nk_exp2\()", body)]
    events = [e for i, e in enumerate(events) if e != "exp2" or events[i - 1] != "exp2"]  # a run of exp2 is one
    assert events == [e if e.startswith(("wait", "exp2")) else "commit" for e in order]


def test_maxnreg_caps_a_threads_registers():
    """ops caps the registers of RMS norm on 1024 x 5120 halves at 64 so that 8 programs fit an SM, one wave of 1024
    (NVRTC takes 65 without: 7 an SM); the cap holds at any value the threads leave."""
    x2, w = torch.randn(1024, 5120, dtype=torch.float16), torch.randn(5120, dtype=torch.float16)
    (kernel, _, args, meta), *_ = ops._norm_steps(x2, True, False)[0]
    values = (x2, w, w, 1e-6, torch.empty_like(x2))
    args = tuple(values[a.i] if isinstance(a, ops._In) else a for a in args)
    assert meta["maxnreg"] == 64
    for cap in (64, 40):
        out = kernel.output(args, dict(meta, maxnreg=cap), "cubin", "sm_90a")
        assert f"__maxnreg__({cap})" in out.cuda.source
        used = {int(r) for r in re.findall(r"\bR(\d+)\b", nvrtc.disassemble(out.binary.cubin))}
        assert max(used) < cap and max(used) >= cap - 16  # the cap binds, and leaves a row's values registers


TILE_LOOP = """
kernel k(a, b, c, M, N, K):
    for t in range(program_id(0), cdiv(M, 16), num_programs(0)):
        rm = t * 16 + arange(0, 16)
        rn = arange(0, 32)
        acc = zeros([16, 32], f32)
        for k0 in range(0, K, 16):
            rk = k0 + arange(0, 16)
            x = load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0)
            y = load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0)
            acc = dot(x, y, acc)
        store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_a_pipeline_in_a_loop_over_tiles_waits_before_refilling_its_ring(arch):
    """The prologue of a pipelined K loop inside a loop over tiles copies into the slots the last tile's last K steps
    read: a barrier first, or a warp done with that tile overwrites a slot another warp still reads (simt found it:
    one warp's columns of a persistent deuteron matmul wrong, now and then). Inside the K loop, no more barriers."""
    module = syntax.parse(TILE_LOOP, "tiles.nk")
    sig = dict(a=Ptr(f16), b=Ptr(f16), c=Ptr(f32), M=i32, N=i32, K=i32)
    src = compiler.compile(module, "k", compiler.Spec.of(sig, {}, arch=arch, num_stages=3), until="cuda").cuda.source
    tiles = loop_body(src)
    k_loop = loop_body(tiles[1:])
    prologue = tiles[:tiles.index(k_loop)]
    assert "nk_cp_async" in prologue and prologue.index("__syncthreads();") < prologue.index("nk_cp_async")
    assert prologue.count("__syncthreads();") == 1 and k_loop.count("__syncthreads();") == 1
