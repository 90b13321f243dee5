/* rlx_weights_*: the safetensors reader on files written here, valid (F32, BF16, F16, sharded) and
 * broken in each way the reader must reject with an error naming the file and the tensor. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include "rlx/model.h"
#include "model_fixture.h"

// ---- fixtures

static int setup(void **state) {
    *state = fixture_dir_create();
    return 0;
}

static int teardown(void **state) {
    fixture_dir_remove(*state);
    free(*state);
    return 0;
}

/* Writes dir/name as a safetensors file: the 8-byte length, header (with ' standing for ") padded
 * with pad spaces, then n bytes of data (zeros when data is NULL). */
static void write_st(const char *dir, const char *name, const char *header, size_t pad, const void *data, size_t n) {
    size_t len = strlen(header) + pad;
    uint8_t *buf = calloc(1, 8 + len + n);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)len >> (8 * i));
    for (size_t i = 0; header[i]; i++)
        buf[8 + i] = header[i] == '\'' ? '"' : (uint8_t)header[i];
    memset(buf + 8 + strlen(header), ' ', pad);
    if (data)
        memcpy(buf + 8 + len, data, n);
    fixture_write(dir, name, buf, 8 + len + n);
    free(buf);
}

/* rlx_weights_open(dir) must fail with want, leaving the handle NULL. */
static void open_fails(const char *dir, rlx_status want) {
    rlx_weights *w = (rlx_weights *)&w; /* non-NULL sentinel */
    assert_int_equal(rlx_weights_open(dir, &w), want);
    assert_null(w);
}

/* model.safetensors with header and n zero bytes of data must be rejected as RLX_E_FORMAT with a
 * message naming the file and containing needle. */
static void header_fails(const char *dir, const char *header, size_t n, const char *needle) {
    write_st(dir, "model.safetensors", header, 0, NULL, n);
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(fixture_path(dir, "model.safetensors"), needle);
}

static uint16_t load_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v); /* tensor data is only byte-aligned */
    return v;
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* The permissions of the first mapping of path in /proc/self/maps, "" when unmapped. */
static const char *mapping_perms(const char *path) {
    static char perms[8];
    char line[4096];
    perms[0] = '\0';
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        size_t n = strlen(line), m = strlen(path);
        if (n >= m && strcmp(line + n - m, path) == 0 && sscanf(line, "%*s %7s", perms) == 1)
            break;
        perms[0] = '\0';
    }
    fclose(f);
    return perms;
}

// ---- valid files

static void test_f32_single_file(void **state) {
    const char *dir = *state;
    const float embed[6] = {0, 1, 2, 3, 4, 5}, norm[2] = {1.5f, -2.0f};
    uint8_t data[32];
    memcpy(data, norm, sizeof norm);
    memcpy(data + 8, embed, sizeof embed);
    write_st(dir, "model.safetensors",
             "{'__metadata__':{'format':'pt'},"
             "'model.norm.weight':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
             "'model.embed_tokens.weight':{'dtype':'F32','shape':[3,2],'data_offsets':[8,32]}}",
             0, data, sizeof data);
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    assert_int_equal(rlx_weights_count(w), 2);
    assert_int_equal(rlx_weights_total_bytes(w), 32);

    const rlx_weight *e = rlx_weights_find(w, "model.embed_tokens.weight");
    assert_non_null(e);
    assert_ptr_equal(e, rlx_weights_at(w, 0)); /* at() is in name order */
    assert_string_equal(e->name, "model.embed_tokens.weight");
    assert_int_equal(e->dtype, RLX_DTYPE_F32);
    assert_int_equal(e->n_dims, 2);
    assert_int_equal(e->shape[0], 3);
    assert_int_equal(e->shape[1], 2);
    assert_int_equal(e->shape[2], 1);
    assert_int_equal(e->shape[3], 1);
    assert_int_equal(e->nbytes, sizeof embed);
    assert_memory_equal(e->data, embed, sizeof embed);
    assert_string_equal(e->file, fixture_path(dir, "model.safetensors"));

    const rlx_weight *n = rlx_weights_at(w, 1);
    assert_string_equal(n->name, "model.norm.weight");
    assert_int_equal(n->n_dims, 1);
    assert_int_equal(n->shape[0], 2);
    assert_memory_equal(n->data, norm, sizeof norm);

    rlx_error_clear();
    assert_null(rlx_weights_find(w, "lm_head.weight"));
    assert_null(rlx_weights_find(w, "__metadata__"));
    assert_string_equal(rlx_last_error(), ""); /* a miss is not an error */
    assert_null(rlx_weights_at(w, 2));
    rlx_weights_close(w);
}

