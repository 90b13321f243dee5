/* Model files mapped read-only (weights_internal.h): the primitive under both weight readers and
 * the GGUF header parser.
 *
 * Files are mapped whole, read-only and MAP_PRIVATE without MAP_POPULATE, so opening a 60 GB model
 * costs page tables, not RAM, and only the pages of tensors actually read become resident. The
 * descriptor is closed right after mmap; the mapping keeps the file alive. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weights_internal.h"

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
