#!/usr/bin/python3
"""rlx serve's chat page at /, in a real browser: Debian's chromium, headless, driven by
playwright-core from npm (fetched into the build tree once) through webui_client.js.

  - the files: Content-Type, ETag (a 304 on If-None-Match), HEAD, a Content-Security-Policy
    that allows this origin only and no inline script, no inline script in the page, Debian's
    marked and DOMPurify served as Debian ships them, 404 and 405 as elsewhere;
  - the page loads with no console error and requests nothing from another origin; a message
    streams (many chunks) a reply equal to a direct non-streamed API call with the same body;
    the second turn sends the first; on a 380-pixel window nothing overflows sideways;
  - stop: while a long reply streams the slot is busy; after Stop the server cancels the request
    (/metrics: one more cancelled, none running; /slots: none busy) and the text grows no more;
  - a new chat starts empty; a reply that thinks shows its reasoning folded, a tool call (the
    page's request given a grammar, or tools with tool_choice required, on its way) is shown;
  - the renderer (the page's own function): markdown renders (a code block, a list, a link);
    hostile strings and 300 random mixtures of them give only allowed tags, no handler, no
    source, links http(s)/mailto only, nothing runs, and HTML shows as text; markup planted past
    the renderer is stopped by the CSP;
  - with --api-key the page loads without the key, asks for it (the 401 message), keeps the
    prompt, and with the key (sent as Bearer, kept in localStorage) works; --no-webui: 404.
Judged here with Python's html.parser and json, not by the page's code.
Without chromium, node or npm: skips (77) saying which, or fails under CI=true (tests/ci_skip.py).

  check_webui.py --rlx BIN --npm DIR
"""
import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import fetch_npm, missing_input, Checks, Server, main_guard  # noqa: E402

PLAYWRIGHT = "playwright-core@1.65.1"
KEY = "sk-webui-test"
PROMPT = "Tell me about the city."
ALLOWED_TAGS = {"p", "em", "strong", "code", "pre", "ul", "ol", "li", "a", "h1", "h2", "h3", "h4", "h5", "h6",
                "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td", "del", "div"}
DEBIAN_JS = {"/webui/marked.min.js": "/usr/share/javascript/marked/marked.min.js",
             "/webui/purify.min.js": "/usr/share/nodejs/dompurify/dist/purify.min.js"}


class Tags(html.parser.HTMLParser):
    """Every start tag with its attributes, and the text inside <script> elements."""

    def __init__(self):
        super().__init__()
        self.tags, self.script_text, self._in_script = [], "", False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.script_text += data


def tags_of(text):
    p = Tags()
    p.feed(text)
    p.close()
    return p


def browser(args, chromium, s, mode):
    p = subprocess.run(["node", os.path.join(HERE, "webui_client.js"), args.npm, chromium, s.url(), mode, KEY],
                       capture_output=True, text=True, timeout=540)
    if p.returncode != 0:
        raise RuntimeError(f"the browser run ({mode}) failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout)


def chat(s, body, headers=None):
    status, _, raw = s.request("POST", "/v1/chat/completions", body, headers=headers)
    if status != 200:
        raise RuntimeError(f"chat {body}: {status} {raw[:300]!r}")
    return json.loads(raw)["choices"][0]["message"]["content"]


def check_files(c, s):
    status, h, page = s.request("GET", "/")
    csp = h.get("content-security-policy", "")
    directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in csp.split(";") if d.strip())
    c.check(status == 200 and h.get("content-type", "").startswith("text/html"), f"GET /: {status} {h}")
    c.check(directives.get("default-src") == "'self'" and directives.get("script-src") == "'self'" and
            directives.get("connect-src") == "'self'" and "unsafe" not in csp and "frame-ancestors" in directives,
            f"the page's CSP: {csp!r}")
    c.check(h.get("x-content-type-options") == "nosniff" and h.get("cache-control") and h.get("etag"),
            f"the page's headers: {h}")
    t = tags_of(page.decode())
    scripts = [a.get("src", "") for tag, a in t.tags if tag == "script"]
    links = [a.get("href", "") for tag, a in t.tags if tag == "link"]
    c.check(scripts and all(re.match(r"^/[^/]", u) for u in scripts + links) and not t.script_text.strip(),
            f"the page loads only its own files and has no inline script: {scripts} {links} {t.script_text!r}")
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    for url in scripts + links:
        status, ah, body = s.request("GET", url)
        want = types[os.path.splitext(url)[1]]
        c.check(status == 200 and ah.get("content-type", "").startswith(want) and ah.get("content-security-policy") == csp
                and len(body) > 0, f"GET {url}: {status} {ah}")
        if url in DEBIAN_JS:
            with open(DEBIAN_JS[url], "rb") as f:
                shipped = re.sub(rb"\n//# sourceMappingURL=[^\n]*\n?$", b"\n", f.read())
            c.check(body == shipped, f"{url} is Debian's {DEBIAN_JS[url]} ({len(body)} against {len(shipped)} bytes)")
    status, hh, body = s.request("HEAD", "/")
    c.check(status == 200 and body == b"" and hh.get("etag") == h.get("etag") and
            hh.get("content-security-policy") == csp, f"HEAD /: {status} {hh} {body[:40]!r}")
    status, _, body = s.request("GET", "/", headers={"If-None-Match": h.get("etag", "")})
    c.check(status == 304 and body == b"", f"GET / with its ETag in If-None-Match: {status}")
    status, _, _ = s.request("GET", "/", headers={"If-None-Match": '"0000"'})
    c.check(status == 200, f"GET / with another ETag: {status}")
    status, _, body = s.request("GET", "/webui/nothing.js")
    c.check(status == 404 and json.loads(body)["error"]["code"] == "not_found", f"GET /webui/nothing.js: {status}")
    status, h405, _ = s.request("POST", "/", b"{}")
    c.check(status == 405 and "GET" in h405.get("allow", ""), f"POST /: {status} {h405}")