static void test_bf16_f16_unaligned(void **state) {
    const char *dir = *state;
    /* BF16 1.0, -2.0 and F16 1.0, 2.0, 0.5 back to back, after a header padded so that the data
     * area, and with it both tensors, starts 2 bytes past a 4-aligned address. */
    const uint16_t bits[5] = {0x3F80, 0xC000, 0x3C00, 0x4000, 0x3800};
    const char *header = "{'b':{'dtype':'BF16','shape':[1,2],'data_offsets':[0,4]},"
                         "'h':{'dtype':'F16','shape':[3],'data_offsets':[4,10]}}";
    size_t pad = (4 - (8 + strlen(header)) % 4) % 4 + 2;
    write_st(dir, "model.safetensors", header, pad, bits, sizeof bits);
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    const rlx_weight *b = rlx_weights_find(w, "b"), *h = rlx_weights_find(w, "h");
    assert_non_null(b);
    assert_non_null(h);
    assert_int_equal(b->dtype, RLX_DTYPE_BF16);
    assert_int_equal(h->dtype, RLX_DTYPE_F16);
    assert_int_equal((uintptr_t)b->data % 4, 2);
    assert_int_equal((uintptr_t)h->data % 4, 2);
    assert_int_equal(load_u16(b->data), 0x3F80);
    assert_int_equal(load_u16((const uint8_t *)b->data + 2), 0xC000);
    for (int i = 0; i < 3; i++)
        assert_int_equal(load_u16((const uint8_t *)h->data + 2 * i), bits[2 + i]);
    assert_int_equal(h->nbytes, 6);
    rlx_weights_close(w);
}

static void test_scalar_empty_and_gaps(void **state) {
    const char *dir = *state;
    /* A scalar, a tensor with a zero dimension sitting inside another's range, and a gap: all
     * valid safetensors. */
    const float v[3] = {7, 8, 9};
    write_st(dir, "model.safetensors",
             "{'s':{'dtype':'F32','shape':[],'data_offsets':[0,4]},"
             "'z':{'dtype':'F32','shape':[0,5],'data_offsets':[4,4]},"
             "'t':{'dtype':'F32','shape':[1],'data_offsets':[8,12]}}",
             0, v, sizeof v);
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    const rlx_weight *s = rlx_weights_find(w, "s"), *z = rlx_weights_find(w, "z"), *t = rlx_weights_find(w, "t");
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->nbytes, 4);
    assert_int_equal(z->n_dims, 2);
    assert_int_equal(z->shape[0], 0);
    assert_int_equal(z->nbytes, 0);
    float x;
    memcpy(&x, t->data, sizeof x);
    assert_true(x == 9.0f);
    assert_int_equal(rlx_weights_total_bytes(w), 8);
    rlx_weights_close(w);
}

/* A vision tower's Conv3d weight has five dimensions: the leading ones fold into the first, the
 * elements and their bytes stay. */
static void test_more_dimensions_fold(void **state) {
    const char *dir = *state;
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i;
    write_st(dir, "model.safetensors", "{'c':{'dtype':'F32','shape':[2,3,1,1,2],'data_offsets':[0,48]}}", 0, v,
             sizeof v);
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    const rlx_weight *c = rlx_weights_find(w, "c");
    assert_int_equal(c->n_dims, 4);
    assert_int_equal(c->shape[0], 6);
    assert_int_equal(c->shape[1], 1);
    assert_int_equal(c->shape[2], 1);
    assert_int_equal(c->shape[3], 2);
    assert_int_equal(c->nbytes, 48);
    float x;
    memcpy(&x, (const float *)c->data + 11, sizeof x);
    assert_true(x == 11.0f);
    rlx_weights_close(w);
}

