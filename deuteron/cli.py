"""The `deuteron` command: print the newt kernel a tile program becomes for given arguments (or a later stage)."""
from __future__ import annotations

import argparse
import ast as pyast
import json
import re
import sys

import torch

from newtc import ir, nvrtc
from newtc.errors import NkError

from .lang import TORCH
from .program import load

EPILOG = """\
examples:
  deuteron examples/tiles.nk -k matmul --sig 'x=f16[4096,4096], y=f16[4096,4096]'
  deuteron examples/tiles.nk -k softmax --sig 'x=f32[8192,1000]' --config '{"block_tm": 2, "num_warps": 8}'
  deuteron examples/tiles.nk -k layernorm --sig 'x=f16[4096,4096], w=f16[4096], b=f16[4096], eps=1e-5' --emit cuda

--sig gives each argument: a tensor as DTYPE[SIZES] (contiguous), anything else as a Python literal.
Without --config, the default config; a partial --config replaces only the values it names.
exit status: 0 ok, 1 an error in the input (shown as FILE:LINE:COL diagnostics), 2 bad usage.
"""


def parse_sig(p, items) -> dict:
    out = {}
    for part in (s.strip() for item in items for s in re.split(r",(?![^\[]*\])", item) if s.strip()):
        name, eq, text = part.partition("=")
        m = re.fullmatch(r"(\w+)\[([\d,\s]*)\]", text.strip())
        try:
            if m and m[1] in TORCH:
                shape = [int(s) for s in m[2].split(",") if s.strip()]
                out[name.strip()] = torch.empty(shape, dtype=TORCH[m[1]], device="meta")
            else:
                out[name.strip()] = pyast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            eq = ""
        if not eq:
            p.error(f"--sig expects NAME=DTYPE[SIZES] (e.g. x=f16[128,64]) or NAME=LITERAL, got {part!r}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="deuteron", description=__doc__.split(":", 1)[1].strip(), epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.nk")
    p.add_argument("-k", "--kernel", metavar="NAME", help="the tile program (default: the file's only one)")
    p.add_argument("--sig", action="append", default=[], metavar="NAME=TYPE,...", help="the call's arguments")
    p.add_argument("--config", metavar="JSON", help="the config, as the autotuner prints it")
    p.add_argument("--emit", choices=["nk", "ir", "cuda", "ptx", "sass"], default="nk", help="what to print (default: nk)")
    p.add_argument("--arch", default="sm_90a", help="GPU architecture for ptx/sass (default: sm_90a)")
    try:
        args = p.parse_args(argv)
        kwargs = parse_sig(p, args.sig)
        config = json.loads(args.config) if args.config else {}
        if not isinstance(config, dict):
            p.error("--config takes a JSON object")
    except json.JSONDecodeError as e:
        p.error(f"--config is not JSON: {e}")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    try:
        prog = load(args.file)
        names = ", ".join(prog.fns) or "none"
        if args.kernel is None and len(prog.fns) != 1:
            raise NkError(f"{args.file} has {len(prog.fns)} tile programs; pick one with -k", None, f"tile programs: {names}")
        fn = prog.fns.get(args.kernel) if args.kernel else next(iter(prog.fns.values()))
        if fn is None:
            raise NkError(f"no tile program named '{args.kernel}' in {args.file}", None, f"tile programs: {names}")
        config = {**fn.space(**kwargs).default(), **config}
        if args.emit == "nk":
            out = fn.source(config=config, **kwargs)
        else:
            stage = {"ir": "ir", "cuda": "cuda"}.get(args.emit, "cubin")
            outs = [launch.compile(stage, args.arch) for launch in fn.plan((), kwargs, config)[1]]
            show = {"ir": lambda r: ir.print_kernel(r.kernel), "cuda": lambda r: r.cuda.source,
                    "ptx": lambda r: r.binary.ptx, "sass": lambda r: nvrtc.disassemble(r.binary.cubin)}[args.emit]
            out = "\n".join(map(show, outs))
        sys.stdout.write(out if out.endswith("\n") else out + "\n")
        return 0
    except NkError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except OSError as e:
        print(f"deuteron: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
