/* Every heap allocation of librlx, and of plugins through rlx_host.alloc, goes through these,
 * so a test can make any one of them fail (rlx_debug_fail_alloc) and check that each failure
 * becomes an error naming what could not be allocated, with nothing leaked. */
#ifndef RLX_UTIL_ALLOC_H
#define RLX_UTIL_ALLOC_H

#include <stddef.h>

void *rlx__malloc(size_t size);
void *rlx__calloc(size_t n, size_t size);
void *rlx__realloc(void *p, size_t size);
char *rlx__strdup(const char *s);
char *rlx__strndup(const char *s, size_t n);
void *rlx__aligned_alloc(size_t align, size_t size);
/* Zeroed pages mapped anonymously (munmap them): untouched pages cost no memory, so a KV cache
 * can be sized for its longest context. */
void *rlx__map_zeroed(size_t size);

#endif
