/* Pipeline parallelism: a model's layers split into contiguous ranges, each run by a *stage*
 * process, driven by one *driver* process that owns the session, sampling and output.
 *
 * Topology: a star. The driver holds one transport connection per stage and, for every forward
 * pass, sends a request to stage 0, waits for its reply, sends that reply's rows to stage 1, and
 * so on; the last stage replies with logits. Stages never talk to each other, so a stage needs
 * only to listen, and the driver sees every failure first-hand and can name the stage.
 *
 * Each stage runs its layer range as an rlx_session over a block (rlx_block_spec: the first
 * stage embeds token ids, the last applies the final norm and the LM head) and keeps the KV
 * cache of its own layers per session id. So a prefill sends the prompt's rows through the
 * stages once, and a decode step sends one position's hidden state per stage, never the whole
 * sequence again. Hidden states travel as little-endian F32, the dtype the blocks compute in, so
 * a pipeline's logits are bit-identical to a single process running the same backends.
 *
 * Wire protocol (proto/rlx.proto, protobuf-c encoded rlx.Envelope messages, one per transport
 * message):
 * - Handshake: the driver sends Hello (protocol version, model id, the layer range it expects,
 *   stage index, KV capacity wanted) and the stage answers HelloReply (its version, model id,
 *   layer range, backend, resident memory, the capacity its sessions get) or, on any mismatch,
 *   an Error naming both sides' values, after which it closes the connection and logs why. The
 *   driver checks the reply as well, so a mismatch is refused on both sides.
 * - Activations: session id, step, start position, rows. A session begins with an Activations
 *   at start position 0 for an id the stage does not hold; any other request for an unknown
 *   id, a step not greater than the session's previous one, or a start position other than the
 *   stage's cache length is answered with an Error and the stage keeps serving.
 * - Hidden states: a driver whose speculator needs the target's final hidden states sets
 *   emit_hidden in the last stage's Hello; that stage echoes it in HelloReply and adds the
 *   final-normed rows of every requested position to its Activations replies. A stage that
 *   predates the field leaves the echo false and the driver refuses it, naming the stage.
 * - Truncate (speculative decoding rolls the caches back) and EndSession are answered with Ack.
 * - Slots (Hello.n_slots > 0): the connection also gets a batched KV cache of n_slots sequences
 *   of kv_capacity positions, which Rows steps (rows of many sequences, each with its slot and
 *   position) read and write and CopySlot copies between; steps carry a per-connection step
 *   number that must increase. The stage keeps no lengths for slots: the driver says where each
 *   row goes, and a slot ends after its last row of a step (a linear-attention layer's state
 *   then is the one after that row; it starts again at a row of position 0). A stage that
 *   predates slots answers n_slots 0 and the driver refuses it.
 * - Authentication (rlx_dist_security): with a token, the stage answers a Hello with
 *   AuthChallenge and the driver proves itself with AuthProof before the Hello is looked at.
 * - Keepalive: a driver with nothing to send pings each stage (Ping, answered by Ack) at a third
 *   of the idle timeout the stage gave in HelloReply.
 * - A stage serves many driver connections at once; their sessions belong to the connection and
 *   are freed on EndSession or when the connection dies.
 *
 * Timeouts: every wait is bounded. Connecting (with retries while the stage is not yet
 * listening) gives up after connect_timeout_ms; a control message (handshake, Truncate,
 * EndSession) waits timeout_ms for its answer; an Activations or Rows request waits
 * timeout_ms + n_positions * compute_ms_per_position, because a stage legitimately computes for
 * a long time on a long prompt. A dead, stalled or babbling stage is thus noticed within a
 * bounded time, with a message naming the stage index and address.
 *
 * Recovery: the driver then replaces the stage (restarting it through a callback when the caller
 * launched it, else reconnecting to its address or to a standby address until one answers the
 * handshake) and replays into it what it held: the session's ids so far, or every slot's
 * positions, fed again through the stages before it, whose kernels rewrite the same values. The
 * interrupted call then goes on, so the caller sees latency, not an error, and the tokens are
 * the ones it would have had (exactly so where the stages' kernels are batch invariant). A stage
 * that refused a request (an Error answer) is not replaced. When no replacement answers within
 * recovery_timeout_ms, or with no_recovery, the call fails naming the stage; the driver then
 * refuses further calls (and, outside the slots' threads, closes every connection so the other
 * stages free the session at once). */
