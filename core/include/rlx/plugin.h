/* Plugins: shared objects loaded with dlopen, and the ABI between them and librlx.
 *
 * A plugin exports exactly one symbol, rlx_plugin_entry, returning a static descriptor. The
 * descriptor and every function table start with a size field (sizeof as the plugin was
 * built), so members can be appended in a minor version; the loader only reads members the
 * size covers. An incompatible change bumps RLX_ABI_MAJOR, and a plugin built against another
 * major is refused at load time with a message naming the file and both versions.
 *
 * The core hands each plugin an rlx_host table (logging, errors, aligned allocation) so a
 * plugin needs no link-time dependency on librlx. The types a plugin fills in live in
 * rlx/plugin_iface.h (and one header per kind: backend_iface.h, transport_iface.h,
 * speculator_iface.h), which is all a plugin includes; this header adds the loader. */
#ifndef RLX_PLUGIN_H
#define RLX_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/plugin_iface.h"
#include "rlx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

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
/* The version of the librlx that is loaded ("0.1.0"), which may differ from the headers'. */
RLX_API const char *rlx_version(void);
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
 * failed to load, with NULL and the failure message. Stops early when fn returns non-zero, and
 * with RLX_E_NOMEM (the message says so) when memory runs out loading a file. */
RLX_API rlx_status rlx_registry_each(
    rlx_registry *r, int (*fn)(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error), void *ctx);

/* Finds and loads the first plugin of `kind` whose name equals `name` ignoring case. A name
 * containing '/' is loaded as a path. Returns RLX_E_NOT_FOUND with the searched directories in
 * the message when nothing matches; the caller owns *out. */
RLX_API rlx_status rlx_registry_load(rlx_registry *r, rlx_plugin_kind kind, const char *name, rlx_plugin_handle **out);

#ifdef __cplusplus
}
#endif
#endif
