"""The same greedy text through rlx's other ways of running a model (test_llamacpp.py step 5):
a 2-stage pipeline, speculative decoding with a draft model, `rlx serve`'s /v1/completions, and
`generate --chat` rendering a chat template (whose reply `rlx serve`'s /v1/chat/completions and
`rlx chat` must give too).

The reference is rlx's single-process greedy run of the first prompt, which step 2 proves to be
llama.cpp's text; here the ids must be equal, not only the text. The chat check renders the
template with Jinja as Hugging Face's apply_chat_template does (trim_blocks, lstrip_blocks, the
tokenizer's bos_token; its encoding adds no special tokens, since a template writes bos_token
itself), tokenizes that text with `rlx tokenize` (no BOS added), and requires `generate --chat`
to have run exactly those prompt ids (n_prompt, and the continuation of `generate --tokens` of
them); a template writing bos_token then starts with exactly one BOS.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "serve"))
import gguf_common as C  # noqa: E402
import gguf_ref  # noqa: E402
import serve_util  # noqa: E402


class Failure(Exception):
    pass


def generate(rlx, args, timeout):
    p = C.run([rlx, "generate", "--json", *args], timeout=timeout)
    if p.returncode != 0:
        raise Failure("rlx generate %s exited %s: %s" % (" ".join(args), p.returncode,
                                                           p.stderr.decode(errors="replace")[-400:]))
    return json.loads(p.stdout)


def tokenizer_strings(path):
    """(chat template, bos_token text or None) of a GGUF file or a Hugging Face directory."""
    if path.endswith(".gguf"):
        m = gguf_ref.read(path).metadata
        bos = m.get("tokenizer.ggml.bos_token_id")
        return m.get("tokenizer.chat_template"), None if bos is None else m["tokenizer.ggml.tokens"][bos]
    with open(os.path.join(path, "tokenizer_config.json")) as f:
        config = json.load(f)
    return config.get("chat_template"), config.get("bos_token")


def render(node, npm, template, prompt, bos_token):
    """The template rendered for one user turn by @huggingface/jinja (render_chat.js), as
    apply_chat_template renders it."""
    request = {"npm": npm, "template": template, "vars": {
        "messages": [{"role": "user", "content": prompt}], "add_generation_prompt": True, "bos_token": bos_token or ""}}
    p = C.run([node, os.path.join(HERE, "render_chat.js")], timeout=60, input=json.dumps(request).encode())
    if p.returncode != 0:
        raise Failure("@huggingface/jinja could not render the template: %s" % p.stderr.decode(errors="replace")[-400:])
    return p.stdout.decode()


def check_chat(rlx, path, prompt, steps, timeout, jinja, template_file):
    """jinja: (node, npm directory holding @huggingface/jinja)."""
    template, bos_token = tokenizer_strings(path)
    extra = []
    if template_file:
        with open(template_file) as f:
            template = f.read()
        extra = ["--chat-template-file", template_file]
    if not template:
        raise Failure("%s has no chat template" % path)
    rendered = render(*jinja, template, prompt, bos_token)
    p = C.run([rlx, "tokenize", "-m", path, "-p", rendered], timeout=timeout)
    if p.returncode != 0:
        raise Failure("rlx tokenize exited %s: %s" % (p.returncode, p.stderr.decode(errors="replace")[-400:]))
    want = [int(t) for t in p.stdout.split()]
    detail = "%d prompt ids" % len(want)
    if bos_token and "bos_token" in template:
        bos = [int(t) for t in C.run([rlx, "tokenize", "-m", path, "-p", bos_token], timeout=timeout).stdout.split()]
        if len(bos) != 1 or want[:1] != bos or want[1:2] == bos:
            raise Failure("the rendered prompt %r does not begin with exactly one BOS %s: %s"
                          % (rendered[:60], bos, want[:4]))
        detail += ", one BOS"
    chat = generate(rlx, ["-m", path, "-p", prompt, "--chat", "-n", str(steps), "--temp", "0", *extra], timeout)
    if chat["n_prompt"] != len(want):
        raise Failure("generate --chat ran %d prompt ids; the template rendered as Hugging Face does gives %d: %s"
                      % (chat["n_prompt"], len(want), want))
    ref = generate(rlx, ["-m", path, "--tokens", ",".join(map(str, want)), "-n", str(steps), "--temp", "0"], timeout)
    if chat["tokens"] != ref["tokens"]:
        raise Failure("generate --chat continues with %s, generate --tokens of the rendered ids with %s"
                      % (chat["tokens"][:8], ref["tokens"][:8]))
    # the same turn through the server's chat endpoint and the interactive chat
    with serve_util.Server(rlx, extra, model=path) as s:
        status, _, body = s.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt}], "max_tokens": steps, "temperature": 0}, timeout=timeout)
    if status != 200:
        raise Failure("/v1/chat/completions answered %d: %s" % (status, body[:300]))
    reply = json.loads(body)
    if reply["usage"]["prompt_tokens"] != len(want) or reply["choices"][0]["message"]["content"] != chat["text"]:
        raise Failure("/v1/chat/completions ran %d prompt ids and answered %r; generate --chat %d and %r"
                      % (reply["usage"]["prompt_tokens"], reply["choices"][0]["message"]["content"], len(want),
                         chat["text"]))
    p = C.run([rlx, "chat", "-m", path, "-n", str(steps), "--temp", "0", *extra], timeout=timeout,
              input=(prompt + "\n").encode())
    said = p.stdout.decode(errors="replace")
    if p.returncode != 0 or chat["text"].strip() not in said:
        raise Failure("rlx chat exited %s and printed %r; generate --chat's reply is %r: %s"
                      % (p.returncode, said[-300:], chat["text"], p.stderr.decode(errors="replace")[-300:]))
    return detail + "; /v1/chat/completions and rlx chat give generate --chat's reply"


def check(rlx, path, prompt, steps, timeout, drafts, jinja, template_file=None):
    """Rows and failures of the checks on path (a GGUF file or a Hugging Face directory); drafts
    are (label, draft model) pairs for --spec draft; the chat check runs when jinja is given."""
    base = ["-m", path, "-p", prompt, "-n", str(steps), "--temp", "0"]
    rows, failures = [], []

    def record(what, fn):
        try:
            rows.append("%-8s pass  %s" % (what, fn()))
        except (Failure, OSError, RuntimeError, ValueError) as e:
            rows.append("%-8s FAIL" % what)
            failures.append("%s: %s" % (what, e))

    try:
        single = generate(rlx, base, timeout)
    except Failure as e:
        return ["single   FAIL"], ["single process: %s" % e]

    def same(what, out):
        if out["tokens"] != single["tokens"]:
            raise Failure("%s gives %r, one process %r" % (what, out["text"], single["text"]))
        return "%d ids as one process" % len(out["tokens"])

    record("stages", lambda: same("--stages 2", generate(rlx, base + ["--stages", "2", "--transport", "tcp"],
                                                          timeout)))
    for label, draft in drafts:
        record("spec", lambda: "draft %s: %s" % (label, same("--spec draft", generate(
            rlx, base + ["--spec", "draft", "--draft-model", draft, "--draft-tokens", "4"], timeout))))

    def serve():
        with serve_util.Server(rlx, [], model=path) as s:
            status, _, body = s.request("POST", "/v1/completions",
                                        {"prompt": prompt, "max_tokens": steps, "temperature": 0}, timeout=timeout)
        if status != 200:
            raise Failure("/v1/completions answered %d: %s" % (status, body[:300]))
        text = json.loads(body)["choices"][0]["text"]
        if text != single["text"]:
            raise Failure("/v1/completions gives %r, generate %r" % (text, single["text"]))
        return "/v1/completions text as generate"

    record("serve", serve)
    if jinja:
        record("chat", lambda: check_chat(rlx, path, prompt, steps, timeout, jinja, template_file))
    return rows, failures