static void test_sharded_index(void **state) {
    const char *dir = *state;
    const float a[2] = {1, 2}, b[1] = {3}, c[3] = {4, 5, 6}, extra[1] = {7};
    float d1[3], d2[4];
    memcpy(d1, a, sizeof a);
    memcpy(d1 + 2, b, sizeof b);
    memcpy(d2, c, sizeof c);
    memcpy(d2 + 3, extra, sizeof extra);
    write_st(dir, "model-00001-of-00002.safetensors",
             "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
             "'b':{'dtype':'F32','shape':[1],'data_offsets':[8,12]}}",
             0, d1, sizeof d1);
    write_st(dir, "model-00002-of-00002.safetensors",
             "{'c':{'dtype':'F32','shape':[3],'data_offsets':[0,12]},"
             "'extra':{'dtype':'F32','shape':[1],'data_offsets':[12,16]}}",
             0, d2, sizeof d2);
    fixture_write_text(dir, "model.safetensors.index.json",
                       "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {"
                       "\"a\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\", "
                       "\"b\": \"model-00001-of-00002.safetensors\"}}");
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    /* Tensors come from the shard headers, including one the index does not list. */
    assert_int_equal(rlx_weights_count(w), 4);
    assert_int_equal(rlx_weights_total_bytes(w), 28);
    const char *names[4] = {"a", "b", "c", "extra"};
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(rlx_weights_at(w, i)->name, names[i]);
    char shard1[PATH_MAX], shard2[PATH_MAX];
    snprintf(shard1, sizeof shard1, "%s", fixture_path(dir, "model-00001-of-00002.safetensors"));
    snprintf(shard2, sizeof shard2, "%s", fixture_path(dir, "model-00002-of-00002.safetensors"));
    assert_string_equal(rlx_weights_find(w, "a")->file, shard1);
    assert_string_equal(rlx_weights_find(w, "b")->file, shard1);
    assert_string_equal(rlx_weights_find(w, "c")->file, shard2);
    assert_memory_equal(rlx_weights_find(w, "b")->data, b, sizeof b);
    assert_memory_equal(rlx_weights_find(w, "c")->data, c, sizeof c);
    assert_memory_equal(rlx_weights_find(w, "extra")->data, extra, sizeof extra);
    /* Each shard is mapped once, and every file name string is shared by its tensors. */
    assert_ptr_equal(rlx_weights_find(w, "a")->file, rlx_weights_find(w, "b")->file);
    rlx_weights_close(w);
}

static void test_single_file_wins_over_index(void **state) {
    const char *dir = *state;
    write_st(dir, "model.safetensors", "{'x':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 0, NULL, 4);
    fixture_write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"y\": \"missing.safetensors\"}}");
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    assert_non_null(rlx_weights_find(w, "x"));
    assert_null(rlx_weights_find(w, "y"));
    rlx_weights_close(w);
}

static void test_many_tensors_lookup(void **state) {
    const char *dir = *state;
    enum { N = 5000 };
    size_t cap = (size_t)N * 96, len = 0;
    char *header = malloc(cap);
    assert_non_null(header);
    len += (size_t)snprintf(header + len, cap - len, "{");
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(header + len, cap - len,
                                "%s'model.layers.%d.w':{'dtype':'F32','shape':[1],'data_offsets':[%d,%d]}",
                                i ? "," : "", i, 4 * i, 4 * i + 4);
    snprintf(header + len, cap - len, "}");
    float *data = malloc(N * sizeof *data);
    assert_non_null(data);
    for (int i = 0; i < N; i++)
        data[i] = (float)i;
    write_st(dir, "model.safetensors", header, 0, data, N * sizeof *data);
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    assert_int_equal(rlx_weights_count(w), N);
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.w", i);
        const rlx_weight *t = rlx_weights_find(w, name);
        assert_non_null(t);
        float v;
        memcpy(&v, t->data, sizeof v);
        assert_true(v == (float)i);
    }
    rlx_weights_close(w);
    free(data);
    free(header);
}

static void test_mapping_private_read_only_fd_closed(void **state) {
    const char *dir = *state;
    write_st(dir, "model.safetensors", "{'x':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 0, NULL, 4);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", fixture_path(dir, "model.safetensors"));
    int fds = count_fds();
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(dir, &w), RLX_OK);
    assert_int_equal(count_fds(), fds);
    assert_string_equal(mapping_perms(path), "r--p");
    rlx_weights_close(w);
    assert_string_equal(mapping_perms(path), "");
    rlx_weights_close(NULL);
}

// ---- broken files

