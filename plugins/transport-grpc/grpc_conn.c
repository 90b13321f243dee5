/* transport-grpc's connections: the completion queue each one owns, the ops posted on its call,
 * and the progress thread. Every op has a tag struct (grpct_op) inside the connection that
 * records whether it is still in flight, and the thread that calls send/recv drives the queue
 * itself until what it waits for arrives or its deadline passes. Invariants per connection:
 *   - one RECV_MESSAGE is in flight whenever the stream is open and no received message is
 *     waiting (at most one message is buffered, so a slow reader back-pressures the sender);
 *   - at most one SEND_MESSAGE is in flight: send copies the payload, posts it and returns;
 *     the next send first waits (within its own timeout) for the previous one to complete;
 *   - a timeout never leaves an untracked operation: the posted ops stay in flight, tracked,
 *     and the connection stays usable. Nothing is destroyed before every op has completed
 *     (after a cancel if need be).
 * gRPC C core makes progress only inside completion-queue waits, hence the progress thread (one
 * per instance), which waits on a private queue whenever the application has made no call for
 * a couple of milliseconds and finishes closed connections. */
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

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>

#include "grpc_internal.h"

// ---- small helpers ----

gpr_timespec grpct_deadline(int timeout_ms) {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms > 0 ? timeout_ms : 0, GPR_TIMESPAN));
}

bool grpct_passed(gpr_timespec deadline) { return gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), deadline) >= 0; }

const char *grpct_status_name(int code) {
    static const char *const names[] = {
        "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
        "DATA_LOSS", "UNAUTHENTICATED"};
    return code >= 0 && code < (int)(sizeof names / sizeof names[0]) ? names[code] : "?";
}

const char *grpct_state_name(grpc_connectivity_state st) {
    switch (st) {
    case GRPC_CHANNEL_IDLE:
        return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
        return "CONNECTING";
    case GRPC_CHANNEL_READY:
        return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
        return "TRANSIENT_FAILURE";
    default:
        return "SHUTDOWN";
    }
}

/* rlx_iface_split_address, with room left for the "ipv6:[...]:port" target gRPC is given. */
int grpct_split_address(const grpct *t, const char *address, char *host, size_t host_size, unsigned *port) {
    char err[256];
    const int rc = rlx_iface_split_address(address, host, host_size, port, err, sizeof err);
    if (rc < 0)
        return t->host->error(rc, "grpc: %s", err);
    if (strlen(host) + 16 >= GRPCT_ADDR_MAX)
        return t->host->error(RLX_E_INVALID, "grpc: address '%s': host name too long", address);
    return RLX_OK;
}

/* "ipv4:127.0.0.1:5000" or "ipv6:%5B::1%5D:5000" (from grpc_call_get_peer) -> "127.0.0.1:5000", "[::1]:5000". */
void grpct_peer_name(grpc_call *call, char *buf, size_t size) {
    char *p = grpc_call_get_peer(call);
    const char *s = p ? p : "?";
    if (!strncmp(s, "ipv4:", 5) || !strncmp(s, "ipv6:", 5))
        s += 5;
    size_t n = 0;
    for (; *s && n + 1 < size; s++) {
        if (!strncmp(s, "%5B", 3) || !strncmp(s, "%5D", 3)) {
            buf[n++] = s[2] == 'B' ? '[' : ']';
            s += 2;
        } else {
            buf[n++] = *s;
        }
    }
    buf[n] = '\0';
    gpr_free(p);
}

// ---- completion queues and ops ----

/* Waits for one completion on c's queue until deadline and records it: 1 got one, 0 timed out. */
int grpct_pump(grpct_conn *c, gpr_timespec deadline) {
    const grpc_event ev = grpc_completion_queue_next(c->cq, deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return 0;
    grpct_op *op = ev.tag;
    op->pending = false;
    op->success = ev.success != 0;
    c->n_pending--;
    switch (op->kind) {
    case GRPCT_OP_INIT:
        c->init_failed = !ev.success;
        break;
    case GRPCT_OP_RECV:
        if (ev.success && c->recv_bb) {
            c->ready = c->recv_bb;
        } else {
            if (c->recv_bb)
                grpc_byte_buffer_destroy(c->recv_bb);
            c->eof = true;
            c->recv_failed = !ev.success || grpc_call_failed_before_recv_message(c->call);
        }
        c->recv_bb = NULL;
        break;
    case GRPCT_OP_SEND:
        grpc_byte_buffer_destroy(c->send_bb);
        c->send_bb = NULL;
        c->send_failed |= !ev.success;
        break;
    default:
        break;
    }
    return 1;
}

/* Starts a batch on c's call tagged with c->ops[kind]. */
int grpct_start(grpct_conn *c, const grpc_op *ops, size_t n, int kind) {
    const grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->ops[kind], NULL);
    if (e != GRPC_CALL_OK)
        return c->t->host->error(RLX_E_INTERNAL, "grpc: stream with %s: starting an operation failed: %s", c->peer,
                                 grpc_call_error_to_string(e));
    c->ops[kind].pending = true;
    c->n_pending++;
    return RLX_OK;
}

