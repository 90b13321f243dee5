/* rlx generate: continues a prompt given as token ids (printing ids) or as text (streaming
 * text as it is produced). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rlx/text.h"

static const char help[] =
    "usage: rlx generate [--model DIR] (--tokens 1,5,3 | --prompt TEXT | -f FILE [--chat [--no-think]]) -n N\n"
    "                    [--greedy | --temp T --top-k K --top-p P] [--seed S] [--stats]\n"
    "                    [--spec NAME [--draft-tokens K] [--draft-model DIR] [--spec-opts OPTS]] [options]\n\n"
    "With --tokens, prints the generated token ids, space-separated, on one line. With --prompt\n"
    "or -f, encodes the text with the model's tokenizer.json and streams the generated text.\n"
    "Stops after N tokens, an end-of-sequence id of config.json / generation_config.json, or at\n"
    "the end of the context (--ctx), which a line on stderr reports.\n\n"
    "  -n N               tokens to generate (default 16; -1: until end-of-sequence or the context\n"
    "                     is full)\n"
    "  --tokens LIST      the prompt as token ids, separated by commas or spaces\n"
    "  -p, --prompt TEXT  the prompt as text\n"
    "  -f, --file FILE    the prompt as the text of FILE ('-': standard input)\n"
    "  --chat             wrap TEXT as a user turn with the model's chat template\n"
    "  --no-think         with --chat: Qwen3's enable_thinking=false\n"
    "  --truncate         drop the start of a prompt that leaves fewer than min(N, ctx/2) positions\n"
    "                     for the reply (a prompt longer than the context fails without it)\n"
    "  --stats            print prompt and generation speed on stderr (with --spec also the\n"
    "                     acceptance figures)\n";

typedef struct output {
    rlx_detok *detok; /* NULL: print ids */
    int n;
    int failed;
} output;

static int emit(void *ctx, int32_t token) {
    output *out = ctx;
    int ok;
    if (out->detok) {
        const char *text;
        size_t len;
        ok = rlx_detok_push(out->detok, token, &text, &len) == RLX_OK && fwrite(text, 1, len, stdout) == len;
    } else {
        ok = printf(out->n ? " %d" : "%d", token) > 0;
    }
    out->n++;
    if (!ok || fflush(stdout) != 0) {
        out->failed = 1;
        return 1;
    }
    return 0;
}

/* The prompt's ids: parsed from --tokens, or the tokenizer's encoding of --prompt. */
static int prompt_ids(const app_runtime *rt, const char *tokens, const char *prompt, int chat, int think,
                      rlx_tokenizer **tok, int32_t **ids, size_t *n) {
    if (tokens) {
        int count = app_parse_tokens("--tokens", tokens, ids);
        if (count < 0)
            return 1;
        *n = (size_t)count;
        return 0;
    }
    if (rlx_tokenizer_load(rt->model_dir, tok) != RLX_OK)
        return app_fail_rlx("generate: cannot load the tokenizer");
    char *rendered = NULL;
    if (chat) {
        rlx_chat_message m = {.role = "user", .content = prompt};
        if (rlx_chat_render(*tok, &m, 1, 1, think, &rendered) != RLX_OK)
            return app_fail_rlx("generate: cannot apply the chat template");
        prompt = rendered;
    }
    /* special tokens in the text are parsed, as Hugging Face's tokenizer(text) does by default */
    rlx_status rc = rlx_tokenizer_encode(*tok, prompt, strlen(prompt), 1, ids, n);
    free(rendered);
    if (rc != RLX_OK)
        return app_fail_rlx("generate: cannot encode the prompt");
    if (*n == 0)
        return app_fail("generate: the prompt encodes to no tokens");
    return 0;
}

/* Fits a prompt of n tokens into rt's context: one longer than the context fails unless
 * truncate. With truncate, a prompt that leaves the reply less than min(n_new, capacity / 2)
 * positions loses its first tokens down to capacity - min(n_new, capacity / 2): the reply gets
 * the room it asks for, but never at the cost of more than half the context, which stays the
 * prompt's. *skip is the number of prompt tokens dropped, *max_new is n_new limited to the room
 * that is left. 1 after reporting. */
static int fit_context(const app_runtime *rt, size_t n, uint32_t n_new, int truncate, uint32_t *skip,
                       uint32_t *max_new) {
    uint32_t capacity = rt->lm.capacity(rt->lm.self);
    char context[80];
    *skip = 0;
    if (truncate) {
        uint32_t room = n_new < capacity / 2 ? n_new : capacity / 2;
        if (n > capacity - room) {
            *skip = (uint32_t)(n - (capacity - room));
            fprintf(stderr, "rlx: prompt truncated to its last %u of %zu tokens\n", capacity - room, n);
        }
    } else if (n > capacity) {
        return app_fail("generate: a prompt of %zu tokens does not fit the context (%s); --truncate keeps its last "
                        "tokens",
                        n, app_describe_context(rt, capacity, context, sizeof context));
    }
    uint32_t room = capacity - (uint32_t)(n - *skip);
    *max_new = n_new < room ? n_new : room;
    return 0;
}

