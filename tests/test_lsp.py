"""`newtc lsp` end to end: a real LSP client (pytest-lsp) talks to the server over stdio.

The expected types, diagnostics and generated code come from the compiler itself (compiler.compile,
the newtc command), so the server is checked against what newt really produces."""
import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("pygls", reason="the language server needs the [lsp] extra (pygls, lsprotocol)")
pytest_lsp = pytest.importorskip("pytest_lsp", reason="the LSP tests need pytest-lsp (the [test] extra)")
import pytest_asyncio  # noqa: E402  (installed with pytest-lsp)
from lsprotocol import types as T  # noqa: E402

from newtc import check, cli, compiler, ir, syntax  # noqa: E402
from newtc.compiler import Spec  # noqa: E402
from newtc.lsp import describe  # noqa: E402
from newtc.types import parse_type  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STDLIB = ROOT / "stdlib"
# kernels whose text the assertions below quote: copies that stay as they are while the stdlib changes
DATA = ROOT / "tests" / "data"
pytestmark = pytest.mark.asyncio(loop_scope="module")

SOFTMAX_SIG = "x=*f16, out=*f16, n_cols=i32, stride=i32 BLOCK=1024"
BROKEN = """\
# newt: sig x=*f32, n=i32 BLOCK=256
kernel scale(x, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    store(x + offs, lod(x + offs) * 2.0, mask=offs < n)
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    config = pytest_lsp.ClientServerConfig([sys.executable, "-m", "newtc", "lsp"],
                                           server_env={**os.environ, "NEWT_CACHE_DIR": str(cache)})
    c = await config.start()
    c.cache_dir = cache
    await c.initialize_session(T.InitializeParams(capabilities=pytest_lsp.client_capabilities("visual-studio-code")))
    yield c
    await c.shutdown_session()
    await c.stop()


def at(text: str, needle: str, nth: int = 0, offset: int = 0) -> T.Position:
    """The position of the nth occurrence of `needle` (plus offset characters)."""
    i = -1
    for _ in range(nth + 1):
        i = text.index(needle, i + 1)
    line = text.count("\n", 0, i)
    return T.Position(line, i - (text.rfind("\n", 0, i) + 1) + offset)


async def open_doc(client, path: Path, text: str, version: int = 1) -> str:
    uri = path.as_uri()
    client.text_document_did_open(T.DidOpenTextDocumentParams(T.TextDocumentItem(uri, "nk", version, text)))
    await wait_diagnostics(client, uri, version)
    return uri


async def wait_diagnostics(client, uri: str, version: int):
    while True:
        params = await asyncio.wait_for(client.wait_for_notification(T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS), 60)
        if params.uri == uri and params.version == version:
            return params.diagnostics


async def hover(client, uri, pos) -> str:
    h = await client.text_document_hover_async(T.HoverParams(T.TextDocumentIdentifier(uri), pos))
    return h.contents.value if h else ""


def typed_lines(markdown: str) -> list[str]:
    """The code block of a hover: its `name: type` lines."""
    block = re.search(r"```nk\n(.*?)\n```", markdown, re.S)
    return block.group(1).splitlines() if block else []


def with_sig(path: Path, kernel: str, sig: str) -> str:
    return path.read_text().replace(f"kernel {kernel}(", f"# newt: sig {sig}\nkernel {kernel}(")


def errors(diags):
    return [d for d in diags if d.severity == T.DiagnosticSeverity.Error]


async def test_diagnostics_are_newtc_checks(client, tmp_path, capsys):
    path = tmp_path / "broken.nk"
    path.write_text(BROKEN)
    uri = await open_doc(client, path, BROKEN)
    rc = cli.main(["--check", str(path), "--sig", "x=*f32,n=i32", "-D", "BLOCK=256"])
    err = capsys.readouterr().err
    assert rc == 1
    line, col, message = re.match(rf"{re.escape(str(path))}:(\d+):(\d+): error: (.*)", err).groups()
    hint = re.search(r"hint: (.*)", err).group(1)
    (d,) = errors(client.diagnostics[uri])
    assert (d.range.start.line + 1, d.range.start.character + 1, d.message) == (int(line), int(col), message)
    assert d.related_information[0].message == f"hint: {hint}"

    # fix the name as a user would type it: the error goes away
    fixed = BROKEN.replace("lod(", "load(")
    where = at(BROKEN, "lod(", offset=2)
    client.text_document_did_change(T.DidChangeTextDocumentParams(
        T.VersionedTextDocumentIdentifier(version=2, uri=uri), [T.TextDocumentContentChangePartial(T.Range(where, where), "a")]))
    assert errors(await wait_diagnostics(client, uri, 2)) == []
    assert "block[256] f32" in await hover(client, uri, at(fixed, "* 2.0", offset=0))  # the product, typed


async def test_syntax_error_then_fixed(client, tmp_path):
    text = "kernel k(x, n):\n    y = (x + \n    store(x, y)\n"
    uri = await open_doc(client, tmp_path / "syntax.nk", text)
    try:
        syntax.parse(text, "syntax.nk")
    except check.NkError as e:
        expected = e.diagnostics[0]
    (d,) = errors(client.diagnostics[uri])
    assert (d.range.start.line + 1, d.range.start.character + 1) == (expected.span.line, expected.span.col)
    assert d.message == expected.message
    client.text_document_did_change(T.DidChangeTextDocumentParams(
        T.VersionedTextDocumentIdentifier(version=2, uri=uri),
        [T.TextDocumentContentChangeWholeDocument("kernel k(x: *f32, n: i32):\n    store(x, n)\n")]))
    assert errors(await wait_diagnostics(client, uri, 2)) == []


def ir_values(path: Path, text: str, kernel: str, sig: dict, consts: dict, line: int, name: str) -> list:
    """The compiler's own answer: values named `name` defined on `line` (1-based) of the kernel's IR."""
    module = syntax.parse(text, str(path))
    k = compiler.compile(module, kernel, Spec.of({n: parse_type(t) for n, t in sig.items()}, consts), until="ir").kernel
    return [describe(r) for op in ir.walk(k.body) if op.span and op.span.line == line for r in op.results if r.name == name]


async def test_hover_shows_ir_types_and_layouts(client):
    path = DATA / "softmax.nk"
    text = with_sig(path, "softmax", SOFTMAX_SIG)
    uri = await open_doc(client, path, text)
    pos = at(text, "v = load(")
    (expected,) = ir_values(path, text, "softmax", {"x": "*f16", "out": "*f16", "n_cols": "i32", "stride": "i32"},
                            {"BLOCK": 1024}, pos.line + 1, "v")
    assert "layout r[" in expected
    shown = await hover(client, uri, pos)
    assert typed_lines(shown) == [f"v: {expected}"] and "from the `# newt: sig` comment" in shown
    # the load itself is f16 (the .to(f32) converts it); the same layout
    assert f"load(...): block[1024] f16, layout {expected.split('layout ')[1]}" in await hover(client, uri, at(text, "load(", 0))
    # a later use of the name reads the same value
    assert typed_lines(await hover(client, uri, at(text, "max(v", offset=4))) == [f"v: {expected}"]
    # kernels without a specialization say what the launch must supply
    unknown = await hover(client, uri, at(text, "mx = max(v", offset=0))
    assert "depend on the launch" in unknown and "cross_entropy" in unknown
    # a constexpr shows its value
    assert "BLOCK=1024" in await hover(client, uri, at(text, "arange(0, BLOCK)", offset=11))


async def test_hover_in_a_helper_shows_each_kernel(client):
    path = DATA / "softmax.nk"
    text = with_sig(path, "softmax_looped", "x=*f32, out=*f32, n_cols=i32, stride=i32 BLOCK=4096 WARPS=4 VEC=4")
    text = text.replace("kernel cross_entropy(", "# newt: sig logits=*bf16, target=*i64, loss=*f32, n_cols=i32, "
                        "stride=i32 BLOCK=2048 WARPS=2 VEC=8\nkernel cross_entropy(")
    uri = await open_doc(client, path, text)
    shown = await hover(client, uri, at(text, "m_new = maximum"))
    assert "block[4, 32] f32" in shown and "(in softmax_looped)" in shown
    assert "block[2, 32] f32" in shown and "(in cross_entropy)" in shown
    assert "x: scalar *bf16    (in cross_entropy)" in await hover(client, uri, at(text, "def row_stats(x", offset=14))


async def test_hover_from_the_last_launch(client, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import newtc

    path = tmp_path / "add.nk"
    path.write_text((STDLIB / "add.nk").read_text())
    monkeypatch.setenv("NEWT_CACHE_DIR", str(client.cache_dir))  # where the server looks for launches
    x = torch.randn(300, dtype=torch.float16)
    y, out = torch.randn_like(x), torch.full_like(x, float("nan"))
    newtc.load(str(path)).add[(2,)](x, y, out, x.numel(), BLOCK=256)  # CPU tensors: the interpreter
    torch.testing.assert_close(out, x + y)
    text = path.read_text()
    uri = await open_doc(client, path, text)
    assert not client.diagnostics[uri]  # the recorded launch specializes (and checks) the kernel
    shown = await hover(client, uri, at(text, "offs ="))
    assert "offs: block[256] i32" in shown and "from the last launch" in shown
    assert "scalar *f16" in await hover(client, uri, at(text, "x, y"))


async def test_definition(client, tmp_path):
    path = STDLIB / "gelu.nk"
    text = path.read_text()
    uri = await open_doc(client, path, text)

    async def goto(pos):
        out = await client.text_document_definition_async(T.DefinitionParams(T.TextDocumentIdentifier(uri), pos))
        return sorted((loc.range.start.line, loc.range.start.character) for loc in out or [])

    helper = at(text, "gelu(v):", offset=0)
    assert await goto(at(text, "gelu(v), mask")) == [(helper.line, helper.character)]
    v = at(text, "v = load")
    assert await goto(at(text, "gelu(v), mask", offset=5)) == [(v.line, v.character)]
    mask = at(text, "mask = ")
    assert await goto(at(text, "mask=mask", offset=5)) == [(mask.line, mask.character)]

    # a loop-carried name: its value before the loop and its update in the body
    path = DATA / "norm.nk"
    text = path.read_text()
    uri = await open_doc(client, path, text)
    use = at(text, "sum(acc", offset=4)
    first, update = at(text, "acc = zeros"), at(text, "acc += ")
    assert await goto(use) == sorted([(first.line, first.character), (update.line, update.character)])

    # joins that feed each other (an if inside loops inside a loop): every assignment, once
    text = "# newt: sig x=*f32, n=i32\nkernel k(x, n):\n    a = 0.0\n    for i in range(n):\n        if i > 2:\n" \
           "            a = a + 1.0\n        for j in range(n):\n            if j > 1:\n                a = a * 2.0\n" \
           "    store(x, a)\n"
    uri = await open_doc(client, tmp_path / "nested.nk", text)
    assigned = [at(text, "a = 0.0"), at(text, "a = a + 1.0"), at(text, "a = a * 2.0")]
    assert await goto(at(text, "store(x, a)", offset=9)) == [(p.line, p.character) for p in assigned]


async def test_completion_offers_builtins_with_signatures(client):
    path = STDLIB / "add.nk"
    text = path.read_text()
    uri = await open_doc(client, path, text)
    items = await client.text_document_completion_async(
        T.CompletionParams(T.TextDocumentIdentifier(uri), at(text, "mask = offs", offset=7)))
    by_label = {i.label: i for i in items.items}
    for name in check.BUILTINS:
        assert by_label[name].kind == T.CompletionItemKind.Function
        assert by_label[name].detail.startswith(name + "(")
    assert by_label["load"].detail == "load(ptr, mask=None, other=None, boundary_check=None, padding_option=None)"
    assert by_label["offs"].kind == T.CompletionItemKind.Variable and "f16" in by_label and "kernel" in by_label
    dot = await client.text_document_completion_async(
        T.CompletionParams(T.TextDocumentIdentifier(uri), at(text, "offs < n", offset=0)))
    assert "to" not in {i.label for i in dot.items}
    text2 = text.replace("mask = offs < n", "mask = offs.")
    client.text_document_did_change(T.DidChangeTextDocumentParams(
        T.VersionedTextDocumentIdentifier(version=2, uri=uri), [T.TextDocumentContentChangeWholeDocument(text2)]))
    items = await client.text_document_completion_async(
        T.CompletionParams(T.TextDocumentIdentifier(uri), at(text2, "offs.", offset=5)))
    assert {i.label for i in items.items} == {"to", "dtype", "shape", "T"}


async def test_document_symbols(client, tmp_path):
    text = (DATA / "softmax.nk").read_text() + "\ntile matmul(a, b, c):\n    pass\n"
    uri = await open_doc(client, tmp_path / "symbols.nk", text)
    out = await client.text_document_document_symbol_async(T.DocumentSymbolParams(T.TextDocumentIdentifier(uri)))
    module = syntax.parse(text, "symbols.nk")
    assert [(s.name, s.detail) for s in out] == [
        (d.name, {"kernel": "kernel", "def": "helper", "tile": "tile program"}[d.kind]) for d in module.defs]
    assert [c.name for c in out[0].children] == [p.name for p in module.defs[0].params]
    assert out[0].children[4].kind == T.SymbolKind.Constant  # BLOCK: constexpr
    head = at(text, "softmax(")
    assert (out[0].selection_range.start.line, out[0].selection_range.start.character) == (head.line, head.character)


@pytest.mark.parametrize("what", ["ir", "cuda", "ptx", "sass"])
async def test_generated_code_is_the_compilers(client, what):
    path = DATA / "softmax.nk"
    text = with_sig(path, "softmax", SOFTMAX_SIG)
    uri = await open_doc(client, path, text)
    pos = at(text, "num = exp")
    out = await client.workspace_execute_command_async(
        T.ExecuteCommandParams("newt.generated", [uri, pos.line, pos.character, what]))
    spec = Spec.of({"x": parse_type("*f16"), "out": parse_type("*f16"), "n_cols": parse_type("i32"),
                    "stride": parse_type("i32")}, {"BLOCK": 1024})
    expected = cli.stage_text(syntax.parse(text, str(path)), "softmax", spec, what)
    strip = (lambda s: re.sub(r"%[a-z_]*\d+", "%", s)) if what == "ir" else (lambda s: s)  # value ids are global
    assert out["kernel"] == "softmax" and strip(out["text"]) == strip(expected)


async def test_generated_code_needs_a_specialization(client):
    path = STDLIB / "add.nk"
    text = path.read_text()
    uri = await open_doc(client, path, text)
    pos = at(text, "mask = ")
    with pytest.raises(Exception, match="kernel 'add' has no specialization"):
        await client.workspace_execute_command_async(
            T.ExecuteCommandParams("newt.generated", [uri, pos.line, pos.character, "cuda"]))
