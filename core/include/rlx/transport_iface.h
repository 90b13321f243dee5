/* Transports move opaque messages (protobuf-encoded rlx.Envelope bytes, see proto/rlx.proto)
 * between a driver and its pipeline stages. A transport plugin returns an rlx_plugin
 * descriptor of kind RLX_PLUGIN_TRANSPORT whose iface is an rlx_transport_iface.
 *
 * Contracts for transport authors:
 * - Addresses are "host:port" (IPv4 dotted quad, a host name, or [IPv6]:port).
 * - A connection carries whole messages in order, both ways. Messages can be large (a prefill's
 *   hidden states, a row of logits per position): at least 1 GiB must be accepted.
 * - Every call that waits takes a timeout in milliseconds (never infinite) and returns
 *   RLX_E_TIMEOUT when it expires; a closed or failed peer is RLX_E_PEER; a malformed frame
 *   is RLX_E_FORMAT. Messages say which address failed and why.
 * - Calls on one connection come from one thread at a time; different connections may be used
 *   from different threads. recv hands over a buffer from host->alloc that the caller frees
 *   with host->free.
 * - A transport plugin includes only this header (which brings rlx/plugin_iface.h and its
 *   option scanner); rlx_iface_split_address below parses the addresses, with nothing to link.
 * - Failures are returned (host->error), never logged as well. A library the transport wraps
 *   logs through host->log at RLX_LOG_DEBUG with a prefix naming it, so an application shows it
 *   only when asked to be verbose; nothing goes to stderr directly.
 * - accept may run on one thread while other threads use connections accepted before; a stage
 *   serves every connection on a thread of its own.
 * - A receive allocates as the bytes arrive, never what a header claims before they do: a peer
 *   that announces a 4 GiB message and sends nothing costs nothing.
 *
 * Every transport takes the option max_message=N[K|M|G], the largest message its recv accepts;
 * a stage passes what its model can legitimately send.
 *
 * TLS (optional; the tcp and grpc transports offer it). Option keys, all paths to PEM files:
 *   tls_ca=FILE    the certificate authority every peer's certificate must chain to
 *   tls_cert=FILE  this process's certificate (may hold the chain after it)
 *   tls_key=FILE   its private key
 *   tls_name=NAME  connect only: the name the server's certificate must carry, instead of the
 *                  host of the address
 * The three files come together or not at all (RLX_E_INVALID at open, naming what is missing;
 * unreadable or mismatched files fail open too). With them, every connection is TLS 1.3 or later
 * and mutually authenticated: a listener's connections must present a certificate chaining to
 * tls_ca, and connect checks that the server's certificate chains to tls_ca and names the host
 * it connects to (a DNS name or IP address in its subjectAltName) or tls_name. An accepted
 * connection finishes its TLS handshake inside its first recv or send, within their timeout,
 * never inside accept, so a silent peer delays no other. A failed handshake is RLX_E_AUTH with
 * the cause: "certificate verify failed: certificate has expired", "the peer presented no
 * certificate", "the peer speaks plaintext (rlx frames without TLS)", "the stage does not speak
 * TLS". */