int cmd_generate(int argc, char **argv, app_options *o) {
    const char *tokens = NULL, *prompt = NULL, *file = NULL;
    uint32_t n_new = 16;
    int stats = 0, chat = 0, think = 1, truncate = 0, n_given = 0;
    app_sampling sampling = {.params = rlx_sampler_params_default()};
    app_spec_options spec_options = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0) {
            printf("%s%s%s%s", help, app_sampling_help, app_spec_help, app_common_help);
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc == 0)
            rc = app_parse_sampling(&sampling, argc, argv, &i);
        if (rc == 0)
            rc = app_parse_spec(&spec_options, argc, argv, &i);
        if (rc < 0)
            return 1;
        if (rc)
            continue;
        if (strcmp(a, "--stats") == 0) {
            stats = 1;
        } else if (strcmp(a, "--chat") == 0) {
            chat = 1;
        } else if (strcmp(a, "--no-think") == 0) {
            think = 0;
        } else if (strcmp(a, "--truncate") == 0) {
            truncate = 1;
        } else if (strcmp(a, "--tokens") == 0 || strcmp(a, "--prompt") == 0 || strcmp(a, "-p") == 0 ||
                   strcmp(a, "--file") == 0 || strcmp(a, "-f") == 0) {
            const char **dst = a[2] == 't' ? &tokens : a[1] == 'f' || a[2] == 'f' ? &file : &prompt;
            if (!(*dst = app_value(argc, argv, &i)))
                return 1;
        } else if (strcmp(a, "-n") == 0) {
            const char *v = app_value(argc, argv, &i);
            if (!v || app_parse_max_new(a, v, &n_new) < 0)
                return 1;
            n_given = 1;
        } else {
            return app_fail("generate: unknown option '%s' (see rlx generate --help)", a);
        }
    }
    if (app_sampling_finish(&sampling))
        return 1;
    if ((tokens != NULL) + (prompt != NULL) + (file != NULL) != 1)
        return app_fail("generate: give exactly one of --tokens, --prompt and -f (see rlx generate --help)");
    if ((chat || !think) && tokens)
        return app_fail("generate: --chat and --no-think need a text prompt (--prompt or -f)");
    char *file_text = NULL;
    size_t file_len;
    if (file && !(prompt = file_text = app_read_file("generate", file, &file_len)))
        return 1;
    if (file && strlen(file_text) != file_len) {
        free(file_text);
        return app_fail("generate: %s holds a NUL byte; a prompt is text", file);
    }
    app_runtime rt;
    app_speculator spec;
    if (app_runtime_open_speculative(&rt, o, &spec_options, &spec)) {
        free(file_text);
        return 1;
    }
    app_generation_defaults(&rt, &sampling, &n_new, n_given);
    rlx_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int status = prompt_ids(&rt, tokens, prompt, chat, think, &tok, &ids, &n);
    uint32_t capacity = rt.lm.capacity(rt.lm.self), skip = 0, max_new = 0;
    char context[80];
    if (!status)
        status = fit_context(&rt, n, n_new, truncate, &skip, &max_new);
    rlx_sampler *sampler = NULL;
    output out = {0};
    rlx_spec_stats sst = {0};
    rlx_gen_stats st = {0};
    if (!status && rlx_sampler_create(&sampling.params, rt.lm.vocab, &sampler) != RLX_OK)
        status = app_fail_rlx("generate");
    if (!status && tok && rlx_detok_create(tok, RLX_DECODE_SKIP_SPECIAL, &out.detok) != RLX_OK)
        status = app_fail_rlx("generate");
    if (!status && spec.spec) {
        if (rlx_spec_generate(&rt.lm, spec.spec, spec.k, sampler, ids + skip, (uint32_t)(n - skip), max_new, emit,
                              &out, &sst) != RLX_OK)
            status = app_fail_rlx("generate");
        st = sst.gen;
    } else if (!status &&
               rlx_generate(&rt.lm, sampler, ids + skip, (uint32_t)(n - skip), max_new, emit, &out, &st) != RLX_OK) {
        status = app_fail_rlx("generate");
    }
    if (!status && !out.failed) {
        const char *rest = "";
        size_t len = 0;
        if (out.detok)
            rlx_detok_flush(out.detok, &rest, &len);
        if (fwrite(rest, 1, len, stdout) != len || fputc('\n', stdout) == EOF || fflush(stdout) != 0)
            out.failed = 1;
    }
    if (!status && out.failed)
        status = app_fail("generate: cannot write to stdout");
    /* a reply the context cut short is a result, not an error: said once, after the text */
    if (!status && max_new < n_new && st.n_generated == max_new && !st.stopped_on_eos)
        fprintf(stderr, "rlx: context full (%s): stopped after %u token%s\n",
                app_describe_context(&rt, capacity, context, sizeof context), max_new, max_new == 1 ? "" : "s");
    if (!status && stats) {
        double decode = st.n_generated > 1 ? (st.n_generated - 1) / st.generate_seconds : 0;
        fprintf(stderr, "rlx: prompt %u tokens at %.1f tokens/s; generated %u tokens at %.1f tokens/s%s\n",
                st.n_prompt, st.n_prompt / st.prompt_seconds, st.n_generated, decode,
                st.stopped_on_eos ? " (stopped on EOS)" : "");
        if (spec.spec)
            fprintf(stderr, "rlx: speculator %s, %u draft tokens: %llu proposed, %llu accepted (acceptance rate "
                    "%.3f), mean accepted length %.2f per round, %.2f tokens per target pass over %llu passes; "
                    "drafting %.3f s, verifying %.3f s\n",
                    rlx_speculator_name(spec.spec), spec.k, (unsigned long long)sst.proposed,
                    (unsigned long long)sst.accepted, rlx_spec_acceptance_rate(&sst), rlx_spec_mean_accepted(&sst),
                    rlx_spec_tokens_per_pass(&sst), (unsigned long long)sst.target_passes, sst.draft_seconds,
                    sst.verify_seconds);
    }
    rlx_detok_destroy(out.detok);
    rlx_sampler_destroy(sampler);
    rlx_tokenizer_destroy(tok);
    free(ids);
    free(file_text);
    app_speculator_close(&spec);
    app_runtime_close(&rt);
    return status;
}
