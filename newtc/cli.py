"""The `newtc` command: compile a `.nk` kernel to IR, CUDA C++, PTX, a cubin or SASS without Python code."""
from __future__ import annotations

import argparse
import ast as pyast
import contextlib
import dataclasses
import os
import re
import sys
from pathlib import Path

from . import ast as A
from . import check, compiler, ir, nvrtc, syntax
from .compiler import Spec
from .errors import NkError
from .types import DTYPES, parse_type

EPILOG = """\
examples:
  newtc stdlib/add.nk --sig x=*f32,y=*f32,out=*f32,n=i32 -D BLOCK=1024             # CUDA C++
  newtc stdlib/add.nk --sig x=*f32,y=*f32,out=*f32,n=i32 -D BLOCK=1024 --emit sass  # SASS for sm_90a
  newtc stdlib/add.nk --sig x=*f16,y=*f16,out=*f16,n=i32 -D BLOCK=512 --emit cubin -o add.cubin
  cat k.nk | newtc - -k scale --sig x=*f32,n=i32 -D BLOCK=256 --emit ir
  newtc stdlib/add.nk --sig x=*f32,y=*f32,out=*f32,n=i32 -D BLOCK=1024 --aligned all --emit sass
  newtc --check stdlib/add.nk                                                      # diagnostics only
  newtc lsp                                 # the language server for editors, over stdio (needs newt[lsp])

exit status: 0 ok, 1 an error in the input (shown as FILE:LINE:COL diagnostics), 2 bad usage.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="newtc", description=__doc__.split(":", 1)[1].strip(), epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.nk", help="the source file; '-' reads standard input")
    p.add_argument("-k", "--kernel", help="the kernel to compile (default: the file's only kernel)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="a constexpr parameter: a Python literal (1024, 0.5, True, 'sum') or a dtype (f16)")
    p.add_argument("--sig", action="append", default=[], metavar="NAME=TYPE,...",
                   help="types of runtime parameters, as in the language: *f32, i32, ...")
    p.add_argument("--aligned", default="", metavar="NAME,...|all",
                   help="parameters to specialize as 16-byte aligned pointers / multiples of 16, as a launch "
                        "with such arguments would (default: none; 'all' for every runtime parameter)")
    p.add_argument("--eights", default="", metavar="NAME,...",
                   help="int parameters to specialize as odd multiples of 8, as a launch with rows of 1000 halves "
                        "would (16-byte rows of 16-bit elements)")
    p.add_argument("--ones", default="", metavar="NAME,...",
                   help="int parameters to specialize as equal to 1, as a launch with unit strides would")
    p.add_argument("--positive", default="", metavar="NAME,...",
                   help="int parameters to specialize as above 0, as a launch with sizes and strides would (TMA "
                        "copies need their tensor's sizes and row stride so)")
    p.add_argument("--num-warps", type=count("a power of two from 1 to 32", lambda n: n in (1, 2, 4, 8, 16, 32)),
                   default=4, metavar="N", help="warps per program: 1, 2, 4, 8, 16 or 32 (default: 4)")
    p.add_argument("--num-stages", type=count(f"from 1 to {check.MAX_STAGES}", lambda n: 1 <= n <= check.MAX_STAGES),
                   default=1, metavar="N",
                   help="slots of the cp.async ring feeding dot in runtime loops (default: 1)")
    p.add_argument("--num-ctas", type=count("1, 2, 4 or 8", lambda n: n in check.CLUSTERS), default=1, metavar="N",
                   help="CTAs a cluster (sm_90): programs launched together that may share TMA copies (default: 1)")
    p.add_argument("--maxnreg", type=count("from 16 to 255", lambda n: 16 <= n <= 255), default=0, metavar="N",
                   help="registers a thread may use at most, as Triton's maxnreg (default: the compiler's choice)")
    p.add_argument("--arch", default="sm_90a", type=arch,
                   help="GPU architecture for ptx/cubin/sass: sm_XY[a], or compute_XY[a] for PTX only (default: sm_90a)")
    p.add_argument("--emit", choices=["ast", "ir", "cuda", "ptx", "cubin", "sass"], default="cuda",
                   help="what to produce (default: cuda)")
    p.add_argument("-o", "--output", metavar="PATH", help="write here instead of standard output")
    p.add_argument("--check", action="store_true",
                   help="only report diagnostics: parse, and check every kernel whose -D/--sig are complete")
    return p


def count(what: str, ok):
    """An argparse type: an integer that is `what`."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or not ok(n):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return n
    return parse


def arch(text: str) -> str:
    if not re.fullmatch(r"(sm|compute)_\d{2,3}[af]?", text):
        raise argparse.ArgumentTypeError(f"expected sm_XY or compute_XY (e.g. sm_90a, sm_80), got {text!r}")
    return text


