/* transport-grpc's connect: a channel of its own, READY before the stream starts (so a missing
 * server fails within the timeout, with a reason from grpc_diagnose.c), then the streaming call
 * with RECV_INITIAL_METADATA in its first batch (without it RECV_MESSAGE never completes). A
 * connection refused until the deadline is RLX_E_PEER; a channel still CONNECTING then is
 * RLX_E_TIMEOUT; a certain TLS cause fails at once as RLX_E_AUTH. */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <grpc/slice.h>

#include "grpc_internal.h"

int grpct_connect(void *self, const char *address, int timeout_ms, void **conn) {
    grpct *t = self;
    if (!t || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    char host[GRPCT_ADDR_MAX];
    unsigned port;
    int rc = grpct_split_address(t, address, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    if (!host[0] || !strcmp(host, "*") || port == 0)
        return t->host->error(RLX_E_INVALID, "grpc: cannot connect to '%s': need a host and a non-zero port", address);
    grpct_conn *c = grpct_conn_new(t, false);
    if (!c)
        return t->host->error(RLX_E_NOMEM, "grpc: out of memory");
    snprintf(c->peer, sizeof c->peer, "%s", address);
    grpc_arg args[16];
    grpc_channel_args ch_args = {.num_args = grpct_common_args(t, args, false), .args = args};
    if (t->tls_name[0]) {
        args[ch_args.num_args].type = GRPC_ARG_STRING;
        args[ch_args.num_args].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[ch_args.num_args++].value.string = t->tls_name;
    }
    /* gRPC checks the server's certificate against the host of address (a DNS or IP SAN), or
     * against tls_name. */
    grpc_channel_credentials *creds = t->tls_channel ? t->tls_channel : grpc_insecure_credentials_create();
    c->channel = grpc_channel_create(address, creds, &ch_args);
    if (!t->tls_channel)
        grpc_channel_credentials_release(creds);
    if (!c->channel) {
        grpct_conn_destroy(c);
        return t->host->error(RLX_E_INTERNAL, "grpc: cannot create a channel to %s", address);
    }
    /* Wait for READY: the connection is up and the server answered the HTTP/2 handshake. */
    const gpr_timespec deadline = grpct_deadline(timeout_ms);
    const gpr_timespec limit = gpr_time_add(deadline, gpr_time_from_millis(2000, GPR_TIMESPAN));
    char why[320] = "no HTTP/2 answer (nothing listening there yet, or not an rlx grpc server)";
    char tls_why[512];
    const char *tls_cause = NULL;
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(c->channel, 1);
    bool probed = false;
    while (st != GRPC_CHANNEL_READY && st != GRPC_CHANNEL_SHUTDOWN) {
        if (st == GRPC_CHANNEL_TRANSIENT_FAILURE && !probed) {
            grpct_probe(c, deadline, why, sizeof why);
            /* Something listens and the handshake failed: when TLS is why, every retry until the
             * deadline would fail alike. A refused connection (a stage still loading its
             * weights) is retried. */
            if (!strstr(why, strerror(ECONNREFUSED)) &&
                (tls_cause = grpct_tls_cause(t, why, host, port, tls_why, sizeof tls_why)))
                break;
        }
        probed = st == GRPC_CHANNEL_TRANSIENT_FAILURE;
        if (grpct_passed(deadline))
            break;
        grpct_op *w = &c->ops[GRPCT_OP_WATCH];
        grpc_channel_watch_connectivity_state(c->channel, st, deadline, c->cq, w);
        w->pending = true;
        c->n_pending++;
        while (w->pending && grpct_pump(c, limit))
            ;
        if (w->pending || !w->success)
            break; /* the deadline passed; conn_destroy ends a watch still pending */
        st = grpc_channel_check_connectivity_state(c->channel, 1);
    }
    if (tls_cause) {
        rc = t->host->error(RLX_E_AUTH, "grpc: TLS handshake with %s failed: %s", address, tls_cause);
        grpct_conn_destroy(c);
        return rc;
    }
    if (st != GRPC_CHANNEL_READY) {
        if (st == GRPC_CHANNEL_TRANSIENT_FAILURE && strstr(why, strerror(ECONNREFUSED))) {
            rc = t->host->error(RLX_E_PEER,
                                "grpc: cannot connect to %s: connection refused for %d ms (nothing "
                                "listens there)",
                                address, timeout_ms);
        } else {
            /* gRPC shows a silent peer and a host that never answers alike: a channel that stays
             * CONNECTING. Only a plain TCP connection tells them apart. */
            if (st == GRPC_CHANNEL_CONNECTING)
                snprintf(why, sizeof why, "%s",
                         grpct_tcp_accepts(host, port)
                             ? "it accepted the connection but never answered the HTTP/2 handshake (not an rlx "
                               "grpc stage: perhaps one started with --transport tcp, or another program)"
                             : "no answer from the host (down, unreachable, or a firewall drops the connection)");
            else if (strstr(why, "Failed parsing HTTP/2")) /* what an rlx tcp stage's error frame gives */
                snprintf(why + strlen(why), sizeof why - strlen(why),
                         " (the peer does not speak HTTP/2: perhaps a stage started with --transport tcp)");
            rc = t->host->error(RLX_E_TIMEOUT, "grpc: cannot connect to %s within %d ms (channel %s): %s", address,
                                timeout_ms, grpct_state_name(st), why);
        }
        grpct_conn_destroy(c);
        return rc;
    }
    c->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                       grpc_slice_from_static_string(GRPCT_METHOD), NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!c->call) {
        grpct_conn_destroy(c);
        return t->host->error(RLX_E_INTERNAL, "grpc: cannot create a call to %s", address);
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &c->md_initial;
    if ((rc = grpct_start(c, ops, 2, GRPCT_OP_INIT)) < 0)
        goto fail;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &c->md_trailing;
    ops[0].data.recv_status_on_client.status = &c->status;
    ops[0].data.recv_status_on_client.status_details = &c->status_details;
    if ((rc = grpct_start(c, ops, 1, GRPCT_OP_STATUS)) < 0 || (rc = grpct_post_recv(c)) < 0)
        goto fail;
    grpct_conn_link(c, true);
    *conn = c;
    return RLX_OK;
fail:
    grpct_conn_destroy(c);
    return rc;
}
