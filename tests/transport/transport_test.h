/* What the transport tests share: a transport plugin loaded from the build tree and one instance
 * of it opened. Define PLUGIN_PATH (the plugin's file) before including this. */
#ifndef RLX_TRANSPORT_TEST_H
#define RLX_TRANSPORT_TEST_H

#include <string.h>
#include <time.h>

#include "rlx/transport.h"

#define LONG_MS 20000 /* waits that must succeed: generous for ASan on a busy machine */

typedef struct tr {
    rlx_plugin_handle *h;
    const rlx_transport_iface *it;
    void *self;
} tr;

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Loads PLUGIN_PATH and opens an instance with options; on failure nothing stays loaded. */
static inline int load(tr *t, const char *options) {
    memset(t, 0, sizeof *t);
    int rc = rlx_plugin_load(PLUGIN_PATH, &t->h);
    if (rc < 0)
        return rc;
    t->it = rlx_plugin_desc(t->h)->iface;
    rc = t->it->open(rlx_host_table(), options, &t->self);
    if (rc < 0) {
        rlx_plugin_unload(t->h);
        t->h = NULL;
    }
    return rc;
}

static inline void unload(tr *t) {
    if (t->self)
        t->it->close(t->self);
    rlx_plugin_unload(t->h);
    memset(t, 0, sizeof *t);
}

#endif
