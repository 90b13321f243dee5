/* The names that one function per operation retired (docs/embedding.md, "Deprecated names"):
 * each calls its successor, kept for outside callers for one release and removed in rlx 0.3
 * together with the "deprecated" block of each header. */
#include "rlx/dist.h"
#include "rlx/engine.h"
#include "rlx/gen.h"
#include "rlx/model.h"
#include "rlx/sched.h"
#include "rlx/speculator.h"

rlx_status rlx_plan_create_opts(const rlx_graph *g, const rlx_plan_options *opts, rlx_plan **out) {
    return rlx_plan_create(g, opts, out);
}

rlx_status rlx_plan_create_placed(const rlx_graph *g, rlx_backend *const *backends, size_t n_backends,
                                  const rlx_place_rule *rules, size_t n_rules, rlx_plan **out) {
    const rlx_plan_options o = {
        .size = sizeof o, .backends = backends, .n_backends = n_backends, .rules = rules, .n_rules = n_rules};
    return rlx_plan_create(g, &o, out);
}

rlx_status rlx_backend_create_ref_opts(const rlx_backend_options *opts, rlx_backend **out) {
    return rlx_backend_create_ref(opts, out);
}

rlx_status rlx_model_build_block_ex(const rlx_model *m, const rlx_block_spec *spec, const rlx_build_options *o,
                                    rlx_graph **graph, rlx_batch_io *io) {
    return rlx_model_build_block(m, spec, o, graph, io);
}

rlx_status rlx_generate_ex(const rlx_lm *lm, rlx_sampler *sampler, const int32_t *prompt, uint32_t n_prompt,
                           uint32_t max_new, rlx_token_fn fn, void *ctx, rlx_gen_stats *stats) {
    return rlx_generate(lm, sampler, prompt, n_prompt, max_new, fn, ctx, stats);
}

rlx_status rlx_session_generate(rlx_session *s, rlx_sampler *sampler, const int32_t *prompt, uint32_t n_prompt,
                                uint32_t max_new, rlx_token_fn fn, void *ctx, rlx_gen_stats *stats) {
    rlx_lm lm;
    rlx_status rc = rlx_session_lm(s, &lm);
    return rc == RLX_OK ? rlx_generate(&lm, sampler, prompt, n_prompt, max_new, fn, ctx, stats) : rc;
}

rlx_status rlx_spec_generate_ex(const rlx_lm *lm, rlx_speculator *spec, uint32_t k, rlx_sampler *sampler,
                                const int32_t *prompt, uint32_t n_prompt, uint32_t max_new, rlx_token_fn fn, void *ctx,
                                rlx_spec_stats *stats) {
    return rlx_spec_generate(lm, spec, k, sampler, prompt, n_prompt, max_new, fn, ctx, stats);
}

rlx_status rlx_driver_stage_info_get(const rlx_driver *d, uint32_t i, rlx_driver_stage_info *out) {
    return rlx_driver_stage_info_of(d, i, out);
}

void rlx_driver_stats_get(const rlx_driver *d, rlx_driver_stats *out) { rlx_driver_stats_of(d, out); }

rlx_status rlx_driver_stage_stats_get(const rlx_driver *d, uint32_t i, rlx_driver_stage_stats *out) {
    return rlx_driver_stage_stats_of(d, i, out);
}

rlx_status rlx_engine_slot_info_get(rlx_engine *e, uint32_t i, rlx_engine_slot_info *out) {
    return rlx_engine_slot_info_of(e, i, out);
}