static void test_rejects_bad_arguments_and_missing_files(void **state) {
    const char *dir = *state;
    rlx_weights *w = NULL;
    assert_int_equal(rlx_weights_open(NULL, &w), RLX_E_INVALID);
    assert_int_equal(rlx_weights_open(dir, NULL), RLX_E_INVALID);
    assert_int_equal(rlx_weights_open("", &w), RLX_E_INVALID);
    open_fails(dir, RLX_E_IO);
    fixture_assert_error_has(dir, "model.safetensors.index.json");
    open_fails(fixture_path(dir, "no_such_dir"), RLX_E_IO);
    fixture_assert_error_has("no_such_dir");
    assert_int_equal(rlx_weights_count(NULL), 0);
    assert_null(rlx_weights_at(NULL, 0));
    assert_null(rlx_weights_find(NULL, "x"));
}

static void test_rejects_bad_length_prefix(void **state) {
    const char *dir = *state;
    fixture_write(dir, "model.safetensors", "\x10\0\0\0\0", 5);
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(fixture_path(dir, "model.safetensors"), "too short");

    uint8_t bytes[10] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'}; /* claims 200 header bytes, has 2 */
    fixture_write(dir, "model.safetensors", bytes, sizeof bytes);
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(fixture_path(dir, "model.safetensors"), "header length 200", "runs past");

    /* A header length inside a (sparse) large file but over the 100 MB limit. */
    const char *path = fixture_path(dir, "model.safetensors");
    int fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    const uint8_t huge[8] = {0x00, 0xe1, 0xf5, 0x06, 0, 0, 0, 0}; /* 116760832 bytes */
    assert_int_equal(write(fd, huge, sizeof huge), sizeof huge);
    assert_int_equal(ftruncate(fd, 128 << 20), 0);
    close(fd);
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(fixture_path(dir, "model.safetensors"), "exceeds the 100000000-byte limit");
}

static void test_rejects_bad_header_json(void **state) {
    const char *dir = *state;
    header_fails(dir, "{'a': {'dtype': 'F32',", 0, "not valid JSON");
    fixture_assert_error_has("byte");
    header_fails(dir, "", 0, "not valid JSON");
    header_fails(dir, "[1, 2]", 0, "not a JSON object");
    header_fails(dir, "{} xx", 0, "unexpected bytes after the header JSON at byte 11");
    header_fails(dir, "{'a': 5}", 0, "tensor 'a': header entry is not a JSON object");
}

/* A header without tensors used to pass as an empty file and reach qsort(NULL, 0, ...), undefined
 * behaviour that UBSan reports; it is a model file that holds nothing to run. */
static void test_rejects_no_tensors(void **state) {
    const char *dir = *state;
    header_fails(dir, "{}", 0, "holds no tensors (its header lists nothing)");
    header_fails(dir, "{'__metadata__': {'format': 'pt'}}", 0, "holds no tensors (its header lists only __metadata__)");
    header_fails(dir, "{'__metadata__': {}}   ", 16, "holds no tensors");
}

static void test_rejects_missing_fields(void **state) {
    const char *dir = *state;
    header_fails(dir, "{'w':{'shape':[1],'data_offsets':[0,4]}}", 4, "tensor 'w': missing field 'dtype'");
    header_fails(dir, "{'w':{'dtype':'F32','data_offsets':[0,4]}}", 4, "tensor 'w': missing field 'shape'");
    header_fails(dir, "{'w':{'dtype':'F32','shape':[1]}}", 4, "tensor 'w': missing field 'data_offsets'");
}

static void test_rejects_bad_dtypes(void **state) {
    const char *dir = *state;
    header_fails(dir, "{'ids':{'dtype':'I64','shape':[2],'data_offsets':[0,16]}}", 16,
                 "tensor 'ids': unsupported dtype 'I64'");
    header_fails(dir, "{'d':{'dtype':'F64','shape':[2],'data_offsets':[0,16]}}", 16,
                 "tensor 'd': unsupported dtype 'F64'");
    header_fails(dir, "{'q':{'dtype':'F8_E4M3','shape':[2],'data_offsets':[0,2]}}", 2,
                 "tensor 'q': unsupported dtype 'F8_E4M3'");
    header_fails(dir, "{'q':{'dtype':'f32','shape':[2],'data_offsets':[0,8]}}", 8, "unsupported dtype 'f32'");
    header_fails(dir, "{'q':{'dtype':3,'shape':[2],'data_offsets':[0,8]}}", 8, "tensor 'q': field 'dtype'");
}