def parse_defines(p, items) -> dict:
    out = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name.isidentifier():
            p.error(f"-D expects NAME=VALUE, got {item!r}")
        try:
            out[name] = DTYPES[text] if text in DTYPES else pyast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = None
        if not isinstance(out[name], (int, float, bool, str)) and out[name] not in DTYPES.values():
            p.error(f"-D {name}: {text!r} is not an int, float, bool, quoted string or dtype literal")
    return out


def parse_sig(p, items) -> dict:
    out = {}
    for part in (s for item in items for s in item.split(",") if s.strip()):
        name, eq, text = part.partition("=")
        t = parse_type(text) if eq else None
        if t is None:
            p.error(f"--sig expects NAME=TYPE with TYPE one of {', '.join(DTYPES)} or a pointer such as *f32, "
                    f"got {part.strip()!r}")
        out[name.strip()] = t
    return out


def specialization(d: A.FuncDef, sig: dict, defines: dict):
    """(sig, constexprs, params lacking a --sig type, constexprs lacking a -D value) for one kernel."""
    sig, no_sig, no_value = dict(sig), [], []
    for p in d.params:
        if check.is_constexpr_annot(p.annotation):
            if p.name not in defines and p.default is None:
                no_value.append(p)
            continue
        fixed = check.annotation_type(p.annotation)
        if fixed is not None:
            sig.setdefault(p.name, fixed)
        if p.name not in sig:
            no_sig.append(p)
    return sig, {k: v for k, v in defines.items() if any(p.name == k for p in d.params)}, no_sig, no_value


def dump_ast(node, depth=0) -> str:
    """A readable AST: one line per statement (fields without spans), bodies indented."""
    def short(v):
        if dataclasses.is_dataclass(v):
            fields = (f"{f.name}={short(getattr(v, f.name))}" for f in dataclasses.fields(v)
                      if f.name not in ("span", "body", "orelse", "source", "defs"))
            return f"{type(v).__name__}({', '.join(fields)})"
        return f"[{', '.join(map(short, v))}]" if isinstance(v, (list, tuple)) else repr(v)
    pad, lines = "  " * depth, []
    for n in node.defs if isinstance(node, A.Module) else node:
        lines.append(f"{pad}{short(n)}" + (f"  # {n.span.line}" if hasattr(n, "span") else ""))
        for label in ("body", "orelse"):
            if getattr(n, label, None):
                lines += [f"{pad}  {label}:", dump_ast(getattr(n, label), depth + 2)]
    return "\n".join(lines)


def emit(args, module: A.Module, filename: str):
    if args.emit == "ast":
        return dump_ast(module) + "\n"
    (d,) = selected(args, module, filename)
    sig, consts, no_sig, no_value = specialization(d, args.sig, args.defines)
    if no_sig:
        p = no_sig[0]
        raise NkError(f"no type for runtime parameter '{p.name}' of kernel '{d.name}'", p.span,
                      f"pass --sig {p.name}=*f32 for a pointer or --sig {p.name}=i32 for a scalar")
    if no_value:
        p = no_value[0]
        raise NkError(f"missing constexpr '{p.name}' for kernel '{d.name}'", p.span, f"pass -D {p.name}=VALUE")
    aligned = frozenset(sig) if args.aligned == "all" else frozenset(filter(None, args.aligned.split(",")))
    eights, ones, positive = (tuple(filter(None, n.split(","))) for n in (args.eights, args.ones, args.positive))
    spec = Spec.of(sig, consts, num_warps=args.num_warps, num_stages=args.num_stages, num_ctas=args.num_ctas,
                   maxnreg=args.maxnreg, aligned=aligned, eights=eights, ones=ones, positive=positive, arch=args.arch)
    return stage_text(module, d.name, spec, args.emit)


def stage_text(module: A.Module, name: str, spec: Spec, emit: str):
    """What --emit ir|cuda|ptx|cubin|sass gives for one specialization (bytes for a cubin); also `newtc lsp`'s."""
    result = compiler.compile(module, name, spec, until={"ir": "ir", "cuda": "cuda"}.get(emit, "cubin"))
    if emit == "ir":
        return ir.print_kernel(result.kernel)
    if emit == "cuda":
        return result.cuda.source
    out = result.binary
    if emit == "ptx":
        if out.ptx is None:
            raise NkError("this NVRTC kept no PTX for the program", None, "try --arch compute_90a")
        return out.ptx
    return out.cubin if emit == "cubin" else nvrtc.disassemble(out.cubin)


