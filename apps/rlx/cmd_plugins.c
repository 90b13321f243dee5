/* rlx plugins: every plugin file found in the search folders, or why it failed to load; with -v
 * also what each backend runs on, from an instance opened with default options. */
#include <stdio.h>
#include <string.h>

#include "common.h"

typedef struct listing {
    int n;
    int verbose;
} listing;

/* The describe line of a backend instance, or why none opened (not fatal: the listing goes on). */
static void print_describe(rlx_status rc, rlx_backend *b) {
    if (rc == RLX_OK)
        printf("%-12s %s\n", "", *rlx_backend_describe(b) ? rlx_backend_describe(b) : "(does not describe itself)");
    else
        printf("%-12s cannot open with default options: %s\n", "", rlx_last_error());
    rlx_backend_destroy(b);
}

static int print_plugin(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error) {
    listing *l = ctx;
    if (h) {
        const rlx_plugin *d = rlx_plugin_desc(h);
        printf("%-12s %-11s %-8s %s\n", d->name, rlx_plugin_kind_name(d->kind), d->version, path);
        if (l->verbose && d->kind == RLX_PLUGIN_BACKEND) {
            rlx_backend_options bo = rlx_backend_options_default();
            rlx_backend *b = NULL;
            rlx_status rc = rlx_backend_create(h, &bo, &b);
            print_describe(rc, b);
        }
    } else {
        printf("%-12s %-11s %-8s %s\n", "(broken)", "-", "-", error);
    }
    l->n++;
    return 0;
}

static const char usage[] =
    "usage: rlx plugins [-v] [--plugin-dir DIR]\n\n"
    "Lists name, kind, version and file of every plugin in the search folders:\n"
    "--plugin-dir, then RLX_PLUGIN_PATH (colon-separated), the build tree, the install prefix.\n"
    "With -v, each backend is opened with its default options and says what it runs on\n"
    "(kernels, library cores, threads).\n\n";

int cmd_plugins(int argc, char **argv, app_options *o) {
    const app_opt own[] = {
        {0, "plugin-dir", NULL, "DIR", "search DIR for plugins first", APP_OPT_STRING, &o->plugin_dir},
        {'v', "verbose", NULL, NULL, "open each backend and print what it runs on", APP_OPT_FLAG, &o->verbose},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("plugins:", own)};
    int exit_status;
    if (app_parse_command("plugins", usage, groups, 1, argc, argv, &exit_status))
        return exit_status;
    rlx_registry *r;
    if (rlx_registry_create(o->plugin_dir, &r) != RLX_OK)
        return app_fail_rlx("plugins");
    printf("%-12s %-11s %-8s %s\n", "NAME", "KIND", "VERSION", "FILE");
    printf("%-12s %-11s %-8s %s\n", "ref", "backend", "builtin", "(reference kernels in librlx)");
    if (o->verbose) {
        rlx_backend *b = NULL;
        rlx_status rc = rlx_backend_create_ref(NULL, &b);
        print_describe(rc, b);
    }
    listing l = {.n = 0, .verbose = o->verbose};
    rlx_registry_each(r, print_plugin, &l);
    if (l.n == 0) {
        fprintf(stderr, "rlx: no plugin files found; searched:");
        for (size_t i = 0; i < rlx_registry_n_dirs(r); i++)
            fprintf(stderr, " %s", rlx_registry_dir(r, i));
        fputc('\n', stderr);
    }
    rlx_registry_destroy(r);
    return fflush(stdout) == 0 ? 0 : app_fail("plugins: cannot write to stdout");
}