#ifndef RLX_DIST_H
#define RLX_DIST_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "rlx/gen.h"
#include "rlx/model.h"
#include "rlx/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when the meaning of a message changes; peers of another version are refused. */
#define RLX_DIST_PROTOCOL_VERSION 1

/* Defaults used when an options field is 0. */
#define RLX_DIST_CONNECT_TIMEOUT_MS 10000
#define RLX_DIST_TIMEOUT_MS 5000
#define RLX_DIST_COMPUTE_MS_PER_POSITION 100
#define RLX_DIST_POLL_MS 200
#define RLX_DIST_RECOVERY_TIMEOUT_MS 30000
/* The most standby addresses one stage may list. */
#define RLX_DIST_MAX_STANDBY 8
/* A stage closes a driver connection that sent nothing for this long; drivers ping at a third. */
#define RLX_DIST_IDLE_TIMEOUT_MS 120000
#define RLX_DIST_MAX_CONNECTIONS 16 /* driver connections a stage serves at once */
#define RLX_DIST_MAX_SESSIONS 64    /* sessions a stage holds at once, all connections together */
/* Connections a stage holds before their handshake (and authentication) completed, in all and
 * from one host (an IPv6 host: its /64 network). Each costs a thread and a few kB, never a
 * session or KV cache. A new connection beyond either limit evicts an older pending one, as
 * sshd's MaxStartups drops: its host's oldest, else the oldest of the host holding the most,
 * else (every host holding one) the oldest once it has waited half the handshake timeout.
 * When none may go, the new connection is told the stage is busy (RLX_E_BUSY), as is each
 * evicted one, so a driver names the cause. */
#define RLX_DIST_MAX_HANDSHAKES 64
#define RLX_DIST_MAX_HANDSHAKES_PER_HOST 16
/* A shared secret shorter than this is refused (a token is a password no person types). */
#define RLX_DIST_MIN_TOKEN_BYTES 16

/* ---- link security ----
 *
 * Who may use a stage. Without credentials a stage listens on loopback only (127.0.0.0/8, ::1,
 * localhost) unless insecure_listen says otherwise. With credentials it refuses, before it
 * allocates anything for it, every peer that does not prove it holds them, and the driver
 * refuses a stage that does not prove it either:
 * - TLS (tls_ca, tls_cert, tls_key): the transport runs TLS 1.3 with mutual authentication, both
 *   sides' certificates chaining to tls_ca (the transport options tls_ca=, tls_cert=, tls_key=,
 *   tls_name=, see transport_iface.h). Encrypts the link as well.
 * - A shared token (auth_token_file): after the driver's Hello, the stage answers with a
 *   challenge and its proof (HMAC-SHA256 of both sides' random nonces under the token) and the
 *   driver answers with its own proof; the token never crosses the wire and a recorded exchange
 *   does not replay. It authenticates the handshake, not the bytes after it: on a network an
 *   attacker can write to, use TLS.
 * Both may be given together. The token file's first line is the token: at least
 * RLX_DIST_MIN_TOKEN_BYTES bytes, in a file that neither group nor others may read. */
typedef struct rlx_dist_security {
    const char *tls_ca;          /* PEM file: the authority peers' certificates chain to; NULL = no TLS */
    const char *tls_cert;        /* PEM file: this process's certificate */
    const char *tls_key;         /* PEM file: its private key */
    const char *tls_name;        /* driver: the name stages' certificates carry, if not their address's host */
    const char *auth_token_file; /* the shared token's file; NULL = none */
    int insecure_listen;         /* stage: listen beyond loopback with no credentials at all */
} rlx_dist_security;

/* How a stage with credentials s, listening on address over transport (its plugin's name), admits
 * drivers, in the words of its start line: "drivers must authenticate: the auth token" (or TLS
 * with a certificate of the CA, or both), "no credentials: drivers on this machine only (loopback)", "no credentials: the
 * ranks of this MPI job only", or for a stage beyond loopback without credentials (which only
 * insecure_listen allows) "no credentials (--insecure-listen): anyone who reaches the port ...".
 * A static string. */