static void test_rejects_bad_shapes(void **state) {
    const char *dir = *state;
    header_fails(dir, "{'w':{'dtype':'F32','shape':[-1,2],'data_offsets':[0,8]}}", 8, "tensor 'w': shape[0]");
    header_fails(dir, "{'w':{'dtype':'F32','shape':[2,1.5],'data_offsets':[0,12]}}", 12, "tensor 'w': shape[1]");
    header_fails(dir, "{'w':{'dtype':'F32','shape':['2'],'data_offsets':[0,8]}}", 8, "tensor 'w': shape[0]");
    header_fails(dir, "{'w':{'dtype':'F32','shape':2,'data_offsets':[0,8]}}", 8, "tensor 'w': field 'shape'");
    header_fails(dir, "{'w':{'dtype':'F32','shape':[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],'data_offsets':[0,4]}}", 4,
                 "tensor 'w': 17 dimensions, more than the 16");
    /* five dimensions are read (folded); their byte count is still checked */
    header_fails(dir, "{'w':{'dtype':'F32','shape':[2,3,1,1,2],'data_offsets':[0,44]}}", 44,
                 "tensor 'w': data_offsets span 44 bytes, but 12 F32 elements take 48");
    /* A product of dimensions that overflows 64 bits must not wrap around to the byte count. */
    header_fails(dir, "{'w':{'dtype':'F32','shape':[4294967296,4294967296,4294967296,1],'data_offsets':[0,0]}}", 0,
                 "tensor 'w': data_offsets span 0 bytes");
}

static void test_rejects_bad_offsets(void **state) {
    const char *dir = *state;
    const char *not_a_range = "tensor 'w': field 'data_offsets' is not [begin, end]";
    header_fails(dir, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0]}}", 4, not_a_range);
    header_fails(dir, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0,4,8]}}", 4, not_a_range);
    header_fails(dir, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0.5,4]}}", 4, not_a_range);
    header_fails(dir, "{'w':{'dtype':'F32','shape':[1],'data_offsets':'0,4'}}", 4, not_a_range);
    header_fails(dir, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[-4,0]}}", 4, not_a_range);
    header_fails(dir, "{'w':{'dtype':'F32','shape':[0],'data_offsets':[8,4]}}", 8, "tensor 'w': data_offsets [8, 4]");
    header_fails(dir, "{'w':{'dtype':'F32','shape':[4],'data_offsets':[0,16]}}", 12,
                 "tensor 'w': data_offsets end at 16, past the 12-byte data area");
    header_fails(dir, "{'w':{'dtype':'F32','shape':[2,2],'data_offsets':[0,12]}}", 16,
                 "tensor 'w': data_offsets span 12 bytes, but 4 F32 elements take 16");
    header_fails(dir, "{'w':{'dtype':'BF16','shape':[3],'data_offsets':[0,12]}}", 16,
                 "tensor 'w': data_offsets span 12 bytes, but 3 BF16 elements take 6");
}

static void test_rejects_overlaps_and_duplicates(void **state) {
    const char *dir = *state;
    header_fails(dir,
                 "{'a':{'dtype':'F32','shape':[4],'data_offsets':[0,16]},"
                 "'b':{'dtype':'F32','shape':[4],'data_offsets':[8,24]}}",
                 24, "tensors 'a' and 'b' overlap");
    /* b starts after a's end but inside c, which started earlier and reaches further. */
    header_fails(dir,
                 "{'a':{'dtype':'F32','shape':[1],'data_offsets':[4,8]},"
                 "'c':{'dtype':'F32','shape':[4],'data_offsets':[0,16]},"
                 "'b':{'dtype':'F32','shape':[1],'data_offsets':[12,16]}}",
                 16, "overlap");
    header_fails(dir,
                 "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
                 "'a':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}",
                 8, "tensor 'a' appears twice");
}

/* Every single-byte corruption of a small file's length prefix and header either still reads as
 * a valid file or is RLX_E_FORMAT; none may crash, leak or read outside the mapping (ASan). */
