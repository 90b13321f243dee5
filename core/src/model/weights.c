/* The weights container shared by the safetensors and GGUF readers (weights_internal.h), and
 * the one place that decides which of the two reads a model path. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "model_internal.h"
#include "util/alloc.h"
#include "weights_internal.h"

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const rlx_weight *)a)->name, ((const rlx_weight *)b)->name);
}

static int cmp_data(const void *a, const void *b) {
    const rlx_weight *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py)
        return px < py ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int cmp_key(const void *key, const void *elem) { return strcmp(key, ((const rlx_weight *)elem)->name); }

char *rlx__path_join(const char *dir, const char *name) {
    size_t n = strlen(dir);
    while (n > 0 && dir[n - 1] == '/')
        n--;
    char *p = rlx__malloc(n + 1 + strlen(name) + 1);
    if (p) {
        memcpy(p, dir, n);
        p[n] = '/';
        strcpy(p + n + 1, name);
    }
    return p;
}

rlx_status rlx__weights_check_file(const char *path, rlx_weight *t, size_t n) {
    if (n == 0)
        return RLX_OK;
    qsort(t, n, sizeof *t, cmp_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(t[i - 1].name, t[i].name) == 0)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' appears twice in the header", path, t[i].name);
    /* In start order, a tensor overlaps an earlier one iff it starts before the furthest end so far. */
    qsort(t, n, sizeof *t, cmp_data);
    const rlx_weight *reach = NULL; /* the non-empty tensor ending furthest so far */
    for (size_t i = 0; i < n; i++) {
        if (t[i].nbytes == 0)
            continue;
        const uint8_t *start = t[i].data, *end = start + t[i].nbytes;
        if (reach && start < (const uint8_t *)reach->data + reach->nbytes)
            return rlx_error(RLX_E_FORMAT, "%s: tensors '%s' and '%s' overlap in the data area", path, reach->name,
                             t[i].name);
        if (!reach || end > (const uint8_t *)reach->data + reach->nbytes)
            reach = &t[i];
    }
    return RLX_OK;
}

rlx_status rlx__weights_index(rlx_weights *w) {
    w->total_bytes = 0;
    if (w->n_tensors)
        qsort(w->tensors, w->n_tensors, sizeof *w->tensors, cmp_name);
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (i > 0 && strcmp(w->tensors[i - 1].name, w->tensors[i].name) == 0)
            return rlx_error(RLX_E_FORMAT, "tensor '%s' is in both %s and %s", w->tensors[i].name,
                             w->tensors[i - 1].file, w->tensors[i].file);
        w->total_bytes += w->tensors[i].nbytes;
    }
    return RLX_OK;
}

void *rlx__weights_own(rlx_weights *w, size_t bytes) {
    void **owned = rlx__realloc(w->owned, (w->n_owned + 1) * sizeof *owned);
    if (!owned)
        return NULL;
    w->owned = owned;
    void *p = rlx__malloc(bytes ? bytes : 1);
    if (p)
        w->owned[w->n_owned++] = p;
    return p;
}

rlx_status rlx__weights_append(rlx_weights *w, const rlx_weight *t) {
    const size_t len = strlen(t->name) + 1;
    char *name = rlx__weights_own(w, len);
    rlx_weight *tensors = name ? rlx__realloc(w->tensors, (w->n_tensors + 1) * sizeof *tensors) : NULL;
    if (!tensors)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", t->file);
    memcpy(name, t->name, len);
    w->tensors = tensors;
    w->tensors[w->n_tensors] = *t;
    w->tensors[w->n_tensors++].name = name;
    return RLX_OK;
}

void rlx_weights_close(rlx_weights *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->n_files; i++) {
        if (w->files[i].map)
            munmap(w->files[i].map, w->files[i].size);
        free(w->files[i].names);
        free(w->files[i].path);
    }
    for (size_t i = 0; i < w->n_gguf; i++)
        rlx__gguf_close(w->gguf[i]);
    for (size_t i = 0; i < w->n_owned; i++)
        free(w->owned[i]);
    free(w->owned);
    free(w->gguf);
    free(w->files);
    free(w->tensors);
    free(w);
}

size_t rlx_weights_count(const rlx_weights *w) { return w ? w->n_tensors : 0; }

const rlx_weight *rlx_weights_at(const rlx_weights *w, size_t i) {
    return w && i < w->n_tensors ? &w->tensors[i] : NULL;
}

const rlx_weight *rlx_weights_find(const rlx_weights *w, const char *name) {
    if (!w || !name || w->n_tensors == 0)
        return NULL;
    return bsearch(name, w->tensors, w->n_tensors, sizeof *w->tensors, cmp_key);
}

size_t rlx_weights_total_bytes(const rlx_weights *w) { return w ? w->total_bytes : 0; }

rlx_status rlx__weights_path_is_gguf(const char *path, int *gguf) {
    struct stat sb;
    *gguf = 0;
    /* said here, before "no model.safetensors" would send the user looking inside a directory;
     * RLX_E_IO, as text.h promises of a tokenizer.json that cannot be read */
    if (stat(path, &sb) != 0)
        return rlx_error(RLX_E_IO,
                         "%s: %s (the model is a GGUF file or a directory "
                         "with config.json and *.safetensors)",
                         path, strerror(errno));
    *gguf = S_ISREG(sb.st_mode);
    return *gguf && !rlx__is_gguf(path) ? rlx__gguf_not_gguf(path) : RLX_OK;
}

rlx_status rlx_weights_open(const char *model_path, rlx_weights **out) {
    if (out)
        *out = NULL;
    if (!model_path || !model_path[0] || !out)
        return rlx_error(RLX_E_INVALID, "rlx_weights_open: model_dir must be a non-empty path and out not NULL");
    int gguf;
    rlx_status st = rlx__weights_path_is_gguf(model_path, &gguf);
    if (st != RLX_OK)
        return st;
    return gguf ? rlx__weights_open_gguf(model_path, out) : rlx__weights_open_safetensors(model_path, out);
}