def same_origin(c, s, out, what):
    others = [r["url"] for r in out["requests"] if not r["url"].startswith(s.url() + "/")]
    c.check(not others, f"{what}: requests to another origin: {others}")


def chat_bodies(out):
    return [json.loads(r["body"]) for r in out["requests"] if r["url"].endswith("/v1/chat/completions")]


def check_chat(c, s, out):
    c.check(out["model"] == "model: target", f"the page names the model: {out['model']!r}")
    c.check(out["load_errors"] == [] and out["errors_before_csp"] == [],
            f"console errors: {out['load_errors']} {out['errors_before_csp']}")
    same_origin(c, s, out, "chat")
    bodies, conv = chat_bodies(out), out["conversation"]
    first = {"messages": [{"role": "user", "content": PROMPT}], "stream": True, "temperature": 0, "max_tokens": 24}
    c.check(len(bodies) == 5 and bodies[0] == first, f"the page's first request: {bodies[:1]}")
    want = chat(s, dict(first, stream=False))
    c.check(conv[1] == {"role": "assistant", "content": want}, f"the streamed reply {conv[1]} against the API's {want!r}")
    c.check(out["first"]["state"] == "done" and out["first"]["chunks"] > 1, f"the reply streamed: {out['first']}")
    c.check(" ".join(out["first"]["text"].split()) == " ".join(want.split()), f"the reply shown: {out['first']}")
    # the second turn carries the first
    second = {"messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": want},
                           {"role": "user", "content": "And the river?"}],
              "stream": True, "temperature": 0, "max_tokens": 8}
    c.check(len(bodies) > 1 and bodies[1] == second, f"the second request: {bodies[1:2]}")
    c.check(conv[3] == {"role": "assistant", "content": chat(s, dict(second, stream=False))},
            f"the second reply: {conv[3]}")
    # stop
    c.check(out["stop_busy"] == 1 and out["stop_enabled"], f"a slot busy while the reply streams: {out['stop_busy']}")
    st, later = out["stopped"], out["stopped_later"]
    c.check(st["state"] == "stopped" and st["chunks"] < 3000 and st["status"] == "(stopped)", f"stopped: {st}")
    before, after = out["metrics_before"], out["metrics_after"]
    c.check(after["running"] == 0 and after["cancelled"] == before["cancelled"] + 1 and out["slots_busy_after"] == 0,
            f"the server cancelled the stopped request: {before} -> {after}, slots busy {out['slots_busy_after']}")
    c.check(later["text"] == st["text"] and later["chunks"] == st["chunks"], f"the text grew after stop: {st} {later}")
    c.check(out["send_enabled"] and conv[5]["content"] and len(conv) == 6, f"after stop: {conv}")
    # a new chat, then reasoning (folded) and a tool call as the server streamed them
    c.check(out["cleared"] == [0, 0] and bodies[3]["messages"] == [{"role": "user", "content": "Think first."}],
            f"a new chat starts empty: {out['cleared']} {bodies[3:4]}")
    th = out["thought"]
    c.check(th["state"] == "done" and not th["reasoning"]["hidden"] and not th["reasoning"]["open"] and
            th["reasoning"]["text"].strip() == "I think." and th["html"].strip() == "<p>Hello <em>world</em>.</p>",
            f"the reasoning folded and the text rendered: {th}")
    calls = [re.fullmatch(r"tool call get_time\((.*)\)", t, re.S) for t in out["called"]["tools"]]
    args = [json.loads(m.group(1)) if m else None for m in calls]
    c.check(out["called"]["state"] == "done" and len(args) == 1 and isinstance(args[0], dict) and
            set(args[0]) == {"city"} and isinstance(args[0]["city"], str), f"the tool call shown: {out['called']}")
    c.check(out["width"]["scroll"] <= out["width"]["client"], f"sideways overflow on a narrow window: {out['width']}")


