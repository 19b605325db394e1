"""Kernel objects: specialization, the compile pipeline on a miss, and the cached launch path.

    mod = newtc.load("stdlib/add.nk")
    mod.add[grid](x, y, out, n, BLOCK=1024, num_warps=4)

A launch whose tensors are all on the CPU (or any launch under NEWT_INTERPRET=1) runs in the
interpreter; otherwise the specialization is compiled once (memory and disk cache) and launched
through the driver on the tensors' device and torch's current stream.
"""
from __future__ import annotations

import builtins
import contextlib
import ctypes
import functools
import gc
import hashlib
import json
import operator
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from . import ast as A
from . import cache, check, compiler, driver, interpret, ir, launches, nvrtc, syntax
from .compiler import Spec
from .errors import NkError, flag
from .types import DTYPES, Ptr, bool_, f32, i32, i64, torch_dtype_name

_SRC = Path(__file__).resolve().parent
# The compiler's own version: a hash of its source, so a changed compiler never reuses old binaries.
VERSION = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(_SRC.rglob("*.py")))).hexdigest()[:16]
INTERPRET = flag("NEWT_INTERPRET")  # read once: the launch path stays free of lookups
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")  # launch options: meta that is not a constexpr


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


@dataclass
class Binary:
    name: str
    cubin: bytes
    threads: int
    smem_bytes: int
    param_types: list  # DType/Ptr per runtime parameter, in order
    tmaps: list = field(default_factory=list)  # the tensor maps its TMA loads read (ir.Kernel.tmaps)

    def pack(self) -> bytes:
        meta = json.dumps({"name": self.name, "threads": self.threads, "smem": self.smem_bytes,
                           "params": [t.name for t in self.param_types], "tmaps": self.tmaps}).encode()
        return len(meta).to_bytes(4, "little") + meta + self.cubin

    @staticmethod
    def unpack(data: bytes) -> "Binary":
        n = int.from_bytes(data[:4], "little")
        meta = json.loads(data[4:4 + n])
        types = [Ptr(DTYPES[t[1:]]) if t.startswith("*") else DTYPES[t] for t in meta["params"]]
        return Binary(meta["name"], data[4 + n:], meta["threads"], meta["smem"], types, meta.get("tmaps", []))


