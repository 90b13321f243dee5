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

int cmd_plugins(int argc, char **argv, app_options *o) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            printf("usage: rlx plugins [-v] [--plugin-dir DIR]\n\n"
                   "Lists name, kind, version and file of every plugin in the search folders:\n"
                   "--plugin-dir, then RLX_PLUGIN_PATH (colon-separated), the build tree, the install prefix.\n"
                   "With -v, each backend is opened with its default options and says what it runs on\n"
                   "(kernels, library cores, threads).\n");
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc <= 0)
            return rc < 0 ? 1 : app_fail("plugins: unknown option '%s'", argv[i]);
    }
    rlx_registry *r;
    if (rlx_registry_create(o->plugin_dir, &r) != RLX_OK)
        return app_fail_rlx("plugins");
    printf("%-12s %-11s %-8s %s\n", "NAME", "KIND", "VERSION", "FILE");
    printf("%-12s %-11s %-8s %s\n", "ref", "backend", "builtin", "(reference kernels in librlx)");
    if (o->verbose) {
        rlx_backend *b = NULL;
        rlx_status rc = rlx_backend_create_ref(&b);
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
