// Anthropic's official npm client (@anthropic-ai/sdk) against rlx serve's /v1/messages: a
// message, a streamed one (the SDK's own event accumulation), a stop sequence, count_tokens,
// and a refused request. Prints one JSON object with what each call returned, for
// check_anthropic.py to compare with `rlx generate --chat`; an unexpected exception fails the run.
//   node anthropic_client.js NPM_DIR BASE_URL API_KEY PROMPT N STOP
'use strict';
const path = require('path');

const [npmDir, baseURL, apiKey, prompt, n, stop] = process.argv.slice(2);
const sdk = require(path.resolve(npmDir, 'node_modules', '@anthropic-ai', 'sdk'));
const Anthropic = sdk.default || sdk;

async function main() {
  const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const base = { model: 'rlx', max_tokens: Number(n), temperature: 0,
                 messages: [{ role: 'user', content: [{ type: 'text', text: prompt }] }] };
  const out = {};
  const msg = await client.messages.create(base);
  out.message = { text: msg.content.map((b) => b.text).join(''), stop_reason: msg.stop_reason,
                  usage: msg.usage, type: msg.type, role: msg.role };

  const stream = client.messages.stream(base);
  const events = [];
  stream.on('streamEvent', (e) => events.push(e.type));
  const final = await stream.finalMessage();
  out.stream = { text: final.content.map((b) => b.text).join(''), stop_reason: final.stop_reason,
                 usage: final.usage, events };

  const stopped = await client.messages.create({ ...base, max_tokens: 64, stop_sequences: [stop] });
  out.stopped = { text: stopped.content.map((b) => b.text).join(''), stop_reason: stopped.stop_reason,
                  stop_sequence: stopped.stop_sequence };

  const counted = await client.messages.countTokens({ model: 'rlx', messages: base.messages });
  out.count = counted.input_tokens;

  // tools: a forced call (tool_choice any), whole and through the SDK's stream accumulation
  const tools = [{ name: 'get_weather', description: 'The weather in a city', input_schema: {
    type: 'object', properties: { location: { type: 'string', maxLength: 16 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['location', 'unit'], additionalProperties: false } }];
  const toolArgs = { ...base, max_tokens: 160, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true } };
  const uses = (m) => m.content.filter((b) => b.type === 'tool_use').map((b) => ({ id: b.id, name: b.name, input: b.input }));
  const called = await client.messages.create(toolArgs);
  out.tools = { uses: uses(called), stop_reason: called.stop_reason, schema: tools[0].input_schema };
  const toolStream = client.messages.stream(toolArgs);
  const streamed = await toolStream.finalMessage();
  out.tools_stream = { uses: uses(streamed), stop_reason: streamed.stop_reason };
  // the call and its result fed back: tool_use and tool_result blocks reach the template
  const history = [...base.messages, { role: 'assistant', content: called.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: out.tools.uses[0].id, content: '18 degrees' }] }];
  out.count_with_result = (await client.messages.countTokens({ model: 'rlx', messages: history, tools })).input_tokens;
  out.count_with_tools = (await client.messages.countTokens({ model: 'rlx', messages: base.messages, tools })).input_tokens;

  try {
    await client.messages.create({ ...base, temperature: 3 });
    out.error = null;
  } catch (e) {
    out.error = { status: e.status, name: e.constructor.name, type: e.error && e.error.error && e.error.error.type,
                  message: String(e.message) };
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
