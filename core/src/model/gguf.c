/* The GGUF header parser (gguf.h). Every length read from the file is checked against the bytes
 * left before it is used, so a corrupt or hostile header ends in an error naming the file, the
 * key or tensor and the byte offset, never in a read past the mapping or an allocation sized by
 * the file's say-so: counts are bounded by the bytes that could hold them. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf.h"
#include "util/alloc.h"
#include "weights_internal.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
/* llama.cpp's limit on tensor names (GGML_MAX_NAME) is 64 bytes with the NUL; keys have none,
 * but a key longer than this is a corrupt length field. */
#define GGUF_MAX_NAME 256
#define GGUF_MAX_KEY 65536

typedef struct reader {
    const char *path;
    const uint8_t *base, *p, *end;
} reader;

static size_t at(const reader *r) { return (size_t)(r->p - r->base); }

static rlx_status truncated(const reader *r, const char *what) {
    return rlx_error(RLX_E_FORMAT, "%s: truncated file: %s at byte %zu runs past its end (%zu bytes)", r->path, what,
                     at(r), (size_t)(r->end - r->base));
}

static rlx_status take(reader *r, size_t n, const char *what, const uint8_t **out) {
    if ((size_t)(r->end - r->p) < n)
        return truncated(r, what);
    *out = r->p;
    r->p += n;
    return RLX_OK;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static rlx_status rd_u32(reader *r, const char *what, uint32_t *out) {
    const uint8_t *p = NULL;
    rlx_status st = take(r, 4, what, &p);
    if (st == RLX_OK)
        *out = (uint32_t)le(p, 4);
    return st;
}

static rlx_status rd_u64(reader *r, const char *what, uint64_t *out) {
    const uint8_t *p = NULL;
    rlx_status st = take(r, 8, what, &p);
    if (st == RLX_OK)
        *out = le(p, 8);
    return st;
}

static rlx_status rd_str(reader *r, const char *what, size_t max, rlx__gguf_str *out) {
    uint64_t len;
    rlx_status st = rd_u64(r, what, &len);
    if (st != RLX_OK)
        return st;
    if (len > (uint64_t)(r->end - r->p))
        return rlx_error(RLX_E_FORMAT,
                         "%s: %s at byte %zu claims a length of %" PRIu64 " bytes, more than the file has left",
                         r->path, what, at(r) - 8, len);
    if (max && len > max)
        return rlx_error(RLX_E_FORMAT, "%s: %s at byte %zu is %" PRIu64 " bytes long (at most %zu)", r->path, what,
                         at(r) - 8, len, max);
    out->s = (const char *)r->p;
    out->len = (size_t)len;
    r->p += len;
    return RLX_OK;
}

static const char *const type_names[RLX_GGUF_TYPE_COUNT] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                            "bool", "string", "array", "u64", "i64", "f64"};

