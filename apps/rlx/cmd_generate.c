/* rlx generate: samples a continuation of a prompt given as token ids and prints the ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char help[] =
    "usage: rlx generate --model DIR --tokens 1,5,3 -n N [--greedy | --temp T --top-k K --top-p P]\n"
    "                    [--seed S] [--stats] [options]\n\n"
    "Prints the generated token ids, space-separated, on one line. Stops after N tokens or an\n"
    "end-of-sequence id from config.json / generation_config.json (which is printed).\n\n"
    "  -n N          tokens to generate (default 16)\n"
    "  --greedy      always take the most likely token (default when no sampling option is given)\n"
    "  --temp T      sampling temperature (> 0)\n"
    "  --top-k K     keep the K most likely tokens (0 = all)\n"
    "  --top-p P     keep the smallest set of tokens whose probability reaches P\n"
    "  --seed S      random seed; the same seed gives the same output\n"
    "  --stats       print prompt and generation speed on stderr\n\noptions:\n";

typedef struct printer {
    int n;
    int failed;
} printer;

static int print_token(void *ctx, int32_t token) {
    printer *p = ctx;
    if (printf(p->n++ ? " %d" : "%d", token) < 0 || fflush(stdout) != 0) {
        p->failed = 1;
        return 1;
    }
    return 0;
}

int cmd_generate(int argc, char **argv, app_options *o) {
    const char *tokens = NULL;
    uint32_t n_new = 16;
    int sampling = 0, greedy = 0, stats = 0;
    rlx_sampler_params sp = rlx_sampler_params_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0) {
            printf("%s%s", help, app_common_help);
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc < 0)
            return 1;
        if (rc)
            continue;
        if (strcmp(a, "--greedy") == 0) {
            greedy = 1;
        } else if (strcmp(a, "--stats") == 0) {
            stats = 1;
        } else if (strcmp(a, "--tokens") == 0 || strcmp(a, "-n") == 0 || strcmp(a, "--temp") == 0 ||
                   strcmp(a, "--top-k") == 0 || strcmp(a, "--top-p") == 0 || strcmp(a, "--seed") == 0) {
            if (!(v = app_value(argc, argv, &i)))
                return 1;
            uint32_t u;
            if (strcmp(a, "--tokens") == 0)
                tokens = v;
            else if (strcmp(a, "-n") == 0 && app_parse_u32(a, v, &n_new) < 0)
                return 1;
            else if (strcmp(a, "--temp") == 0 && (sampling = 1, app_parse_float(a, v, &sp.temperature) < 0))
                return 1;
            else if (strcmp(a, "--top-p") == 0 && (sampling = 1, app_parse_float(a, v, &sp.top_p) < 0))
                return 1;
            else if (strcmp(a, "--top-k") == 0) {
                if (app_parse_u32(a, v, &u) < 0 || u > INT32_MAX)
                    return 1;
                sampling = 1;
                sp.top_k = (int32_t)u;
            } else if (strcmp(a, "--seed") == 0) {
                unsigned long long seed;
                char *end;
                seed = strtoull(v, &end, 10);
                if (end == v || *end)
                    return app_fail("--seed: '%s' is not an integer", v);
                sp.seed = seed;
            }
        } else {
            return app_fail("generate: unknown option '%s' (see rlx generate --help)", a);
        }
    }
    if (greedy && sampling)
        return app_fail("generate: --greedy cannot be combined with --temp, --top-k or --top-p");
    if (!tokens)
        return app_fail("generate: --tokens is required (see rlx generate --help)");
    sp.greedy = !sampling;
    int32_t *ids;
    int n = app_parse_tokens(tokens, &ids);
    if (n < 0)
        return 1;
    app_runtime rt;
    if (app_runtime_open(&rt, o)) {
        free(ids);
        return 1;
    }
    int status = 0;
    rlx_sampler *sampler = NULL;
    printer pr = {0};
    rlx_gen_stats st;
    if (rlx_sampler_create(&sp, rlx_model_config_of(rt.model)->vocab_size, &sampler) != RLX_OK)
        status = app_fail_rlx("generate");
    else if (rlx_session_generate(rt.session, sampler, ids, (uint32_t)n, n_new, print_token, &pr, &st) != RLX_OK)
        status = app_fail_rlx("generate");
    if (!status && (pr.failed || printf("\n") < 0 || fflush(stdout) != 0))
        status = app_fail("generate: cannot write to stdout");
    if (!status && stats) {
        double decode = st.n_generated > 1 ? (st.n_generated - 1) / st.generate_seconds : 0;
        fprintf(stderr, "prompt: %u tokens, %.1f tokens/s; generated: %u tokens, %.1f tokens/s%s\n", st.n_prompt,
                st.n_prompt / st.prompt_seconds, st.n_generated, decode, st.stopped_on_eos ? " (stopped on EOS)" : "");
    }
    rlx_sampler_destroy(sampler);
    app_runtime_close(&rt);
    free(ids);
    return status;
}
