"""newt: a small Triton-like GPU kernel compiler. `.nk` text -> typed tile IR -> CUDA C++ -> NVRTC -> launch."""
from .errors import NkError, install_excepthook
from .jit import Kernel, Module, compile, load
from . import ops  # noqa: E402 - stdlib ops; their `.nk` files load on first use

install_excepthook()  # a user mistake in a script shows as a diagnostic, not a traceback

__all__ = ["NkError", "Kernel", "Module", "compile", "load", "ops"]
