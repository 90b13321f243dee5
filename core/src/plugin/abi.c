/* Pins the layout of every struct that crosses the plugin boundary (LP64). A failing assertion
 * here means a change would break plugins built against RLX_ABI_MAJOR: append members
 * instead, or bump the major. */
#include <stddef.h>

#include "rlx/backend.h"
#include "rlx/speculator.h"

#define PIN(type, member, offset) _Static_assert(offsetof(type, member) == (offset), #type "." #member " moved")

PIN(rlx_tensor, dtype, 0);
PIN(rlx_tensor, n_dims, 4);
PIN(rlx_tensor, shape, 8);
PIN(rlx_tensor, data, 40);
_Static_assert(sizeof(rlx_tensor) == 48, "rlx_tensor size changed");

PIN(rlx_op_params, eps, 0);
PIN(rlx_op_params, rope_theta, 4);
PIN(rlx_op_params, scale, 8);
PIN(rlx_op_params, head_dim, 12);
PIN(rlx_op_params, n_heads, 16);
PIN(rlx_op_params, n_kv_heads, 20);
PIN(rlx_op_params, window, 24);
PIN(rlx_op_params, n_experts, 28);
PIN(rlx_op_params, top_k, 32);
PIN(rlx_op_params, norm_topk, 36);
PIN(rlx_op_params, layer, 40);
PIN(rlx_op_params, head_dim_v, 44); /* 1.6 */
PIN(rlx_op_params, rope_dims, 48);  /* 1.6 */
PIN(rlx_op_params, kv_tiled, 52);   /* 1.6 */
PIN(rlx_op_params, state_rows, 56); /* 1.7 */
_Static_assert(sizeof(rlx_op_params) == 64, "rlx_op_params size changed");

PIN(rlx_node_view, op, 0);
PIN(rlx_node_view, n_inputs, 4);
PIN(rlx_node_view, inputs, 8);
PIN(rlx_node_view, output, 16);
PIN(rlx_node_view, params, 24);
PIN(rlx_node_view, name, 32);
PIN(rlx_node_view, prepared, 40);
PIN(rlx_node_view, input_ids, 48);
PIN(rlx_node_view, output_id, 56);
_Static_assert(sizeof(int) == sizeof(int32_t), "graph ids are handed to backends as int32_t");

PIN(rlx_weight_info, size, 0);
PIN(rlx_weight_info, flags, 4);
PIN(rlx_weight_info, tensor, 8);
PIN(rlx_weight_info, name, 16);
PIN(rlx_weight_info, op, 24);
PIN(rlx_weight_info, input, 28);
PIN(rlx_weight_info, node, 32);

PIN(rlx_span, size, 0);
PIN(rlx_span, n_nodes, 4);
PIN(rlx_span, nodes, 8);
PIN(rlx_span, last_use, 16);

PIN(rlx_host, size, 0);
PIN(rlx_host, abi_major, 4);
PIN(rlx_host, abi_minor, 8);
PIN(rlx_host, log, 16);
PIN(rlx_host, error, 24);
PIN(rlx_host, alloc, 32);
PIN(rlx_host, free, 40);

PIN(rlx_plugin, size, 0);
PIN(rlx_plugin, abi_major, 4);
PIN(rlx_plugin, abi_minor, 8);
PIN(rlx_plugin, kind, 12);
PIN(rlx_plugin, name, 16);
PIN(rlx_plugin, version, 24);
PIN(rlx_plugin, summary, 32);
PIN(rlx_plugin, iface, 40);

PIN(rlx_backend_options, size, 0);
PIN(rlx_backend_options, n_threads, 4);
PIN(rlx_backend_options, extra, 8);

PIN(rlx_backend_iface, size, 0);
PIN(rlx_backend_iface, open, 8);
PIN(rlx_backend_iface, close, 16);
PIN(rlx_backend_iface, supports, 24);
PIN(rlx_backend_iface, compute, 32);
PIN(rlx_backend_iface, precision, 40);
PIN(rlx_backend_iface, describe, 48);
PIN(rlx_backend_iface, prepare_weight, 56);
PIN(rlx_backend_iface, release_weight, 64);
PIN(rlx_backend_iface, plan_span, 72);
PIN(rlx_backend_iface, compute_span, 80);
PIN(rlx_backend_iface, release_span, 88);

PIN(rlx_spec_target, size, 0);
PIN(rlx_spec_target, kv_capacity, 4);
PIN(rlx_spec_target, model_dir, 8);
PIN(rlx_spec_target, vocab, 16);
PIN(rlx_spec_target, hidden_size, 24);
PIN(rlx_spec_target, backends, 32);
PIN(rlx_spec_target, n_backends, 40);
PIN(rlx_spec_target, rules, 48);
PIN(rlx_spec_target, n_rules, 56);
PIN(rlx_spec_target, options, 64);

PIN(rlx_speculator_iface, size, 0);
PIN(rlx_speculator_iface, flags, 4);
PIN(rlx_speculator_iface, open, 8);
PIN(rlx_speculator_iface, close, 16);
PIN(rlx_speculator_iface, reset, 24);
PIN(rlx_speculator_iface, propose, 32);

// ---- the speculator boundary: every struct a speculator plugin is handed or hands the core ----
/* The sized ones start with their size and are read only as far as it reaches (gen.h,
 * speculator_iface.h); the others are pinned whole. */

