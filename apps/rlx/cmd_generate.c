/* rlx generate: continues a prompt given as token ids (printing ids) or as text (streaming
 * text as it is produced). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "output.h"
#include "rlx/grammar.h"
#include "rlx/text.h"

static const char usage[] =
    "usage: rlx generate [-m PATH] (-p TEXT | -f FILE | --tokens 1,5,3) [-n N] [--chat [--no-think]]\n"
    "                    [sampling options] [--stats] [--spec NAME ...] [options]\n\n"
    "With --tokens, prints the generated token ids, space-separated, on one line. With --prompt\n"
    "or -f, encodes the text with the model's tokenizer.json and streams the generated text.\n"
    "Stops after N tokens, an end-of-sequence id of config.json / generation_config.json, a\n"
    "--stop string or at the end of the context (saying so on stderr).\n\n";

static int emit(void *ctx, int32_t token, const float *logits) { return app_output_token(ctx, token, logits); }

/* The prompt's ids: parsed from --tokens, or the tokenizer's encoding of --prompt, which stops
 * once it passes max_ids (0: no limit), setting *over. */
static int prompt_ids(const app_runtime *rt, const char *tokens, const char *prompt, int chat, int think,
                      const char *chat_template, int special_in_content, size_t max_ids, rlx_tokenizer **tok,
                      int32_t **ids, size_t *n, int *over) {
    if (tokens) {
        int count = app_parse_tokens("--tokens", tokens, ids);
        if (count < 0)
            return 1;
        *n = (size_t)count;
        return 0;
    }
    if (app_tokenizer_open(rt, tok) != RLX_OK)
        return app_fail_rlx("generate: cannot load the tokenizer");
    rlx_status rc;
    if (chat) {
        rlx_chat_message m = {.role = "user", .content = prompt};
        char *rendered;
        rlx_text_span *markup;
        size_t n_markup;
        if (app_chat_render(*tok, &(app_chat){&m, 1}, think, chat_template, NULL, &rendered, &markup, &n_markup) !=
            RLX_OK)
            return app_fail_rlx("generate: cannot apply the chat template");
        rc = app_encode_chat(*tok, rendered, markup, n_markup, special_in_content, max_ids, ids, n, over);
        free(rendered);
        free(markup);
    } else {
        /* special tokens in raw text are parsed, and the BOS the model wants is added (Llama 3,
         * Mistral; not Qwen3), as Hugging Face's tokenizer(text) and llama.cpp do */
        rlx_encode_options eo = {.size = sizeof eo, .parse_special = 1, .max_ids = max_ids, .add_special = 1};
        rc = rlx_tokenizer_encode_ex(*tok, prompt, strlen(prompt), &eo, ids, n, over);
    }
    if (rc != RLX_OK)
        return app_fail_rlx("generate: cannot encode the prompt");
    if (*n == 0)
        return app_fail("generate: the prompt encodes to no tokens");
    return 0;
}

/* Fits a prompt of n tokens (more, when over) into rt's context: one longer than the context
 * fails unless truncate. With truncate, a prompt that leaves the reply less than min(n_new, capacity / 2)
 * positions loses its first tokens down to capacity - min(n_new, capacity / 2): the reply gets
 * the room it asks for, but never at the cost of more than half the context, which stays the
 * prompt's. *skip is the number of prompt tokens dropped, *max_new is n_new limited to the room
 * that is left. 1 after reporting. */
static int fit_context(const app_runtime *rt, size_t n, int over, uint32_t n_new, int truncate, uint32_t *skip,
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
    } else if (n > capacity || over) {
        return app_fail("generate: a prompt of %s%zu tokens does not fit the context (%s); --truncate keeps its "
                        "last tokens",
                        over ? "more than " : "", n, app_describe_context(rt, capacity, context, sizeof context));
    }
    uint32_t room = capacity - (uint32_t)(n - *skip);
    *max_new = n_new < room ? n_new : room;
    return 0;
}

/* A constrained reply (--grammar, --grammar-file, --json-schema, --json-schema-file, as
 * llama.cpp's): the grammar, the tokenizer's vocabulary for it and the sequence's place in it. */
typedef struct constraint {
    const char *gbnf, *gbnf_file, *schema, *schema_file;
    rlx_grammar *grammar;
    rlx_grammar_vocab *vocab;
    rlx_grammar_matcher *matcher;
} constraint;

