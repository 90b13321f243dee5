/* transport-grpc's listeners: a grpc_server with its own notification queue and GRPCT_BACKLOG
 * request_call slots posted at all times, each bound to the queue its connection will use, so
 * several streams can be accepted and served concurrently. gRPC finishes every TLS handshake
 * before a call reaches a slot, so a peer that fails it or stays silent holds none. The server
 * lives until the listener and every connection accepted from it are closed. */
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

/* Posts request_call for every free slot. Caller holds l->accept_mu (or owns l alone). */
static int grpct_fill_slots(grpct_listener *l) {
    grpct *t = l->t;
    for (int i = 0; i < GRPCT_BACKLOG; i++) {
        if (l->slots[i])
            continue;
        grpct_conn *c = grpct_conn_new(t, true);
        if (!c)
            return t->host->error(RLX_E_NOMEM, "grpc: out of memory");
        c->ops[GRPCT_OP_ACCEPT].pending = true;
        const grpc_call_error e = grpc_server_request_call(l->server, &c->call, &c->details, &c->md_request, c->cq,
                                                           l->cq, &c->ops[GRPCT_OP_ACCEPT]);
        if (e != GRPC_CALL_OK) {
            grpct_conn_destroy(c);
            return t->host->error(RLX_E_INTERNAL, "grpc: listener %s: request_call failed: %s", l->address,
                                  grpc_call_error_to_string(e));
        }
        l->slots[i] = c;
    }
    return RLX_OK;
}

/* Frees a slot whose request_call completed; a call it got while shutting down is refused. */
static void grpct_slot_release(grpct_listener *l, grpct_conn *c, bool got_call) {
    for (int i = 0; i < GRPCT_BACKLOG; i++)
        if (l->slots[i] == c)
            l->slots[i] = NULL;
    c->ops[GRPCT_OP_ACCEPT].pending = false;
    if (got_call && c->call)
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE, "rlx listener closed", NULL);
    else
        c->call = NULL;
    grpct_conn_destroy(c);
}