static size_t scalar_size(uint32_t type) {
    static const size_t sizes[RLX_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < RLX_GGUF_TYPE_COUNT ? sizes[type] : 0;
}

static int is_signed(uint32_t t) {
    return t == RLX_GGUF_I8 || t == RLX_GGUF_I16 || t == RLX_GGUF_I32 || t == RLX_GGUF_I64;
}

static int is_int(uint32_t t) {
    return is_signed(t) || t == RLX_GGUF_U8 || t == RLX_GGUF_U16 || t == RLX_GGUF_U32 || t == RLX_GGUF_U64;
}

static int64_t sign_extend(uint64_t v, size_t bytes) {
    if (bytes == 8)
        return (int64_t)v;
    const uint64_t sign = 1ull << (8 * bytes - 1);
    return (int64_t)((v ^ sign) - sign);
}

/* Reads the value of kv (whose key and type are set) at r. */
static rlx_status rd_value(reader *r, rlx__gguf_kv *kv) {
    char what[GGUF_MAX_NAME + 64];
    snprintf(what, sizeof what, "the value of key '%.*s'", GGUF_MAX_NAME, kv->key);
    if (kv->type >= RLX_GGUF_TYPE_COUNT)
        return rlx_error(RLX_E_FORMAT, "%s: key '%s' at byte %zu has unknown value type %u", r->path, kv->key,
                         at(r) - 4, kv->type);
    if (kv->type == RLX_GGUF_STRING)
        return rd_str(r, what, 0, &kv->v.str);
    if (kv->type != RLX_GGUF_ARRAY) {
        const uint8_t *p = NULL;
        const size_t n = scalar_size(kv->type);
        rlx_status st = take(r, n, what, &p);
        if (st != RLX_OK)
            return st;
        const uint64_t raw = le(p, (int)n);
        if (kv->type == RLX_GGUF_F32) {
            float f;
            uint32_t bits = (uint32_t)raw;
            memcpy(&f, &bits, sizeof f);
            kv->v.f = f;
        } else if (kv->type == RLX_GGUF_F64) {
            memcpy(&kv->v.f, &raw, sizeof kv->v.f);
        } else if (is_signed(kv->type)) {
            kv->v.i = sign_extend(raw, n);
        } else {
            kv->v.u = raw;
        }
        if (kv->type == RLX_GGUF_BOOL && raw > 1)
            return rlx_error(RLX_E_FORMAT, "%s: key '%s': bool value %" PRIu64 " is neither 0 nor 1", r->path, kv->key,
                             raw);
        return RLX_OK;
    }
    uint32_t elem;
    uint64_t n;
    rlx_status st = rd_u32(r, what, &elem);
    if (st == RLX_OK)
        st = rd_u64(r, what, &n);
    if (st != RLX_OK)
        return st;
    if (elem >= RLX_GGUF_TYPE_COUNT || elem == RLX_GGUF_ARRAY)
        return rlx_error(RLX_E_FORMAT,
                         "%s: key '%s': array elements of %s type %u (rlx reads arrays of scalars and strings)",
                         r->path, kv->key, elem == RLX_GGUF_ARRAY ? "nested array" : "unknown", elem);
    kv->v.arr.type = elem;
    kv->v.arr.n = n;
    kv->v.arr.data = r->p;
    const size_t left = (size_t)(r->end - r->p);
    if (elem != RLX_GGUF_STRING) {
        const size_t size = scalar_size(elem);
        if (n > left / size)
            return rlx_error(RLX_E_FORMAT,
                             "%s: key '%s': an array length of %" PRIu64
                             " %s values at byte %zu does not fit in the %zu bytes left",
                             r->path, kv->key, n, type_names[elem], at(r), left);
        r->p += n * size;
        return RLX_OK;
    }
    /* every string takes at least its 8-byte length */
    if (n > left / 8)
        return rlx_error(RLX_E_FORMAT,
                         "%s: key '%s': an array length of %" PRIu64
                         " strings at byte %zu does not fit in the %zu bytes left",
                         r->path, kv->key, n, at(r), left);
    for (uint64_t i = 0; i < n; i++) {
        rlx__gguf_str s;
        if ((st = rd_str(r, what, 0, &s)) != RLX_OK)
            return st;
    }
    return RLX_OK;
}

static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const rlx__gguf_kv *)a)->key, ((const rlx__gguf_kv *)b)->key);
}

static int cmp_kv_key(const void *key, const void *elem) { return strcmp(key, ((const rlx__gguf_kv *)elem)->key); }

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(const rlx__gguf_tensor *const *)a)->name, (*(const rlx__gguf_tensor *const *)b)->name);
}