RLX_API const char *rlx_dist_security_mode(const rlx_dist_security *s, const char *address, const char *transport);

/* ---- model identity ---- */

/* 64 lowercase hex digits and a NUL. */
#define RLX_MODEL_ID_SIZE 65

/* The identity of the model in model_dir: SHA-256 over the bytes of config.json and, for every
 * safetensors file in name order, its size and header (the JSON that names every tensor with its
 * dtype, shape and byte range); for a GGUF model, over each shard's size and header (metadata and
 * tensor index). The same files give the same id wherever they are; tensor data is not read, so
 * computing it costs no more than opening the model. */
RLX_API rlx_status rlx_model_id(const char *model_dir, char out[RLX_MODEL_ID_SIZE]);

/* ---- layer split ---- */

typedef struct rlx_layer_range {
    uint32_t start; /* first layer */
    uint32_t end;   /* one past the last */
} rlx_layer_range;

/* Splits n_layers into n_stages contiguous ranges of sizes differing by at most one; earlier
 * stages get the extra layers. RLX_E_RANGE when there are more stages than layers. */
RLX_API rlx_status rlx_dist_split_even(uint32_t n_layers, uint32_t n_stages, rlx_layer_range *out);

/* Splits cfg's layers into n_stages contiguous ranges that balance the weights each stage reads
 * per token: every decoder layer's matrices (of a sparse layer, the experts a token is routed to
 * and the router) and, on the last stage, the LM head. Decode reads every weight once per step,
 * so this balances the stages' time where an even split leaves the last stage the slowest (a
 * Qwen3-0.6B's LM head weighs as much as 10 layers). Of the splits whose heaviest stage is
 * lightest, the nearest to rlx_dist_split_even; a configuration without sizes (hidden_size 0)
 * splits evenly. The driver and the stages compute it from the same config.json, so they agree.
 * The default split of --stages and of deployment files without layers. */
RLX_API rlx_status rlx_dist_split_balanced(const rlx_model_config *cfg, uint32_t n_stages, rlx_layer_range *out);

/* Checks that ranges, in pipeline order, cover [0, n_layers) exactly: each non-empty, the first
 * starting at 0, each starting where the previous ended (no gap, no overlap) and the last ending
 * at n_layers. The message names the stage and the layers concerned. */
RLX_API rlx_status rlx_dist_check_ranges(uint32_t n_layers, const rlx_layer_range *ranges, uint32_t n_stages);

/* Parses "A-B" (inclusive, as in deployment files and --layers) or a single layer "A" into the
 * half-open range [A, B + 1). */
RLX_API rlx_status rlx_dist_parse_range(const char *text, rlx_layer_range *out);

/* ---- stage ---- */

typedef struct rlx_stage_options {
    const char *address;                /* "host:port" to listen on; port 0 picks a free one */
    const rlx_plugin_handle *transport; /* a loaded transport plugin, borrowed */
    const char *transport_options;      /* passed to the transport's open; may be NULL */
    rlx_layer_range layers;             /* the block: embeds if start is 0, logits if end is the last */
    rlx_session_options session;        /* backends and placement (borrowed), default KV capacity */
    const char *backend_name;           /* reported to drivers; NULL = "ref" */
    int prefetch;                       /* 1: read the block's weights in before listening */
    uint32_t timeout_ms;                /* bound on a send or a handshake wait; 0 = RLX_DIST_TIMEOUT_MS */
    uint32_t poll_ms;                   /* how often *stop is looked at; 0 = RLX_DIST_POLL_MS */
    /* Limits over all connections together; 0 = the default. */
    uint32_t max_sessions;    /* sessions held at once; RLX_DIST_MAX_SESSIONS */
    uint32_t max_connections; /* driver connections served at once; RLX_DIST_MAX_CONNECTIONS */
    /* KV positions granted at once (each session and slot of every connection counts its
     * capacity); 0 = as many as half the machine's memory holds for this stage's layers */
    uint64_t max_positions;
    uint32_t idle_timeout_ms; /* a connection that sends nothing for this long is closed; RLX_DIST_IDLE_TIMEOUT_MS */
    rlx_dist_security security;
    const volatile sig_atomic_t *stop; /* serve until *stop != 0 (a signal handler sets it) */
    /* Called once listening, with the bound address (for port 0); may be NULL. */
    void (*on_listening)(void *ctx, const char *bound_address);
    void *ctx;
    /* Return RLX_OK once this many drivers were served: connections whose handshake the stage
     * granted, however they ended (a launcher's job ends with its driver; a peer refused before
     * that, garbage or a wrong credential, does not end a stage). 0 = until *stop. */
    uint32_t max_drivers;
} rlx_stage_options;

