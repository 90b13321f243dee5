/* Loading OpenBLAS for cpu-blas: see openblas.h. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "openblas.h"
#include "rlx/status.h"

#ifndef RLX_OPENBLAS_SONAME
#define RLX_OPENBLAS_SONAME "libopenblas.so.0"
#endif

/* How long the probe below may take before its answer counts as unknown. */
#define CPU_BLAS_PROBE_MS 10000

cpu_blas_cpu cpu_blas_cpu_detect(void) {
    __builtin_cpu_init();
    return (cpu_blas_cpu){
        .avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
        .avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512cd"),
        .avx512_bf16 = __builtin_cpu_supports("avx512bf16"),
        .amd = __builtin_cpu_is("amd"),
    };
}

const char *cpu_blas_openblas_core(const cpu_blas_cpu *cpu, const char *detected) {
    /* the cores of OpenBLAS 0.3.21 with AVX2 kernels; any other is a fallback on such a CPU */
    static const char *const avx2_cores[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"};
    if (!detected || !cpu->avx2_fma)
        return NULL;
    for (size_t i = 0; i < sizeof avx2_cores / sizeof avx2_cores[0]; i++)
        if (strcasecmp(detected, avx2_cores[i]) == 0)
            return NULL;
    if (cpu->avx512)
        return cpu->avx512_bf16 ? "Cooperlake" : "SkylakeX";
    return cpu->amd ? "Zen" : "Haswell";
}

/* The core OpenBLAS picks by itself, asked of rlx-blas-probe beside this plugin: once loaded,
 * OpenBLAS keeps the core it chose, so this process must not load it before deciding, and a
 * spawned program (unlike a fork of this possibly multithreaded process) may load libraries
 * safely. false when unknown: no probe, or no answer in time. */
static bool cpu_blas_probe_core(char *out, size_t size) {
    Dl_info self;
    char probe[4096];
    if (!dladdr((void *)cpu_blas_probe_core, &self) || !self.dli_fname || !strrchr(self.dli_fname, '/') ||
        snprintf(probe, sizeof probe, "%.*s/rlx-blas-probe", (int)(strrchr(self.dli_fname, '/') - self.dli_fname),
                 self.dli_fname) >= (int)sizeof probe)
        return false;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return false;
    posix_spawn_file_actions_t actions;
    pid_t pid = -1;
    char *argv[] = {probe, NULL};
    if (posix_spawn_file_actions_init(&actions) == 0) {
        if (posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO) == 0 &&
            posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0) == 0 &&
            posix_spawn(&pid, probe, &actions, NULL, argv, environ) != 0)
            pid = -1;
        posix_spawn_file_actions_destroy(&actions);
    }
    close(fds[1]);
    size_t len = 0;
    if (pid > 0) {
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        ssize_t got;
        while (len + 1 < size && poll(&pfd, 1, CPU_BLAS_PROBE_MS) > 0 &&
               (got = read(fds[0], out + len, size - 1 - len)) > 0)
            len += (size_t)got;
        kill(pid, SIGKILL); /* a no-op unless it hangs */
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            len = 0;
    }
    close(fds[0]);
    out[len] = '\0';
    return len > 0;
}

typedef struct cpu_blas_copies {
    const char *ours; /* the path of the copy we loaded */
    char other[256];
} cpu_blas_copies;

static int cpu_blas_find_other(struct dl_phdr_info *info, size_t size, void *ctx) {
    (void)size;
    cpu_blas_copies *c = ctx;
    if (info->dlpi_name && strstr(info->dlpi_name, "openblas") && strcmp(info->dlpi_name, c->ours) != 0) {
        snprintf(c->other, sizeof c->other, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

static cpu_blas_openblas cpu_blas_ob;
static char cpu_blas_ob_error[512];
static pthread_once_t cpu_blas_ob_once = PTHREAD_ONCE_INIT;

static void cpu_blas_openblas_init(void) {
    cpu_blas_openblas *ob = &cpu_blas_ob;
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *set = NULL;
    char detected[64] = "";
    if (user && *user) {
        snprintf(ob->origin, sizeof ob->origin, "OPENBLAS_CORETYPE=%s set by the user", user);
    } else if (dlopen(RLX_OPENBLAS_SONAME, RTLD_NOW | RTLD_NOLOAD)) {
        snprintf(ob->origin, sizeof ob->origin, "chosen when something else loaded OpenBLAS first");
    } else {
        const cpu_blas_cpu cpu = cpu_blas_cpu_detect();
        /* only a CPU with AVX2 can be short-changed, so only then is the probe worth running */
        const bool probed = cpu.avx2_fma && cpu_blas_probe_core(detected, sizeof detected);
        if (probed)
            set = cpu_blas_openblas_core(&cpu, detected);
        if (set)
            snprintf(ob->origin, sizeof ob->origin, "OPENBLAS_CORETYPE set by rlx: OpenBLAS alone picks %s", detected);
        else
            snprintf(ob->origin, sizeof ob->origin, "chosen by OpenBLAS%s",
                     probed || !cpu.avx2_fma ? "" : "; rlx-blas-probe gave no answer");
    }
    /* OpenBLAS reads the variable only while it loads; taking it out again keeps child
     * processes (launched stages) from mistaking it for the user's */
    if (set)
        setenv("OPENBLAS_CORETYPE", set, 1);
    void *h = dlopen(RLX_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (set)
        unsetenv("OPENBLAS_CORETYPE");
    if (!h) {
        snprintf(cpu_blas_ob_error, sizeof cpu_blas_ob_error, "cpu-blas: cannot load OpenBLAS: %s", dlerror());
        return;
    }
    const struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cblas_sgemm", (void **)&ob->sgemm},
        {"cblas_sgemv", (void **)&ob->sgemv},
        {"openblas_set_num_threads", (void **)&ob->set_num_threads},
        {"openblas_get_num_threads", (void **)&ob->get_num_threads},
        {"openblas_get_config", (void **)&ob->get_config},
        {"openblas_get_corename", (void **)&ob->get_corename},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
            snprintf(cpu_blas_ob_error, sizeof cpu_blas_ob_error, "cpu-blas: %s has no %s", RLX_OPENBLAS_SONAME,
                     syms[i].name);
            return;
        }
    /* another OpenBLAS in the process (linked by the application, say) has its own threads and
     * core; say so, as it competes with ours */
    struct link_map *map = NULL;
    cpu_blas_copies copies = {.ours = ""};
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map)
        copies.ours = map->l_name;
    if (dl_iterate_phdr(cpu_blas_find_other, &copies)) {
        size_t len = strlen(ob->origin);
        snprintf(ob->origin + len, sizeof ob->origin - len, "; another OpenBLAS is loaded too: %s", copies.other);
    }
}

const cpu_blas_openblas *cpu_blas_openblas_load(const rlx_host *host) {
    pthread_once(&cpu_blas_ob_once, cpu_blas_openblas_init);
    if (cpu_blas_ob_error[0]) {
        host->error(RLX_E_UNSUPPORTED, "%s", cpu_blas_ob_error);
        return NULL;
    }
    return &cpu_blas_ob;
}
