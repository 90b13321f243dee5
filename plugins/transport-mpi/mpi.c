/* transport-mpi: rlx messages between the ranks of one MPI job (built on Open MPI; any MPI-3
 * library serves).
 *
 * Addresses are "rank:K", K a rank of MPI_COMM_WORLD: a process listens as its own rank (one
 * listener per process) and connects to any rank, itself included. A connection is two tags,
 * one per direction, derived from a connection id the connecting process draws:
 *   connect: CONNECT {id} to rank K on RLXM_TAG_CONNECT; K's accept answers ACCEPT on the
 *            connection's tag towards the connector, which connect waits for.
 *   message: a header {magic "RLXM", kind DATA, payload length, piece size} then the payload in
 *            pieces of the sender's `chunk` bytes (MPI counts are int; the receiver posts its
 *            receives by the header's size), all on the sender's tag of the connection, which MPI
 *            keeps in order.
 *   close:   a header of kind CLOSE, so the peer's next recv is RLX_E_PEER, as a closed socket is.
 * MPI's blocking calls have no deadline, so every wait polls nonblocking ones (MPI_Improbe,
 * MPI_Testall) with sleeps growing from 20 us to 1 ms until the caller's deadline. MPI cannot
 * tell that a peer died: a dead peer's messages stop coming, and the wait times out.
 *
 * MPI is initialised by the first open (MPI_THREAD_SERIALIZED: one mutex serialises every MPI
 * call of the process, so connections may still be used from several threads) and finalised when
 * the process exits with status 0. MPI_Finalize waits for every rank of the job, so a process
 * that fails exits without it: the launcher then ends the whole job instead of it hanging. A
 * process that ends well first meets the others' in a nonblocking barrier, for at most
 * RLXM_EXIT_WAIT_MS: a rank that died or fails never comes, and under mpirun --enable-recovery
 * (where a death does not end the job) MPI_Finalize would wait for it forever. Then the process
 * says so and exits with status 1, without MPI_Finalize. The plugin is linked with -z nodelete
 * so that exit handler outlives an unload.
 *
 * A send copies the message before posting it: a send that times out leaves its MPI requests
 * pending (Open MPI cannot cancel a send), and they must not point into the caller's buffer once
 * send has returned. Requests still pending when their connection closes are kept (with their
 * buffers) on a list that later calls test, so nothing they touch is freed under them.
 *
 * Options ("key=value" pairs separated by commas, all optional):
 *   max_message=N[K|M|G]   largest payload accepted by recv (default 4G)
 *   chunk=N[K|M|G]         largest single MPI message a payload is cut into (default 1G, at most
 *                          2147483647 bytes: MPI's int count) */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "plugin_entry.h"
#include "rlx/transport_iface.h"

#define RLXM_ALIGN 64
#define RLXM_HEADER_SIZE 24
#define RLXM_KIND_CONNECT 1u
#define RLXM_KIND_ACCEPT 2u
#define RLXM_KIND_DATA 3u
#define RLXM_KIND_CLOSE 4u
#define RLXM_TAG_CONNECT 1
#define RLXM_TAG_FIRST 16 /* connection tags: RLXM_TAG_FIRST + 2 * id + direction */
#define RLXM_DEFAULT_MAX_MESSAGE (4ull << 30)
#define RLXM_DEFAULT_CHUNK (1ull << 30)
#define RLXM_SLEEP_FIRST_NS 20000L
#define RLXM_SLEEP_MAX_NS 1000000L
/* How long closing waits for its CLOSE header or a cancelled receive before leaving them to
 * the pending list. */
#define RLXM_CLOSE_WAIT_MS 200
/* How long a process that ends well waits for every rank to end before MPI_Finalize. The ranks
 * of a job end together (a stage stops when its driver's connection closes), so this is slack
 * for freeing models, not for work. */
#define RLXM_EXIT_WAIT_MS 5000

/* Requests in flight and the buffer they use; freed once all have completed. */
typedef struct rlxm_pending {
    struct rlxm_pending *next;
    void *buf; /* host->alloc'd */
    int n;
    MPI_Request reqs[]; /* n */
} rlxm_pending;