int grpct_post_recv(grpct_conn *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_bb;
    return grpct_start(c, &op, 1, GRPCT_OP_RECV);
}

grpct_conn *grpct_conn_new(grpct *t, bool is_server) {
    grpct_conn *c = t->host->alloc(sizeof *c, GRPCT_ALIGN);
    if (!c)
        return NULL;
    memset(c, 0, sizeof *c);
    c->t = t;
    c->is_server = is_server;
    c->cq = grpc_completion_queue_create_for_next(NULL);
    if (!c->cq) {
        t->host->free(c);
        return NULL;
    }
    for (int k = 0; k < GRPCT_N_OPS; k++) {
        c->ops[k].c = c;
        c->ops[k].kind = k;
    }
    grpc_metadata_array_init(&c->md_initial);
    grpc_metadata_array_init(&c->md_trailing);
    grpc_metadata_array_init(&c->md_request);
    grpc_call_details_init(&c->details);
    c->status_details = grpc_empty_slice();
    c->status_text = grpc_empty_slice();
    c->max_message = (uint64_t)t->max_message;
    return c;
}

/* Adds or removes an open connection in t->conns, the list close() cleans up after. */
void grpct_conn_link(grpct_conn *c, bool link) {
    grpct *t = c->t;
    pthread_mutex_lock(&t->mu);
    if (link && !c->linked) {
        c->prev = NULL;
        c->next = t->conns;
        if (t->conns)
            t->conns->prev = c;
        t->conns = c;
    } else if (!link && c->linked) {
        if (c->prev)
            c->prev->next = c->next;
        else
            t->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        c->prev = c->next = NULL;
    }
    c->linked = link;
    pthread_mutex_unlock(&t->mu);
}

/* Moves a closed connection towards the end of its stream without waiting: lets the send in
 * flight finish, then half-closes (client) or sends an OK status (server), and discards what
 * still arrives. True once nothing is left to wait for (or the call failed). */
bool grpct_conn_advance(grpct_conn *c) {
    if (!c->call)
        return true;
    if (c->ready) {
        grpc_byte_buffer_destroy(c->ready);
        c->ready = NULL;
        if (!c->eof && grpct_post_recv(c) < 0)
            return true;
    }
    if (c->send_failed || c->init_failed)
        return true;
    if (c->ops[GRPCT_OP_SEND].pending)
        return false;
    grpc_op op;
    memset(&op, 0, sizeof op);
    if (!c->is_server) {
        if (!c->ops[GRPCT_OP_STATUS].pending)
            return true; /* the server ended the call */
        if (!c->close_posted) {
            c->close_posted = true;
            op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
            if (grpct_start(c, &op, 1, GRPCT_OP_CLOSE) < 0)
                return true;
        }
        return false;
    }
    if (!c->ops[GRPCT_OP_STATUS].pending && c->cancelled)
        return true;
    if (!c->close_posted) {
        c->close_posted = true;
        op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        op.data.send_status_from_server.status = GRPC_STATUS_OK;
        op.data.send_status_from_server.status_details = &c->status_text;
        if (grpct_start(c, &op, 1, GRPCT_OP_CLOSE) < 0)
            return true;
    }
    return !c->ops[GRPCT_OP_CLOSE].pending && !c->ops[GRPCT_OP_STATUS].pending;
}

/* Releases everything c holds, cancelling its call first if it is not complete. */
void grpct_conn_destroy(grpct_conn *c) {
    grpct *t = c->t;
    grpct_conn_link(c, false);
    if (c->call)
        grpc_call_cancel(c->call, NULL); /* a no-op once the call is complete */
    if (c->channel) {
        grpc_channel_destroy(c->channel); /* also ends a connectivity watch */
        c->channel = NULL;
    }
    const gpr_timespec deadline = grpct_deadline(GRPCT_DRAIN_MS);
    while (c->n_pending > 0 && grpct_pump(c, deadline))
        ;
    if (c->n_pending > 0) {
        /* Never seen; destroying a queue with ops in flight would crash, so leak instead. */
        t->host->log(RLX_LOG_ERROR, "grpc: stream with %s: %d operations did not finish after cancel; leaking it",
                     c->peer, c->n_pending);
        return;
    }
    if (c->call)
        grpc_call_unref(c->call);
    if (c->ready)
        grpc_byte_buffer_destroy(c->ready);
    grpc_metadata_array_destroy(&c->md_initial);
    grpc_metadata_array_destroy(&c->md_trailing);
    grpc_metadata_array_destroy(&c->md_request);
    grpc_call_details_destroy(&c->details);
    grpc_slice_unref(c->status_details);
    grpc_completion_queue_shutdown(c->cq);
    while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(c->cq);
    grpct_listener *l = c->listener;
    t->host->free(c);
    if (l)
        grpct_listener_unref(l);
}

