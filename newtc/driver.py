"""The CUDA driver API through ctypes: devices, primary contexts, modules, launches.

libcuda.so.1 is loaded (and cuInit called) on first use, so importing this on a machine without a GPU works.
Handles (contexts, modules, functions) are plain ints."""
from __future__ import annotations

import ctypes
import functools
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_uint, c_void_p

from .errors import NkError

ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

# None of these is renamed to a _v2 symbol by cuda.h, so the plain names are the current ABI.
_SIGNATURES = {
    "cuInit": (c_uint,),
    "cuGetErrorName": (c_int, POINTER(c_char_p)),
    "cuGetErrorString": (c_int, POINTER(c_char_p)),
    "cuDeviceGetCount": (POINTER(c_int),),
    "cuDeviceGet": (POINTER(c_int), c_int),
    "cuDeviceGetAttribute": (POINTER(c_int), c_int, c_int),
    "cuDevicePrimaryCtxRetain": (POINTER(c_void_p), c_int),
    "cuCtxSetCurrent": (c_void_p,),
    "cuCtxGetCurrent": (POINTER(c_void_p),),
    "cuModuleLoadData": (POINTER(c_void_p), c_char_p),
    "cuModuleGetFunction": (POINTER(c_void_p), c_void_p, c_char_p),
    "cuFuncSetAttribute": (c_void_p, c_int, c_int),
    "cuLaunchKernel": (c_void_p, *[c_uint] * 7, c_void_p, c_void_p, c_void_p),  # grid, block, smem, stream
    "cuTensorMapEncodeTiled": (c_void_p, c_int, c_uint, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                               c_int, c_int, c_int, c_int),
}
_lib: ctypes.CDLL | None = None
_lock = threading.Lock()
_contexts: dict[int, int] = {}  # device ordinal -> its retained primary context


class CudaError(NkError):
    """A CUDA driver call returned an error: `function` names the call, `name` the CUresult."""

    def __init__(self, function: str, code: int):
        self.function, self.code = function, code
        self.name, description = _describe(code)
        super().__init__(f"{function} failed: {self.name} ({description})")


def _describe(code: int) -> tuple[str, str]:
    name, text = c_char_p(), c_char_p()
    if _lib is None or _lib.cuGetErrorName(code, byref(name)) or _lib.cuGetErrorString(code, byref(text)):
        return f"CUresult {code}", "unknown error code"
    return name.value.decode(), text.value.decode()


def _cuda() -> ctypes.CDLL:
    """libcuda, loaded and initialized once."""
    global _lib, _launch_kernel
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise NkError("the CUDA driver (libcuda.so.1) could not be loaded",
                              hint=f"{e}; newt needs an NVIDIA GPU and its driver") from None
            for fn, argtypes in _SIGNATURES.items():
                getattr(lib, fn).argtypes = argtypes
            _lib = lib  # set before cuInit so that its error can be named
            rc = lib.cuInit(0)
            if rc:
                error, _lib = CudaError("cuInit", rc), None
                raise error
            _launch_kernel = lib.cuLaunchKernel
        return _lib


def _check(rc: int, function: str) -> None:
    if rc:
        raise CudaError(function, rc)


def _launch_kernel(*args) -> int:
    """Stands in for cuLaunchKernel until the library is loaded, then _cuda() puts the real one here."""
    return _cuda().cuLaunchKernel(*args)


def init() -> None:
    _cuda()


def device_count() -> int:
    n = c_int()
    _check(_cuda().cuDeviceGetCount(byref(n)), "cuDeviceGetCount")
    return n.value


def _device(ordinal: int) -> int:
    dev = c_int()
    _check(_cuda().cuDeviceGet(byref(dev), ordinal), "cuDeviceGet")
    return dev.value


def device_attribute(device: int, attribute: int) -> int:
    """A CU_DEVICE_ATTRIBUTE_* value (the ATTR_* constants here) of device ordinal `device`."""
    value = c_int()
    _check(_cuda().cuDeviceGetAttribute(byref(value), attribute, _device(device)), "cuDeviceGetAttribute")
    return value.value


def capability(device: int) -> tuple[int, int]:
    return (device_attribute(device, ATTR_COMPUTE_CAPABILITY_MAJOR),
            device_attribute(device, ATTR_COMPUTE_CAPABILITY_MINOR))


