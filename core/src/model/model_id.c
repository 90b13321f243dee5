/* rlx_model_id: SHA-256 (OpenSSL's) over config.json and every safetensors file's size and
 * header, or every GGUF file's size and header, so two processes (a driver and its stages) can
 * tell cheaply whether they hold the same model files. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "model/arch.h"
#include "model/model_internal.h"
#include "model/weights_internal.h"
#include "util/alloc.h"

#define HEADER_MAX (100u << 20) /* safetensors' own limit on the header */

static rlx_status hash_range(EVP_MD_CTX *h, int fd, const char *path, uint64_t offset, uint64_t len) {
    char buf[65536];
    while (len) {
        size_t want = len < sizeof buf ? (size_t)len : sizeof buf;
        ssize_t got = pread(fd, buf, want, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return rlx_error(RLX_E_IO, "%s: cannot read: %s", path,
                             got < 0 ? strerror(errno) : "unexpected end of file");
        if (!EVP_DigestUpdate(h, buf, (size_t)got))
            return rlx_error(RLX_E_INTERNAL, "%s: SHA-256 failed", path);
        offset += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return RLX_OK;
}

/* Hashes the size, the 8-byte header length and the header of one safetensors file. */
static rlx_status hash_safetensors(EVP_MD_CTX *h, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rlx_error(RLX_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    uint8_t prefix[8];
    rlx_status rc = RLX_OK;
    if (fstat(fd, &st) != 0 || st.st_size < 8 || pread(fd, prefix, 8, 0) != 8) {
        rc = rlx_error(RLX_E_FORMAT, "%s: not a safetensors file", path);
        goto done;
    }
    uint64_t header = 0, size = (uint64_t)st.st_size;
    for (int i = 0; i < 8; i++)
        header |= (uint64_t)prefix[i] << (8 * i);
    if (header > HEADER_MAX || header > size - 8) {
        rc = rlx_error(RLX_E_FORMAT, "%s: corrupt safetensors header length %llu", path, (unsigned long long)header);
        goto done;
    }
    rc = EVP_DigestUpdate(h, &size, sizeof size) ? hash_range(h, fd, path, 0, 8 + header)
                                                 : rlx_error(RLX_E_INTERNAL, "%s: SHA-256 failed", path);
done:
    close(fd);
    return rc;
}

static int by_name(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    const char *bx = strrchr(x, '/'), *by = strrchr(y, '/');
    return strcmp(bx ? bx + 1 : x, by ? by + 1 : y);
}

/* A SHA-256 context, or the error saying why there is none. */
static rlx_status digest_new(EVP_MD_CTX **h) {
    *h = EVP_MD_CTX_new();
    if (!*h)
        return rlx_error(RLX_E_NOMEM, "model id: out of memory");
    if (!EVP_DigestInit_ex(*h, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(*h);
        *h = NULL;
        return rlx_error(RLX_E_INTERNAL, "model id: OpenSSL has no SHA-256");
    }
    return RLX_OK;
}

/* Ends h (freed either way) and writes its digest as 64 hex digits. */
static rlx_status hex_digest(EVP_MD_CTX *h, char out[RLX_MODEL_ID_SIZE]) {
    uint8_t digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    const int ok = EVP_DigestFinal_ex(h, digest, &len) && len == 32;
    EVP_MD_CTX_free(h);
    if (!ok)
        return rlx_error(RLX_E_INTERNAL, "model id: SHA-256 failed");
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", digest[i]);
    return RLX_OK;
}

/* A GGUF model, from its opened files: every shard's size and header (metadata and tensor
 * index, up to the data). */
static rlx_status gguf_weights_id(const rlx_weights *w, char out[RLX_MODEL_ID_SIZE]) {
    EVP_MD_CTX *h;
    rlx_status rc = digest_new(&h);
    if (rc != RLX_OK)
        return rc;
    int ok = 1;
    for (size_t i = 0; ok && i < w->n_gguf; i++) {
        const rlx__gguf *g = w->gguf[i];
        const uint64_t size = g->size;
        ok = EVP_DigestUpdate(h, &size, sizeof size) && EVP_DigestUpdate(h, g->map, g->data_offset);
    }
    if (!ok) {
        EVP_MD_CTX_free(h);
        return rlx_error(RLX_E_INTERNAL, "model id: SHA-256 failed");
    }
    return hex_digest(h, out);
}

static rlx_status gguf_model_id(const char *path, char out[RLX_MODEL_ID_SIZE]) {
    rlx_weights *w;
    rlx_status rc = rlx_weights_open(path, &w);
    if (rc != RLX_OK)
        return rc;
    rc = gguf_weights_id(w, out);
    rlx_weights_close(w);
    return rc;
}

rlx_status rlx__model_id_of(const rlx_model *m, char out[RLX_MODEL_ID_SIZE]) {
    const rlx_weights *w = rlx_model_weights(m);
    if (!rlx__weights_gguf(w))
        return rlx_model_id(rlx_model_dir(m), out);
    const rlx_status rc = gguf_weights_id(w, out);
    /* the model released the header's pages after reading it, and hashing faulted them back */
    rlx__weights_release_gguf_headers(w);
    return rc;
}

rlx_status rlx__model_config_and_id(const char *model_path, rlx_model_config *cfg, char id[RLX_MODEL_ID_SIZE],
                                    int *recurrent) {
    int gguf;
    rlx_status rc = rlx__weights_path_is_gguf(model_path, &gguf);
    if (rc != RLX_OK)
        return rc;
    rlx__model_desc desc;
    memset(&desc, 0, sizeof desc);
    rlx_weights *w = NULL;
    if (!gguf) {
        if ((rc = rlx__model_desc_load_dir(model_path, &desc)) == RLX_OK)
            rc = rlx_model_id(model_path, id);
    } else if ((rc = rlx_weights_open(model_path, &w)) == RLX_OK) {
        if ((rc = rlx__model_desc_from_gguf(w, &desc)) == RLX_OK)
            rc = gguf_weights_id(w, id);
        rlx_weights_close(w);
    }
    if (rc == RLX_OK)
        *cfg = desc.cfg;
    *recurrent = 0;
    for (int64_t l = 0; rc == RLX_OK && l < desc.cfg.num_hidden_layers; l++)
        *recurrent |= desc.layers[l].linear != 0;
    rlx__model_desc_free(&desc);
    return rc;
}

rlx_status rlx_model_id(const char *model_dir, char out[RLX_MODEL_ID_SIZE]) {
    if (!model_dir || !out)
        return rlx_error(RLX_E_INVALID, "rlx_model_id: NULL argument");
    out[0] = '\0';
    int gguf;
    rlx_status rc = rlx__weights_path_is_gguf(model_dir, &gguf);
    if (rc != RLX_OK || gguf)
        return rc != RLX_OK ? rc : gguf_model_id(model_dir, out);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", model_dir) >= (int)sizeof path)
        return rlx_error(RLX_E_INVALID, "%s: path too long", model_dir);
    /* the weights loader knows the files (single or sharded) and validates them */
    rlx_weights *w;
    if ((rc = rlx_weights_open(model_dir, &w)) != RLX_OK)
        return rc;
    size_t n = rlx_weights_count(w), n_files = 0;
    const char **files = rlx__malloc((n ? n : 1) * sizeof *files);
    EVP_MD_CTX *h = NULL;
    if (!files) {
        rc = rlx_error(RLX_E_NOMEM, "model id: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const char *f = rlx_weights_at(w, i)->file;
        size_t j = 0;
        while (j < n_files && strcmp(files[j], f) != 0)
            j++;
        if (j == n_files)
            files[n_files++] = f;
    }
    qsort(files, n_files, sizeof *files, by_name);
    if ((rc = digest_new(&h)) != RLX_OK)
        goto done;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = rlx_error(RLX_E_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    struct stat st;
    rc = fstat(fd, &st) == 0 ? hash_range(h, fd, path, 0, (uint64_t)st.st_size)
                             : rlx_error(RLX_E_IO, "%s: %s", path, strerror(errno));
    close(fd);
    for (size_t i = 0; rc == RLX_OK && i < n_files; i++)
        rc = hash_safetensors(h, files[i]);
    if (rc == RLX_OK) {
        rc = hex_digest(h, out);
        h = NULL;
    }
done:
    EVP_MD_CTX_free(h);
    free(files);
    rlx_weights_close(w);
    return rc;
}
