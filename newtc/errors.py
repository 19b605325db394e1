"""Diagnostics: a span plus a message, rendered once, like a compiler."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field


def flag(name: str) -> bool:
    """An on/off environment variable: unset, empty, 0, false, no and off mean off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Span:
    file: str
    line: int  # 1-based
    col: int  # 1-based
    end_line: int = 0
    end_col: int = 0
    # the whole text of the file, shared by its spans: any stage can quote a line with no registry of sources
    source: str | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def quote(self) -> str | None:
        """The span's first line of source, as lark counts lines (a newline ends one)."""
        if self.source is None or self.line < 1:
            return None
        lines = self.source.split("\n", self.line)
        return lines[self.line - 1].rstrip("\r") if self.line <= len(lines) else None


@dataclass
class Diagnostic:
    span: Span | None
    message: str
    hint: str = ""
    severity: str = "error"
    source_line: str | None = None  # the quoted line, taken when the diagnostic is made

    def __post_init__(self):
        if self.source_line is None and self.span is not None:
            self.source_line = self.span.quote()

    def render(self, color: bool | None = None) -> str:
        if color is None:
            color = sys.stderr.isatty() and "NO_COLOR" not in os.environ
        bold, red, cyan, reset = ("\033[1m", "\033[31m", "\033[36m", "\033[0m") if color else ("",) * 4
        where = f"{self.span}: " if self.span else ""
        out = [f"{bold}{where}{red}{self.severity}:{reset}{bold} {self.message}{reset}"]
        if self.source_line is not None:
            src = self.source_line
            width = 1
            if self.span.end_line == self.span.line and self.span.end_col > self.span.col:
                width = self.span.end_col - self.span.col
            out.append(f"  {src}")
            out.append(f"  {' ' * (self.span.col - 1)}{red}^{'~' * (width - 1)}{reset}")
        if self.hint:
            out.append(f"  {cyan}hint:{reset} {self.hint}")
        return "\n".join(out)


class NkError(Exception):
    """A user-facing error: one or more diagnostics. Never shown with a Python traceback."""

    def __init__(self, message: str, span: Span | None = None, hint: str = ""):
        self.diagnostics = [Diagnostic(span, message, hint)]
        super().__init__(self.render(color=False))

    @property
    def span(self) -> Span | None:
        return self.diagnostics[0].span

    def render(self, color: bool | None = None) -> str:
        return "\n".join(d.render(color) for d in self.diagnostics)


def install_excepthook() -> None:
    """Show NkError as a diagnostic with no traceback when it reaches the top of a script."""
    previous = sys.excepthook

    def hook(kind, exc, tb):
        if isinstance(exc, NkError):
            print(exc.render(), file=sys.stderr)
        else:
            previous(kind, exc, tb)

    sys.excepthook = hook
