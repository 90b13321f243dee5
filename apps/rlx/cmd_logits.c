/* rlx logits: the logits of a prompt as raw little-endian float32, for comparison with other
 * implementations. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char help[] = "usage: rlx logits --model DIR --tokens 1,5,3 [--all] --out FILE [options]\n\n"
                           "Writes the last position's vocab logits (or with --all every position's, row after\n"
                           "row) as raw little-endian float32 to FILE.\n\noptions:\n";

int cmd_logits(int argc, char **argv, app_options *o) {
    const char *tokens = NULL, *out_path = NULL;
    int all = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            printf("%s%s", help, app_common_help);
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc < 0)
            return 1;
        if (rc)
            continue;
        if (strcmp(argv[i], "--tokens") == 0) {
            if (!(tokens = app_value(argc, argv, &i)))
                return 1;
        } else if (strcmp(argv[i], "--out") == 0) {
            if (!(out_path = app_value(argc, argv, &i)))
                return 1;
        } else if (strcmp(argv[i], "--all") == 0) {
            all = 1;
        } else {
            return app_fail("logits: unknown option '%s' (see rlx logits --help)", argv[i]);
        }
    }
    if (!tokens || !out_path)
        return app_fail("logits: --tokens and --out are required (see rlx logits --help)");
    int32_t *ids;
    int n = app_parse_tokens("--tokens", tokens, &ids);
    if (n < 0)
        return 1;
    app_runtime rt;
    if (app_runtime_open(&rt, o)) {
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
