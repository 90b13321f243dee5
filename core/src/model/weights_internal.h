/* The weights container (rlx_weights) that the safetensors and GGUF readers fill: the files a
 * model's tensors live in, mapped read-only, and the tensors sorted by name. */
#ifndef RLX_WEIGHTS_INTERNAL_H
#define RLX_WEIGHTS_INTERNAL_H

#include <stddef.h>

#include "gguf.h"
#include "rlx/model.h"
#include "rlx/status.h"

typedef struct rlx__wfile {
    char *path;       /* the rlx_weight.file of its tensors */
    const char *name; /* file name part of path */
    void *map;        /* the whole file, PROT_READ, owned; NULL until mapped (or for a GGUF file,
                       * whose mapping its rlx__gguf owns) */
    size_t size;
    char *names; /* this file's tensor names, NUL-terminated back to back */
} rlx__wfile;

struct rlx_weights {
    rlx__wfile *files;
    size_t n_files;      /* entries of files holding a path (and possibly a mapping) */
    rlx_weight *tensors; /* sorted by name once all files are read */
    size_t n_tensors;
    size_t total_bytes;
    rlx__gguf **gguf; /* the shards of a GGUF model, in order, owned; NULL for safetensors */
    size_t n_gguf;
    void **owned; /* buffers of tensors quantized in memory (rlx_model_quantize), freed at close */
    size_t n_owned;
};

/* Quantizes the matrices of w in memory as rlx_model_quantize documents (quantize.c). */
struct rlx__qtype;
struct rlx__model_desc;
rlx_status rlx__weights_quantize(rlx_weights *w, const struct rlx__model_desc *d, const struct rlx__qtype *q,
                                 rlx_quantize_progress progress, void *ctx);

/* dir/name with a single separator (dir is not empty); NULL when out of memory. */
char *rlx__path_join(const char *dir, const char *name);

/* Maps the whole regular file at f->path (read-only, private, lazily). A file shorter than
 * min_size bytes is RLX_E_FORMAT saying it is too short for `what`. */
rlx_status rlx__wfile_map(rlx__wfile *f, size_t min_size, const char *what);

/* Drops the resident pages wholly inside [p, p + n) of a file mapping (clean, so they are read
 * back from the file if touched again), keeping the range out of 2 MiB mappings first: a fault
 * anywhere in a 2 MiB page-cache folio maps all of it, so a neighbour's read would otherwise
 * map the dropped pages back. Advice only: a failure leaves them resident, nothing else. */
void rlx__drop_mapped(const void *p, size_t n);

/* Checks the n tensors read from the file at path: no name twice, no two non-empty byte ranges
 * sharing a byte (gaps are allowed). Reorders t. */
rlx_status rlx__weights_check_file(const char *path, rlx_weight *t, size_t n);

/* Sorts the tensors of every file read into w by name, rejecting a name held twice, and sums
 * their bytes (again, after tensors were renamed or appended). */
rlx_status rlx__weights_index(rlx_weights *w);

/* A buffer of bytes that w owns and frees with itself (a tensor put into another order or
 * dtype at open), or NULL when out of memory. */
void *rlx__weights_own(rlx_weights *w, size_t bytes);

/* Appends tensor t (its name copied into memory w owns): a view a reader derives from a file's
 * tensor. The table is unsorted until rlx__weights_index runs again. */
rlx_status rlx__weights_append(rlx_weights *w, const rlx_weight *t);

/* Maps a model directory's safetensors (model.safetensors, or the shards its
 * model.safetensors.index.json lists) as weights under their file's names. */
rlx_status rlx__weights_open_safetensors(const char *model_dir, rlx_weights **out);

/* Maps a GGUF model (one file, or the first shard "NAME-00001-of-0000N.gguf" of a split one,
 * whose siblings are opened with it) as weights under their Hugging Face names (gguf.h). */
rlx_status rlx__weights_open_gguf(const char *path, rlx_weights **out);

#endif
