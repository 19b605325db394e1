"""Kernels written at random, against a torch model of the same program: in the interpreter on the CPU, and (marker
gpu) compiled for the GPU, where every layout, conversion and shared-memory staging of the passes is met.

Each program tiles [R, C] tensors over a grid of BM x BN programs (R, C ragged against the tile; tiles of 1 to 128 a
side), loads 1-3 inputs (and where's conditions) in f32, f16, bf16 or i32, each stored by rows or by columns (so that
their loads coalesce along either dim), in wider rows or off 16 bytes, with masked lanes filled with a constant, and
combines them through 3-9 random steps: arithmetic, where, minimum/maximum, abs, exp and sqrt, casts, reductions
along an axis or of the whole tile broadcast back, argmax/argmin, C's integer // and %, shifts and bits, cumsum,
flip, sort, trans of square tiles, column pairs swapped through reshape/split/join, cat, the max of column groups
(3-D blocks), and two chained dots (the attention pattern, f16, bf16 or f32 "ieee" operands). It stores the last value, with every value nothing read added to it, in f32 or f16, laid out as
the inputs, under the mask.

The model evaluates the same steps on every program's tile at once ([PM, PN, BM, BN] in float64, masked lanes holding
the constant), so the padding lanes that reductions, scans and sorts see are part of it. Rounding is not modeled:
each value carries a bound on its magnitude and one on its error (an `eps` of its precision per operation), and the
kernel's output must lie within 4x that bound. A wrong layout or a lost lane moves a value by its magnitude.
Each run draws fresh programs from a fresh seed, which a failure names (NEWT_RANDOM_SEED=... repeats it;
NEWT_RANDOM_KERNELS=N draws N: by default 30 in the interpreter, 120 on the GPU). Outputs start as NaN.
"""
import math
import os
import random
import re
from dataclasses import dataclass

import pytest
import torch

import newtc

SEED = int(os.environ.get("NEWT_RANDOM_SEED", random.SystemRandom().randrange(2**32)))
COUNT = os.environ.get("NEWT_RANDOM_KERNELS")
EPS = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8, "i32": 0.0}
TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32}
LIMIT = {"i32": 2.0**30, "f16": 2.0**15}  # the magnitudes a value of these may reach (a step past them is redrawn)


@dataclass
class Value:
    """A step's value: its name in the kernel, its model ([PM, PN, BM, BN], float64), a bound on its magnitude and on
    its error, the unit roundoff of the narrowest precision it went through, and its dtype."""
    name: str
    ref: torch.Tensor
    mag: float
    err: float
    eps: float
    dt: str