static void constraint_free(constraint *c) {
    rlx_grammar_matcher_destroy(c->matcher);
    rlx_grammar_vocab_destroy(c->vocab);
    rlx_grammar_destroy(c->grammar);
}

/* Compiles the constraint asked for and hands it to the sampler, with the model's end ids as
 * the ends the grammar allows once its text is complete. 1 after reporting. */
static int constrain(const app_runtime *rt, rlx_tokenizer **tok, rlx_sampler *sampler, constraint *c) {
    const char *path = c->gbnf_file ? c->gbnf_file : c->schema_file;
    char *file = NULL, *gbnf = NULL;
    size_t len = 0, gbnf_len = 0;
    if (path && !(file = app_read_file("generate", path, 0, &len)))
        return 1;
    const char *text = file ? file : c->gbnf ? c->gbnf : c->schema;
    len = file ? len : strlen(text);
    int status = 0;
    if ((c->schema || c->schema_file) && rlx_json_schema_to_gbnf(text, len, NULL, &gbnf, &gbnf_len) != RLX_OK)
        status = app_fail_rlx("generate: --json-schema");
    if (!status && rlx_grammar_parse(gbnf ? gbnf : text, gbnf ? gbnf_len : len, NULL, &c->grammar) != RLX_OK)
        status = app_fail_rlx("generate: --grammar");
    if (!status && !*tok && app_tokenizer_open(rt, tok) != RLX_OK)
        status = app_fail_rlx("generate: a grammar needs the model's tokenizer");
    if (!status && (rlx_grammar_vocab_create(*tok, &c->vocab) != RLX_OK ||
                    rlx_grammar_matcher_create(c->grammar, c->vocab, &c->matcher) != RLX_OK ||
                    rlx_sampler_set_grammar(sampler, c->matcher, rt->lm.eos_ids, rt->lm.n_eos) != RLX_OK))
        status = app_fail_rlx("generate");
    free(file);
    free(gbnf);
    return status;
}