@functools.cache  # ops ask on every call: two driver queries cost 7.5 us of a 27 us matmul call (an H200's host)
def arch(device: int) -> str:
    """The exact NVRTC target of a device: 'sm_90a' on Hopper (wgmma, TMA need the 'a'), else 'sm_XY'."""
    major, minor = capability(device)
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def set_device(device: int) -> int:
    """Make the device's primary context (the one PyTorch uses) current in this thread; returns it.

    The context is retained once per process and kept; current-ness is per thread."""
    ctx = _contexts.get(device)
    if ctx is None:
        handle = c_void_p()
        _check(_cuda().cuDevicePrimaryCtxRetain(byref(handle), _device(device)), "cuDevicePrimaryCtxRetain")
        ctx = _contexts.setdefault(device, handle.value)
    _check(_cuda().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def current_context() -> int | None:
    ctx = c_void_p()
    _check(_cuda().cuCtxGetCurrent(byref(ctx)), "cuCtxGetCurrent")
    return ctx.value


def set_context(ctx: int | None) -> None:
    _check(_cuda().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def load_module(cubin: bytes) -> int:
    """Load a cubin into the current context (call set_device first)."""
    module = c_void_p()
    _check(_cuda().cuModuleLoadData(byref(module), cubin), "cuModuleLoadData")
    return module.value


def get_function(module: int, name: str) -> int:
    func = c_void_p()
    _check(_cuda().cuModuleGetFunction(byref(func), module, name.encode()), f"cuModuleGetFunction({name!r})")
    return func.value


def set_max_dynamic_smem(func: int, nbytes: int) -> None:
    """Allow `nbytes` of dynamic shared memory per block; needed above the default 48 KB."""
    _check(_cuda().cuFuncSetAttribute(func, _FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes), "cuFuncSetAttribute")


def fast_launch_function():
    """cuLaunchKernelEx(config, function, params, extra) with no argtypes: ctypes converts nothing. The
    caller passes ctypes objects (buffers, c_void_p), so one call takes four ready-made arguments; the
    grid, block and stream travel inside the config struct, which the caller packs (LAUNCH_CONFIG)."""
    _cuda()
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    fn.restype = c_int
    return fn


# CUlaunchConfig: grid x/y/z, block x/y/z, dynamic shared bytes (uint32 each), the stream, then a NULL
# attribute list and its zero count (cuda.h, CUDA 12.0 and later).
LAUNCH_CONFIG = "<7I4xQ16x"


def launch(func: int, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int,
           params: ctypes.Array | None) -> None:
    """cuLaunchKernel. `params` is a (c_void_p * n) array of pointers to each argument's ctypes storage."""
    rc = _launch_kernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, params, None)
    if rc:
        raise CudaError("cuLaunchKernel", rc)


# CUtensorMapDataType by element size: TMA moves bits, and out of bounds fills zero bits (oobFill NONE) in any type
_TMA_TYPES = {1: 0, 2: 1, 4: 2, 8: 4}  # UINT8, UINT16, UINT32, UINT64
_TMA_SWIZZLE = {32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_32B/64B/128B
_TMA_L2_256B = 3


def encode_tiled(itemsize: int, base: int, dims: list, strides: list, box: list, swizzle: int) -> bytes:
    """cuTensorMapEncodeTiled: the 128-byte CUtensorMap of a tensor at `base` with `dims` (innermost first) and the
    byte `strides` of its outer dimensions, copied in boxes of `box` elements with this swizzle (bytes)."""
    rank = len(dims)
    buf = ctypes.create_string_buffer(256)
    at = -ctypes.addressof(buf) % 128  # the map must be 64-byte aligned (cuda.h declares it 128-byte aligned)
    u64s, u32s = ctypes.c_uint64 * rank, ctypes.c_uint32 * rank
    rc = _cuda().cuTensorMapEncodeTiled(ctypes.addressof(buf) + at, _TMA_TYPES[itemsize], rank, base, u64s(*dims),
                                        u64s(*strides, 0), u32s(*box), u32s(*[1] * rank), 0, _TMA_SWIZZLE[swizzle],
                                        _TMA_L2_256B, 0)
    _check(rc, "cuTensorMapEncodeTiled")
    return buf.raw[at:at + 128]