void grpct_listener_destroy(grpct_listener *l) {
    grpct *t = l->t;
    if (l->server) {
        l->shutdown_op.pending = true;
        grpc_server_shutdown_and_notify(l->server, l->cq, &l->shutdown_op);
        grpc_server_cancel_all_calls(l->server);
        const gpr_timespec deadline = grpct_deadline(GRPCT_DRAIN_MS);
        for (;;) {
            bool slots_left = false;
            for (int i = 0; i < GRPCT_BACKLOG; i++)
                slots_left |= l->slots[i] != NULL;
            if (!l->shutdown_op.pending && !slots_left)
                break;
            const grpc_event ev = grpc_completion_queue_next(l->cq, deadline, NULL);
            if (ev.type != GRPC_OP_COMPLETE)
                break;
            grpct_op *op = ev.tag;
            if (op == &l->shutdown_op)
                l->shutdown_op.pending = false;
            else
                grpct_slot_release(l, op->c, ev.success);
        }
        if (l->shutdown_op.pending) {
            t->host->log(RLX_LOG_ERROR, "grpc: listener %s did not shut down; leaking it", l->address);
            return;
        }
        grpc_server_destroy(l->server);
    }
    if (l->cq) {
        grpc_completion_queue_shutdown(l->cq);
        while (grpc_completion_queue_next(l->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(l->cq);
    }
    pthread_mutex_lock(&t->mu);
    if (l->prev)
        l->prev->next = l->next;
    else if (t->listeners == l)
        t->listeners = l->next;
    if (l->next)
        l->next->prev = l->prev;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_destroy(&l->mu);
    pthread_mutex_destroy(&l->accept_mu);
    t->host->free(l);
}

void grpct_listener_unref(grpct_listener *l) {
    pthread_mutex_lock(&l->mu);
    const bool last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (last)
        grpct_listener_destroy(l);
}

int grpct_listen(void *self, const char *address, void **listener) {
    grpct *t = self;
    if (!t || !listener)
        return RLX_E_INVALID;
    *listener = NULL;
    char host[GRPCT_ADDR_MAX], target[GRPCT_ADDR_MAX + 8];
    unsigned port;
    int rc = grpct_split_address(t, address, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    const bool wildcard = !host[0] || !strcmp(host, "*");
    const bool v6 = strchr(host, ':') != NULL;
    if (wildcard)
        snprintf(target, sizeof target, "[::]:%u", port);
    else
        snprintf(target, sizeof target, v6 ? "[%s]:%u" : "%s:%u", host, port);
    grpct_listener *l = t->host->alloc(sizeof *l, GRPCT_ALIGN);
    if (!l)
        return t->host->error(RLX_E_NOMEM, "grpc: out of memory");
    memset(l, 0, sizeof *l);
    l->t = t;
    l->refs = 1;
    l->shutdown_op.kind = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_mutex_init(&l->accept_mu, NULL);
    snprintf(l->address, sizeof l->address, "%s", address);
    grpc_arg args[16];
    const grpc_channel_args ch_args = {.num_args = grpct_common_args(t, args, true), .args = args};
    l->server = grpc_server_create(&ch_args, NULL);
    l->cq = grpc_completion_queue_create_for_next(NULL);
    if (!l->server || !l->cq) {
        rc = t->host->error(RLX_E_INTERNAL, "grpc: cannot create a server for %s", address);
        goto fail;
    }
    grpc_server_register_completion_queue(l->server, l->cq, NULL);
    /* With TLS, gRPC completes the handshake (and verifies the client's certificate) before the
     * first call: a peer that fails it or stays silent never reaches a request_call slot. */
    grpc_server_credentials *creds = t->tls_server ? t->tls_server : grpc_insecure_server_credentials_create();
    grpct_last_log[0] = '\0';
    const int bound = grpc_server_add_http2_port(l->server, target, creds);
    if (!t->tls_server)
        grpc_server_credentials_release(creds);
    if (bound <= 0) {
        char cause[256] = "address in use, not local, or not resolvable";
        if (strstr(grpct_last_log, strerror(EADDRINUSE)))
            snprintf(cause, sizeof cause, "%s", GRPCT_IN_USE);
        else if (grpct_last_log[0])
            grpct_log_cause(grpct_last_log, cause, sizeof cause);
        rc = t->host->error(RLX_E_IO, "grpc: cannot listen on %s: %s", address, cause);
        grpc_server_destroy(l->server); /* never started: no shutdown needed */
        l->server = NULL;
        goto fail;
    }
    if (wildcard)
        snprintf(l->bound, sizeof l->bound, "[::]:%d", bound);
    else
        snprintf(l->bound, sizeof l->bound, v6 ? "[%s]:%d" : "%s:%d", host, bound);
    grpc_server_start(l->server);
    pthread_mutex_lock(&t->mu);
    l->next = t->listeners;
    if (t->listeners)
        t->listeners->prev = l;
    t->listeners = l;
    pthread_mutex_unlock(&t->mu);
    rc = grpct_fill_slots(l); /* not published yet: no accept can run */
    if (rc < 0) {
        grpct_listener_unref(l);
        return rc;
    }
    *listener = l;
    return RLX_OK;
fail:
    grpct_listener_destroy(l);
    return rc;
}

int grpct_bound_address(void *self, void *listener, char *buf, size_t size) {
    grpct *t = self;
    grpct_listener *l = listener;
    if (!t || !l || !buf || !size)
        return RLX_E_INVALID;
    if ((size_t)snprintf(buf, size, "%s", l->bound) >= size)
        return t->host->error(RLX_E_RANGE, "grpc: listener %s: address does not fit in %zu bytes", l->address, size);
    return RLX_OK;
}

void grpct_listener_close(void *self, void *listener) {
    grpct_listener *l = listener;
    if (self && l)
        grpct_listener_unref(l); /* the server stays until its accepted connections close */
}

/* Makes an accepted slot a connection: initial metadata out, the first receive posted. */
static int grpct_conn_start_server(grpct_conn *c) {
    grpct_peer_name(c->call, c->peer, sizeof c->peer);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    int rc = grpct_start(c, &op, 1, GRPCT_OP_INIT);
    if (rc < 0)
        return rc;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if ((rc = grpct_start(c, &op, 1, GRPCT_OP_STATUS)) < 0)
        return rc;
    return grpct_post_recv(c);
}

int grpct_accept(void *self, void *listener, int timeout_ms, void **conn) {
    grpct *t = self;
    grpct_listener *l = listener;
    if (!t || !l || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    const gpr_timespec deadline = grpct_deadline(timeout_ms);
    pthread_mutex_lock(&l->accept_mu);
    int rc;
    for (;;) {
        const grpc_event ev = grpc_completion_queue_next(l->cq, deadline, NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
            rc = t->host->error(RLX_E_TIMEOUT, "grpc: no connection on %s within %d ms", l->address, timeout_ms);
            break;
        }
        grpct_op *op = ev.tag;
        grpct_conn *c = op->c;
        if (op == &l->shutdown_op || !c) {
            l->shutdown_op.pending = false;
            continue;
        }
        for (int i = 0; i < GRPCT_BACKLOG; i++)
            if (l->slots[i] == c)
                l->slots[i] = NULL;
        c->ops[GRPCT_OP_ACCEPT].pending = false;
        if (!ev.success) {
            c->call = NULL;
            grpct_conn_destroy(c);
            continue;
        }
        if ((rc = grpct_fill_slots(l)) < 0) {
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE, "rlx listener out of resources", NULL);
            grpct_conn_destroy(c);
            break;
        }
        if (grpc_slice_str_cmp(c->details.method, GRPCT_METHOD) != 0) {
            /* A connect probe or a stranger: answer it without bothering the application. */
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNIMPLEMENTED, "rlx serves only " GRPCT_METHOD, NULL);
            grpct_conn_destroy(c);
            continue;
        }
        if ((rc = grpct_conn_start_server(c)) < 0) {
            grpct_conn_destroy(c);
            break;
        }
        c->listener = l;
        grpct_conn_link(c, true);
        pthread_mutex_lock(&l->mu);
        l->refs++;
        pthread_mutex_unlock(&l->mu);
        *conn = c;
        rc = RLX_OK;
        break;
    }
    pthread_mutex_unlock(&l->accept_mu);
    return rc;
}
