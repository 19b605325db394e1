"""Kernel objects: specialization, the compile pipeline on a miss, and the cached launch path.

    mod = newtc.load("stdlib/add.nk")
    mod.add[grid](x, y, out, n, BLOCK=1024, num_warps=4)

A launch whose tensors are all on the CPU (or any launch under NEWT_INTERPRET=1) runs in the
interpreter; otherwise the specialization is compiled once (memory and disk cache) and launched
through the driver on the tensors' device and torch's current stream.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import hashlib
import json
import os
import pickle
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from . import ast as A
from . import cache, check, codegen, driver, interpret, ir, nvrtc, passes, syntax
from .errors import SOURCES, NkError, flag
from .types import DTYPES, Ptr, bool_, f32, i32, i64, torch_dtype_name

_SRC = Path(__file__).resolve().parent
# The compiler's own version: a hash of its source, so a changed compiler never reuses old binaries.
VERSION = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(_SRC.rglob("*.py")))).hexdigest()[:16]
_disk = None
INTERPRET = flag("NEWT_INTERPRET")  # read once: the launch path stays free of lookups


@contextlib.contextmanager
def gc_paused():
    """Compiling allocates many small objects; with torch loaded a full GC pass costs ~90 ms, so a first
    call would pay for several. Collection waits until the compile is done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def disk_cache() -> cache.DiskCache:
    global _disk
    if _disk is None:
        _disk = cache.DiskCache()
    return _disk


# ---- the pipeline, stage by stage --------------------------------------------------------------
def typed_ir(module: A.Module, name: str, sig: dict, constexprs: dict, num_warps: int, num_stages: int,
             idx64: bool, aligned: frozenset = frozenset()) -> ir.Kernel:
    SOURCES[module.file] = module.source  # diagnostics quote this module even if another reused its name
    k = check.check(module, name, sig, constexprs, num_warps, num_stages, idx64, aligned)  # check
    return passes.run_passes(k)  # passes


def cuda_source(k: ir.Kernel, filename: str) -> codegen.Generated:
    gen = codegen.generate(k, filename)  # codegen
    if flag("NEWT_DEBUG"):
        print(f"// ---- newt: {k.name} {k.constexprs} num_warps={k.num_warps}\n{gen.source}", file=sys.stderr)
    return gen


@dataclass
class Binary:
    name: str
    cubin: bytes
    threads: int
    smem_bytes: int
    param_types: list  # DType/Ptr per runtime parameter, in order

    def pack(self) -> bytes:
        meta = json.dumps({"name": self.name, "threads": self.threads, "smem": self.smem_bytes,
                           "params": [t.name for t in self.param_types]}).encode()
        return len(meta).to_bytes(4, "little") + meta + self.cubin

    @staticmethod
    def unpack(data: bytes) -> "Binary":
        n = int.from_bytes(data[:4], "little")
        meta = json.loads(data[4:4 + n])
        types = [Ptr(DTYPES[t[1:]]) if t.startswith("*") else DTYPES[t] for t in meta["params"]]
        return Binary(meta["name"], data[4 + n:], meta["threads"], meta["smem"], types)


# ---- argument classification --------------------------------------------------------------------
def _is_tensor(a) -> bool:
    return isinstance(a, Tensor)


def arg_type(a, big: bool):
    """The parameter type a launch argument gives (design section 3)."""
    if _is_tensor(a):
        name = torch_dtype_name(a.dtype)
        if not name:
            raise NkError(f"tensors of {a.dtype} are not supported")
        return Ptr(DTYPES[name])
    if isinstance(a, bool):
        return bool_
    if isinstance(a, int):
        return i64 if big or not -2**31 <= a < 2**31 else i32
    if isinstance(a, float):
        return f32
    raise NkError(f"cannot pass {type(a).__name__} to a kernel", hint="pass tensors, ints, floats or bools")


def aligned_params(params, args) -> frozenset:
    """Parameters whose value is a multiple of 16 (ints) or 16-byte aligned (tensors), as Triton specializes."""
    return frozenset(p.name for p, a in zip(params, args)
                     if (isinstance(a, Tensor) and a.data_ptr() % 16 == 0) or (type(a) is int and a % 16 == 0))


def needs_idx64(args) -> bool:
    """Offsets overflow 32 bits when a tensor spans 2 GiB or more: specialize to 64-bit indices."""
    return any(_is_tensor(a) and a.nbytes >= 2**31 for a in args)


# Each argument gets an 8-byte slot of one buffer, packed by a single struct call per launch.
SLOT = {"bool": "?7x", "i8": "b7x", "i16": "h6x", "i32": "i4x", "i64": "q", "u8": "B7x", "u16": "H6x",
        "u32": "I4x", "u64": "Q", "f32": "f4x", "f64": "d"}
WRONG_CONTEXT = (201, 400)  # CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE


