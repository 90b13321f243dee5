// The official `openai` npm client against rlx serve: chat and completions, streamed and not,
// greedy. Prints one JSON object with what each call returned, for check_openai.py to compare
// with `rlx generate`; any exception the client throws fails the run.
//   node openai_client.js NPM_DIR BASE_URL API_KEY PROMPT N
'use strict';
const path = require('path');

const [npmDir, baseURL, apiKey, prompt, n] = process.argv.slice(2);
const OpenAI = require(path.resolve(npmDir, 'node_modules', 'openai')).default;

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const maxTokens = Number(n);
  const out = {};
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);
  out.retrieved = (await client.models.retrieve(out.models[0])).id;

  const messages = [{ role: 'user', content: prompt }];
  const chat = await client.chat.completions.create({ model: out.models[0], messages, max_tokens: maxTokens, temperature: 0 });
  out.chat = { text: chat.choices[0].message.content, finish: chat.choices[0].finish_reason, usage: chat.usage, object: chat.object };
  // n: two choices of the one prompt (greedy: the same text twice)
  const two = await client.chat.completions.create({ model: out.models[0], messages, max_tokens: maxTokens, temperature: 0, n: 2 });
  out.chat_n = { indices: two.choices.map((c) => c.index), texts: two.choices.map((c) => c.message.content), usage: two.usage };

  const chatStream = await client.chat.completions.create({
    model: out.models[0], messages, max_tokens: maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null, role = null;
  for await (const chunk of chatStream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content || '';
      finish = c.finish_reason || finish;
    }
  }
  out.chat_stream = { text, finish, usage, role };

  const cmpl = await client.completions.create({ model: out.models[0], prompt, max_tokens: maxTokens, temperature: 0 });
  out.completion = { text: cmpl.choices[0].text, finish: cmpl.choices[0].finish_reason, usage: cmpl.usage, object: cmpl.object };

  const cmplStream = await client.completions.create({ model: out.models[0], prompt, max_tokens: maxTokens, temperature: 0, stream: true });
  text = ''; finish = null;
  for await (const chunk of cmplStream) {
    for (const c of chunk.choices) {
      text += c.text;
      finish = c.finish_reason || finish;
    }
  }
  out.completion_stream = { text, finish };

  // tool calls: whole, and through the client's stream helper, which assembles delta.tool_calls
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: {
    type: 'object', properties: { location: { type: 'string', maxLength: 16 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['location', 'unit'], additionalProperties: false } } }];
  const calls = (m) => m.tool_calls.map((t) => ({ id: t.id, type: t.type, name: t.function.name, arguments: t.function.arguments }));
  const toolArgs = { model: out.models[0], messages, tools, tool_choice: 'required', parallel_tool_calls: false,
    max_tokens: 160, temperature: 0 };
  const tc = await client.chat.completions.create(toolArgs);
  out.tools = { calls: calls(tc.choices[0].message), finish: tc.choices[0].finish_reason };
  const tcStream = client.chat.completions.stream(toolArgs);
  const tcFinal = await tcStream.finalChatCompletion();
  out.tools_stream = { calls: calls(tcFinal.choices[0].message), finish: tcFinal.choices[0].finish_reason };

  // structured output through the client's parse(), which reads the content as JSON
  const person = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'], additionalProperties: false };
  const parsed = await client.chat.completions.parse({ model: out.models[0], messages, max_tokens: 80, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } } });
  out.parsed = { value: parsed.choices[0].message.parsed, schema: person };
  out.tool_schema = tools[0].function.parameters;

  // the client's error class and status for a refusal
  try {
    await client.chat.completions.create({ model: out.models[0], messages, temperature: 'hot' });
    out.error = null;
  } catch (e) {
    out.error = { status: e.status, name: e.constructor.name, message: e.message };
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(`openai client failed: ${e.stack || e}`);
  process.exit(1);
});
