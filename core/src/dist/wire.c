/* Transport instances and rlx.Envelope messages over them: protobuf-c packing on the way out,
 * unpacking (which validates the encoding) on the way in. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "util/alloc.h"

rlx_status rlx__net_open(const rlx_plugin_handle *plugin, const char *options, rlx__net *out) {
    memset(out, 0, sizeof *out);
    if (!plugin)
        return rlx_error(RLX_E_INVALID, "no transport plugin given");
    const rlx_plugin *d = rlx_plugin_desc(plugin);
    if (d->kind != RLX_PLUGIN_TRANSPORT)
        return rlx_error(RLX_E_INVALID, "%s: plugin '%s' is a %s, not a transport", rlx_plugin_path(plugin), d->name,
                         rlx_plugin_kind_name(d->kind));
    out->t = d->iface;
    out->name = d->name;
    rlx_error_clear();
    int rc = out->t->open(rlx_host_table(), options, &out->self);
    if (rc < 0) {
        const char *why = rlx_last_error();
        rc = rlx_error(rc, "transport %s: cannot open%s%s", d->name, *why ? ": " : "", why);
        memset(out, 0, sizeof *out);
        return rc;
    }
    return RLX_OK;
}

void rlx__net_close(rlx__net *n) {
    if (n && n->t && n->self)
        n->t->close(n->self);
    if (n)
        memset(n, 0, sizeof *n);
}

rlx_status rlx__net_send(rlx__net *n, void *conn, const Rlx__Envelope *e, int timeout_ms, size_t *bytes) {
    size_t len = rlx__envelope__get_packed_size(e);
    uint8_t *buf = rlx__malloc(len ? len : 1);
    if (!buf)
        return rlx_error(RLX_E_NOMEM, "out of memory for a %zu-byte message", len);
    rlx__envelope__pack(e, buf);
    rlx_error_clear();
    int rc = n->t->send(n->self, conn, buf, len, timeout_ms);
    free(buf);
    if (rc < 0 && !*rlx_last_error())
        rc = rlx_error(rc, "send failed");
    if (bytes)
        *bytes = len;
    return rc < 0 ? (rlx_status)rc : RLX_OK;
}

rlx_status rlx__net_recv(rlx__net *n, void *conn, Rlx__Envelope **out, int timeout_ms, size_t *bytes) {
    *out = NULL;
    void *data = NULL;
    size_t len = 0;
    rlx_error_clear();
    int rc = n->t->recv(n->self, conn, &data, &len, timeout_ms);
    if (rc < 0) {
        if (!*rlx_last_error())
            rlx_error(rc, "receive failed");
        return (rlx_status)rc;
    }
    if (bytes)
        *bytes = len;
    Rlx__Envelope *e = len ? rlx__envelope__unpack(NULL, len, data) : NULL;
    rlx_host_table()->free(data);
    if (!e || e->body_case == RLX__ENVELOPE__BODY__NOT_SET) {
        if (e)
            rlx__envelope__free_unpacked(e, NULL);
        return rlx_error(RLX_E_FORMAT, "received %zu bytes that are not an rlx message (protobuf rlx.Envelope)", len);
    }
    *out = e;
    return RLX_OK;
}

void rlx__envelope_free(Rlx__Envelope *e) {
    if (e)
        rlx__envelope__free_unpacked(e, NULL);
}

rlx_status rlx__net_send_error(rlx__net *n, void *conn, uint64_t session, int code, const char *message,
                               int timeout_ms) {
    Rlx__Error err = RLX__ERROR__INIT;
    err.session_id = session;
    err.code = code;
    err.message = (char *)message;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_ERROR;
    e.error = &err;
    return rlx__net_send(n, conn, &e, timeout_ms, NULL);
}

const char *rlx__envelope_kind(const Rlx__Envelope *e) {
    switch (e->body_case) {
    case RLX__ENVELOPE__BODY_HELLO:
        return "Hello";
    case RLX__ENVELOPE__BODY_HELLO_REPLY:
        return "HelloReply";
    case RLX__ENVELOPE__BODY_ACTIVATIONS:
        return "Activations";
    case RLX__ENVELOPE__BODY_TRUNCATE:
        return "Truncate";
    case RLX__ENVELOPE__BODY_END_SESSION:
        return "EndSession";
    case RLX__ENVELOPE__BODY_ACK:
        return "Ack";
    case RLX__ENVELOPE__BODY_ERROR:
        return "Error";
    case RLX__ENVELOPE__BODY_ROWS:
        return "Rows";
    case RLX__ENVELOPE__BODY_COPY_SLOT:
        return "CopySlot";
    case RLX__ENVELOPE__BODY_AUTH_CHALLENGE:
        return "AuthChallenge";
    case RLX__ENVELOPE__BODY_AUTH_PROOF:
        return "AuthProof";
    case RLX__ENVELOPE__BODY_PING:
        return "Ping";
    default:
        return "an unknown message";
    }
}

const char *rlx__dtype_name(int dtype) {
    switch (dtype) {
    case RLX__DTYPE__DTYPE_F32:
        return "F32";
    case RLX__DTYPE__DTYPE_BF16:
        return "BF16";
    case RLX__DTYPE__DTYPE_F16:
        return "F16";
    case RLX__DTYPE__DTYPE_I32:
        return "I32";
    default:
        return "unknown-dtype";
    }
}