class Launcher:
    """The per-signature launch path: the module, the function and the argument packing, built once."""

    def __init__(self, binary: Binary, device: int):
        """Built with the device's context current."""
        self.device = device
        self.func = driver.get_function(driver.load_module(binary.cubin), binary.name)
        if binary.smem_bytes > 48 * 1024:
            driver.set_max_dynamic_smem(self.func, binary.smem_bytes)
        self.threads = binary.threads
        self.smem = binary.smem_bytes
        self.packer = struct.Struct("<" + "".join("Q" if isinstance(t, Ptr) else SLOT[t.name]
                                                  for t in binary.param_types))
        self.nargs = len(binary.param_types)
        self.buffers: dict = {}  # thread id -> (buffer, pointer array): concurrent launches never share one
        self.cu_launch = driver.fast_launch_function()
        self.cu_func = ctypes.c_void_p(self.func)
        self.stream, self.cu_stream = None, None

    def buffer(self):
        buf = ctypes.create_string_buffer(max(8, self.packer.size))
        base = ctypes.addressof(buf)
        params = (ctypes.c_void_p * self.nargs)(*[base + 8 * k for k in range(self.nargs)])
        return self.buffers.setdefault(threading.get_ident(), (buf, params))

    def __call__(self, grid, values, stream: int) -> None:
        buf, params = self.buffers.get(threading.get_ident()) or self.buffer()
        self.packer.pack_into(buf, 0, *values)
        if stream != self.stream:
            self.stream, self.cu_stream = stream, ctypes.c_void_p(stream)
        try:
            rc = self.cu_launch(self.cu_func, *grid, self.threads, 1, 1, self.smem, self.cu_stream, params, None)
        except ctypes.ArgumentError:  # a grid of numpy or torch integers: only plain ints pass unconverted
            grid = tuple(map(int, grid))
            rc = self.cu_launch(self.cu_func, *grid, self.threads, 1, 1, self.smem, self.cu_stream, params, None)
        if rc in WRONG_CONTEXT:  # another device's context is current (or none): switch for this launch only
            previous = driver.current_context()
            driver.set_device(self.device)
            try:
                rc = self.cu_launch(self.cu_func, *grid, self.threads, 1, 1, self.smem, self.cu_stream, params, None)
            finally:
                driver.set_context(previous)  # torch reads its current device from the current context
        if rc:
            raise driver.CudaError("cuLaunchKernel", rc)


