"""`newtc lsp`: a language server for `.nk` files, over stdio (pygls: `pip install 'newt[lsp]'`).

It reports what `newtc --check` reports as the text changes, shows the shape, dtype and layout that
the typed IR gives each name and expression, goes to definitions, completes builtins with their
signatures, lists the file's definitions, and returns the IR, CUDA C++, PTX or SASS of a kernel.

Types need one specialization per kernel. It comes from a comment above the kernel,

    # newt: sig x=*f16, y=*f16, out=*f16, n=i32 BLOCK=1024 num_warps=8

else from the kernel's last launch (the jit records it: newtc/launches.py), else from the
annotations and constexpr defaults alone, as `newtc --check` would take them. Without any, hover
shows what the source fixes and says what the launch must supply.

`Document` holds everything about one version of a file (parse, specializations, typed IR, name
bindings); the pygls layer in `server()` converts positions and messages and caches one Document
per open file and version.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import inspect
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

from . import ast as A
from . import check, cli, compiler, ir, launches, syntax
from .ast import children, walk
from .compiler import Spec
from .errors import Diagnostic, NkError, Span
from .types import DTYPES

DIRECTIVE = re.compile(r"^\s*#\s*newt:\s*sig\b(.*)$")
ITEM = re.compile(r"""([A-Za-z_]\w*)\s*=\s*("[^"]*"|'[^']*'|[^\s,]+)""")
DEBOUNCE_S = 0.05  # a change is checked when no other follows within this time
# directive items that are not parameters
OPTIONS = {"num_warps": int, "num_stages": int, "num_ctas": int, "maxnreg": int, "arch": str}
ATTRIBUTES = {"to": "x.to(dtype, bitcast=False): convert, or reinterpret the bits", "T": "x.T: trans(x)",
              "dtype": "x.dtype: the dtype (compile-time)", "shape": "x.shape: the shape, a tuple of ints (compile-time)"}
RANGES = {"range": "range(end) | range(start, end, step=1, num_stages=, unroll=): a runtime loop",
          "static_range": "static_range(end) | static_range(start, end, step=1): unrolled at compile time"}


# ---- the vocabulary: the grammar's words and the checker's names (completion, TextMate) ----------
def vocabulary() -> dict[str, list[str]]:
    """Reserved words of grammar/nk.lark, builtins of check.BUILTINS, dtypes and constants."""
    words = sorted({t.pattern.value for t in syntax._parser().terminals
                    if t.pattern.type == "str" and t.pattern.value.isidentifier()})
    return {"keywords": words, "builtins": sorted(check.BUILTINS), "dtypes": sorted(DTYPES),
            "constants": sorted(set(check.CONSTANTS) - set(DTYPES)), "annotations": ["constexpr"]}


def signature(name: str) -> str:
    """A builtin's signature as users write the call (the checker's own parameters left out)."""
    if name in RANGES:
        return RANGES[name]
    if name in check.LIBM_BUILTINS:  # one checker function serves them: their arity is data
        return f"{name}({', '.join('xy'[:check.LIBM[name]])})"
    params = list(inspect.signature(check.BUILTINS[name]).parameters.values())[2:]
    return f"{name}({', '.join(str(p) for p in params if p.name != '_name')})"


def def_signature(d: A.FuncDef, lines: list[str]) -> str:
    """`kernel add(x, y, out, n, BLOCK: constexpr)`, the header as written (joined if it spans lines)."""
    text = " ".join(s.strip() for s in lines[d.span.line - 1:d.body[0].span.line - 1])
    return " ".join(text.rstrip().removesuffix(":").split())


# ---- spans and the AST -------------------------------------------------------------------------
def contains(span: Span, line: int, col: int) -> bool:
    return (span.line, span.col) <= (line, col) < (span.end_line, span.end_col)


def name_span(node, lines: list[str]) -> Span:
    """The span of the name a Param or FuncDef introduces (their own spans start elsewhere)."""
    s = node.span
    col = s.col if isinstance(node, A.Param) else lines[s.line - 1].index(node.name, s.col - 1 + len(node.kind)) + 1
    return Span(s.file, s.line, col, s.line, col + len(node.name))


