"""Typed tile IR (with layouts) -> one CUDA C++ kernel.

A block value becomes a per-thread register array, one entry per register of its layout; every op
is unrolled over those registers. `regs(value, layout)` is the one way to read a value: it returns
one C expression per register of the requested layout, renaming registers when the threads already
hold the data, going through the shared-memory scratch arena when they do not, and recomputing index
values (layout None) in the requested layout.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import ir
from ..errors import NkError
from ..layout import Layout, dim_bits, log2, remap, rename
from ..passes.layouts import LayoutPlan
from . import cexpr
from .prelude import PRELUDE

KEYWORDS = {"int", "float", "double", "char", "short", "long", "unsigned", "signed", "bool", "void", "auto",
            "new", "delete", "default", "case", "switch", "goto", "class", "struct", "union", "template",
            "this", "const", "static", "register", "volatile", "extern", "operator", "private", "public"}


@dataclass
class Generated:
    source: str
    name: str
    threads: int
    smem_bytes: int


def bits_expr(var: str, bases) -> str:
    """XOR of `bases[k]` over the set bits k of `var`, folding runs of consecutive bits into shifts."""
    terms, k = [], 0
    while k < len(bases):
        b = bases[k]
        if b == 0:
            k += 1
            continue
        if b & (b - 1) == 0:
            r = 1
            while k + r < len(bases) and bases[k + r] == b << r:
                r += 1
            terms.append(f"(({var} >> {k}) & {(1 << r) - 1}) << {log2(b)}")
            k += r
        else:
            terms.append(f"(({var} >> {k}) & 1) * {b}")
            k += 1
    return " ^ ".join(f"({t})" for t in terms) or "0"


class Codegen:
    def __init__(self, k: ir.Kernel, filename: str):
        self.k = k
        self.file = filename
        self.file_literal = filename.replace("\\", "/").replace('"', "'")  # #line takes no escapes in NVRTC
        self.plan = LayoutPlan(k)
        self.out: list[str] = []
        self.head: list[str] = []
        self.layouts: dict[Layout, str] = {}
        self.names: dict[int, str] = {}
        self.scopes: list[dict] = [{}]
        self.defs: dict[int, ir.Op] = {id(r): op for op in ir.walk(k.body) for r in op.results}
        self.halves = [0, 0]  # bytes of each half of the scratch arena
        self.last_half = None  # half used last in straight-line code; None: unknown (after a boundary)
        self.fresh_arena = True  # nothing has touched shared memory yet
        self.line_no = None
        self.depth = 1
        self.span = None
        self.counter = 0

    # ---- output ------------------------------------------------------------------------------
    def emit(self, text: str) -> None:
        if self.span is not None and self.line_no != self.span.line:
            self.out.append(f'#line {self.span.line} "{self.file_literal}"')
            self.line_no = self.span.line
        self.out.append("  " * self.depth + text)
        if self.line_no is not None:
            self.line_no += 1

    def emit_all(self, stmts: list[str], per_line: int = 8) -> None:
        for i in range(0, len(stmts), per_line):
            self.emit(" ".join(stmts[i:i + per_line]))

    def fresh(self, hint: str) -> str:
        self.counter += 1
        hint = re.sub(r"\W", "_", hint or "t")
        return f"{hint}_{self.counter}"

    def name_of(self, v: ir.Value) -> str:
        if id(v) not in self.names:
            self.names[id(v)] = self.fresh(v.name or "v")
        return self.names[id(v)]

    def scratch(self, nbytes: int) -> str:
        """Start one use of the shared-memory scratch arena (write, barrier, read); returns its base.

        Uses alternate between two halves: a use's writes cannot race the readers of the use before
        it (other half), and the readers two uses back finished before that use's barrier. So only
        the first use after a loop or branch boundary, where the order is unknown, needs a barrier
        before writing."""
        half = 0 if self.last_half is None else 1 - self.last_half
        if self.last_half is None and not self.fresh_arena:
            self.emit("__syncthreads();")
        self.last_half, self.fresh_arena = half, False
        self.halves[half] = max(self.halves[half], (nbytes + 15) // 16 * 16)
        return "nk_smem" if half == 0 else "(nk_smem + nk_half)"

    def barrier(self) -> None:
        self.emit("__syncthreads();")

    # ---- layouts and coordinates ------------------------------------------------------------
    def lay(self, layout: Layout) -> str:
        """Name of the per-thread flat-index variable of a layout, declared once at the top."""
        if layout not in self.layouts:
            name = f"L{len(self.layouts)}"
            self.layouts[layout] = name
            t = f"({bits_expr('nk_lane', layout.lane)}) ^ ({bits_expr('nk_warp', layout.warp)})"
            self.head.append(f"  const int {name} = {t};  // {list(layout.shape)} {layout.short()}")
        return self.layouts[layout]

    def flat(self, layout: Layout, i: int) -> str:
        t, r = self.lay(layout), layout.reg_flat(i)
        return f"({t} + {r})" if layout.disjoint else f"({t} ^ {r})"

    def coord(self, layout: Layout, i: int, d: int) -> str:
        s, w = dim_bits(layout.shape)[d]
        mask = (1 << w) - 1
        t, r = self.lay(layout), layout.reg_flat(i)
        if layout.disjoint:
            return f"(((({t}) >> {s}) & {mask}) + {(r >> s) & mask})"
        return f"(((({t}) ^ {r}) >> {s}) & {mask})"

    def owner(self, layout: Layout | None) -> str:
        """Condition for the one thread among copies of replicated data (stores and atomics do it once)."""
        if layout is None:
            return "nk_tid == 0"
        conds = []
        if layout.replicated_lanes():
            conds.append(f"(nk_lane & {layout.replicated_lanes()}) == 0")
        if layout.replicated_warps():
            conds.append(f"(nk_warp & {layout.replicated_warps()}) == 0")
        return " && ".join(conds)

    # ---- reading values ----------------------------------------------------------------------
    def scalar(self, v: ir.Value) -> str:
        return self.names[id(v)]

    def regs(self, v: ir.Value, layout: Layout) -> list[str]:
        if not v.type.shape:
            return [self.scalar(v)] * layout.nregs
        key = (id(v), layout)
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        if v.layout is not None:
            arr = self.name_of(v)
            if v.layout == layout:
                out = [f"{arr}[{i}]" for i in range(layout.nregs)]
            else:
                perm = rename(v.layout, layout)
                out = [f"{arr}[{j}]" for j in perm] if perm is not None else self.convert(v, layout)
        else:
            op = self.defs[id(v)]
            consumer, self.span = self.span, op.span  # its code maps to its own `.nk` line
            exprs = self.compute(op, layout)
            if all(re.fullmatch(r"[\w\[\]]+", e) for e in exprs):
                out = exprs  # already plain names: nothing to compute once
            else:
                out = self.declare(v.type.dtype, v.name, exprs)
            self.span = consumer
        self.scopes[-1][key] = out
        return out

    def declare(self, dtype, hint: str, exprs: list[str]) -> list[str]:
        name = self.fresh(hint)
        self.emit(f"{cexpr.ctype(dtype)} {name}[{len(exprs)}];")
        self.emit_all([f"{name}[{i}] = {e};" for i, e in enumerate(exprs)])
        return [f"{name}[{i}]" for i in range(len(exprs))]

    def convert(self, v: ir.Value, layout: Layout) -> list[str]:
        """Move a value between threads through shared memory: write in its layout, read in the new one."""
        src = v.layout
        t = cexpr.ctype(v.type.dtype)
        buf = f"(({t}*){self.scratch(v.type.numel * v.type.dtype.itemsize)})"
        arr = self.name_of(v)
        self.emit_all([f"{buf}[{self.flat(src, j)}] = {arr}[{j}];" for j in range(src.nregs)])
        self.barrier()
        return self.declare(v.type.dtype, v.name + "_cvt", [f"{buf}[{self.flat(layout, i)}]" for i in range(layout.nregs)])

    # ---- computing values --------------------------------------------------------------------
    def compute(self, op: ir.Op, layout: Layout) -> list[str]:
        """Registers of op's result in `layout`, for ops that can be evaluated in any layout."""
        kind, res = op.kind, op.result
        if kind == "splat":
            return [self.scalar(op.args[0])] * layout.nregs
        if kind == "arange":
            return [f"({op.attrs['start']} + {self.coord(layout, i, 0)})" for i in range(layout.nregs)]
        if kind in ir.VIEWS:
            x = op.args[0]
            return self.regs(x, view_source_layout(op, layout))
        if kind in ir.ELEMENTWISE:
            cols = [self.regs(a, layout) for a in op.args]
            dts = [a.type.dtype for a in op.args]
            return [cexpr.elementwise(kind, dts, res.type.dtype, [c[i] for c in cols]) for i in range(layout.nregs)]
        raise NkError(f"internal: {kind} cannot be recomputed in another layout", op.span)

    # ---- ops ---------------------------------------------------------------------------------
    def region(self, r: ir.Region) -> None:
        for op in r.ops:
            if op.kind != "yield":
                self.span = op.span
                self.op(op)

    def op(self, op: ir.Op) -> None:
        from . import memory, reduce
        kind = op.kind
        res = op.results[0] if op.results else None
        if kind == "for":
            self.loop(op)
        elif kind == "if":
            self.branch(op)
        elif kind == "store":
            memory.store(self, op)
        elif kind in ("load", "atomic"):
            memory.load_or_atomic(self, op)
        elif kind == "reduce":
            reduce.reduce_op(self, op)
        elif kind == "dot":
            reduce.dot(self, op)
        elif kind == "print":
            raise NkError("print() runs in the interpreter only", op.span, "run with NEWT_INTERPRET=1")
        elif res.type.shape:
            if res.layout is not None:
                self.define(res, self.compute(op, res.layout))
        else:
            self.define(res, [self.scalar_expr(op)])

    def scalar_expr(self, op: ir.Op) -> str:
        kind = op.kind
        if kind == "const":
            return cexpr.literal(op.attrs["value"], op.result.type.dtype)
        if kind in ("program_id", "num_programs"):
            reg = ("blockIdx", "gridDim")[kind == "num_programs"] + "." + "xyz"[op.attrs["axis"]]
            return f"({cexpr.ctype(op.result.type.dtype)}){reg}"
        dts = [a.type.dtype for a in op.args]
        return cexpr.elementwise(kind, dts, op.result.type.dtype, [self.scalar(a) for a in op.args])

    def define(self, v: ir.Value, exprs: list[str]) -> None:
        """Give a value storage: a scalar variable, or the register array of its layout."""
        name = self.name_of(v)
        t = cexpr.ctype(v.type.dtype)
        if not v.type.shape:
            self.emit(f"{t} const {name} = {exprs[0]};")
            return
        self.emit(f"{t} {name}[{len(exprs)}];")
        self.emit_all([f"{name}[{i}] = {e};" for i, e in enumerate(exprs)])

    def storage(self, vals: list[ir.Value]) -> None:
        """Declare mutable storage for loop-carried or branch-joined values."""
        for v in vals:
            name, t = self.name_of(v), cexpr.ctype(v.type.dtype)
            self.emit(f"{t} {name}[{v.layout.nregs}];" if v.type.shape else f"{t} {name};")

    def assign(self, dst: ir.Value, src: ir.Value, stage: bool) -> list[str]:
        """Statements writing src into dst's storage; `stage` copies through temporaries first
        (a loop's next values may read the current ones)."""
        name = self.name_of(dst)
        if not dst.type.shape:
            return [f"{name} = {self.scalar(src)};"]
        exprs = self.regs(src, dst.layout)
        if stage:
            exprs = self.declare(src.type.dtype, dst.name + "_next", exprs)
        return [f"{name}[{i}] = {e};" for i, e in enumerate(exprs)]

    def loop(self, op: ir.Op) -> None:
        lo, hi, step = (self.scalar(a) for a in op.args[:3])
        body = op.regions[0]
        iv, carried = body.params[0], body.params[1:]
        self.storage(op.results)
        for r, init in zip(op.results, op.args[3:]):
            self.emit_all(self.assign(r, init, False))
        for p, r in zip(carried, op.results):
            self.names[id(p)] = self.name_of(r)
        step_op = self.defs.get(id(op.args[2]))
        down = step_op is not None and step_op.kind == "const" and step_op.attrs["value"] < 0
        ivn = self.name_of(iv)
        t = cexpr.ctype(iv.type.dtype)
        if self.k.spec.num_stages > 1:  # unrolled, the next iterations' loads are issued before this one's math
            self.emit(f"#pragma unroll {self.k.spec.num_stages}")
        self.emit(f"for ({t} {ivn} = {lo}; {ivn} {'>' if down else '<'} {hi}; {ivn} += {step}) {{")
        self.nested(body, list(zip(carried, body.ops[-1].args)), stage=True)
        self.emit("}")

    def nested(self, r: ir.Region, yields: list, stage: bool) -> None:
        self.depth += 1
        self.scopes.append({})
        # a loop body follows its own previous iteration (which may have used the arena), a branch either path
        self.last_half, self.fresh_arena = None, False
        self.region(r)
        self.span = r.ops[-1].span if r.ops else self.span
        stmts = []
        for dst, src in yields:
            stmts += self.assign(dst, src, stage)
        self.emit_all(stmts)
        self.scopes.pop()
        self.depth -= 1
        self.last_half = None

    def branch(self, op: ir.Op) -> None:
        self.storage(op.results)
        self.emit(f"if ({self.scalar(op.args[0])}) {{")
        for i, r in enumerate(op.regions):
            if i:
                self.emit("} else {")
            self.nested(r, list(zip(op.results, r.ops[-1].args)), stage=False)
        self.emit("}")

    # ---- the kernel --------------------------------------------------------------------------
    def generate(self) -> Generated:
        k = self.k
        params = []
        for p in k.params:
            self.names[id(p)] = param_name(p.name)
            params.append(f"{cexpr.ctype(p.type.dtype)} {self.names[id(p)]}")
        self.region(k.body)
        threads = 32 * k.spec.num_warps
        smem = self.halves[0] + self.halves[1]
        symbol = f"nk_{k.name}"  # prefixed: a kernel named like a CUDA builtin (norm, exp) must not clash
        lines = [PRELUDE.strip(), "",
                 f'extern "C" __global__ void __launch_bounds__({threads}) {symbol}({", ".join(params)}) {{',
                 "  extern __shared__ __align__(16) unsigned char nk_smem[];",
                 f"  const int nk_half = {self.halves[0]};  // the scratch arena's second half",
                 "  const int nk_tid = threadIdx.x, nk_lane = nk_tid & 31, nk_warp = nk_tid >> 5;",
                 *self.head, *self.out, "}", ""]
        return Generated("\n".join(lines), symbol, threads, smem)