class Kernel:
    """A `.nk` kernel: call as kernel[grid](*args, **meta)."""

    def __init__(self, module: "Module", d: A.FuncDef):
        self.module = module
        self.name = d.name
        self.defn = d
        self.runtime = [p for p in d.params if not check.is_constexpr_annot(p.annotation)]
        self.constexpr_names = {p.name for p in d.params if check.is_constexpr_annot(p.annotation)}
        self.launchers: dict = {}
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<newt kernel {self.name} from {self.module.filename}>"

    def __getitem__(self, grid):
        return functools.partial(self.run, grid)  # C-level binding: one Python frame per launch

    # ---- specialization ----------------------------------------------------------------------
    def split_meta(self, args, meta):
        meta = dict(meta)
        num_warps = meta.pop("num_warps", 4)
        num_stages = meta.pop("num_stages", 1)
        unknown = set(meta) - self.constexpr_names
        if unknown:
            raise NkError(f"kernel '{self.name}' has no constexpr parameter '{sorted(unknown)[0]}'", self.defn.span,
                          f"constexpr parameters: {', '.join(sorted(self.constexpr_names)) or 'none'}")
        if len(args) != len(self.runtime):
            names = ", ".join(p.name for p in self.runtime)
            raise NkError(f"kernel '{self.name}' takes {len(self.runtime)} runtime arguments ({names}), got {len(args)}",
                          self.defn.span)
        return meta, num_warps, num_stages

    def specialize(self, args, meta):
        meta, num_warps, num_stages = self.split_meta(args, meta)
        idx64 = needs_idx64(args)
        sig = {p.name: arg_type(a, idx64) for p, a in zip(self.runtime, args)}
        return sig, meta, num_warps, num_stages, idx64, aligned_params(self.runtime, args)

    def typed(self, args, meta) -> ir.Kernel:
        sig, consts, nw, ns, idx64, aligned = self.specialize(args, meta)
        return typed_ir(self.module.ast, self.name, sig, consts, nw, ns, idx64, aligned)

    # ---- the stages, for inspection -----------------------------------------------------------
    def ir(self, *args, **meta) -> str:
        return ir.print_kernel(self.typed(args, meta))

    def source(self, *args, **meta) -> str:
        return cuda_source(self.typed(args, meta), self.module.filename).source

    def compiled(self, args, meta, arch: str | None = None) -> nvrtc.Compiled:
        gen = cuda_source(self.typed(args, meta), self.module.filename)
        return nvrtc.compile(gen.source, gen.name, arch or default_arch())

    def ptx(self, *args, arch: str | None = None, **meta) -> str:
        return self.compiled(args, meta, arch).ptx

    def sass(self, *args, arch: str | None = None, **meta) -> str:
        return nvrtc.disassemble(self.compiled(args, meta, arch).cubin)

    def binary(self, args, meta, arch: str) -> Binary:
        sig, consts, nw, ns, idx64, aligned = self.specialize(args, meta)
        key = cache.key(VERSION, self.module.filename, self.module.text, self.name, repr(sorted((k, v.name) for k, v in sig.items())),
                        repr(sorted(consts.items())), str(nw), str(ns), str(idx64), repr(sorted(aligned)), arch,
                        repr(nvrtc.version()))
        data = disk_cache().get(key)
        if data is not None:
            try:
                return Binary.unpack(data)
            except (ValueError, KeyError, IndexError):
                pass  # an entry from an incompatible writer: rebuild it
        k = typed_ir(self.module.ast, self.name, sig, consts, nw, ns, idx64, aligned)
        gen = cuda_source(k, self.module.filename)
        out = nvrtc.compile(gen.source, gen.name, arch)  # nvrtc
        b = Binary(gen.name, out.cubin, gen.threads, gen.smem_bytes, [p.type.dtype for p in k.params])
        disk_cache().put(key, b.pack())
        return b

    # ---- launching ---------------------------------------------------------------------------
    def run(self, grid, /, *args, **meta) -> None:
        # The hot path, kept flat: one pass over the arguments builds the key and the values.
        key, values, device = [tuple(meta.items())], [], None
        for a in args:
            if isinstance(a, Tensor):
                d = a.get_device()  # -1 on the CPU
                if device is None:
                    device = d
                elif d != device:
                    raise NkError(f"kernel '{self.name}': tensors on different devices in one launch",
                                  self.defn.span, "move every tensor to the same device (a CPU launch runs "
                                  "in the interpreter)")
                p = a.data_ptr()
                key.append((a.dtype, a.nbytes >= 2**31, p & 15 == 0))
                values.append(p)
            else:
                key.append((type(a), -2**31 <= a < 2**31, a & 15 == 0) if type(a) is int else type(a))
                values.append(a)
        if device is None or device < 0 or INTERPRET:
            return self.interpret(grid, args, meta)
        key.append(device)
        launcher = self.launchers.get(tuple(key))
        if launcher is None:
            launcher = self.new_launcher(args, meta, device, tuple(key))
        if callable(grid):
            grid = grid(meta)
        if len(grid) != 3:
            grid = (*grid, 1, 1)[:3]
        if 0 in grid:  # an empty grid (empty tensors) launches nothing; the driver would call it invalid
            return
        launcher(grid, values, _stream(device))

    def new_launcher(self, args, meta, device: int, key) -> Launcher:
        with self.lock, gc_paused():
            if key not in self.launchers:
                binary = self.binary(args, meta, driver.arch(device))
                previous = driver.current_context()  # the module loads into the device's own context
                driver.set_device(device)
                try:
                    self.launchers[key] = Launcher(binary, device)
                finally:
                    driver.set_context(previous)
            return self.launchers[key]

    def interpret(self, grid, args, meta) -> None:
        k = self.typed(args, meta)
        if callable(grid):
            grid = grid(meta)
        host = [a.cpu() if _is_tensor(a) and a.device.type != "cpu" else a for a in args]
        interpret.run(k, grid, host)
        for a, h in zip(args, host):
            if _is_tensor(a) and h is not a:
                a.copy_(h)


# torch's current stream as a raw handle (absent from CPU-only builds, which never launch)
_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def default_arch() -> str:
    try:
        return driver.arch(0)
    except NkError:
        return "sm_90a"


def parsed(text: str, filename: str) -> A.Module:
    """Parse, or take the AST from the disk cache: a warm process never builds the grammar's tables."""
    key = cache.key(VERSION, "ast", filename, text)
    with gc_paused():
        data = disk_cache().get(key)
        if data is not None:
            try:
                module = pickle.loads(data)
                SOURCES[filename] = text
                return module
            except (pickle.UnpicklingError, AttributeError, EOFError, TypeError):
                pass  # written by another compiler version: parse again
        module = syntax.parse(text, filename)
        disk_cache().put(key, pickle.dumps(module))
    return module


class Module:
    """A parsed `.nk` file; its kernels are attributes."""

    def __init__(self, text: str, filename: str):
        self.text = text
        self.filename = filename
        self.ast = parsed(text, filename)
        self.kernels = {d.name: Kernel(self, d) for d in self.ast.defs if d.kind == "kernel"}

    def __getattr__(self, name: str) -> Kernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"{self.__dict__.get('filename')} has no kernel '{name}' (kernels: {', '.join(kernels)})")

    def __dir__(self):
        return list(self.kernels) + list(super().__dir__())


_loaded: dict = {}


def load(path) -> Module:
    """Parse a `.nk` file once per process; a file changed on disk (size or mtime) is parsed again."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    mod = _loaded.get(key)
    if mod is None:
        mod = _loaded[key] = Module(Path(path).read_text(), str(path))
    return mod


def compile(text: str, filename: str = "<string>") -> Module:
    return Module(text, filename)



