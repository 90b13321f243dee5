/* What fuzz_stage and its seed maker agree on: the two stages the target serves and how an
 * input is laid out.
 *
 * Input: a mode byte, then the rest.
 *   MODE_ENVELOPES set: the rest is records (a u16 little-endian length, then that many bytes),
 *     each sent as one properly framed message, so protobuf decoding and the message handling
 *     are reached with whatever the records hold (a seed's first record is a valid Hello).
 *   MODE_ENVELOPES clear: the target sends a valid Hello first (with MODE_SLOTS(mode) batch
 *     slots), then the rest as raw bytes; with MODE_FIX_CHECKSUMS their frame checksums are made
 *     right first (fuzz_frame.h), so mutated frames get past the header check.
 *   MODE_TAIL picks the stage serving layers 1 to the last (hidden states in) instead of the one
 *   serving every layer (token ids in, logits out). */
#ifndef RLX_FUZZ_STAGE_H
#define RLX_FUZZ_STAGE_H

#define MODE_ENVELOPES 1u
#define MODE_TAIL 2u
#define MODE_FIX_CHECKSUMS 4u
#define MODE_SLOTS(mode) (((mode) >> 3) & 3u)
#define MODE_WITH_SLOTS(n) ((unsigned)(n) << 3)

/* The layers of the stage an input talks to. */
static inline void stage_layers(unsigned mode, unsigned n_layers, unsigned *start, unsigned *end) {
    *start = mode & MODE_TAIL ? 1 : 0;
    *end = n_layers;
}

#endif
