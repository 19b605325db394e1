"""Typed IR after the passes -> one CUDA C++ kernel: a plain emitter.

Every block value arrives with its layout and every operand in the layout its op reads (the passes
decided them and made conversions and shared memory explicit). A block becomes a per-thread register
array, one entry per register of its layout, and every op is unrolled over those registers. Views,
register renames and splats emit nothing: their registers are other values' registers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import ir
from ..errors import NkError
from ..layout import Layout, dim_bits, log2, rename
from . import cexpr
from .prelude import PRELUDE

# C++20 keywords and alternative tokens that are not Python keywords (those cannot be .nk names)
KEYWORDS = set("""alignas alignof asm auto bitand bitor bool case catch char char8_t char16_t char32_t class compl
    concept const consteval constexpr constinit const_cast co_await co_return co_yield decltype default delete do
    double dynamic_cast enum explicit export extern float friend goto inline int long mutable namespace new noexcept
    not_eq nullptr operator or_eq private protected public register reinterpret_cast requires restrict short signed
    sizeof static static_assert static_cast struct switch template this thread_local throw typedef typeid typename
    union unsigned using virtual void volatile wchar_t xor xor_eq and_eq""".split())
CALLED = re.compile(r"\b([A-Za-z_]\w*)\(")  # functions and casts the generated source calls: a parameter may not shadow one


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
    def __init__(self, k: ir.Kernel, filename: str, renamed: frozenset = frozenset()):
        self.k = k
        self.renamed = renamed  # parameter names that clashed with a name the generated source calls
        self.file_literal = filename.replace("\\", "/").replace('"', "'")  # #line takes no escapes in NVRTC
        self.out: list[str] = []
        self.head: list[str] = []
        self.thread_vars: dict = {}  # (var, lane bases, warp bases) -> name of the per-thread variable
        self.names: dict[int, str] = {}  # scalars and register arrays
        self.vals: dict[int, list[str]] = {}  # id(block value) -> one C expression per register
        self.pinned: dict[int, list[str]] = {}  # id(asynchronous wgmma's result) -> its A words in registers
        self.defs: dict[int, ir.Op] = {id(r): op for op in ir.walk(k.body) for r in op.results}
        self.readers = ir.uses(k)  # id(value) -> the ops that read it
        # ptxas serializes asynchronous wgmma if accumulators are read behind branches: stores then use predicates
        self.predicated = any(op.kind == "dot" and op.attrs.get("async") for op in ir.walk(k.body))
        # with a producer warpgroup (passes.pipeline's warp specialization): the threads past the consumers
        self.producer = next((op.attrs["consumers"] for op in ir.walk(k.body) if op.kind == "roles"), None)
        self.sync = "__syncthreads();"  # the CTA barrier; once the producer has left, the consumers' own
        self.issuer = "nk_tid == 0"  # the thread that issues TMA copies and initializes barriers
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

    # ---- per-thread indices ------------------------------------------------------------------
    def thread_var(self, lane: tuple, warp: tuple, comment: str) -> str:
        """A per-thread int declared once at the top: the XOR of the lane and warp bases of this thread."""
        key = (lane, warp)
        if key not in self.thread_vars:
            name = f"L{len(self.thread_vars)}"
            self.thread_vars[key] = name
            self.head.append(f"  const int {name} = ({bits_expr('nk_lane', lane)}) ^ ({bits_expr('nk_warp', warp)});"
                             f"  // {comment}")
        return self.thread_vars[key]

    def lay(self, layout: Layout) -> str:
        return self.thread_var(layout.lane, layout.warp, f"{list(layout.shape)} {layout.short()}")

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

    # ---- values ------------------------------------------------------------------------------
    def scalar(self, v: ir.Value) -> str:
        return self.names[id(v)]

    def regs(self, v: ir.Value) -> list[str]:
        """The registers of a block value (or a scalar's name, once per register of nothing)."""
        return self.vals[id(v)]

    def declare(self, dtype, hint: str, exprs: list[str]) -> list[str]:
        name = self.fresh(hint)
        self.emit(f"{cexpr.ctype(dtype)} {name}[{len(exprs)}];")
        self.emit_all([f"{name}[{i}] = {e};" for i, e in enumerate(exprs)])
        return [f"{name}[{i}]" for i in range(len(exprs))]

    def define(self, v: ir.Value, exprs: list[str]) -> None:
        """Give a value storage: a scalar variable, or the register array of its layout."""
        if not v.type.shape:
            self.emit(f"{cexpr.ctype(v.type.dtype)} const {self.name_of(v)} = {exprs[0]};")
        elif all(re.fullmatch(r"[\w\[\]]+", e) for e in exprs):
            self.vals[id(v)] = exprs  # already registers or names: nothing to compute
        else:
            self.vals[id(v)] = self.declare(v.type.dtype, v.name, exprs)

    def array(self, v: ir.Value) -> str:
        """Declare a block's register array, to be filled by the caller; returns its name."""
        name = self.name_of(v)
        self.emit(f"{cexpr.ctype(v.type.dtype)} {name}[{v.layout.nregs}];")
        self.vals[id(v)] = [f"{name}[{i}]" for i in range(v.layout.nregs)]
        return name

    # ---- ops ---------------------------------------------------------------------------------
    def region(self, r: ir.Region) -> None:
        for op in r.ops:
            if op.kind != "yield":
                self.span = op.span
                self.op(op)

    def op(self, op: ir.Op) -> None:
        rule = RULES.get(op.kind)
        if rule is not None:
            rule(self, op)
        elif op.kind == "print":
            raise NkError("print() runs in the interpreter only", op.span, "run with NEWT_INTERPRET=1")
        elif isinstance(op.result.type.dtype, ir.Buffer):  # a transposed view of a buffer: nothing to compute
            pass
        elif op.result.type.shape:
            self.block_op(op)
        else:
            self.define(op.result, [self.scalar_expr(op)])

    def block_op(self, op: ir.Op) -> None:
        kind, res = op.kind, op.result
        n = res.layout.nregs
        if kind == "splat":
            self.vals[id(res)] = [self.scalar(op.args[0])] * n
        elif kind in ir.VIEWS:  # the operand is already in the layout that puts each element in place
            self.vals[id(res)] = self.regs(op.args[0])
        elif kind == "convert":
            src = self.regs(op.args[0])
            perm = rename(op.args[0].layout, res.layout)
            if perm is None:
                raise NkError("internal: a conversion between threads reached codegen", op.span)
            self.vals[id(res)] = [src[j] for j in perm]
        elif kind == "arange":
            self.define(res, [f"({op.attrs['start']} + {self.coord(res.layout, i, 0)})" for i in range(n)])
        elif kind in ir.ELEMENTWISE:
            cols = [self.regs(a) for a in op.args]
            dts = [a.type.dtype for a in op.args]
            self.define(res, [cexpr.elementwise(kind, dts, res.type.dtype, [c[i] for c in cols], op.attrs.get("fn"))
                              for i in range(n)])
        else:
            raise NkError(f"internal: no code for {kind}", op.span)

    def scalar_expr(self, op: ir.Op) -> str:
        kind = op.kind
        if kind == "const":
            return cexpr.literal(op.attrs["value"], op.result.type.dtype)
        if kind in ("program_id", "num_programs"):
            reg = ("blockIdx", "gridDim")[kind == "num_programs"] + "." + "xyz"[op.attrs["axis"]]
            return f"({cexpr.ctype(op.result.type.dtype)}){reg}"
        dts = [a.type.dtype for a in op.args]
        return cexpr.elementwise(kind, dts, op.result.type.dtype, [self.scalar(a) for a in op.args], op.attrs.get("fn"))

    def storage(self, vals: list[ir.Value]) -> None:
        """Declare mutable storage for loop-carried or branch-joined values."""
        for v in vals:
            if v.type.shape:
                self.array(v)
            else:
                self.emit(f"{cexpr.ctype(v.type.dtype)} {self.name_of(v)};")

    def assign(self, dst: ir.Value, src: ir.Value, stage: bool) -> list[str]:
        """Statements writing src into dst's storage; `stage` copies through temporaries first
        (a loop's next values may read the current ones)."""
        if not dst.type.shape:
            value = self.scalar(src)
            if stage:
                value = self.fresh(dst.name + "_next")
                self.emit(f"{cexpr.ctype(src.type.dtype)} const {value} = {self.scalar(src)};")
            return [f"{self.name_of(dst)} = {value};"]
        exprs = self.regs(src)
        if stage:
            exprs = self.declare(src.type.dtype, dst.name + "_next", exprs)
        return [f"{d} = {e};" for d, e in zip(self.regs(dst), exprs)]

    def loop(self, op: ir.Op) -> None:
        body = op.regions[0]
        inits, carried = ir.carried(op)
        self.storage(op.results)
        for r, init in zip(op.results, inits):
            self.emit_all(self.assign(r, init, False))
        for p, r in zip(carried, op.results):
            self.names[id(p)] = self.name_of(r)
            if p.type.shape:
                self.vals[id(p)] = self.regs(r)
        if op.attrs.get("unroll"):
            self.emit(f"#pragma unroll {op.attrs['unroll']}")
        if op.kind == "while":  # its first carried value is the condition
            self.emit(f"while ({self.name_of(op.results[0])}) {{")
        else:
            lo, hi, step = (self.scalar(a) for a in op.args[:3])
            step_op = self.defs.get(id(op.args[2]))
            down = step_op is not None and step_op.kind == "const" and step_op.attrs["value"] < 0
            ivn = self.name_of(body.params[0])
            t = cexpr.ctype(body.params[0].type.dtype)
            self.emit(f"for ({t} {ivn} = {lo}; {ivn} {'>' if down else '<'} {hi}; {ivn} += {step}) {{")
        self.nested(body, list(zip(carried, body.ops[-1].args)), stage=True)
        self.emit("}")

    def nested(self, r: ir.Region, yields: list, stage: bool) -> None:
        self.depth += 1
        self.region(r)
        self.span = r.ops[-1].span if r.ops else self.span
        stmts = []
        for dst, src in yields:
            stmts += self.assign(dst, src, stage)
        self.emit_all(stmts)
        self.depth -= 1

    def branch(self, op: ir.Op) -> None:
        self.storage(op.results)
        self.emit(f"if ({self.scalar(op.args[0])}) {{")
        for i, r in enumerate(op.regions):
            if i:
                self.emit("} else {")
            self.nested(r, list(zip(op.results, r.ops[-1].args)), stage=False)
        self.emit("}")

    def roles(self, op: ir.Op) -> None:
        """The producer warpgroup gives most of its registers to the consumers (passes.pipeline.producer_registers),
        its first thread runs the producer's region, and all of it leaves; from here on, a barrier counts the
        consumers' threads only."""
        consumers, (producer, regs) = op.attrs["consumers"], op.attrs["registers"]
        self.emit(f"if (nk_tid >= {consumers}) {{")
        self.emit(f'  asm volatile("setmaxnreg.dec.sync.aligned.u32 {producer};");')
        self.emit(f"  if (nk_tid == {consumers}) {{")
        issuer, self.issuer, self.depth = self.issuer, "true", self.depth + 1
        self.nested(op.regions[0], [], stage=False)
        self.issuer, self.depth = issuer, self.depth - 1
        self.emit("  }")
        self.emit("  return;")
        self.emit("}")
        if regs is not None:
            self.emit(f'asm volatile("setmaxnreg.inc.sync.aligned.u32 {regs};");')
        self.sync = f'asm volatile("bar.sync 1, {consumers};" ::: "memory");'

    # ---- the kernel --------------------------------------------------------------------------
    def generate(self) -> Generated:
        k = self.k
        params = []
        for p in k.params:
            self.names[id(p)] = param_name(p.name, self.renamed)
            t = cexpr.ctype(p.type.dtype)
            if p.name in k.spec.ones:  # specialized as 1: the constant lets NVRTC fold the arithmetic
                params.append(f"{t} nk_unit_{len(params)}")
                self.head.append(f"  const {t} {self.names[id(p)]} = 1;")
            else:
                params.append(f"{t} {self.names[id(p)]}")
        params += [f"const __grid_constant__ nk_tmap nk_map{i}" for i in range(len(k.tmaps))]  # after the arguments
        self.region(k.body)
        threads = 32 * k.spec.num_warps + (128 if self.producer else 0)
        symbol = f"nk_{k.name}"  # prefixed: a kernel named like a CUDA builtin (norm, exp) must not clash
        # setmaxnreg: one program per SM; a cap on registers replaces the bound (NVRTC takes one or the other)
        bounds = f"__launch_bounds__({threads}, 1)" if self.producer else \
            f"__maxnreg__({k.spec.maxnreg})" if k.spec.maxnreg else f"__launch_bounds__({threads})"
        cluster = f" __cluster_dims__({k.spec.num_ctas}, 1, 1)" if k.spec.num_ctas > 1 else ""
        lines = [PRELUDE.strip(), "",
                 f'extern "C" __global__ void {bounds}{cluster} {symbol}({", ".join(params)}) {{',
                 "  extern __shared__ __align__(1024) unsigned char nk_smem[];  // swizzle atoms are 1024 bytes",
                 "  const int nk_tid = threadIdx.x, nk_lane = nk_tid & 31, nk_warp = nk_tid >> 5;",
                 *(["  const unsigned nk_sbase = (unsigned)__cvta_generic_to_shared(nk_smem);"] if k.smem_bytes else []),
                 *self.head, *self.out, "}", ""]
        return Generated("\n".join(lines), symbol, threads, k.smem_bytes)


def device_assert(cg: Codegen, op: ir.Op) -> None:
    """__assertfail prints `file.nk:line: kernel: block [..], thread [..] Assertion `msg` failed.` and traps. A check
    the compiler adds only traps: a call in the kernel makes ptxas serialize every wgmma."""
    cond, mask = op.args
    fail = 'asm volatile("trap;");' if op.attrs.get("trap") else \
        f'__assertfail({cexpr.cstring(op.attrs["msg"])}, "{cg.file_literal}", {op.span.line}, "{cg.k.name}", 1);'
    conds = cg.regs(cond) if cond.type.shape else [cg.scalar(cond)]
    masks = (cg.regs(mask) if mask.type.shape else [cg.scalar(mask)]) if mask is not None else [""] * len(conds)
    cg.emit_all([f"if ({m + ' && ' if m else ''}!{c}) {fail}" for c, m in zip(conds, masks)], per_line=1)


ASM_C = {"h": "unsigned short", "r": "unsigned", "l": "unsigned long long", "f": "float", "d": "double"}
UINT = {8: "unsigned char", 16: "unsigned short", 32: "unsigned", 64: "unsigned long long"}


def inline_asm(cg: Codegen, op: ir.Op) -> None:
    """One asm statement per `pack` registers (the last group padded); every operand travels as the bits its
    constraint names, elements narrower than 32 bits packed into one operand as in Triton (element 0 lowest)."""
    res, cons, pack = op.result, op.attrs["constraints"], op.attrs.get("pack", 1)
    text = re.sub(r"\$(\d+)|\$\$|%", lambda m: f"%{m[1]}" if m[1] else "$" if m[0] == "$$" else "%%", op.attrs["asm"])
    n = res.layout.nregs if res.type.shape else 1
    if res.type.shape:
        cg.array(res)
    else:
        cg.emit(f"{cexpr.ctype(res.type.dtype)} {cg.name_of(res)};")
    dest = cg.regs(res) if res.type.shape else [cg.name_of(res)]
    cols = [cg.regs(a) if a.type.shape else [cg.scalar(a)] * n for a in op.args]
    volatile = "" if op.attrs["pure"] else " volatile"

    def groups(dt, k: int) -> list[range]:  # the elements of each operand register of a group of `pack`
        per = min(max(32 // dt.bits, 1), pack)
        return [range(k + j, k + j + per) for j in range(0, pack, per)]
    for k in range(0, n, pack):
        out_regs = groups(res.type.dtype, k)
        ins = []
        for a, col in zip(op.args, cols):
            w = a.type.dtype.bits
            for g in groups(a.type.dtype, k):
                bits = " | ".join(f"({UINT[w * len(g)]})nk_bitcast<{UINT[w]}>({col[min(i, n - 1)]}) << {w * j}"
                                  for j, i in enumerate(g))
                ins.append(f"nk_bitcast<{ASM_C[cons[len(out_regs) + len(ins)]]}>(({UINT[w * len(g)]})({bits}))")
        outs = ", ".join(f'"{c}"(o{j})' for j, c in enumerate(cons[:len(out_regs)]))
        operands = ", ".join(f'"{c}"({x})' for c, x in zip(cons[len(out_regs):], ins))
        w, t = res.type.dtype.bits, cexpr.ctype(res.type.dtype)
        unpack = " ".join(f"{dest[i]} = nk_bitcast<{t}>(({UINT[w]})(nk_bitcast<{UINT[w * len(g)]}>(o{j}) >> {w * m}));"
                          for j, g in enumerate(out_regs) for m, i in enumerate(g) if i < n)
        cg.emit(f"{{ {' '.join(f'{ASM_C[c[1:]]} o{j};' for j, c in enumerate(cons[:len(out_regs)]))} "
                f"asm{volatile}({cexpr.cstring(text)} : {outs} : {operands}); {unpack} }}")


from . import memory, mma, reduce, shared  # noqa: E402 - they take a Codegen

# ops with their own emitter, each a function (codegen, op)
RULES = {"for": Codegen.loop, "while": Codegen.loop, "if": Codegen.branch, "store": memory.store, "load": memory.load,
         "atomic": memory.atomic, "reduce": reduce.reduce_op, "dot": mma.dot, "dot_wait": mma.dot_wait, "alloc": lambda cg, op: None, "slot": lambda cg, op: None,
         "local_store": shared.local_store, "local_load": shared.local_load, "async_copy": shared.async_copy,
         "async_commit": shared.async_commit, "async_wait": shared.async_wait,
         "barrier": lambda cg, op: cg.emit(cg.sync), "assert": device_assert, "asm": inline_asm, "roles": Codegen.roles,
         "fence_async": lambda cg, op: cg.emit('asm volatile("fence.proxy.async.shared::cta;" ::: "memory");'),
         "mbar_init": shared.mbar_init, "mbar_inval": shared.mbar_inval, "mbar_expect": shared.mbar_expect,
         "tma_load": shared.tma_load, "tma_store": shared.tma_store, "bulk_wait": shared.bulk_wait,
         "mbar_wait": shared.mbar_wait, "mbar_arrive": shared.mbar_arrive, "cluster_sync": shared.cluster_sync}

from . import scan  # noqa: E402 - scans and data movement keep their emitters in their own table

RULES.update(scan.RULES)

GENERATED = re.compile(r"(nk_\w*|L\d+|\w+_\d+|__\w*|threadIdx|blockIdx|blockDim|gridDim|warpSize|\w+_t"
                       r"|u?(char|short|int|long|longlong)[1-4]|(float|double)[1-4]|half2?)")  # and CUDA's types


def param_name(name: str, renamed: frozenset = frozenset()) -> str:
    """The .nk name, unless it could collide with a C++ keyword, a CUDA builtin or a generated name."""
    clash = name in KEYWORDS or name in renamed or GENERATED.fullmatch(name)
    return f"{name}_arg" if clash else name


def generate(k: ir.Kernel, filename: str) -> Generated:
    """The kernel's CUDA source. A parameter named like a function or type that the source calls (expf, max,
    uint4) would shadow it in the kernel's body: such parameters are renamed and the source made again."""
    renamed = frozenset()
    while True:
        g = Codegen(k, filename, renamed).generate()
        clashes = set(CALLED.findall(g.source)) & {p.name for p in k.params} - renamed
        if not clashes:
            return g
        renamed |= clashes