GENERATED = re.compile(r"(nk_\w*|L\d+|\w+_\d+|__\w*|threadIdx|blockIdx|blockDim|gridDim|warpSize)")


def param_name(name: str) -> str:
    """The .nk name, unless it could collide with a C++ keyword, a CUDA builtin or a generated name."""
    return name if name not in KEYWORDS and not GENERATED.fullmatch(name) else f"{name}_arg"


def view_source_layout(op: ir.Op, layout: Layout) -> Layout:
    """The layout of a view's operand that puts each element where the view's consumer reads it."""
    x = op.args[0]
    src = x.type.shape
    if op.kind == "expand_dims":
        a = op.attrs["axis"]
        return remap(layout, src, lambda c: c[:a] + c[a + 1:])
    if op.kind == "broadcast":
        return remap(layout, src, lambda c: tuple(0 if s == 1 else ci for ci, s in zip(c, src)))
    if op.kind == "reshape":
        return Layout(src, layout.reg, layout.lane, layout.warp)
    if op.kind == "trans":
        perm = op.attrs["perm"]
        inv = [perm.index(d) for d in range(len(perm))]
        return remap(layout, src, lambda c: tuple(c[inv[d]] for d in range(len(perm))))
    raise AssertionError(op.kind)


def generate(k: ir.Kernel, filename: str) -> Generated:
    return Codegen(k, filename).generate()

