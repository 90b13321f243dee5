/* The weights container shared by the safetensors and GGUF readers (weights_internal.h).
 *
 * Files are mapped whole, read-only and MAP_PRIVATE without MAP_POPULATE, so opening a 60 GB model
 * costs page tables, not RAM, and only the pages of tensors actually read become resident. The
 * descriptor is closed right after mmap; the mapping keeps the file alive. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

void rlx__drop_mapped(const void *p, size_t n) {
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return;
    const uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    const uintptr_t hi = ((uintptr_t)p + n) / (uintptr_t)page * (uintptr_t)page;
    if (hi <= lo)
        return;
    (void)madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE);
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

rlx_status rlx__wfile_map(rlx__wfile *f, size_t min_size, const char *what) {
    rlx_status st = RLX_OK;
    struct stat sb;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rlx_error(RLX_E_IO, "%s: %s", f->path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        st = rlx_error(RLX_E_IO, "%s: %s", f->path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = rlx_error(RLX_E_IO, "%s: not a regular file", f->path);
        goto fail;
    }
    if ((uint64_t)sb.st_size < min_size) {
        st = rlx_error(RLX_E_FORMAT, "%s: %lld bytes is too short for %s", f->path, (long long)sb.st_size, what);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = rlx_error(RLX_E_IO, "%s: mmap: %s", f->path, strerror(errno));
        goto fail;
    }
    f->map = map;
    f->size = (size_t)sb.st_size;
fail:
    close(fd);
    return st;
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