/* A key or tensor name: no NUL inside (it is used as a C string). */
static rlx_status copy_name(const reader *r, const rlx__gguf_str *s, const char *what, char **out) {
    if (memchr(s->s, '\0', s->len))
        return rlx_error(RLX_E_FORMAT, "%s: %s '%.*s' contains a NUL byte", r->path, what, (int)strnlen(s->s, s->len),
                         s->s);
    if (!(*out = rlx__strndup(s->s, s->len)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", r->path);
    return RLX_OK;
}

/* The ggml tensor types: those rlx runs map to an rlx_dtype, the others are named in the error. */
static const struct {
    uint32_t ggml;
    const char *name;
    int dtype; /* -1: not run by rlx */
} ggml_types[] = {
    {0, "F32", RLX_DTYPE_F32},
    {1, "F16", RLX_DTYPE_F16},
    {2, "Q4_0", RLX_DTYPE_Q4_0},
    {3, "Q4_1", RLX_DTYPE_Q4_1},
    {6, "Q5_0", RLX_DTYPE_Q5_0},
    {7, "Q5_1", RLX_DTYPE_Q5_1},
    {8, "Q8_0", RLX_DTYPE_Q8_0},
    {9, "Q8_1", -1},
    {10, "Q2_K", -1},
    {11, "Q3_K", -1},
    {12, "Q4_K", RLX_DTYPE_Q4_K},
    {13, "Q5_K", RLX_DTYPE_Q5_K},
    {14, "Q6_K", RLX_DTYPE_Q6_K},
    {15, "Q8_K", -1},
    {16, "IQ2_XXS", -1},
    {17, "IQ2_XS", -1},
    {18, "IQ3_XXS", -1},
    {19, "IQ1_S", -1},
    {20, "IQ4_NL", -1},
    {21, "IQ3_S", -1},
    {22, "IQ2_S", -1},
    {23, "IQ4_XS", -1},
    {24, "I8", -1},
    {25, "I16", -1},
    {26, "I32", -1},
    {27, "I64", -1},
    {28, "F64", -1},
    {29, "IQ1_M", -1},
    {30, "BF16", RLX_DTYPE_BF16},
    {34, "TQ1_0", -1},
    {35, "TQ2_0", -1},
    {39, "MXFP4", -1},
};

static rlx_status tensor_type(const reader *r, const char *name, uint32_t ggml, uint32_t *dtype,
                              const char **type_name) {
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++) {
        if (ggml_types[i].ggml != ggml)
            continue;
        *type_name = ggml_types[i].name;
        if (ggml_types[i].dtype < 0)
            return rlx_error(RLX_E_UNSUPPORTED,
                             "%s: tensor '%s' has type %s, which rlx does not run (it runs F32, F16, BF16, Q8_0, "
                             "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K)",
                             r->path, name, ggml_types[i].name);
        *dtype = (uint32_t)ggml_types[i].dtype;
        return RLX_OK;
    }
    return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' has unknown type %u", r->path, name, ggml);
}

/* Reads one tensor info; the data pointer is set once the data area is known. */
static rlx_status rd_tensor(reader *r, rlx__gguf_tensor *t, uint64_t *offset) {
    rlx__gguf_str name;
    uint32_t n_dims, ggml;
    rlx_status st = rd_str(r, "a tensor name", GGUF_MAX_NAME, &name);
    if (st == RLX_OK)
        st = copy_name(r, &name, "tensor name", &t->name);
    if (st == RLX_OK)
        st = rd_u32(r, "a tensor's dimension count", &n_dims);
    if (st != RLX_OK)
        return st;
    if (n_dims < 1 || n_dims > 4)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' has %u dimensions (1 to 4)", r->path, t->name, n_dims);
    t->n_dims = n_dims;
    uint64_t numel = 1;
    for (uint32_t i = 0; i < n_dims; i++) {
        uint64_t d;
        if ((st = rd_u64(r, "a tensor dimension", &d)) != RLX_OK)
            return st;
        if (d == 0 || d > (uint64_t)INT64_MAX)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': dimension %u is %" PRIu64 "", r->path, t->name, i, d);
        if (numel > (uint64_t)INT64_MAX / d)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': its dimensions overflow, multiplying past 2^63 elements",
                             r->path, t->name);
        numel *= d;
        t->ne[i] = (int64_t)d;
    }
    for (uint32_t i = n_dims; i < 4; i++)
        t->ne[i] = 1;
    if ((st = rd_u32(r, "a tensor type", &ggml)) != RLX_OK || (st = rd_u64(r, "a tensor offset", offset)) != RLX_OK)
        return st;
    t->ggml_type = ggml;
    const char *type_name = "";
    if ((st = tensor_type(r, t->name, ggml, &t->dtype, &type_name)) != RLX_OK)
        return st;
    const size_t row = rlx_iface_row_bytes(t->dtype, t->ne[0]);
    if (row == 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: tensor '%s': rows of %" PRId64 " values are not a whole number of %s blocks of %" PRId64,
                         r->path, t->name, t->ne[0], type_name, rlx_iface_dtype_block(t->dtype));
    const uint64_t rows = numel / (uint64_t)t->ne[0];
    if (rows > SIZE_MAX / row)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' is larger than the address space", r->path, t->name);
    t->nbytes = (size_t)rows * row;
    return RLX_OK;
}

