/* rlx logits: the logits of a prompt as raw little-endian float32, for comparison with other
 * implementations. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char usage[] = "usage: rlx logits [-m PATH] --tokens 1,5,3 [--all] --out FILE [options]\n\n"
                            "Writes the last position's vocab logits (or with --all every position's, row after\n"
                            "row) as raw little-endian float32 to FILE.\n\n";

int cmd_logits(int argc, char **argv, app_options *o) {
    const char *tokens = NULL, *out_path = NULL;
    int all = 0;
    const app_opt own[] = {
        {0, "tokens", NULL, "LIST", "the prompt as token ids, separated by commas or spaces", APP_OPT_STRING, &tokens},
        {0, "out", NULL, "FILE", "where to write the logits", APP_OPT_STRING, &out_path},
        {0, "all", NULL, NULL, "every position's logits, not only the last one's", APP_OPT_FLAG, &all},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("logits:", own), app_common_group(o),
                                    app_pipeline_group(&o->pipeline)};
    int exit_status;
    if (app_parse_command("logits", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status;
    if (!tokens || !out_path)
        return app_fail("logits: --tokens and --out are required (see rlx logits --help)");
    int32_t *ids;
    int n = app_parse_tokens("--tokens", tokens, &ids);
    if (n < 0)
        return 1;
    app_runtime rt;
    if (app_runtime_open(&rt, o, NULL)) {
        free(ids);
        return 1;
    }
    int status = 0;
    const float *logits;
    if (rt.lm.forward(rt.lm.self, ids, (uint32_t)n, all, &logits) != RLX_OK) {
        status = app_fail_rlx("logits");
    } else {
        size_t count = (size_t)(all ? n : 1) * (size_t)rt.lm.vocab;
        FILE *f = fopen(out_path, "wb");
        if (!f) {
            status = app_fail("logits: cannot create %s: %s", out_path, strerror(errno));
        } else {
            size_t written = fwrite(logits, sizeof *logits, count, f);
            if (fclose(f) != 0 || written != count)
                status = app_fail("logits: cannot write %s: %s", out_path, strerror(errno));
        }
    }
    app_runtime_close(&rt);
    free(ids);
    return status;
}