RLX_API rlx_stage_options rlx_stage_options_default(void);

/* Serves the block of model m (borrowed) to drivers until *o->stop becomes non-zero (or
 * o->max_drivers were served), then frees every session, closes the listener and returns
 * RLX_OK. Every connection has a thread of its own, so one peer's silence or slow handshake
 * delays no other; the forwards of all connections take turns (one at a time; the backends may
 * use threads). Every receive has a deadline: the handshake's timeout_ms, then idle_timeout_ms.
 * Until a peer has authenticated (o->security) its messages may be a few kB at most; after the
 * Hello, as large as its sessions can legitimately send. Connections that fail, drivers that
 * break the protocol or die are logged (rlx_log_set_handler) and dropped. Fails early only when
 * the block, the credentials, the transport or the listen address cannot be set up, or the
 * address is not loopback and there are no credentials (security.insecure_listen). */
RLX_API rlx_status rlx_stage_serve(const rlx_model *m, const rlx_stage_options *o);

/* ---- driver ---- */

typedef struct rlx_driver_stage {
    const char *address; /* "host:port" the stage listens on */
    rlx_layer_range layers;
    /* Where the stage was configured, put before it in every message about it as
     * "deploy.yaml:7: stage 1 (...)"; source_file NULL for none. Copied. */
    const char *source_file;
    uint32_t source_line;
    /* Addresses of stand-by stages serving the same layers, tried in order (after the stage's
     * own address) when the stage is lost; copied. */
    const char *const *standby;
    uint32_t n_standby;
} rlx_driver_stage;

/* Starts a replacement for lost stage `stage` (a launcher restarts the process it started:
 * ends the old one, which may be stopped rather than dead, and starts another) and writes the
 * address it listens on, within timeout_ms. Returns RLX_OK, RLX_E_UNSUPPORTED for a stage the
 * caller did not start (the driver then tries its addresses), or another status with
 * rlx_error's message. Called on a driver thread. */
typedef rlx_status (*rlx_driver_restart_fn)(void *ctx, uint32_t stage, char *address, size_t size, uint32_t timeout_ms);

typedef struct rlx_driver_options {
    const rlx_plugin_handle *transport; /* a loaded transport plugin, borrowed for the driver's life */
    const char *transport_options;      /* may be NULL */
    const rlx_driver_stage *stages;     /* in pipeline order; copied */
    uint32_t n_stages;
    uint32_t kv_capacity;             /* positions wanted; 0 = the stages' default */
    uint32_t connect_timeout_ms;      /* 0 = RLX_DIST_CONNECT_TIMEOUT_MS */
    uint32_t timeout_ms;              /* 0 = RLX_DIST_TIMEOUT_MS */
    uint32_t compute_ms_per_position; /* 0 = RLX_DIST_COMPUTE_MS_PER_POSITION */
    /* 1: the last stage also returns the final-normed hidden rows (rlx_lm.hidden, for an MTP
     * speculator); a stage that cannot is refused at the handshake */
    uint32_t emit_hidden;
    /* > 0: every stage also keeps a batched KV cache of n_slots sequences of kv_capacity
     * positions for this driver, run by rlx_driver_submit (the batched engine's pipeline mode);
     * a stage that cannot is refused at the handshake */
    uint32_t n_slots;
    /* Recovery: a stage that dies, hangs up or stalls past its deadline mid-stream is replaced
     * (restarted through `restart` when given, else reconnected at its address or one of its
     * standby addresses once one answers the handshake) and every stream is replayed into it,
     * within recovery_timeout_ms (0 = RLX_DIST_RECOVERY_TIMEOUT_MS); no_recovery = 1 fails at
     * once instead, as before. */
    uint32_t recovery_timeout_ms;
    uint32_t no_recovery;
    rlx_driver_restart_fn restart; /* may be NULL */
    void *restart_ctx;
    rlx_dist_security security; /* the credentials the stages require (insecure_listen unused) */
} rlx_driver_options;

