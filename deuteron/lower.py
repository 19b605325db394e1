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

import torch

from newtc import ast as A
from newtc.errors import NkError, Span
from newtc.types import DType

from .lang import DTYPE_OF, header, is_call, literal

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


def size_facts(n) -> tuple:
    """What a size proves: its whole block (the next power of two) and the power of two dividing it."""
    n = int(n)
    return 1 << max(0, (n - 1).bit_length()), n & -n


def facts(v, constexpr: bool):
    """The part of a host value that the generated text depends on."""
    if isinstance(v, torch.Tensor):
        if v.dtype not in DTYPE_OF:
            raise NkError(f"tensors of {v.dtype} are not supported")
        return "T", DTYPE_OF[v.dtype].name, tuple((*size_facts(s), st == 1) for s, st in zip(v.shape, v.stride()))
    if constexpr or isinstance(v, bool) or not isinstance(v, (int, float)):
        return ("K" if constexpr else "C"), v
    return ("I", size_facts(v)) if isinstance(v, int) else ("F",)


def is_whole(item) -> bool:
    """`:` among indices."""
    return isinstance(item, A.Slice) and item.lower is item.upper is item.step is None


def is_none(item) -> bool:
    return isinstance(item, A.Const) and item.value is None


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
    meta: dict  # the launch's keywords: the constexprs, num_warps and num_stages
    grid: list  # (bound expression, block size; None for grid(n))
    persistent: bool
    file: str  # the generated file's name
    linemap: dict  # generated line -> Span in the tile program
    info: Info
    kernel: object = None  # the newt kernel, once compiled

    def args(self, env) -> list:
        return [env[s[1]] if s[0] == "value" else getattr(env[s[1]], s[0])(s[2]) for _, s in self.params]

    def grid_size(self, env, interp, programs: int) -> int:
        n = 1
        for bound, block in self.grid:
            size = int(interp.expr(bound, env))
            n *= -(-size // block) if block else size
        return min(n, programs) if self.persistent else n

    def run(self, step, *args, **kwargs):
        """step(*args, **kwargs), an error in the generated kernel reported at the tile program's line."""
        try:
            return step(*args, **kwargs)
        except NkError as e:
            raise self.remap(e) from None

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

    def let(self, base: str, text: str) -> str:
        """A fresh name assigned `text` on a line of its own."""
        name = self.fresh(base)
        self.line(f"{name} = {text}")
        return name

    # ---- the grid ------------------------------------------------------------------------------
    def lower(self, loop: A.For) -> Lowered:
        self.span = loop.span
        dims, grid = [], []  # (variable, bound, Dim or None for grid(n)); (bound node, block size or None)
        for name, arg in zip(header(loop)[1], loop.iter.args):
            node = arg.args[0] if is_call(arg, "grid") else arg
            bound = self.scalar(node)
            d = self.tile(name, arg, bound) if node is arg else None
            dims.append((name, bound.text, d))
            grid.append((node, d.size if d else None))
        self.info.group = len(dims) > 1 and None not in (dims[-1][2], dims[-2][2])
        group = self.config.get("group", 1) if self.info.group else 1
        persistent = bool(self.config.get("persistent"))
        counts = []  # programs along each dimension, named where used more than once
        for v, bound, d in dims:
            count = bound if d is None else f"cdiv({bound}, {d.block})"
            counts.append(self.let(f"n_{v}", count) if d and (len(dims) > 1 or persistent) else count)
        pid = self.fresh("pid")
        if persistent:  # one program per SM walks the tiles
            self.line(f"for {pid} in range(program_id(0), {' * '.join(counts)}, num_programs(0)):")
            self.depth += 1
        else:
            self.line(f"{pid} = program_id(0)")
        pids = [pid] if len(dims) == 1 and dims[0][2] else [v if d is None else self.fresh(f"pid_{v}") for v, _, d in dims]
        if group > 1:  # the last two dimensions as one, walked in groups of rows
            inner = pid if len(dims) == 2 else self.fresh("inner")
            self.unflatten(pid, pids[:-2] + [inner], counts[:-2] + [f"({counts[-2]} * {counts[-1]})"])
            self.grouped(inner, pids[-2:], counts[-2:], self.const("GROUP", group, "GROUP"))
        else:
            self.unflatten(pid, pids, counts)
        for (v, bound, d), p in zip(dims, pids):
            if d is None:
                self.env[v] = E(v)
            else:
                self.enter(v, d, E(f"{p} * {d.block}", (), PREC["*"]), bound)
        self.block(loop.body)
        return self.finish(grid, persistent)

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
        """A tile loop's block; it is not masked where the call proves that the block divides the bound."""
        size, fact = self.config.get(f"block_{name}", 1), self.bounds.get(id(node))
        self.info.tiles[name] = fact
        even = fact is not None and fact[1] % size == 0
        return Dim(name, self.const(f"BLOCK_{name.upper()}", size, ("block", name)), None if even else bound.text, name, size)

    def enter(self, name: str, dim: Dim, begin: E, bound: str) -> None:
        self.line(f"{name} = {begin.text} + arange(0, {dim.block})")
        self.env[name] = TileVar(dim, begin, bound)

    def whole(self, bound: str, facts: tuple) -> Dim:
        """A whole dimension of `bound` elements in a block of its next power of two; one index vector per size."""
        np2, pow2 = facts[:2]
        if np2 not in self.rindex:
            index = self.fresh(f"r{len(self.rindex)}")
            self.rindex[np2] = index, self.const(index.upper(), np2, ("R", np2))
            self.preamble.append((1, f"{index} = arange(0, {self.rindex[np2][1]})", self.span))
        return Dim(*self.rindex[np2], None if pow2 == np2 else bound, None, np2)

    def finish(self, grid, persistent) -> Lowered:
        file, short = self.module.file, Path(self.module.file).name
        order = sorted(self.params, key=lambda n: not (self.params[n][0] == "value" and self.facts[self.params[n][1]][0] == "T"))
        config = json.dumps(self.config, default=str)
        out = [(f"# deuteron: tile {self.fn.name} ({short}:{self.fn.span.line}), config {config}", None)]  # (text, Span)
        defs = {d.name: d for d in self.module.defs if d.kind == "def"}
        used = self.called & set(defs)
        while more := {m for n in used for m in names_in(defs[n].body) if m in defs} - used:  # helpers' helpers
            used |= more
        src = self.module.source.splitlines()
        for d in (d for d in defs.values() if d.name in used):  # as written
            out += [(src[k - 1], Span(file, k, 1)) for k in range(d.span.line, d.span.end_line + 1)] + [("", None)]
        out.append((f"kernel {self.name}({', '.join(order + [f'{n}: constexpr' for n in self.consts])}):", self.span))
        out += [(f"{'    ' * depth}{text}  # {short}:{span.line}", span) for depth, text, span in self.preamble + self.lines]
        meta = {**self.consts, "num_warps": self.config.get("num_warps", 4), "num_stages": self.config.get("num_stages", 1)}
        return Lowered("\n".join(text for text, _ in out) + "\n", self.name, [(n, self.params[n]) for n in order],
                       meta, grid, persistent, f"{file}~{self.name}.nk",
                       {i: span for i, (_, span) in enumerate(out, 1) if span}, self.info)

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
        kind, names = header(s)
        if kind != "tiles":
            self.line(f"for {names[0]} in {kind}({', '.join(self.scalar(a).text for a in s.iter.args)}):")
            self.env[names[0]] = E(names[0])
            return self.nested(s.body)
        self.info.loops = True
        for name, arg in zip(names, s.iter.args):  # one in-kernel loop per dimension
            bound = self.scalar(arg)
            dim, begin = self.tile(name, arg, bound), self.fresh(f"{name}_begin")
            self.line(f"for {begin} in range(0, {bound.text}, {dim.block}):")
            self.depth += 1
            self.enter(name, dim, E(begin), bound.text)
        self.block(s.body)
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
        """The name of the host code's tensor that e is, or None."""
        ok = isinstance(e, A.Name) and e.id not in self.env and self.facts.get(e.id, ("",))[0] == "T"
        return e.id if ok else None

    def shape_item(self, e) -> tuple | None:
        """(x, d) where e is `x.shape[d]` of a host tensor x."""
        if isinstance(e, A.Subscript) and isinstance(e.value, A.Attribute) and e.value.attr == "shape":
            t = self.host_tensor(e.value.value)
            return (t, literal(e.index[0])) if t else None
        return None

    def size(self, t: str, d: int) -> str:
        return self.param(f"{t}_size{d}", ("size", t, d))

    def int_facts(self, e) -> tuple | None:
        """What the call proves about a host int, `x.shape[d]` or a parameter: see size_facts."""
        if (item := self.shape_item(e)) is not None:
            return self.facts[item[0]][2][item[1]]
        if isinstance(e, A.Name) and e.id not in self.env and self.facts.get(e.id, ("",))[0] == "I":
            return self.facts[e.id][1]
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
        if (item := self.shape_item(e)) is not None:
            return E(self.size(*item))
        if self.host_tensor(e.value):
            ptr, m, dims = self.place(e)
            return E(f"load({ptr}{f', mask={m}, other=0' if m else ''})", dims)
        v, dims, items = self.expr(e.value), [], []
        axes = iter(v.dims)
        for item in e.index:  # a computed tile takes `:` and None
            if not (is_whole(item) or is_none(item)):
                raise NkError("a computed tile takes only `:` and `None` as indices", item.span)
            dims.append(next(axes, None) if is_whole(item) else None)
            items.append(":" if is_whole(item) else "None")
        return E(f"{par(v, ATOM)}[{', '.join(items)}]", tuple(dims))

    def place(self, e: A.Subscript):
        """The pointers, mask and dims of `x[tm, :, i, None]` for a host tensor x."""
        t = self.host_tensor(e.value)
        if t is None:
            raise NkError("tiles index the host code's tensors", e.value.span)
        shape, dims, offsets = self.facts[t][2], [], []  # offsets: per dimension of x, an axis of dims or a scalar E
        for item in e.index:
            v = self.env.get(item.id) if isinstance(item, A.Name) else None
            if is_none(item):
                dims.append(None)
                continue
            if len(offsets) == len(shape):
                raise NkError(f"too many indices for a tensor of rank {len(shape)}", e.span)
            if isinstance(item, A.Slice) and not is_whole(item):
                raise NkError("a tensor takes `:` (a whole dimension), not a range", item.span)
            if is_whole(item) or isinstance(v, TileVar):
                dims.append(self.whole(self.size(t, len(offsets)), shape[len(offsets)]) if is_whole(item) else v.dim)
                offsets.append(len(dims) - 1)
            else:
                offsets.append(self.scalar(item))
        if len(offsets) != len(shape):
            raise NkError(f"{len(offsets)} indices for a tensor of rank {len(shape)}", e.span)
        parts = [t]
        for d, x in enumerate(offsets):
            idx = E(dims[x].index + bc(x, len(dims))) if isinstance(x, int) else x
            unit = shape[d][2]  # a unit stride is known, so the offsets are seen to be contiguous
            parts.append(par(idx, 10) if unit else f"{par(idx, 10)} * {self.param(f'{t}_stride{d}', ('stride', t, d))}")
        self.params[t] = ("value", t)
        return " + ".join(parts), mask(enumerate(dims), len(dims)), tuple(dims)

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
        shape = e.args[0]
        dims = tuple(map(self.shape_dim, shape.items if isinstance(shape, (A.ListExpr, A.TupleExpr)) else [shape]))
        rest = [self.expr(a).text for a in e.args[1:]] + [f"{k}={self.expr(v).text}" for k, v in e.kwargs]
        return E(f"{f}([{', '.join(d.block for d in dims)}]{''.join(', ' + r for r in rest)})", dims)

    def shape_dim(self, item) -> Dim:
        """A dimension of the block zeros() or full() makes: a tile, a literal, or a whole host size."""
        v = self.env.get(item.id) if isinstance(item, A.Name) else None
        if isinstance(v, TileVar):
            return v.dim
        if isinstance(item, A.Num):
            return Dim("", str(item.value), None, None, item.value)
        if (facts := self.int_facts(item)) is not None:
            return self.whole(self.scalar(item).text, facts)
        raise NkError("a tile shape lists tiles, tensor sizes (x.shape[i]) and host ints", item.span)
