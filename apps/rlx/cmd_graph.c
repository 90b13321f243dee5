/* rlx graph: the planned graph of a model, each node with the backend that runs it. */
#include <stdio.h>
#include <string.h>

#include "common.h"

static const char usage[] = "usage: rlx graph [-m PATH] [--positions N] [options]\n\n"
                            "Prints the graph for a run of N positions (default 1) with the backend of\n"
                            "each node, its precision and the activation arena size.\n\n";

int cmd_graph(int argc, char **argv, app_options *o) {
    uint32_t positions = 1;
    const app_opt own[] = {
        {0, "positions", NULL, "N", "positions the planned run computes (default 1)", APP_OPT_U32, &positions,
         .min = 1},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("graph:", own), app_common_group(o)};
    int exit_status;
    if (app_parse_command("graph", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status;
    app_runtime rt;
    if (app_runtime_open(&rt, o, NULL))
        return 1;
    if (!rt.session) {
        app_runtime_close(&rt);
        return app_fail("graph: prints the plan of a model run in this process, not of a pipeline");
    }
    int status = rlx_session_dump_plan(rt.session, positions, stdout) == RLX_OK ? 0 : app_fail_rlx("graph");
    app_runtime_close(&rt);
    return status;
}
