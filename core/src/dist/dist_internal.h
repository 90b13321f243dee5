/* Helpers shared by the sources of core/src/dist: link credentials, and a transport instance that
 * moves rlx.Envelope messages (encoded with protobuf-c) with bounded waits. */
#ifndef RLX_DIST_INTERNAL_H
#define RLX_DIST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "rlx.pb-c.h"
#include "rlx/dist.h"
#include "rlx/transport.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rlx puts host-order numbers on the wire, which the protocol defines as little-endian"
#endif

// ---- credentials (security.c) ----

#define RLX__AUTH_NONCE_BYTES 32
#define RLX__AUTH_PROOF_BYTES 32 /* HMAC-SHA256 */
#define RLX__AUTH_STAGE_LABEL "rlx stage proof v1"
#define RLX__AUTH_DRIVER_LABEL "rlx driver proof v1"

/* One side's credentials, ready for the link. */
typedef struct rlx__auth {
    uint8_t *token; /* the shared token, NULL when none */
    size_t token_len;
    int tls;       /* the transport runs mutual TLS */
    char *options; /* the transport's options: the caller's with the TLS files and max_message added */
} rlx__auth;

/* Checks the security options, reads the token file and builds the transport options from
 * transport_options (may be NULL), the TLS files (and tls_name for a driver) and max_message
 * (0: none; the caller's own max_message wins). */
rlx_status rlx__auth_init(rlx__auth *a, const rlx_dist_security *s, const char *transport_options, uint64_t max_message,
                          int driver);
void rlx__auth_free(rlx__auth *a); /* wipes the token */
rlx_status rlx__auth_nonce(uint8_t out[RLX__AUTH_NONCE_BYTES]);
/* HMAC-SHA256(token, label || driver_nonce || stage_nonce); both nonces RLX__AUTH_NONCE_BYTES. */
void rlx__auth_proof(const rlx__auth *a, const char *label, const uint8_t *driver_nonce, const uint8_t *stage_nonce,
                     uint8_t out[RLX__AUTH_PROOF_BYTES]);
/* Whether proof is that proof (compared in constant time). */
int rlx__auth_proof_ok(const rlx__auth *a, const char *label, const uint8_t *driver_nonce, const uint8_t *stage_nonce,
                       const uint8_t *proof, size_t proof_len);
/* A host:port on 127.0.0.0/8, ::1 or localhost. */
int rlx__address_is_loopback(const char *address);

// ---- transport instances and messages ----

typedef struct rlx__net {
    const rlx_transport_iface *t;
    void *self;
    const char *name; /* the plugin's name */
} rlx__net;

/* Opens an instance of a loaded transport plugin. */
rlx_status rlx__net_open(const rlx_plugin_handle *plugin, const char *options, rlx__net *out);
void rlx__net_close(rlx__net *n);

/* Packs and sends e; *bytes (may be NULL) receives the encoded size. */
rlx_status rlx__net_send(rlx__net *n, void *conn, const Rlx__Envelope *e, int timeout_ms, size_t *bytes);

/* Receives one message and decodes it. *out is the caller's (rlx__envelope_free). A message
 * that is not an Envelope is RLX_E_FORMAT. *bytes (may be NULL) receives the encoded size. */
rlx_status rlx__net_recv(rlx__net *n, void *conn, Rlx__Envelope **out, int timeout_ms, size_t *bytes);

void rlx__envelope_free(Rlx__Envelope *e);

/* Sends an Error envelope (best effort; the result is ignored by callers that are giving up). */
rlx_status rlx__net_send_error(rlx__net *n, void *conn, uint64_t session, int code, const char *message,
                               int timeout_ms);

/* "Hello", "Activations", ...: the name of an envelope's body for messages. */
const char *rlx__envelope_kind(const Rlx__Envelope *e);

/* "F32", "I32", ... for a DType on the wire. */
const char *rlx__dtype_name(int dtype);

// ---- the driver (driver.c) ----

/* Whether d's model has linear-attention layers: a slot's recurrent state then sums up all its
 * positions and cannot be cut back, so the batched engine over d reuses a slot only where it ends
 * and copies no busy slot's prefix, as over its own slots. */
int rlx__driver_recurrent(const rlx_driver *d);

#endif