# ---- argument classification --------------------------------------------------------------------
class ArgError(ValueError):
    """An argument a kernel cannot take; the kernel turns it into an NkError that names the parameter."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def arg_type(a, big: bool):
    """The parameter type a launch argument gives (design section 3)."""
    if isinstance(a, Tensor):
        name = torch_dtype_name(a.dtype)
        if not name:
            raise ArgError(f"tensors of {a.dtype} are not supported", f"tensor dtypes: {', '.join(DTYPES)}")
        return Ptr(DTYPES[name])
    if isinstance(a, bool):
        return bool_
    if isinstance(a, int):
        return i64 if big or not -2**31 <= a < 2**31 else i32
    if isinstance(a, float):
        return f32
    raise ArgError(f"cannot pass {type(a).__name__} to a kernel", "pass tensors, ints, floats or bools")


def scalar_problem(t, a) -> str:
    """Why the scalar `a` cannot travel as a `t` ('' when it can): a value never wraps or truncates."""
    if t == bool_:
        return "" if type(a) is bool else "is not a bool"
    if t.is_int and isinstance(a, float):
        return f"is not an integer; the parameter is {t}"
    try:
        struct.pack("<" + SLOT[t.name], a)  # the launch packs it so (standard sizes: floats range-checked too)
        return ""
    except (struct.error, OverflowError):
        if t.is_int:
            lo, hi = check.int_range(t)
            return f"does not fit {t} ({lo} to {hi})"
        return f"is outside the range of {t}"


def aligned_params(params, args) -> frozenset:
    """Parameters whose value is a multiple of 16 (ints) or 16-byte aligned (tensors), as Triton specializes."""
    return frozenset(p.name for p, a in zip(params, args)
                     if (isinstance(a, Tensor) and a.data_ptr() % 16 == 0) or (type(a) is int and a % 16 == 0))


def needs_idx64(args) -> bool:
    """Offsets overflow 32 bits when a tensor spans 2 GiB or more: specialize to 64-bit indices."""
    return any(isinstance(a, Tensor) and a.nbytes >= 2**31 for a in args)


# One buffer per launch: the launch config, then an 8-byte slot per argument, packed by one struct call.
SLOT = {"bool": "?7x", "i8": "b7x", "i16": "h6x", "i32": "i4x", "i64": "q", "u8": "B7x", "u16": "H6x",
        "u32": "I4x", "u64": "Q", "f32": "f4x", "f64": "d"}
# torch's compiled launcher's letters for the types whose values the specialization key keeps in range (int) or that
# it checks itself (i64, f64); narrower ints go through the packed path, which checks them
STATIC = {"bool": "b", "i32": "i", "i64": "l", "f32": "f", "f64": "d"}
FLT_MAX = 3.4028234663852886e38
CONFIG_BYTES = struct.calcsize(driver.LAUNCH_CONFIG)  # the arguments' slots follow the launch config
WRONG_CONTEXT = (201, 400)  # CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE
INVALID_VALUE = 1


class Launcher:
    """The per-signature launch path: the module, the function and the argument packing, built once."""

    def __init__(self, binary: Binary, device: int):
        """Built with the device's context current."""
        self.device = device
        func = driver.get_function(driver.load_module(binary.cubin), binary.name)
        if binary.smem_bytes > 48 * 1024:
            driver.set_max_dynamic_smem(func, binary.smem_bytes)
        self.threads, self.smem = binary.threads, binary.smem_bytes
        self.pack = struct.Struct(driver.LAUNCH_CONFIG + "".join("Q" if isinstance(t, Ptr) else SLOT[t.name]
                                                                 for t in binary.param_types)
                                  + "128s" * len(binary.tmaps)).pack_into
        self.nargs = len(binary.param_types)
        self.tmaps = binary.tmaps
        self.local = threading.local()  # each thread packs its own buffer: concurrent launches never share one
        self.cu_launch = driver.fast_launch_function()
        self.func, self.cu_func = func, ctypes.c_void_p(func)
        self.types = binary.param_types

    def buffers(self):
        """This thread's buffer: the launch config, an 8-byte slot per argument, then 128 bytes per tensor map."""
        n, maps = self.nargs, len(self.tmaps)
        buf = ctypes.create_string_buffer(CONFIG_BYTES + 8 * n + 128 * maps)
        slots = ctypes.addressof(buf) + CONFIG_BYTES
        offsets = [8 * k for k in range(n)] + [8 * n + 128 * k for k in range(maps)]
        self.local.buffers = buf, (ctypes.c_void_p * max(1, n + maps))(*[slots + o for o in offsets])
        return self.local.buffers

    def encode(self, values: tuple) -> tuple:
        """The tensor maps of a launch, from its argument values (pointers as ints)."""
        return tuple(driver.encode_tiled(*tmap_fields(m, values)) for m in self.tmaps)

    def function(self):
        """The launch as a closure over everything constant (no attribute lookups): launch(stream, values,
        *grid). Through torch's compiled launcher (inductor's, one C call that reads the values and calls the driver)
        where this torch has one and it takes every argument's type, else `packed`. Whatever it refuses (a grid
        beyond the device's, another device's context current) goes through `packed`, which names it or switches
        the context."""
        packed = self.packed()
        static = getattr(torch._C, "_StaticCudaLauncher", None)
        kinds = "".join("K" if isinstance(t, Ptr) else STATIC.get(t.name, "?") for t in self.types)
        if static is None or self.tmaps or "?" in kinds:
            return packed
        # it casts a float to f32 with no range check: finite values beyond f32's go through `packed`, which names them
        fits = "".join(f" and -{FLT_MAX!r} <= values[{i}] <= {FLT_MAX!r}" for i, k in enumerate(kinds) if k == "f")
        scope = dict(run=static._launch_kernel, packed=packed, func=self.func, warps=self.threads // 32, smem=self.smem,
                     kinds=kinds)
        exec("def launch(stream, values, gx, gy=1, gz=1):\n"
             f"    if gx and gy and gz{fits}:\n"
             "        try:\n"
             "            return run(func, gx, gy, gz, warps, smem, kinds, values, stream)\n"
             "        except (RuntimeError, TypeError, OverflowError):\n"
             "            pass\n"
             "    packed(stream, values, gx, gy, gz)\n", scope)
        launch = scope["launch"]
        launch.launcher, launch.types, launch.kinds = self, self.types, kinds
        return launch

    def packed(self):
        """launch(stream, values, *grid) that packs the config and the arguments into this thread's buffer and
        calls the driver once through ctypes."""
        local, buffers, pack, cu_launch, cu_func = self.local, self.buffers, self.pack, self.cu_launch, self.cu_func
        threads, smem, failed = self.threads, self.smem, self.failed

        def launch(stream, values, gx, gy=1, gz=1):
            try:
                buf, params = local.buffers
            except AttributeError:
                buf, params = buffers()
            if gx and gy and gz:  # an empty grid (empty tensors) launches nothing; the driver would call it invalid
                try:
                    pack(buf, 0, gx, gy, gz, threads, 1, 1, smem, stream, *values)
                except (struct.error, OverflowError):  # a grid size or a scalar the slots do not take
                    raise TypeError("the general path names it") from None
                rc = cu_launch(buf, cu_func, params, None)
                if rc:
                    failed(rc, buf, params, gy, gz)
            elif {type(gx), type(gy), type(gz)} != {int}:  # 0.0 or None is no empty grid: say so
                raise TypeError("the general path names it")

        if self.tmaps:  # encoded per launch from the arguments, and remembered for launches that repeat them
            encode, plain_launch = functools.lru_cache(maxsize=256)(self.encode), launch

            def launch(stream, values, gx, gy=1, gz=1):
                values = tuple(values)
                plain_launch(stream, values + encode(values), gx, gy, gz)
        launch.launcher, launch.types = self, self.types
        return launch

    def failed(self, rc: int, buf, params, gy: int, gz: int) -> None:
        if rc == INVALID_VALUE and max(gy, gz) > 65535:  # a grid beyond the device's: the general path names it
            raise TypeError("the general path names it")
        if rc in WRONG_CONTEXT:  # another device's context is current (or none): switch for this launch only
            previous = driver.current_context()
            driver.set_device(self.device)
            try:
                rc = self.cu_launch(buf, self.cu_func, params, None)
            finally:
                driver.set_context(previous)  # torch reads its current device from the current context
        if rc:
            raise driver.CudaError("cuLaunchKernelEx", rc)


