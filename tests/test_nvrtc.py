import ctypes
from concurrent.futures import ThreadPoolExecutor

import pytest

from newtc import driver, nvrtc
from newtc.errors import NkError

KERNEL = """\
extern "C" __global__ void scale(float* x, int n) {
#line 3 "foo.nk"
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 2.0f * i + 1.0f;
}
"""


def test_version():
    major, minor = nvrtc.version()
    assert major >= 12 and minor >= 0


def test_fast_math_is_not_a_default():
    assert "--use_fast_math" not in nvrtc.DEFAULT_OPTIONS


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compile_to_cubin_and_disassemble(arch):
    out = nvrtc.compile(KERNEL, "scale.cu", arch)
    assert out.cubin.startswith(b"\x7fELF")
    assert out.ptx is not None and ".entry scale" in out.ptx and f".target {arch}" in out.ptx
    sass = nvrtc.disassemble(out.cubin)
    assert "Function : scale" in sass
    assert "STG" in sass


def test_compute_arch_gives_ptx_only():
    out = nvrtc.compile(KERNEL, "scale.cu", "compute_90a")
    assert out.cubin == b"" and ".target sm_90a" in out.ptx


def test_extra_options_are_passed():
    out = nvrtc.compile("#ifndef N\n#error no N\n#endif\n" + KERNEL, "scale.cu", "sm_80", ["-DN=4"])
    assert out.cubin.startswith(b"\x7fELF")


def test_compile_error_carries_nk_line_and_log():
    bad = KERNEL.replace("if (i < n)", "if (i < m)")
    with pytest.raises(nvrtc.NvrtcError) as info:
        nvrtc.compile(bad, "scale.cu", "sm_90a")
    err = info.value
    assert isinstance(err, NkError)
    assert 'foo.nk(4): error: identifier "m" is undefined' in str(err)
    assert "if (i < m)" in str(err)  # NVRTC quotes the generated line
    assert err.entries == [("foo.nk", 4, 'error: identifier "m" is undefined')]


def test_bad_arch_is_an_nvrtc_error():
    with pytest.raises(nvrtc.NvrtcError, match="sm_1"):
        nvrtc.compile(KERNEL, "scale.cu", "sm_1")


def test_parse_log():
    log = (
        'foo.nk(12): warning #177-D: variable "t" was declared but never referenced\n'
        "    float t;\n"
        "          ^\n"
        'foo.nk(3): error: identifier "y" is undefined\n'
        'kernel.cu(1): catastrophic error: cannot open source file "cuda_fp16.h"\n'
        '2 errors detected in the compilation of "kernel.cu".\n'
        "ptxas error   : Entry function 'k' uses too much shared data\n"
    )
    assert nvrtc.parse_log(log) == [
        ("foo.nk", 12, 'warning #177-D: variable "t" was declared but never referenced'),
        ("foo.nk", 3, 'error: identifier "y" is undefined'),
        ("kernel.cu", 1, 'catastrophic error: cannot open source file "cuda_fp16.h"'),
    ]
    assert nvrtc.parse_log("") == []


def test_concurrent_compiles():
    sources = [KERNEL.replace("2.0f", f"{i}.0f") for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda s: nvrtc.compile(s, "scale.cu", "sm_90a"), sources))
    assert all(o.cubin.startswith(b"\x7fELF") for o in outs)
    assert len({o.cubin for o in outs}) == len(outs)


def test_not_found_lists_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(nvrtc, "_candidates", lambda: ([tmp_path], ["libnvrtc-missing.so.99"]))
    with pytest.raises(NkError, match="NVRTC not found") as info:
        nvrtc._load()
    text = str(info.value)
    assert str(tmp_path) in text and "libnvrtc-missing.so.99" in text
    assert "pip install nvidia-cuda-nvrtc" in text


def test_identity_names_the_library_without_loading_it(monkeypatch):
    """A cubin's cache key takes NVRTC's identity: a warm process finds its cubins without loading NVRTC."""
    want = nvrtc.identity()
    nvrtc.identity.cache_clear()
    monkeypatch.setattr(nvrtc, "_load", lambda: pytest.fail("identity() loaded NVRTC"))
    monkeypatch.setattr(nvrtc, "_lib", None)
    assert nvrtc.identity() == want and "libnvrtc.so" in want


def test_driver_imports_without_gpu():
    assert driver.CudaError.__mro__[1] is NkError
    if not _has_libcuda():
        with pytest.raises(NkError, match="libcuda"):
            driver.device_count()


def _has_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _function(source: str, name: str, device: int) -> int:
    driver.set_device(device)
    return driver.get_function(driver.load_module(nvrtc.compile(source, "k.cu", driver.arch(device)).cubin), name)


def _cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.mark.gpu
def test_launch_writes_a_torch_tensor():
    torch = _cuda_torch()
    n = 1000
    x = torch.zeros(n, device="cuda")
    dev = x.device.index
    assert driver.device_count() >= 1
    assert driver.device_attribute(dev, driver.ATTR_MULTIPROCESSOR_COUNT) > 0
    major, minor = torch.cuda.get_device_capability(dev)
    assert driver.capability(dev) == (major, minor)
    assert driver.arch(dev) == ("sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}")
    func = _function(KERNEL, "scale", dev)
    ptr, count = ctypes.c_void_p(x.data_ptr()), ctypes.c_int(n)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(count))
    stream = torch.cuda.current_stream().cuda_stream
    driver.launch(func, ((n + 127) // 128, 1, 1), (128, 1, 1), 0, stream, params)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.arange(n, dtype=torch.float32) * 2 + 1)


SMEM_KERNEL = """\
extern "C" __global__ void rev(float* x) {
  extern __shared__ float buf[];
  int n = blockDim.x * 64, t = threadIdx.x;
  for (int i = t; i < n; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  for (int i = t; i < n; i += blockDim.x) x[i] = buf[n - 1 - i];
}
"""


@pytest.mark.gpu
def test_dynamic_smem_above_48k_and_errors_are_named():
    torch = _cuda_torch()
    dev = torch.cuda.current_device()
    threads = 256
    smem = threads * 64 * 4  # 64 KB: above the 48 KB a launch gets without the attribute
    if driver.device_attribute(dev, driver.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) < smem:
        pytest.skip("device has too little shared memory")
    x = torch.arange(threads * 64, dtype=torch.float32, device="cuda")
    func = _function(SMEM_KERNEL, "rev", dev)
    ptr = ctypes.c_void_p(x.data_ptr())
    params = (ctypes.c_void_p * 1)(ctypes.addressof(ptr))
    stream = torch.cuda.current_stream().cuda_stream
    with pytest.raises(driver.CudaError, match="cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE"):
        driver.launch(func, (1, 1, 1), (threads, 1, 1), smem, stream, params)
    driver.set_max_dynamic_smem(func, smem)
    driver.launch(func, (1, 1, 1), (threads, 1, 1), smem, stream, params)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.arange(threads * 64, dtype=torch.float32).flip(0))
    with pytest.raises(driver.CudaError, match="CUDA_ERROR_NOT_FOUND"):
        _function(SMEM_KERNEL, "nope", dev)
