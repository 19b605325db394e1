"""NVRTC through ctypes: find the library at run time, compile CUDA C++ to a cubin, disassemble it."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

from .errors import NkError

# --use_fast_math is left out on purpose: it changes results (flush-to-zero, approximate division).
DEFAULT_OPTIONS = ("--std=c++17", "-lineinfo")

_SIGNATURES = {
    "nvrtcVersion": (POINTER(c_int), POINTER(c_int)),
    "nvrtcCreateProgram": (POINTER(c_void_p), c_char_p, c_char_p, c_int, c_void_p, c_void_p),
    "nvrtcDestroyProgram": (POINTER(c_void_p),),
    "nvrtcCompileProgram": (c_void_p, c_int, POINTER(c_char_p)),
    "nvrtcGetProgramLogSize": (c_void_p, POINTER(c_size_t)),
    "nvrtcGetProgramLog": (c_void_p, c_char_p),
    "nvrtcGetCUBINSize": (c_void_p, POINTER(c_size_t)),
    "nvrtcGetCUBIN": (c_void_p, c_char_p),
    "nvrtcGetPTXSize": (c_void_p, POINTER(c_size_t)),
    "nvrtcGetPTX": (c_void_p, c_char_p),
    "nvrtcGetErrorString": (c_int,),
}
_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


class NvrtcError(NkError):
    """NVRTC refused a program. `log` is NVRTC's full log, `entries` its located lines (parse_log)."""

    def __init__(self, message: str, log: str = "", hint: str = ""):
        self.log = log
        self.entries = parse_log(log)
        super().__init__(f"{message}\n{log.rstrip()}" if log.strip() else message, hint=hint)


@dataclass(frozen=True)
class Compiled:
    cubin: bytes  # empty when `arch` is a virtual compute_XX architecture
    ptx: str | None  # the PTX NVRTC made on the way, None if this NVRTC does not keep it
    log: str  # warnings of a successful compile; usually empty


class LogLine(NamedTuple):
    file: str
    line: int
    message: str  # as NVRTC wrote it, severity first: 'error: identifier "y" is undefined'


_LOG_LINE = re.compile(r"^(.+?)\((\d+)\): ((?:catastrophic error|error|warning|remark)\b.*)$", re.MULTILINE)


def parse_log(log: str) -> list[LogLine]:
    """The located diagnostics of an NVRTC log (`file(LINE): error: ...`); quoted source lines are skipped."""
    return [LogLine(m[1], int(m[2]), m[3].rstrip()) for m in _LOG_LINE.finditer(log)]


def _nvidia_dirs(sub: str) -> list[Path]:
    """`<pkg>/<sub>` inside the `nvidia` wheels' namespace package, CUDA 13's and NVRTC's own first."""
    spec = importlib.util.find_spec("nvidia")
    dirs: list[Path] = []
    for root in map(Path, (spec.submodule_search_locations or []) if spec else []):
        preferred = [root / "cu13" / sub, root / "cuda_nvrtc" / sub]
        dirs += [d for d in preferred if d.is_dir()]
        dirs += sorted(d for d in root.glob(f"*/{sub}") if d not in preferred)
    return dirs


def _so_version(path: Path) -> tuple[int, ...]:
    tail = path.name.partition(".so")[2]
    return tuple(int(x) for x in re.findall(r"\d+", tail))


def _candidates() -> tuple[list[Path], list[str]]:
    """Folders to search for libnvrtc.so*, then plain names for the dynamic loader's own search."""
    dirs = _nvidia_dirs("lib")
    if os.environ.get("CUDA_HOME"):
        dirs += [Path(os.environ["CUDA_HOME"]) / "lib64", Path(os.environ["CUDA_HOME"]) / "lib"]
    dirs.append(Path("/usr/local/cuda/lib64"))
    found = any(next(d.glob("libnvrtc.so*"), None) for d in dirs)  # find_library runs ldconfig and gcc: ~10 ms
    names = [] if found else [n for n in (ctypes.util.find_library("nvrtc"),) if n]
    return dirs, names + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


def _files(dirs: list[Path]) -> list[Path]:
    """The libnvrtc files in the folders, in the order they are tried: the newest version of a folder first."""
    return [f for d in dirs for f in sorted(d.glob("libnvrtc.so*"), key=_so_version, reverse=True)]


