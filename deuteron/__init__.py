"""deuteron: tile programs -> newt .nk kernels, with an eager oracle, an autotuner and a config cache.

    prog = deuteron.load("examples/tiles.nk")
    out = prog.matmul(x, y)          # lowered, autotuned once per shape bucket (cached on disk), launched
"""
from .program import Program, TileFunction, compile, load

__all__ = ["Program", "TileFunction", "compile", "load"]