# ---- the launch path, generated per argument kinds ---------------------------------------------
def tmap_fields(m: dict, values) -> tuple:
    """driver.encode_tiled's arguments for tensor map `m` (ir.Kernel.tmaps) of a launch with these argument values
    (pointers as ints): each map's parameters or constants, dims innermost first and strides in bytes (a zero dim as
    1: a map must cover something)."""
    def get(ref) -> int:
        return values[ref[1]] if ref[0] == "arg" else ref[1]
    return (m["itemsize"], values[m["base"]], [max(1, get(d)) for d in m["dims"]],
            [get(s) * m["itemsize"] for s in m["strides"]], m["box"], m["swizzle"])


def arg_kind(a) -> str:
    """What the launch path branches on per argument (after `plain`): tensor, int, float or bool."""
    return "tensor" if isinstance(a, Tensor) else type(a).__name__


def plain(a):
    """An argument as the launch path takes it: numbers of other types (IntEnum, numpy scalars) become Python's
    own; a tensor must have a dtype newt has; anything else is an ArgError."""
    if type(a) in (int, float, bool):
        return a
    if isinstance(a, Tensor):
        arg_type(a, False)
        return a
    if isinstance(a, (bool, np.bool_)):
        return bool(a)
    if isinstance(a, (int, np.integer)):
        return int(a)
    if isinstance(a, (float, np.floating)):
        return float(a)
    return arg_type(a, False)  # raises


def constexpr_value(v):
    """A constexpr as the checker takes it: numpy scalars become Python's, torch dtypes newt's."""
    if isinstance(v, torch.dtype):
        return DTYPES.get(torch_dtype_name(v), v)
    if isinstance(v, np.generic):
        return v.item()
    return tuple(map(constexpr_value, v)) if isinstance(v, tuple) else v