#ifndef RLX_TRANSPORT_IFACE_H
#define RLX_TRANSPORT_IFACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rlx/plugin_iface.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlx_transport_iface {
    uint32_t size; /* sizeof(rlx_transport_iface) the plugin was built with */
    uint32_t reserved;
    /* Version 1.0 */
    int (*open)(const rlx_host *host, const char *options, void **self); /* required; options may be NULL */
    void (*close)(void *self);                                           /* required */
    /* Binds and listens on address ("0.0.0.0:7101"; port 0 picks a free one, see bound_address).
     * A port another socket holds is RLX_E_IO with a message saying the port is in use. */
    int (*listen)(void *self, const char *address, void **listener); /* required */
    /* Waits up to timeout_ms for a peer; RLX_E_TIMEOUT when none came. */
    int (*accept)(void *self, void *listener, int timeout_ms, void **conn); /* required */
    /* The address the listener is bound to, written to buf (for port 0). */
    int (*bound_address)(void *self, void *listener, char *buf, size_t size); /* required */
    void (*listener_close)(void *self, void *listener);                       /* required */
    /* Connects within timeout_ms, retrying while the peer is not yet listening. When the deadline
     * passes: RLX_E_PEER if the last attempt was refused (the host answered, nothing listens on
     * the port), RLX_E_TIMEOUT if nothing answered or a peer accepted but never completed the
     * transport's own handshake (the message says which, when the transport can tell). A
     * peer that answers but fails authentication (TLS) is RLX_E_AUTH at once, not retried. */
    int (*connect)(void *self, const char *address, int timeout_ms, void **conn);      /* required */
    int (*send)(void *self, void *conn, const void *data, size_t len, int timeout_ms); /* required */
    int (*recv)(void *self, void *conn, void **data, size_t *len, int timeout_ms);     /* required */
    void (*conn_close)(void *self, void *conn);                                        /* required */
    /* Version 1.1 (optional: NULL, or absent from a plugin whose size ends before it) */
    /* Sets the largest message recv accepts on conn from now on (at most the instance's own
     * max_message): a longer one is RLX_E_FORMAT, found from its header before its payload is
     * read where the framing allows. A stage lowers it before a peer has authenticated and
     * raises it to what its model can legitimately send afterwards. */
    int (*set_max_message)(void *self, void *conn, uint64_t max_message);
    /* Version 1.2 (optional, as 1.1) */
    /* Writes the address of conn's peer as "host:port" (an IPv6 host in brackets) to buf. A stage
     * counts the connections of one peer host still in their handshake, so that one host cannot
     * take every place a driver needs. */
    int (*peer_address)(void *self, void *conn, char *buf, size_t size);
} rlx_transport_iface;

/* ---- helpers for transport authors (static inline: nothing to link) ---- */

/* Splits "host:port", "[IPv6]:port" or ":port" into host (without brackets; "" when empty)
 * and port. The host part is not resolved or checked beyond the brackets: a name, a dotted
 * quad and an IPv6 literal all pass. Returns RLX_OK, or RLX_E_INVALID with a message in err
 * (err_size bytes, terminated when err_size > 0; it quotes the address) when address is NULL,
 * has no port, holds an unbracketed ':' in its host, has a port that is not 1 to 5 decimal
 * digits from 0 to 65535, or a host of host_size bytes or more. */
static inline int rlx_iface_split_address(const char *address, char *host, size_t host_size, unsigned *port, char *err,
                                          size_t err_size) {
    if (!address)
        return rlx_iface__message(err, err_size, "address is NULL"), RLX_E_INVALID;
    const char *problem, *colon, *h = address;
    size_t host_len;
    if (address[0] == '[') {
        const char *close = strchr(address, ']');
        problem = " is not [IPv6]:port";
        if (!close || close[1] != ':')
            goto fail;
        h = address + 1;
        host_len = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(address, ':');
        problem = " has no port (want host:port)";
        if (!colon)
            goto fail;
        host_len = (size_t)(colon - address);
        problem = ": write IPv6 addresses as [addr]:port";
        if (memchr(address, ':', host_len))
            goto fail;
    }
    const char *p = colon + 1;
    unsigned long v = 0;
    size_t n_digits = 0;
    for (; p[n_digits] >= '0' && p[n_digits] <= '9' && n_digits <= 5; n_digits++)
        v = v * 10 + (unsigned long)(p[n_digits] - '0');
    problem = ": port must be a number from 0 to 65535";
    if (n_digits == 0 || n_digits > 5 || p[n_digits] || v > 65535)
        goto fail;
    problem = ": host name too long";
    if (host_len >= host_size)
        goto fail;
    memcpy(host, h, host_len);
    host[host_len] = '\0';
    *port = (unsigned)v;
    return RLX_OK;
fail:
    return rlx_iface__message(err, err_size, "address '%s'%s", address, problem), RLX_E_INVALID;
}

#ifdef __cplusplus
}
#endif
#endif
