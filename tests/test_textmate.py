"""The TextMate grammar of the VS Code extension against the language.

The grammar file is generated (editors/vscode/gen_grammar.py) from grammar/nk.lark and newtc.check;
the first test fails when the committed file drifts from what the generator writes now. The others
tokenize every stdlib and example file, and a sample holding every reserved word, builtin, dtype,
constant and operator, with VS Code's own engine (vscode-textmate + vscode-oniguruma, through node),
and compare each token's scope with what newt's own lexer says the token is."""
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from newtc import syntax
from newtc.lsp import vocabulary

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "editors" / "vscode"
spec = importlib.util.spec_from_file_location("gen_grammar", EXT / "gen_grammar.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)
FILES = sorted(ROOT.glob("stdlib/*.nk")) + sorted(ROOT.glob("examples/**/*.nk"))


def test_committed_grammar_is_generated():
    for kind, text in gen.generate().items():
        assert gen.FILES[kind].read_text() == text, \
            f"{gen.FILES[kind]} is out of date: run python editors/vscode/gen_grammar.py"


def sample() -> str:
    """A file that parses and holds every word, builtin, dtype, constant and operator of the language."""
    vocab = vocabulary()
    _, _, operators, _ = gen.grammar_facts()
    lines = ["# newt: sig x=*f32, n=i32 B=4", "kernel k(x: *f32, n: i32, B: constexpr = 4):"]
    lines += [f"    v = {b}(x)" for b in vocab["builtins"]]
    lines += [f"    v = x.to({d})" for d in vocab["dtypes"]] + [f"    v = {c}" for c in vocab["constants"]]
    lines += ["    v = 1 + 0x1f + 0b101 + 1_000 + 1.5 + .5 + 1. + 1e-5 + 2.5E+3  # numbers", "    v = 'a' + \"b\\\"c\"",
              "    tile = kernel + 1  # names here, not keywords"]
    for o in sorted(operators):
        if o.endswith("=") and o not in ("==", "!=", "<=", ">=", "="):
            lines.append(f"    v {o} 1")
        elif o == "~":
            lines.append("    v = ~a")
        elif o not in ("=", "*"):
            lines.append(f"    v = a {o} b")
    lines += ["    if a and b or not c:", "        pass", "    elif True:", "        v = None", "    else:",
              "        for i in range(3):", "            v = False", "    while a:", "        break",
              "    while b:", "        continue",
              "def h(v):", "    return v", "tile t(a):", "    pass"]
    return "\n".join(lines) + "\n"


def expected_scopes(text: str) -> dict:
    """(line, col) -> the scope each token must have, from newt's own lexer (None: no highlighting)."""
    role, _, operators, _ = gen.grammar_facts()
    vocab = vocabulary()
    by_name = {**{b: "support.function.builtin.nk" for b in vocab["builtins"]},
               **{d: "support.type.dtype.nk" for d in vocab["dtypes"]},
               **{c: "constant.language.nk" for c in vocab["constants"]},
               **{a: "storage.modifier.constexpr.nk" for a in vocab["annotations"]}}
    literal = {"INT": "constant.numeric.integer.nk", "FLOAT": "constant.numeric.float.nk", "STRING": "string.quoted.nk"}
    out, previous = {}, None
    for tok in syntax._parser().parse_interactive(text + "\n").iter_parse():
        where = (tok.line, tok.column)
        if tok.type == "_NEWLINE":  # blank lines and comments: each comment starts at a '#'
            line, col, in_comment = tok.line, tok.column, False
            for ch in str(tok):
                if ch == "#" and not in_comment:
                    out[(line, col)], in_comment = "punctuation.definition.comment.nk", True
                line, col, in_comment = (line + 1, 1, False) if ch == "\n" else (line, col + 1, in_comment)
        elif tok.type.startswith("_"):
            continue
        elif tok.type == "NAME":
            defining = previous is not None and previous.type != "NAME" and str(previous) in role \
                and role[str(previous)] == gen.ROLES["_deftype"]
            attribute = previous is not None and str(previous) == "."  # x.T, libdevice.asin: not highlighted
            out[where] = "entity.name.function.nk" if defining else None if attribute else by_name.get(str(tok))
        elif str(tok) in role:
            out[where] = role[str(tok)]
        else:
            out[where] = literal.get(tok.type, "keyword.operator.nk" if str(tok) in operators else None)
        previous = tok
    return out


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    """{file: {(line, col): innermost scope}} from VS Code's tokenizer, for the sample and every .nk file."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the TextMate tests need node and npm")
    if not (EXT / "node_modules" / "vscode-textmate").is_dir() or not (EXT / "node_modules" / "vscode-oniguruma").is_dir():
        pytest.skip("vscode-textmate / vscode-oniguruma are not installed: run `npm ci` in editors/vscode "
                    "(.ci/run does; it could not reach the npm registry)")
    sample_file = tmp_path_factory.mktemp("textmate") / "sample.nk"
    sample_file.write_text(sample())
    run = subprocess.run(["node", str(EXT / "test" / "tokenize.js"), str(gen.FILES["grammar"]),
                          str(sample_file), *map(str, FILES)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = {}
    for file, lines in json.loads(run.stdout).items():
        scopes = {}
        for ln, tokens in enumerate(lines, 1):
            col = 1
            for text, token_scopes in tokens:
                for _ in text:
                    scopes[(ln, col)] = token_scopes[-1]
                    col += 1
        out[Path(file).name if Path(file) != sample_file else "<sample>"] = scopes
    return out


def check_file(name: str, text: str, scopes: dict):
    wrong = []
    for (line, col), want in expected_scopes(text).items():
        got = scopes.get((line, col), "source.nk")
        if got != (want or "source.nk"):
            word = text.splitlines()[line - 1][col - 1:].split()[0]
            wrong.append(f"{name}:{line}:{col} {word!r}: {got} (want {want or 'no scope'})")
    assert not wrong, "\n".join(wrong)


def test_sample_covers_the_language():
    words = {str(t) for t in syntax._parser().parse_interactive(sample() + "\n").iter_parse()}
    role, _, operators, _ = gen.grammar_facts()
    vocab = vocabulary()
    missing = (set(role) | operators | {w for k in ("builtins", "dtypes", "constants", "annotations")
                                         for w in vocab[k]}) - words
    assert not missing, f"add these to sample(): {sorted(missing)}"


def test_every_word_of_the_language_gets_its_scope(tokenized):
    check_file("<sample>", sample(), tokenized["<sample>"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_stdlib_and_examples(tokenized, path):
    check_file(path.name, path.read_text(), tokenized[path.name])


def test_extension_client_is_valid_javascript():
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    run = subprocess.run(["node", "--check", str(EXT / "extension.js")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