def launch_source(kinds: tuple) -> str:
    """A launch function for arguments of these kinds, straight-line Python: it checks the kinds, builds the
    specialization key (device, dtype, 2 GiB and alignment bits per tensor; range, % 16, == 1 and > 0 per int) and
    calls the cached Launcher. Anything unexpected goes to `miss`, the general path, which also compiles."""
    n = len(kinds)
    names = [f"a{i}" for i in range(n)]
    tensors = [a for a, k in zip(names, kinds) if k == "tensor"]
    guard = [f"isinstance({a}, Tensor)" if k == "tensor" else f"type({a}) is {k}" for a, k in zip(names, kinds)]
    # the kinds lead the key: launches of other kinds share the dict but never a launcher
    key = [repr(kinds), *[f"d{a}" for a in tensors], *[f"{a}.dtype" for a in tensors]]
    if tensors:
        key.append(f"({' | '.join(f'{a}.nbytes' for a in tensors)}) >= 2147483648")
    key += [f"p{a} & 15 == 0" for a in tensors]
    for a, k in zip(names, kinds):
        if k == "int":
            key += [f"-2147483648 <= {a} < 2147483648", f"{a} & 15 == 0", f"{a} & 15 == 8", f"{a} == 1", f"{a} > 0"]
    values = [f"p{a}" if k == "tensor" else a for a, k in zip(names, kinds)]
    stream = f"d{tensors[0]}" if tensors else "-1"
    lines = [
        "def launch(grid, /, *args, **meta):",
        f"    if len(args) != {n}:",
        "        return miss(grid, args, meta, None)",
        *([f"    {', '.join(names)}, = args", f"    if not ({' and '.join(guard)}):",
           "        return miss(grid, args, meta, None)"] if n else []),
        *[f"    p{a}, d{a} = {a}.data_ptr(), {a}.get_device()" for a in tensors],
        f"    key = ({', '.join([*key, '*meta.items()'])},)",
        "    try:",
        f"        return launchers[key](stream({stream}), ({', '.join(values)}{',' if len(values) == 1 else ''}), "
        "*(grid(meta) if callable(grid) else grid))",
        "    except (KeyError, TypeError):  # a new specialization, or a value the general path checks and names",
        "        return miss(grid, args, meta, key)",
    ]
    return "\n".join(lines) + "\n"


