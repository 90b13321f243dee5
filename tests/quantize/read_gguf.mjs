// Reads GGUF files with Hugging Face's parser (@huggingface/gguf) and checks what it finds against
// the expectations rlx's test passes: the architecture, the tensor names and types, the metadata
// keys. Prints one line per file; exits 1 on any mismatch.
//   node read_gguf.mjs --npm DIR FILE.gguf EXPECT.json [FILE.gguf EXPECT.json ...]
import { createRequire } from "module";
import { readFileSync } from "fs";
import path from "path";

const args = process.argv.slice(2);
const npm = args[args.indexOf("--npm") + 1];
const files = args.filter((a, i) => a !== "--npm" && args[i - 1] !== "--npm");
const require = createRequire(path.join(npm, "node_modules", "x.js"));
const { gguf, GGMLQuantizationType } = require("@huggingface/gguf");

let failed = 0;
for (let i = 0; i < files.length; i += 2) {
  const file = path.resolve(files[i]);
  const want = JSON.parse(readFileSync(files[i + 1], "utf8"));
  const { metadata, tensorInfos } = await gguf(file, { allowLocalFile: true });
  const problems = [];
  if (metadata["general.architecture"] !== want.architecture)
    problems.push(`architecture ${metadata["general.architecture"]}`);
  const keys = Object.keys(metadata).filter((k) => k !== "version" && k !== "tensor_count" && k !== "kv_count");
  for (const k of want.keys) if (!keys.includes(k)) problems.push(`missing key ${k}`);
  if (keys.length !== want.keys.length) problems.push(`${keys.length} keys, expected ${want.keys.length}`);
  const byName = new Map(tensorInfos.map((t) => [t.name, t]));
  if (byName.size !== Object.keys(want.tensors).length)
    problems.push(`${byName.size} tensors, expected ${Object.keys(want.tensors).length}`);
  for (const [name, [type, dims]] of Object.entries(want.tensors)) {
    const t = byName.get(name);
    if (!t) {
      problems.push(`no tensor ${name}`);
      continue;
    }
    if (GGMLQuantizationType[t.dtype] !== type) problems.push(`${name}: ${GGMLQuantizationType[t.dtype]}, expected ${type}`);
    if (t.shape.map(Number).join(",") !== dims.join(",")) problems.push(`${name}: shape ${t.shape}, expected ${dims}`);
  }
  const tokens = metadata["tokenizer.ggml.tokens"];
  if (!Array.isArray(tokens) || tokens.length !== want.n_tokens) problems.push(`tokens: ${tokens && tokens.length}`);
  console.log(`${path.basename(file)}: ${tensorInfos.length} tensors, ${keys.length} keys: ${problems.length ? "FAIL " + problems.join("; ") : "ok"}`);
  failed += problems.length > 0;
}
process.exit(failed ? 1 : 0);