/* The process's MPI state, shared by every instance; mu serialises every MPI call. */
static struct {
    pthread_mutex_t mu;
    bool ready, failed, finalize_at_exit;
    int rank, size, tag_ub;
    uint64_t next_id;
    bool listening;
    const rlx_host *host; /* of the instance that left requests pending, to free their buffers */
    rlxm_pending *orphans;
    char why[256]; /* why initialisation failed */
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

typedef struct rlxm {
    const rlx_host *host;
    uint64_t max_message;
    uint64_t chunk;
} rlxm;

typedef struct rlxm_listener {
    int rank;
} rlxm_listener;

typedef struct rlxm_conn {
    int peer;
    int tag_in, tag_out;
    /* A failed direction stays failed. */
    int send_rc, recv_rc;
    char send_why[160], recv_why[200];
    bool peer_closed;
    /* The message being received; kept across a timeout so the next recv resumes it. */
    rlxm_pending *rx; /* NULL between messages */
    uint64_t rx_len;
} rlxm_conn;

// ---- small helpers ----

static int64_t rlxm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t rlxm_deadline(int timeout_ms) {
    return rlxm_now_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
}

/* Sleeps before the next poll (growing *sleep_ns up to the cap) unless the deadline has passed:
 * 1 slept, 0 the deadline passed. */
static int rlxm_pause(int64_t deadline, long *sleep_ns) {
    const int64_t left = deadline - rlxm_now_ns();
    if (left <= 0)
        return 0;
    const struct timespec ts = {.tv_sec = 0, .tv_nsec = *sleep_ns < left ? *sleep_ns : (long)left};
    nanosleep(&ts, NULL);
    *sleep_ns = *sleep_ns * 2 < RLXM_SLEEP_MAX_NS ? *sleep_ns * 2 : RLXM_SLEEP_MAX_NS;
    return 1;
}

static const char *rlxm_mpi_error(int code, char *buf) {
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS)
        snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", code);
    return buf;
}

/* A header: 4 bytes "RLXM", then little-endian kind (u32), value (u64: the connection id of
 * CONNECT and ACCEPT, a DATA payload's length) and piece size (u64, DATA only). */
typedef struct rlxm_head {
    uint32_t kind;
    uint64_t value, chunk;
} rlxm_head;

