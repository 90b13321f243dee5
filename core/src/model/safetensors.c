/* The safetensors reader: maps model.safetensors, or every shard named by
 * model.safetensors.index.json, validates each header and indexes the tensors by name.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 *   {"<name>": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, "__metadata__": {...}}
 * (possibly padded with spaces), then the data area that the offsets index. Files are mapped whole,
 * read-only and MAP_PRIVATE without MAP_POPULATE, so opening a 60 GB model costs page tables, not
 * RAM, and only the pages of tensors actually read become resident. The descriptor is closed right
 * after mmap; the mapping keeps the file alive.
 *
 * Alignment: the format promises none and writers pack tensors back to back after a header of any
 * length, so rlx_weight.data is only byte-aligned (a BF16 tensor may start at an odd multiple of 2).
 * The pointers are handed out as they are; kernels read them with memcpy or unaligned-safe loads. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "model_internal.h"
#include "weights_internal.h"
#include "rlx/model.h"
#include "util/alloc.h"
#include "util/json.h"

/* The reference implementation's limit: a longer header means a corrupt length field. */
#define HEADER_MAX 100000000u

static const struct {
    const char *name;
    rlx_dtype dtype;
    uint64_t size;
} dtypes[] = {{"F32", RLX_DTYPE_F32, 4}, {"BF16", RLX_DTYPE_BF16, 2}, {"F16", RLX_DTYPE_F16, 2}};

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static int cmp_file_key(const void *key, const void *elem) { return strcmp(key, ((const rlx__wfile *)elem)->name); }

// ---- one file

/* Dimensions of a tensor the header may give (those past RLX_MAX_DIMS are folded, parse_tensor);
 * beyond this a header is nonsense rather than a model. */
#define ST_MAX_DIMS 16

/* Fills t from the header entry of one tensor; data is the file's data area of data_size bytes. */
static rlx_status parse_tensor(const rlx__wfile *f, const cJSON *entry, const uint8_t *data, uint64_t data_size,
                               rlx_weight *t) {
    const char *name = entry->string;
    if (!cJSON_IsObject(entry))
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': header entry is not a JSON object", f->path, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offsets ? "data_offsets" : NULL;
    if (missing)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': missing field '%s'", f->path, name, missing);

    if (!cJSON_IsString(dtype))
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': field 'dtype' is not a string", f->path, name);
    size_t k = 0;
    while (k < sizeof dtypes / sizeof dtypes[0] && strcmp(dtype->valuestring, dtypes[k].name) != 0)
        k++;
    if (k == sizeof dtypes / sizeof dtypes[0])
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': unsupported dtype '%.32s' (rlx reads F32, BF16 and F16)",
                         f->path, name, dtype->valuestring);

    if (!cJSON_IsArray(shape))
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': field 'shape' is not a list", f->path, name);
    int n_dims = cJSON_GetArraySize(shape);
    if (n_dims > ST_MAX_DIMS)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': %d dimensions, more than the %d a safetensors reader takes",
                         f->path, name, n_dims, ST_MAX_DIMS);
    /* numel saturates instead of wrapping: a saturated count can never match a real byte range,
     * while a dimension of 0 still correctly makes it 0. */
    uint64_t numel = 1, dims[ST_MAX_DIMS];
    int i = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        if (!rlx__json_u64(dim, &dims[i]))
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", f->path, name,
                             i);
        numel = dims[i] != 0 && numel > UINT64_MAX / dims[i] ? UINT64_MAX : numel * dims[i];
        i++;
    }
    /* a tensor of more dimensions than rlx_weight holds (a vision tower's Conv3d weight, which no
     * block reads) keeps its elements with the leading dimensions folded into the first */
    const int folded = n_dims > RLX_MAX_DIMS ? n_dims - RLX_MAX_DIMS : 0;
    uint64_t first = n_dims ? dims[0] : 1;
    for (int d = 1; d <= folded; d++)
        first = dims[d] != 0 && first > UINT64_MAX / dims[d] ? UINT64_MAX : first * dims[d];
    for (int d = 0; d < RLX_MAX_DIMS; d++)
        t->shape[d] = d >= n_dims - folded ? 1 : (int64_t)(d == 0 ? first : dims[d + folded]);
    if (folded)
        n_dims = RLX_MAX_DIMS;

    uint64_t begin, end;
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 || !rlx__json_u64(offsets->child, &begin) ||
        !rlx__json_u64(offsets->child->next, &end))
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': field 'data_offsets' is not [begin, end] with integers >= 0",
                         f->path, name);
    if (begin > end)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "]: end is before begin",
                         f->path, name, begin, end);
    if (end > data_size)
        return rlx_error(RLX_E_FORMAT,
                         "%s: tensor '%s': data_offsets end at %" PRIu64 ", past the %" PRIu64
                         "-byte data area (truncated file?)",
                         f->path, name, end, data_size);
    uint64_t want = numel > UINT64_MAX / dtypes[k].size ? UINT64_MAX : numel * dtypes[k].size;
    if (end - begin != want)
        return rlx_error(RLX_E_FORMAT,
                         "%s: tensor '%s': data_offsets span %" PRIu64 " bytes, but %" PRIu64
                         " %s elements take %" PRIu64,
                         f->path, name, end - begin, numel, dtypes[k].name, want);

    t->dtype = dtypes[k].dtype;
    t->n_dims = (uint32_t)n_dims;
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    t->file = f->path;
    return RLX_OK;
}