typedef struct rlx_driver rlx_driver;

RLX_API rlx_driver_options rlx_driver_options_default(void);

/* Reads the model's config.json (+ generation_config.json) and identity from model_dir, checks
 * the ranges (rlx_dist_check_ranges), connects to every stage and shakes hands. Fails with the
 * stage index and address in the message when a stage cannot be reached in time or refuses;
 * the message tells an address where nothing listens (refused until connect_timeout_ms) from
 * a peer that accepted the connection but never answered the handshake (within timeout_ms). */
RLX_API rlx_status rlx_driver_create(const char *model_dir, const rlx_driver_options *o, rlx_driver **out);

/* Ends the session on every stage still reachable (bounded by timeout_ms) and disconnects. */
RLX_API void rlx_driver_destroy(rlx_driver *d);

/* The rlx_lm of the pipeline (borrows d): one sequence whose KV cache lives in the stages.
 * forward sends the ids through the stages; truncate rolls every stage back; capacity is the
 * smallest the stages granted. The logits stay valid until the next call on d. */
RLX_API rlx_status rlx_driver_lm(rlx_driver *d, rlx_lm *out);

/* ---- slots: many sequences through the stages at once ----
 *
 * A driver created with n_slots runs steps of rows of many sequences (the Rows message): row r
 * is position positions[r] of the sequence in slot slots[r], fed token ids[r]; the rows of one
 * slot are at consecutive positions (a step with a gap is refused), and a slot's positions
 * before them must have been sent by earlier steps (or copied). The last stage returns the
 * logits of the rows out_rows[0..n_out).
 *
 * A step's last row of a slot ends the slot: the slot then holds positions 0 up to that row's,
 * and what lies beyond (rows of an earlier, longer sequence) counts as never written, to be
 * sent again before it is read; a copy of n positions likewise ends the slot it writes at n. A
 * linear-attention layer's state sums up all of a slot's positions and cannot be cut back, so
 * with such layers (a hybrid) a slot's next rows start at its end or at position 0. A lost stage
 * is rebuilt from this: each slot's positions from 0 to its end are replayed.
 *
 * Steps are pipelined: rlx_driver_submit queues a step and returns at once, a thread per stage
 * sends each step to its stage as soon as the stage finished the one before, and hands the
 * stage's rows on to the next stage's thread. So with two steps in flight stage 0 computes the
 * second while stage 1 computes the first. Every stage takes the steps in submission order,
 * and rlx_driver_wait hands the answers back in that order. A failed step (a stage that died,
 * stalled past its deadline or refused) makes the driver unusable as a failed forward does:
 * the steps behind it fail with the same message, naming the stage.
 *
 * rlx_driver_submit, rlx_driver_copy_slot and rlx_driver_wait are called from one thread (the
 * engine's worker); the rlx_lm of rlx_driver_lm must not be used while steps are in flight. */
typedef struct rlx_driver_rows {
    const int32_t *ids;       /* [n] token ids */
    const int32_t *positions; /* [n] */
    const int32_t *slots;     /* [n] */
    uint32_t n;
    const int32_t *out_rows; /* [n_out] rows whose logits come back, 1 <= n_out <= n */
    uint32_t n_out;
} rlx_driver_rows;

/* The slots the stages granted (0 for a driver without), and the positions of each. */
RLX_API uint32_t rlx_driver_n_slots(const rlx_driver *d);
RLX_API uint32_t rlx_driver_capacity(const rlx_driver *d);
/* Queues a step (the rows are copied) and returns its ticket; never waits for a stage. The
 * message names a row that is out of range. */
