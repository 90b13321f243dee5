// The official `openai` npm client's embeddings.create against rlx serve --embedding: one input,
// several, token ids, and base64 (which the client asks for by default and decodes itself).
// Prints one JSON object of what each call returned, for check_embeddings.py to compare with
// NumPy; any exception the client throws fails the run.
//   node openai_embeddings.js NPM_DIR BASE_URL API_KEY IDS_JSON
'use strict';
const path = require('path');

const [npmDir, baseURL, apiKey, idsJson] = process.argv.slice(2);
const OpenAI = require(path.resolve(npmDir, 'node_modules', 'openai')).default;

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const ids = JSON.parse(idsJson);
  const model = 'text-embedding-3-small';
  const out = {};
  // without encoding_format the client asks for base64 and decodes it into numbers
  const single = await client.embeddings.create({ model, input: ids[0] });
  out.single = { data: single.data.map((d) => Array.from(d.embedding)), usage: single.usage, model: single.model };
  const many = await client.embeddings.create({ model, input: ids, encoding_format: 'float' });
  out.many = { data: many.data.map((d) => d.embedding), index: many.data.map((d) => d.index), usage: many.usage };
  const text = await client.embeddings.create({ model, input: ['Hello world', 'The jury said'] });
  out.text = text.data.map((d) => Array.from(d.embedding));
  process.stdout.write(JSON.stringify(out));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err));
  process.exit(1);
});