def promote(a: str, b: str) -> str:
    """Triton's promotion of two dtypes among these."""
    return a if a == b else b if a == "i32" else a if b == "i32" else "f32"


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
        self.lines, self.params, self.args, self.count, self.read = [], [], [], 0, set()

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def line(self, code: str) -> None:
        self.lines.append(f"    {code}")
        self.read |= set(re.findall(r"\bt\d+\b", code.split("=", 1)[1]))

    def emit(self, code: str, ref: torch.Tensor, mag: float, err: float, eps: float, dt: str) -> Value:
        name = self.fresh()
        self.line(f"{name} = {code}")
        return Value(name, ref, mag, err, eps, dt)

    def tensor_param(self, t: torch.Tensor) -> str:
        """A kernel parameter for a copy of t ([R, C]) stored by rows or by columns, in wider rows or off 16 bytes (as
        the analysis then proves less); returns its element address expression."""
        i, how = len(self.params), self.r.choice(["rows", "columns", "wider", "shifted"])
        self.params += [f"p{i}", f"p{i}r", f"p{i}c"]
        if how == "columns":
            t = t.t().contiguous().t()
        elif how == "wider":
            t = torch.cat([t, t[:, :1].expand(-1, self.r.randint(1, 9))], 1)[:, :self.C]
        elif how == "shifted":
            shift = self.r.randint(1, 7)
            t = torch.cat([t.new_zeros(shift), t.flatten()])[shift:].view(self.R, self.C)
        self.args += [t, t.stride(0), t.stride(1)]
        return f"p{i} + rm[:, None] * p{i}r + rn[None, :] * p{i}c"

    def leaf(self) -> Value:
        r = self.r
        dt = r.choice(["f32", "f16", "bf16", "i32"])
        if dt == "i32":
            x = torch.randint(-8, 9, (self.R, self.C), device=self.device, dtype=torch.int32)
        else:
            x = torch.randn(self.R, self.C, device=self.device).to(TORCH[dt])
        other = r.choice([0, 1, -2])
        full = torch.full((self.PM * self.BM, self.PN * self.BN), float(other), dtype=torch.float64)
        full[:self.R, :self.C] = x.double().cpu()
        ref = full.view(self.PM, self.BM, self.PN, self.BN).permute(0, 2, 1, 3)
        addr = self.tensor_param(x)
        return self.emit(f"load({addr}, mask=mask, other={other})", ref, max(abs(other), x.abs().max().item()), 0.0,
                         EPS[dt], dt)

    def step(self, vals: list) -> Value:
        """One step on values drawn from vals; drawn again where it would overflow its dtype or not apply."""
        while True:
            made = self.draw_step(vals)
            if made is not None and made[2] <= LIMIT.get(made[5], math.inf):
                return self.emit(*made)

    def draw_step(self, vals: list):
        """(code, model, magnitude, error, eps, dtype) of a random step, or None."""
        r = self.r
        a, b = r.choice(vals), r.choice(vals)
        eps, dt = max(a.eps, b.eps, EPS["f32"]), promote(a.dt, b.dt)
        kind = r.choice(["arith", "arith", "minmax", "where", "unary", "cast", "reduce", "scan", "flip", "sort",
                         "trans", "pairs", "dots", "arg", "ints", "all", "cat", "groups"])
        axis = r.randint(0, 1)
        dim = 2 + axis  # the model's dim of the tile's axis
        n = (self.BM, self.BN)[axis]
        if kind == "arith":
            op = r.choice(["+", "-", "*"])
            if op == "*":
                mag = a.mag * b.mag
                return f"{a.name} * {b.name}", a.ref * b.ref, mag, a.mag * b.err + b.mag * a.err + eps * mag, eps, dt
            mag = a.mag + b.mag
            return (f"{a.name} {op} {b.name}", a.ref + b.ref if op == "+" else a.ref - b.ref, mag,
                    a.err + b.err + eps * mag, eps, dt)
        if kind == "minmax":
            op = r.choice(["minimum", "maximum"])
            return f"{op}({a.name}, {b.name})", getattr(torch, op)(a.ref, b.ref), max(a.mag, b.mag), \
                max(a.err, b.err), eps, dt
        if kind == "where":  # on a loaded value, exact: a computed one could compare either way within its error
            c = r.choice([v for v in vals if v.err == 0] or [self.leaf()])
            return f"where({c.name} > 0, {a.name}, {b.name})", torch.where(c.ref > 0, a.ref, b.ref), \
                max(a.mag, b.mag), max(a.err, b.err), eps, dt
        if kind == "unary":
            op = r.choice(["abs", "neg", "exp", "sqrt"])
            real = "f32" if a.dt == "i32" else a.dt  # math on integers is in f32
            if op == "exp":
                return f"exp(-abs({a.name}))", torch.exp(-a.ref.abs()), 1.0, a.err + 2 * eps, eps, real
            if op == "sqrt":
                mag = math.sqrt(a.mag + 1)
                return f"sqrt(abs({a.name}) + 1)", torch.sqrt(a.ref.abs() + 1), mag, a.err / 2 + 2 * eps * mag, eps, \
                    real
            return (f"abs({a.name})" if op == "abs" else f"-{a.name}", a.ref.abs() if op == "abs" else -a.ref, a.mag,
                    a.err, a.eps, a.dt)
        if kind == "cast":
            to = r.choice(["f16", "bf16", "f32"])
            if to == "f16" and a.mag > LIMIT["f16"]:
                return None
            return f"{a.name}.to({to}).to(f32)", a.ref.to(TORCH[to]).double(), a.mag, a.err + EPS[to] * a.mag, \
                max(a.eps, EPS[to]), "f32"
        if kind == "reduce":
            op = r.choice(["sum", "max", "min"])
            red = {"sum": lambda t: t.sum(dim, keepdim=True), "max": lambda t: t.amax(dim, keepdim=True),
                   "min": lambda t: t.amin(dim, keepdim=True)}[op](a.ref)
            mag, err = (n * a.mag, n * (a.err + eps * a.mag)) if op == "sum" else (a.mag, a.err)
            index = "[None, :]" if axis == 0 else "[:, None]"
            return f"{op}({a.name}, axis={axis}){index} + {b.name}", red + b.ref, mag + b.mag, \
                err + b.err + eps * (mag + b.mag), eps, dt
        if kind == "scan":
            return f"cumsum({a.name}, axis={axis})", a.ref.cumsum(dim), n * a.mag, n * (a.err + eps * a.mag), eps, a.dt
        if kind == "flip":
            return f"flip({a.name}, dim={axis})", a.ref.flip(dim), a.mag, a.err, a.eps, a.dt
        if kind == "sort":
            desc = r.random() < 0.5
            return f"sort({a.name}, dim={axis}, descending={desc})", a.ref.sort(dim, descending=desc).values, a.mag, \
                a.err, a.eps, a.dt
        if kind == "trans" and self.BM == self.BN:
            return f"trans({a.name})", a.ref.transpose(2, 3), a.mag, a.err, a.eps, a.dt
        if kind == "pairs" and self.BN >= 2:  # the halves of each column pair swapped: a layout's register split
            h = self.fresh()
            self.line(f"{h}a, {h}b = split(reshape({a.name}, [{self.BM}, {self.BN // 2}, 2]))")
            ref = a.ref.unflatten(3, (self.BN // 2, 2)).flip(4).flatten(3)
            return f"reshape(join({h}b, {h}a), [{self.BM}, {self.BN}])", ref, a.mag, a.err, a.eps, a.dt
        exact = [v for v in vals if v.err == 0]  # loaded values: an index or a bit of a computed one could be another
        if kind == "arg" and exact:  # the first among ties, as torch's
            c, op = r.choice(exact), r.choice(["argmax", "argmin"])
            index = (c.ref.argmax if op == "argmax" else c.ref.argmin)(dim, keepdim=True).double()
            broadcast = "[None, :]" if axis == 0 else "[:, None]"
            mag = n + b.mag
            return f"{op}({c.name}, axis={axis}){broadcast} + {b.name}", index + b.ref, mag, b.err + eps * mag, eps, \
                promote("i32", b.dt)
        if kind == "ints" and [v for v in exact if v.dt == "i32"]:  # C's truncating // and %, shifts, bits
            c, m = r.choice([v for v in exact if v.dt == "i32"]), r.randint(1, 5)
            op = r.choice(["//", "%", "<<", ">>", "&", "|", "^"])
            x = c.ref.long()
            ref = {"//": lambda: torch.div(x, m, rounding_mode="trunc"), "%": lambda: torch.fmod(x, m),
                   "<<": lambda: x << m, ">>": lambda: x >> m, "&": lambda: x & m, "|": lambda: x | m,
                   "^": lambda: x ^ m}[op]()
            return f"{c.name} {op} {m}", ref.double(), c.mag * 2**m if op == "<<" else c.mag + m, 0.0, 0.0, "i32"
        if kind == "all":  # a reduction to one value, broadcast
            op = r.choice(["sum", "max", "min"])
            ref = {"sum": lambda t: t.sum((2, 3), keepdim=True), "max": lambda t: t.amax((2, 3), keepdim=True),
                   "min": lambda t: t.amin((2, 3), keepdim=True)}[op](a.ref)
            size = self.BM * self.BN if op == "sum" else 1
            mag = size * a.mag + b.mag
            err = size * (a.err + eps * a.mag) + b.err + eps * mag
            return f"{op}({a.name}) + {b.name}", ref + b.ref, mag, err, eps, dt
        if kind == "cat":  # two tiles one after the other, then summed back over the new outer dim
            c = self.fresh()
            self.line(f"{c} = reshape(cat({a.name}, {b.name}, dim={axis}), [2, {self.BM}, {self.BN}])" if axis == 0 else
                      f"{c} = trans(reshape(cat({a.name}, {b.name}, dim=1), [{self.BM}, 2, {self.BN}]), 1, 0, 2)")
            mag = a.mag + b.mag
            return f"sum({c}, axis=0)", a.ref + b.ref, mag, a.err + b.err + eps * mag, eps, dt
        if kind == "groups" and self.BN >= 4:  # the max of each group of 4 columns, broadcast over it: 3-D layouts
            g = self.BN // 4
            ref = a.ref.unflatten(3, (g, 4)).amax(4, keepdim=True).expand(-1, -1, -1, g, 4).flatten(3)
            return f"reshape(broadcast_to(max(reshape({a.name}, [{self.BM}, {g}, 4]), axis=2)[:, :, None], " \
                f"[{self.BM}, {g}, 4]), [{self.BM}, {self.BN}])", ref, a.mag, a.err, a.eps, a.dt
        if kind == "dots" and self.BM * self.BM <= 512 * self.warps:  # (a @ b^T) @ c, as attention's two products
            to = r.choice(["f16", "bf16", "f32"])
            c = r.choice(vals)
            if to == "f16" and max(a.mag, b.mag, c.mag, self.BN * a.mag * b.mag) > LIMIT["f16"]:
                return None
            cast, prec = f".to({to})", ', input_precision="ieee"' if to == "f32" else ""
            x, y, z = (v.ref.to(TORCH[to]).double() for v in (a, b, c))
            ep = max(eps, c.eps, EPS[to])
            smag = self.BN * a.mag * b.mag
            serr = self.BN * (a.mag * b.err + b.mag * a.err + 2 * ep * a.mag * b.mag)
            s = self.fresh()
            self.line(f"{s} = dot({a.name}{cast}, trans({b.name}){cast}{prec})")
            mag = self.BM * smag * c.mag
            err = self.BM * (smag * c.err + c.mag * serr + 2 * ep * smag * c.mag)
            return f"dot({s}{cast}, {c.name}{cast}{prec})", (x @ y.transpose(2, 3)).to(TORCH[to]).double() @ z, mag, \
                err, ep, "f32"
        return None

    def build(self) -> tuple[str, list, Value, str]:
        r = self.r
        vals = [self.leaf() for _ in range(r.randint(1, 3))]
        for _ in range(r.randint(3, 9)):
            vals.append(self.step(vals))
        out = vals[-1]
        for v in vals[:-1]:  # every value reaches the output: a step nothing reads could be wrong unseen
            if v.name not in self.read:
                x = out if out.mag + v.mag <= LIMIT.get(promote(out.dt, v.dt), math.inf) else \
                    self.emit(f"{out.name}.to(f32)", out.ref, out.mag, out.err, out.eps, "f32")  # not to overflow
                mag = x.mag + v.mag
                out = self.emit(f"{x.name} + {v.name}", x.ref + v.ref, mag, x.err + v.err + max(x.eps, v.eps) * mag,
                                max(x.eps, v.eps), promote(x.dt, v.dt))
        odt = r.choice(["f32", "f16"]) if out.mag < LIMIT["f16"] else "f32"
        addr = self.tensor_param(torch.full((self.R, self.C), float("nan"), dtype=TORCH[odt], device=self.device))
        self.lines.append(f"    store({addr}, {out.name}, mask=mask)")
        head = f"kernel k({', '.join(self.params)}, R, C, BM: constexpr, BN: constexpr):"
        body = ["    rm = program_id(0) * BM + arange(0, BM)", "    rn = program_id(1) * BN + arange(0, BN)",
                "    mask = (rm[:, None] < R) & (rn[None, :] < C)"]
        out.err += EPS[odt] * out.mag
        return "\n".join([head, *body, *self.lines]) + "\n", self.args + [self.R, self.C], out, odt


def run_one(r: random.Random, device: str) -> str:
    p = Program(r, device)
    source, args, out, odt = p.build()
    layouts = " ".join(f"{tuple(t.stride())}+{t.storage_offset()}" for t in args if isinstance(t, torch.Tensor))
    what = f"R={p.R} C={p.C} BM={p.BM} BN={p.BN} num_warps={p.warps} out {odt}, strides+offsets {layouts}:\n{source}"
    o, kernel, meta = args[-5], newtc.compile(source, "random.nk").k, dict(BM=p.BM, BN=p.BN, num_warps=p.warps)
    if device == "cpu":  # the GPU's code too, to a cubin (NVRTC and ptxas run without a GPU)
        kernel.ptx(*args, arch=r.choice(["sm_80", "sm_90a"]), **meta)
    kernel[(p.PM, p.PN)](*args, **meta)
    ref = out.ref.permute(0, 2, 1, 3).reshape(p.PM * p.BM, p.PN * p.BN)[:p.R, :p.C]
    got = o.double().cpu()
    assert not got.isnan().any(), f"unwritten (NaN) elements\n{what}"
    bound = 4 * out.err + 1e-30
    worst = (got - ref).abs().max().item()
    assert worst <= bound, f"error {worst:.3g} beyond its bound {bound:.3g} (magnitude {out.mag:.3g})\n{what}"
    return what


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_random_kernels(device, monkeypatch):
    monkeypatch.setenv("NEWT_VERIFY", "1")  # the IR verifier after every pass, the interpreter's types per op
    r = random.Random(f"{SEED}-{device}")
    for i in range(int(COUNT or (30 if device == "cpu" else 120))):
        try:
            run_one(r, device)
        except AssertionError as e:
            raise AssertionError(f"program {i} of NEWT_RANDOM_SEED={SEED} on {device}: {e}") from None
