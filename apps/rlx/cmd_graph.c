/* rlx graph: the planned graph of a model, each node with the backend that runs it. */
#include <stdio.h>
#include <string.h>

#include "common.h"

static const char help[] = "usage: rlx graph --model DIR [-t TOKENS] [options]\n\n"
                           "Prints the graph for a run of TOKENS positions (default 1) with the backend of\n"
                           "each node and the activation arena size.\n\noptions:\n";

int cmd_graph(int argc, char **argv, app_options *o) {
    uint32_t tokens = 1;
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
        if (strcmp(argv[i], "-t") == 0) {
            const char *v = app_value(argc, argv, &i);
            if (!v || app_parse_u32("-t", v, &tokens) < 0)
                return 1;
        } else {
            return app_fail("graph: unknown option '%s' (see rlx graph --help)", argv[i]);
        }
    }
    app_runtime rt;
    if (app_runtime_open(&rt, o))
        return 1;
    if (!rt.session) {
        app_runtime_close(&rt);
        return app_fail("graph: prints the plan of a model run in this process, not of a pipeline");
    }
    int status = rlx_session_dump_plan(rt.session, tokens, stdout) == RLX_OK ? 0 : app_fail_rlx("graph");
    app_runtime_close(&rt);
    return status;
}
