"""One launch grid of a tile program + a config + the call's host values -> a newt kernel's text.

Each expression becomes its text and its dims, one per axis: a Dim (a tile, or a whole dimension taken with
`:`) or None (size 1). Dims say where masks go: loads and stores are masked by their tiles' bounds, a
reduction along a ragged dim first puts its identity in the padding, and a dot along a ragged K zeroes the
padding of an operand that is not a fresh load (loads fill it with 0). A mask is left out where the call's
sizes, which the host code knows, prove that the block divides the bound.
"""
import functools
import itertools
import json
from pathlib import Path
from typing import NamedTuple

import torch

import newtc
from newtc import ast as A, gpu
from newtc.errors import NkError, Span
from newtc.types import DType

from .lang import DTYPE_OF, callee, header, require

PREC = {"or": 1, "and": 2, "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "//": 10,
        "%": 10, "@": 10, **dict.fromkeys(["<", "<=", ">", ">=", "==", "!="], 4)}
ATOM = 12
IDENTITY = {"sum": "0", "max": "-inf", "min": "inf", "argmax": "-inf", "argmin": "inf"}


class Dim(NamedTuple):
    index: str  # the index vector: a tile's variable, or r0, r1, ... for whole dimensions
    block: str  # its block size, a constexpr
    bound: str | None  # lanes with index >= bound are padding; None where the call proves there are none
    var: str | None  # the tile variable (None: a whole dimension)
    size: int  # the block size


class E(NamedTuple):
    text: str
    dims: tuple = ()
    prec: int = ATOM
    zero: bool = False  # its padding lanes hold 0: a fresh load, converted or not


TileVar = NamedTuple("TileVar", [("dim", Dim), ("begin", E), ("bound", str)])  # a tile variable of the kernel


def par(e: E, prec: int) -> str:
    return e.text if e.prec >= prec else f"({e.text})"


def bc(j: int, rank: int) -> str:
    """The indexing that puts a 1-D index vector on axis j of a rank-`rank` block: `[:, None]`."""
    return "" if rank <= 1 else "[" + ", ".join(":" if k == j else "None" for k in range(rank)) + "]"


def mask(dims: tuple, axes=None) -> str | None:
    """The mask of a block's ragged dims (those on `axes`, or all)."""
    terms = [f"{d.index}{bc(j, len(dims))} < {d.bound}" for j, d in enumerate(dims)
             if d is not None and d.bound and (axes is None or j in axes)]
    return terms[0] if len(terms) == 1 else " & ".join(f"({t})" for t in terms) or None


def padded(v: E, axes, fill: str) -> str:
    """v's text with `fill` in its padding lanes along `axes`: a reduction's identity, a dot's 0."""
    m = mask(v.dims, axes)
    return f"where({m}, {v.text}, {fill})" if m else v.text


def broadcast(*dimss) -> tuple:
    """The dims of operands broadcast together, aligned at the right: per axis, the first that is not 1 (None)."""
    columns = itertools.zip_longest(*(reversed(d) for d in dimss))
    return tuple(reversed([next(filter(None, column), None) for column in columns]))


def names_in(nodes) -> set:
    """Every name some AST nodes mention or bind (names, parameters, definitions)."""
    found = (n for x in nodes for n in A.walk(x) if isinstance(n, (A.Name, A.Param, A.FuncDef)))
    return {n.id if isinstance(n, A.Name) else n.name for n in found}


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def programs(device: torch.device) -> int:
    """How many programs a persistent grid starts: one per SM, as newt's model of the GPU says (4 in the interpreter)."""
    return gpu.gpu(device.index).sms if device.type == "cuda" else 4


def is_whole(item) -> bool:
    """`:` among indices."""
    return isinstance(item, A.Slice) and item.lower is item.upper is item.step is None


def is_none(item) -> bool:
    return isinstance(item, A.Const) and item.value is None


