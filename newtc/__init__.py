"""newt: a small Triton-like GPU kernel compiler. `.nk` text -> typed tile IR -> CUDA C++ -> NVRTC -> launch.

Importing newtc is cheap and torch-free (the `newtc` command never needs torch): the names that launch
kernels on torch tensors load on first use."""
import importlib

from .errors import NkError, install_excepthook

install_excepthook()  # a user mistake in a script shows as a diagnostic, not a traceback

_LAZY = {"Kernel": "jit", "Module": "jit", "compile": "jit", "load": "jit", "ops": None}
__all__ = ["NkError", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'newtc' has no attribute '{name}'")
    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    return module if _LAZY[name] is None else getattr(module, name)


def __dir__():
    return sorted([*globals(), *_LAZY])
