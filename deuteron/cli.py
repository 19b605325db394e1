"""The `deuteron` command: print the newt kernel a tile program becomes for given arguments, or a later stage."""
import argparse
import ast as pyast
import json
import re
import sys

import torch

from newtc.errors import NkError

from .lang import TORCH
from .program import load

EPILOG = """\
examples:
  deuteron examples/tiles.nk -k matmul --sig 'x=f16[4096,4096], y=f16[4096,4096]'
  deuteron examples/tiles.nk -k softmax --sig 'x=f32[8192,1000]' --config '{"block_tm": 2, "num_warps": 8}'
  deuteron examples/tiles.nk -k layernorm --sig 'x=f16[4096,4096], w=f16[4096], b=f16[4096], eps=1e-5' --emit cuda

exit status: 0 ok, 1 an error in the input (shown as FILE:LINE:COL diagnostics), 2 bad usage.
"""


def arguments(p, items) -> dict:
    out = {}
    for part in (s.strip() for item in items for s in re.split(r",(?![^\[]*\])", item) if s.strip()):
        name, _, text = (x.strip() for x in part.partition("="))
        m = re.fullmatch(r"(\w+)\[([\d,\s]*)\]", text)
        try:
            out[name] = torch.empty([int(s) for s in m[2].split(",") if s.strip()], dtype=TORCH[m[1]], device="meta") \
                if m and m[1] in TORCH else pyast.literal_eval(text)
        except (ValueError, SyntaxError):
            p.error(f"--sig expects NAME=DTYPE[SIZES] (e.g. x=f16[128,64]) or NAME=LITERAL, got {part!r}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="deuteron", description=__doc__.split(":", 1)[1].strip(), epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.nk")
    p.add_argument("-k", "--kernel", metavar="NAME", help="the tile program (default: the file's only one)")
    p.add_argument("--sig", action="append", default=[], metavar="NAME=TYPE,...",
                   help="the call's arguments: a tensor as DTYPE[SIZES] (contiguous), anything else as a Python literal")
    p.add_argument("--config", default="{}", metavar="JSON",
                   help="the JSON the autotuner prints; what it leaves out is the default config's")
    p.add_argument("--emit", choices=["nk", "ir", "cuda", "ptx", "sass"], default="nk", help="what to print (default: nk)")
    p.add_argument("--arch", default="sm_90a", help="GPU architecture for ptx/sass (default: sm_90a)")
    try:
        args = p.parse_args(argv)
        kwargs, config = arguments(p, args.sig), json.loads(args.config)
        if not isinstance(config, dict):
            p.error("--config takes a JSON object")
    except json.JSONDecodeError as e:
        return print(f"deuteron: --config is not JSON: {e}", file=sys.stderr) or 2
    except SystemExit as e:  # argparse: 2 for bad usage, 0 for --help
        return e.code if isinstance(e.code, int) else 1
    try:
        fns = load(args.file).fns
        fn = fns.get(args.kernel or (next(iter(fns)) if len(fns) == 1 else None))
        if fn is None:
            raise NkError(f"pick a tile program of {args.file} with -k", None, f"tile programs: {', '.join(fns) or 'none'}")
        plan = fn.plan((), kwargs, {**fn.space(**kwargs).default(), **config})[1]  # what --config leaves out: the default's
        texts = [launch.low.text if args.emit == "nk" else launch.stage(args.emit, args.arch) for launch in plan]
        print("\n".join(texts).rstrip("\n"))
        return 0
    except (NkError, OSError) as e:
        print(e.render() if isinstance(e, NkError) else f"deuteron: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 1
