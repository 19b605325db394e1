"""Kernels written at random, against a torch model of the same program: in the interpreter on the CPU, and (marker
gpu) compiled for the GPU, where every layout, conversion and shared-memory staging of the passes is met.

Each program tiles [R, C] tensors over a grid of BM x BN programs (R, C ragged against the tile; tiles of 1 to 128 a
side), loads 1-3 inputs (and where's conditions) in f32, f16, bf16, f64, i8, u8, i16, i32 or i64, each stored by rows or by
columns (so that their loads coalesce along either dim), in wider rows or off 16 bytes, with masked lanes filled with
a constant, and combines them through 3-9 random steps: arithmetic, where, minimum/maximum, abs, exp and sqrt, casts,
reductions along an axis or of the whole tile broadcast back, argmax/argmin, C's integer // and %, shifts and bits,
cumsum, flip, sort, trans of square tiles, column pairs swapped through reshape/split/join, cat, the max of column
groups (3-D blocks), and two chained dots (the attention pattern, f16, bf16 or f32 "ieee" operands). It stores the last
value, with every value nothing read added to it, in f32 or f16, laid out as the inputs, under the mask; or, in a
program per BM rows that walks the columns in a runtime loop (num_stages 1-3), the sum of its tiles' rows; or, by
atomics (add, max, min), each program's row sums, maxima or minima of its tile, met in one f32 a row.

The model evaluates the same steps on every program's tile at once ([PM, PN, BM, BN] in float64, masked lanes holding
the constant), so the padding lanes that reductions, scans and sorts see are part of it. Rounding is not modeled:
each element carries a bound on its error, grown per operation by the unit roundoff of its dtype times the magnitudes
of its terms (the model run on magnitudes, as in a forward error analysis), and each element of the kernel's output
must lie within 4x its bound. A wrong layout or a lost lane moves an element by its own size.
Each run draws fresh programs from a fresh seed, which a failure names (NEWT_RANDOM_SEED=... repeats it;
NEWT_RANDOM_KERNELS=N draws N: by default 30 in the interpreter, 120 on the GPU). Outputs start as NaN, those of
atomics as their identity (0, -inf, inf).
"""
import math
import os
import random
import re
from dataclasses import dataclass

import pytest
import torch

import newtc
import simt
from newtc import jit

SEED = int(os.environ.get("NEWT_RANDOM_SEED", random.SystemRandom().randrange(2**32)))
COUNT = os.environ.get("NEWT_RANDOM_KERNELS")
# unit roundoffs (f64's twice: the model's own rounding is as large); integers are exact
BITS = {"i8": 8, "u8": 8, "i16": 16, "i32": 32, "u32": 32, "i64": 64}
INTS, UNSIGNED = tuple(BITS), ("u8", "u32")  # unsigned values must stay >= 0 (a step that leaves them so is redrawn)
EPS = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8, "f64": 2.0**-52, **dict.fromkeys(INTS, 0.0)}
TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64, "i8": torch.int8,
         "u8": torch.uint8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64}
TINY = {"f32": 2.0**-150, "f16": 2.0**-25, "bf16": 2.0**-134, "f64": 2.0**-1074, **dict.fromkeys(INTS, 0.0)}  # half the
# least subnormal: the error of a rounding near 0, where the relative one does not hold (unit roundoff times magnitude)
# the magnitudes a value of these may reach (a step past them is redrawn): i64's, the model's exact integers
LIMIT = {"i8": 2.0**6, "u8": 2.0**7, "i16": 2.0**14, "i32": 2.0**30, "u32": 2.0**31, "i64": 2.0**50, "f16": 2.0**15}


@dataclass
class Value:
    """A step's value: its name in the kernel, its model ([PM, PN, BM, BN], float64), and per element a bound on the
    sum of the magnitudes of the terms it is made of (the model run on magnitudes: what rounding scales with) and one
    on its error, and its dtype."""
    name: str
    ref: torch.Tensor
    abs: torch.Tensor
    err: torch.Tensor
    dt: str


def rounding(dt: str, m: torch.Tensor, n: int = 1) -> torch.Tensor:
    """A bound on the error of n roundings to dt of values made of terms of magnitude m (a sum of n terms)."""
    return n * (EPS[dt] * m + TINY[dt])


