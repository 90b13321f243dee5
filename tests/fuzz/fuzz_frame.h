/* The tcp transport's frame (plugins/transport-tcp/tcp_frame.c) as its fuzz targets and their seed
 * maker write it: a 24-byte header "RLXT", version 1, flags, payload length, payload CRC32C and
 * the header's own CRC32C. Computed here bit by bit, apart from the plugin's table and SSE4.2
 * versions, so a frame the plugin refuses for its checksum is the plugin's mistake. */
#ifndef RLX_FUZZ_FRAME_H
#define RLX_FUZZ_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_HEADER_SIZE 24
#define FRAME_FLAG_NO_CRC 0x0001u

static inline uint32_t frame_crc32c(const uint8_t *p, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static inline void frame_put(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t frame_get(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Writes the header of a frame carrying payload[len] into h (flags as given: with
 * FRAME_FLAG_NO_CRC the payload checksum is left 0). */
static inline void frame_header(uint8_t h[FRAME_HEADER_SIZE], const uint8_t *payload, uint64_t len, uint16_t flags) {
    h[0] = 'R', h[1] = 'L', h[2] = 'X', h[3] = 'T';
    frame_put(h + 4, 1, 2);
    frame_put(h + 6, flags, 2);
    frame_put(h + 8, len, 8);
    frame_put(h + 16, flags & FRAME_FLAG_NO_CRC ? 0 : frame_crc32c(payload, (size_t)len), 4);
    frame_put(h + 20, frame_crc32c(h, 20), 4);
}

/* Rewrites the header checksums of the frames in stream[n] in place, frame after frame by the
 * lengths the headers give, so that mutations of a header's fields reach what follows its
 * checksum check; a payload checksum is fixed too when the payload is all there. */
static inline void frame_fix_checksums(uint8_t *stream, size_t n) {
    size_t at = 0;
    while (n - at >= FRAME_HEADER_SIZE) {
        uint8_t *h = stream + at;
        const uint64_t len = frame_get(h + 8, 8);
        const int whole = len <= n - at - FRAME_HEADER_SIZE;
        if (whole && !(frame_get(h + 6, 2) & FRAME_FLAG_NO_CRC))
            frame_put(h + 16, frame_crc32c(h + FRAME_HEADER_SIZE, (size_t)len), 4);
        frame_put(h + 20, frame_crc32c(h, 20), 4);
        if (!whole)
            break;
        at += FRAME_HEADER_SIZE + (size_t)len;
    }
}

#endif
