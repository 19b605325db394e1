"""Lowering: one launch grid of a tile program + a config + what the call's arguments prove -> a newt kernel.

The lowering reads the grid loop the way newt's checker reads a kernel: each expression becomes its text
and its *dims*, one per axis: a `Dim` (a tile, or a whole dimension taken with `:`) or None (size 1). The
dims say where masks go. Loads and stores are masked by their tiles' bounds; a reduction along a ragged
dim first puts the reduction's identity in the padding; a dot along a ragged K zeroes the padding of an
operand that is not a fresh load (loads fill it with 0). A mask is dropped where the specialization
proves that the block divides the bound. Host values become kernel parameters, tile sizes constexprs.
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

PREC = {"or": 1, "and": 2, "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9,
        "*": 10, "/": 10, "//": 10, "%": 10, "@": 10, **dict.fromkeys(["<", "<=", ">", ">=", "==", "!="], 4)}
UNARY, ATOM = 11, 12
IDENTITY = {"sum": "0", "max": "-inf", "min": "inf", "argmax": "-inf", "argmin": "inf"}
REDUCTIONS = set(IDENTITY)


class Dim(NamedTuple):
    index: str  # the index vector: `tm` (a tile) or `r0` (a whole dimension)
    block: str  # its block size, a constexpr
    bound: str | None  # lanes with index >= bound are padding; None when none can be
    var: str | None  # the tile variable; None for a whole dimension
    size: int  # the block size's value


class E(NamedTuple):
    text: str
    dims: tuple = ()
    prec: int = ATOM


class TileVar(NamedTuple):
    dim: Dim
    begin: E  # the first index
    bound: str


def par(e: E, prec: int) -> str:
    return e.text if e.prec >= prec else f"({e.text})"


def bc(j: int, rank: int) -> str:
    """`[:, None]`-style indexing that puts a 1-D index vector on axis j of a rank-`rank` block."""
    return "" if rank <= 1 else "[" + ", ".join(":" if k == j else "None" for k in range(rank)) + "]"


def mask(dims, rank: int) -> str | None:
    """The mask of the ragged ones among dims, a list of (axis, Dim)."""
    terms = [f"{d.index}{bc(j, rank)} < {d.bound}" for j, d in dims if d is not None and d.bound]
    return terms[0] if len(terms) == 1 else " & ".join(f"({t})" for t in terms) or None


def broadcast(*dimss) -> tuple:
    rank = max((len(d) for d in dimss), default=0)
    return tuple(next((d[k - rank + len(d)] for d in dimss if k - rank + len(d) >= 0 and d[k - rank + len(d)]), None)
                 for k in range(rank))


def names_in(node, out=None) -> set:
    """Every name a piece of AST mentions (for fresh names, and for the facts a lowering depends on)."""
    out = set() if out is None else out
    if isinstance(node, A.Name):
        out.add(node.id)
    elif isinstance(node, list):
        for x in node:
            names_in(x, out)
    elif hasattr(node, "__dataclass_fields__"):
        for f in node.__dataclass_fields__:
            if f != "span":
                names_in(getattr(node, f), out)
    if isinstance(node, A.Param):
        out.add(node.name)
    return out


@dataclass
class Info:
    """What the search space is derived from: tiles, their bounds, dot operands, block shapes, loops."""
    tiles: dict = field(default_factory=dict)  # tile variable -> (next power of two, power-of-two factor) of its bound
    dot: set = field(default_factory=set)  # tile variables that are dot dimensions
    values: set = field(default_factory=set)  # block shapes: tuples of tile variables and whole sizes
    loops: bool = False  # an in-kernel tile loop (num_stages and persistence matter)
    group: bool = False  # the grid's last two dimensions are tiles (program-id grouping reuses L2)


@dataclass
class Lowered:
    text: str
    name: str  # the kernel's name
    params: list  # (name, source): ("value", host name) | ("size", tensor, dim) | ("stride", tensor, dim)
    consts: dict  # constexpr name -> value
    grid: list  # (bound expression, block size or None for grid(n))
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
        """An error in the generated kernel, at the tile program's line (the generated line in the hint)."""
        lines = self.text.splitlines()
        diags = []
        for d in err.diagnostics:
            if d.span is None or d.span.file != self.file:
                diags.append(d)
                continue
            here = lines[d.span.line - 1].split("  # ")[0].strip() if 0 < d.span.line <= len(lines) else ""
            hint = "; ".join(filter(None, [d.hint, f"in the generated kernel: {here}" if here else ""]))
            diags.append(type(d)(self.linemap.get(d.span.line), d.message, hint))
        new = NkError(diags[0].message, diags[0].span, diags[0].hint)
        new.diagnostics = diags
        new.args = (new.render(color=False),)
        return new