static rlx_status parse(rlx__gguf *g) {
    reader r = {.path = g->path, .base = g->map, .p = g->map, .end = g->map + g->size};
    const uint8_t *magic = NULL;
    rlx_status st = take(&r, 4, "the magic", &magic);
    if (st != RLX_OK)
        return st;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0)
        return rlx_error(RLX_E_FORMAT, "%s: bad magic (the file does not start with \"GGUF\"): not a GGUF file",
                         g->path);
    uint64_t n_tensors, n_kv;
    if ((st = rd_u32(&r, "the version", &g->version)) != RLX_OK)
        return st;
    if (g->version != 2 && g->version != 3)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: GGUF version %u (rlx reads versions 2 and 3)", g->path, g->version);
    if ((st = rd_u64(&r, "the tensor count", &n_tensors)) != RLX_OK ||
        (st = rd_u64(&r, "the metadata count", &n_kv)) != RLX_OK)
        return st;
    /* a key takes at least 12 bytes (length and type), a tensor info at least 32 */
    const size_t left = (size_t)(r.end - r.p);
    if (n_kv > left / 12 || n_tensors > left / 32)
        return rlx_error(RLX_E_FORMAT,
                         "%s: %" PRIu64 " metadata keys and %" PRIu64 " tensors cannot fit in a %zu-byte file", g->path,
                         n_kv, n_tensors, g->size);

    if (n_kv && !(g->kv = rlx__calloc((size_t)n_kv, sizeof *g->kv)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", g->path);
    for (; g->n_kv < n_kv; g->n_kv++) {
        rlx__gguf_kv *kv = &g->kv[g->n_kv];
        rlx__gguf_str key;
        if ((st = rd_str(&r, "a metadata key", GGUF_MAX_KEY, &key)) != RLX_OK ||
            (st = copy_name(&r, &key, "metadata key", &kv->key)) != RLX_OK)
            return st;
        if ((st = rd_u32(&r, "a value type", &kv->type)) != RLX_OK || (st = rd_value(&r, kv)) != RLX_OK) {
            g->n_kv++; /* its key is allocated */
            return st;
        }
    }
    if (g->n_kv)
        qsort(g->kv, g->n_kv, sizeof *g->kv, cmp_kv);
    for (size_t i = 1; i < g->n_kv; i++)
        if (strcmp(g->kv[i - 1].key, g->kv[i].key) == 0)
            return rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' appears twice", g->path, g->kv[i].key);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const rlx__gguf_kv *align = rlx__gguf_find(g, "general.alignment");
    if (align) {
        if (align->type != RLX_GGUF_U32 || align->v.u == 0 || (align->v.u & (align->v.u - 1)))
            return rlx_error(RLX_E_FORMAT, "%s: key 'general.alignment' must be a u32 power of two", g->path);
        g->alignment = (uint32_t)align->v.u;
    }

    uint64_t *offsets = NULL;
    if (n_tensors && (!(g->tensors = rlx__calloc((size_t)n_tensors, sizeof *g->tensors)) ||
                      !(offsets = rlx__malloc((size_t)n_tensors * sizeof *offsets)))) {
        free(offsets);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", g->path);
    }
    for (; g->n_tensors < n_tensors && st == RLX_OK; g->n_tensors++)
        st = rd_tensor(&r, &g->tensors[g->n_tensors], &offsets[g->n_tensors]);
    const size_t data_start = (at(&r) + g->alignment - 1) / g->alignment * g->alignment;
    g->data_offset = data_start;
    for (size_t i = 0; i < g->n_tensors && st == RLX_OK; i++) {
        rlx__gguf_tensor *t = &g->tensors[i];
        if (offsets[i] % g->alignment)
            st = rlx_error(RLX_E_FORMAT, "%s: tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %u",
                           g->path, t->name, offsets[i], g->alignment);
        else if (data_start > g->size || offsets[i] > g->size - data_start ||
                 t->nbytes > g->size - data_start - offsets[i])
            st = rlx_error(RLX_E_FORMAT,
                           "%s: tensor '%s': its %zu bytes at offset %" PRIu64 " of the data area (byte %zu) run past "
                           "the end of the %zu-byte file (truncated file?)",
                           g->path, t->name, t->nbytes, offsets[i], data_start, g->size);
        else
            t->data = g->map + data_start + offsets[i];
    }
    free(offsets);
    if (st != RLX_OK || g->n_tensors < 2)
        return st;
    /* names are checked for duplicates here; overlapping data when the weights index them */
    rlx__gguf_tensor **order = rlx__malloc(g->n_tensors * sizeof *order);
    if (!order)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", g->path);
    for (size_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof *order, cmp_tensor_ptr);
    for (size_t i = 1; i < g->n_tensors && st == RLX_OK; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            st = rlx_error(RLX_E_FORMAT, "%s: tensor '%s' appears twice", g->path, order[i]->name);
    free(order);
    return st;
}

/* A header parsed from size bytes at data, which the result borrows (owned: unmapped at close). */
static rlx_status open_bytes(const char *path, const void *data, size_t size, int owned, rlx__gguf **out) {
    *out = NULL;
    rlx__gguf *g = rlx__calloc(1, sizeof *g);
    if (!g || !(g->path = rlx__strdup(path))) {
        free(g);
        if (owned)
            munmap((void *)data, size);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    }
    g->map = data;
    g->size = size;
    g->owned = owned;
    rlx_status st = parse(g);
    if (st != RLX_OK) {
        rlx__gguf_close(g);
        return st;
    }
    *out = g;
    return RLX_OK;
}

rlx_status rlx__gguf_parse(const char *path, const void *data, size_t size, rlx__gguf **out) {
    return open_bytes(path, data, size, 0, out);
}

rlx_status rlx__gguf_open(const char *path, rlx__gguf **out) {
    *out = NULL;
    rlx__wfile f = {.path = rlx__strdup(path)};
    if (!f.path)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    rlx_status st = rlx__wfile_map(&f, 4, "the GGUF magic");
    free(f.path);
    return st == RLX_OK ? open_bytes(path, f.map, f.size, 1, out) : st;
}

void rlx__gguf_release_header(const rlx__gguf *g) {
    /* the page holding the data area's start may hold tensor bytes too, so it stays */
    if (g->owned)
        rlx__drop_mapped(g->map, g->data_offset);
}

void rlx__gguf_close(rlx__gguf *g) {
    if (!g)
        return;
    if (g->owned && g->map)
        munmap((void *)g->map, g->size);
    for (size_t i = 0; i < g->n_kv; i++)
        free(g->kv[i].key);
    for (size_t i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->path);
    free(g);
}

/* Printable ASCII as itself, any other byte as \xNN: what a bad magic shows. */
static void show_bytes(const unsigned char *b, size_t n, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && used + 5 < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\'' ? "%c" : "\\x%02x",
                                 b[i]);
}

rlx_status rlx__gguf_not_gguf(const char *path) {
    unsigned char magic[4];
    FILE *f = fopen(path, "rb");
    const size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f)
        fclose(f);
    char shown[24];
    show_bytes(magic, n, shown, sizeof shown);
    if (n < 4)
        return rlx_error(RLX_E_INVALID,
                         "%s is a file, but neither a GGUF file nor a model directory (config.json and *.safetensors): "
                         "it has %zu bytes, fewer than the 4 of the GGUF magic",
                         path, n);
    return rlx_error(RLX_E_INVALID,
                     "%s is a file, but neither a GGUF file nor a model directory (config.json and *.safetensors): "
                     "it starts with '%s', not the GGUF magic 'GGUF'",
                     path, shown);
}

