/* A program built against an installed rlx, as an application author would build it (CMake:
 * find_package(rlx) and rlx::rlx; or `pkg-config --cflags --libs rlx`). Loads the backend
 * named argv[1] (searching argv[2] first, if given), runs one ADD node on it and prints
 * "ok <backend> <sums>"; on failure prints the rlx error and exits 1. */
#include <stdio.h>

#include <rlx/rlx.h>

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "cpu-blas", *dir = argc > 2 ? argv[2] : NULL;
    rlx_registry *reg = NULL;
    rlx_plugin_handle *plugin = NULL;
    rlx_backend *b = NULL;
    int status = 1;
    if (rlx_registry_create(dir, &reg) != RLX_OK ||
        rlx_registry_load(reg, RLX_PLUGIN_BACKEND, name, &plugin) != RLX_OK ||
        rlx_backend_create(plugin, NULL, &b) != RLX_OK) {
        fprintf(stderr, "consumer: %s\n", rlx_last_error());
        goto done;
    }
    _Alignas(64) float a[3] = {1, 2, 3}, c[3] = {10, 20, 30}, y[3] = {0};
    rlx_tensor in[2] = {{.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, 3, 1, 1}, .data = a},
                        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, 3, 1, 1}, .data = c}};
    rlx_tensor out = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, 3, 1, 1}, .data = y};
    rlx_op_params p = {0};
    rlx_node_view v = {
        .op = RLX_OP_ADD, .n_inputs = 2, .inputs = in, .output = &out, .params = &p, .name = "consumer.add"};
    if (!rlx_backend_supports(b, &v)) {
        fprintf(stderr, "consumer: backend %s does not claim ADD\n", rlx_backend_name(b));
        goto done;
    }
    if (rlx_backend_compute(b, &v) != RLX_OK) {
        fprintf(stderr, "consumer: %s\n", rlx_last_error());
        goto done;
    }
    printf("ok %s %g %g %g (ABI %d.%d)\n", rlx_backend_name(b), (double)y[0], (double)y[1], (double)y[2], RLX_ABI_MAJOR,
           RLX_ABI_MINOR);
    status = 0;
done:
    rlx_backend_destroy(b);
    rlx_plugin_unload(plugin);
    rlx_registry_destroy(reg);
    return status;
}
