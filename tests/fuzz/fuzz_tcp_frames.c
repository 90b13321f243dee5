/* libFuzzer target: the tcp transport's frame decoder (plugins/transport-tcp/tcp_frame.c) on an
 * arbitrary byte stream. The plugin is compiled into this target so that a connection can wrap
 * one end of a socketpair (tcp_conn_create, the plugin's only internal used here); the instance
 * comes from the plugin's own descriptor with max_message=1M, so lengths on both sides of the
 * limit are reached. Input: a mode byte, then the stream. With mode bit 0 the frames' checksums
 * are made right first (fuzz_frame.h), so mutated lengths, flags and versions get past the
 * header checksum; with bit 1 the connection's limit is lowered to LOWERED_MAX by transport
 * iface 1.1's set_max_message (when the plugin has it), as a stage does before its peer has
 * authenticated. The stream is written to the socket, the socket shut, and recv called until it
 * fails; each message must be within the limit. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_frame.h"
#include "rlx/plugin.h"
#include "tcp_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_MESSAGE = 1 << 20, LOWERED_MAX = 4096, RECV_TIMEOUT_MS = 1000 };

static const rlx_host *fuzz_host;
static const rlx_transport_iface *iface;
static void *instance;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_host = rlx_host_table();
    const rlx_plugin *p = rlx_plugin_entry(fuzz_host);
    iface = p->iface;
    if (iface->open(fuzz_host, "max_message=1M", &instance) != RLX_OK) {
        fprintf(stderr, "fuzz_tcp_frames: tcp open: %s\n", rlx_last_error());
        exit(2);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    uint8_t *stream = malloc(size);
    int fds[2];
    if (!stream || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) != 0) {
        perror("fuzz_tcp_frames");
        abort();
    }
    const size_t n = size - 1;
    memcpy(stream, data + 1, n);
    if (data[0] & 1)
        frame_fix_checksums(stream, n);
    /* What does not fit in the socket's buffer is dropped: the stream then ends there. */
    size_t sent = 0;
    while (sent < n) {
        const ssize_t k = send(fds[0], stream + sent, n - sent, MSG_NOSIGNAL);
        if (k <= 0)
            break;
        sent += (size_t)k;
    }
    shutdown(fds[0], SHUT_WR);
    tcp_conn *c;
    if (tcp_conn_create(instance, fds[1], "fuzz", &c) != RLX_OK) {
        fprintf(stderr, "fuzz_tcp_frames: %s\n", rlx_last_error());
        abort();
    }
    uint64_t limit = MAX_MESSAGE;
    if ((data[0] & 2) && iface->size > offsetof(rlx_transport_iface, set_max_message) && iface->set_max_message) {
        if (iface->set_max_message(instance, c, LOWERED_MAX) != RLX_OK) {
            fprintf(stderr, "fuzz_tcp_frames: set_max_message: %s\n", rlx_last_error());
            abort();
        }
        limit = LOWERED_MAX;
    }
    size_t received = 0;
    void *message;
    size_t len;
    while (iface->recv(instance, c, &message, &len, RECV_TIMEOUT_MS) == RLX_OK) {
        if (len > limit || len + FRAME_HEADER_SIZE > sent - received) {
            fprintf(stderr, "recv returned %zu bytes (limit %llu) after %zu of %zu bytes sent\n", len,
                    (unsigned long long)limit, received, sent);
            abort();
        }
        received += FRAME_HEADER_SIZE + len;
        fuzz_host->free(message);
    }
    iface->conn_close(instance, c);
    close(fds[0]);
    free(stream);
    return 0;
}