int rlx__is_gguf(const char *path) {
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    const int is = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, GGUF_MAGIC, 4) == 0;
    if (f)
        fclose(f);
    return is;
}

const rlx__gguf_kv *rlx__gguf_find(const rlx__gguf *g, const char *key) {
    return g->n_kv ? bsearch(key, g->kv, g->n_kv, sizeof *g->kv, cmp_kv_key) : NULL;
}

/* The kv of key, or the status for a missing one. */
static rlx_status lookup(const rlx__gguf *g, const char *key, int optional, const rlx__gguf_kv **out) {
    if ((*out = rlx__gguf_find(g, key)))
        return RLX_OK;
    return optional ? RLX_E_NOT_FOUND : rlx_error(RLX_E_FORMAT, "%s: missing metadata key '%s'", g->path, key);
}

static rlx_status wrong_type(const rlx__gguf *g, const rlx__gguf_kv *kv, const char *want) {
    return rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' is a %s, not %s", g->path, kv->key, type_names[kv->type],
                     want);
}

rlx_status rlx__gguf_int(const rlx__gguf *g, const char *key, int optional, int64_t *out) {
    const rlx__gguf_kv *kv;
    rlx_status st = lookup(g, key, optional, &kv);
    if (st != RLX_OK)
        return st;
    if (!is_int(kv->type))
        return wrong_type(g, kv, "an integer");
    if (!is_signed(kv->type) && kv->v.u > (uint64_t)INT64_MAX)
        return rlx_error(RLX_E_FORMAT, "%s: metadata key '%s': %" PRIu64 " is out of range", g->path, key, kv->v.u);
    *out = is_signed(kv->type) ? kv->v.i : (int64_t)kv->v.u;
    return RLX_OK;
}

