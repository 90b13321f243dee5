/* GGUF files as llama.cpp writes them (versions 2 and 3): the header parsed and validated,
 * the metadata values and the tensor data left where they are mapped.
 *
 * Layout (little-endian): magic "GGUF", uint32 version, uint64 tensor count, uint64 metadata
 * count; the metadata as (string key, uint32 value type, value); the tensor infos as (string
 * name, uint32 n_dims, uint64 dims[n_dims] innermost first, uint32 ggml type, uint64 offset); then,
 * at the next multiple of general.alignment (default 32), the data area the offsets index. A
 * string is a uint64 length and that many bytes (no NUL); an array is a uint32 element type, a
 * uint64 count and the elements. */
#ifndef RLX_GGUF_H
#define RLX_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/model.h"
#include "rlx/status.h"

enum {
    RLX_GGUF_U8 = 0,
    RLX_GGUF_I8 = 1,
    RLX_GGUF_U16 = 2,
    RLX_GGUF_I16 = 3,
    RLX_GGUF_U32 = 4,
    RLX_GGUF_I32 = 5,
    RLX_GGUF_F32 = 6,
    RLX_GGUF_BOOL = 7,
    RLX_GGUF_STRING = 8,
    RLX_GGUF_ARRAY = 9,
    RLX_GGUF_U64 = 10,
    RLX_GGUF_I64 = 11,
    RLX_GGUF_F64 = 12,
    RLX_GGUF_TYPE_COUNT
};

typedef struct rlx__gguf_str {
    const char *s; /* inside the mapping, not NUL-terminated */
    size_t len;
} rlx__gguf_str;

typedef struct rlx__gguf_kv {
    char *key;     /* NUL-terminated copy */
    uint32_t type; /* RLX_GGUF_* */
    union {
        uint64_t u; /* unsigned integers and bool */
        int64_t i;  /* signed integers */
        double f;   /* F32 and F64 */
        rlx__gguf_str str;
        struct {
            uint32_t type; /* element type, never ARRAY */
            uint64_t n;
            const uint8_t *data; /* the first element in the mapping */
        } arr;
    } v;
} rlx__gguf_kv;

typedef struct rlx__gguf_tensor {
    char *name; /* NUL-terminated copy */
    uint32_t ggml_type;
    uint32_t dtype; /* rlx_dtype */
    uint32_t n_dims;
    int64_t ne[4]; /* GGUF order: ne[0] innermost */
    const uint8_t *data;
    size_t nbytes;
} rlx__gguf_tensor;

typedef struct rlx__gguf {
    char *path;
    const uint8_t *map;
    size_t size;
    int owned; /* map is this header's mapping of the file */
    uint32_t version;
    uint32_t alignment;
    size_t data_offset; /* where the data area starts: the header is the bytes before it */
    rlx__gguf_kv *kv;   /* sorted by key */
    size_t n_kv;
    rlx__gguf_tensor *tensors; /* in file order */
    size_t n_tensors;
} rlx__gguf;

/* Maps and validates the GGUF file at path: magic, version, every length against the file's
 * size, value types, no key or tensor name twice, known tensor types, dimensions (1 to 4, each
 * positive, a whole number of blocks in the innermost), offsets aligned and inside the file.
 * Any problem is RLX_E_FORMAT naming the file and the key or tensor (RLX_E_UNSUPPORTED for a
 * tensor type rlx does not run). */
rlx_status rlx__gguf_open(const char *path, rlx__gguf **out);
void rlx__gguf_close(rlx__gguf *g);

/* Drops this process's resident pages of the header (all but the page where the data area
 * starts) from an opened file's mapping: the metadata is read once, at load (Qwen3's 151k token
 * and merge strings are about 5.6 MiB), and would otherwise stay counted in the RSS beside the
 * weights. Pointers into the header stay valid: a later read faults its pages back in from the
 * file. A header from rlx__gguf_parse (bytes the caller holds) is left alone. */
void rlx__gguf_release_header(const rlx__gguf *g);

/* The same checks on a header already in memory (size bytes at data, borrowed until close):
 * for fuzzing, and for callers that hold the bytes. path only names it in errors. */
rlx_status rlx__gguf_parse(const char *path, const void *data, size_t size, rlx__gguf **out);

/* True when the file at path starts with GGUF's magic. */
int rlx__is_gguf(const char *path);

/* The error for a path that is a regular file but not a GGUF file (RLX_E_INVALID): a model is a
 * GGUF file or a directory, so the message says both and shows the file's first bytes, which
 * tells a truncated or mistyped file from, say, a tokenizer.json given as the model. */
rlx_status rlx__gguf_not_gguf(const char *path);

/* The value of key, or NULL. */
const rlx__gguf_kv *rlx__gguf_find(const rlx__gguf *g, const char *key);

/* Typed reads: a missing key is RLX_E_NOT_FOUND with no message recorded when optional, else
 * RLX_E_FORMAT naming it; a value of the wrong type (or an integer out of range) is RLX_E_FORMAT. */
rlx_status rlx__gguf_int(const rlx__gguf *g, const char *key, int optional, int64_t *out);
rlx_status rlx__gguf_float(const rlx__gguf *g, const char *key, int optional, double *out);
rlx_status rlx__gguf_bool(const rlx__gguf *g, const char *key, int optional, int *out);
rlx_status rlx__gguf_string(const rlx__gguf *g, const char *key, int optional, rlx__gguf_str *out);
/* An array of element type elem (RLX_GGUF_*; integer arrays of any integer type when elem is
 * RLX_GGUF_I64), as its kv. */
rlx_status rlx__gguf_array(const rlx__gguf *g, const char *key, uint32_t elem, int optional, const rlx__gguf_kv **out);

/* Element i of an integer array (any integer element type), widened. */
int64_t rlx__gguf_array_int(const rlx__gguf_kv *kv, uint64_t i);

/* The strings of a string array in order: *cursor starts at kv->v.arr.data and advances. The
 * array was validated at open, so this cannot run past the file. */
rlx__gguf_str rlx__gguf_next_string(const uint8_t **cursor);

#endif
