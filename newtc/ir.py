"""The typed tile IR: SSA values, ops with structured regions, a printer and a verifier.

Every value has a Type (shape, dtype) and, after the layout pass, a Layout. Op kinds:

  const                      attrs value                   scalar constant (0 of a pointer type: null)
  param                      (kernel parameters are Kernel.params, not ops)
  program_id, num_programs   attrs axis                    scalar i32 (i64 in 64-bit-index specializations)
  arange                     attrs start, end              block [end-start] i32
  splat       (s)                                          scalar -> block of the result shape
  broadcast   (x)                                          size-1 dims -> result shape (same rank)
  expand_dims (x)            attrs axis                    insert a size-1 dim
  reshape     (x)                                          same numel, new shape (row-major)
  trans       (x)            attrs perm                    permute dims
  add sub mul div floordiv mod shl shr and or xor minimum maximum   (a, b) same type
  lt le gt ge eq ne          (a, b) -> bool
  neg not abs exp exp2 log log2 sqrt rsqrt sin cos tanh sigmoid erf floor ceil   (x)
  fma         (a, b, c)
  libm        (*x)               attrs fn                  a CUDA math function (fn + 'f' on f32), or umulhi
  where       (c, a, b)
  cast        (x)                                          result dtype is the target
  bitcast     (x)                                          same width, reinterpreted
  ptradd      (p, offset)                                  pointer + integer offset (in elements)
  load        (ptr, mask|None, other|None)
  store       (ptr, value, mask|None)                      no result
  atomic      (ptr, val, mask|None) or (ptr, cmp, val, mask|None) for cas   attrs kind: add max min xchg cas
  reduce      (x)                attrs kind (sum max min argmax argmin), axis, keep_dims
  dot         (a, b, acc)                                  acc + a @ b
  for         (lo, hi, step, *init)   region params (iv, *carried); results = final carried values
                                 attrs num_stages (its software pipeline's depth), unroll (#pragma unroll N),
                                 warp_specialize (a producer warpgroup issues its copies: passes.pipeline)
  while       (cond, *init)           region params (cond, *carried), all carried: the loop runs while the first
                                      is true; results = final values
  if          (cond)                  regions then, else; each ends in yield; results
  yield       (*values)
  print       (*values)          attrs prefix
  assert      (cond, mask|None)  attrs msg                 device_assert: traps with file:line and msg
  asm         (*args)            attrs asm, constraints, pure, pack   inline PTX, pack elements a statement (anchored: never recomputed)
  barrier                                                  debug_barrier (passes.smem also places them)
  scan        (*xs)              attrs axis, reverse; region (a..., b...) ending in a yield of the combined
                                 values: inclusive scans of blocks of one shape, one result per block
  exchange    (x)                attrs axis, xor               element i along axis becomes element i ^ xor
  gather      (src, index)       attrs axis                    src's elements at index along axis
  histogram   (x, mask|None)                                   i32[num_bins]: how many elements equal each bin
  join        (a, b)                                           a new minor dim of 2: [..., 0] = a, [..., 1] = b
  split       (x)                                              two results, x[..., 0] and x[..., 1]
  hint        (x)                attrs multiple_of | max_contiguous (per dim)    x, with facts promised for axisinfo

Made by the passes (the checker never emits them; the interpreter runs the IR before the passes):
  convert     (x)                                          the same block in another register layout
  alloc                          attrs offset (bytes, set by passes.smem)   a shared-memory buffer: its type's
                                                           dtype is a Buffer, its layout a shared layout
  slot        (ring, index)                                one tile of a ring buffer, itself a buffer
  trans       (buf)              attrs perm                 of a buffer: the same bytes through the permuted layout
  local_store (buf, x)                                     write a block into a buffer
  local_load  (buf)              attrs start (coordinate of the sub-tile read)
  async_copy  (buf, ptr, mask|None)                        cp.async of a pointer block into a buffer
  async_commit, async_wait       attrs pending              cp.async groups
  dot_wait    (acc..., buf...)   attrs pending              the accumulators of asynchronous wgmma, once landed
                                                           (one result each); the buffers they read
  barrier, fence_async                                     __syncthreads; order shared-memory writes before the
                                                           tensor cores' (async proxy) reads
  roles                          attrs consumers; region   the producer warpgroup's code (threads past `consumers`,
                                                           which then leave); the consumers go on after it
  mbar_init (bars) attrs count; mbar_expect, tma_load, mbar_wait (bars, slot, parity[, valid]), mbar_inval (bars),
  mbar_arrive (bars, slot, cond)                           TMA rings' barriers (passes.pipeline); attrs ctas: every
                                                           CTA's barrier of a cluster; tma_load's attrs cast: multicast
  cluster_sync                                             barrier.cluster: every thread of the cluster
  tma_store   (buf, row, col, outer...)  attrs map, boxes  a staged tile copied to global memory by TMA
  bulk_wait                                                the TMA stores issued so far have read their buffers
reduce takes a scratch buffer as a second operand when warps meet along the axis; a scalar atomic
takes one as its last operand (the old value reaches every thread through it).
scan, exchange, gather and histogram take one as their last operand where data crosses warps.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from .errors import NkError, Span, flag
from .types import Ptr, Type

_ids = itertools.count()

ELEMENTWISE_BINARY = {"add", "sub", "mul", "div", "floordiv", "mod", "shl", "shr", "and", "or", "xor",
                      "minimum", "maximum"}
COMPARISONS = {"lt", "le", "gt", "ge", "eq", "ne"}
ELEMENTWISE_UNARY = {"neg", "not", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh",
                     "sigmoid", "erf", "floor", "ceil"}
ELEMENTWISE = (ELEMENTWISE_BINARY | COMPARISONS | ELEMENTWISE_UNARY
               | {"fma", "where", "cast", "bitcast", "ptradd", "libm", "hint"})
VIEWS = {"splat", "broadcast", "expand_dims", "reshape", "trans"}


@dataclass(frozen=True)
class Buffer:
    """The dtype of a shared-memory buffer: `slots` copies of a tile of `elem` (a ring when slots > 1)."""
    elem: Any
    slots: int = 1

    @property
    def name(self) -> str:
        return f"smem<{self.elem}{f' x{self.slots}' if self.slots > 1 else ''}>"

    def __repr__(self) -> str:
        return self.name

    kind = "s"
    bits = 0
    is_float = False
    is_int = False


def buffer_bytes(v: "Value") -> int:
    return v.type.numel * v.type.dtype.elem.itemsize * v.type.dtype.slots


def is_zero(v: "Value", defs: dict) -> bool:
    """The value is a constant 0, through splats, broadcasts and conversions of it."""
    op = defs.get(id(v))
    while op is not None and op.kind in ("splat", "broadcast", "convert"):
        op = defs.get(id(op.args[0]))
    return op is not None and op.kind == "const" and op.attrs["value"] == 0


def root_buffer(v: "Value", defs: dict) -> "Op":
    """The alloc a buffer value (an alloc's result, a slot of a ring or a transposed view) lives in."""
    op = defs[id(v)]
    return root_buffer(op.args[0], defs) if op.kind in ("slot", "trans") else op


@dataclass(frozen=True)
class Facts:
    """What passes.axisinfo knows about the values of a block, per dimension (see there)."""
    contig: tuple = (1,)
    div: tuple = (1,)
    const: tuple = (1,)
    value: int | None = None  # every element's value, when it is one known constant


def facts(v: "Value | None") -> Facts:
    """A value's facts, or nothing known (a scalar counts as one dimension of size one)."""
    if v is not None and v.facts is not None:
        return v.facts
    rank = max(1, len(v.type.shape)) if v is not None else 1
    return Facts((1,) * rank, (1,) * rank, (1,) * rank)


@dataclass(eq=False)
class Value:
    type: Type
    name: str = ""
    layout: Any = None  # set by passes.layouts for blocks; None = recomputed in each consumer's layout
    facts: Facts | None = None  # set by passes.axisinfo: what is known about its values
    id: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"%{self.name or 'v'}{self.id}"


@dataclass(eq=False)
class Region:
    params: list[Value] = field(default_factory=list)
    ops: list["Op"] = field(default_factory=list)


@dataclass(eq=False)
class Op:
    kind: str
    args: list[Value | None]
    results: list[Value] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    span: Span | None = None
    regions: list[Region] = field(default_factory=list)

    @property
    def result(self) -> Value:
        return self.results[0]


@dataclass(eq=False)
class Kernel:
    """One specialization of a `.nk` kernel: the unit that passes, codegen and the interpreter take."""

    name: str
    params: list[Value]  # runtime parameters, in launch order
    body: Region
    spec: Any  # the compiler.Spec it was typed for
    span: Span | None = None
    smem_bytes: int = 0  # set by passes.smem
    tmaps: list = field(default_factory=list)  # set by passes.pipeline: the tensor maps its TMA loads read (dicts)


def carried(op: Op) -> tuple[list, list]:
    """A loop's (initial values, region parameters) of its carried values, one per result."""
    n, params = len(op.results), op.regions[0].params
    return op.args[len(op.args) - n:], params[len(params) - n:]


def walk(region: Region):
    """Every op in a region, nested regions included, in program order."""
    for op in region.ops:
        yield op
        for r in op.regions:
            yield from walk(r)


def uses(k: "Kernel") -> dict:
    """id(value) -> the ops that read it."""
    out: dict = {}
    for op in walk(k.body):
        for a in op.args:
            if a is not None:
                out.setdefault(id(a), []).append(op)
    return out


# ---- printer: the `--emit ir` format ---------------------------------------------------------
def _fmt_attr(v) -> str:
    return repr(v) if not isinstance(v, float) else repr(v)


def _fmt_type(v: Value) -> str:
    s = str(v.type)
    if v.layout is not None:
        s += f" #{v.layout.short()}"
    return s


def print_kernel(k: Kernel) -> str:
    lines = []
    params = ", ".join(f"{p!r}: {p.type}" for p in k.params)
    consts = ", ".join(f"{n}={v!r}" for n, v in k.spec.constexprs)
    lines.append(f"kernel @{k.name}({params}) num_warps={k.spec.num_warps}" + (f" [{consts}]" if consts else "") + " {")
    _print_region(k.body, lines, 1)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _print_region(region: Region, lines: list[str], depth: int) -> None:
    pad = "  " * depth
    for op in region.ops:
        res = ", ".join(repr(r) for r in op.results)
        lhs = f"{res} = " if res else ""
        args = ", ".join("_" if a is None else repr(a) for a in op.args)
        attrs = " ".join(f"{k}={_fmt_attr(v)}" for k, v in op.attrs.items())
        types = ", ".join(_fmt_type(r) for r in op.results)
        line = f"{pad}{lhs}{op.kind}({args})" + (f" {{{attrs}}}" if attrs else "") + (f" : {types}" if types else "")
        if op.span:
            line += f"  # {op.span.line}"
        lines.append(line)
        for i, r in enumerate(op.regions):
            head = ", ".join(f"{p!r}: {p.type}" for p in r.params)
            lines.append(f"{pad}  ^{['body', 'else'][i] if op.kind != 'if' else ['then', 'else'][i]}({head}):")
            _print_region(r, lines, depth + 2)


# ---- verifier --------------------------------------------------------------------------------
def verify(k: Kernel) -> None:
    """Check SSA dominance and the type rules every pass must keep; raises on the first violation."""
    defined = {id(p) for p in k.params}

    def fail(op: Op, msg: str):
        raise NkError(f"internal IR error in {op.kind}: {msg}", op.span)

    def region(r: Region, scope: set[int]):
        scope = set(scope) | {id(p) for p in r.params}
        for op in r.ops:
            for a in op.args:
                if a is not None and id(a) not in scope:
                    fail(op, f"operand {a!r} used before definition")
            if op.kind in ELEMENTWISE_BINARY | COMPARISONS and op.args[0].type.shape != op.args[1].type.shape:
                fail(op, f"shape mismatch {op.args[0].type} vs {op.args[1].type}")
            if op.kind in ELEMENTWISE_BINARY and op.args[0].type.dtype != op.args[1].type.dtype:
                fail(op, f"dtype mismatch {op.args[0].type} vs {op.args[1].type}")
            if op.kind in ("load", "store", "atomic") and not isinstance(op.args[0].type.dtype, Ptr):
                fail(op, "pointer operand is not a pointer")
            if op.kind in ELEMENTWISE | {"load"} and op.results and op.result.layout is not None:
                for a in op.args:  # after layout assignment, an op reads its operands where it computes
                    if a is not None and a.type.shape and a.layout != op.result.layout:
                        fail(op, f"operand layout {a.layout and a.layout.short()} differs from the result's")
            for sub in op.regions:
                region(sub, scope)
                if op.kind in ("for", "while", "if"):
                    last = sub.ops[-1] if sub.ops else None
                    if last is None or last.kind != "yield" or len(last.args) != len(op.results):
                        fail(op, "region must end in a yield of one value per result")
                    for y, res in zip(last.args, op.results):
                        if y.type != res.type:
                            fail(op, f"yield type {y.type} differs from result type {res.type}")
            for v in op.results:
                for d in () if isinstance(v.type.dtype, Buffer) and v.layout is None else v.type.shape:
                    if d & (d - 1):  # a scratch buffer's bytes (argmax: 12 a value) need not be a power of two
                        fail(op, f"block dimension {d} is not a power of two")
                scope.add(id(v))

    region(k.body, defined)


def maybe_verify(k: Kernel) -> None:
    if flag("NEWT_VERIFY"):
        verify(k)