static void rlxm_put(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t rlxm_get(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void rlxm_header(uint8_t *h, rlxm_head head) {
    memcpy(h, "RLXM", 4);
    rlxm_put(h + 4, head.kind, 4);
    rlxm_put(h + 8, head.value, 8);
    rlxm_put(h + 16, head.chunk, 8);
}

static int rlxm_tag(uint64_t id, int direction) { return RLXM_TAG_FIRST + (int)(2 * id) + direction; }

/* "rank:K" -> K, checked against the job's size. */
static int rlxm_parse_address(rlxm *s, const char *verb, const char *address, int *rank) {
    char host[64], err[256];
    unsigned k;
    if (rlx_iface_split_address(address, host, sizeof host, &k, err, sizeof err) < 0 || strcasecmp(host, "rank") != 0)
        return s->host->error(RLX_E_INVALID, "mpi: cannot %s '%s': want rank:K, K a rank of the MPI job", verb,
                              address ? address : "(null)");
    if ((int)k >= g.size)
        return s->host->error(RLX_E_NOT_FOUND,
                              "mpi: cannot %s %s: the MPI job has %d rank%s (0-%d); start the driver and every "
                              "stage in one job (mpirun -n STAGES+1 ...)",
                              verb, address, g.size, g.size == 1 ? "" : "s", g.size - 1);
    *rank = (int)k;
    return RLX_OK;
}

// ---- requests in flight (call with g.mu held) ----

static rlxm_pending *rlxm_pending_new(const rlx_host *host, int n, size_t buf_size) {
    rlxm_pending *p = host->alloc(sizeof *p + (size_t)n * sizeof(MPI_Request), RLXM_ALIGN);
    if (!p)
        return NULL;
    p->next = NULL;
    p->n = n;
    for (int i = 0; i < n; i++)
        p->reqs[i] = MPI_REQUEST_NULL;
    p->buf = host->alloc(buf_size ? buf_size : 1, RLXM_ALIGN);
    if (!p->buf) {
        host->free(p);
        return NULL;
    }
    return p;
}

static void rlxm_pending_free(const rlx_host *host, rlxm_pending *p) {
    if (p) {
        host->free(p->buf);
        host->free(p);
    }
}

/* 1 when every request has completed, 0 while some are pending, -1 when one failed (*mpi_rc,
 * which may be NULL, gets MPI's code). */
static int rlxm_pending_test(rlxm_pending *p, int *mpi_rc) {
    int done = 0;
    const int rc = MPI_Testall(p->n, p->reqs, &done, MPI_STATUSES_IGNORE);
    if (mpi_rc)
        *mpi_rc = rc;
    return rc != MPI_SUCCESS ? -1 : done;
}

/* Frees the orphans that have completed; tests each once. */
static void rlxm_reap(void) {
    for (rlxm_pending **pp = &g.orphans; *pp;) {
        rlxm_pending *p = *pp;
        if (rlxm_pending_test(p, NULL) != 0) {
            *pp = p->next;
            rlxm_pending_free(g.host, p);
        } else {
            pp = &p->next;
        }
    }
}

static void rlxm_orphan(const rlx_host *host, rlxm_pending *p) {
    g.host = host;
    p->next = g.orphans;
    g.orphans = p;
}

/* Posts a header to peer on tag and waits up to wait_ms for it to leave; still pending then, it
 * is left to the orphan list. RLX_OK, RLX_E_NOMEM, or RLX_E_IO when MPI refused it (*mpi_rc set). */
static int rlxm_send_header(const rlx_host *host, int peer, int tag, uint32_t kind, uint64_t value, int wait_ms,
                            int *mpi_rc) {
    rlxm_pending *p = rlxm_pending_new(host, 1, RLXM_HEADER_SIZE);
    if (!p)
        return RLX_E_NOMEM;
    rlxm_header(p->buf, (rlxm_head){.kind = kind, .value = value});
    *mpi_rc = MPI_Isend(p->buf, RLXM_HEADER_SIZE, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &p->reqs[0]);
    if (*mpi_rc != MPI_SUCCESS) {
        rlxm_pending_free(host, p);
        return RLX_E_IO;
    }
    const int64_t deadline = rlxm_deadline(wait_ms);
    long sleep_ns = RLXM_SLEEP_FIRST_NS;
    int done;
    while ((done = rlxm_pending_test(p, mpi_rc)) == 0 && rlxm_now_ns() < deadline) {
        /* the lock is held: other threads wait at most wait_ms, only while closing */
        const struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        sleep_ns = sleep_ns * 2 < RLXM_SLEEP_MAX_NS ? sleep_ns * 2 : RLXM_SLEEP_MAX_NS;
    }
    if (done == 0)
        rlxm_orphan(host, p);
    else
        rlxm_pending_free(host, p);
    return done < 0 ? RLX_E_IO : RLX_OK;
}

// ---- MPI for the process ----

/* Finalises MPI when the process ends well and every rank has come to its end too. on_exit, not
 * atexit: a failing process must not wait in MPI_Finalize for ranks that may never get there. */
static void rlxm_at_exit(int status, void *arg) {
    (void)arg;
    pthread_mutex_lock(&g.mu);
    if (status == 0 && g.finalize_at_exit) {
        const int64_t deadline = rlxm_deadline(RLXM_CLOSE_WAIT_MS);
        while (g.orphans && rlxm_now_ns() < deadline)
            rlxm_reap();
        MPI_Request barrier;
        int all_ended = 0;
        if (MPI_Ibarrier(MPI_COMM_WORLD, &barrier) == MPI_SUCCESS) {
            const int64_t barrier_deadline = rlxm_deadline(RLXM_EXIT_WAIT_MS);
            long sleep_ns = RLXM_SLEEP_FIRST_NS;
            while (MPI_Test(&barrier, &all_ended, MPI_STATUS_IGNORE) == MPI_SUCCESS && !all_ended &&
                   rlxm_pause(barrier_deadline, &sleep_ns))
                ;
        }
        if (!all_ended) {
            /* stderr itself: the application has let go of its log handler by now */
            fprintf(stderr,
                    "rlx: mpi: rank %d: not every rank of the job ended within %d ms (one died or failed); "
                    "exiting with status 1, without MPI_Finalize\n",
                    g.rank, RLXM_EXIT_WAIT_MS);
            _exit(1);
        }
        MPI_Finalize();
        g.ready = false;
    }
    pthread_mutex_unlock(&g.mu);
}

/* Initialises MPI once per process; later calls report the first one's outcome. */
static int rlxm_init(const rlx_host *host) {
    pthread_mutex_lock(&g.mu);
    if (!g.ready && !g.failed) {
        int initialized = 0, finalized = 0, provided = 0;
        MPI_Initialized(&initialized);
        MPI_Finalized(&finalized);
        if (finalized) {
            snprintf(g.why, sizeof g.why, "MPI was finalised in this process and cannot start again");
        } else if (!initialized && MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            snprintf(g.why, sizeof g.why, "MPI_Init_thread failed");
        } else {
            if (initialized)
                MPI_Query_thread(&provided);
            else
                g.finalize_at_exit = true;
            if (provided < MPI_THREAD_SERIALIZED)
                snprintf(g.why, sizeof g.why,
                         "the MPI library gives thread level %d, the transport needs %d "
                         "(MPI_THREAD_SERIALIZED)",
                         provided, MPI_THREAD_SERIALIZED);
        }
        if (!g.why[0]) {
            /* errors come back as codes instead of aborting the job */
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
            MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
            MPI_Comm_size(MPI_COMM_WORLD, &g.size);
            int *ub = NULL, flag = 0;
            MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
            g.tag_ub = flag && ub ? *ub : 32767; /* the standard's minimum */
            g.next_id = 1;
            g.ready = true;
            if (g.finalize_at_exit)
                on_exit(rlxm_at_exit, NULL);
        }
        g.failed = !g.ready;
    }
    const bool ok = g.ready;
    pthread_mutex_unlock(&g.mu);
    return ok ? RLX_OK : host->error(RLX_E_IO, "mpi: %s", g.why);
}

// ---- options, open, close ----

static int rlxm_parse_options(rlxm *s, const char *options) {
    const char *cursor = options;
    rlx_iface_option o;
    char err[256];
    unsigned long long size;
    int rc;
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        if (rlx_iface_option_is(&o, "max_message")) {
            if (!rlx_iface_option_size(&o, 1, 1ull << 40, &size))
                return s->host->error(RLX_E_INVALID, "mpi: option '%.*s': want a size from 1 to 1T", o.item_len,
                                      o.item);
            s->max_message = size;
        } else if (rlx_iface_option_is(&o, "chunk")) {
            if (!rlx_iface_option_size(&o, 1, INT_MAX, &size))
                return s->host->error(RLX_E_INVALID, "mpi: option '%.*s': want a size from 1 to %d (MPI's int count)",
                                      o.item_len, o.item, INT_MAX);
            s->chunk = size;
        } else {
            return s->host->error(RLX_E_INVALID, "mpi: unknown option '%.*s' (known: max_message=N, chunk=N)",
                                  o.item_len, o.item);
        }
    }
    return rc < 0 ? s->host->error(rc, "mpi: %s", err) : RLX_OK;
}

static int rlxm_open(const rlx_host *host, const char *options, void **self) {
    if (!host || !self)
        return host ? host->error(RLX_E_INVALID, "mpi: open: NULL argument") : RLX_E_INVALID;
    *self = NULL;
    rlxm *s = host->alloc(sizeof *s, RLXM_ALIGN);
    if (!s)
        return host->error(RLX_E_NOMEM, "mpi: out of memory");
    *s = (rlxm){.host = host, .max_message = RLXM_DEFAULT_MAX_MESSAGE, .chunk = RLXM_DEFAULT_CHUNK};
    int rc = rlxm_parse_options(s, options);
    if (rc == RLX_OK)
        rc = rlxm_init(host);
    if (rc < 0) {
        host->free(s);
        return rc;
    }
    *self = s;
    return RLX_OK;
}

static void rlxm_close(void *self) {
    rlxm *s = self;
    if (!s)
        return;
    pthread_mutex_lock(&g.mu);
    rlxm_reap();
    pthread_mutex_unlock(&g.mu);
    s->host->free(s);
}

// ---- listeners ----

static int rlxm_listen(void *self, const char *address, void **listener) {
    rlxm *s = self;
    if (!s || !listener)
        return RLX_E_INVALID;
    *listener = NULL;
    int rank;
    int rc = rlxm_parse_address(s, "listen on", address, &rank);
    if (rc < 0)
        return rc;
    if (rank != g.rank)
        return s->host->error(RLX_E_INVALID, "mpi: cannot listen on %s: this process is rank %d of the MPI job",
                              address, g.rank);
    rlxm_listener *l = s->host->alloc(sizeof *l, RLXM_ALIGN);
    if (!l)
        return s->host->error(RLX_E_NOMEM, "mpi: out of memory");
    pthread_mutex_lock(&g.mu);
    const bool taken = g.listening;
    g.listening = true;
    pthread_mutex_unlock(&g.mu);
    if (taken) {
        s->host->free(l);
        /* worded as the other transports word a port in use */
        return s->host->error(RLX_E_IO,
                              "mpi: cannot listen on %s: the port is in use (this process listens as "
                              "rank %d already)",
                              address, g.rank);
    }
    l->rank = rank;
    *listener = l;
    return RLX_OK;
}

static int rlxm_bound_address(void *self, void *listener, char *buf, size_t size) {
    rlxm *s = self;
    rlxm_listener *l = listener;
    if (!s || !l || !buf || !size)
        return RLX_E_INVALID;
    const int n = snprintf(buf, size, "rank:%d", l->rank);
    if (n < 0 || (size_t)n >= size)
        return s->host->error(RLX_E_RANGE, "mpi: address rank:%d does not fit in %zu bytes", l->rank, size);
    return RLX_OK;
}

static void rlxm_listener_close(void *self, void *listener) {
    rlxm *s = self;
    if (!s || !listener)
        return;
    pthread_mutex_lock(&g.mu);
    g.listening = false;
    pthread_mutex_unlock(&g.mu);
    s->host->free(listener);
}

// ---- connections ----

/* The largest connection id whose tags stay within MPI_TAG_UB. */
static uint64_t rlxm_max_id(void) { return (uint64_t)(g.tag_ub - RLXM_TAG_FIRST - 1) / 2; }

static int rlxm_conn_new(rlxm *s, int peer, int tag_in, int tag_out, rlxm_conn **out) {
    rlxm_conn *c = s->host->alloc(sizeof *c, RLXM_ALIGN);
    if (!c)
        return s->host->error(RLX_E_NOMEM, "mpi: out of memory for a connection with rank %d", peer);
    *c = (rlxm_conn){.peer = peer, .tag_in = tag_in, .tag_out = tag_out};
    *out = c;
    return RLX_OK;
}

/* With g.mu held: takes a header sent to this rank on tag from source (MPI_ANY_SOURCE for any).
 * 1 taken (*head and *from set), 0 none there; RLX_E_FORMAT (a message that is no header, taken
 * off the queue so it cannot block what follows) or RLX_E_IO with why filled. */
static int rlxm_take_header(rlxm *s, int source, int tag, rlxm_head *head, int *from, char *why, size_t why_size) {
    char mpi_err[MPI_MAX_ERROR_STRING];
    int flag = 0, count = 0;
    MPI_Message msg;
    MPI_Status st;
    int rc = MPI_Improbe(source, tag, MPI_COMM_WORLD, &flag, &msg, &st);
    if (rc != MPI_SUCCESS)
        return snprintf(why, why_size, "probing for messages failed: %.120s", rlxm_mpi_error(rc, mpi_err)), RLX_E_IO;
    if (!flag)
        return 0;
    *from = st.MPI_SOURCE;
    MPI_Get_count(&st, MPI_BYTE, &count);
    uint8_t h[RLXM_HEADER_SIZE];
    uint8_t *dst = count == RLXM_HEADER_SIZE ? h : s->host->alloc(count > 0 ? (size_t)count : 1, RLXM_ALIGN);
    /* a matched message has arrived whole (a probe matches only what arrived): this does not wait */
    rc = dst ? MPI_Mrecv(dst, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE) : MPI_ERR_NO_MEM;
    if (dst != h)
        s->host->free(dst);
    if (count != RLXM_HEADER_SIZE)
        return snprintf(why, why_size, "a %d-byte message from rank %d where a %d-byte header was due", count,
                        st.MPI_SOURCE, RLXM_HEADER_SIZE),
               RLX_E_FORMAT;
    if (rc != MPI_SUCCESS)
        return snprintf(why, why_size, "receiving from rank %d failed: %.120s", st.MPI_SOURCE,
                        rlxm_mpi_error(rc, mpi_err)),
               RLX_E_IO;
    if (memcmp(h, "RLXM", 4) != 0)
        return snprintf(why, why_size, "bad header from rank %d: magic %02x %02x %02x %02x is not \"RLXM\"",
                        st.MPI_SOURCE, h[0], h[1], h[2], h[3]),
               RLX_E_FORMAT;
    *head =
        (rlxm_head){.kind = (uint32_t)rlxm_get(h + 4, 4), .value = rlxm_get(h + 8, 8), .chunk = rlxm_get(h + 16, 8)};
    return 1;
}

static int rlxm_accept(void *self, void *listener, int timeout_ms, void **conn) {
    rlxm *s = self;
    if (!s || !listener || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    const int64_t deadline = rlxm_deadline(timeout_ms);
    long sleep_ns = RLXM_SLEEP_FIRST_NS;
    char why[256], mpi_err[MPI_MAX_ERROR_STRING];
    for (;;) {
        rlxm_head head = {0};
        int from = -1, mpi_rc = MPI_SUCCESS;
        pthread_mutex_lock(&g.mu);
        rlxm_reap();
        int rc = rlxm_take_header(s, MPI_ANY_SOURCE, RLXM_TAG_CONNECT, &head, &from, why, sizeof why);
        const uint64_t id = head.value;
        if (rc == 1 && (head.kind != RLXM_KIND_CONNECT || !id || id > rlxm_max_id())) {
            snprintf(why, sizeof why, "rank %d sent a bad connection request (kind %u, id %llu)", from, head.kind,
                     (unsigned long long)id);
            rc = RLX_E_FORMAT;
        }
        if (rc == 1 && rlxm_send_header(s->host, from, rlxm_tag(id, 1), RLXM_KIND_ACCEPT, id, 0, &mpi_rc) < 0) {
            snprintf(why, sizeof why, "cannot answer rank %d's connection request: %.120s", from,
                     rlxm_mpi_error(mpi_rc, mpi_err));
            rc = RLX_E_IO;
        }
        pthread_mutex_unlock(&g.mu);
        if (rc == 1)
            return rlxm_conn_new(s, from, rlxm_tag(id, 0), rlxm_tag(id, 1), (rlxm_conn **)conn);
        /* a malformed request is dropped, as a socket that fails its handshake would be */
        if (rc == RLX_E_FORMAT)
            s->host->log(RLX_LOG_DEBUG, "mpi: dropped a message: %s", why);
        else if (rc < 0)
            return s->host->error(rc, "mpi: accept on rank %d: %s", g.rank, why);
        if (!rlxm_pause(deadline, &sleep_ns))
            return s->host->error(RLX_E_TIMEOUT, "mpi: no connection to rank %d within %d ms", g.rank, timeout_ms);
    }
}

static int rlxm_connect(void *self, const char *address, int timeout_ms, void **conn) {
    rlxm *s = self;
    if (!s || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    int peer, mpi_rc = MPI_SUCCESS;
    int rc = rlxm_parse_address(s, "connect to", address, &peer);
    if (rc < 0)
        return rc;
    char why[256], mpi_err[MPI_MAX_ERROR_STRING];
    pthread_mutex_lock(&g.mu);
    const uint64_t id = g.next_id;
    g.next_id = id + 1 > rlxm_max_id() ? 1 : id + 1;
    rc = rlxm_send_header(s->host, peer, RLXM_TAG_CONNECT, RLXM_KIND_CONNECT, id, 0, &mpi_rc);
    pthread_mutex_unlock(&g.mu);
    if (rc < 0)
        return s->host->error(rc, "mpi: cannot send a connection request to %s: %s", address,
                              rc == RLX_E_NOMEM ? "out of memory" : rlxm_mpi_error(mpi_rc, mpi_err));
    const int64_t deadline = rlxm_deadline(timeout_ms);
    long sleep_ns = RLXM_SLEEP_FIRST_NS;
    for (;;) {
        rlxm_head head = {0};
        int from = -1;
        pthread_mutex_lock(&g.mu);
        rc = rlxm_take_header(s, peer, rlxm_tag(id, 1), &head, &from, why, sizeof why);
        pthread_mutex_unlock(&g.mu);
        if (rc == 1 && head.kind == RLXM_KIND_ACCEPT && head.value == id)
            return rlxm_conn_new(s, peer, rlxm_tag(id, 1), rlxm_tag(id, 0), (rlxm_conn **)conn);
        if (rc == 1)
            return s->host->error(RLX_E_FORMAT, "mpi: %s answered the connection request with kind %u", address,
                                  head.kind);
        if (rc < 0)
            return s->host->error(rc, "mpi: connecting to %s: %s", address, why);
        if (!rlxm_pause(deadline, &sleep_ns))
            break;
    }
    /* the request stays queued at the peer: if it is accepted later, the peer's first receive
     * finds this close */
    pthread_mutex_lock(&g.mu);
    rlxm_send_header(s->host, peer, rlxm_tag(id, 0), RLXM_KIND_CLOSE, 0, 0, &mpi_rc);
    pthread_mutex_unlock(&g.mu);
    return s->host->error(RLX_E_TIMEOUT,
                          "mpi: %s did not accept the connection within %d ms (nothing listens as that rank yet: "
                          "a stage reads its weights before it listens)",
                          address, timeout_ms);
}

/* With g.mu held: cancels what the receive in progress still waits for; what cannot be
 * cancelled in time is left to the orphan list. */
static void rlxm_rx_drop(rlxm *s, rlxm_conn *c) {
    if (!c->rx)
        return;
    for (int i = 0; i < c->rx->n; i++)
        if (c->rx->reqs[i] != MPI_REQUEST_NULL)
            MPI_Cancel(&c->rx->reqs[i]);
    const int64_t deadline = rlxm_deadline(RLXM_CLOSE_WAIT_MS);
    int done;
    while ((done = rlxm_pending_test(c->rx, NULL)) == 0 && rlxm_now_ns() < deadline) {
        const struct timespec ts = {0, RLXM_SLEEP_FIRST_NS};
        nanosleep(&ts, NULL);
    }
    if (done == 0)
        rlxm_orphan(s->host, c->rx);
    else
        rlxm_pending_free(s->host, c->rx);
    c->rx = NULL;
}

static void rlxm_conn_close(void *self, void *conn) {
    rlxm *s = self;
    rlxm_conn *c = conn;
    if (!s || !c)
        return;
    int mpi_rc;
    pthread_mutex_lock(&g.mu);
    if (!c->peer_closed)
        rlxm_send_header(s->host, c->peer, c->tag_out, RLXM_KIND_CLOSE, 0, RLXM_CLOSE_WAIT_MS, &mpi_rc);
    rlxm_rx_drop(s, c);
    rlxm_reap();
    pthread_mutex_unlock(&g.mu);
    s->host->free(c);
}

// ---- send ----

static int rlxm_send_broken(rlxm *s, rlxm_conn *c, int rc, const char *why) {
    snprintf(c->send_why, sizeof c->send_why, "%s", why);
    c->send_rc = rc;
    return s->host->error(rc, "mpi: sending to rank %d: %s (the connection sends no more)", c->peer, why);
}

static int rlxm_send(void *self, void *conn, const void *data, size_t len, int timeout_ms) {
    rlxm *s = self;
    rlxm_conn *c = conn;
    if (!s || !c || (len && !data))
        return s ? s->host->error(RLX_E_INVALID, "mpi: send: NULL argument") : RLX_E_INVALID;
    if (c->send_rc)
        return s->host->error(RLX_E_PEER, "mpi: connection to rank %d cannot send any more: %s", c->peer, c->send_why);
    const uint64_t n_chunks = (len + s->chunk - 1) / s->chunk;
    if (len > SIZE_MAX - RLXM_HEADER_SIZE - RLXM_ALIGN || n_chunks > INT_MAX - 1)
        return s->host->error(RLX_E_RANGE, "mpi: a message of %zu bytes is too large (pieces of %llu bytes)", len,
                              (unsigned long long)s->chunk);
    const int64_t deadline = rlxm_deadline(timeout_ms);
    char why[160], mpi_err[MPI_MAX_ERROR_STRING];
    pthread_mutex_lock(&g.mu);
    rlxm_pending *p = rlxm_pending_new(s->host, 1 + (int)n_chunks, RLXM_HEADER_SIZE + len);
    if (!p) {
        pthread_mutex_unlock(&g.mu);
        return s->host->error(RLX_E_NOMEM, "mpi: cannot allocate %zu bytes to send to rank %d", len, c->peer);
    }
    uint8_t *buf = p->buf;
    rlxm_header(buf, (rlxm_head){.kind = RLXM_KIND_DATA, .value = len, .chunk = s->chunk});
    if (len)
        memcpy(buf + RLXM_HEADER_SIZE, data, len);
    int rc = MPI_Isend(buf, RLXM_HEADER_SIZE, MPI_BYTE, c->peer, c->tag_out, MPI_COMM_WORLD, &p->reqs[0]);
    for (uint64_t i = 0; rc == MPI_SUCCESS && i < n_chunks; i++) {
        const uint64_t off = i * s->chunk, n = len - off < s->chunk ? len - off : s->chunk;
        rc = MPI_Isend(buf + RLXM_HEADER_SIZE + off, (int)n, MPI_BYTE, c->peer, c->tag_out, MPI_COMM_WORLD,
                       &p->reqs[1 + i]);
    }
    if (rc != MPI_SUCCESS) {
        rlxm_orphan(s->host, p); /* what was posted may still go out */
        pthread_mutex_unlock(&g.mu);
        snprintf(why, sizeof why, "posting a send failed: %.120s", rlxm_mpi_error(rc, mpi_err));
        return rlxm_send_broken(s, c, RLX_E_IO, why);
    }
    pthread_mutex_unlock(&g.mu);
    long sleep_ns = RLXM_SLEEP_FIRST_NS;
    for (;;) {
        int mpi_rc;
        pthread_mutex_lock(&g.mu);
        const int done = rlxm_pending_test(p, &mpi_rc);
        if (done > 0)
            rlxm_pending_free(s->host, p);
        else if (done < 0)
            rlxm_orphan(s->host, p);
        pthread_mutex_unlock(&g.mu);
        if (done > 0)
            return RLX_OK;
        if (done < 0) {
            snprintf(why, sizeof why, "the send failed: %.120s", rlxm_mpi_error(mpi_rc, mpi_err));
            return rlxm_send_broken(s, c, RLX_E_PEER, why);
        }
        if (!rlxm_pause(deadline, &sleep_ns))
            break;
    }
    /* the message may still go out whole, in order, once the peer reads; a peer that gave up on
     * it could not tell later ones from it, so the connection sends no more */
    pthread_mutex_lock(&g.mu);
    rlxm_orphan(s->host, p);
    pthread_mutex_unlock(&g.mu);
    snprintf(why, sizeof why, "rank %d took not all of %zu bytes within %d ms", c->peer, len, timeout_ms);
    return rlxm_send_broken(s, c, RLX_E_TIMEOUT, why);
}

// ---- recv ----

static int rlxm_recv_broken(rlxm *s, rlxm_conn *c, int rc, const char *why) {
    snprintf(c->recv_why, sizeof c->recv_why, "%s", why);
    c->recv_rc = rc;
    return s->host->error(rc, "mpi: %s", why);
}

/* With g.mu held: takes the next header of c and posts the receives of its payload. 1 started,
 * 0 no header yet, <0 failure reported (the connection receives no more). */
static int rlxm_rx_start(rlxm *s, rlxm_conn *c) {
    rlxm_head head = {0};
    int from = -1;
    char why[200], mpi_err[MPI_MAX_ERROR_STRING];
    int rc = rlxm_take_header(s, c->peer, c->tag_in, &head, &from, why, sizeof why);
    const uint32_t kind = head.kind;
    const uint64_t len = head.value, chunk = head.chunk;
    if (rc < 0)
        return rlxm_recv_broken(s, c, rc, why);
    if (rc == 0)
        return 0;
    if (kind == RLXM_KIND_CLOSE) {
        c->peer_closed = true;
        snprintf(why, sizeof why, "peer rank %d closed the connection", c->peer);
        return rlxm_recv_broken(s, c, RLX_E_PEER, why);
    }
    if (kind != RLXM_KIND_DATA) {
        snprintf(why, sizeof why, "bad frame from rank %d: kind %u where a message was due", c->peer, kind);
        return rlxm_recv_broken(s, c, RLX_E_FORMAT, why);
    }
    if (len > s->max_message || len > SIZE_MAX - RLXM_ALIGN) {
        snprintf(why, sizeof why,
                 "bad frame from rank %d: a message of %llu bytes exceeds the limit of %llu (option max_message)",
                 c->peer, (unsigned long long)len, (unsigned long long)s->max_message);
        return rlxm_recv_broken(s, c, RLX_E_FORMAT, why);
    }
    if (chunk < 1 || chunk > INT_MAX) {
        snprintf(why, sizeof why, "bad frame from rank %d: pieces of %llu bytes (want 1 to %d)", c->peer,
                 (unsigned long long)chunk, INT_MAX);
        return rlxm_recv_broken(s, c, RLX_E_FORMAT, why);
    }
    const uint64_t n_chunks = (len + chunk - 1) / chunk;
    rlxm_pending *p = n_chunks <= INT_MAX ? rlxm_pending_new(s->host, (int)n_chunks, (size_t)len) : NULL;
    if (!p) {
        snprintf(why, sizeof why, "cannot allocate %llu bytes for a message from rank %d", (unsigned long long)len,
                 c->peer);
        return rlxm_recv_broken(s, c, RLX_E_NOMEM, why);
    }
    uint8_t *buf = p->buf;
    rc = MPI_SUCCESS;
    for (uint64_t i = 0; rc == MPI_SUCCESS && i < n_chunks; i++) {
        const uint64_t off = i * chunk, n = len - off < chunk ? len - off : chunk;
        rc = MPI_Irecv(buf + off, (int)n, MPI_BYTE, c->peer, c->tag_in, MPI_COMM_WORLD, &p->reqs[i]);
    }
    c->rx = p;
    c->rx_len = len;
    if (rc != MPI_SUCCESS) {
        snprintf(why, sizeof why, "posting a receive from rank %d failed: %.120s", c->peer,
                 rlxm_mpi_error(rc, mpi_err));
        rlxm_rx_drop(s, c);
        return rlxm_recv_broken(s, c, RLX_E_IO, why);
    }
    return 1;
}

static int rlxm_recv(void *self, void *conn, void **data, size_t *len, int timeout_ms) {
    rlxm *s = self;
    rlxm_conn *c = conn;
    if (!s || !c || !data || !len)
        return s ? s->host->error(RLX_E_INVALID, "mpi: recv: NULL argument") : RLX_E_INVALID;
    *data = NULL;
    *len = 0;
    if (c->recv_rc)
        return s->host->error(c->recv_rc, "mpi: connection with rank %d is unusable after an earlier error: %s",
                              c->peer, c->recv_why);
    const int64_t deadline = rlxm_deadline(timeout_ms);
    long sleep_ns = RLXM_SLEEP_FIRST_NS;
    char why[200], mpi_err[MPI_MAX_ERROR_STRING];
    for (;;) {
        int mpi_rc = MPI_SUCCESS, done = 0;
        pthread_mutex_lock(&g.mu);
        const int started = c->rx ? 1 : rlxm_rx_start(s, c);
        if (started == 1 && (done = rlxm_pending_test(c->rx, &mpi_rc)) == 1) {
            *data = c->rx->buf;
            *len = (size_t)c->rx_len;
            s->host->free(c->rx); /* the buffer is the caller's now */
            c->rx = NULL;
        } else if (done < 0) {
            rlxm_rx_drop(s, c);
        }
        pthread_mutex_unlock(&g.mu);
        if (started < 0)
            return started;
        if (done > 0)
            return RLX_OK;
        if (done < 0) {
            snprintf(why, sizeof why, "receiving from rank %d failed: %.120s", c->peer,
                     rlxm_mpi_error(mpi_rc, mpi_err));
            return rlxm_recv_broken(s, c, RLX_E_PEER, why);
        }
        if (!rlxm_pause(deadline, &sleep_ns))
            break;
    }
    if (!c->rx)
        return s->host->error(RLX_E_TIMEOUT, "mpi: no message from rank %d within %d ms", c->peer, timeout_ms);
    return s->host->error(RLX_E_TIMEOUT,
                          "mpi: message from rank %d still incomplete after %d ms (%llu bytes); the next recv "
                          "resumes it",
                          c->peer, timeout_ms, (unsigned long long)c->rx_len);
}

// ---- plugin ----

static const rlx_transport_iface rlxm_iface = {
    .size = sizeof(rlx_transport_iface),
    .open = rlxm_open,
    .close = rlxm_close,
    .listen = rlxm_listen,
    .accept = rlxm_accept,
    .bound_address = rlxm_bound_address,
    .listener_close = rlxm_listener_close,
    .connect = rlxm_connect,
    .send = rlxm_send,
    .recv = rlxm_recv,
    .conn_close = rlxm_conn_close,
};

static const rlx_plugin rlxm_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_TRANSPORT,
    .name = "mpi",
    .version = "0.1.0",
    .summary = "MPI transport: messages between the ranks of one MPI job (addresses rank:K), nonblocking calls "
               "polled to every deadline",
    .iface = &rlxm_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return plugin_entry(host, &rlxm_plugin); }
