/* rlx-blas-probe: prints the core OpenBLAS picks by itself on this CPU. cpu-blas runs it as a
 * fresh process before it loads OpenBLAS (which keeps the core it chose at load), rather than
 * forking itself: a fork of a multithreaded process may not call dlopen safely. */
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    void *h = dlopen(RLX_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    char *(*corename)(void) = h ? (char *(*)(void))dlsym(h, "openblas_get_corename") : NULL;
    if (!corename) {
        fprintf(stderr, "rlx-blas-probe: cannot load %s: %s\n", RLX_OPENBLAS_SONAME, dlerror());
        return 1;
    }
    fputs(corename(), stdout);
    return 0;
}
