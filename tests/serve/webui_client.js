// rlx serve's chat page in a real browser: Debian's chromium, headless, driven by playwright-core.
// Does what a person would (type, send, stop, give the key) and prints one JSON object of what
// it saw, for check_webui.py to judge; it judges nothing itself.
//   node webui_client.js NPM_DIR CHROMIUM BASE_URL MODE [API_KEY]
// MODE chat: the page loads; a greedy reply streams; a long reply is stopped; the renderer's
//            output on markdown and hostile strings; an inline handler planted past the renderer.
// MODE key:  the page of a server with --api-key: without the key, then with it.
'use strict';
const path = require('path');

const [npmDir, chromiumPath, base, mode, apiKey] = process.argv.slice(2);
const { chromium } = require(path.resolve(npmDir, 'node_modules', 'playwright-core'));

const WAIT_MS = 180000; // an ASan build on a loaded machine

async function metrics() {
  const res = await fetch(base + '/metrics', apiKey ? { headers: { Authorization: 'Bearer ' + apiKey } } : {});
  const text = await res.text();
  const value = (name) => {
    const m = text.match(new RegExp('^' + name.replace(/[{}"=]/g, '\\$&') + ' (\\S+)$', 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return {
    running: value('rlx_requests_running'),
    cancelled: value('rlx_requests_total{outcome="cancelled"}'),
  };
}

async function slotsBusy() {
  const res = await fetch(base + '/slots', apiKey ? { headers: { Authorization: 'Bearer ' + apiKey } } : {});
  return (await res.json()).filter((s) => s.is_processing).length;
}

async function openSettings(page) {
  if (!(await page.evaluate(() => document.getElementById('settings').open))) await page.click('#settings > summary');
}

// Types text into the page's box and sends it as a person would (Enter), and waits until the
// reply is no longer streaming.
async function send(page, text, { temperature, maxTokens } = {}) {
  await openSettings(page);
  if (temperature !== undefined) await page.fill('#temperature', String(temperature));
  if (maxTokens !== undefined) await page.fill('#max-tokens', String(maxTokens));
  const before = await page.locator('article.msg.assistant').count();
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
  await page.waitForFunction((n) => document.querySelectorAll('article.msg.assistant').length > n, before);
  return page.locator('article.msg.assistant').nth(before);
}

async function replyState(reply) {
  return reply.evaluate((el) => ({
    state: el.dataset.state,
    chunks: Number(el.dataset.chunks),
    text: el.querySelector('.content').textContent,
    html: el.querySelector('.content').innerHTML,
    status: el.querySelector('.status').textContent,
    reasoning: {
      hidden: el.querySelector('details.reasoning').hidden,
      open: el.querySelector('details.reasoning').open,
      text: el.querySelector('details.reasoning .text').textContent,
    },
    tools: [...el.querySelectorAll('.tool-call')].map((t) => t.textContent),
  }));
}

async function waitDone(page, reply) {
  await reply.evaluate(
    (el, ms) =>
      new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error('the reply did not finish')), ms);
        const check = () => {
          if (el.dataset.state !== 'streaming') {
            clearTimeout(t);
            resolve();
          } else {
            setTimeout(check, 50);
          }
        };
        check();
      }),
    WAIT_MS
  );
  return replyState(reply);
}

const MARKDOWN = '# Title\n\nSome *emphasis* and `code`.\n\n```c\nint main(void) { return 0; }\n```\n\n' +
  '- one\n- two\n\n[a link](https://example.com/x)\n';

const HOSTILE = [
  '<img src=x onerror="window.__pwned=1">',
  '<script>window.__pwned=1</script>',
  '[click](javascript:window.__pwned=1)',
  '<a href="javascript:window.__pwned=1">x</a>',
  '![pixel](http://127.0.0.2:9/track.png)',
  '<svg onload=window.__pwned=1></svg>',
  '<iframe src="http://127.0.0.2:9/"></iframe>',
  '<details open ontoggle=window.__pwned=1>x</details>',
  '<math><mtext><table><mglyph><style><img src=x onerror=window.__pwned=1>',
  '[data](data:text/html,<script>window.__pwned=1</script>)',
  '<style>body{display:none}</style>',
  '```html\n<script>window.__pwned=1</script>\n```',
  '`<b onclick=window.__pwned=1>`',
  '<a href="https://example.com" onclick="window.__pwned=1">ok</a>',
  '<form action="http://127.0.0.2:9/"><input name=q></form>',
  '[x](  JaVaScRiPt:window.__pwned=1)',
  '<div style="background:url(http://127.0.0.2:9/)">s</div>',
];