class Lower:
    def __init__(self, fn: A.FuncDef, module: A.Module, facts: dict, bounds: dict, config: dict, name: str, taken: set):
        self.fn, self.module, self.facts, self.bounds, self.config = fn, module, facts, bounds, config
        self.name, self.taken = name, set(taken)
        self.lines: list = []  # (depth, text, span)
        self.preamble: list = []
        self.depth, self.span = 1, fn.span
        self.params: dict = {}  # kernel parameter -> source
        self.consts: dict = {}  # constexpr -> value
        self.memo: dict = {}  # source or constexpr key -> generated name
        self.env: dict = {}  # device names -> E or TileVar
        self.rindex: dict = {}  # block size -> index vector and constexpr of whole dimensions
        self.info = Info()
        self.called: set = set()  # names called: the helpers to copy

    def fresh(self, base: str, key=None) -> str:
        if key is not None and key in self.memo:
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

    def line(self, text: str, span: Span | None = None) -> None:
        self.lines.append((self.depth, text, span or self.span))

    # ---- the grid ------------------------------------------------------------------------------
    def lower(self, loop: A.For) -> Lowered:
        self.span = loop.span
        names = [t.id for t in (loop.target.items if isinstance(loop.target, A.TupleExpr) else [loop.target])]
        if len(names) != len(loop.iter.args):
            raise NkError(f"{len(names)} names for {len(loop.iter.args)} tile dimensions", loop.span)
        dims, grid = [], []  # (variable, bound, Dim or None for grid(n)); (bound expression, block size)
        for name, arg in zip(names, loop.iter.args):
            scalar = isinstance(arg, A.Call) and isinstance(arg.func, A.Name) and arg.func.id == "grid"
            node = arg.args[0] if scalar else arg
            bound = self.scalar(node)
            dim = None if scalar else self.tile(name, arg, bound)
            dims.append((name, bound.text, dim))
            grid.append((node, None if scalar else dim.size))
        self.info.group = len(dims) > 1 and None not in (dims[-1][2], dims[-2][2])
        group = self.config.get("group", 1) if self.info.group else 1
        persistent = bool(self.config.get("persistent", False))
        counts = []
        for v, bound, d in dims:
            counts.append(bound if d is None else f"cdiv({bound}, {d.block})")
            if d is not None and (len(dims) > 1 or persistent):
                counts[-1] = self.fresh(f"n_{v}")
                self.line(f"{counts[-1]} = cdiv({bound}, {d.block})")
        pid = self.fresh("pid")
        if persistent:  # one program per SM walks the tiles
            self.line(f"for {pid} in range(program_id(0), {' * '.join(counts)}, num_programs(0)):")
            self.depth += 1
        else:
            self.line(f"{pid} = program_id(0)")
        pids = [v if d is None else self.fresh(f"pid_{v}") for v, _, d in dims]
        flat, targets = counts, pids
        if group > 1:
            flat, targets = counts[:-2] + [f"({counts[-2]} * {counts[-1]})"], pids[:-2] + [self.fresh("in_group")]
        if len(targets) == 1 and dims[0][2] is not None or group > 1 and len(targets) == 1:
            targets[0] = pid
        for i, t in enumerate(targets):  # row-major: the last dimension moves fastest
            later = flat[i + 1:]
            text = pid if not later else f"{pid} // {later[0]}" if len(later) == 1 else f"{pid} // ({' * '.join(later)})"
            if t != pid:
                self.line(f"{t} = {text}" + (f" % {flat[i]}" if i else ""))
        if group > 1:  # GROUP rows of tiles are walked column by column, so their inputs stay in L2
            g, first, rows, rest = (self.fresh(n) for n in ("group", "first", "rows", "rest"))
            gc = self.const("GROUP", group, "GROUP")
            self.line(f"{g} = {gc} * {counts[-1]}")
            self.line(f"{first} = {targets[-1]} // {g} * {gc}")
            self.line(f"{rows} = minimum({counts[-2]} - {first}, {gc})")
            self.line(f"{rest} = {targets[-1]} % {g}")
            self.line(f"{pids[-2]} = {first} + {rest} % {rows}")
            self.line(f"{pids[-1]} = {rest} // {rows}")
        elif len(targets) == 1 and dims[0][2] is not None:
            pids = [pid]
        for (v, bound, d), p in zip(dims, pids):
            if d is None:
                self.env[v] = E(v)
            else:
                begin = E(f"{p} * {d.block}", (), PREC["*"])
                self.line(f"{v} = {begin.text} + arange(0, {d.block})")
                self.env[v] = TileVar(d, begin, bound)
        self.block(loop.body)
        return self.finish(grid, persistent)

    def tile(self, name: str, node, bound: E) -> Dim:
        size = self.config.get(f"block_{name}", 1)
        fact = self.bounds.get(id(node))
        self.info.tiles[name] = fact
        block = self.const(f"BLOCK_{name.upper()}", size, ("block", name))
        even = fact is not None and fact[1] % size == 0
        return Dim(name, block, None if even else bound.text, name, size)

    def whole(self, bound: str, np2: int, pow2: int) -> Dim:
        """A whole dimension of `bound` elements, in a block of its next power of two (one index per size)."""
        if np2 not in self.rindex:
            index = self.fresh(f"r{len(self.rindex)}")
            block = self.const(index.upper(), np2, ("R", np2))
            self.preamble.append((1, f"{index} = arange(0, {block})", self.span))
            self.rindex[np2] = index, block
        index, block = self.rindex[np2]
        return Dim(index, block, None if pow2 == np2 else bound, None, np2)

    def finish(self, grid, persistent) -> Lowered:
        src = self.module.source.splitlines()
        tile_file = self.module.file
        short = Path(tile_file).name
        tensors = [n for n, s in self.params.items() if s[0] == "value" and self.facts[s[1]][0] == "T"]
        params = tensors + [n for n in self.params if n not in tensors] + [f"{n}: constexpr" for n in self.consts]
        out, linemap = [f"# deuteron: tile {self.fn.name} ({short}:{self.fn.span.line}), config {json.dumps(self.config, default=str)}"], {}
        for d in self.helpers():  # as written
            for k in range(d.span.line, d.span.end_line + 1):
                out.append(src[k - 1])
                linemap[len(out)] = Span(tile_file, k, 1)
            out.append("")
        out.append(f"kernel {self.name}({', '.join(params)}):")
        linemap[len(out)] = self.span
        for depth, text, span in self.preamble + self.lines:
            out.append(f"{'    ' * depth}{text}  # {short}:{span.line}")
            linemap[len(out)] = span
        order = tensors + [n for n in self.params if n not in tensors]
        return Lowered("\n".join(out) + "\n", self.name, [(n, self.params[n]) for n in order], self.consts, grid, persistent,
                       f"{tile_file}~{self.name}.nk", linemap, self.info)

    def helpers(self) -> list:
        """The helpers the kernel calls, directly or through each other, in file order."""
        defs = {d.name: d for d in self.module.defs if d.kind == "def"}
        used, todo = set(), [n for n in self.called if n in defs]
        while todo:
            n = todo.pop()
            if n not in used:
                used.add(n)
                todo += [m for m in names_in(defs[n].body) if m in defs]
        return [d for d in defs.values() if d.name in used]

    # ---- statements ----------------------------------------------------------------------------
    def block(self, stmts):
        for s in stmts:
            self.span = s.span
            getattr(self, "s_" + type(s).__name__)(s)

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
                raise NkError("assign to names or to tensor tiles such as out[tm, tn]", t.span)
            self.env[t.id] = E(t.id, e.dims)
        self.line(f"{', '.join(t.id for t in s.targets)} = {e.text}")

    def s_AugAssign(self, s):
        v = s.value
        if isinstance(s.target, A.Subscript):  # read, modify, write
            ptr, m, dims = self.place(s.target)
            old = E(f"load({ptr}{f', mask={m}, other=0' if m else ''})", dims)
            new = self.binop(s.op, old, self.expr(v))
            return self.line(f"store({ptr}, {new.text}{f', mask={m}' if m else ''})")
        acc = self.expr(s.target)
        if s.op == "+" and isinstance(v, A.BinOp) and v.op == "@":  # accumulate in the dot itself
            return self.line(f"{acc.text} = {self.dot(v.left, v.right, acc, v.span).text}")
        self.line(f"{acc.text} {s.op}= {self.expr(v).text}")

    def s_If(self, s):
        self.line(f"if {self.expr(s.cond).text}:")
        self.nested(s.body)
        if s.orelse:
            self.line("else:")
            self.nested(s.orelse)

    def nested(self, body, depth=1):
        self.depth += depth
        self.block(body)
        self.depth -= depth

    def s_For(self, s):
        kind = s.iter.func.id if isinstance(s.iter, A.Call) and isinstance(s.iter.func, A.Name) else None
        names = [t.id for t in (s.target.items if isinstance(s.target, A.TupleExpr) else [s.target])]
        if kind in ("range", "static_range") and len(names) == 1:
            self.line(f"for {names[0]} in {kind}({', '.join(self.scalar(a).text for a in s.iter.args)}):")
            self.env[names[0]] = E(names[0])
            return self.nested(s.body)
        if kind != "tiles" or len(names) != len(s.iter.args):
            raise NkError("a loop in a tile program iterates over tiles(...), range(...) or static_range(...)", s.iter.span)
        self.info.loops = True
        for name, arg in zip(names, s.iter.args):  # one in-kernel loop per dimension
            bound = self.scalar(arg)
            dim = self.tile(name, arg, bound)
            begin = self.fresh(f"{name}_begin")
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

    def e_TupleExpr(self, e):
        return E(f"({', '.join(self.expr(x).text for x in e.items)}{',' if len(e.items) == 1 else ''})")

    def e_ListExpr(self, e):
        return E(f"[{', '.join(self.expr(x).text for x in e.items)}]")

    def e_Name(self, e):
        v = self.env.get(e.id)
        if isinstance(v, TileVar):
            return E(e.id, (v.dim,))
        if v is not None:
            return v
        if e.id not in self.facts:
            return E(e.id)  # a builtin, a helper or a constant such as f32 or inf
        kind, value = self.facts[e.id][0], self.facts[e.id][-1]
        if kind in ("T", "I", "F"):
            self.params[e.id] = ("value", e.id)
            return E(e.id)
        if kind == "K":
            self.consts[e.id] = value
            return E(e.id)
        return E(value.name if isinstance(value, DType) else repr(value))

    def host_tensor(self, e) -> str | None:
        if isinstance(e, A.Name) and e.id not in self.env and self.facts.get(e.id, ("",))[0] == "T":
            return e.id
        return None

    def e_Attribute(self, e):
        v = self.env.get(e.value.id) if isinstance(e.value, A.Name) else None
        if isinstance(v, TileVar) and e.attr in ("begin", "end", "size", "index"):
            end = f"minimum({v.begin.text} + {v.dim.block}, {v.bound})"
            return {"begin": v.begin, "end": E(end), "index": E(v.dim.index, (v.dim,)),
                    "size": E(f"{end} - {par(v.begin, PREC['-'] + 1)}", (), PREC["-"])}[e.attr]
        t = self.host_tensor(e.value)
        if t and e.attr == "dtype":
            return E(self.facts[t][1])
        base = self.expr(e.value)
        return E(f"{par(base, ATOM)}.{e.attr}", base.dims if e.attr == "to" else ())

    def e_Subscript(self, e):
        if isinstance(e.value, A.Attribute) and e.value.attr == "shape" and self.host_tensor(e.value.value):
            t, d = e.value.value.id, literal(e.index[0])
            return E(self.param(f"{t}_size{d}", ("size", t, d)))
        if self.host_tensor(e.value):
            ptr, m, dims = self.place(e)
            return E(f"load({ptr}{f', mask={m}, other=0' if m else ''})", dims)
        v, dims, items, k = self.expr(e.value), [], [], 0
        for item in e.index:  # a device value takes `:` and None
            if isinstance(item, A.Const) and item.value is None:
                dims.append(None)
                items.append("None")
            elif isinstance(item, A.Slice) and item.lower is item.upper is item.step is None and k < len(v.dims):
                dims.append(v.dims[k])
                items.append(":")
                k += 1
            else:
                raise NkError("a computed tile takes only `:` and `None` as indices", item.span)
        return E(f"{par(v, ATOM)}[{', '.join(items)}]", tuple(dims))

    def place(self, e: A.Subscript):
        """The pointer block, mask and dims of `x[tm, :, i]` for a host tensor x."""
        t = self.host_tensor(e.value)
        if t is None:
            raise NkError("only tensors of the host code are indexed by tiles", e.value.span)
        shape = self.facts[t][2]
        out, terms = [], []  # result dims; (tensor dim, position in out or a scalar E)
        for item in e.index:
            if isinstance(item, A.Const) and item.value is None:
                out.append(None)
                continue
            d = len(terms)
            if d == len(shape):
                raise NkError(f"too many indices for a tensor of rank {len(shape)}", e.span)
            v = self.env.get(item.id) if isinstance(item, A.Name) else None
            if isinstance(item, A.Slice):
                if not item.lower is item.upper is item.step is None:
                    raise NkError("a tensor takes `:` (a whole dimension), not a range", item.span)
                np2, pow2, _ = shape[d]
                dim = self.whole(self.param(f"{t}_size{d}", ("size", t, d)), np2, pow2)
            elif isinstance(v, TileVar):
                dim = v.dim
            else:
                terms.append((d, self.scalar(item)))
                continue
            terms.append((d, len(out)))
            out.append(dim)
        if len(terms) != len(shape):
            raise NkError(f"{len(terms)} indices for a tensor of rank {len(shape)}", e.span)
        parts = []
        for d, x in terms:
            idx = E(out[x].index + bc(x, len(out))) if isinstance(x, int) else x
            if shape[d][2]:  # unit stride
                parts.append(par(idx, PREC["+"] + 1))
            else:
                parts.append(f"{par(idx, PREC['*'])} * {self.param(f'{t}_stride{d}', ('stride', t, d))}")
        self.params[t] = ("value", t)
        return " + ".join([t] + parts), mask(enumerate(out), len(out)), tuple(out)

    def e_UnaryOp(self, e):
        v = self.expr(e.operand)
        if e.op == "not":
            return E(f"not {par(v, 3)}", v.dims, 3)
        return E(f"{e.op}{par(v, UNARY)}", v.dims, UNARY)

    def e_BinOp(self, e):
        if e.op == "@":
            return self.dot(e.left, e.right, None, e.span)
        return self.binop(e.op, self.expr(e.left), self.expr(e.right))

    def binop(self, op, a: E, b: E) -> E:
        p = PREC[op]
        left = p + 1 if p == 4 else p  # comparisons do not chain
        return E(f"{par(a, left)} {op} {par(b, p + 1)}", broadcast(a.dims, b.dims), p)

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
        """A fresh load (also converted): its padding lanes hold 0."""
        if isinstance(e, A.Call) and isinstance(e.func, A.Attribute) and e.func.attr == "to":
            return self.zero_padded(e.func.value)
        return isinstance(e, A.Subscript) and self.host_tensor(e.value) is not None

    def e_Call(self, e):
        f = e.func.id if isinstance(e.func, A.Name) else None
        if f in REDUCTIONS:
            return self.reduce(f, e)
        if f in ("zeros", "full"):
            return self.alloc(f, e)
        if f == "dot":
            acc = self.expr(e.args[2] if len(e.args) > 2 else dict(e.kwargs)["acc"]) if len(e.args) > 2 or e.kwargs else None
            return self.dot(e.args[0], e.args[1], acc, e.span)
        if f and f.startswith("atomic_") and e.args and isinstance(e.args[0], A.Subscript):
            ptr, m, _ = self.place(e.args[0])
            rest = [self.expr(a).text for a in e.args[1:]]
            return E(f"{f}({', '.join([ptr, *rest])}{f', mask={m}' if m else ''})")
        if f in ("reshape", "broadcast_to", "tiles"):
            raise NkError(f"{f}() is not supported in a tile loop", e.span)
        func = self.expr(e.func)
        self.called.add(f)
        args = [self.expr(a) for a in e.args]
        kwargs = [(k, self.expr(v)) for k, v in e.kwargs]
        dims = broadcast(*(a.dims for a in args)) if f != "trans" else tuple(reversed(args[0].dims))
        if f == "trans" and len(args) > 1:
            dims = tuple(args[0].dims[int(a.text)] for a in args[1:])
        if isinstance(e.func, A.Attribute) and e.func.attr == "to":
            dims = func.dims
        text = ", ".join([a.text for a in args] + [f"{k}={v.text}" for k, v in kwargs])
        return E(f"{func.text}({text})", dims)

    def reduce(self, f, e):
        x = self.expr(e.args[0])
        kw = dict(e.kwargs)
        axis = literal(e.args[1] if len(e.args) > 1 else kw["axis"]) if len(e.args) > 1 or "axis" in kw else None
        keep = bool(literal(kw["keep_dims"])) if "keep_dims" in kw else False
        rank = len(x.dims)
        axes = list(range(rank)) if axis is None else [axis % rank]
        m = mask([(a, x.dims[a]) for a in axes], rank)
        text = f"where({m}, {x.text}, {IDENTITY[f]})" if m else x.text
        args = [text] + ([f"axis={axis}"] if axis is not None else []) + (["keep_dims=True"] if keep else [])
        dims = tuple(None if a in axes else d for a, d in enumerate(x.dims) if keep or a not in axes)
        return E(f"{f}({', '.join(args)})", dims)

    def alloc(self, f, e):
        shape = e.args[0]
        items = shape.items if isinstance(shape, (A.ListExpr, A.TupleExpr)) else [shape]
        dims = []
        for item in items:
            v = self.env.get(item.id) if isinstance(item, A.Name) else None
            t = self.host_tensor(item.value.value) if isinstance(item, A.Subscript) and \
                isinstance(item.value, A.Attribute) and item.value.attr == "shape" else None
            if isinstance(v, TileVar):
                dims.append(v.dim)
            elif isinstance(item, A.Num):
                dims.append(Dim("", str(item.value), None, None, item.value))
            elif t is not None:  # x.shape[d]: a whole dimension
                d = literal(item.index[0])
                np2, pow2, _ = self.facts[t][2][d]
                dims.append(self.whole(self.param(f"{t}_size{d}", ("size", t, d)), np2, pow2))
            elif isinstance(item, A.Name) and self.facts.get(item.id, ("",))[0] == "I":
                self.params[item.id] = ("value", item.id)
                dims.append(self.whole(item.id, *self.facts[item.id][1]))
            else:
                raise NkError("a tile shape lists tiles, tensor sizes (x.shape[i]) or host ints", item.span)
        rest = [self.expr(a).text for a in e.args[1:]] + [f"{k}={self.expr(v).text}" for k, v in e.kwargs]
        return E(f"{f}([{', '.join(d.block for d in dims)}]{''.join(', ' + r for r in rest)})", tuple(dims))
