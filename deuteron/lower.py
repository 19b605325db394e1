"""One launch grid of a tile program + a config + what the call's arguments prove -> a newt kernel's text.

Each expression becomes its text and its dims, one per axis: a Dim (a tile, or a whole dimension taken with
`:`) or None (size 1). Dims say where masks go: loads and stores are masked by their tiles' bounds, a
reduction along a ragged dim first puts its identity in the padding, and a dot along a ragged K zeroes the
padding of an operand that is not a fresh load (loads fill it with 0). A mask is left out where the
specialization proves that the block divides the bound.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from newtc import ast as A
from newtc.errors import NkError, Span
from newtc.types import DType

from .lang import literal

PREC = {"or": 1, "and": 2, "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "//": 10,
        "%": 10, "@": 10, **dict.fromkeys(["<", "<=", ">", ">=", "==", "!="], 4)}
ATOM = 12
IDENTITY = {"sum": "0", "max": "-inf", "min": "inf", "argmax": "-inf", "argmin": "inf"}


class Dim(NamedTuple):
    index: str  # the index vector: a tile's variable, or r0, r1, ... for whole dimensions
    block: str  # its block size, a constexpr
    bound: str | None  # lanes with index >= bound are padding; None where the specialization proves there are none
    var: str | None  # the tile variable (None: a whole dimension)
    size: int  # the block size


class E(NamedTuple):
    text: str
    dims: tuple = ()
    prec: int = ATOM


class TileVar(NamedTuple):
    dim: Dim
    begin: E
    bound: str


def par(e: E, prec: int) -> str:
    return e.text if e.prec >= prec else f"({e.text})"


def bc(j: int, rank: int) -> str:
    """The indexing that puts a 1-D index vector on axis j of a rank-`rank` block: `[:, None]`."""
    return "" if rank <= 1 else "[" + ", ".join(":" if k == j else "None" for k in range(rank)) + "]"


def mask(dims, rank: int) -> str | None:
    """The mask of the ragged ones of (axis, Dim) pairs."""
    terms = [f"{d.index}{bc(j, rank)} < {d.bound}" for j, d in dims if d is not None and d.bound]
    return terms[0] if len(terms) == 1 else " & ".join(f"({t})" for t in terms) or None


def broadcast(*dimss) -> tuple:
    rank = max(map(len, dimss), default=0)
    padded = [(None,) * (rank - len(d)) + tuple(d) for d in dimss]
    return tuple(next((d[k] for d in padded if d[k]), None) for k in range(rank))


def names_in(node) -> set:
    """Every name some AST mentions or binds."""
    if isinstance(node, A.Name):
        return {node.id}
    if isinstance(node, list):
        return set().union(*map(names_in, node))
    out = set().union(*(names_in(getattr(node, f)) for f in getattr(node, "__dataclass_fields__", ()) if f != "span"))
    return out | {node.name} if isinstance(node, A.Param) else out


def targets(s: A.For) -> list:
    return [t.id for t in (s.target.items if isinstance(s.target, A.TupleExpr) else [s.target])]


@dataclass
class Info:
    """What the search space is derived from."""
    tiles: dict = field(default_factory=dict)  # tile variable -> size facts of its bound (or None)
    dot: set = field(default_factory=set)  # tile variables that are dot dimensions
    values: set = field(default_factory=set)  # block shapes: tuples of tile variables and whole sizes
    loops: bool = False  # an in-kernel tile loop
    group: bool = False  # the grid's last two dimensions are tiles


@dataclass
class Lowered:
    text: str
    name: str  # the kernel's
    params: list  # (name, source): ("value", host name) | ("size" | "stride", tensor, dim)
    consts: dict  # constexpr name -> value
    grid: list  # (bound expression, block size; None for grid(n))
    persistent: bool
    file: str  # the generated file's name
    linemap: dict  # generated line -> Span in the tile program
    info: Info

    def args(self, env) -> list:
        return [env[s[1]] if s[0] == "value" else getattr(env[s[1]], s[0])(s[2]) for _, s in self.params]

    def grid_size(self, env, interp, programs: int) -> int:
        n = 1
        for bound, block in self.grid:
            size = int(interp.expr(bound, env))
            n *= -(-size // block) if block else size
        return min(n, programs) if self.persistent else n

    def remap(self, err: NkError) -> NkError:
        """An error in the generated kernel as an error at the tile program's line."""
        d = err.diagnostics[0]
        if d.span is None or d.span.file != self.file:
            return err
        here = self.text.splitlines()[d.span.line - 1].split("  # ")[0].strip()
        return NkError(d.message, self.linemap.get(d.span.line), "; ".join(filter(None, [d.hint, f"in the generated kernel: {here}"])))


