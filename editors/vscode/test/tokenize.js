// Tokenize files with VS Code's own TextMate engine (vscode-textmate + vscode-oniguruma).
// usage: node tokenize.js GRAMMAR.json FILE...  ->  JSON {file: [[[text, [scopes...]], ...] per line]}
const fs = require("fs");
const path = require("path");
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

const [grammarPath, ...files] = process.argv.slice(2);
const wasm = fs.readFileSync(path.join(path.dirname(require.resolve("vscode-oniguruma")), "onig.wasm"));
const onigLib = oniguruma.loadWASM(wasm.buffer).then(() => ({
  createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
  createOnigString: (s) => new oniguruma.OnigString(s),
}));
const registry = new vsctm.Registry({
  onigLib,
  loadGrammar: async () => vsctm.parseRawGrammar(fs.readFileSync(grammarPath, "utf8"), grammarPath),
});

registry.loadGrammar("source.nk").then((grammar) => {
  const out = {};
  for (const file of files) {
    let state = vsctm.INITIAL;
    out[file] = fs.readFileSync(file, "utf8").split(/\r?\n/).map((line) => {
      const r = grammar.tokenizeLine(line, state);
      state = r.ruleStack;
      return r.tokens.map((t) => [line.slice(t.startIndex, t.endIndex), t.scopes]);
    });
  }
  process.stdout.write(JSON.stringify(out));
});
