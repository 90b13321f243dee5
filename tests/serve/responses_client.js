// The official `openai` npm client's Responses API (client.responses) against rlx serve, greedy:
// text whole and streamed (every event kept), the client's stream helper, tools with
// tool_choice required and named, a function_call_output fed back, text.format json_schema, and
// refusals. Prints one JSON object for check_responses.py, which judges it; the chat completions
// it prints are the same prompts through /v1/chat/completions.
//   node responses_client.js NPM_DIR BASE_URL API_KEY PROMPT N
'use strict';
const path = require('path');

const [npmDir, baseURL, apiKey, prompt, n] = process.argv.slice(2);
const OpenAI = require(path.resolve(npmDir, 'node_modules', 'openai')).default;

const item = (o) => (o.type === 'message'
  ? { type: o.type, id: o.id, status: o.status, role: o.role, text: o.content.map((p) => p.text).join('') }
  : { ...o });
const summary = (r) => ({ id: r.id, object: r.object, status: r.status, incomplete: r.incomplete_details,
  output: r.output.map(item), output_text: r.output_text, usage: r.usage });

async function events(stream) {
  const all = [];
  for await (const e of stream) all.push(e);
  return all;
}

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const model = 'target';
  const maxTokens = Number(n);
  const out = {};
  const base = { model, input: prompt, max_output_tokens: maxTokens, temperature: 0 };

  out.text = summary(await client.responses.create(base));
  const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }],
    max_tokens: maxTokens, temperature: 0 });
  out.chat = { text: chat.choices[0].message.content, usage: chat.usage };
  out.events = await events(await client.responses.create({ ...base, stream: true }));
  out.helper = summary(await client.responses.stream(base).finalResponse());

  // reasoning.effort none: the template's thinking turned off, as chat's enable_thinking false does
  const noThink = { ...base, max_output_tokens: 1, reasoning: { effort: 'none' } };
  out.no_think = (await client.responses.create(noThink)).usage;
  out.no_think_chat = (await client.chat.completions.create({ model, messages: [{ role: 'user', content: prompt }],
    max_tokens: 1, temperature: 0, chat_template_kwargs: { enable_thinking: false } })).usage;

  // tools: flat function definitions, a required call, then its output fed back
  const tool = { type: 'function', name: 'get_weather', description: 'The weather in a city', strict: true,
    parameters: { type: 'object', properties: { location: { type: 'string', maxLength: 6 },
      unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['location', 'unit'],
    additionalProperties: false } };
  out.tool_schema = tool.parameters;
  const toolArgs = { model, input: 'What is the weather in Paris?', tools: [tool], tool_choice: 'required',
    parallel_tool_calls: false, max_output_tokens: 160, temperature: 0 };
  const tc = await client.responses.create(toolArgs);
  out.tools = summary(tc);
  out.tools_events = await events(await client.responses.create({ ...toolArgs, stream: true }));
  // a named choice: accepted (its call's decoding is the required one's, which serve_tools covers)
  out.named = summary(await client.responses.create({ ...toolArgs, max_output_tokens: 2,
    tool_choice: { type: 'function', name: 'get_weather' } }));
  const call = tc.output.find((o) => o.type === 'function_call');
  const result = '{"temperature": 21, "unit": "celsius"}';
  out.fed = summary(await client.responses.create({ model, tools: [tool], max_output_tokens: maxTokens,
    temperature: 0, input: [{ role: 'user', content: 'What is the weather in Paris?' }, ...tc.output,
      { type: 'function_call_output', call_id: call.call_id, output: result }] }));
  // the same conversation as chat messages, the tool's keys in the order the template prints them
  const fedChat = await client.chat.completions.create({ model, max_tokens: maxTokens, temperature: 0,
    tools: [{ type: 'function', function: { name: tool.name, description: tool.description,
      parameters: tool.parameters, strict: true } }],
    messages: [{ role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: '', tool_calls: [{ id: call.call_id, type: 'function',
        function: { name: call.name, arguments: call.arguments } }] },
      { role: 'tool', tool_call_id: call.call_id, content: result }] });
  out.fed_chat = { text: fedChat.choices[0].message.content, usage: fedChat.usage };

  // structured output: text.format json_schema
  const person = { type: 'object', properties: { name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 } }, required: ['name', 'age'], additionalProperties: false };
  out.json = { ...summary(await client.responses.create({ model, input: prompt, max_output_tokens: 80, temperature: 0,
    text: { format: { type: 'json_schema', name: 'person', strict: true, schema: person } } })), schema: person };

  // refusals, as the client's errors
  const bad = {
    input: { model, input: 5 },
    store: { model, input: prompt, store: true },
    previous: { model, input: prompt, previous_response_id: 'resp_123' },
    tool_type: { model, input: prompt, tools: [{ type: 'web_search' }] },
    unknown: { model, input: prompt, frequency_penalty: 1 },
    content: { model, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] },
    named: { model, input: prompt, tools: [tool], tool_choice: { type: 'function', name: 'get_time' } },
  };
  out.errors = {};
  for (const [name, body] of Object.entries(bad)) {
    try {
      await client.responses.create(body);
      out.errors[name] = null;
    } catch (e) {
      out.errors[name] = { status: e.status, name: e.constructor.name, message: e.message, param: e.param };
    }
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(`openai client failed: ${e.stack || e}`);
  process.exit(1);
});