def path_to(node, line: int, col: int) -> list:
    """The nodes from `node` down to the innermost one whose span holds the position."""
    out = [node]
    while True:
        inner = next((c for c in children(out[-1]) if contains(c.span, line, col)), None)
        if inner is None:
            return out
        out.append(inner)


# ---- which definitions a name use may read ---------------------------------------------------------
@dataclass(eq=False)
class Binding:
    """A place where a name gets a value, and how to find that value in the typed IR.

    how: param | assign (node: the value expression, index: the item of a tuple assignment) | aug (node:
    the statement) | loopvar (node: the For) | carried (a loop's incoming value) and after (after a loop)
    and merge (after an if) (node: the statement, sources: the bindings that flow in)."""

    name: str
    span: Span | None  # where the name is written; None for the joins, whose sources have spans
    how: str
    node: object
    func: A.FuncDef
    index: int | None = None
    sources: list = field(default_factory=list)


class Scopes:
    """Reaching definitions on the AST. The code is structured, so one pass in order suffices: an `if`
    joins its branches, a loop's body sees its incoming values joined with its own, as check.py runs it."""

    def __init__(self, module: A.Module, lines: list[str]):
        self.uses: dict[int, list[Binding]] = {}  # id(Name) read -> the bindings it may see
        self.binds: dict[int, Binding] = {}  # id(Name) written or id(Param) -> its binding
        self.calls: dict[str, list[A.Call]] = defaultdict(list)  # callee name -> call sites
        for d in module.defs:
            self.func = d
            env = {}
            for p in d.params:
                b = self.binds[id(p)] = Binding(p.name, name_span(p, lines), "param", p, d)
                env[p.name] = [b]
                if p.default is not None:
                    self.expr(p.default, {})
            self.block(d.body, env)

    def expr(self, e, env):
        for n in walk(e):
            if isinstance(n, A.Name):
                self.uses[id(n)] = env.get(n.id, [])
            elif isinstance(n, A.Call) and isinstance(n.func, A.Name):
                self.calls[n.func.id].append(n)

    def bind(self, target, env, how, node, index=None):
        if not isinstance(target, A.Name):
            return self.expr(target, env)
        b = self.binds[id(target)] = Binding(target.id, target.span, how, node, self.func, index)
        env[target.id] = [b]

    def block(self, stmts, env) -> dict:
        for s in stmts:
            if isinstance(s, A.Assign):
                self.expr(s.value, env)
                for i, t in enumerate(s.targets):
                    self.bind(t, env, "assign", s.value, i if len(s.targets) > 1 else None)
            elif isinstance(s, A.AugAssign):
                self.expr(s.value, env)
                self.expr(s.target, env)  # read first: go to definition finds the value it updates
                self.bind(s.target, env, "aug", s)
            elif isinstance(s, (A.ExprStmt, A.Return)) and s.value is not None:
                self.expr(s.value, env)
            elif isinstance(s, A.If):
                self.expr(s.cond, env)
                a, b = self.block(s.body, dict(env)), self.block(s.orelse, dict(env))
                for n in {*a, *b}:
                    if a.get(n) is not b.get(n):
                        env[n] = [Binding(n, None, "merge", s, self.func, sources=a.get(n, []) + b.get(n, []))]
            elif isinstance(s, (A.For, A.While)):
                self.loop(s, env)
        return env

    def loop(self, s: A.For | A.While, env):
        self.expr(s.cond if isinstance(s, A.While) else s.iter, env)
        body = dict(env)
        for t in [] if isinstance(s, A.While) else s.target.items if isinstance(s.target, A.TupleExpr) else [s.target]:
            self.bind(t, body, "loopvar", s)
        carried = {n: Binding(n, None, "carried", s, self.func, sources=list(env[n]))
                   for n in check.assigned_names(s.body) if n in env}
        body.update({n: [b] for n, b in carried.items()})
        end = self.block(s.body, body)
        for n, b in carried.items():
            b.sources += [x for x in end[n] if x is not b]
        unrolled = isinstance(s, A.For) and isinstance(s.iter, A.Call) and \
            getattr(s.iter.func, "id", "") == "static_range"
        # a runtime loop may run no iteration and its own names end with it; an unrolled one runs as
        # written and leaves them bound, as check.py does
        for n in end if unrolled else carried:
            if end[n] is not env.get(n):
                env[n] = [Binding(n, None, "after", s, self.func, sources=end[n] if unrolled else [carried[n]])]