RLX_API rlx_status rlx_driver_submit(rlx_driver *d, const rlx_driver_rows *rows, uint64_t *ticket);
/* Queues a copy of positions [0, n) of slot `from` into slot `to` in every stage, after the steps
 * queued before it (a new sequence sharing a prompt prefix with another), and returns its
 * ticket; rlx_driver_wait hands it back in its turn. Until then slot `from` must not be
 * written (a lost stage is rebuilt from what the slots held). A linear-attention layer's state
 * is copied whole: with such layers n is slot `from`'s end. */
RLX_API rlx_status rlx_driver_copy_slot(rlx_driver *d, uint32_t from, uint32_t to, uint32_t n, uint64_t *ticket);
/* Waits for the oldest queued step or copy: its ticket and, for a step, its logits (n_out rows
 * of vocab floats, valid until the next rlx_driver_wait; NULL for a copy). The wait is bounded by the stages' deadlines: every
 * step queued ahead of it gets timeout_ms + rows * compute_ms_per_position per stage.
 * RLX_E_INVALID when no step is queued. */
RLX_API rlx_status rlx_driver_wait(rlx_driver *d, uint64_t *ticket, const float **logits);

/* Makes a recovery in progress, and any later one, give up at once (within a connection attempt
 * or a handshake's deadline): what waits on it fails with the stage's error. For a caller that
 * shuts down and will not wait out recovery_timeout_ms; any thread may call it. */
RLX_API void rlx_driver_stop_recovery(rlx_driver *d);

RLX_API const rlx_model_config *rlx_driver_config(const rlx_driver *d);
RLX_API uint32_t rlx_driver_n_stages(const rlx_driver *d);

typedef struct rlx_driver_stage_info {
    const char *address; /* borrowed from d */
    rlx_layer_range layers;
    const char *backend; /* as the stage reported it */
    uint64_t rss_bytes;  /* the stage's resident memory at the handshake */
    uint32_t kv_capacity;
} rlx_driver_stage_info;

RLX_API rlx_status rlx_driver_stage_info_of(const rlx_driver *d, uint32_t i, rlx_driver_stage_info *out);

/* Traffic since the driver was created: messages and bytes each way, and the wall time spent
 * waiting for the stages (compute plus transport). */
typedef struct rlx_driver_stats {
    uint64_t messages;
    uint64_t bytes_sent;
    uint64_t bytes_received;
    double wait_seconds;
    /* stages lost and replaced (their streams replayed), and the time that took */
    uint64_t recoveries;
    double recovery_seconds;      /* summed */
    double last_recovery_seconds; /* the latest */
} rlx_driver_stats;

RLX_API void rlx_driver_stats_of(const rlx_driver *d, rlx_driver_stats *out);

/* One stage's share since the driver was created: the forward steps it answered and the wall
 * time of each, from sending the step to the stage to its answer (the stage's compute plus both
 * transfers), and the bytes each way (handshakes and truncations included). */
typedef struct rlx_driver_stage_stats {
    uint64_t steps;
    double seconds;      /* summed over the steps */
    double last_seconds; /* the latest step */
    double max_seconds;
    uint64_t bytes_sent;
    uint64_t bytes_received;
} rlx_driver_stage_stats;

/* Both stats calls may run on another thread while this one drives (a server's /metrics). */
RLX_API rlx_status rlx_driver_stage_stats_of(const rlx_driver *d, uint32_t i, rlx_driver_stage_stats *out);

/* ---- deprecated, removed in rlx 0.3 ---- */

/* rlx_driver_stage_info_of, rlx_driver_stats_of and rlx_driver_stage_stats_of. */
RLX_API rlx_status rlx_driver_stage_info_get(const rlx_driver *d, uint32_t i, rlx_driver_stage_info *out);
RLX_API void rlx_driver_stats_get(const rlx_driver *d, rlx_driver_stats *out);
RLX_API rlx_status rlx_driver_stage_stats_get(const rlx_driver *d, uint32_t i, rlx_driver_stage_stats *out);

#ifdef __cplusplus
}
#endif
#endif