def selected(args, module: A.Module, filename: str) -> list[A.FuncDef]:
    """The kernels -k picks (all of them for --check without -k), after checking that every name given to
    --sig, -D and --aligned is a parameter of one of them, of the right kind."""
    kernels = [d for d in module.defs if d.kind == "kernel"]
    names = ", ".join(d.name for d in kernels) or "none"
    if args.kernel is None and len(kernels) != 1 and not args.check:
        raise NkError(f"{filename} has {len(kernels)} kernels; pick one with -k", None, f"kernels: {names}")
    chosen = [d for d in kernels if args.kernel in (None, d.name)]
    if not chosen and args.kernel is not None:
        raise NkError(f"no kernel named '{args.kernel}' in {filename}", None, f"kernels: {names}")
    params = {p.name: p for d in chosen for p in d.params}
    aligned = set(filter(None, args.aligned.split(","))) - {"all"}
    eights, ones, positive = (set(filter(None, names.split(","))) for names in (args.eights, args.ones, args.positive))
    for flag, given in (("--sig", args.sig), ("-D", args.defines), ("--aligned", aligned), ("--eights", eights),
                        ("--ones", ones), ("--positive", positive)):
        for name in given:
            p = params.get(name)
            if p is None:
                one = chosen[0] if len(chosen) == 1 else None
                owner = f"kernel '{one.name}' has no" if one else "no kernel checked here has a"
                raise NkError(f"{flag} {name}: {owner} parameter '{name}'", one.span if one else None,
                              f"parameters: {', '.join(params) or 'none'}")
            if check.is_constexpr_annot(p.annotation) != (flag == "-D"):
                kind, right = ("constexpr", f"-D {name}=VALUE") if flag != "-D" else ("runtime", f"--sig {name}=TYPE")
                raise NkError(f"{flag} {name}: '{name}' is a {kind} parameter", p.span, f"give it with {right}")
    return chosen


def check_all(args, module: A.Module, filename: str) -> list[NkError]:
    errors = []
    check.check_names(module)
    for d in selected(args, module, filename):
        sig, consts, no_sig, no_value = specialization(d, args.sig, args.defines)
        if no_sig or no_value:
            need = [f"{flag} for {', '.join(p.name for p in ps)}"
                    for flag, ps in (("--sig", no_sig), ("-D", no_value)) if ps]
            print(f"newtc: note: kernel '{d.name}' parsed, not checked: it needs {' and '.join(need)}", file=sys.stderr)
            continue
        try:
            check.check(module, d.name, Spec.of(sig, consts, num_warps=args.num_warps, num_stages=args.num_stages))
        except NkError as err:
            errors.append(err)
    return errors


def main(argv=None) -> int:
    """Run the command; returns the exit status (argparse's usage errors and --help included)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            if argv[:1] == ["lsp"]:  # `newtc lsp`: the language server (optional dependencies, imported on demand)
                from . import lsp
                return lsp.main(argv[1:])
            status = run(argv)
        except SystemExit as e:  # argparse: 2 for bad usage, 0 for --help
            status = e.code if isinstance(e.code, int) else 1
        if sys.stdout is not None:
            sys.stdout.flush()  # here, where a full disk or a closed pipe can still be reported
        return status
    except OSError as e:
        print(f"newtc: cannot write the output: {e.strerror or e}", file=sys.stderr)
        with contextlib.suppress(OSError, ValueError, AttributeError):  # nothing left to flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def read_input(path: str) -> bytes:
    if path != "-":
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise NkError(f"cannot read {path}: {e.strerror}") from None
    if sys.stdin is None or sys.stdin.closed:
        raise NkError("cannot read the standard input: it is closed")
    try:
        return sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    except OSError as e:
        raise NkError(f"cannot read the standard input: {e.strerror or e}") from None


def run(argv) -> int:
    p = parser()
    args = p.parse_args(argv)
    args.sig, args.defines = parse_sig(p, args.sig), parse_defines(p, args.defines)
    if args.emit in ("cubin", "sass") and args.arch.startswith("compute_") and not args.check:
        p.error(f"--arch {args.arch} is virtual: NVRTC makes PTX only; --emit {args.emit} needs sm_XY")
    if sys.stdout is None and not args.output and not args.check:
        p.error("the standard output is closed: write to a file with -o PATH")
    if args.emit == "cubin" and not args.output and not args.check and sys.stdout.isatty():
        p.error("a cubin is binary: write it to a file with -o PATH (or redirect standard output)")
    try:
        filename = "<stdin>" if args.file == "-" else args.file
        module = syntax.parse_cached(syntax.decode(read_input(args.file), filename), filename)
        if args.check:
            errors = check_all(args, module, filename)
            print("\n".join(err.render() for err in errors), file=sys.stderr, end="\n" if errors else "")
            return 1 if errors else 0
        result = emit(args, module, filename)
        if args.output:
            try:
                Path(args.output).write_bytes(result if isinstance(result, bytes) else result.encode())
            except OSError as e:
                raise NkError(f"cannot write {args.output}: {e.strerror}") from None
        elif isinstance(result, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(result)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(result if result.endswith("\n") else result + "\n")
        return 0
    except NkError as err:
        print(err.render(), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
