// The VS Code side of newt: starts `newtc lsp` for .nk files, and shows a kernel's generated code.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

async function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("newt").get("server.command");
  client = new LanguageClient("newt", "newt (.nk)", { command, args }, { documentSelector: [{ language: "nk" }] });
  context.subscriptions.push(vscode.commands.registerCommand("newt.showGenerated", showGenerated));
  await client.start();
}

// Ask the server for the CUDA C++ / IR / PTX / SASS of the kernel under the cursor; open it beside the source.
async function showGenerated(what) {
  const editor = vscode.window.activeTextEditor;
  if (!editor || editor.document.languageId !== "nk") return;
  what = what || (await vscode.window.showQuickPick(["cuda", "ir", "ptx", "sass"], { placeHolder: "show the kernel as" }));
  if (!what) return;
  const pos = editor.selection.active;
  try {
    const out = await client.sendRequest("workspace/executeCommand", {
      command: "newt.generated",
      arguments: [editor.document.uri.toString(), pos.line, pos.character, what],
    });
    const language = what === "cuda" ? "cuda-cpp" : "plaintext";
    const doc = await vscode.workspace.openTextDocument({ content: out.text, language });
    await vscode.window.showTextDocument(doc, { viewColumn: vscode.ViewColumn.Beside, preview: true });
  } catch (err) {
    vscode.window.showErrorMessage(`newt: ${err.message}`);
  }
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