// Random mixtures of hostile pieces and markdown syntax (a fixed seed: the same strings each run).
function fuzzStrings(n) {
  const pieces = HOSTILE.concat(['*', '**', '_', '`', '```', '\n', '\n\n', '> ', '- ', '1. ', '[', ']', '(', ')',
    '<', '>', '"', "'", '=', '&', '<!--', '-->', '<![CDATA[', ']]>', '\\', '|', '---', 'javascript:', 'on']);
  let seed = 12345;
  const rand = (k) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % k;
  };
  const out = [];
  for (let i = 0; i < n; i++) {
    let s = '';
    for (let j = 0, m = 2 + rand(8); j < m; j++) s += pieces[rand(pieces.length)];
    out.push(s);
  }
  return out;
}

async function chatMode(page, out) {
  await page.goto(base + '/');
  await page.waitForFunction(() => document.getElementById('model').textContent !== '');
  out.model = await page.textContent('#model');
  out.load_errors = out.console.slice();

  // a greedy reply, streamed, then a second turn that carries the first
  const first = await send(page, 'Tell me about the city.', { temperature: 0, maxTokens: 24 });
  out.first = await waitDone(page, first);
  const second = await send(page, 'And the river?', { temperature: 0, maxTokens: 8 });
  out.second = await waitDone(page, second);

  // stop: a long reply, stopped once it has streamed a little
  const before = await metrics();
  const long = await send(page, 'Write a long story about the war.', { temperature: 0, maxTokens: 3000 });
  await long.evaluate(
    (el, ms) =>
      new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error('no text streamed')), ms);
        const check = () => (Number(el.dataset.chunks) >= 4 ? (clearTimeout(t), resolve()) : setTimeout(check, 20));
        check();
      }),
    WAIT_MS
  );
  out.stop_busy = await slotsBusy();
  out.stop_enabled = await page.isEnabled('#stop');
  await page.click('#stop');
  out.stopped = await waitDone(page, long);
  // the server notices the hang-up and cancels: wait (bounded) until the metrics say so
  const deadline = Date.now() + 60000;
  let after = await metrics();
  while ((after.running !== 0 || after.cancelled <= before.cancelled) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    after = await metrics();
  }
  out.metrics_before = before;
  out.metrics_after = after;
  out.slots_busy_after = await slotsBusy();
  out.stopped_later = await replyState(long);
  out.send_enabled = await page.isEnabled('#send');
  out.conversation = await page.evaluate(() => window.rlxChat.conversation());

  // reasoning and tool calls from the real server, in a new chat: the page's request is given a
  // grammar that makes the reply think first, then tools with tool_choice required (the request
  // rewritten on its way, the answer the server's own)
  await page.click('#new-chat');
  out.cleared = await page.evaluate(() => [document.querySelectorAll('#log .msg').length, window.rlxChat.conversation().length]);
  let extra = {};
  await page.route('**/v1/chat/completions', (route) =>
    route.continue({ postData: JSON.stringify(Object.assign(JSON.parse(route.request().postData()), extra)) })
  );
  extra = { grammar: 'root ::= "<think>\\nI think.\\n</think>\\n\\nHello *world*."' };
  out.thought = await waitDone(page, await send(page, 'Think first.', { temperature: 0, maxTokens: 40 }));
  extra = {
    tools: [{ type: 'function', function: { name: 'get_time', parameters: {
      type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'], additionalProperties: false } } }],
    tool_choice: 'required',
    parallel_tool_calls: false,
    chat_template_kwargs: { enable_thinking: false }, /* the call at once, not after thinking */
  };
  out.called = await waitDone(page, await send(page, 'What time is it in Paris?', { temperature: 0, maxTokens: 100 }));
  await page.unroute('**/v1/chat/completions');

  // the renderer, on known markdown and on hostile strings, in the page itself
  out.markdown = await page.evaluate((t) => {
    const d = document.createElement('div');
    d.append(window.rlxChat.renderMarkdown(t));
    return d.innerHTML;
  }, MARKDOWN);
  const hostile = HOSTILE.concat(fuzzStrings(300));
  out.hostile = await page.evaluate(async (list) => {
    const log = document.getElementById('log');
    const res = list.map((t) => {
      const d = document.createElement('div');
      d.className = 'content';
      d.append(window.rlxChat.renderMarkdown(t));
      log.append(d); // live in the page, where a handler or a load would run
      return { input: t, html: d.innerHTML, text: d.textContent };
    });
    await new Promise((r) => setTimeout(r, 500)); // give any load or handler its chance to run
    return { results: res, pwned: window.__pwned === 1 };
  }, hostile);
  out.errors_before_csp = out.console.slice();

  // the Content-Security-Policy itself: markup planted past the renderer still cannot run script
  out.csp = await page.evaluate(async () => {
    const violations = [];
    document.addEventListener('securitypolicyviolation', (e) => violations.push(e.violatedDirective));
    const d = document.createElement('div');
    d.innerHTML = '<img src="/webui/icon.svg?x" onerror="window.__pwned=2" onload="window.__pwned=2">';
    document.body.append(d);
    const s = document.createElement('script');
    s.textContent = 'window.__pwned = 3';
    document.body.append(s);
    await new Promise((r) => setTimeout(r, 500));
    return { pwned: window.__pwned || 0, violations };
  });
}

async function keyMode(page, out) {
  await page.goto(base + '/');
  await page.waitForFunction(() => !document.getElementById('notice').hidden);
  out.load_notice = await page.textContent('#notice');
  const refused = await send(page, 'Tell me about the city.', { temperature: 0, maxTokens: 8 });
  out.refused = await waitDone(page, refused);
  out.refused_notice = await page.textContent('#notice');
  out.prompt_kept = await page.inputValue('#prompt');
  out.settings_open = await page.evaluate(() => document.getElementById('settings').open);
  await openSettings(page);
  await page.fill('#api-key', apiKey);
  await page.press('#api-key', 'Tab'); // a change event: the page saves the key and asks for the model
  await page.waitForFunction(() => document.getElementById('model').textContent !== '');
  const ok = await send(page, 'Tell me about the city.', { temperature: 0, maxTokens: 8 });
  out.ok = await waitDone(page, ok);
  out.notice_after = await page.evaluate(() => (document.getElementById('notice').hidden ? '' : document.getElementById('notice').textContent));
  out.conversation = await page.evaluate(() => window.rlxChat.conversation());
  out.stored = await page.evaluate(() => localStorage.getItem('rlx-webui-settings'));
  // a reload keeps the key: the page works at once
  await page.reload();
  await page.waitForFunction(() => document.getElementById('model').textContent !== '');
  out.reload_model = await page.textContent('#model');
}

async function main() {
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true });
  const out = { console: [], requests: [] };
  try {
    // a phone's width: the page must work on a narrow window
    const context = await browser.newContext({ viewport: { width: 380, height: 760 } });
    const page = await context.newPage();
    page.setDefaultTimeout(WAIT_MS);
    page.on('console', (m) => {
      if (m.type() === 'error') out.console.push(m.text());
    });
    page.on('pageerror', (e) => out.console.push('pageerror: ' + e.message));
    page.on('request', (r) =>
      out.requests.push({ url: r.url(), method: r.method(), body: r.postData(), authorization: r.headers().authorization || null })
    );
    if (mode === 'chat') await chatMode(page, out);
    else await keyMode(page, out);
    if (process.env.WEBUI_SCREENSHOT) await page.screenshot({ path: process.env.WEBUI_SCREENSHOT, fullPage: true });
    out.width = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth }));
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