int cmd_generate(int argc, char **argv, app_options *o) {
    const char *tokens = NULL, *prompt = NULL, *file = NULL, *template_file = NULL;
    uint32_t n_new = 16;
    int stats = 0, chat = 0, no_think = 0, special_in_content = 0, truncate = 0, n_given = 0, json = 0,
        logprobs_given = 0, ignore_eos = 0, no_conversation = 0;
    uint32_t top_logprobs = 0;
    app_sampling sampling = {0};
    app_spec_options spec_options = {0};
    constraint cons = {0};
    const app_opt own[] = {
        {'p', "prompt", NULL, "TEXT", "the prompt as text", APP_OPT_STRING, &prompt},
        {'f', "file", NULL, "FILE", "the prompt as the text of FILE ('-': standard input)", APP_OPT_STRING, &file},
        {0, "tokens", NULL, "LIST", "the prompt as token ids, separated by commas or spaces", APP_OPT_STRING, &tokens},
        {'n', "n-predict", NULL, "N",
         "tokens to generate (default 16; -1: until end-of-sequence or the context\n"
         "is full)",
         APP_OPT_CUSTOM, &n_new, &n_given, .parse = app_parse_max_new},
        {0, "chat", NULL, NULL, "wrap the text as a user turn with the model's chat template", APP_OPT_FLAG, &chat},
        {0, "no-think", NULL, NULL, "with --chat: Qwen3's enable_thinking=false", APP_OPT_FLAG, &no_think},
        {0, "chat-template-file", NULL, "FILE", "with --chat: " APP_CHAT_TEMPLATE_FILE_HELP, APP_OPT_STRING,
         &template_file},
        {0, "no-conversation", NULL, NULL,
         "llama.cpp's -no-cnv, taken: generate continues the prompt as it is\n"
         "unless --chat",
         APP_OPT_FLAG, &no_conversation},
        {0, "special-in-content", NULL, NULL, "with --chat: " APP_SPECIAL_IN_CONTENT_HELP, APP_OPT_FLAG,
         &special_in_content},
        {0, "truncate", NULL, NULL,
         "drop the start of a prompt that leaves fewer than min(N, ctx/2) positions\n"
         "for the reply (a prompt longer than the context fails without it)",
         APP_OPT_FLAG, &truncate},
        {0, "json", NULL, NULL,
         "print one JSON object at the end instead of streaming: text, token ids,\n"
         "finish_reason (stop or length), stopped_by, timings, seed",
         APP_OPT_FLAG, &json},
        {0, "logprobs", NULL, "K",
         "with --json: each token's log-probability under the model (softmax of its\n"
         "logits, before sampling settings) and its K most likely alternatives (0-20)",
         APP_OPT_U32, &top_logprobs, &logprobs_given},
        {0, "ignore-eos", NULL, NULL, "do not stop at end-of-sequence ids (llama.cpp's --ignore-eos, for benchmarks)",
         APP_OPT_FLAG, &ignore_eos},
        {0, "grammar", NULL, "GBNF",
         "generate only text of this GBNF grammar (docs/grammars.md); it ends where\n"
         "the grammar's text is complete",
         APP_OPT_STRING, &cons.gbnf},
        {0, "grammar-file", NULL, "FILE", "--grammar from FILE", APP_OPT_STRING, &cons.gbnf_file},
        {'j', "json-schema", NULL, "SCHEMA", "generate only JSON that the JSON schema validates", APP_OPT_STRING,
         &cons.schema},
        {0, "json-schema-file", NULL, "FILE", "--json-schema from FILE (-jf)", APP_OPT_STRING, &cons.schema_file},
        {0, "stats", NULL, NULL,
         "print the seed, prompt and generation speed on stderr (with --spec also\n"
         "the acceptance figures)",
         APP_OPT_FLAG, &stats},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("generate:", own), app_sampling_group(&sampling),
                                    app_spec_group(&spec_options), app_common_group(o),
                                    app_pipeline_group(&o->pipeline)};
    int exit_status;
    if (app_parse_command("generate", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status;
    if (app_sampling_finish(&sampling))
        return 1;
    if ((tokens != NULL) + (prompt != NULL) + (file != NULL) != 1)
        return app_fail("generate: give exactly one of --tokens, --prompt and -f (see rlx generate --help)");
    if (chat && tokens)
        return app_fail("generate: --chat needs a text prompt (--prompt or -f), not --tokens");
    if (logprobs_given && !json)
        return app_fail("generate: --logprobs adds to the JSON output; it needs --json");
    if (top_logprobs > APP_MAX_LOGPROBS)
        return app_fail("generate: --logprobs %u: at most %d alternatives", top_logprobs, APP_MAX_LOGPROBS);
    if (sampling.n_stops && tokens)
        return app_fail("generate: --stop matches text; with --tokens the output is ids");
    if (no_conversation && chat)
        return app_fail("generate: --no-conversation (-no-cnv) and --chat contradict each other");
    if (no_think && !chat)
        return app_fail("generate: --no-think only changes the chat template; it needs --chat");
    if (template_file && !chat)
        return app_fail("generate: --chat-template-file is the chat template; it needs --chat");
    if (special_in_content && !chat)
        return app_fail("generate: --special-in-content is about chat messages; it needs --chat (special tokens "
                        "in a raw prompt are always parsed)");
    if ((cons.gbnf != NULL) + (cons.gbnf_file != NULL) + (cons.schema != NULL) + (cons.schema_file != NULL) > 1)
        return app_fail("generate: give one of --grammar, --grammar-file, --json-schema and --json-schema-file");
    char *file_text = NULL, *template_text = NULL;
    size_t file_len;
    if (file && !(prompt = file_text = app_read_file("generate", file, 1, &file_len)))
        return 1;
    if (file && strlen(file_text) != file_len) {
        free(file_text);
        return app_fail("generate: %s holds a NUL byte; a prompt is text", file);
    }
    if (app_chat_template_file("generate", template_file, &template_text)) {
        free(file_text);
        return 1;
    }
    app_runtime rt;
    if (app_runtime_open(&rt, o, &spec_options)) {
        free(file_text);
        free(template_text);
        return 1;
    }
    if (app_generation_defaults(&rt, &sampling, &n_new, n_given)) {
        app_runtime_close(&rt);
        free(file_text);
        free(template_text);
        return 1;
    }
    if (ignore_eos)
        rt.lm.n_eos = 0;
    rlx_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    uint32_t capacity = rt.lm.capacity(rt.lm.self), skip = 0, max_new = 0;
    int over = 0;
    /* a prompt longer than the context is refused, so its encoding stops there; --truncate keeps
     * the end of the prompt and needs all of it */
    int status = prompt_ids(&rt, tokens, prompt, chat, !no_think, template_text, special_in_content,
                            truncate ? 0 : capacity, &tok, &ids, &n, &over);
    free(template_text);
    char context[80];
    if (!status)
        status = fit_context(&rt, n, over, n_new, truncate, &skip, &max_new);
    /* the JSON object gives the text and each token's too when the model has a tokenizer, even for
     * a prompt of ids; without one it has the ids only */
    if (!status && json && !tok && app_tokenizer_open(&rt, &tok) != RLX_OK)
        tok = NULL;
    rlx_sampler *sampler = NULL;
    app_output *out = NULL;
    app_output_options oo = {.tok = tok,
                             .stops = sampling.stops,
                             .n_stops = sampling.n_stops,
                             .json = json,
                             .logprobs = logprobs_given,
                             .top_logprobs = top_logprobs,
                             .vocab = rt.lm.vocab,
                             .out = stdout};
    rlx_spec_stats sst = {0};
    rlx_gen_stats st = {0};
    if (!status && rlx_sampler_create(&sampling.params, rt.lm.vocab, &sampler) != RLX_OK)
        status = app_fail_rlx("generate");
    if (!status && (cons.gbnf || cons.gbnf_file || cons.schema || cons.schema_file))
        status = constrain(&rt, &tok, sampler, &cons);
    if (!status)
        status = app_output_create(&oo, &out);
    if (!status && rt.spec) {
        if (rlx_spec_generate(&rt.lm, rt.spec, rt.draft_tokens, sampler, ids + skip, (uint32_t)(n - skip), max_new,
                              emit, out, &sst) != RLX_OK)
            status = app_fail_rlx("generate");
        st = sst.gen;
    } else if (!status &&
               rlx_generate(&rt.lm, sampler, ids + skip, (uint32_t)(n - skip), max_new, emit, out, &st) != RLX_OK) {
        status = app_fail_rlx("generate");
    }
    const int context_full = max_new < n_new && st.n_generated == max_new && !st.stopped_on_eos;
    app_finish finish = {.stopped_by = st.stopped_on_eos                ? "eos"
                                       : out && app_output_stopped(out) ? "stop_string"
                                       : context_full                   ? "context"
                                                                        : "max_tokens",
                         .stats = &st,
                         .seed = sampling.params.seed,
                         .greedy = sampling.params.greedy};
    if (!status)
        status = app_output_finish(out, &finish);
    /* a reply the context cut short is a result, not an error: said once, after the text */
    if (!status && context_full)
        fprintf(stderr, "rlx: context full (%s): stopped after %u token%s\n",
                app_describe_context(&rt, capacity, context, sizeof context), max_new, max_new == 1 ? "" : "s");
    if (!status && stats) {
        fprintf(stderr, "rlx: seed %llu%s\n", (unsigned long long)sampling.params.seed,
                sampling.params.greedy ? " (greedy: unused)"
                : sampling.seed_drawn  ? " (drawn; --seed repeats the run)"
                                       : "");
        double decode = st.n_generated > 1 ? (st.n_generated - 1) / st.generate_seconds : 0;
        fprintf(stderr, "rlx: prompt %u tokens at %.1f tokens/s; generated %u tokens at %.1f tokens/s%s\n", st.n_prompt,
                st.n_prompt / st.prompt_seconds, st.n_generated, decode, st.stopped_on_eos ? " (stopped on EOS)" : "");
        if (rt.spec)
            fprintf(stderr,
                    "rlx: speculator %s, %u draft tokens: %llu proposed, %llu accepted (acceptance rate "
                    "%.3f), mean accepted length %.2f per round, %.2f tokens per target pass over %llu passes; "
                    "drafting %.3f s, verifying %.3f s\n",
                    rlx_speculator_name(rt.spec), rt.draft_tokens, (unsigned long long)sst.proposed,
                    (unsigned long long)sst.accepted, rlx_spec_acceptance_rate(&sst), rlx_spec_mean_accepted(&sst),
                    rlx_spec_tokens_per_pass(&sst), (unsigned long long)sst.target_passes, sst.draft_seconds,
                    sst.verify_seconds);
    }
    app_output_destroy(out);
    rlx_sampler_destroy(sampler);
    constraint_free(&cons);
    rlx_tokenizer_close(tok);
    free(ids);
    free(file_text);
    app_runtime_close(&rt);
    return status;
}
