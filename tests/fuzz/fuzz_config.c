/* libFuzzer target: the config readers (core/src/model/config.c) on arbitrary bytes, as a
 * model's config.json and as its generation_config.json (both read the same input). A config
 * that loads is then used the way a model uses it: every layer asked whether it is sparse, its
 * layers split over stages by weight, and its generation_config.json read on top of it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_files.h"
#include "rlx/dist.h"
#include "rlx/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("config.json", data, size);
    fuzz_write("generation_config.json", data, size);
    rlx_generation_defaults g;
    (void)rlx_generation_config_load(fuzz_dir_path(), &g);

    rlx_model_config cfg;
    if (rlx_model_config_load(fuzz_path("config.json"), &cfg) != RLX_OK)
        return 0;
    volatile int sparse = 0;
    for (int64_t layer = 0; layer < cfg.num_hidden_layers; layer++)
        sparse += rlx_model_config_layer_is_moe(&cfg, layer);
    (void)sparse;
    enum { STAGES = 3 };
    rlx_layer_range ranges[STAGES];
    if (rlx_dist_split_balanced(&cfg, STAGES, ranges) == RLX_OK &&
        rlx_dist_check_ranges((uint32_t)cfg.num_hidden_layers, ranges, STAGES) != RLX_OK) {
        fprintf(stderr, "the balanced split of %lld layers is not a pipeline: %s\n", (long long)cfg.num_hidden_layers,
                rlx_last_error());
        abort();
    }
    (void)rlx_model_config_load_generation(fuzz_path("generation_config.json"), &cfg);
    return 0;
}