/* Processes whatever already completed on c's queue, without waiting. */
void grpct_pump_ready(grpct_conn *c) {
    while (grpct_pump(c, gpr_inf_past(GPR_CLOCK_MONOTONIC)))
        ;
}

/* The error for a stream that ended or failed; waits briefly for the client's final status. */
int grpct_stream_error(grpct_conn *c, const char *doing, gpr_timespec deadline) {
    const rlx_host *h = c->t->host;
    if (!c->is_server) {
        const gpr_timespec soon = grpct_deadline(1000);
        const gpr_timespec until = gpr_time_cmp(deadline, soon) < 0 ? deadline : soon;
        while (c->ops[GRPCT_OP_STATUS].pending && grpct_pump(c, until))
            ;
        if (c->ops[GRPCT_OP_STATUS].pending)
            return h->error(RLX_E_PEER, "grpc: %s %s: the stream failed (no status from the peer yet)", doing, c->peer);
        char *details = grpc_slice_to_c_string(c->status_details);
        /* A message over one side's max_message is a malformed message, not a dead peer. */
        const int code = c->status == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(details, "larger than max")
                             ? RLX_E_FORMAT
                             : RLX_E_PEER;
        int rc;
        if (c->status == GRPC_STATUS_OK)
            rc = h->error(RLX_E_PEER, "grpc: %s %s: the peer closed the stream", doing, c->peer);
        else
            rc = h->error(code, "grpc: %s %s: status %d %s: %s", doing, c->peer, (int)c->status,
                          grpct_status_name(c->status), details);
        gpr_free(details);
        return rc;
    }
    if (c->eof && !c->recv_failed)
        return h->error(RLX_E_PEER, "grpc: %s %s: the peer closed the stream", doing, c->peer);
    return h->error(RLX_E_PEER,
                    "grpc: %s %s: the stream broke off (peer gone, connection lost, or a message over "
                    "max_message)",
                    doing, c->peer);
}

/* The error for every call on a connection that refused a message over its max_message. */
int grpct_refused_error(const grpct_conn *c) {
    return c->t->host->error(RLX_E_FORMAT,
                             "grpc: receiving from %s: a message of %zu bytes exceeds this connection's max_message "
                             "(%llu); the stream was ended",
                             c->peer, c->refused, (unsigned long long)c->max_message);
}

// ---- the progress thread ----

/* Advances every closed connection; destroys those that finished or ran out of time. */
static void grpct_reap(grpct *t) {
    pthread_mutex_lock(&t->mu);
    grpct_conn *z = t->zombies, *keep = NULL;
    t->zombies = NULL;
    pthread_mutex_unlock(&t->mu);
    while (z) {
        grpct_conn *next = z->next;
        grpct_pump_ready(z);
        if (grpct_conn_advance(z) || grpct_passed(z->expiry)) {
            grpct_conn_destroy(z);
        } else {
            z->next = keep;
            keep = z;
        }
        z = next;
    }
    if (!keep)
        return;
    pthread_mutex_lock(&t->mu);
    grpct_conn *last = keep;
    while (last->next)
        last = last->next;
    last->next = t->zombies;
    t->zombies = keep;
    pthread_mutex_unlock(&t->mu);
}

static bool grpct_has_zombies(grpct *t) {
    pthread_mutex_lock(&t->mu);
    const bool any = t->zombies != NULL;
    pthread_mutex_unlock(&t->mu);
    return any;
}

/* The progress thread. Waiting on any completion queue lets a thread take its turn as gRPC's
 * poller: it reads the sockets and runs gRPC's work for every queue of the process. It does so
 * only while the application has been out of this transport for a while (no call for one
 * look, GRPCT_QUIET_MS): during a burst of calls the calling threads poll themselves, and a
 * second poller would only add a wake-up hand-off to every message (measured: about +40 %
 * round-trip time, half the echo bandwidth on 2 vCPUs). */
void *grpct_poller_main(void *arg) {
    grpct *t = arg;
    unsigned seen = atomic_load(&t->calls) - 1;
    while (!atomic_load(&t->stopping)) {
        const unsigned calls = atomic_load(&t->calls);
        if (atomic_load(&t->active) == 0 && calls == seen) {
            grpc_completion_queue_next(t->poller_cq, grpct_deadline(GRPCT_POLL_MS), NULL);
        } else {
            const struct timespec ts = {.tv_sec = 0, .tv_nsec = GRPCT_QUIET_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        seen = calls;
        grpct_reap(t);
    }
    /* The transport is closing: closed connections get the rest of their linger time. */
    while (grpct_has_zombies(t)) {
        grpc_completion_queue_next(t->poller_cq, grpct_deadline(5), NULL);
        grpct_reap(t);
    }
    return NULL;
}

/* Brackets every entry point, so the progress thread knows when the application polls. */
void grpct_enter(grpct *t) {
    atomic_fetch_add(&t->active, 1);
    atomic_fetch_add(&t->calls, 1);
}

void grpct_leave(grpct *t) { atomic_fetch_sub(&t->active, 1); }
