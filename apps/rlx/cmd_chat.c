/* rlx chat: a multi-turn conversation in the terminal. The KV cache is kept across turns: each
 * turn renders the whole conversation with the chat template, and only the tokens after the
 * longest prefix the cache already holds are run (the template rewrites earlier assistant turns
 * when it drops their reasoning, so the cache is truncated back to where the text diverges).
 * Nothing is reserved for a reply: it runs to the end of the context, and a message that does
 * not fit after the conversation drops the oldest turns, which the same prefix logic handles. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_input.h"
#include "common.h"
#include "rlx/text.h"

static const char usage[] =
    "usage: rlx chat [-m PATH] [--system TEXT] [--no-think] [-n N] [sampling options] [options]\n\n"
    "Reads your messages from stdin and streams the model's replies. A message is a line; a line\n"
    "ending in \\ goes on on the next, lines between two lines of \"\"\" are one message, and so is a\n"
    "paste. Commands: /reset forgets the conversation, /quit (or Ctrl-D) ends it; Ctrl-C stops a\n"
    "reply. On a terminal a line has no length limit (the reader edits it: Backspace, Ctrl-U,\n"
    "Ctrl-W); a message is at most 16 MiB.\n\n";

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* SIGTERM, SIGHUP and SIGQUIT end the program as they would, but with the terminal as it was. */
static void on_fatal_signal(int sig) {
    chat_input_restore_terminal();
    raise(sig); /* SA_RESETHAND made it the default action, which runs once this handler returns */
}

typedef struct conversation {
    rlx_chat_message *msgs;
    size_t n, cap;
    int32_t *cached; /* the ids the KV cache holds, in order */
    size_t n_cached, cap_cached;
    int special_in_content;    /* --special-in-content */
    const char *chat_template; /* --chat-template-file's text, or NULL for the model's */
} conversation;

static int add_message(conversation *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        rlx_chat_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m)
            return app_fail("chat: out of memory");
        c->msgs = m;
        c->cap = cap;
    }
    char *copy = strdup(content);
    if (!copy)
        return app_fail("chat: out of memory");
    c->msgs[c->n++] = (rlx_chat_message){.role = role, .content = copy};
    return 0;
}

static void clear_messages(conversation *c, size_t keep) {
    while (c->n > keep)
        free((char *)c->msgs[--c->n].content);
}

static int remember(conversation *c, const int32_t *ids, size_t n) {
    if (c->n_cached + n > c->cap_cached) {
        size_t cap = (c->n_cached + n) * 2;
        int32_t *grown = realloc(c->cached, cap * sizeof *grown);
        if (!grown)
            return app_fail("chat: out of memory");
        c->cached = grown;
        c->cap_cached = cap;
    }
    memcpy(c->cached + c->n_cached, ids, n * sizeof *ids);
    c->n_cached += n;
    return 0;
}

typedef struct reply {
    rlx_detok *detok;
    rlx_stop_matcher *stopper; /* --stop strings, or NULL */
    int stopped;
    char *text;
    size_t len, cap;
    int32_t *ids;
    size_t n_ids, cap_ids;
    int failed;
} reply;

static int append(reply *r, const char *text, size_t len) {
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *grown = realloc(r->text, cap);
        if (!grown)
            return -1;
        r->text = grown;
        r->cap = cap;
    }
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = '\0';
    return 0;
}

/* Reply text on its way to the terminal, cut before the first --stop string. */
static int show(reply *r, const char *text, size_t len) {
    if (r->stopper && r->stopped)
        return 0;
    if (r->stopper && rlx_stop_matcher_push(r->stopper, text, len, &text, &len, &r->stopped) != RLX_OK)
        return -1;
    return append(r, text, len) < 0 || fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0 ? -1 : 0;
}

static int on_token(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    reply *r = ctx;
    if (r->n_ids == r->cap_ids) {
        size_t cap = r->cap_ids ? 2 * r->cap_ids : 64;
        int32_t *grown = realloc(r->ids, cap * sizeof *grown);
        if (!grown)
            return r->failed = 1;
        r->ids = grown;
        r->cap_ids = cap;
    }
    r->ids[r->n_ids++] = token;
    const char *text;
    size_t len;
    if (rlx_detok_push(r->detok, token, &text, &len) != RLX_OK || show(r, text, len) < 0)
        return r->failed = 1;
    return interrupted || r->stopped;
}

/* The ids of the conversation as the template renders it for a reply, leaving out the `drop`
 * messages after the first n_fixed; the encoding stops past max_ids, setting *over. */