class Lower:
    def __init__(self, fn: A.FuncDef, module: A.Module, facts: dict, bounds: dict, config: dict, name: str, taken: set):
        self.fn, self.module, self.facts, self.bounds, self.config = fn, module, facts, bounds, config
        self.name, self.taken, self.span = name, set(taken), fn.span
        self.lines, self.preamble, self.depth = [], [], 1  # (depth, text, span)
        self.params, self.consts, self.memo, self.env, self.rindex = {}, {}, {}, {}, {}
        self.info, self.called = Info(), set()

    def fresh(self, base: str, key=None) -> str:
        """A name no one uses, the same one for the same key."""
        if key in self.memo:
            return self.memo[key]
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}{n}"
        self.taken.add(name)
        if key is not None:
            self.memo[key] = name
        return name

    def param(self, base: str, source) -> str:
        name = self.fresh(base, source)
        self.params[name] = source
        return name

    def const(self, base: str, value, key) -> str:
        name = self.fresh(base, key)
        self.consts[name] = value
        return name

    def line(self, text: str) -> None:
        self.lines.append((self.depth, text, self.span))

    # ---- the grid ------------------------------------------------------------------------------
    def lower(self, loop: A.For) -> Lowered:
        self.span = loop.span
        dims, grid, counts = [], [], []  # (variable, bound, Dim or None for grid(n)); (bound node, block)
        for name, arg in zip(targets(loop), loop.iter.args):
            scalar = isinstance(arg, A.Call) and isinstance(arg.func, A.Name) and arg.func.id == "grid"
            bound = self.scalar(arg.args[0] if scalar else arg)
            dims.append((name, bound.text, None if scalar else self.tile(name, arg, bound)))
            grid.append((arg.args[0] if scalar else arg, None if scalar else dims[-1][2].size))
        self.info.group = len(dims) > 1 and None not in (dims[-1][2], dims[-2][2])
        group = self.config.get("group", 1) if self.info.group else 1
        persistent = bool(self.config.get("persistent"))
        for v, bound, d in dims:
            counts.append(bound if d is None else f"cdiv({bound}, {d.block})")
            if d is not None and (len(dims) > 1 or persistent):
                name = self.fresh(f"n_{v}")
                self.line(f"{name} = {counts[-1]}")
                counts[-1] = name
        pid = self.fresh("pid")
        if persistent:  # one program per SM walks the tiles
            self.line(f"for {pid} in range(program_id(0), {' * '.join(counts)}, num_programs(0)):")
            self.depth += 1
        else:
            self.line(f"{pid} = program_id(0)")
        pids = [pid] if len(dims) == 1 and dims[0][2] else [v if d is None else self.fresh(f"pid_{v}") for v, _, d in dims]
        flat, split = counts, pids
        if group > 1:  # the last two dimensions as one, then grouped
            inner = pid if len(dims) == 2 else self.fresh("inner")
            flat, split = counts[:-2] + [f"({counts[-2]} * {counts[-1]})"], pids[:-2] + [inner]
        for i, t in enumerate(split):  # row-major: the last dimension moves fastest
            later = flat[i + 1:]
            div = "" if not later else f" // {later[0]}" if len(later) == 1 else f" // ({' * '.join(later)})"
            if t != pid:
                self.line(f"{t} = {pid}{div}" + (f" % {flat[i]}" if i else ""))
        if group > 1:  # GROUP rows of tiles go column by column: the tiles they read stay in L2
            g, first, rows, rest = (self.fresh(n) for n in ("group", "first", "rows", "rest"))
            gc = self.const("GROUP", group, "GROUP")
            for text in (f"{g} = {gc} * {counts[-1]}", f"{first} = {inner} // {g} * {gc}",
                         f"{rows} = minimum({counts[-2]} - {first}, {gc})", f"{rest} = {inner} % {g}",
                         f"{pids[-2]} = {first} + {rest} % {rows}", f"{pids[-1]} = {rest} // {rows}"):
                self.line(text)
        for (v, bound, d), p in zip(dims, pids):
            if d is None:
                self.env[v] = E(v)
                continue
            begin = E(f"{p} * {d.block}", (), PREC["*"])
            self.line(f"{v} = {begin.text} + arange(0, {d.block})")
            self.env[v] = TileVar(d, begin, bound)
        self.block(loop.body)
        return self.finish(grid, persistent)

    def tile(self, name: str, node, bound: E) -> Dim:
        size, fact = self.config.get(f"block_{name}", 1), self.bounds.get(id(node))
        self.info.tiles[name] = fact
        even = fact is not None and fact[1] % size == 0
        return Dim(name, self.const(f"BLOCK_{name.upper()}", size, ("block", name)), None if even else bound.text, name, size)

    def whole(self, bound: str, np2: int, pow2: int) -> Dim:
        """A whole dimension of `bound` elements in a block of its next power of two; one index vector per size."""
        if np2 not in self.rindex:
            index = self.fresh(f"r{len(self.rindex)}")
            self.rindex[np2] = index, self.const(index.upper(), np2, ("R", np2))
            self.preamble.append((1, f"{index} = arange(0, {self.rindex[np2][1]})", self.span))
        return Dim(*self.rindex[np2], None if pow2 == np2 else bound, None, np2)

    def finish(self, grid, persistent) -> Lowered:
        src, file = self.module.source.splitlines(), self.module.file
        short = Path(file).name
        order = sorted(self.params, key=lambda n: not (self.params[n][0] == "value" and self.facts[self.params[n][1]][0] == "T"))
        header = ", ".join(order + [f"{n}: constexpr" for n in self.consts])
        out = [f"# deuteron: tile {self.fn.name} ({short}:{self.fn.span.line}), config {json.dumps(self.config, default=str)}"]
        linemap = {}
        defs = {d.name: d for d in self.module.defs if d.kind == "def"}
        used = self.called & set(defs)
        while more := {m for n in used for m in names_in(defs[n].body) if m in defs} - used:  # helpers' helpers
            used |= more
        for d in (d for d in defs.values() if d.name in used):  # as written
            for k in range(d.span.line, d.span.end_line + 1):
                out.append(src[k - 1])
                linemap[len(out)] = Span(file, k, 1)
            out.append("")
        out.append(f"kernel {self.name}({header}):")
        linemap[len(out)] = self.span
        for depth, text, span in self.preamble + self.lines:
            out.append(f"{'    ' * depth}{text}  # {short}:{span.line}")
            linemap[len(out)] = span
        return Lowered("\n".join(out) + "\n", self.name, [(n, self.params[n]) for n in order], self.consts, grid,
                       persistent, f"{file}~{self.name}.nk", linemap, self.info)

    # ---- statements ----------------------------------------------------------------------------
    def block(self, stmts):
        for s in stmts:
            self.span = s.span
            getattr(self, "s_" + type(s).__name__)(s)

    def nested(self, body, depth=1):
        self.depth += depth
        self.block(body)
        self.depth -= depth

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
            if not isinstance(t, A.Name):
                raise NkError("assign to names, or to a tensor's tile such as out[tm, tn]", t.span)
            self.env[t.id] = E(t.id, e.dims)
        self.line(f"{', '.join(t.id for t in s.targets)} = {e.text}")

    def s_AugAssign(self, s):
        if not isinstance(s.target, A.Name):
            raise NkError("only names take augmented assignment in a tile loop", s.span)
        acc, v = self.expr(s.target), s.value
        if s.op == "+" and isinstance(v, A.BinOp) and v.op == "@":  # accumulate in the dot itself
            return self.line(f"{acc.text} = {self.dot(v.left, v.right, acc, v.span).text}")
        self.line(f"{acc.text} {s.op}= {self.expr(v).text}")

    def s_If(self, s):
        self.line(f"if {self.expr(s.cond).text}:")
        self.nested(s.body)
        if s.orelse:
            self.line("else:")
            self.nested(s.orelse)

    def s_For(self, s):
        kind, names = s.iter.func.id if isinstance(s.iter, A.Call) and isinstance(s.iter.func, A.Name) else None, targets(s)
        if kind in ("range", "static_range") and len(names) == 1:
            self.line(f"for {names[0]} in {kind}({', '.join(self.scalar(a).text for a in s.iter.args)}):")
            self.env[names[0]] = E(names[0])
            return self.nested(s.body)
        if kind != "tiles" or len(names) != len(s.iter.args):
            raise NkError("a loop here goes over tiles(...) with a name per dimension, or range(...)", s.iter.span)
        self.info.loops = True
        for name, arg in zip(names, s.iter.args):  # one in-kernel loop per dimension
            bound = self.scalar(arg)
            dim, begin = self.tile(name, arg, bound), self.fresh(f"{name}_begin")
            self.line(f"for {begin} in range(0, {bound.text}, {dim.block}):")
            self.depth += 1
            self.line(f"{name} = {begin} + arange(0, {dim.block})")
            self.env[name] = TileVar(dim, E(begin), bound.text)
        self.nested(s.body, 0)
        self.depth -= len(names)

    # ---- expressions ---------------------------------------------------------------------------
    def expr(self, e) -> E:
        out = getattr(self, "e_" + type(e).__name__)(e)
        if out.dims:
            self.info.values.add(tuple(d.var or d.size for d in out.dims if d))
        return out

    def scalar(self, e) -> E:
        out = self.expr(e)
        if out.dims:
            raise NkError("expected a scalar here, not a tile", e.span)
        return out

    def e_Num(self, e):
        return E(repr(e.value))

    e_Const = e_Str = e_Num

    def e_ListExpr(self, e):
        items = ", ".join(self.expr(x).text for x in e.items)
        return E(f"[{items}]" if isinstance(e, A.ListExpr) else f"({items}{',' if len(e.items) == 1 else ''})")

    e_TupleExpr = e_ListExpr

    def e_Name(self, e):
        v = self.env.get(e.id)
        if v is not None:
            return E(e.id, (v.dim,)) if isinstance(v, TileVar) else v
        fact = self.facts.get(e.id, ("",))
        if fact[0] == "C":  # a host bool, string, dtype or None: a literal
            return E(fact[1].name if isinstance(fact[1], DType) else repr(fact[1]))
        if fact[0] == "K":
            self.consts[e.id] = fact[1]
        elif fact[0]:
            self.params[e.id] = ("value", e.id)
        return E(e.id)  # a parameter, or a builtin, helper or constant such as f32 or inf

    def host_tensor(self, e) -> str | None:
        ok = isinstance(e, A.Name) and e.id not in self.env and self.facts.get(e.id, ("",))[0] == "T"
        return e.id if ok else None

    def size(self, e) -> str | None:
        """`x.shape[d]` of a host tensor, as a kernel parameter."""
        if isinstance(e, A.Subscript) and isinstance(e.value, A.Attribute) and e.value.attr == "shape" \
                and self.host_tensor(e.value.value):
            t, d = e.value.value.id, literal(e.index[0])
            return self.param(f"{t}_size{d}", ("size", t, d))
        return None

    def e_Attribute(self, e):
        v = self.env.get(e.value.id) if isinstance(e.value, A.Name) else None
        if isinstance(v, TileVar) and e.attr in ("begin", "end", "size", "index"):
            end = f"minimum({v.begin.text} + {v.dim.block}, {v.bound})"
            return {"begin": v.begin, "end": E(end), "index": E(v.dim.index, (v.dim,)),
                    "size": E(f"{end} - {par(v.begin, PREC['-'] + 1)}", (), PREC["-"])}[e.attr]
        if self.host_tensor(e.value) and e.attr == "dtype":
            return E(self.facts[e.value.id][1])
        base = self.expr(e.value)
        return E(f"{par(base, ATOM)}.{e.attr}", base.dims if e.attr == "to" else ())

    def e_Subscript(self, e):
        if (size := self.size(e)) is not None:
            return E(size)
        if self.host_tensor(e.value):
            ptr, m, dims = self.place(e)
            return E(f"load({ptr}{f', mask={m}, other=0' if m else ''})", dims)
        v, dims, items = self.expr(e.value), [], []
        axes = iter(v.dims)
        for item in e.index:  # a computed tile takes `:` and None
            full = isinstance(item, A.Slice) and item.lower is item.upper is item.step is None
            if not (full or isinstance(item, A.Const) and item.value is None):
                raise NkError("a computed tile takes only `:` and `None` as indices", item.span)
            dims.append(next(axes, None) if full else None)
            items.append(":" if full else "None")
        return E(f"{par(v, ATOM)}[{', '.join(items)}]", tuple(dims))

    def place(self, e: A.Subscript):
        """The pointers, mask and dims of `x[tm, :, i, None]` for a host tensor x."""
        t = self.host_tensor(e.value)
        if t is None:
            raise NkError("tiles index the host code's tensors", e.value.span)
        shape, out, terms = self.facts[t][2], [], []  # terms: (tensor dim, axis in out or a scalar E)
        for item in e.index:
            if isinstance(item, A.Const) and item.value is None:
                out.append(None)
                continue
            d, v = len(terms), self.env.get(item.id) if isinstance(item, A.Name) else None
            if d == len(shape):
                raise NkError(f"too many indices for a tensor of rank {len(shape)}", e.span)
            if isinstance(item, A.Slice):
                if not item.lower is item.upper is item.step is None:
                    raise NkError("a tensor takes `:` (a whole dimension), not a range", item.span)
                out.append(self.whole(self.param(f"{t}_size{d}", ("size", t, d)), *shape[d][:2]))
            elif isinstance(v, TileVar):
                out.append(v.dim)
            else:
                terms.append((d, self.scalar(item)))
                continue
            terms.append((d, len(out) - 1))
        if len(terms) != len(shape):
            raise NkError(f"{len(terms)} indices for a tensor of rank {len(shape)}", e.span)
        parts = []
        for d, x in terms:
            idx = E(out[x].index + bc(x, len(out))) if isinstance(x, int) else x
            unit = shape[d][2]  # a unit stride is known, so the offsets are seen to be contiguous
            parts.append(par(idx, 10) if unit else f"{par(idx, 10)} * {self.param(f'{t}_stride{d}', ('stride', t, d))}")
        self.params[t] = ("value", t)
        return " + ".join([t] + parts), mask(enumerate(out), len(out)), tuple(out)

    def e_UnaryOp(self, e):
        v = self.expr(e.operand)
        if e.op == "not":
            return E(f"not {par(v, 3)}", v.dims, 3)
        return E(f"{e.op}{par(v, 11)}", v.dims, 11)

    def e_BinOp(self, e):
        if e.op == "@":
            return self.dot(e.left, e.right, None, e.span)
        a, b, p = self.expr(e.left), self.expr(e.right), PREC[e.op]
        return E(f"{par(a, p + (p == 4))} {e.op} {par(b, p + 1)}", broadcast(a.dims, b.dims), p)  # no chained <

    def dot(self, an, bn, acc: E | None, span) -> E:
        a, b = self.expr(an), self.expr(bn)
        if len(a.dims) != 2 or len(b.dims) != 2:
            raise NkError("`@` multiplies two 2-D tiles", span)
        texts = []
        for node, v, k, j in ((an, a, a.dims[1], 1), (bn, b, b.dims[0], 0)):
            m = None if self.zero_padded(node) else mask([(j, k)], 2)
            texts.append(f"where({m}, {v.text}, 0)" if m else v.text)
        self.info.dot |= {d.var for d in (a.dims[0], a.dims[1], b.dims[1]) if d and d.var}
        return E(f"dot({', '.join(texts + ([acc.text] if acc else []))})", (a.dims[0], b.dims[1]))

    def zero_padded(self, e) -> bool:
        """A fresh load, possibly converted: its padding holds 0."""
        if isinstance(e, A.Call) and isinstance(e.func, A.Attribute) and e.func.attr == "to":
            return self.zero_padded(e.func.value)
        return isinstance(e, A.Subscript) and self.host_tensor(e.value) is not None

    def e_Call(self, e):
        f = e.func.id if isinstance(e.func, A.Name) else None
        kw = dict(e.kwargs)
        if f in IDENTITY:
            return self.reduce(f, e, kw)
        if f in ("zeros", "full"):
            return self.alloc(f, e)
        if f == "dot":
            acc = e.args[2] if len(e.args) > 2 else kw.get("acc")
            return self.dot(e.args[0], e.args[1], self.expr(acc) if acc else None, e.span)
        if f and f.startswith("atomic_") and e.args and isinstance(e.args[0], A.Subscript):
            ptr, m, _ = self.place(e.args[0])
            return E(f"{f}({', '.join([ptr] + [self.expr(a).text for a in e.args[1:]])}{f', mask={m}' if m else ''})")
        if f in ("reshape", "broadcast_to", "tiles"):
            raise NkError(f"{f}() is not supported in a tile loop", e.span)
        func, args = self.expr(e.func), [self.expr(a) for a in e.args]
        self.called.add(f)
        dims = broadcast(*(a.dims for a in args))
        if f == "trans":
            dims = tuple(args[0].dims[int(a.text)] for a in args[1:]) or tuple(reversed(args[0].dims))
        text = ", ".join([a.text for a in args] + [f"{k}={self.expr(v).text}" for k, v in e.kwargs])
        return E(f"{func.text}({text})", func.dims if isinstance(e.func, A.Attribute) else dims)

    def reduce(self, f, e, kw):
        x = self.expr(e.args[0])
        axis = literal(e.args[1] if len(e.args) > 1 else kw["axis"]) if len(e.args) > 1 or "axis" in kw else None
        keep = "keep_dims" in kw and bool(literal(kw["keep_dims"]))
        axes = range(len(x.dims)) if axis is None else [axis % len(x.dims)]
        m = mask([(a, x.dims[a]) for a in axes], len(x.dims))
        args = [f"where({m}, {x.text}, {IDENTITY[f]})" if m else x.text]
        args += ([f"axis={axis}"] if axis is not None else []) + (["keep_dims=True"] if keep else [])
        return E(f"{f}({', '.join(args)})", tuple(None if a in axes else d for a, d in enumerate(x.dims) if keep or a not in axes))

    def alloc(self, f, e):
        shape, dims = e.args[0], []
        for item in shape.items if isinstance(shape, (A.ListExpr, A.TupleExpr)) else [shape]:
            v = self.env.get(item.id) if isinstance(item, A.Name) else None
            if isinstance(v, TileVar):
                dims.append(v.dim)
            elif isinstance(item, A.Num):
                dims.append(Dim("", str(item.value), None, None, item.value))
            elif (size := self.size(item)) is not None:  # x.shape[d]: a whole dimension
                dims.append(self.whole(size, *self.facts[item.value.value.id][2][literal(item.index[0])][:2]))
            elif isinstance(item, A.Name) and self.facts.get(item.id, ("",))[0] == "I":
                self.params[item.id] = ("value", item.id)
                dims.append(self.whole(item.id, *self.facts[item.id][1]))
            else:
                raise NkError("a tile shape lists tiles, tensor sizes (x.shape[i]) and host ints", item.span)
        rest = [self.expr(a).text for a in e.args[1:]] + [f"{k}={self.expr(v).text}" for k, v in e.kwargs]
        return E(f"{f}([{', '.join(d.block for d in dims)}]{''.join(', ' + r for r in rest)})", tuple(dims))
