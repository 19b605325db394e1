"""Tile programs as Python callables: the host code, lowering on a miss, launch, and the config to use.

    prog = deuteron.load("examples/tiles.nk")
    out = prog.matmul(x, y)                       # tuned once per shape bucket, then from the disk store
    print(prog.matmul.source(x, y, config=cfg))   # the generated .nk
"""
import os
from pathlib import Path
from typing import NamedTuple

import torch

from newtc import ast as A
from newtc import cache
from newtc.cli import stage_text
from newtc.errors import flag
from newtc.syntax import parse_cached as parsed

from . import lang, lower, search, store


def signature(args, kwargs) -> tuple:
    """What the host code and the lowering can see of a call's arguments (not tensor data, not float values)."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return a.dtype, a.shape, a.stride(), a.device, a.data_ptr() % 16 == 0
        return type(a), None if isinstance(a, float) else a
    return (*map(one, args), *((k, one(v)) for k, v in kwargs.items()))


class Launch(NamedTuple):
    """One kernel launch of a call, its arguments bound; calling it launches."""
    low: lower.Lowered
    args: list

    def __call__(self):
        self.low.run(self.low.kernel[(self.low.grid,)], *self.args, **self.low.meta)

    def compile(self, until: str = "cubin", arch: str = "sm_90a"):
        """newt's pipeline output (newtc.compiler.Output) for this launch; no GPU needed."""
        return self.low.run(self.low.kernel.output, self.args, self.low.meta, until, arch)

    def stage(self, emit: str, arch: str = "sm_90a") -> str:
        """What `newtc --emit` prints for this launch: ir, cuda, ptx or sass."""
        kernel = self.low.kernel
        return self.low.run(stage_text, kernel.module.ast, kernel.name, kernel.specialize(self.args, self.low.meta, arch), emit)


class Program:
    """A `.nk` file of tile programs; each `tile` definition is an attribute."""

    def __init__(self, text: str, filename: str = "<string>"):
        self.filename, self.ast = filename, parsed(text, filename)
        self.defs = {d.name: d for d in self.ast.defs if d.kind == "def"}
        self.fns = {d.name: TileFunction(self, d) for d in self.ast.defs if d.kind == "tile"}

    def __getattr__(self, name: str) -> "TileFunction":
        if name in self.__dict__.get("fns", {}):
            return self.fns[name]
        raise AttributeError(f"{self.__dict__.get('filename')} has no tile program '{name}'")


class TileFunction:
    def __init__(self, program: Program, d: A.FuncDef):
        self.program, self.defn, self.name = program, d, d.name
        self.tunables = lang.Interp(program.defs, None).tunables(d)
        self.constexprs = {p.name for p in d.params if lang.is_constexpr_annot(p.annotation)} | set(self.tunables)
        lines = program.ast.source.splitlines()  # a stored config is valid for this text and the file's helpers
        self.hash = cache.key(*("\n".join(lines[x.span.line - 1:x.span.end_line]) for x in [d, *program.defs.values()]))[:16]
        self.lowered, self.kernels, self.chosen, self.pinned, self.tuned = {}, {}, {}, None, {}

    def __repr__(self) -> str:
        return f"<deuteron tile program {self.name} from {self.program.filename}>"

    def __call__(self, *args, config: dict | None = None, eager: bool | None = None, **kwargs):
        """Run on torch tensors; eager=True (or DEUTERON_EAGER=1) runs the eager oracle instead."""
        if eager or eager is None and flag("DEUTERON_EAGER"):
            return self.eager(*args, **kwargs)
        result, plan = self.plan(args, kwargs, config or self.config(*args, **kwargs))
        for launch in plan:
            launch()
        return result

    def eager(self, *args, **kwargs):
        """The tile program run by torch, each tile a whole slice: the oracle."""
        return lang.Interp(self.program.defs, lang.device_of(args, kwargs)).call(self.defn, args, kwargs)

    def source(self, *args, config: dict | None = None, **kwargs) -> str:
        """The generated `.nk` text of this call's kernels."""
        return "\n".join(launch.low.text for launch in self.plan(args, kwargs, config or self.config(*args, **kwargs))[1])

    def plan(self, args, kwargs, config: dict, poison: bool = False):
        """Run the host code: (the result, the launches it makes), nothing launched yet."""
        launches, call = [], (tuple(sorted(config.items())), signature(args, kwargs))  # the same call lowers the same way

        def grid(loop, env):
            key = (id(loop), call, tuple(env.get(n) for n in sorted(self.constexprs)))  # and floats passed as constexprs
            if key not in self.lowered:
                name = f"{self.name}_{len(launches)}" if launches else self.name  # a later grid of the call: name_1, ...
                self.lowered[key] = lower.Lowered(self, env, interp, config, name, loop)
            launches.append(Launch(self.lowered[key], self.lowered[key].args(env)))

        interp = lang.Interp(self.program.defs, lang.device_of(args, kwargs), grid, config, poison)
        return interp.call(self.defn, args, kwargs), launches

    def space(self, *args, **kwargs) -> search.Space:
        """The search space of this specialization, derived from what the lowering sees."""
        return search.Space([launch.low for launch in self.plan(args, kwargs, {})[1]], self.tunables)

    def pin(self, config: dict | None) -> None:
        """Use this config for every call (None: back to tuning)."""
        self.pinned = config

    def config(self, *args, **kwargs) -> dict:
        """The config of a call: pinned, chosen before, stored on disk, or tuned now (CUDA tensors only; the
        default config on the CPU or under DEUTERON_AUTOTUNE=0)."""
        if self.pinned is not None:
            return self.pinned
        sig = signature(args, kwargs)
        if sig not in self.chosen:
            space, cuda = self.space(*args, **kwargs), lang.device_of(args, kwargs).type == "cuda"
            stored = store.load(store.key(self, args, kwargs), space) if cuda else None
            tune = cuda and stored is None and ("DEUTERON_AUTOTUNE" not in os.environ or flag("DEUTERON_AUTOTUNE"))
            self.chosen[sig] = self.tune(*args, **kwargs) if tune else stored or space.default()
        return self.chosen[sig]

    def tune(self, *args, effort: str = "quick", budget: float | None = None, **kwargs) -> dict:
        """Autotune for these arguments (CUDA tensors), store the winner and return it; `self.tuned` keeps the
        session's numbers (best ms, configs tried and rejected, seconds)."""
        from . import tune
        space = self.space(*args, **kwargs)
        if effort == "none":
            return space.default()
        config, self.tuned = tune.tune(self, args, kwargs, space, effort, budget)
        store.save(store.key(self, args, kwargs), config, **self.tuned)
        self.chosen[signature(args, kwargs)] = config
        return config


def load(path) -> Program:
    return Program(Path(path).read_text(), str(path))


compile = Program  # deuteron.compile(text, filename): the tile programs of a text