# ---- the typed IR of one kernel, by source span ------------------------------------------------------
class Typed:
    def __init__(self, k: ir.Kernel):
        self.kernel = k
        self.ops: dict[Span, list[ir.Op]] = defaultdict(list)
        for op in ir.walk(k.body):
            if op.span is not None:
                self.ops[op.span].append(op)

    def roots(self, span: Span) -> list[ir.Value]:
        """The values an expression evaluated to: results of ops at its span that no op of that span
        consumes (one per evaluation: a helper inlined twice, an unrolled loop)."""
        ops = self.ops.get(span, ())
        used = {id(a) for op in ops for a in op.args if a is not None}
        return [r for op in ops for r in op.results if id(r) not in used]

    def structured(self, span: Span, kind: str) -> list[ir.Op]:
        return [op for op in self.ops.get(span, ()) if op.kind == kind]


# ---- one version of one document ---------------------------------------------------------------------
class _Reject:
    """cli.parse_sig / cli.parse_defines report through argparse's `error`; here it becomes a diagnostic."""

    def __init__(self, span: Span):
        self.span = span

    def error(self, message: str):
        raise NkError(message, self.span)


@dataclass
class KernelView:
    defn: A.FuncDef
    spec: Spec | None = None
    origin: str = ""  # where the specialization came from
    missing: str = ""  # what a specialization still needs, when there is none
    typed: Typed | None = None
    error: NkError | None = None  # the check failed for this specialization