static int render_ids(rlx_tokenizer *tok, const conversation *c, size_t n_fixed, size_t drop, int think, size_t max_ids,
                      int32_t **ids, size_t *n, int *over) {
    rlx_chat_message *view = malloc(c->n * sizeof *view);
    if (!view)
        return app_fail("chat: out of memory");
    memcpy(view, c->msgs, n_fixed * sizeof *view);
    memcpy(view + n_fixed, c->msgs + n_fixed + drop, (c->n - n_fixed - drop) * sizeof *view);
    char *rendered;
    rlx_text_span *markup;
    size_t n_markup;
    rlx_status rc = app_chat_render(tok, &(app_chat){view, c->n - drop}, think, c->chat_template, NULL, &rendered,
                                    &markup, &n_markup);
    free(view);
    if (rc != RLX_OK)
        return app_fail_rlx("chat: cannot apply the chat template");
    rc = app_encode_chat(tok, rendered, markup, n_markup, c->special_in_content, max_ids, ids, n, over);
    free(rendered);
    free(markup);
    if (rc != RLX_OK)
        return app_fail_rlx("chat: cannot encode the conversation");
    return 0;
}

/* The conversation's ids for the reply to its last (user) message, after dropping the oldest
 * turns (a user message and the replies to it; never the n_fixed messages that open it) until
 * the context has room for at least one reply token. A message that does not fit even alone
 * fails, with the conversation left as it was. */
static int fit_conversation(const app_runtime *rt, rlx_tokenizer *tok, conversation *c, size_t n_fixed, int think,
                            int32_t **ids, size_t *n) {
    uint32_t capacity = rt->lm.capacity(rt->lm.self);
    size_t drop = 0, turns = 0;
    int over = 0;
    for (;;) {
        /* a conversation that does not fit is not encoded past the context */
        if (render_ids(tok, c, n_fixed, drop, think, capacity - 1, ids, n, &over))
            return 1;
        if (!over && *n < capacity)
            break;
        free(*ids);
        *ids = NULL;
        size_t next = n_fixed + drop + 1; /* the message after the oldest turn's replies */
        while (next < c->n && strcmp(c->msgs[next].role, "user") != 0)
            next++;
        if (next == c->n) {
            char context[80];
            return app_fail("chat: %s more than %zu tokens, which leaves no room for a reply in the context (%s); "
                            "the conversation is kept as it was",
                            n_fixed ? "the system prompt and this message take" : "this message takes",
                            (size_t)capacity - 1, app_describe_context(rt, capacity, context, sizeof context));
        }
        drop = next - n_fixed;
        turns++;
    }
    if (turns) {
        for (size_t i = n_fixed; i < n_fixed + drop; i++)
            free((char *)c->msgs[i].content);
        memmove(c->msgs + n_fixed, c->msgs + n_fixed + drop, (c->n - n_fixed - drop) * sizeof *c->msgs);
        c->n -= drop;
        if (turns == 1)
            fprintf(stderr, "rlx chat: dropped the oldest turn to fit the context of %u positions\n", capacity);
        else
            fprintf(stderr, "rlx chat: dropped the oldest %zu turns to fit the context of %u positions\n", turns,
                    capacity);
    }
    return 0;
}

/* One assistant turn for the conversation so far, whose first n_fixed messages are never
 * dropped; the reply is added to it. */
/* What turn() returns when the model cannot answer any more (a pipeline lost a stage); 1 is a
 * failed turn after which the conversation can go on. */
#define TURN_MODEL_GONE 2