class Kernel:
    """A `.nk` kernel: call as kernel[grid](*args, **meta)."""

    def __init__(self, module: "Module", d: A.FuncDef):
        self.module = module
        self.name = d.name
        self.defn = d
        self.runtime = [p for p in d.params if not check.is_constexpr_annot(p.annotation)]
        self.constexpr_names = {p.name for p in d.params if check.is_constexpr_annot(p.annotation)}
        self.launchers: dict = {}  # specialization key -> Launcher
        self.launch_fns: dict = {}  # argument kinds -> generated launch function
        self.checked: dict = {}  # repr(spec) -> the typed IR the interpreter runs (checked once, as a compile is)
        self.current = self.run  # the launch path of the last kinds seen
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<newt kernel {self.name} from {self.module.filename}>"

    def __getitem__(self, grid):
        return functools.partial(self.current, grid)  # C-level binding: one Python frame per launch

    # ---- specialization ----------------------------------------------------------------------
    def split_meta(self, args, meta):
        """(constexprs, launch options) of a launch, made plain; unknown names and a wrong count are errors."""
        meta = {name: constexpr_value(v) for name, v in meta.items()}
        options = {name: meta.pop(name) for name in OPTIONS if name in meta}
        unknown = set(meta) - self.constexpr_names
        if unknown:
            raise NkError(f"kernel '{self.name}' has no constexpr parameter '{sorted(unknown)[0]}'", self.defn.span,
                          f"constexpr parameters: {', '.join(sorted(self.constexpr_names)) or 'none'}")
        if len(args) != len(self.runtime):
            names = ", ".join(p.name for p in self.runtime)
            raise NkError(f"kernel '{self.name}' takes {len(self.runtime)} runtime arguments ({names}), got {len(args)}",
                          self.defn.span)
        return meta, options  # their values are the checker's to judge

    def plain_args(self, args) -> tuple:
        """The arguments as the launch path takes them (see plain), or an error naming the parameter."""
        out = []
        for p, a in zip(self.runtime, args):
            try:
                out.append(plain(a))
            except ArgError as e:
                raise NkError(f"kernel '{self.name}': argument '{p.name}': {e}", p.span, e.hint) from None
        return tuple(out)

    def check_scalars(self, types, args) -> None:
        """Every scalar fits the type it travels as (the compiled kernel's parameter types)."""
        for p, t, a in zip(self.runtime, types, args):
            problem = "" if isinstance(t, Ptr) else scalar_problem(t, a)
            if problem:
                raise NkError(f"kernel '{self.name}': argument '{p.name}' = {a!r} {problem}", p.span)

    def launch_grid(self, grid) -> tuple:
        """The grid as 1 to 3 ints (numpy and torch integers too), or an error naming the kernel."""
        try:
            dims = tuple(map(operator.index, grid))
        except TypeError:
            dims = ()
        if not 1 <= len(dims) <= 3 or min(dims) < 0 or dims[0] >= 2**31 or max(dims[1:], default=0) > 65535:
            raise NkError(f"kernel '{self.name}': bad launch grid {grid!r}", self.defn.span,
                          "a grid is a tuple of 1 to 3 ints: x below 2**31, y and z up to 65535")
        return dims

    def specialize(self, args, meta, arch: str = "sm_90a") -> Spec:
        meta, options = self.split_meta(args, meta)
        args = self.plain_args(args)
        idx64 = needs_idx64(args)
        sig = {p.name: arg_type(a, idx64) for p, a in zip(self.runtime, args)}
        ints = [(p.name, a) for p, a in zip(self.runtime, args) if type(a) is int]
        spec = Spec.of(sig, meta, **options, idx64=idx64,
                       aligned=aligned_params(self.runtime, args), eights=tuple(n for n, a in ints if a % 16 == 8),
                       ones=tuple(n for n, a in ints if a == 1),
                       positive=tuple(n for n, a in ints if a > 0), arch=arch)
        launches.record(self.module.filename, self.name, spec)  # what `newtc lsp` shows types for
        return spec

    def output(self, args, meta, until: str, arch: str | None = None) -> compiler.Output:
        return compiler.compile(self.module.ast, self.name, self.specialize(args, meta, arch or default_arch()), until)

    # ---- the stages, for inspection -----------------------------------------------------------
    def ir(self, *args, **meta) -> str:
        return ir.print_kernel(self.output(args, meta, "ir").kernel)

    def source(self, *args, **meta) -> str:
        return self.output(args, meta, "cuda").cuda.source

    def ptx(self, *args, arch: str | None = None, **meta) -> str:
        return self.output(args, meta, "cubin", arch).binary.ptx

    def sass(self, *args, arch: str | None = None, **meta) -> str:
        return nvrtc.disassemble(self.output(args, meta, "cubin", arch).binary.cubin)

    def binary(self, args, meta, arch: str) -> Binary:
        spec = self.specialize(args, meta, arch)
        key = cache.key(VERSION, self.module.filename, self.module.text, self.name, repr(spec), nvrtc.identity())
        data = cache.shared().get(key)
        if data is not None:
            try:
                return Binary.unpack(data)
            except (ValueError, KeyError, IndexError):
                pass  # an entry from an incompatible writer: rebuild it
        out = compiler.compile(self.module.ast, self.name, spec)
        b = Binary(out.cuda.name, out.binary.cubin, out.cuda.threads, out.cuda.smem_bytes,
                   [p.type.dtype for p in out.kernel.params], out.kernel.tmaps)
        cache.shared().put(key, b.pack())
        return b

    # ---- launching ---------------------------------------------------------------------------
    def run(self, grid, /, *args, **meta) -> None:
        """Launch through the path generated for these argument kinds (the hot path; see launch_source)."""
        return self.miss(grid, args, meta, None)

    def launch_for(self, kinds: tuple):
        fn = self.launch_fns.get(kinds)
        if fn is None:
            scope = {"Tensor": Tensor, "launchers": self.launchers, "miss": self.miss, "stream": _stream}
            exec(builtins.compile(launch_source(kinds), f"<newt launch {self.name}>", "exec"), scope)
            fn = self.launch_fns[kinds] = scope["launch"]
        self.current = fn  # kernel[grid] binds it: the next launches of these kinds go straight there
        return fn

    def miss(self, grid, args, meta, key) -> None:
        """The general path: arguments of new kinds (a launch path is made for them), errors, the interpreter,
        and the first launch of a specialization (compile, load, cache under `key`)."""
        self.split_meta(args, meta)  # a wrong count or meta: the error names the kernel
        args = self.plain_args(args)
        if key is None:
            return self.launch_for(tuple(map(arg_kind, args)))(grid, *args, **meta)
        for p, a in zip(self.runtime, args):
            if isinstance(a, Tensor) and a.device.type not in ("cpu", "cuda"):  # e.g. meta: fine for .ir()
                raise NkError(f"kernel '{self.name}': argument '{p.name}' is a tensor on the '{a.device.type}' "
                              "device, which has no memory to launch on", p.span, "use a cuda or cpu tensor")
        devices = {a.get_device() for a in args if isinstance(a, Tensor)}
        if len(devices) > 1:
            raise NkError(f"kernel '{self.name}': tensors on different devices in one launch", self.defn.span,
                          "move every tensor to the same device (a CPU launch runs in the interpreter)")
        device = devices.pop() if devices else -1
        grid = self.launch_grid(grid(meta) if callable(grid) else grid)
        ctas = meta.get("num_ctas", 1)
        if ctas in check.CLUSTERS and grid[0] % ctas:  # the driver would refuse it, the interpreter not (the checker
            # names a bad num_ctas)
            raise NkError(f"kernel '{self.name}': a grid of {grid[0]} programs along x is not whole clusters of "
                          f"num_ctas={ctas}", self.defn.span, f"launch a multiple of {ctas} programs along x")
        if device < 0 or INTERPRET:
            return self.interpret(grid, args, meta)
        with self.lock, gc_paused():
            launcher = self.launchers.get(key)
            if launcher is None:
                binary = self.binary(args, meta, driver.arch(device))
                previous = driver.current_context()  # the module loads into the device's own context
                driver.set_device(device)
                try:
                    launcher = self.launchers[key] = Launcher(binary, device).function()
                finally:
                    driver.set_context(previous)
        self.check_scalars(launcher.types, args)
        values = [a.data_ptr() if isinstance(a, Tensor) else a for a in args]
        launcher(_stream(device), values, *grid)

    def interpret(self, grid, args, meta) -> None:
        spec = self.specialize(args, meta)
        k = self.checked.get(repr(spec)) or compiler.compile(self.module.ast, self.name, spec, "checked").kernel
        self.checked[repr(spec)] = k
        self.check_scalars([p.type.dtype for p in k.params], args)
        host = [a.cpu() if isinstance(a, Tensor) and a.device.type != "cpu" else a for a in args]
        interpret.run(k, grid, host)
        for a, h in zip(args, host):
            if isinstance(a, Tensor) and h is not a:
                a.copy_(h)


# torch's current stream as a raw handle (absent from CPU-only builds, which never launch)
_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def default_arch() -> str:
    try:
        return driver.arch(0)
    except NkError:
        return "sm_90a"


class Module:
    """A parsed `.nk` file; its kernels are attributes."""

    def __init__(self, text: str | bytes, filename: str):
        self.text = syntax.decode(text, filename) if isinstance(text, bytes) else text
        self.filename = filename
        with gc_paused():
            self.ast = syntax.parse_cached(self.text, filename)
        check.check_names(self.ast)
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
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
        mod = _loaded.get(key)
        if mod is not None:
            return mod
        text = Path(path).read_bytes()
    except OSError as e:
        raise NkError(f"cannot read {path}: {e.strerror}") from None
    mod = _loaded[key] = Module(text, str(path))  # outside the try: an OSError of newt's own is not the file's
    return mod


def compile(text: str | bytes, filename: str = "<string>") -> Module:
    """A module from source text (bytes are read as UTF-8, like a file)."""
    if not isinstance(text, (str, bytes)) or not isinstance(filename, str):
        raise TypeError(f"newtc.compile(text, filename) takes str (or bytes) and str, got "
                        f"{type(text).__name__} and {type(filename).__name__}")
    return Module(text, filename)