/* Appends the tensors of a parsed header (an object) to w; data is the file's data area. */
static rlx_status add_tensors(rlx_weights *w, rlx__wfile *f, const cJSON *header, const uint8_t *data,
                              uint64_t data_size) {
    size_t count = 0, name_bytes = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, header) {
        if (strcmp(entry->string, "__metadata__") != 0) {
            count++;
            name_bytes += strlen(entry->string) + 1;
        }
    }
    if (count == 0) /* a model file without weights is a mistake, and the index sorts none */
        return rlx_error(RLX_E_FORMAT, "%s: holds no tensors (its header lists %s)", f->path,
                         cJSON_GetArraySize(header) ? "only __metadata__" : "nothing");
    rlx_weight *grown = rlx__realloc(w->tensors, (w->n_tensors + count) * sizeof *grown);
    if (!grown)
        return rlx_error(RLX_E_NOMEM, "%s: cannot allocate the index of %zu tensors", f->path, count);
    w->tensors = grown;
    f->names = rlx__malloc(name_bytes);
    if (!f->names)
        return rlx_error(RLX_E_NOMEM, "%s: cannot allocate %zu bytes of tensor names", f->path, name_bytes);

    rlx_weight *first = w->tensors + w->n_tensors;
    char *name = f->names;
    size_t n = 0;
    cJSON_ArrayForEach(entry, header) {
        if (strcmp(entry->string, "__metadata__") == 0)
            continue;
        rlx_weight *t = &first[n];
        memset(t, 0, sizeof *t);
        rlx_status st = parse_tensor(f, entry, data, data_size, t);
        if (st != RLX_OK)
            return st;
        size_t len = strlen(entry->string) + 1;
        memcpy(name, entry->string, len);
        t->name = name;
        name += len;
        n++;
    }
    rlx_status st = rlx__weights_check_file(f->path, first, n);
    if (st == RLX_OK)
        w->n_tensors += n;
    return st;
}