static int turn(app_runtime *rt, rlx_tokenizer *tok, rlx_sampler *sampler, rlx_stop_matcher *stopper, conversation *c,
                size_t n_fixed, int think, uint32_t max_new, int stats) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (fit_conversation(rt, tok, c, n_fixed, think, &ids, &n))
        return 1;
    size_t keep = 0;
    while (keep < n && keep < c->n_cached && ids[keep] == c->cached[keep])
        keep++;
    if (keep == n) /* the model must see at least one new token to answer */
        keep--;
    uint32_t capacity = rt->lm.capacity(rt->lm.self), room = capacity - (uint32_t)n;
    uint32_t reply_max = max_new < room ? max_new : room;
    rt->lm.truncate(rt->lm.self, (uint32_t)keep);
    c->n_cached = keep;
    reply r = {.stopper = stopper};
    int status = 0;
    if (rlx_detok_create(tok, RLX_DECODE_SKIP_SPECIAL, &r.detok) != RLX_OK)
        status = app_fail_rlx("chat");
    if (stopper)
        rlx_stop_matcher_reset(stopper);
    /* the penalties look at the whole context: what the cache keeps, then (from rlx_generate) the rest */
    rlx_sampler_reset_history(sampler);
    for (size_t i = 0; i < keep; i++)
        rlx_sampler_accept(sampler, ids[i]);
    interrupted = 0;
    rlx_gen_stats st;
    rlx_status rc =
        status ? RLX_OK
               : rlx_generate(&rt->lm, sampler, ids + keep, (uint32_t)(n - keep), reply_max, on_token, &r, &st);
    if (rc != RLX_OK) {
        app_fail_rlx("chat");
        /* a stage that died or stalls will not answer the next message either */
        status = rc == RLX_E_PEER || rc == RLX_E_TIMEOUT ? TURN_MODEL_GONE : 1;
    }
    if (!status && !r.failed) {
        const char *rest;
        size_t len;
        rlx_detok_flush(r.detok, &rest, &len);
        if (show(&r, rest, len) < 0)
            r.failed = 1;
        if (r.stopper && !r.stopped) {
            rlx_stop_matcher_flush(r.stopper, &rest, &len);
            r.failed |= append(&r, rest, len) < 0 || fwrite(rest, 1, len, stdout) != len;
        }
        if (fputs("\n", stdout) == EOF || fflush(stdout) != 0)
            r.failed = 1;
    }
    if (!status && r.failed)
        status = app_fail("chat: cannot write the reply");
    if (!status && reply_max < max_new && st.n_generated == reply_max && !st.stopped_on_eos && !interrupted &&
        !r.stopped) {
        char context[80];
        fprintf(stderr, "rlx chat: context full (%s): the reply stopped after %u token%s\n",
                app_describe_context(rt, capacity, context, sizeof context), reply_max, reply_max == 1 ? "" : "s");
    }
    if (!status && stats)
        fprintf(stderr,
                "rlx chat: %zu prompt tokens reused from the cache, %u run at %.1f tokens/s; %u generated at "
                "%.1f tokens/s\n",
                keep, st.n_prompt, st.n_prompt / st.prompt_seconds, st.n_generated,
                st.n_generated > 1 ? (st.n_generated - 1) / st.generate_seconds : 0.0);
    /* the cache holds the prompt and every reply token but the last, which was only sampled */
    if (!status)
        status = remember(c, ids + keep, n - keep) || remember(c, r.ids, r.n_ids ? r.n_ids - 1 : 0) ||
                 add_message(c, "assistant", r.text ? r.text : "");
    if (status) /* the cache no longer matches what we know: start the next turn from scratch */
        c->n_cached = 0;
    rlx_detok_destroy(r.detok);
    free(r.text);
    free(r.ids);
    free(ids);
    return status;
}