def check_renderer(c, out):
    t = tags_of(out["markdown"])
    names = [tag for tag, _ in t.tags]
    code = re.search(r'<pre><code class="language-c">(.*?)</code></pre>', out["markdown"], re.S)
    links = [a for tag, a in t.tags if tag == "a"]
    c.check(names.count("h1") == 1 and "em" in names and names.count("li") == 2 and code and
            code.group(1) == "int main(void) { return 0; }\n", f"markdown rendered: {out['markdown']!r}")
    c.check(links == [{"href": "https://example.com/x", "target": "_blank", "rel": "noopener noreferrer"}],
            f"the link: {links}")
    h = out["hostile"]
    c.check(not h["pwned"] and len(h["results"]) == 317, f"a hostile string ran script: {h['pwned']}")
    bad = []
    for r in h["results"]:
        for tag, attrs in tags_of(r["html"]).tags:
            wrong = [k for k in attrs if k.startswith("on") or k in ("src", "style", "srcdoc", "action", "formaction")]
            href = attrs.get("href")
            if tag not in ALLOWED_TAGS or wrong or (href is not None and not re.match(r"^(https?:|mailto:)", href, re.I)):
                bad.append((r["input"], r["html"]))
                break
    c.check(not bad, f"{len(bad)} renderings let markup through, e.g. {bad[:3]}")
    shown = {r["input"]: r["text"] for r in h["results"]}
    for raw in ('<img src=x onerror="window.__pwned=1">', "<script>window.__pwned=1</script>",
                "<svg onload=window.__pwned=1></svg>", '<iframe src="http://127.0.0.2:9/"></iframe>'):
        c.check(raw in shown[raw], f"{raw!r} shows as text: {shown[raw]!r}")
    csp = out["csp"]
    c.check(csp["pwned"] == 0 and "script-src-attr" in csp["violations"] and "script-src-elem" in csp["violations"],
            f"the CSP stops a planted handler and script: {csp}")


def check_key(c, s, out):
    status, _, _ = s.request("GET", "/")
    c.check(status == 200, f"the page without the key: {status}")
    status, _, _ = s.request("GET", "/v1/models")
    c.check(status == 401, f"the API without the key: {status}")
    same_origin(c, s, out, "with --api-key")
    for name in ("load_notice", "refused_notice"):
        c.check("needs an API key" in out[name], f"{name}: {out[name]!r}")
    c.check(out["refused"]["state"] == "error" and "API key" in out["refused"]["status"] and out["settings_open"] and
            out["prompt_kept"] == PROMPT, f"the refused turn: {out['refused']} {out['prompt_kept']!r}")
    chats = [r for r in out["requests"] if r["url"].endswith("/v1/chat/completions")]
    c.check([r["authorization"] for r in chats] == [None, f"Bearer {KEY}"], f"the keys sent: {chats}")
    body = {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 8}
    want = chat(s, body, {"Authorization": f"Bearer {KEY}"})
    c.check(out["ok"]["state"] == "done" and out["conversation"] == [{"role": "user", "content": PROMPT},
                                                                      {"role": "assistant", "content": want}]
            and out["notice_after"] == "", f"with the key: {out['ok']} {out['conversation']} {out['notice_after']!r}")
    c.check(json.loads(out["stored"] or "{}").get("apiKey") == KEY and out["reload_model"] == "model: target",
            f"the key kept in localStorage: {out['stored']!r}, after a reload {out['reload_model']!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--npm", required=True, help="folder to install playwright-core into")
    args = ap.parse_args()
    chromium = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium")) if p and os.access(p, os.X_OK)),
                    None)
    if not chromium:
        return missing_input("chromium is not installed (Debian's chromium package)")
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            return missing_input(f"{tool} is not installed, so playwright-core cannot be fetched and run")
    failed = fetch_npm(args.npm, PLAYWRIGHT)
    if failed:
        print(f"FAIL {failed}")
        return 1
    c = Checks()
    with Server(args.rlx, ["--parallel", "2", "--slot-ctx", "4096"]) as s:
        check_files(c, s)
        out = browser(args, chromium, s, "chat")
        check_chat(c, s, out)
        check_renderer(c, out)
    with Server(args.rlx, ["--api-key", KEY, "--parallel", "1"]) as s:
        check_key(c, s, browser(args, chromium, s, "key"))
    with Server(args.rlx, ["--no-webui", "--parallel", "1"]) as s:
        for method, url in (("GET", "/"), ("HEAD", "/"), ("GET", "/webui/app.js")):
            status, _, body = s.request(method, url)
            c.check(status == 404, f"--no-webui: {method} {url}: {status}")
        status, _, body = s.request("GET", "/")
        c.check(b"--no-webui" in body, f"--no-webui: the 404 says why: {body[:200]!r}")
        status, _, _ = s.request("GET", "/v1/models")
        c.check(status == 200, f"--no-webui: the API is served: {status}")
    return c.report()


if __name__ == "__main__":
    main_guard(main)