PIN(rlx_sampler_params, size, 0);
PIN(rlx_sampler_params, greedy, 4);
PIN(rlx_sampler_params, temperature, 8);
PIN(rlx_sampler_params, top_k, 12);
PIN(rlx_sampler_params, top_p, 16);
PIN(rlx_sampler_params, seed, 24);
_Static_assert(RLX_SAMPLER_PARAMS_SIZE_1 == offsetof(rlx_sampler_params, seed) + sizeof(uint64_t),
               "the first version of rlx_sampler_params ends after seed");
PIN(rlx_sampler_params, min_p, 32);
PIN(rlx_sampler_params, repeat_penalty, 36);
PIN(rlx_sampler_params, repeat_last_n, 40);
PIN(rlx_sampler_params, presence_penalty, 44);
PIN(rlx_sampler_params, frequency_penalty, 48);
/* a writer of the 56-byte version (through frequency_penalty and its padding) has no biases */
PIN(rlx_sampler_params, logit_bias, 56);
PIN(rlx_sampler_params, n_logit_bias, 64);
_Static_assert(sizeof(rlx_sampler_params) == 72, "rlx_sampler_params size changed");

PIN(rlx_spec_update, size, 0);
PIN(rlx_spec_update, tokens, 8);
PIN(rlx_spec_update, n_tokens, 16);
PIN(rlx_spec_update, n_accepted, 20);
PIN(rlx_spec_update, hidden, 24);
PIN(rlx_spec_update, n_hidden, 32);
_Static_assert(sizeof(rlx_spec_update) == 40, "rlx_spec_update size changed");

_Static_assert(sizeof(rlx_spec_target) == 72, "rlx_spec_target size changed");

PIN(rlx_session_options, size, 0);
PIN(rlx_session_options, kv_capacity, 4);
PIN(rlx_session_options, backends, 8);
PIN(rlx_session_options, n_backends, 16);
PIN(rlx_session_options, rules, 24);
PIN(rlx_session_options, n_rules, 32);
PIN(rlx_session_options, kv_dtype, 40); /* appended: a speculator built before it gets F32 caches */
PIN(rlx_session_options, check_finite, 44);
/* appended: the core reads a caller's struct up to its size, so an older speculator's session
 * keeps the trained length as its limit */
PIN(rlx_session_options, beyond_trained, 48);
_Static_assert(sizeof(rlx_session_options) == 56, "rlx_session_options size changed");

PIN(rlx_place_rule, op, 0);
PIN(rlx_place_rule, backend, 8);
_Static_assert(sizeof(rlx_place_rule) == 16, "rlx_place_rule size changed");

PIN(rlx_block_spec, size, 0);
PIN(rlx_block_spec, layer_start, 4);
PIN(rlx_block_spec, layer_end, 8);
PIN(rlx_block_spec, embed_input, 12);
PIN(rlx_block_spec, produce_logits, 16);
PIN(rlx_block_spec, all_logits, 20);
PIN(rlx_block_spec, emit_hidden, 24);
PIN(rlx_block_spec, mtp, 28);
_Static_assert(sizeof(rlx_block_spec) == 32, "rlx_block_spec size changed");

/* Read through rlx_model_config_of (the core's copy, never the plugin's): members are only
 * appended, so a plugin built earlier reads the ones it knows where they have always been. */
PIN(rlx_model_config, model_type, 0);
PIN(rlx_model_config, vocab_size, 32);
PIN(rlx_model_config, hidden_size, 40);
PIN(rlx_model_config, intermediate_size, 48);
PIN(rlx_model_config, num_hidden_layers, 56);
PIN(rlx_model_config, num_attention_heads, 64);
PIN(rlx_model_config, num_key_value_heads, 72);
PIN(rlx_model_config, head_dim, 80);
PIN(rlx_model_config, max_position_embeddings, 88);
PIN(rlx_model_config, rms_norm_eps, 96);
PIN(rlx_model_config, rope_theta, 104);
PIN(rlx_model_config, tie_word_embeddings, 112);
PIN(rlx_model_config, attention_bias, 116);
PIN(rlx_model_config, use_sliding_window, 120);
PIN(rlx_model_config, sliding_window, 128);
PIN(rlx_model_config, max_window_layers, 136);
PIN(rlx_model_config, layer_sliding, 144);
PIN(rlx_model_config, num_experts, 1168);
PIN(rlx_model_config, num_experts_per_tok, 1176);
PIN(rlx_model_config, moe_intermediate_size, 1184);
PIN(rlx_model_config, decoder_sparse_step, 1192);
PIN(rlx_model_config, norm_topk_prob, 1200);
PIN(rlx_model_config, layer_dense_mlp, 1204);
PIN(rlx_model_config, eos_ids, 2228);
PIN(rlx_model_config, n_eos, 2260);
PIN(rlx_model_config, bos_id, 2264);

PIN(rlx_model_arch_info, size, 0);
PIN(rlx_model_arch_info, qk_norm, 4);
PIN(rlx_model_arch_info, qkv_bias, 8);
PIN(rlx_model_arch_info, o_bias, 12);
PIN(rlx_model_arch_info, rope_type, 16);
PIN(rlx_model_arch_info, arch, 20);
_Static_assert(sizeof(rlx_model_arch_info) == 52, "rlx_model_arch_info size changed");
PIN(rlx_model_layer_info, size, 0);
PIN(rlx_model_layer_info, window, 4);
PIN(rlx_model_layer_info, moe, 8);
PIN(rlx_model_layer_info, linear, 12);
_Static_assert(sizeof(rlx_model_layer_info) == 16, "rlx_model_layer_info size changed");