int cmd_chat(int argc, char **argv, app_options *o) {
    const char *system = NULL, *system_file = NULL, *template_file = NULL;
    int no_think = 0, special_in_content = 0, stats = 0, max_given = 0, is_conversation = 0;
    uint32_t max_new = 512;
    app_sampling sampling = {0};
    const app_opt own[] = {
        {0, "system", "system-prompt", "TEXT", "a system message opening the conversation (llama.cpp's -sys)",
         APP_OPT_STRING, &system},
        {0, "system-prompt-file", NULL, "FILE",
         "the system message as the text of FILE, one final newline dropped\n"
         "(llama.cpp's -sysf)",
         APP_OPT_STRING, &system_file},
        {0, "conversation", NULL, NULL, "llama.cpp's -cnv, taken: chat is always a conversation", APP_OPT_FLAG,
         &is_conversation},
        {0, "no-think", NULL, NULL, "Qwen3's enable_thinking=false", APP_OPT_FLAG, &no_think},
        {0, "chat-template-file", NULL, "FILE", APP_CHAT_TEMPLATE_FILE_HELP, APP_OPT_STRING, &template_file},
        {0, "special-in-content", NULL, NULL, APP_SPECIAL_IN_CONTENT_HELP, APP_OPT_FLAG, &special_in_content},
        {'n', "n-predict", NULL, "N",
         "at most N tokens per reply (default 512; -1: until end-of-sequence); a\n"
         "reply also stops at the end of the context (--ctx), and a message that does\n"
         "not fit after the conversation drops its oldest turns",
         APP_OPT_CUSTOM, &max_new, &max_given, .parse = app_parse_max_new},
        {0, "stats", NULL, NULL,
         "after each reply, print on stderr how many prompt tokens were reused from\n"
         "the KV cache and how many were run, and the speeds",
         APP_OPT_FLAG, &stats},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("chat:", own), app_sampling_group(&sampling), app_common_group(o),
                                    app_pipeline_group(&o->pipeline)};
    int exit_status;
    if (app_parse_command("chat", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status;
    if (app_sampling_finish(&sampling))
        return 1;
    if (system && system_file)
        return app_fail("chat: give --system or --system-prompt-file, not both");
    char *system_text = NULL, *template_text = NULL;
    size_t system_len;
    if (system_file &&
        !(system = system_text = app_read_file("chat: --system-prompt-file", system_file, 1, &system_len)))
        return 1;
    if (app_chat_template_file("chat", template_file, &template_text)) {
        free(system_text);
        return 1;
    }
    app_runtime rt;
    if (app_runtime_open(&rt, o, NULL)) {
        free(system_text);
        free(template_text);
        return 1;
    }
    rlx_tokenizer *tok = NULL;
    rlx_sampler *sampler = NULL;
    rlx_stop_matcher *stopper = NULL;
    conversation c = {.special_in_content = special_in_content, .chat_template = template_text};
    int status = app_generation_defaults(&rt, &sampling, &max_new, max_given);
    if (!status && app_tokenizer_open(&rt, &tok) != RLX_OK)
        status = app_fail_rlx("chat: cannot load the tokenizer");
    if (!status && rlx_chat_template_of(tok) == RLX_CHAT_TEMPLATE_NONE && !template_file)
        status = app_fail("chat: %s has no chat template (give one with --chat-template-file)", rt.model_dir);
    if (!status && rlx_sampler_create(&sampling.params, rt.lm.vocab, &sampler) != RLX_OK)
        status = app_fail_rlx("chat");
    if (!status && sampling.n_stops && rlx_stop_matcher_create(sampling.stops, sampling.n_stops, &stopper) != RLX_OK)
        status = app_fail_rlx("chat: --stop");
    if (!status && system)
        status = add_message(&c, "system", system);
    size_t n_fixed = c.n;
    const int tty = isatty(STDIN_FILENO);
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    sigaction(SIGINT, &sa, &old);
    static const int fatal[] = {SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction fatal_old[sizeof fatal / sizeof fatal[0]];
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) {
        struct sigaction restore = {.sa_handler = on_fatal_signal, .sa_flags = (int)SA_RESETHAND};
        sigaction(fatal[i], NULL, &fatal_old[i]);
        /* an ignored signal (nohup) stays ignored */
        if (tty && fatal_old[i].sa_handler != SIG_IGN)
            sigaction(fatal[i], &restore, NULL);
    }
    /* after the handlers: from here on a signal must put the terminal back */
    chat_input *input = status ? NULL : chat_input_open(&interrupted);
    if (!input)
        status = 1;
    if (!status && chat_input_is_terminal(input))
        fprintf(stderr, "rlx chat: /reset forgets the conversation, /quit or Ctrl-D ends it, Ctrl-C stops a reply; "
                        "end a line with \\ to go on, or put lines between two lines of \"\"\"\n");
    while (!status) {
        interrupted = 0;
        const char *line;
        size_t len;
        if (chat_input_read(input, &line, &len) <= 0)
            break;
        if (len == 0)
            continue;
        if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0)
            break;
        if (strcmp(line, "/reset") == 0) {
            clear_messages(&c, n_fixed);
            c.n_cached = 0;
            rt.lm.truncate(rt.lm.self, 0);
            fprintf(stderr, "rlx chat: conversation cleared\n");
            continue;
        }
        if ((status = add_message(&c, "user", line)))
            break;
        int failed = turn(&rt, tok, sampler, stopper, &c, n_fixed, !no_think, max_new, stats);
        chat_input_discard_typed(input);
        if (failed == TURN_MODEL_GONE) {
            status = 1;
            break;
        }
        if (failed) {
            /* a failed turn takes its message back (turns dropped to fit it stay dropped) */
            clear_messages(&c, c.n - 1);
            if (ferror(stdout)) /* nobody is reading the replies any more */
                status = 1;
        }
    }
    chat_input_close(input);
    sigaction(SIGINT, &old, NULL);
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        sigaction(fatal[i], &fatal_old[i], NULL);
    clear_messages(&c, 0);
    free(c.msgs);
    free(c.cached);
    rlx_sampler_destroy(sampler);
    rlx_stop_matcher_destroy(stopper);
    rlx_tokenizer_close(tok);
    app_runtime_close(&rt);
    free(system_text);
    free(template_text);
    return status;
}
