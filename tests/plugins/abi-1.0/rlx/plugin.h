/* Plugins: shared objects loaded with dlopen, and the ABI between them and librlx.
 *
 * A plugin exports exactly one symbol, rlx_plugin_entry, returning a static descriptor. The
 * descriptor and every function table start with a size field (sizeof as the plugin was
 * built), so members can be appended in a minor version; the loader only reads members the
 * size covers. An incompatible change bumps RLX_ABI_MAJOR, and a plugin built against another
 * major is refused at load time with a message naming the file and both versions.
 *
 * The core hands each plugin an rlx_host table (logging, errors, aligned allocation) so a
 * plugin needs no link-time dependency on librlx. */
#ifndef RLX_PLUGIN_H
#define RLX_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RLX_ABI_MAJOR 1
#define RLX_ABI_MINOR 0

#define RLX_PLUGIN_EXPORT __attribute__((visibility("default")))
#define RLX_PLUGIN_ENTRY_SYMBOL "rlx_plugin_entry"

/* True when a table of type T that reports `size` bytes contains member m. */
#define RLX_HAS(T, p, m) ((p)->size >= offsetof(T, m) + sizeof(((T *)0)->m))

typedef enum rlx_plugin_kind {
    RLX_PLUGIN_BACKEND = 1,
    RLX_PLUGIN_TRANSPORT = 2,
    RLX_PLUGIN_SPECULATOR = 3
} rlx_plugin_kind;

enum { RLX_LOG_ERROR = 0, RLX_LOG_WARN = 1, RLX_LOG_INFO = 2, RLX_LOG_DEBUG = 3 };

/* The core's services for plugins. Valid from rlx_plugin_entry until the plugin is unloaded. */
typedef struct rlx_host {
    uint32_t size;      /* sizeof(rlx_host) of the core */
    uint32_t abi_major; /* RLX_ABI_MAJOR of the core */
    uint32_t abi_minor; /* RLX_ABI_MINOR of the core */
    uint32_t reserved;
    /* Logs one line (no trailing newline needed). Thread-safe. */
    void (*log)(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    /* Records the calling thread's error detail and returns status, like rlx_error(). */
    int (*error)(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    /* Aligned allocation (align a power of two >= sizeof(void *)); NULL on failure.
     * Memory from alloc is released with free, by whichever side holds it last; free(NULL) is
     * a no-op. */
    void *(*alloc)(size_t size, size_t align);
    void (*free)(void *p);
} rlx_host;

/* The descriptor a plugin returns. Must stay valid until the plugin is unloaded. */
typedef struct rlx_plugin {
    uint32_t size;       /* sizeof(rlx_plugin) the plugin was built with */
    uint32_t abi_major;  /* RLX_ABI_MAJOR the plugin was built with */
    uint32_t abi_minor;  /* RLX_ABI_MINOR the plugin was built with */
    uint32_t kind;       /* rlx_plugin_kind */
    const char *name;    /* matched case-insensitively, e.g. "cpu-blas" */
    const char *version; /* the plugin's own version, e.g. "0.1.0" */
    const char *summary; /* one line for `rlx plugins` */
    const void *iface;   /* the kind's table: rlx_backend_iface for RLX_PLUGIN_BACKEND */
} rlx_plugin;

/* The entry point every plugin exports. Returns NULL if the plugin cannot run with this host
 * (it may call host->error first to say why). */
typedef const rlx_plugin *(*rlx_plugin_entry_fn)(const rlx_host *host);

/* ---- loader (core side) ---- */

typedef struct rlx_plugin_handle rlx_plugin_handle;

/* Loads the plugin file at path (which must contain a '/'), checks the descriptor and its table
 * and returns a handle the caller owns. Failures (missing file, failing dlopen, no entry
 * symbol, NULL descriptor, ABI major mismatch, a table too short for its required members)
 * return an error whose message starts with the path and names the cause. */
RLX_API rlx_status rlx_plugin_load(const char *path, rlx_plugin_handle **out);
RLX_API void rlx_plugin_unload(rlx_plugin_handle *h); /* NULL is a no-op */
RLX_API const rlx_plugin *rlx_plugin_desc(const rlx_plugin_handle *h);
RLX_API const char *rlx_plugin_path(const rlx_plugin_handle *h);
RLX_API const char *rlx_plugin_kind_name(uint32_t kind); /* "backend", ...; "?" if unknown */
/* The host table librlx gives plugins. */
RLX_API const rlx_host *rlx_host_table(void);

/* Directories searched for plugins, in order: `dir` (from --plugin-dir, may be NULL), each
 * entry of RLX_PLUGIN_PATH (colon-separated), the build tree's plugin folder (only when this
 * librlx is the build tree's), then `rlx/plugins` beside librlx (the installed layout, so an
 * installed tree can be moved). Files named rlx-*.so are candidates. */
typedef struct rlx_registry rlx_registry;

RLX_API rlx_status rlx_registry_create(const char *dir, rlx_registry **out);
RLX_API void rlx_registry_destroy(rlx_registry *r);
RLX_API size_t rlx_registry_n_dirs(const rlx_registry *r);
RLX_API const char *rlx_registry_dir(const rlx_registry *r, size_t i);

/* Calls fn for every candidate file: with the loaded handle (borrowed for the call) or, when it
 * failed to load, with NULL and the failure message. Stops early when fn returns non-zero. */
RLX_API rlx_status rlx_registry_each(rlx_registry *r,
                                     int (*fn)(void *ctx, const char *path, const rlx_plugin_handle *h,
                                               const char *error),
                                     void *ctx);

/* Finds and loads the first plugin of `kind` whose name equals `name` ignoring case. A name
 * containing '/' is loaded as a path. Returns RLX_E_NOT_FOUND with the searched directories in
 * the message when nothing matches; the caller owns *out. */
RLX_API rlx_status rlx_registry_load(rlx_registry *r, rlx_plugin_kind kind, const char *name,
                                     rlx_plugin_handle **out);

#ifdef __cplusplus
}
#endif
#endif
