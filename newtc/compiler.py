"""The pipeline in one place: a parsed module and a specialization -> typed IR -> CUDA C++ -> cubin.

    out = compile(module, "add", Spec.of({"x": Ptr(f32), ...}, {"BLOCK": 1024}), until="cuda")

Torch-free, so that the `newtc` command, the jit and the tests share it without importing torch.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from . import ast as A
from . import check, codegen, ir, nvrtc, passes
from .errors import NkError, flag

# `until`: the typed IR as the checker made it (what the interpreter runs), after the passes, the CUDA C++,
# NVRTC's cubin and PTX
STAGES = ("checked", "ir", "cuda", "cubin")


@dataclass(frozen=True)
class Spec:
    """Everything a compiled kernel depends on besides its source: one specialization."""

    sig: tuple = ()  # (name, DType | Ptr) of each runtime parameter
    constexprs: tuple = ()  # (name, value) of each constexpr given at launch (or by -D)
    num_warps: int = 4
    num_stages: int = 1
    num_ctas: int = 1  # CTAs a cluster (sm_90): launched together, they may share TMA copies (multicast)
    maxnreg: int = 0  # registers a thread may use at most (0: as many as the threads leave, up to 255)
    idx64: bool = False  # 64-bit offsets: a tensor argument spans 2 GiB or more
    aligned: tuple = ()  # parameters that are multiples of 16 (ints) or 16-byte aligned (pointers)
    eights: tuple = ()  # int parameters that are odd multiples of 8: the rows of 16-bit elements they count are
    # 16-byte aligned (vectors, TMA), where Triton's multiples of 16 leave a product of 1000 x 1000 plain loads
    ones: tuple = ()  # int parameters equal to 1 (unit strides: the analysis then sees contiguity)
    positive: tuple = ()  # int parameters above 0 (sizes and strides a TMA tensor map may be built from)
    arch: str = "sm_90a"

    def __post_init__(self):  # sorted: the repr is a cache key, the same in every process
        object.__setattr__(self, "aligned", tuple(sorted(self.aligned)))
        object.__setattr__(self, "eights", tuple(sorted(self.eights)))
        object.__setattr__(self, "ones", tuple(sorted(self.ones)))
        object.__setattr__(self, "positive", tuple(sorted(self.positive)))

    @staticmethod
    def of(sig: dict, constexprs: dict | None = None, **options) -> "Spec":
        return Spec(tuple(sig.items()), tuple((constexprs or {}).items()), **options)

    @property
    def types(self) -> dict:
        return dict(self.sig)

    @property
    def values(self) -> dict:
        return dict(self.constexprs)


@dataclass
class Output:
    kernel: ir.Kernel  # after the passes
    cuda: codegen.Generated | None = None
    binary: nvrtc.Compiled | None = None  # the cubin and the PTX


def compile(module: A.Module, name: str, spec: Spec, until: str = "cubin") -> Output:
    """Run the stages in order up to `until` (one of STAGES)."""
    if until not in STAGES:
        raise NkError(f"unknown stage '{until}'", hint=f"stages: {', '.join(STAGES)}")
    try:
        k = check.check(module, name, spec)  # check
        if until == "checked":
            return Output(k)
        k = passes.run_passes(k)  # passes
        if until == "ir":
            return Output(k)
        gen = codegen.generate(k, module.file)  # codegen
    except RecursionError:  # the parser bounds nesting; what recurses past that is a compiler limit, located
        d = next(d for d in module.defs if d.name == name)
        raise NkError(f"internal limit: kernel '{name}' is too deep for the compiler (Python's recursion limit)",
                      d.span, "shorten chains of index arithmetic that feed one another") from None
    if flag("NEWT_DEBUG"):
        print(f"// ---- newt: {k.name} {spec}\n{gen.source}", file=sys.stderr)
    if until == "cuda":
        return Output(k, gen)
    return Output(k, gen, compile_cuda(gen, spec.arch))  # nvrtc


NEGATION = re.compile(r"\bneg\.s(16|32)\b")


def compile_cuda(gen: codegen.Generated, arch: str) -> nvrtc.Compiled:
    """NVRTC's cubin; compiled again with NK_OPAQUE where the PTX negates an integer (or NVRTC kept no PTX): ptxas
    12.6-13.3 fold a negation into sm_90's three-way min/max (VIMNMX3, also made of compares and selects) and drop it
    for one operand, and LLVM makes negations the source does not write (q - (p + q) is -p). There the values integer
    min, max and where choose from go through an asm (prelude's nk_opaque). Elsewhere that asm would only hide from
    LLVM the value ranges it shapes loops by (the persistent matmul's tile loop lost its unrolled producer); no stdlib
    kernel negates an integer."""
    out = nvrtc.compile(gen.source, gen.name, arch)
    if out.ptx is None or NEGATION.search(out.ptx):
        out = nvrtc.compile(gen.source, gen.name, arch, ["-DNK_OPAQUE"])
    return out