def _load() -> ctypes.CDLL:
    dirs, names = _candidates()
    failures = []
    for candidate in [*map(str, _files(dirs)), *names]:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as e:
            if os.sep in candidate:  # a file that exists but won't load is worth reporting
                failures.append(f"{candidate}: {e}")
            continue
        for fn, argtypes in _SIGNATURES.items():
            getattr(lib, fn).argtypes = argtypes
        lib.nvrtcGetErrorString.restype = c_char_p
        return lib
    looked = [f"{d}/libnvrtc.so*" for d in dirs] + [f"loader path: {', '.join(names)}"]
    raise NkError(
        "NVRTC not found",
        hint="looked in:\n    " + "\n    ".join(looked + failures)
        + "\n  install it with: pip install nvidia-cuda-nvrtc (or set CUDA_HOME to a CUDA toolkit)",
    )


def _nvrtc() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _load()
        return _lib


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc:
        raise NvrtcError(f"{what} failed: {lib.nvrtcGetErrorString(rc).decode()}")


def _read(lib: ctypes.CDLL, prog: c_void_p, what: str) -> bytes:
    """One of NVRTC's outputs ('ProgramLog', 'CUBIN', 'PTX') as bytes, NUL terminator dropped."""
    size = c_size_t()
    _check(lib, getattr(lib, f"nvrtcGet{what}Size")(prog, byref(size)), f"nvrtcGet{what}Size")
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, getattr(lib, f"nvrtcGet{what}")(prog, buf), f"nvrtcGet{what}")
    return buf.raw.rstrip(b"\0") if what != "CUBIN" else buf.raw


@functools.cache
def identity() -> str:
    """NVRTC in a cache key, known without loading it (a dlopen of tens of MB would be most of a warm process's
    first launch): the file it loads first, resolved, and its size; the version where only the loader finds it."""
    first = next(iter(_files(_candidates()[0])), None)
    return f"{first.resolve()} {first.stat().st_size}" if first else repr(version())


def version() -> tuple[int, int]:
    lib, major, minor = _nvrtc(), c_int(), c_int()
    _check(lib, lib.nvrtcVersion(byref(major), byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def compile(source: str, name: str, arch: str, options: Sequence[str] = ()) -> Compiled:
    """Compile CUDA C++ `source` (`name` is the file name NVRTC reports) for `arch` ('sm_90a', 'sm_80').

    Thread-safe: every call has its own NVRTC program, and ctypes lets go of the GIL while NVRTC works."""
    lib, prog = _nvrtc(), c_void_p()
    _check(lib, lib.nvrtcCreateProgram(byref(prog), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", *DEFAULT_OPTIONS, *options]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (c_char_p * len(opts))(*(o.encode() for o in opts)))
        log = _read(lib, prog, "ProgramLog").decode(errors="replace")
        if rc:
            raise NvrtcError(
                f"NVRTC could not compile {name} for {arch} ({lib.nvrtcGetErrorString(rc).decode()})",
                log, hint=f"options: {' '.join(opts)}")
        cubin = _read(lib, prog, "CUBIN")
        try:
            ptx: str | None = _read(lib, prog, "PTX").decode() or None
        except NvrtcError:
            ptx = None
        return Compiled(cubin, ptx, log)
    finally:
        lib.nvrtcDestroyProgram(byref(prog))


def _find_cuobjdump() -> Path:
    on_path = shutil.which("cuobjdump")
    dirs = _nvidia_dirs("bin")
    if os.environ.get("CUDA_HOME"):
        dirs.append(Path(os.environ["CUDA_HOME"]) / "bin")
    dirs.append(Path("/usr/local/cuda/bin"))
    for candidate in ([Path(on_path)] if on_path else []) + [d / "cuobjdump" for d in dirs]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise NkError("cuobjdump not found", hint="looked on PATH and in " + ", ".join(map(str, dirs))
                  + "\n  install it with: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin, as `cuobjdump -sass` prints it."""
    tool = _find_cuobjdump()
    # cuobjdump runs nvdisasm, which the wheels and toolkits put beside it
    env = {**os.environ, "PATH": f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with tempfile.TemporaryDirectory(prefix="newt-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([str(tool), "-sass", str(path)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise NkError("cuobjdump could not disassemble the cubin", hint=(done.stderr or done.stdout).strip())
    return done.stdout
