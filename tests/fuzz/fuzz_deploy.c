/* libFuzzer target: the deployment file reader (core/src/deploy/deploy.c, YAML through libyaml)
 * on arbitrary bytes as a deploy.yaml. A file that parses is then read through every accessor,
 * and its stages' layers resolved for a fixed 8-layer model the way `rlx stage` and the driver
 * resolve them, which must give ranges that cover the model. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_files.h"
#include "rlx/deploy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { LAYERS = 8 };

/* The Brown target's shape (share/models/brown/target), so the split by weights has sizes. */
static rlx_model_config model_config(void) {
    rlx_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    c.vocab_size = 4096;
    c.hidden_size = 512;
    c.intermediate_size = 2048;
    c.num_hidden_layers = LAYERS;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 64;
    c.max_position_embeddings = 2048;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tie_word_embeddings = 1;
    c.bos_id = -1;
    return c;
}

static volatile size_t sink;

static void touch(const char *s) { sink += s ? strlen(s) : 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("deploy.yaml", data, size);
    rlx_deploy *d;
    if (rlx_deploy_open(fuzz_path("deploy.yaml"), &d) != RLX_OK)
        return 0;
    touch(rlx_deploy_path(d));
    touch(rlx_deploy_model(d));
    touch(rlx_deploy_transport(d));
    const uint32_t n = rlx_deploy_n_stages(d);
    for (uint32_t i = 0; i < n; i++) {
        const rlx_deploy_stage *s = rlx_deploy_stage_at(d, i);
        touch(s->address);
        touch(s->listen);
        touch(s->backend);
        touch(s->backend_options);
        for (uint32_t k = 0; k < s->n_standby; k++)
            touch(s->standby[k]);
    }
    if (rlx_deploy_stage_at(d, n) != NULL) {
        fprintf(stderr, "rlx_deploy_stage_at(%u) of %u stages is not NULL\n", n, n);
        abort();
    }
    const rlx_deploy_speculator *spec = rlx_deploy_speculator_of(d);
    if (spec) {
        touch(spec->plugin);
        touch(spec->draft_model);
        touch(spec->options);
    }
    sink += rlx_deploy_generation_of(d)->max_tokens + rlx_deploy_timeouts_of(d)->connect_ms;

    const rlx_model_config cfg = model_config();
    rlx_layer_range *ranges = calloc(n, sizeof *ranges);
    rlx_driver_stage *stages = calloc(n, sizeof *stages);
    if (ranges && stages && rlx_deploy_layers(d, &cfg, ranges) == RLX_OK) {
        if (rlx_dist_check_ranges(LAYERS, ranges, n) != RLX_OK) {
            fprintf(stderr, "rlx_deploy_layers gave ranges that do not cover the model: %s\n", rlx_last_error());
            abort();
        }
        if (rlx_deploy_driver_stages(d, &cfg, stages) != RLX_OK) {
            fprintf(stderr, "rlx_deploy_driver_stages failed where rlx_deploy_layers did not: %s\n", rlx_last_error());
            abort();
        }
        for (uint32_t i = 0; i < n; i++)
            if (stages[i].layers.start != ranges[i].start || stages[i].layers.end != ranges[i].end) {
                fprintf(stderr, "stage %u: the driver's layers differ from rlx_deploy_layers'\n", i);
                abort();
            }
    }
    free(stages);
    free(ranges);
    rlx_deploy_close(d);
    return 0;
}
