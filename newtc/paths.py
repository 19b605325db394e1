"""Where the package's data folders (grammar/, stdlib/) are, installed or in a source checkout."""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """`grammar` or `stdlib`: inside the installed package, else at the top of the source tree."""
    for candidate in (_HERE / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"newt data folder '{name}' not found next to {_HERE}")