/* Validates the header of a mapped file and appends its tensors to w. */
static rlx_status parse_header(rlx_weights *w, rlx__wfile *f) {
    const uint8_t *base = f->map;
    uint64_t header_len = 0;
    for (int i = 0; i < 8; i++)
        header_len |= (uint64_t)base[i] << (8 * i);
    if (header_len > HEADER_MAX)
        return rlx_error(RLX_E_FORMAT, "%s: header length %" PRIu64 " exceeds the %u-byte limit (not safetensors?)",
                         f->path, header_len, HEADER_MAX);
    if (header_len > f->size - 8)
        return rlx_error(RLX_E_FORMAT, "%s: header length %" PRIu64 " runs past the end of the %zu-byte file", f->path,
                         header_len, f->size);

    rlx_status st = RLX_OK;
    const char *json = (const char *)base + 8, *json_end = json + header_len, *end = NULL;
    cJSON *header = cJSON_ParseWithLengthOpts(json, (size_t)header_len, &end, 0);
    if (!header) {
        st = rlx_error(RLX_E_FORMAT, "%s: header is not valid JSON (error near byte %zu of the file)", f->path,
                       (size_t)((end ? end : json) - (const char *)base));
        goto fail;
    }
    for (; end < json_end; end++) {
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            st = rlx_error(RLX_E_FORMAT, "%s: unexpected bytes after the header JSON at byte %zu of the file", f->path,
                           (size_t)(end - (const char *)base));
            goto fail;
        }
    }
    if (!cJSON_IsObject(header)) {
        st = rlx_error(RLX_E_FORMAT, "%s: header is not a JSON object", f->path);
        goto fail;
    }
    st = add_tensors(w, f, header, (const uint8_t *)json_end, f->size - 8 - header_len);
fail:
    cJSON_Delete(header);
    return st;
}

/* Appends a file entry for dir/name to w (w->files has room), maps it and reads its header. */
static rlx_status add_file(rlx_weights *w, const char *dir, const char *name) {
    rlx__wfile *f = &w->files[w->n_files];
    memset(f, 0, sizeof *f);
    f->path = rlx__path_join(dir, name);
    if (!f->path)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", dir);
    f->name = f->path + strlen(f->path) - strlen(name);
    w->n_files++; /* from here rlx_weights_close releases the entry */
    rlx_status st = rlx__wfile_map(f, 8, "the 8-byte header length");
    return st == RLX_OK ? parse_header(w, f) : st;
}

// ---- sharded checkpoints

/* Maps each distinct shard of the index's weight_map once, in name order. */
static rlx_status open_shards(rlx_weights *w, const char *dir, const char *index_path, const cJSON *index) {
    if (!cJSON_IsObject(index))
        return rlx_error(RLX_E_FORMAT, "%s: the top level is not a JSON object", index_path);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!map)
        return rlx_error(RLX_E_FORMAT, "%s: missing required field 'weight_map'", index_path);
    if (!cJSON_IsObject(map) || !map->child)
        return rlx_error(RLX_E_FORMAT, "%s: field 'weight_map' is not a non-empty object", index_path);

    size_t n = (size_t)cJSON_GetArraySize(map), n_shards = 0;
    const char **shards = rlx__malloc(n * sizeof *shards);
    if (!shards)
        return rlx_error(RLX_E_NOMEM, "%s: cannot allocate %zu shard names", index_path, n);
    rlx_status st = RLX_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        /* Shards live in the model directory; a path in the index must not reach outside it. */
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
            strcmp(e->valuestring, ".") == 0 || strcmp(e->valuestring, "..") == 0) {
            st = rlx_error(RLX_E_FORMAT, "%s: field 'weight_map': tensor '%s' is not mapped to a file name", index_path,
                           e->string);
            goto fail;
        }
        shards[n_shards++] = e->valuestring;
    }
    qsort(shards, n_shards, sizeof *shards, cmp_str);
    size_t n_unique = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (n_unique == 0 || strcmp(shards[n_unique - 1], shards[i]) != 0)
            shards[n_unique++] = shards[i];

    w->files = rlx__calloc(n_unique, sizeof *w->files);
    if (!w->files) {
        st = rlx_error(RLX_E_NOMEM, "%s: cannot allocate %zu shards", index_path, n_unique);
        goto fail;
    }
    for (size_t i = 0; i < n_unique && st == RLX_OK; i++)
        st = add_file(w, dir, shards[i]);
fail:
    free(shards);
    return st;
}

/* Every tensor the index lists must be in the shard it names. Tensors a shard holds beyond the
 * index are kept: the shard headers, not the index, are the source of truth for the data. */
