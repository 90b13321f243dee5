/* Plugin loading: dlopen, the entry symbol, descriptor and ABI checks, and the registry that
 * searches plugin folders. Every failure is one message that starts with the file's path. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "rlx/backend.h"
#include "rlx/plugin.h"
#include "rlx/transport.h"
#include "spec/spec_internal.h"
#include "util/log.h"
#include "util/alloc.h"

struct rlx_plugin_handle {
    void *dl;
    const rlx_plugin *desc;
    char *path;
};

static void host_log(int level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rlx__log_v(level, fmt, ap);
    va_end(ap);
}

static int host_error(int status, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return rlx_error(status, "%s", buf);
}

static void *host_alloc(size_t size, size_t align) {
    void *p = NULL;
    if (align < sizeof(void *))
        align = sizeof(void *);
    size = (size + align - 1) / align * align; /* aligned_alloc wants a multiple of align */
    return posix_memalign(&p, align, size ? size : align) == 0 ? p : NULL;
}

static const rlx_host host = {
    .size = sizeof(rlx_host),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .log = host_log,
    .error = host_error,
    .alloc = host_alloc,
    .free = free,
};

const rlx_host *rlx_host_table(void) { return &host; }

const char *rlx_plugin_kind_name(uint32_t kind) {
    switch (kind) {
    case RLX_PLUGIN_BACKEND:
        return "backend";
    case RLX_PLUGIN_TRANSPORT:
        return "transport";
    case RLX_PLUGIN_SPECULATOR:
        return "speculator";
    default:
        return "?";
    }
}

/* Checks the kind's function table: long enough for, and filling, its required members. */
static rlx_status check_iface(const char *path, const rlx_plugin *d) {
    if (!d->iface)
        return rlx_error(RLX_E_ABI, "%s: plugin '%s' has no function table", path, d->name);
    if (d->kind == RLX_PLUGIN_BACKEND) {
        const rlx_backend_iface *b = d->iface;
        if (!RLX_HAS(rlx_backend_iface, b, compute))
            return rlx_error(RLX_E_ABI, "%s: backend table is %u bytes, too short for ABI %d (needs %zu)", path,
                             b->size, RLX_ABI_MAJOR, offsetof(rlx_backend_iface, compute) + sizeof b->compute);
        if (!b->open || !b->close || !b->supports || !b->compute)
            return rlx_error(RLX_E_ABI, "%s: backend table lacks a required function (open, close, supports, compute)",
                             path);
        if (d->abi_minor < 2)
            return RLX_OK;
#define HAS_12(m) (RLX_HAS(rlx_backend_iface, b, m) && b->m)
        if (HAS_12(prepare_weight) != HAS_12(release_weight))
            return rlx_error(RLX_E_ABI, "%s: backend table has %s without %s (they come together)", path,
                             HAS_12(prepare_weight) ? "prepare_weight" : "release_weight",
                             HAS_12(prepare_weight) ? "release_weight" : "prepare_weight");
        if (HAS_12(plan_span) != HAS_12(compute_span) || HAS_12(plan_span) != HAS_12(release_span))
            return rlx_error(RLX_E_ABI,
                             "%s: backend table has only some of plan_span, compute_span and release_span "
                             "(they come together)",
                             path);
#undef HAS_12
        return RLX_OK;
    }
    if (d->kind == RLX_PLUGIN_TRANSPORT) {
        const rlx_transport_iface *t = d->iface;
        if (!RLX_HAS(rlx_transport_iface, t, conn_close))
            return rlx_error(RLX_E_ABI, "%s: transport table is %u bytes, too short for ABI %d (needs %zu)", path,
                             t->size, RLX_ABI_MAJOR, offsetof(rlx_transport_iface, conn_close) + sizeof t->conn_close);
        if (!t->open || !t->close || !t->listen || !t->accept || !t->bound_address || !t->listener_close ||
            !t->connect || !t->send || !t->recv || !t->conn_close)
            return rlx_error(RLX_E_ABI, "%s: transport table lacks a required function", path);
        return RLX_OK;
    }
    if (d->kind == RLX_PLUGIN_SPECULATOR)
        return rlx__speculator_check_iface(path, d->iface);
    return rlx_error(RLX_E_UNSUPPORTED, "%s: plugin kind %s (%u) is not supported by this rlx", path,
                     rlx_plugin_kind_name(d->kind), d->kind);
}