class Document:
    def __init__(self, text: str, filename: str, version: int | None = None):
        self.text, self.filename, self.version = text, filename, version
        self.lines = text.removeprefix("\ufeff").splitlines() or [""]
        self.diagnostics: list[Diagnostic] = []
        self.module: A.Module | None = None
        self.kernels: dict[str, KernelView] = {}
        self.defs: dict[str, A.FuncDef] = {}
        try:
            self.module = syntax.parse(text, filename)
        except NkError as err:
            self.diagnostics += err.diagnostics
            return
        self.defs = {d.name: d for d in self.module.defs}
        self.scopes = Scopes(self.module, self.lines)
        for i, d in enumerate(self.module.defs):
            if d.kind == "kernel":
                self.kernels[d.name] = self.view(d, self.module.defs[i - 1].span.end_line if i else 0)
        seen = set()
        for v in self.kernels.values():  # an error inside a helper reached from two kernels shows once
            for diag in v.error.diagnostics if v.error else ():
                if (diag.span, diag.message) not in seen:
                    seen.add((diag.span, diag.message))
                    self.diagnostics.append(diag)

    # ---- specializations -------------------------------------------------------------------------
    def view(self, d: A.FuncDef, after_line: int) -> KernelView:
        v = KernelView(d)
        candidates = []
        try:
            found = self.directive(d, after_line)
            if found:
                candidates.append(found)
        except NkError as err:
            self.diagnostics += [dataclasses.replace(x, severity="warning") for x in err.diagnostics]
        record = launches.last(self.filename, d.name)
        if record:
            try:
                candidates.append(self.recorded(d, record))
            except NkError:
                pass  # recorded for an older version of the kernel: its parameters differ
        candidates.append(({}, {}, {}, "the annotations and defaults"))
        for sig, defines, options, origin in candidates:
            try:
                sig, consts, no_sig, no_value = cli.specialization(d, sig, defines)
            except NkError as err:  # an annotation that is no type: no specialization can fix it
                v.error = err
                return v
            if no_sig or no_value:
                v.missing = v.missing or " and ".join(
                    f"{what} for {', '.join(p.name for p in ps)}"
                    for what, ps in (("types", no_sig), ("values", no_value)) if ps)
                continue
            v.spec, v.origin = Spec.of(sig, consts, **options), origin
            break
        head = name_span(d, self.lines)
        if v.spec is None:
            example = " ".join([", ".join(f"{p.name}=TYPE" for p in d.params if not check.is_constexpr_annot(p.annotation)),
                                *(f"{p.name}=VALUE" for p in d.params if check.is_constexpr_annot(p.annotation))])
            self.diagnostics.append(Diagnostic(head, f"kernel '{d.name}' parsed, not checked: it needs {v.missing}",
                                               f"add `# newt: sig {example}` above it (TYPE as in --sig: *f32, i32), "
                                               "or launch it once", severity="note"))
            return v
        try:
            v.typed = Typed(compiler.compile(self.module, d.name, v.spec, until="ir").kernel)
        except NkError as err:
            v.error = err
        except Exception as exc:  # a compiler bug: said at the kernel, and the rest of the file still works
            v.error = NkError(f"internal compiler error while checking '{d.name}': {exc!r}", head,
                              "please report it with this file")
        return v

    def directive(self, d: A.FuncDef, after_line: int):
        """(sig, defines, options, origin) from `# newt: sig` lines between the previous definition and d."""
        sig, defines, options, first = {}, {}, {}, None
        params = {p.name: p for p in d.params}
        for ln in range(after_line + 1, d.span.line):
            m = DIRECTIVE.match(self.lines[ln - 1])
            if not m:
                continue
            first = first or ln
            for item in ITEM.finditer(m.group(1)):
                name, text = item.groups()
                col = m.start(1) + item.start() + 1
                span = Span(self.filename, ln, col, ln, m.start(1) + item.end() + 1)
                if name in OPTIONS and name not in params:
                    try:
                        options[name] = OPTIONS[name](text)
                    except ValueError:
                        raise NkError(f"{name} must be an integer, got {text!r}", span) from None
                elif name not in params:
                    raise NkError(f"kernel '{d.name}' has no parameter '{name}'", span,
                                  f"parameters: {', '.join(params)}")
                elif check.is_constexpr_annot(params[name].annotation):
                    defines.update(cli.parse_defines(_Reject(span), [f"{name}={text}"]))
                else:
                    sig.update(cli.parse_sig(_Reject(span), [f"{name}={text}"]))
        return (sig, defines, options, f"the `# newt: sig` comment on line {first}") if first else None

    def recorded(self, d: A.FuncDef, r: dict):
        span = d.span
        sig, defines = cli.parse_sig(_Reject(span), r["sig"]), cli.parse_defines(_Reject(span), r["defines"])
        if {*sig, *defines} - {p.name for p in d.params}:
            raise NkError("stale record", span)
        options = {k: r[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg", "idx64", "aligned", "eights",
                                     "ones", "positive", "arch") if k in r}
        return sig, defines, options, f"the last launch (recorded {_ago(r['time'])})"

    # ---- positions ---------------------------------------------------------------------------------
    def func_at(self, line: int, col: int) -> A.FuncDef | None:
        if self.module is None:
            return None
        return next((d for d in self.module.defs if d.span.line <= line <= d.span.end_line), None)

    def values(self, b: Binding, t: Typed, seen: set) -> list:
        """The IR values a binding takes in one kernel's IR (several where a helper is inlined twice)."""
        if id(b) in seen:
            return []
        seen.add(id(b))
        if b.how == "param" and b.func.kind == "kernel":
            return [p for p in t.kernel.params if p.name == b.name] if b.func.name == t.kernel.name else []
        if b.how == "param":
            out = []
            for call in self.scopes.calls.get(b.func.name, []):  # a helper's parameter: its arguments
                i = next(i for i, p in enumerate(b.func.params) if p.name == b.name)
                arg = dict(call.kwargs).get(b.name, call.args[i] if i < len(call.args) else b.node.default)
                out += self.expr_values(arg, t, seen) if arg is not None else []
            return out
        if b.how == "assign":
            return self.expr_values(b.node, t, seen, b.index)
        if b.how == "aug":
            return t.roots(b.node.span)
        loops = t.structured(b.node.span, "for") + t.structured(b.node.span, "while")  # a loop that may break: a while
        if b.how == "loopvar":
            return [p for op in loops for p in op.regions[0].params if p.name == b.name]
        found = [v for op in (t.structured(b.node.span, "if") if b.how == "merge" else loops)
                 for v in (op.regions[0].params if b.how == "carried" else op.results) if v.name == b.name]
        return found or [v for s in b.sources for v in self.values(s, t, seen)]

    def expr_values(self, e, t: Typed, seen: set, index: int | None = None) -> list:
        if index is not None:
            if isinstance(e, A.TupleExpr):
                return self.expr_values(e.items[index], t, seen) if index < len(e.items) else []
            return [v for r in self.returns(e) if isinstance(r.value, A.TupleExpr)
                    for v in self.expr_values(r.value, t, seen, index)]
        roots = t.roots(e.span)
        if roots:
            return roots
        if isinstance(e, A.Name):
            return [v for b in self.scopes.uses.get(id(e), []) for v in self.values(b, t, seen)]
        if isinstance(e, A.Call) and isinstance(e.func, A.Attribute) and e.func.attr == "to":
            return self.expr_values(e.func.value, t, seen)  # a conversion to the dtype it has already
        return [v for r in self.returns(e) if r.value is not None for v in self.expr_values(r.value, t, seen)]

    def returns(self, e) -> list[A.Return]:
        """The return statements of the helper that a call calls."""
        d = self.defs.get(e.func.id) if isinstance(e, A.Call) and isinstance(e.func, A.Name) else None
        return [n for n in walk(d) if isinstance(n, A.Return)] if d is not None and d.kind == "def" else []

    # ---- hover -------------------------------------------------------------------------------------
    def hover(self, line: int, col: int) -> tuple[str, Span] | None:
        """Markdown for the position, and the span it describes."""
        d = self.func_at(line, col)
        if d is None or not contains(d.span, line, col):
            return None
        path = path_to(d, line, col)
        node, parent = path[-1], path[-2] if len(path) > 1 else None
        if isinstance(node, A.FuncDef):
            head = name_span(d, self.lines)
            return (self.describe_def(d), head) if contains(head, line, col) else None
        if isinstance(node, A.Param):
            span = name_span(node, self.lines)
            return (self.typed_text(d, node.name, lambda t, s: self.values(self.scopes.binds[id(node)], t, s),
                                    self.param_note(node)), span) if contains(span, line, col) else None
        if isinstance(node, A.Name):
            b = self.scopes.binds.get(id(node))
            if b is not None:
                return self.typed_text(d, node.id, lambda t, s: self.values(b, t, s)), node.span
            uses = self.scopes.uses.get(id(node), [])
            if uses:
                params = [u.node for u in uses if u.how == "param"]
                return self.typed_text(d, node.id, lambda t, s: self.expr_values(node, t, s),
                                       self.param_note(params[0]) if params else ""), node.span
            note = self.global_note(node.id)
            if isinstance(parent, A.Call) and parent.func is node and node.id not in RANGES:
                return self.typed_text(d, node.id + "(...)", lambda t, s: self.expr_values(parent, t, s), note), node.span
            return (f"```nk\n{note}\n```", node.span) if note else None
        if isinstance(node, A.Attribute) and isinstance(parent, A.Call) and parent.func is node:
            node = parent  # x.to(f16): the call is the value
        if not isinstance(node, (A.BinOp, A.UnaryOp, A.Call, A.Attribute, A.Subscript, A.TupleExpr, A.ListExpr)):
            return None  # literals (compile-time), statements
        note = self.global_note(node.func.id) if isinstance(node, A.Call) and isinstance(node.func, A.Name) else ""
        return self.typed_text(d, self.source(node.span), lambda t, s: self.expr_values(node, t, s), note), node.span

    def typed_text(self, d: A.FuncDef, label: str, find, note: str = "") -> str:
        """What each checked kernel that runs this code gives it: one line per distinct type."""
        views = [self.kernels[d.name]] if d.kind == "kernel" else list(self.kernels.values())
        found = []
        for v in (v for v in views if v.typed is not None):
            lines = list(dict.fromkeys(f"{label}: {describe(x)}" for x in find(v.typed, set())))
            if lines:
                found.append((v, lines))
        body = [note] * bool(note) + [line + f"    (in {v.defn.name})" * (len(found) > 1)
                                      for v, lines in found for line in lines]
        parts = [f"```nk\n{chr(10).join(body)}\n```"] if body else []
        parts += [f"*{v.defn.name}: {spec_text(v.spec)}, from {v.origin}*" for v, _ in found]
        if not found:
            parts.append(self.why_untyped(d, views, note))
        return "\n\n".join(p for p in parts if p)

    def why_untyped(self, d: A.FuncDef, views: list, note: str) -> str:
        typed = [v.defn.name for v in views if v.typed is not None]
        if typed:
            return "" if note else (f"No code here in {', '.join(typed)}: a folded compile-time value, a branch "
                                    "the constexprs do not take, or a helper it does not call.")
        if d.kind != "kernel":
            return "Shape, dtype and layout depend on the launch: no kernel that calls this is checked yet."
        v = views[0]
        if v.error is not None:
            return f"No types: kernel '{d.name}' does not check ({v.error.diagnostics[0].message})."
        return (f"Shape, dtype and layout depend on the launch: kernel '{d.name}' needs {v.missing}. "
                "Add a `# newt: sig` comment above it, or launch it once.")

    def describe_def(self, d: A.FuncDef) -> str:
        text = f"```nk\n{def_signature(d, self.lines)}\n```"
        if d.kind == "kernel":
            v = self.kernels[d.name]
            spec = f"specialization: {spec_text(v.spec)}, from {v.origin}" if v.spec else f"needs {v.missing}"
            return f"{text}\n\n{spec}"
        calls = len(self.scopes.calls.get(d.name, []))
        what = "a helper, inlined at each call" if d.kind == "def" else "a tile program (deuteron)"
        return f"{text}\n\n{what}; {calls} call site{'s' * (calls != 1)} in this file"

    def param_note(self, p: A.Param) -> str:
        if check.is_constexpr_annot(p.annotation):
            default = f" = {self.source(p.default.span)}" if p.default is not None else ""
            d = self.func_at(p.span.line, p.span.col)
            values = [f"in {v.defn.name}: {p.name}={dict(v.spec.constexprs)[p.name]!r}"
                      for v in self.kernels.values() if v.spec and v.defn is d and p.name in dict(v.spec.constexprs)]
            return "\n".join([f"{p.name}: constexpr{default}", *values])
        return f"{p.name}: {self.source(p.annotation.span)}" if p.annotation is not None else ""

    def global_note(self, name: str) -> str:
        if name in check.BUILTINS:
            return signature(name)
        if name in DTYPES:
            return f"dtype {name}"
        if name in check.CONSTANTS:
            return f"{name}: f32 constant (compile-time)"
        if name in self.defs:
            return def_signature(self.defs[name], self.lines)
        return ""

    def source(self, span: Span) -> str:
        if span.line == span.end_line:
            return self.lines[span.line - 1][span.col - 1:span.end_col - 1]
        return self.lines[span.line - 1][span.col - 1:].strip() + " ..."

    # ---- definitions, completion, symbols, generated code ---------------------------------------
    def definition(self, line: int, col: int) -> list[Span]:
        d = self.func_at(line, col)
        if d is None:
            return []
        node = path_to(d, line, col)[-1]
        if not isinstance(node, A.Name):
            return []
        if node.id in self.defs and not self.scopes.uses.get(id(node)):
            return [name_span(self.defs[node.id], self.lines)]
        out, todo, seen = [], list(self.scopes.uses.get(id(node)) or []), set()
        while todo:  # joins (after an if, around a loop) stand for the bindings that flow into them
            b = todo.pop(0)
            if id(b) not in seen:
                seen.add(id(b))
                out += [b.span] if b.span is not None and b.span not in out else []
                todo += b.sources
        return sorted(out, key=lambda s: (s.line, s.col))

    def completions(self, line: int, col: int) -> list[tuple[str, str, str]]:
        """(label, kind, detail) for each name that may be written at the position."""
        before = self.lines[line - 1][:col - 1] if line <= len(self.lines) else ""
        if re.search(r"\.\w*$", before):
            return [(k, "method" if k == "to" else "property", doc) for k, doc in ATTRIBUTES.items()]
        out = []
        d = self.func_at(line, col)
        if d is not None:
            local = {p.name: f"parameter of {d.name}" for p in d.params}
            local.update({n: f"local of {d.name}" for n in check.assigned_names(d.body)})
            out += [(n, "variable", doc) for n, doc in local.items()]
        vocab = vocabulary()
        out += [(n, "function", signature(n)) for n in vocab["builtins"]]
        out += [(n, "function", def_signature(x, self.lines)) for n, x in self.defs.items()]
        out += [(n, "type", f"dtype {n}") for n in vocab["dtypes"]]
        out += [(n, "constant", "f32 constant") for n in vocab["constants"]]
        out += [(n, "keyword", "") for n in vocab["keywords"] + vocab["annotations"]]
        return out

    def symbols(self) -> list[tuple[A.FuncDef, Span, list]]:
        if self.module is None:
            return []
        return [(d, name_span(d, self.lines), [(p, name_span(p, self.lines)) for p in d.params]) for d in self.module.defs]

    def generated(self, line: int, col: int, what: str) -> tuple[str, str]:
        """(kernel name, text) of the IR, CUDA C++, PTX or SASS of the kernel at the position (for a
        helper, the first checked kernel that inlines it)."""
        if what not in ("ir", "cuda", "ptx", "sass"):
            raise NkError(f"unknown output '{what}'", hint="ir, cuda, ptx or sass")
        d = self.func_at(line, col)
        if d is None:
            raise NkError("put the cursor inside a kernel or a helper")
        views = [self.kernels[d.name]] if d.kind == "kernel" else \
            [v for v in self.kernels.values() if v.typed and any(s.line >= d.span.line and s.end_line <= d.span.end_line
                                                                 for s in v.typed.ops)]
        if not views:
            raise NkError(f"no checked kernel calls '{d.name}'")
        v = views[0]
        if v.spec is None:
            raise NkError(f"kernel '{v.defn.name}' has no specialization: it needs {v.missing}",
                          name_span(v.defn, self.lines), "add a `# newt: sig` comment above it, or launch it once")
        if v.error is not None:
            raise v.error
        text = cli.stage_text(self.module, v.defn.name, v.spec, what)
        return v.defn.name, text