rlx_status rlx__gguf_float(const rlx__gguf *g, const char *key, int optional, double *out) {
    const rlx__gguf_kv *kv;
    rlx_status st = lookup(g, key, optional, &kv);
    if (st != RLX_OK)
        return st;
    if (kv->type == RLX_GGUF_F32 || kv->type == RLX_GGUF_F64)
        *out = kv->v.f;
    else if (is_int(kv->type))
        *out = is_signed(kv->type) ? (double)kv->v.i : (double)kv->v.u;
    else
        return wrong_type(g, kv, "a number");
    return RLX_OK;
}

rlx_status rlx__gguf_bool(const rlx__gguf *g, const char *key, int optional, int *out) {
    const rlx__gguf_kv *kv;
    rlx_status st = lookup(g, key, optional, &kv);
    if (st != RLX_OK)
        return st;
    if (kv->type != RLX_GGUF_BOOL)
        return wrong_type(g, kv, "a bool");
    *out = kv->v.u != 0;
    return RLX_OK;
}

rlx_status rlx__gguf_string(const rlx__gguf *g, const char *key, int optional, rlx__gguf_str *out) {
    const rlx__gguf_kv *kv;
    rlx_status st = lookup(g, key, optional, &kv);
    if (st != RLX_OK)
        return st;
    if (kv->type != RLX_GGUF_STRING)
        return wrong_type(g, kv, "a string");
    *out = kv->v.str;
    return RLX_OK;
}

rlx_status rlx__gguf_array(const rlx__gguf *g, const char *key, uint32_t elem, int optional, const rlx__gguf_kv **out) {
    rlx_status st = lookup(g, key, optional, out);
    if (st != RLX_OK)
        return st;
    const rlx__gguf_kv *kv = *out;
    const int ok =
        kv->type == RLX_GGUF_ARRAY && (elem == RLX_GGUF_I64 ? is_int(kv->v.arr.type) : kv->v.arr.type == elem);
    if (!ok)
        return rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' is not an array of %s", g->path, key,
                         elem == RLX_GGUF_I64 ? "integers" : type_names[elem]);
    return RLX_OK;
}

int64_t rlx__gguf_array_int(const rlx__gguf_kv *kv, uint64_t i) {
    const size_t n = scalar_size(kv->v.arr.type);
    const uint64_t raw = le(kv->v.arr.data + i * n, (int)n);
    return is_signed(kv->v.arr.type) ? sign_extend(raw, n) : (int64_t)raw;
}

rlx__gguf_str rlx__gguf_next_string(const uint8_t **cursor) {
    rlx__gguf_str s = {.len = (size_t)le(*cursor, 8), .s = (const char *)*cursor + 8};
    *cursor += 8 + s.len;
    return s;
}