def summed(dt: str) -> str:
    """The dtype of a sum or cumsum of dt values: narrow integers in 32 bits, as Triton's."""
    return ("u32" if dt in UNSIGNED else "i32") if BITS.get(dt, 32) < 32 else dt


def wider(a: str, b: str) -> str:
    """Of two dtypes, the one of the larger unit roundoff."""
    return max(a, b, key=EPS.get)


def promote(a: str, b: str) -> str:
    """Triton's promotion of two dtypes among these."""
    if a == b or b in INTS:  # of two integers the wider, or on a tie the unsigned one
        return max(a, b, key=lambda t: (BITS[t], t in UNSIGNED)) if a in INTS else a
    return b if a in INTS else "f64" if "f64" in (a, b) else "f32"


class Program:
    def __init__(self, r: random.Random, device: str):
        self.r, self.device = r, device
        self.R, self.C = (round(math.exp(r.uniform(0, math.log(300)))) for _ in range(2))
        self.BM, self.BN = r.choice([1, 2, 4, 8, 16, 32, 64, 128]), r.choice([1, 2, 4, 8, 16, 32, 64, 128])
        while self.BM * self.BN > 4096:
            self.BM //= 2
        while device == "cpu" and -(-self.R // self.BM) * -(-self.C // self.BN) > 256:  # the interpreter's pace
            self.R, self.C = (self.R // 2, self.C) if self.R // self.BM > self.C // self.BN else (self.R, self.C // 2)
        self.PM, self.PN = -(-self.R // self.BM), -(-self.C // self.BN)
        self.warps = max(r.choice([1, 2, 4, 8]), self.BM * self.BN // 512)  # at most 16 elements a thread: quick
        # or a program per BM rows, its tiles in a runtime loop (pipelined copies where tiles go through shared memory)
        self.looped = r.random() < 0.4
        self.stages = r.choice([1, 2, 3]) if self.looped else 1
        self.lines, self.params, self.args, self.count, self.read = [], [], [], 0, set()

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def line(self, code: str) -> None:
        self.lines.append(code)
        self.read |= set(re.findall(r"\bt\d+\b", code.split("=", 1)[1]))

    def emit(self, code: str, ref: torch.Tensor, abs_: torch.Tensor, err: torch.Tensor, dt: str) -> Value:
        name = self.fresh()
        self.line(f"{name} = {code}")
        return Value(name, ref, abs_, err, dt)

    def tensor_param(self, t: torch.Tensor, cols: str = "rn[None, :]") -> str:
        """A kernel parameter for a copy of t (2-D) stored by rows or by columns, in wider rows or off 16 bytes (as
        the analysis then proves less); returns its element address expression (cols: its column index)."""
        i, how = len(self.params), self.r.choice(["rows", "columns", "wider", "shifted"])
        self.params += [f"p{i}", f"p{i}r", f"p{i}c"]
        if how == "columns":
            t = t.t().contiguous().t()
        elif how == "wider":
            t = torch.cat([t, t[:, :1].expand(-1, self.r.randint(1, 9))], 1)[:, :t.shape[1]]
        elif how == "shifted":
            shift = self.r.randint(1, 7)
            t = torch.cat([t.new_zeros(shift), t.flatten()])[shift:].view(t.shape)
        self.args += [t, t.stride(0), t.stride(1)]
        return f"p{i} + rm[:, None] * p{i}r + {cols} * p{i}c"

    def leaf(self) -> Value:
        r = self.r
        dt = r.choice(["f32", "f16", "bf16", "i32"] * 2 + ["f64", "i64", "i8", "i16", "u8"])
        if dt in INTS:
            x = torch.randint(0 if dt in UNSIGNED else -8, 9, (self.R, self.C), device=self.device, dtype=TORCH[dt])
        else:
            x = torch.randn(self.R, self.C, device=self.device).to(TORCH[dt])
        other = r.choice([0, 1] if dt in UNSIGNED else [0, 1, -2])
        full = torch.full((self.PM * self.BM, self.PN * self.BN), float(other), dtype=torch.float64)
        full[:self.R, :self.C] = x.double().cpu()
        ref = full.view(self.PM, self.BM, self.PN, self.BN).permute(0, 2, 1, 3)
        addr = self.tensor_param(x)
        return self.emit(f"load({addr}, mask=mask, other={other})", ref, ref.abs(), torch.zeros_like(ref), dt)

    def step(self, vals: list) -> Value:
        """One step on values drawn from vals; drawn again where it would overflow its dtype or not apply."""
        while True:
            made = self.draw_step(vals)
            if made is not None and made[2].max().item() <= LIMIT.get(made[4], math.inf) and \
                    not (made[4] in UNSIGNED and made[1].min() < 0):
                return self.emit(*made)

    def draw_step(self, vals: list):
        """(code, model, magnitudes, error, dtype) of a random step, or None. Each operation's rounding adds its
        bound (`rounding`) to the errors it carries forward."""
        r = self.r
        a, b = r.choice(vals), r.choice(vals)
        dt = promote(a.dt, b.dt)
        if dt in UNSIGNED and min(a.ref.min(), b.ref.min()) < 0:  # a negative value made unsigned wraps
            return None
        kind = r.choice(["arith", "arith", "minmax", "where", "unary", "cast", "reduce", "scan", "flip", "sort",
                         "trans", "pairs", "dots", "arg", "ints", "all", "cat", "groups"])
        axis = r.randint(0, 1)
        dim = 2 + axis  # the model's dim of the tile's axis
        n = (self.BM, self.BN)[axis]
        keep = "[None, :]" if axis == 0 else "[:, None]"  # a reduction along axis, broadcast back

        def same(f):  # a step that moves or selects elements: their magnitudes and errors go with them
            return f(a.ref), f(a.abs), f(a.err), a.dt

        def line_max(t):  # along the axis, every element: what a sort or a max may take there
            return t.amax(dim, keepdim=True).expand_as(t)
        if kind == "arith":
            op = r.choice(["+", "-", "*"])
            if op == "*":
                m = a.abs * b.abs
                e = a.abs * b.err + b.abs * a.err + a.err * b.err + rounding(dt, m)
                return f"{a.name} * {b.name}", a.ref * b.ref, m, e, dt
            m = a.abs + b.abs
            ref = a.ref + b.ref if op == "+" else a.ref - b.ref
            return f"{a.name} {op} {b.name}", ref, m, a.err + b.err + rounding(dt, m), dt
        if kind == "minmax":
            op = r.choice(["minimum", "maximum"])
            return f"{op}({a.name}, {b.name})", getattr(torch, op)(a.ref, b.ref), torch.maximum(a.abs, b.abs), \
                torch.maximum(a.err, b.err), dt
        if kind == "where":  # on a loaded value, exact: a computed one could compare either way within its error
            c = r.choice([v for v in vals if not v.err.any()] or [self.leaf()])
            pick = c.ref > 0
            return f"where({c.name} > 0, {a.name}, {b.name})", torch.where(pick, a.ref, b.ref), \
                torch.where(pick, a.abs, b.abs), torch.where(pick, a.err, b.err), dt
        if kind == "unary":
            op = r.choice(["abs", "neg", "exp", "sqrt"])
            real = "f32" if a.dt in INTS else a.dt  # math on integers is in f32
            w = 4 * EPS["f32"] + EPS[real]  # the math function's error, then its result's rounding (of at most 2)
            if op == "exp":  # of at most 1, its slope at most 1
                one = torch.ones_like(a.ref)
                x = f"{a.name}.to(f32)" if a.dt in UNSIGNED else a.name  # (an unsigned value's negation wraps)
                return f"exp(-abs({x}))", torch.exp(-a.ref.abs()), one, a.err + w + TINY[real], real
            if op == "sqrt":  # its slope at most 1/2, after the sum's rounding
                m = torch.sqrt(a.abs + 1)
                e = (a.err + rounding(real, a.abs + 1)) / 2 + w * m
                return f"sqrt(abs({a.name}) + 1)", torch.sqrt(a.ref.abs() + 1), m, e, real
            return (f"abs({a.name})", *same(torch.abs)) if op == "abs" else (f"-{a.name}", -a.ref, a.abs, a.err, a.dt)
        if kind == "cast":
            to = r.choice(["f16", "bf16", "f32"])
            if to == "f16" and a.abs.max() > LIMIT["f16"]:
                return None
            return f"{a.name}.to({to}).to(f32)", a.ref.to(TORCH[to]).double(), a.abs, a.err + rounding(to, a.abs), "f32"
        def reduction(dims, count: int, code: str):  # sum, max or min over dims, broadcast back, plus b
            op = r.choice(["sum", "max", "min"])
            rdt = summed(a.dt) if op == "sum" else a.dt
            out = promote(rdt, b.dt)
            if op == "sum":
                m, e = a.abs.sum(dims, keepdim=True), a.err.sum(dims, keepdim=True)
                e = e + rounding(wider(out, a.dt), m, count)
                red = a.ref.sum(dims, keepdim=True)
            else:
                m, e = a.abs.amax(dims, keepdim=True), a.err.amax(dims, keepdim=True)
                red = a.ref.amax(dims, keepdim=True) if op == "max" else a.ref.amin(dims, keepdim=True)
            if m.max() > LIMIT.get(rdt, math.inf):  # the reduction's own dtype overflows
                return None
            m = m + b.abs
            return code.format(op=op) + f" + {b.name}", red + b.ref, m, e + b.err + rounding(out, m), out
        if kind == "reduce":
            return reduction(dim, n, f"{{op}}({a.name}, axis={axis}){keep}")
        if kind == "scan":
            m = a.abs.cumsum(dim)
            e = a.err.cumsum(dim) + rounding(a.dt, m, n)
            return f"cumsum({a.name}, axis={axis})", a.ref.cumsum(dim), m, e, summed(a.dt)
        if kind == "flip":
            return f"flip({a.name}, dim={axis})", *same(lambda t: t.flip(dim))
        if kind == "sort":  # sorted values each within the line's largest error (sorting is 1-Lipschitz)
            desc = r.random() < 0.5
            return f"sort({a.name}, dim={axis}, descending={desc})", a.ref.sort(dim, descending=desc).values, \
                line_max(a.abs), line_max(a.err), a.dt
        if kind == "trans" and self.BM == self.BN:
            return f"trans({a.name})", *same(lambda t: t.transpose(2, 3))
        if kind == "pairs" and self.BN >= 2:  # the halves of each column pair swapped: a layout's register split
            h = self.fresh()
            self.line(f"{h}a, {h}b = split(reshape({a.name}, [{self.BM}, {self.BN // 2}, 2]))")
            return f"reshape(join({h}b, {h}a), [{self.BM}, {self.BN}])", \
                *same(lambda t: t.unflatten(3, (self.BN // 2, 2)).flip(4).flatten(3))
        exact = [v for v in vals if not v.err.any()]  # an index or a bit of a computed value could be another
        if kind == "arg" and exact:  # the first among ties, as torch's
            c, op = r.choice(exact), r.choice(["argmax", "argmin"])
            index = (c.ref.argmax if op == "argmax" else c.ref.argmin)(dim, keepdim=True).double()
            m, dt = index + b.abs, promote("i32", b.dt)
            return f"{op}({c.name}, axis={axis}){keep} + {b.name}", index + b.ref, m, b.err + rounding(dt, m), dt
        if kind == "ints" and [v for v in exact if v.dt in INTS]:  # C's truncating // and %, shifts, bits
            c, m = r.choice([v for v in exact if v.dt in INTS]), r.randint(1, 5)
            op = r.choice(["//", "%", "<<", ">>", "&", "|", "^"])
            x = c.ref.long()
            ref = {"//": lambda: torch.div(x, m, rounding_mode="trunc"), "%": lambda: torch.fmod(x, m),
                   "<<": lambda: x << m, ">>": lambda: x >> m, "&": lambda: x & m, "|": lambda: x | m,
                   "^": lambda: x ^ m}[op]().double()
            return f"{c.name} {op} {m}", ref, ref.abs(), torch.zeros_like(ref), c.dt
        if kind == "all":  # a reduction to one value, broadcast
            return reduction((2, 3), self.BM * self.BN, f"{{op}}({a.name})")
        if kind == "cat":  # two tiles one after the other, then summed back over the new outer dim
            c = self.fresh()
            self.line(f"{c} = reshape(cat({a.name}, {b.name}, dim={axis}), [2, {self.BM}, {self.BN}])" if axis == 0 else
                      f"{c} = trans(reshape(cat({a.name}, {b.name}, dim=1), [{self.BM}, 2, {self.BN}]), 1, 0, 2)")
            m = a.abs + b.abs
            return f"sum({c}, axis=0)", a.ref + b.ref, m, a.err + b.err + rounding(dt, m, 2), summed(dt)
        if kind == "groups" and self.BN >= 4:  # the max of each group of 4 columns, broadcast over it: 3-D layouts
            g = self.BN // 4
            return f"reshape(broadcast_to(max(reshape({a.name}, [{self.BM}, {g}, 4]), axis=2)[:, :, None], " \
                f"[{self.BM}, {g}, 4]), [{self.BM}, {self.BN}])", \
                *same(lambda t: t.unflatten(3, (g, 4)).amax(4, keepdim=True).expand(-1, -1, -1, g, 4).flatten(3))
        if kind == "dots" and self.BM * self.BM <= 512 * self.warps:  # (a @ b^T) @ c, as attention's two products
            to, c = r.choice(["f16", "bf16", "f32"]), r.choice(vals)
            cast, prec = f".to({to})", ', input_precision="ieee"' if to == "f32" else ""

            def product(x: tuple, y: tuple, k: int) -> tuple:  # (model, magnitudes, error) of x @ y, f32 sums of k
                m = x[1] @ y[1]
                return x[0] @ y[0], m, x[1] @ y[2] + x[2] @ y[1] + x[2] @ y[2] + rounding("f32", m, k)

            def operand(v: Value, t=lambda t: t) -> tuple:  # v in `to`, transformed by t
                return t(v.ref.to(TORCH[to]).double()), t(v.abs), t(v.err + rounding(to, v.abs))
            s_ref, s_abs, s_err = product(operand(a), operand(b, lambda t: t.transpose(2, 3)), self.BN)
            if to == "f16" and max(a.abs.max(), b.abs.max(), c.abs.max(), s_abs.max()) > LIMIT["f16"]:
                return None
            s = self.fresh()
            self.line(f"{s} = dot({a.name}{cast}, trans({b.name}){cast}{prec})")
            s_in = (s_ref.to(TORCH[to]).double(), s_abs, s_err + rounding(to, s_abs))
            return f"dot({s}{cast}, {c.name}{cast}{prec})", *product(s_in, operand(c), self.BM), "f32"
        return None

    def build(self) -> tuple[str, list, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The kernel's source, its arguments, its output tensor, the model's output and the bound on each element's
        error."""
        r = self.r
        vals = [self.leaf() for _ in range(r.randint(1, 3))]
        for _ in range(r.randint(3, 9)):
            vals.append(self.step(vals))
        out = vals[-1]
        for v in vals[:-1]:  # every value reaches the output: a step nothing reads could be wrong unseen
            if v.name not in self.read:
                m, dt = out.abs + v.abs, promote(out.dt, v.dt)
                if m.max() > LIMIT.get(dt, math.inf) or dt in UNSIGNED and min(out.ref.min(), v.ref.min()) < 0:
                    out, dt = self.emit(f"{out.name}.to(f32)", out.ref, out.abs, out.err, "f32"), "f32"
                out = self.emit(f"{out.name} + {v.name}", out.ref + v.ref, m, out.err + v.err + rounding(dt, m), dt)
        rows = "rm = program_id(0) * BM + arange(0, BM)"
        tile = ["mask = (rm[:, None] < R) & (rn[None, :] < C)", *self.lines]
        # or each program's row sums (maxima, minima) of its tile in f32, met in one value a row by atomics
        atomic = None if self.looped or r.random() < 0.7 else r.choice(["add", "max", "min"])
        if self.looped:  # each tile summed into an f32 accumulator, then its rows: one value a row
            ref, m = (t.sum((1, 3)).flatten()[:self.R, None] for t in (out.ref, out.abs))
            err = out.err.sum((1, 3)).flatten()[:self.R, None] + rounding("f32", m, self.PN * self.BN)
        else:
            ref, m, err = (t.permute(0, 2, 1, 3).reshape(self.PM * self.BM, -1)[:self.R, :self.C]
                           for t in (out.ref, out.abs, out.err))
        if atomic == "add":
            ref, m, err = ref.sum(1, keepdim=True), m.sum(1, keepdim=True), err.sum(1, keepdim=True)
            err = err + rounding("f32", m, self.C)
        elif atomic:  # the max or min of the row, and of its terms' magnitudes and errors (f32 rounds it once)
            ref = (ref.amax if atomic == "max" else ref.amin)(1, keepdim=True)
            m, err = m.amax(1, keepdim=True), err.amax(1, keepdim=True) + rounding("f32", m.amax(1, keepdim=True))
        odt = r.choice(["f32", "f16"]) if m.max() < LIMIT["f16"] and not atomic else "f32"
        start = {None: "nan", "add": 0, "max": "-inf", "min": "inf"}[atomic]  # the atomics' identity
        o = torch.full((self.R, 1 if self.looped or atomic else self.C), float(start), dtype=TORCH[odt],
                       device=self.device)
        if atomic:
            addr = self.tensor_param(o, "arange(0, 1)[None, :]")
            v = f"where(mask, {out.name}.to(f32), {'0.0' if atomic == 'add' else start})"
            lines = [rows, "rn = program_id(1) * BN + arange(0, BN)", *tile,
                     f"atomic_{atomic}({addr}, {'sum' if atomic == 'add' else atomic}({v}, axis=1)[:, None], "
                     "mask=rm[:, None] < R)"]
        elif self.looped:
            addr = self.tensor_param(o, "arange(0, 1)[None, :]")
            lines = [rows, "acc = zeros([BM, BN], f32)", "for j in range(0, C, BN):",
                     *(f"    {x}" for x in ["rn = j + arange(0, BN)", *tile, f"acc = acc + {out.name}"]),
                     f"store({addr}, sum(acc, axis=1)[:, None], mask=rm[:, None] < R)"]
        else:
            addr = self.tensor_param(o)
            lines = [rows, "rn = program_id(1) * BN + arange(0, BN)", *tile, f"store({addr}, {out.name}, mask=mask)"]
        source = "\n".join([f"kernel k({', '.join(self.params)}, R, C, BM: constexpr, BN: constexpr):",
                            *(f"    {x}" for x in lines)]) + "\n"
        o = self.args[-3]  # as tensor_param laid it out
        return source, self.args + [self.R, self.C], o, ref, 4 * (err + rounding(odt, m))


def run_one(r: random.Random, device: str) -> str:
    p = Program(r, device)
    source, args, o, ref, bound = p.build()
    layouts = " ".join(f"{tuple(t.stride())}+{t.storage_offset()}" for t in args if isinstance(t, torch.Tensor))
    what = (f"R={p.R} C={p.C} BM={p.BM} BN={p.BN} num_warps={p.warps} num_stages={p.stages} out {o.dtype}, "
            f"strides+offsets {layouts}:\n{source}")
    kernel, meta = newtc.compile(source, "random.nk").k, dict(BM=p.BM, BN=p.BN, num_warps=p.warps, num_stages=p.stages)
    try:
        if device == "cpu":  # the GPU's code too, to a cubin (NVRTC and ptxas run without a GPU)
            kernel.ptx(*args, arch=r.choice(["sm_80", "sm_90a"]), **meta)
        kernel[(p.PM,) if p.looped else (p.PM, p.PN)](*args, **meta)
    except Exception as e:  # a compile error is a failure too: name the program
        raise AssertionError(f"{type(e).__name__}: {str(e)[:2000]}\n{what}") from None
    got = o.double().cpu()
    assert not got.isnan().any(), f"unwritten (NaN) elements\n{what}"
    over = ((got - ref).abs() - bound).flatten()
    i = int(over.argmax())
    assert over[i] <= 0, f"element {divmod(i, got.shape[1])}: {got.flatten()[i].item():.6g}, expected " \
        f"{ref.flatten()[i].item():.6g} within {bound.flatten()[i].item():.3g}\n{what}"
    return what


@pytest.mark.parametrize("device", ["cpu", pytest.param("simt", marks=pytest.mark.skipif(simt.GXX is None,
                                                                                       reason="needs g++")),
                                    pytest.param("cuda", marks=pytest.mark.gpu)])
def test_random_kernels(device, monkeypatch):
    """simt: on the CPU, each program's generated CUDA run as the GPU would (the layouts, shuffles, shared memory and
    tensor-core fragments the passes chose); a program whose code only a GPU runs goes to the interpreter."""
    monkeypatch.setenv("NEWT_VERIFY", "1")  # the IR verifier after every pass, the interpreter's types per op
    if device == "simt":
        monkeypatch.setattr(jit.Kernel, "interpret", simt.run_or_interpret)
    r = random.Random(f"{SEED}-{device}")
    torch.manual_seed(SEED)  # the inputs too: NEWT_RANDOM_SEED repeats a failing program exactly
    for i in range(int(COUNT or (30 if device != "cuda" else 120))):
        try:
            run_one(r, "cpu" if device == "simt" else device)
        except AssertionError as e:
            raise AssertionError(f"program {i} of NEWT_RANDOM_SEED={SEED} on {device}: {e}") from None