static void test_header_mutations_fail_cleanly(void **state) {
    const char *dir = *state;
    const char *header = "{'__metadata__':{'format':'pt'},'a':{'dtype':'BF16','shape':[2,2],'data_offsets':[0,8]},"
                         "'b':{'dtype':'F32','shape':[3],'data_offsets':[8,20]}}";
    size_t len = strlen(header), size = 8 + len + 20;
    write_st(dir, "model.safetensors", header, 0, NULL, 20);
    uint8_t *orig = malloc(size), *buf = malloc(size);
    assert_non_null(orig);
    assert_non_null(buf);
    FILE *f = fopen(fixture_path(dir, "model.safetensors"), "rb");
    assert_non_null(f);
    assert_int_equal(fread(orig, 1, size, f), size);
    fclose(f);
    const uint8_t values[] = {0x00, 0xff, '"', '{', ']', ',', '9', '-', 'x'};
    for (size_t pos = 0; pos < 8 + len; pos++) {
        for (size_t v = 0; v < sizeof values; v++) {
            memcpy(buf, orig, size);
            buf[pos] = values[v];
            fixture_write(dir, "model.safetensors", buf, size);
            rlx_weights *w = NULL;
            rlx_status st = rlx_weights_open(dir, &w);
            if (st != RLX_OK && st != RLX_E_FORMAT)
                print_error("byte %zu = 0x%02x: status %d (%s)\n", pos, values[v], st, rlx_last_error());
            assert_true(st == RLX_OK || st == RLX_E_FORMAT);
            assert_true((st == RLX_OK) == (w != NULL));
            rlx_weights_close(w);
        }
    }
    free(buf);
    free(orig);
}

/* A two-shard model: shard 1 holds header1, shard 2 holds header2, and the index maps as given. */
static void write_shards(const char *dir, const char *header1, const char *header2, const char *weight_map) {
    write_st(dir, "s1.safetensors", header1, 0, NULL, 16);
    write_st(dir, "s2.safetensors", header2, 0, NULL, 16);
    char index[512];
    snprintf(index, sizeof index, "{\"weight_map\": {%s}}", weight_map);
    fixture_write_text(dir, "model.safetensors.index.json", index);
}

static void test_rejects_broken_shards(void **state) {
    const char *dir = *state;
    const char *a = "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}";
    const char *b = "{'b':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}";
    char index[PATH_MAX];
    snprintf(index, sizeof index, "%s", fixture_path(dir, "model.safetensors.index.json"));

    write_shards(dir, a, a, "\"a\": \"s1.safetensors\", \"x\": \"s2.safetensors\"");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has("tensor 'a' is in both", "s1.safetensors", "s2.safetensors");

    write_shards(dir, a, b, "\"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\"");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(index, "tensor 'c' is mapped to", "s2.safetensors, which does not contain it");

    write_shards(dir, a, b, "\"a\": \"s2.safetensors\", \"b\": \"s1.safetensors\"");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(index, "tensor 'a' is mapped to", "s2.safetensors but stored in", "s1.safetensors");

    write_shards(dir, a, b, "\"a\": \"s1.safetensors\", \"b\": \"s3.safetensors\"");
    open_fails(dir, RLX_E_IO);
    fixture_assert_error_has("s3.safetensors", "No such file");

    write_shards(dir, a, b, "\"a\": \"s1.safetensors\", \"b\": \"../s2.safetensors\"");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(index, "tensor 'b' is not mapped to a file name");

    write_shards(dir, "{'a':{'dtype':'I64','shape':[1],'data_offsets':[0,8]}}", b, "\"a\": \"s1.safetensors\"");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has("s1.safetensors", "tensor 'a': unsupported dtype 'I64'");

    fixture_write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(index, "'weight_map'");

    fixture_write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {}}");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(index, "'weight_map'");

    fixture_write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"s1.safetensors\",}}");
    open_fails(dir, RLX_E_FORMAT);
    fixture_assert_error_has(index, "malformed JSON", "line 1");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_f32_single_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bf16_f16_unaligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scalar_empty_and_gaps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_more_dimensions_fold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_single_file_wins_over_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_tensors_lookup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mapping_private_read_only_fd_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_bad_arguments_and_missing_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_bad_length_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_bad_header_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_no_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_missing_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_bad_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_bad_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_bad_offsets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_overlaps_and_duplicates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_mutations_fail_cleanly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_broken_shards, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
