/* Linked into every executable of the sanitizer build (RLX_SANITIZE): AddressSanitizer's options
 * every rlx process needs, whatever ASAN_OPTIONS the environment gives (it is parsed after these).
 *
 * intercept_tls_get_addr=0: GCC 12's runtime (Debian 12) takes a dynamic TLS block that starts
 * 16 bytes past a page boundary for one with a glibc 2.19 header and reads its bounds from the two
 * words before it. Since glibc 2.25 there is no such header, so when a block lands there by chance,
 * LeakSanitizer's exit-time tracer reads garbage bounds and dies ("Tracer caught signal 11"): the
 * rare, load-dependent failure of processes with threads and dlopen'd libraries (mpirun ranks,
 * gRPC drivers). LLVM 17 dropped the heuristic. Leak checking still scans each thread's static TLS
 * and, through it, the heap blocks glibc allocates for dynamic TLS. */
__attribute__((visibility("default"))) const char *__asan_default_options(void);

const char *__asan_default_options(void) { return "intercept_tls_get_addr=0"; }