class Lowered:
    """A launch grid of a tile program lowered for one call: the kernel's `text`, launched on `grid` programs with
    `args(env)` and `meta`, and what the search space is derived from. `host` holds the host code's values at the
    grid while lowering; they are not kept."""

    def __init__(self, fn, host: dict, interp, config: dict, name: str, loop: A.For):
        self.fn, self.host, self.interp, self.config, self.name = fn, host, interp, config, name
        self.taken, self.short = names_in(fn.program.ast.defs), Path(fn.program.ast.file).name
        self.file = f"{self.short}~{name}.nk"  # not the folder: a program loaded by another path shares newt's caches
        self.lines, self.preamble, self.depth = [], [], 1  # (depth, text, span)
        self.params, self.consts, self.memo, self.env, self.rindex = {}, {}, {}, {}, {}  # params: name -> source
        # for the search space: each tile's bound (its next power of two, or None), the tiles of dots, the block
        # shapes (tuples of tiles and whole sizes), an in-kernel tile loop, the grid's last two dimensions tiles; and
        # the extent of each tile and grid index the host code knows
        self.tiles, self.extent, self.dots, self.values, self.loops, self.group = {}, {}, set(), set(), False, False
        self.lower(loop)
        self.itemsize = max((v.element_size() for v in host.values() if isinstance(v, torch.Tensor)), default=2)
        self.gpu = gpu.gpu(interp.device.index if interp.device.type == "cuda" else -1)  # what dot tiles fit
        self.host = self.interp = None

    @functools.cached_property
    def kernel(self):
        """The newt kernel, compiled on first use (not for the text alone); equal text (another shape that lowers
        the same way) shares one, so its launches and binaries are reused."""
        if self.text not in self.fn.kernels:
            self.fn.kernels[self.text] = getattr(self.run(newtc.compile, self.text, self.file), self.name)
        return self.fn.kernels[self.text]

    def args(self, env) -> list:
        """The kernel's runtime arguments: a source is ("value", host name) | ("size" | "stride", tensor, dim)."""
        return [env[s[1]] if s[0] == "value" else getattr(env[s[1]], s[0])(s[2]) for s in self.params.values()]

    def run(self, step, *args, **kwargs):
        """step(*args, **kwargs), an error in the generated kernel reported at the tile program's line."""
        try:
            return step(*args, **kwargs)
        except NkError as e:
            d = e.diagnostics[0]
            if d.span is None or d.span.file != self.file:
                raise
            here = self.text.splitlines()[d.span.line - 1].split("  # ")[0].strip()
            hint = "; ".join(filter(None, [d.hint, f"in the generated kernel: {here}"]))
            raise NkError(d.message, self.linemap.get(d.span.line), hint) from None

    def fresh(self, base: str, key=None) -> str:
        """A name that neither the file nor the kernel uses (base, base2, base3, ...), the same one for the same key."""
        if key is None or key not in self.memo:
            names = (f"{base}{i}" if i > 1 else base for i in itertools.count(1))
            self.memo[key] = next(n for n in names if n not in self.taken)
            self.taken.add(self.memo[key])
        return self.memo[key]

    def declare(self, table: dict, base: str, value, key) -> str:
        """A fresh name for `key`, bound to `value` in params (name -> source) or consts (name -> value)."""
        table[name := self.fresh(base, key)] = value
        return name

    def size(self, x: str, d: int, what: str = "size") -> str:
        """The kernel parameter of tensor x's size (or stride) along dimension d."""
        return self.declare(self.params, f"{x}_{what}{d}", (what, x, d), (what, x, d))

    def line(self, text: str) -> None:
        self.lines.append((self.depth, text, self.span))

    def let(self, base: str, text: str) -> str:
        """A fresh name assigned `text` on a line of its own."""
        name = self.fresh(base)
        self.line(f"{name} = {text}")
        return name

    def known(self, e, what: str | None = None) -> int | None:
        """The int an expression makes of the host code's values alone (a size, an axis); where it makes none,
        None, or an error saying that `what` must be one."""
        try:
            n = None if names_in([e]) & set(self.env) else self.interp.expr(e, self.host)
        except (NkError, TypeError, ValueError, AttributeError, IndexError, KeyError):
            n = None
        require(not what or isinstance(n, int), f"{what} must be an int the host code knows", e.span)
        return n if isinstance(n, int) else None

    # ---- the grid ------------------------------------------------------------------------------
    def lower(self, loop: A.For) -> None:
        self.span, dims, counts, grid = loop.span, [], [], 1  # dims: (variable, bound, Dim or None for grid(n))
        persistent, several = bool(self.config.get("persistent")), len(loop.iter.args) > 1
        for name, arg in zip(header(loop)[1], loop.iter.args):
            node = arg.args[0] if callee(arg) == "grid" else arg
            bound, n = self.scalar(node), self.known(node, "a grid's size")
            self.extent[name] = n
            d = self.tile(name, arg, bound) if node is arg else None
            dims.append((name, bound.text, d))
            grid *= -(-n // d.size) if d else n
            count = bound.text if d is None else f"cdiv({bound.text}, {d.block})"  # programs along the dimension
            counts.append(self.let(f"n_{name}", count) if d and (several or persistent) else count)  # named: used again
        self.group = several and None not in (dims[-1][2], dims[-2][2])
        group = self.config.get("group", 1) if self.group else 1
        pid = self.fresh("pid")
        self.line(f"for {pid} in range(program_id(0), {' * '.join(counts)}, num_programs(0)):" if persistent else
                  f"{pid} = program_id(0)")
        if persistent:  # one program per SM walks the tiles
            self.depth += 1
            grid = min(grid, programs(self.interp.device))
        pids = [pid] if len(dims) == 1 and dims[0][2] else [v if d is None else self.fresh(f"pid_{v}") for v, _, d in dims]
        if group > 1:  # the last two dimensions as one, walked in groups of rows
            inner = pid if len(dims) == 2 else self.fresh("inner")
            self.unflatten(pid, pids[:-2] + [inner], counts[:-2] + [f"({counts[-2]} * {counts[-1]})"])
            self.grouped(inner, pids[-2:], counts[-2:], self.declare(self.consts, "GROUP", group, "GROUP"))
        else:
            self.unflatten(pid, pids, counts)
        for (v, bound, d), p in zip(dims, pids):  # grid(n)'s index is a scalar
            self.env[v] = E(v) if d is None else self.enter(v, d, E(f"{p} * {d.block}", (), PREC["*"]), bound)
        self.block(loop.body)
        self.finish(grid, loop)

    def unflatten(self, pid: str, names: list, counts: list) -> None:
        """The index along each dimension from the flat program id, row-major: the last dimension moves fastest."""
        for i, name in enumerate(names):
            later = counts[i + 1:]
            div = f" // {later[0]}" if len(later) == 1 else f" // ({' * '.join(later)})" if later else ""
            if name != pid:
                self.line(f"{name} = {pid}{div}" + (f" % {counts[i]}" if i else ""))

    def grouped(self, inner: str, pids: list, counts: list, size: str) -> None:
        """GROUP rows of tiles walked column by column, so that the tiles they read stay in L2."""
        group = self.let("group", f"{size} * {counts[1]}")
        first = self.let("first", f"{inner} // {group} * {size}")
        rows = self.let("rows", f"minimum({counts[0]} - {first}, {size})")
        rest = self.let("rest", f"{inner} % {group}")
        self.line(f"{pids[0]} = {first} + {rest} % {rows}")
        self.line(f"{pids[1]} = {rest} // {rows}")

    def tile(self, name: str, node, bound: E) -> Dim:
        """A tile loop's block; it is not masked where the host code's sizes show that the block divides the bound."""
        size, n = self.config.get(f"block_{name}", 1), self.known(node)
        self.tiles[name], self.extent[name] = None if n is None else next_pow2(n), n
        block = self.declare(self.consts, f"BLOCK_{name.upper()}", size, ("block", name))
        return Dim(name, block, None if n is not None and n % size == 0 else bound.text, name, size)

    def enter(self, name: str, dim: Dim, begin: E, bound: str) -> TileVar:
        """The tile variable `name` of the tile at `begin`, its index vector assigned on a line of its own."""
        self.line(f"{name} = {begin.text} + arange(0, {dim.block})")
        return TileVar(dim, begin, bound)

    def whole(self, bound: str, n: int) -> Dim:
        """A whole dimension of n elements (`bound` in the kernel) in a block of its next power of two; one index
        vector per block size."""
        np2 = next_pow2(n)
        if np2 not in self.rindex:
            index = self.fresh(f"r{len(self.rindex)}")
            self.rindex[np2] = index, self.declare(self.consts, index.upper(), np2, ("R", np2))
            self.preamble.append((1, f"{index} = arange(0, {self.rindex[np2][1]})", self.span))
        return Dim(*self.rindex[np2], None if n == np2 else bound, None, np2)

    def finish(self, grid: int, loop: A.For) -> None:
        module, fn, defs, short = self.fn.program.ast, self.fn.defn, self.fn.program.defs, self.short
        self.params = dict(sorted(self.params.items(), key=lambda p: not isinstance(self.host.get(p[0]), torch.Tensor)))
        out = [(f"# deuteron: tile {fn.name} ({short}:{fn.span.line}), config {json.dumps(self.config, default=str)}", None)]
        used = names_in(loop.body) & set(defs)
        while more := {m for n in used for m in names_in(defs[n].body) if m in defs} - used:  # helpers' helpers
            used |= more
        src = module.source.splitlines()
        for d in (d for d in defs.values() if d.name in used):  # as written
            out += [(src[k - 1], Span(module.file, k, 1)) for k in range(d.span.line, d.span.end_line + 1)] + [("", None)]
        out.append((f"kernel {self.name}({', '.join([*self.params, *(f'{n}: constexpr' for n in self.consts)])}):", self.span))
        out += [(f"{'    ' * depth}{text}  # {short}:{span.line}", span) for depth, text, span in self.preamble + self.lines]
        self.meta = {**self.consts, "num_warps": self.config.get("num_warps", 4), "num_stages": self.config.get("num_stages", 1)}
        self.text, self.grid = "\n".join(text for text, _ in out) + "\n", grid
        self.linemap = {i: span for i, (_, span) in enumerate(out, 1) if span}  # generated line -> Span in the tile program

    # ---- statements ----------------------------------------------------------------------------
    def block(self, stmts):
        for s in stmts:
            self.span = s.span
            getattr(self, "s_" + type(s).__name__)(s)

    def nested(self, body):
        self.depth += 1
        self.block(body)
        self.depth -= 1

    def s_Pass(self, s):
        self.line("pass")

    def s_Return(self, s):
        raise NkError("`return` belongs to the host code, after the tile loops", s.span)

    def s_ExprStmt(self, s):
        self.line(self.expr(s.value).text)

    def s_Assign(self, s):
        e = self.expr(s.value)
        if isinstance(s.targets[0], A.Subscript):
            ptr, m, _ = self.place(s.targets[0])
            return self.line(f"store({ptr}, {e.text}{f', mask={m}' if m else ''})")
        for t in s.targets:
            require(isinstance(t, A.Name), "assign to names, or to a tensor's tile such as out[tm, tn]", t.span)
            self.env[t.id] = E(t.id, e.dims)
        self.line(f"{', '.join(t.id for t in s.targets)} = {e.text}")

    def s_AugAssign(self, s):
        require(isinstance(s.target, A.Name), "only names take augmented assignment in a tile loop", s.span)
        if s.op == "+" and isinstance(s.value, A.BinOp) and s.value.op == "@":  # accumulate in the dot itself
            return self.line(f"{s.target.id} = {self.dot(s.value.left, s.value.right, s.target, s.value.span).text}")
        self.line(f"{self.expr(s.target).text} {s.op}= {self.expr(s.value).text}")

    def s_If(self, s):
        self.line(f"if {self.expr(s.cond).text}:")
        self.nested(s.body)
        if s.orelse:
            self.line("else:")
            self.nested(s.orelse)

    def s_For(self, s):
        kind, names = header(s)
        if kind != "tiles":
            self.line(f"for {names[0]} in {kind}({', '.join(self.scalar(a).text for a in s.iter.args)}):")
            self.env[names[0]] = E(names[0])
            return self.nested(s.body)
        self.loops = True
        for name, arg in zip(names, s.iter.args):  # one in-kernel loop per dimension
            bound = self.scalar(arg)
            dim, begin = self.tile(name, arg, bound), self.fresh(f"{name}_begin")
            self.line(f"for {begin} in range(0, {bound.text}, {dim.block}):")
            self.depth += 1
            self.env[name] = self.enter(name, dim, E(begin), bound.text)
        self.block(s.body)
        self.depth -= len(names)

    # ---- expressions ---------------------------------------------------------------------------
    def expr(self, e) -> E:
        lower = getattr(self, "e_" + type(e).__name__, None)
        require(lower, f"{type(e).__name__} is not supported in a tile loop", e.span)
        out = lower(e)
        if out.dims:
            self.values.add(tuple(d.var or d.size for d in out.dims if d))
        return out

    def scalar(self, e) -> E:
        out = self.expr(e)
        require(not out.dims, "expected a scalar here, not a tile", e.span)
        return out

    def e_Num(self, e):
        return E(repr(e.value))

    e_Const = e_Str = e_Num

    def e_Name(self, e):
        if (v := self.env.get(e.id)) is not None:
            return E(e.id, (v.dim,)) if isinstance(v, TileVar) else v
        v = self.host.get(e.id)
        if e.id in self.fn.constexprs:
            self.consts[e.id] = v
        elif self.tensor(e) is not None or type(v) in (int, float):
            self.params[e.id] = ("value", e.id)
        elif e.id in self.host:  # a host bool, string, dtype or None: a literal
            return E(v.name if isinstance(v, DType) else repr(v))
        return E(e.id)  # a parameter, or a builtin, helper or constant such as f32 or inf

    def tensor(self, e) -> torch.Tensor | None:
        """The host code's tensor that e names, or None."""
        v = self.host.get(e.id) if isinstance(e, A.Name) and e.id not in self.env else None
        if not isinstance(v, torch.Tensor):
            return None
        require(v.dtype in DTYPE_OF, f"tensors of {v.dtype} are not supported", e.span)
        return v

    def e_Attribute(self, e):
        v = self.env.get(e.value.id) if isinstance(e.value, A.Name) else None
        if isinstance(v, TileVar) and e.attr in ("begin", "end", "size", "index"):
            end = f"minimum({v.begin.text} + {v.dim.block}, {v.bound})"
            return {"begin": v.begin, "end": E(end), "index": E(v.dim.index, (v.dim,)),
                    "size": E(f"{end} - {par(v.begin, PREC['-'] + 1)}", (), PREC["-"])}[e.attr]
        if (t := self.tensor(e.value)) is not None and e.attr == "dtype":
            return E(DTYPE_OF[t.dtype].name)
        base = self.expr(e.value)
        return E(f"{par(base, ATOM)}.{e.attr}", base.dims if e.attr == "to" else (), zero=base.zero and e.attr == "to")

    def e_Subscript(self, e):
        if isinstance(e.value, A.Attribute) and e.value.attr == "shape" and (t := self.tensor(e.value.value)) is not None:
            return E(self.size(e.value.value.id, self.known(e.index[0], "a dimension") % t.dim()))
        if self.tensor(e.value) is not None:
            ptr, m, dims = self.place(e)
            return E(f"load({ptr}{f', mask={m}, other=0' if m else ''})", dims, zero=True)
        v = self.expr(e.value)
        for item in e.index:  # a computed tile takes `:` and None
            require(is_whole(item) or is_none(item), "a computed tile takes only `:` and `None` as indices", item.span)
        axes = iter(v.dims)
        dims = tuple(next(axes, None) if is_whole(item) else None for item in e.index)
        return E(f"{par(v, ATOM)}[{', '.join(':' if is_whole(i) else 'None' for i in e.index)}]", dims)

    def place(self, e: A.Subscript):
        """The pointers, mask and dims of `x[tm, :, i, None]` for a host tensor x."""
        t = self.tensor(e.value)
        require(t is not None, "tiles index the host code's tensors", e.value.span)
        x, dims, offsets = e.value.id, [], []  # offsets: per dimension of x, an axis of dims or a scalar E
        for item in e.index:
            v, n = (self.env.get(item.id), self.extent.get(item.id)) if isinstance(item, A.Name) else (None, None)
            if is_none(item):
                dims.append(None)
                continue
            d = len(offsets)
            require(d < t.dim(), f"too many indices for a tensor of rank {t.dim()}", e.span)
            require(is_whole(item) or not isinstance(item, A.Slice), "a tensor takes `:` (a whole dimension), not a range", item.span)
            # n: a tile's or grid index's extent; past x's size the GPU would read past its end (the oracle raises)
            require((n or 0) <= t.shape[d], f"the index runs over {n}, past {x}'s dimension {d} of {t.shape[d]}", item.span)
            if is_whole(item) or isinstance(v, TileVar):
                dims.append(self.whole(self.size(x, d), t.shape[d]) if is_whole(item) else v.dim)
                offsets.append(len(dims) - 1)
            else:
                offsets.append(self.scalar(item))
        require(len(offsets) == t.dim(), f"{len(offsets)} indices for a tensor of rank {t.dim()}", e.span)
        parts = [self.expr(e.value).text]  # the tensor's pointer, a parameter
        for d, i in enumerate(offsets):
            idx = par(E(dims[i].index + bc(i, len(dims))) if isinstance(i, int) else i, PREC["*"])
            parts.append(idx if t.stride(d) == 1 else f"{idx} * {self.size(x, d, 'stride')}")  # unit: seen contiguous
        return " + ".join(parts), mask(tuple(dims)), tuple(dims)

    def e_UnaryOp(self, e):
        v, p = self.expr(e.operand), 3 if e.op == "not" else 11  # `not` binds looser than - + ~
        return E(f"not {par(v, p)}" if e.op == "not" else f"{e.op}{par(v, p)}", v.dims, p)

    def e_BinOp(self, e):
        if e.op == "@":
            return self.dot(e.left, e.right, None, e.span)
        a, b, p = self.expr(e.left), self.expr(e.right), PREC[e.op]
        return E(f"{par(a, p + (p == 4))} {e.op} {par(b, p + 1)}", broadcast(a.dims, b.dims), p)  # no chained <

    def dot(self, an, bn, acc, span) -> E:
        """a @ b, accumulating into acc where there is one; the nodes of a, b and acc."""
        a, b = self.expr(an), self.expr(bn)
        require(len(a.dims) == len(b.dims) == 2, "`@` multiplies two 2-D tiles", span)
        texts = [v.text if v.zero else padded(v, [k], "0") for v, k in ((a, 1), (b, 0))]  # K: a's axis 1, b's axis 0
        self.dots.add(tuple(d.var if d else None for d in (a.dims[0], b.dims[1], a.dims[1])))  # (m, n, k)
        return E(f"dot({', '.join(texts + ([self.expr(acc).text] if acc else []))})", (a.dims[0], b.dims[1]))

    def e_Call(self, e):
        f, kw = callee(e), dict(e.kwargs)
        if f in IDENTITY:
            return self.reduce(f, e, kw)
        if f in ("zeros", "full"):
            return self.alloc(f, e)
        if f == "dot":
            return self.dot(e.args[0], e.args[1], e.args[2] if len(e.args) > 2 else kw.get("acc"), e.span)
        if f and f.startswith("atomic_") and e.args and isinstance(e.args[0], A.Subscript):
            ptr, m, _ = self.place(e.args[0])
            return E(f"{f}({', '.join([ptr] + [self.expr(a).text for a in e.args[1:]])}{f', mask={m}' if m else ''})")
        require(f not in ("reshape", "broadcast_to", "tiles"), f"{f}() is not supported in a tile loop", e.span)
        func, args = self.expr(e.func), [self.expr(a) for a in e.args]
        dims = broadcast(*(a.dims for a in args))
        if f == "trans":
            dims = tuple(args[0].dims[int(a.text)] for a in args[1:]) or tuple(reversed(args[0].dims))
        text = ", ".join([a.text for a in args] + [f"{k}={self.expr(v).text}" for k, v in e.kwargs])
        return E(f"{func.text}({text})", func.dims if isinstance(e.func, A.Attribute) else dims, zero=func.zero)

    def reduce(self, f, e, kw):
        x = self.expr(e.args[0])
        node = e.args[1] if len(e.args) > 1 else kw.get("axis")
        axis = None if node is None or is_none(node) else self.known(node, "an axis")
        keep = "keep_dims" in kw and bool(self.known(kw["keep_dims"]))
        axes = range(len(x.dims)) if axis is None else [axis % len(x.dims)]
        args = [padded(x, axes, IDENTITY[f]), *([f"axis={axis}"] if axis is not None else []), *(["keep_dims=True"] if keep else [])]
        return E(f"{f}({', '.join(args)})", tuple(None if a in axes else d for a, d in enumerate(x.dims) if keep or a not in axes))

    def alloc(self, f, e):
        shape = e.args[0]
        dims = tuple(map(self.shape_dim, shape.items if isinstance(shape, (A.ListExpr, A.TupleExpr)) else [shape]))
        rest = [self.expr(a).text for a in e.args[1:]] + [f"{k}={self.expr(v).text}" for k, v in e.kwargs]
        return E(f"{f}([{', '.join(d.block for d in dims)}]{''.join(', ' + r for r in rest)})", dims)

    def shape_dim(self, item) -> Dim:
        """A dimension of the block zeros() or full() makes: a tile, or a whole size the host knows (x.shape[i], 16)."""
        v = self.env.get(item.id) if isinstance(item, A.Name) else None
        return v.dim if isinstance(v, TileVar) else \
            self.whole(self.scalar(item).text, self.known(item, "a tile shape's entry (a tile, or a size)"))