def describe(v: ir.Value) -> str:
    """`block[128, 64] f32, layout r[..] l[..] w[..]`: the value's type in the typed IR."""
    t = v.type
    if not t.shape:
        return f"scalar {t.dtype}"
    layout = v.layout.short() if v.layout is not None else "free (each consumer computes it in its own layout)"
    return f"block[{', '.join(map(str, t.shape))}] {t.dtype}, layout {layout}"


def spec_text(spec: Spec) -> str:
    items = [f"{n}={t.name}" for n, t in spec.sig] + [f"{n}={v!r}" for n, v in spec.constexprs]
    options = [f"num_warps={spec.num_warps}"] + [f"num_stages={spec.num_stages}"] * (spec.num_stages != 1)
    return ", ".join(items + options + [f"num_ctas={spec.num_ctas}"] * (spec.num_ctas != 1))


def _ago(t: float) -> str:
    s = max(0, time.time() - t)
    return next((f"{int(s // u)} {name} ago" for u, name in ((86400, "days"), (3600, "h"), (60, "min")) if s >= u),
                f"{int(s)} s ago")


# ---- the protocol ------------------------------------------------------------------------------------
def server():
    """The pygls server: each request converts positions, asks the Document of the latest version."""
    from lsprotocol import types as T
    from pygls.lsp.server import LanguageServer

    ls = LanguageServer("newtc", "0.1.0", text_document_sync_kind=T.TextDocumentSyncKind.Incremental)
    docs: dict[str, Document] = {}  # uri -> the analysis of its latest version
    severity = {"error": T.DiagnosticSeverity.Error, "warning": T.DiagnosticSeverity.Warning,
                "note": T.DiagnosticSeverity.Hint}
    kinds = {"variable": T.CompletionItemKind.Variable, "function": T.CompletionItemKind.Function,
             "type": T.CompletionItemKind.TypeParameter, "constant": T.CompletionItemKind.Constant,
             "keyword": T.CompletionItemKind.Keyword, "method": T.CompletionItemKind.Method,
             "property": T.CompletionItemKind.Property}

    def document(uri: str, fresh: bool = False):
        td = ls.workspace.get_text_document(uri)
        doc = docs.get(uri)
        if fresh or doc is None or doc.version != td.version or doc.text != td.source:
            doc = docs[uri] = Document(td.source, td.path or uri, td.version)
        return td, doc

    def position(td, pos) -> tuple[int, int]:
        p = td.position_from_client_units(pos)
        return p.line + 1, p.character + 1

    def to_range(td, span: Span | None):
        if span is None:
            return T.Range(T.Position(0, 0), T.Position(0, 0))
        end = (span.end_line, span.end_col) if span.end_line else (span.line, span.col + 1)
        return td.range_to_client_units(T.Range(T.Position(span.line - 1, span.col - 1),
                                                T.Position(end[0] - 1, end[1] - 1)))

    def publish(uri: str, fresh: bool = False):
        td, doc = document(uri, fresh)
        out = []
        for d in doc.diagnostics:
            rng = to_range(td, d.span)
            related = [T.DiagnosticRelatedInformation(T.Location(uri, rng), f"hint: {d.hint}")] if d.hint else None
            out.append(T.Diagnostic(rng, d.message, severity=severity[d.severity], source="newtc",
                                    related_information=related))
        ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri, out, version=td.version))

    @ls.feature(T.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: T.DidOpenTextDocumentParams):
        publish(params.text_document.uri)

    @ls.feature(T.TEXT_DOCUMENT_DID_CHANGE)
    async def did_change(params: T.DidChangeTextDocumentParams):
        await asyncio.sleep(DEBOUNCE_S)  # while typing, only the version that stays a moment is checked
        if ls.workspace.get_text_document(params.text_document.uri).version == params.text_document.version:
            publish(params.text_document.uri)

    @ls.feature(T.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: T.DidSaveTextDocumentParams):
        publish(params.text_document.uri, fresh=True)  # a launch since may have recorded a specialization

    @ls.feature(T.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: T.DidCloseTextDocumentParams):
        docs.pop(params.text_document.uri, None)
        ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(params.text_document.uri, []))

    @ls.feature(T.TEXT_DOCUMENT_HOVER)
    def hover(params: T.HoverParams):
        td, doc = document(params.text_document.uri)
        found = doc.hover(*position(td, params.position))
        if not found:
            return None
        text, span = found
        return T.Hover(T.MarkupContent(T.MarkupKind.Markdown, text), to_range(td, span))

    @ls.feature(T.TEXT_DOCUMENT_DEFINITION)
    def definition(params: T.DefinitionParams):
        td, doc = document(params.text_document.uri)
        return [T.Location(td.uri, to_range(td, s)) for s in doc.definition(*position(td, params.position))] or None

    @ls.feature(T.TEXT_DOCUMENT_COMPLETION, T.CompletionOptions(trigger_characters=["."]))
    def completion(params: T.CompletionParams):
        td, doc = document(params.text_document.uri)
        items = [T.CompletionItem(label, kind=kinds[kind], detail=detail or None, sort_text=f"{kind != 'variable'}{label}")
                 for label, kind, detail in doc.completions(*position(td, params.position))]
        return T.CompletionList(is_incomplete=False, items=items)

    @ls.feature(T.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    def symbols(params: T.DocumentSymbolParams):
        td, doc = document(params.text_document.uri)
        out = []
        for d, head, params_ in doc.symbols():
            kids = [T.DocumentSymbol(p.name, T.SymbolKind.Constant if check.is_constexpr_annot(p.annotation)
                                     else T.SymbolKind.Variable, to_range(td, p.span), to_range(td, s))
                    for p, s in params_]
            detail = {"kernel": "kernel", "def": "helper", "tile": "tile program"}[d.kind]
            out.append(T.DocumentSymbol(d.name, T.SymbolKind.Function, to_range(td, d.span), to_range(td, head),
                                        detail=detail, children=kids))
        return out

    @ls.command("newt.generated")
    def generated(uri: str, line: int, character: int, what: str):
        """[uri, line, character, ir|cuda|ptx|sass] -> {kernel, what, text}; an error is a JSON-RPC error."""
        td, doc = document(uri)
        name, text = doc.generated(*position(td, T.Position(line, character)), what)
        return {"kernel": name, "what": what, "text": text}

    return ls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="newtc lsp", description="the .nk language server, over stdio")
    p.add_argument("--stdio", action="store_true", help="talk over standard input and output (the default)")
    p.parse_args(argv)
    try:
        ls = server()
    except ImportError as e:
        print(f"newtc lsp: {e.name} is missing; install the server with: pip install 'newt[lsp]'", file=sys.stderr)
        return 2
    gc.freeze()  # the objects of the imports (torch's, with newtc) leave every collection: no 90 ms pause mid-hover
    ls.start_io()
    return 0