rlx_status rlx_plugin_load(const char *path, rlx_plugin_handle **out) {
    if (!path || !out)
        return rlx_error(RLX_E_INVALID, "rlx_plugin_load: NULL argument");
    *out = NULL;
    if (!strchr(path, '/'))
        return rlx_error(RLX_E_INVALID, "%s: plugin path must contain a '/' (use ./%s)", path, path);
    struct stat st;
    if (stat(path, &st) != 0)
        return rlx_error(RLX_E_NOT_FOUND, "%s: cannot open plugin: %s", path, strerror(errno));
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        return rlx_error(RLX_E_PLUGIN, "%s: dlopen failed: %s", path, dlerror());
    rlx_status rc;
    rlx_plugin_entry_fn entry;
    dlerror();
    *(void **)(&entry) = dlsym(dl, RLX_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        rc = rlx_error(RLX_E_PLUGIN, "%s: not an rlx plugin: no entry symbol %s", path, RLX_PLUGIN_ENTRY_SYMBOL);
        goto fail;
    }
    rlx_error_clear();
    const rlx_plugin *d = entry(&host);
    if (!d) {
        rc = rlx_error(RLX_E_PLUGIN, "%s: plugin refused to initialise%s%s", path, *rlx_last_error() ? ": " : "",
                       rlx_last_error());
        goto fail;
    }
    if (d->size < 2 * sizeof(uint32_t) || d->abi_major != RLX_ABI_MAJOR) {
        rc = rlx_error(RLX_E_ABI, "%s: plugin built for ABI major %u, this rlx has ABI major %d", path,
                       d->size >= 2 * sizeof(uint32_t) ? d->abi_major : 0, RLX_ABI_MAJOR);
        goto fail;
    }
    if (!RLX_HAS(rlx_plugin, d, iface)) {
        rc = rlx_error(RLX_E_ABI, "%s: plugin descriptor is %u bytes, ABI %d needs %zu", path, d->size, RLX_ABI_MAJOR,
                       sizeof(rlx_plugin));
        goto fail;
    }
    if (!d->name || !*d->name || !d->version) {
        rc = rlx_error(RLX_E_ABI, "%s: plugin descriptor has no name or version", path);
        goto fail;
    }
    if ((rc = check_iface(path, d)) < 0)
        goto fail;
    rlx_plugin_handle *h = rlx__calloc(1, sizeof *h);
    if (!h || !(h->path = rlx__strdup(path))) {
        free(h);
        rc = rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    h->dl = dl;
    h->desc = d;
    *out = h;
    return RLX_OK;
fail:
    dlclose(dl);
    return rc;
}

void rlx_plugin_unload(rlx_plugin_handle *h) {
    if (!h)
        return;
    dlclose(h->dl);
    free(h->path);
    free(h);
}

const rlx_plugin *rlx_plugin_desc(const rlx_plugin_handle *h) { return h->desc; }
const char *rlx_plugin_path(const rlx_plugin_handle *h) { return h->path; }

const char *rlx_version(void) { return RLX_VERSION; }

// ---- registry ----

struct rlx_registry {
    char **dirs;
    size_t n_dirs;
};

static rlx_status add_dir(rlx_registry *r, const char *dir, size_t len) {
    if (len == 0)
        return RLX_OK;
    for (size_t i = 0; i < r->n_dirs; i++)
        if (strlen(r->dirs[i]) == len && strncmp(r->dirs[i], dir, len) == 0)
            return RLX_OK;
    char **dirs = rlx__realloc(r->dirs, (r->n_dirs + 1) * sizeof *dirs);
    if (!dirs)
        return rlx_error(RLX_E_NOMEM, "plugin registry: out of memory");
    r->dirs = dirs;
    if (!(r->dirs[r->n_dirs] = rlx__strndup(dir, len)))
        return rlx_error(RLX_E_NOMEM, "plugin registry: out of memory");
    r->n_dirs++;
    return RLX_OK;
}

rlx_status rlx_registry_create(const char *dir, rlx_registry **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_registry_create: out is NULL");
    rlx_registry *r = rlx__calloc(1, sizeof *r);
    if (!r)
        return rlx_error(RLX_E_NOMEM, "plugin registry: out of memory");
    rlx_status rc = dir ? add_dir(r, dir, strlen(dir)) : RLX_OK;
    const char *env = getenv("RLX_PLUGIN_PATH");
    while (rc == RLX_OK && env && *env) {
        const char *colon = strchr(env, ':');
        size_t len = colon ? (size_t)(colon - env) : strlen(env);
        rc = add_dir(r, env, len);
        env = colon ? colon + 1 : NULL;
    }
    /* Where librlx itself lives decides the rest, so an installed tree can be moved: the
     * build tree's plugin folder only for the build tree's library, and <libdir>/rlx/plugins. */
    Dl_info self;
    char lib_dir[4096] = "";
    if (dladdr((void *)rlx_registry_create, &self) && self.dli_fname && strrchr(self.dli_fname, '/')) {
        snprintf(lib_dir, sizeof lib_dir, "%.*s", (int)(strrchr(self.dli_fname, '/') - self.dli_fname), self.dli_fname);
        char *real = realpath(lib_dir, NULL);
        if (real) {
            snprintf(lib_dir, sizeof lib_dir, "%s", real);
            free(real);
        }
    }
    if (rc == RLX_OK && strcmp(lib_dir, RLX_BUILD_LIB_DIR) == 0)
        rc = add_dir(r, RLX_BUILD_PLUGIN_DIR, strlen(RLX_BUILD_PLUGIN_DIR));
    if (rc == RLX_OK && lib_dir[0]) {
        char installed[4200];
        snprintf(installed, sizeof installed, "%s/rlx/plugins", lib_dir);
        rc = add_dir(r, installed, strlen(installed));
    }
    if (rc != RLX_OK) {
        rlx_registry_destroy(r);
        return rc;
    }
    *out = r;
    return RLX_OK;
}

void rlx_registry_destroy(rlx_registry *r) {
    if (!r)
        return;
    for (size_t i = 0; i < r->n_dirs; i++)
        free(r->dirs[i]);
    free(r->dirs);
    free(r);
}

size_t rlx_registry_n_dirs(const rlx_registry *r) { return r->n_dirs; }
const char *rlx_registry_dir(const rlx_registry *r, size_t i) { return i < r->n_dirs ? r->dirs[i] : NULL; }

static int is_candidate(const char *name) {
    size_t len = strlen(name);
    return strncmp(name, "rlx-", 4) == 0 && len > 7 && strcmp(name + len - 3, ".so") == 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

rlx_status rlx_registry_each(rlx_registry *r,
                             int (*fn)(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error),
                             void *ctx) {
    int stop = 0;
    rlx_status rc = RLX_OK;
    for (size_t i = 0; i < r->n_dirs && !stop; i++) {
        struct dirent **entries;
        int n = scandir(r->dirs[i], &entries, NULL, by_name);
        if (n < 0)
            continue; /* a search folder that does not exist is normal (e.g. not installed) */
        for (int k = 0; k < n; k++) {
            if (!stop && is_candidate(entries[k]->d_name)) {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", r->dirs[i], entries[k]->d_name);
                rlx_plugin_handle *h = NULL;
                rlx_status lrc = rlx_plugin_load(path, &h);
                if (lrc == RLX_OK) {
                    stop = fn(ctx, path, h, NULL);
                    rlx_plugin_unload(h);
                } else if (lrc == RLX_E_NOMEM) {
                    /* not a broken file: the files after it cannot be judged either */
                    rc = lrc;
                    stop = 1;
                } else {
                    stop = fn(ctx, path, NULL, rlx_last_error());
                }
            }
            free(entries[k]);
        }
        free(entries);
    }
    return rc;
}

typedef struct find_ctx {
    uint32_t kind;
    const char *name;
    char path[4096];
} find_ctx;

static int match(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error) {
    find_ctx *f = ctx;
    if (h && rlx_plugin_desc(h)->kind == f->kind && strcasecmp(rlx_plugin_desc(h)->name, f->name) == 0) {
        snprintf(f->path, sizeof f->path, "%s", path);
        return 1;
    }
    return 0;
}

rlx_status rlx_registry_load(rlx_registry *r, rlx_plugin_kind kind, const char *name, rlx_plugin_handle **out) {
    if (!r || !name || !out)
        return rlx_error(RLX_E_INVALID, "rlx_registry_load: NULL argument");
    *out = NULL;
    if (strchr(name, '/')) {
        rlx_status rc = rlx_plugin_load(name, out);
        if (rc == RLX_OK && rlx_plugin_desc(*out)->kind != (uint32_t)kind) {
            rlx_status bad =
                rlx_error(RLX_E_INVALID, "%s: plugin '%s' is a %s, not a %s", name, rlx_plugin_desc(*out)->name,
                          rlx_plugin_kind_name(rlx_plugin_desc(*out)->kind), rlx_plugin_kind_name(kind));
            rlx_plugin_unload(*out);
            *out = NULL;
            return bad;
        }
        return rc;
    }
    find_ctx f = {.kind = (uint32_t)kind, .name = name};
    rlx_status rc = rlx_registry_each(r, match, &f);
    if (rc != RLX_OK)
        return rc;
    if (!f.path[0]) {
        char dirs[2048] = "";
        size_t len = 0;
        for (size_t i = 0; i < r->n_dirs && len < sizeof dirs; i++)
            len += (size_t)snprintf(dirs + len, sizeof dirs - len, "%s%s", i ? ", " : "", r->dirs[i]);
        return rlx_error(RLX_E_NOT_FOUND, "no %s plugin named '%s' (searched %s; `rlx plugins` lists what exists)",
                         rlx_plugin_kind_name(kind), name, dirs);
    }
    return rlx_plugin_load(f.path, out);
}