static rlx_status check_index(const rlx_weights *w, const char *index_path, const cJSON *index) {
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(index, "weight_map")) {
        const rlx__wfile *f = bsearch(e->valuestring, w->files, w->n_files, sizeof *w->files, cmp_file_key);
        const rlx_weight *t = rlx_weights_find(w, e->string);
        if (!t)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' is mapped to %s, which does not contain it", index_path,
                             e->string, f->path);
        if (t->file != f->path)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' is mapped to %s but stored in %s", index_path, e->string,
                             f->path, t->file);
    }
    return RLX_OK;
}

// ---- public API

rlx_status rlx__weights_open_file(const char *path, rlx_weights **out) {
    *out = NULL;
    const char *slash = strrchr(path, '/');
    char *dir = slash ? rlx__strndup(path, (size_t)(slash - path)) : rlx__strdup(".");
    rlx_weights *w = rlx__calloc(1, sizeof *w);
    rlx_status st = RLX_OK;
    if (!dir || !w || !(w->files = rlx__calloc(1, sizeof *w->files)))
        st = rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    if (st == RLX_OK)
        st = add_file(w, dir, slash ? slash + 1 : path);
    if (st == RLX_OK)
        st = rlx__weights_index(w);
    free(dir);
    if (st != RLX_OK) {
        rlx_weights_close(w);
        return st;
    }
    *out = w;
    return RLX_OK;
}

/* What a model directory without safetensors holds instead: GGUF files are named, as a user who
 * gives the folder a GGUF download landed in means one of them. */
static rlx_status no_safetensors(const char *model_dir) {
    char found[512] = "";
    size_t n_found = 0;
    DIR *d = opendir(model_dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0)
            continue;
        if (n_found++ < 4) {
            size_t used = strlen(found);
            snprintf(found + used, sizeof found - used, "%s%s", used ? ", " : "", e->d_name);
        }
    }
    if (d)
        closedir(d);
    if (!n_found)
        return rlx_error(RLX_E_IO,
                         "%s: no model.safetensors or model.safetensors.index.json (a model directory holds "
                         "config.json and *.safetensors; a GGUF model is given as its file)",
                         model_dir);
    char *config = rlx__path_join(model_dir, "config.json");
    const int has_config = config && access(config, F_OK) == 0;
    free(config);
    const char *comma = strchr(found, ',');
    return rlx_error(RLX_E_IO,
                     "%s is a directory with GGUF files (%s%s) but no %s*.safetensors: give the GGUF file itself as "
                     "the model, e.g. -m %s/%.*s",
                     model_dir, found, n_found > 4 ? ", ..." : "", has_config ? "" : "config.json or ", model_dir,
                     comma ? (int)(comma - found) : (int)strlen(found), found);
}

rlx_status rlx__weights_open_safetensors(const char *model_dir, rlx_weights **out) {
    rlx_status st = RLX_OK;
    cJSON *index = NULL;
    char *single = rlx__path_join(model_dir, "model.safetensors");
    char *index_path = rlx__path_join(model_dir, "model.safetensors.index.json");
    rlx_weights *w = rlx__calloc(1, sizeof *w);
    if (!single || !index_path || !w) {
        st = rlx_error(RLX_E_NOMEM, "%s: out of memory", model_dir);
        goto fail;
    }

    /* The single file wins when both exist, as in transformers' from_pretrained. */
    struct stat sb;
    if (stat(single, &sb) == 0) {
        w->files = rlx__calloc(1, sizeof *w->files);
        if (w->files)
            st = add_file(w, model_dir, "model.safetensors");
        else
            st = rlx_error(RLX_E_NOMEM, "%s: out of memory", single);
    } else if (errno != ENOENT) {
        st = rlx_error(RLX_E_IO, "%s: %s", single, strerror(errno));
    } else {
        st = rlx__json_load(index_path, 1, &index);
        if (st == RLX_OK && !index)
            st = no_safetensors(model_dir);
        if (st == RLX_OK)
            st = open_shards(w, model_dir, index_path, index);
    }
    if (st == RLX_OK)
        st = rlx__weights_index(w);
    if (st == RLX_OK && index)
        st = check_index(w, index_path, index);
fail:
    cJSON_Delete(index);
    free(index_path);
    free(single);
    if (st != RLX_OK) {
        rlx_weights_close(w);
        w = NULL;
    }
    *out = w;
    return st;
}
