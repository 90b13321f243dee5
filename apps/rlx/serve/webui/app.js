/* rlx chat: the page rlx serve shows at /. It talks to the server's own /v1/chat/completions
 * with "stream": true and shows the reply as it arrives: the reasoning folded, tool calls as
 * they are written, the text as markdown.
 *
 * Model output is untrusted: markdown goes through marked with every raw HTML block or tag
 * turned back into text and images into text, then through DOMPurify (links http(s) or mailto
 * only), and the server's Content-Security-Policy forbids inline script and other origins as a
 * last wall. Everything is served by rlx itself; nothing is fetched from elsewhere. */
'use strict';

(function () {
  const SETTINGS_KEY = 'rlx-webui-settings';
  const $ = (id) => document.getElementById(id);
  const state = { messages: [], controller: null };

  // ---- markdown, rendered safely ----

  const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ESCAPES[c]);

  marked.use({
    gfm: true,
    breaks: false,
    headerIds: false, /* ids from model text could clobber the page's own */
    mangle: false,
    renderer: {
      /* a reply that writes HTML shows it as the text it is */
      html: (raw) => escapeHtml(raw),
      /* an image would be a request to wherever the model points (and CSP refuses it anyway) */
      image: (href, title, text) => escapeHtml('[image: ' + (text || '') + ']'),
    },
  });

  DOMPurify.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName === 'A' && node.hasAttribute('href')) {
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    }
  });

  const PURIFY = {
    RETURN_DOM_FRAGMENT: true,
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
    FORBID_TAGS: ['style', 'img', 'svg', 'math', 'form', 'input', 'button', 'textarea', 'select', 'iframe'],
    FORBID_ATTR: ['style', 'id', 'name'],
  };

  /* Markdown text as a DocumentFragment of sanitized nodes. */
  function renderMarkdown(text) {
    return DOMPurify.sanitize(marked.parse(String(text)), PURIFY);
  }

  // ---- settings, kept in this browser ----

  function loadSettings() {
    let saved = {};
    try {
      saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || '{}') || {};
    } catch (e) {
      saved = {};
    }
    if (typeof saved.temperature === 'string') $('temperature').value = saved.temperature;
    if (typeof saved.maxTokens === 'string') $('max-tokens').value = saved.maxTokens;
    if (typeof saved.system === 'string') $('system-prompt').value = saved.system;
    if (typeof saved.apiKey === 'string') $('api-key').value = saved.apiKey;
  }

  function saveSettings() {
    const s = {
      temperature: $('temperature').value,
      maxTokens: $('max-tokens').value,
      system: $('system-prompt').value,
      apiKey: $('api-key').value,
    };
    try {
      localStorage.setItem(SETTINGS_KEY, JSON.stringify(s));
    } catch (e) {
      /* storage may be off (private windows): the settings then last as long as the page */
    }
  }

  function headers() {
    const h = { 'Content-Type': 'application/json' };
    const key = $('api-key').value.trim();
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }

  // ---- notices ----

  function notice(text) {
    const n = $('notice');
    n.textContent = text || '';
    n.hidden = !text;
  }

  /* The message for a refused request; a 401 asks for the key and opens the settings. */
  async function httpError(res) {
    let message = '';
    try {
      const body = await res.json();
      message = (body && body.error && body.error.message) || '';
    } catch (e) {
      message = '';
    }
    if (res.status === 401) {
      $('settings').open = true;
      $('api-key').focus();
      return $('api-key').value.trim()
        ? 'The server refused the API key: check it under Settings.'
        : 'This server needs an API key: enter it under Settings (it is sent as "Authorization: Bearer").';
    }
    return 'The server answered ' + res.status + (message ? ': ' + message : '');
  }

  async function showModel() {
    try {
      const res = await fetch('/v1/models', { headers: headers() });
      if (!res.ok) {
        notice(await httpError(res));
        return;
      }
      const body = await res.json();
      const id = body && body.data && body.data[0] && body.data[0].id;
      $('model').textContent = id ? 'model: ' + id : '';
      notice('');
    } catch (e) {
      notice('Cannot reach the server: ' + e.message);
    }
  }

  // ---- the conversation ----

  function addMessage(role) {
    const el = document.createElement('article');
    el.className = 'msg ' + role;
    const label = document.createElement('span');
    label.className = 'role';
    label.textContent = role === 'user' ? 'You' : 'Assistant';
    el.append(label);
    $('log').append(el);
    return el;
  }

  function scrollToEnd() {
    const main = document.querySelector('main');
    main.scrollTop = main.scrollHeight;
  }

  /* The view of one assistant reply, updated as its deltas arrive. */
  function replyView() {
    const el = addMessage('assistant');
    const reasoning = document.createElement('details');
    reasoning.className = 'reasoning';
    reasoning.hidden = true;
    const summary = document.createElement('summary');
    summary.textContent = 'Reasoning';
    const reasoningText = document.createElement('div');
    reasoningText.className = 'text';
    reasoning.append(summary, reasoningText);
    const tools = document.createElement('div');
    tools.className = 'tools';
    const content = document.createElement('div');
    content.className = 'content';
    const status = document.createElement('p');
    status.className = 'status';
    status.setAttribute('role', 'status');
    el.append(reasoning, content, tools, status);
    el.dataset.state = 'streaming';
    el.dataset.chunks = '0';
    const reply = { content: '', reasoning: '', calls: [] };
    let pending = false;

    function render() {
      pending = false;
      reasoning.hidden = !reply.reasoning;
      reasoningText.textContent = reply.reasoning;
      content.replaceChildren(renderMarkdown(reply.content));
      tools.replaceChildren(
        ...reply.calls.map((c) => {
          const d = document.createElement('div');
          d.className = 'tool-call';
          d.textContent = 'tool call ' + (c.name || '?') + '(' + c.arguments + ')';
          return d;
        })
      );
      scrollToEnd();
    }

    return {
      reply,
      /* one chunk's delta; rendering waits for the next frame so a fast stream costs one
       * markdown pass per frame, not per token */
      add(delta) {
        if (typeof delta.reasoning_content === 'string') reply.reasoning += delta.reasoning_content;
        if (typeof delta.content === 'string' && delta.content) {
          reply.content += delta.content;
          el.dataset.chunks = String(Number(el.dataset.chunks) + 1);
        }
        for (const t of Array.isArray(delta.tool_calls) ? delta.tool_calls : []) {
          const i = Number.isInteger(t.index) ? t.index : reply.calls.length;
          const call = (reply.calls[i] = reply.calls[i] || { id: '', name: '', arguments: '' });
          if (t.id) call.id = t.id;
          if (t.function && typeof t.function.name === 'string') call.name += t.function.name;
          if (t.function && typeof t.function.arguments === 'string') call.arguments += t.function.arguments;
        }
        if (pending) return;
        pending = true;
        if (document.hidden) render();
        else requestAnimationFrame(render);
      },
      finish(how, text) {
        render();
        el.dataset.state = how;
        status.textContent = text || '';
        status.classList.toggle('error', how === 'error');
      },
    };
  }

  /* Calls onData with each server-sent event's data until [DONE] or the end of the body. */
  async function readEvents(body, onData) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      const events = buffer.split(/\r?\n\r?\n/);
      buffer = done ? '' : events.pop();
      for (const event of events) {
        const data = event
          .split(/\r?\n/)
          .filter((line) => line.startsWith('data:'))
          .map((line) => line.slice(5).replace(/^ /, ''))
          .join('\n');
        if (!data) continue; /* a comment (":"), which the server sends to probe a closed client */
        if (data === '[DONE]') return;
        onData(JSON.parse(data));
      }
      if (done) return;
    }
  }

  function setBusy(busy) {
    $('send').disabled = busy;
    $('stop').disabled = !busy;
  }

  function requestBody() {
    const body = { messages: [], stream: true };
    const system = $('system-prompt').value.trim();
    if (system) body.messages.push({ role: 'system', content: system });
    body.messages.push(...state.messages);
    const temperature = parseFloat($('temperature').value);
    if (Number.isFinite(temperature)) body.temperature = temperature;
    const maxTokens = parseInt($('max-tokens').value, 10);
    if (Number.isInteger(maxTokens) && maxTokens > 0) body.max_tokens = maxTokens;
    return body;
  }

  async function send(text) {
    notice('');
    state.messages.push({ role: 'user', content: text });
    const userEl = addMessage('user');
    userEl.append(document.createTextNode(text));
    const view = replyView();
    const controller = (state.controller = new AbortController());
    setBusy(true);
    let finish = null;
    try {
      const res = await fetch('/v1/chat/completions', {
        method: 'POST',
        headers: headers(),
        body: JSON.stringify(requestBody()),
        signal: controller.signal,
      });
      if (!res.ok) {
        const why = await httpError(res);
        /* the turn never happened: it goes back to the box, to send again */
        state.messages.pop();
        userEl.remove();
        $('prompt').value = text;
        view.finish('error', why);
        notice(why);
        return;
      }
      await readEvents(res.body, (obj) => {
        if (obj.error) throw new Error(obj.error.message || 'the server failed');
        const choice = obj.choices && obj.choices[0];
        if (!choice) return;
        if (choice.delta) view.add(choice.delta);
        if (choice.finish_reason) finish = choice.finish_reason;
      });
      view.finish('done', finish === 'length' ? '(stopped at max tokens)' : '');
    } catch (e) {
      if (e.name === 'AbortError') {
        view.finish('stopped', '(stopped)');
      } else {
        controller.abort(); /* an error event or a broken stream: the request ends here */
        view.finish('error', 'Error: ' + e.message);
      }
    } finally {
      if (state.controller === controller) state.controller = null;
      const r = view.reply;
      /* what was said, even in part, is the context of the next turn */
      if (state.messages.length && state.messages[state.messages.length - 1].role === 'user' && r.content)
        state.messages.push({ role: 'assistant', content: r.content });
      setBusy(false);
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function newChat() {
    stop();
    state.messages = [];
    $('log').replaceChildren();
    notice('');
    $('prompt').focus();
  }

  // ---- wiring ----

  document.addEventListener('DOMContentLoaded', () => {
    loadSettings();
    $('settings-form').addEventListener('change', saveSettings);
    $('settings-form').addEventListener('submit', (e) => e.preventDefault());
    $('api-key').addEventListener('change', showModel);
    $('compose').addEventListener('submit', (e) => {
      e.preventDefault();
      const text = $('prompt').value;
      if (!text.trim() || state.controller) return;
      $('prompt').value = '';
      send(text);
    });
    $('prompt').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $('compose').requestSubmit();
      }
    });
    $('stop').addEventListener('click', stop);
    $('new-chat').addEventListener('click', newChat);
    showModel();
    $('prompt').focus();
  });

  /* for scripts driving the page (the browser test): the renderer and the conversation */
  window.rlxChat = Object.freeze({
    renderMarkdown,
    conversation: () => JSON.parse(JSON.stringify(state.messages)),
  });
})();
