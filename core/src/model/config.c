/* config.json and generation_config.json: the model_type picks the architecture (arch.h), whose
 * reader fills the architecture-neutral description with the helpers here.
 *
 * Field names, defaults and the per-layer flags derived from them follow the Hugging Face
 * configuration classes (Qwen3Config, ...), so a checkpoint means the same here as in transformers.
 * Types are checked strictly (a count must be a JSON integer, a flag a JSON boolean): a 3.5 or a
 * "28" in a config is a broken file, not a value to guess at. JSON null in an optional field means
 * "use the default", as Python's None does in transformers. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "gguf.h"
#include "model_internal.h"
#include "rlx/model.h"
#include "util/alloc.h"
#include "util/json.h"

#define REQUIRED RLX__REQUIRED

// ---- typed fields

rlx_status rlx__hf_wrong_type(const char *path, const char *field, const char *expected, const cJSON *item) {
    char got[64];
    rlx__json_describe(item, got, sizeof got);
    return rlx_error(RLX_E_FORMAT, "%s: field '%s' must be %s, got %s", path, field, expected, got);
}

/* An integer field in [min, max]; absent or null takes dflt, unless dflt is REQUIRED. */
rlx_status rlx__hf_int(const char *path, const cJSON *obj, const char *key, int64_t dflt, int64_t min, int64_t max,
                       int64_t *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item || (cJSON_IsNull(item) && dflt != REQUIRED)) {
        if (dflt == REQUIRED)
            return rlx_error(RLX_E_FORMAT, "%s: missing required field '%s'", path, key);
        *out = dflt;
        return RLX_OK;
    }
    int64_t v;
    if (!rlx__json_int(item, &v))
        return rlx__hf_wrong_type(path, key, "an integer", item);
    if (v < min || v > max)
        return rlx_error(RLX_E_FORMAT, "%s: field '%s' is %" PRId64 ", must be in [%" PRId64 ", %" PRId64 "]", path,
                         key, v, min, max);
    *out = v;
    return RLX_OK;
}

/* A finite number > 0; absent or null takes dflt unless required. */
static rlx_status get_positive(const char *path, const cJSON *obj, const char *key, int required, double dflt,
                               double *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item || (cJSON_IsNull(item) && !required)) {
        if (required)
            return rlx_error(RLX_E_FORMAT, "%s: missing required field '%s'", path, key);
        *out = dflt;
        return RLX_OK;
    }
    if (!cJSON_IsNumber(item))
        return rlx__hf_wrong_type(path, key, "a number", item);
    double v = item->valuedouble;
    if (!(v > 0 && v <= 1e300)) /* 1e300 keeps out the infinity a literal like 1e999 parses to */
        return rlx__hf_wrong_type(path, key, "a positive number", item);
    *out = v;
    return RLX_OK;
}

rlx_status rlx__hf_bool(const char *path, const cJSON *obj, const char *key, int dflt, int *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item || cJSON_IsNull(item)) {
        *out = dflt;
        return RLX_OK;
    }
    if (!cJSON_IsBool(item))
        return rlx__hf_wrong_type(path, key, "true or false", item);
    *out = cJSON_IsTrue(item);
    return RLX_OK;
}

/* Adds the token ids of item (an integer, a list of integers or null) to ids[*n], skipping ids
 * already there, as Hugging Face accepts eos_token_id in both forms. */
static rlx_status add_token_ids(const char *path, const char *key, const cJSON *item, int32_t *ids, uint32_t *n) {
    if (!item || cJSON_IsNull(item))
        return RLX_OK;
    if (!cJSON_IsNumber(item) && !cJSON_IsArray(item))
        return rlx__hf_wrong_type(path, key, "an integer or a list of integers", item);
    int is_list = cJSON_IsArray(item);
    const cJSON *e = is_list ? item->child : item;
    for (int index = 0; e; index++, e = is_list ? e->next : NULL) {
        int64_t id;
        if (!rlx__json_int(e, &id) || id < 0 || id > INT32_MAX) {
            char field[64];
            if (is_list)
                snprintf(field, sizeof field, "%s[%d]", key, index);
            else
                snprintf(field, sizeof field, "%s", key);
            return rlx__hf_wrong_type(path, field, "a token id (an integer >= 0)", e);
        }
        uint32_t k = 0;
        while (k < *n && ids[k] != (int32_t)id)
            k++;
        if (k < *n)
            continue;
        if (*n == RLX_MAX_EOS)
            return rlx_error(RLX_E_FORMAT, "%s: field '%s' makes more than %d distinct end-of-sequence ids", path, key,
                             RLX_MAX_EOS);
        ids[(*n)++] = (int32_t)id;
    }
    return RLX_OK;
}

// ---- config.json

static rlx_status get_arch(const char *path, const cJSON *root, rlx__model_desc *d) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!item)
        return rlx_error(RLX_E_FORMAT, "%s: missing required field 'model_type'", path);
    if (!cJSON_IsString(item))
        return rlx__hf_wrong_type(path, "model_type", "a string", item);
    char list[RLX__ARCH_LIST_SIZE];
    if (!(d->arch = rlx__arch_by_hf(item->valuestring)))
        return rlx_error(RLX_E_FORMAT,
                         "%s: field 'model_type' is \"%.64s\", an architecture rlx does not run; it runs %s", path,
                         item->valuestring, rlx__arch_list(list, sizeof list));
    snprintf(d->cfg.model_type, sizeof d->cfg.model_type, "%s", item->valuestring);
    return RLX_OK;
}

/* An explicit layer_types list wins; otherwise Hugging Face slides layers i >= max_window_layers
 * when use_sliding_window is set and sliding_window is not null. */
static rlx_status get_layer_types(const char *path, const cJSON *root, int window_null, rlx_model_config *c) {
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (!types || cJSON_IsNull(types)) {
        for (int64_t i = 0; i < c->num_hidden_layers; i++)
            c->layer_sliding[i] = c->use_sliding_window && !window_null && i >= c->max_window_layers;
        return RLX_OK;
    }
    if (!cJSON_IsArray(types))
        return rlx__hf_wrong_type(path, "layer_types", "a list of strings", types);
    int n = cJSON_GetArraySize(types);
    if (n != c->num_hidden_layers)
        return rlx_error(RLX_E_FORMAT, "%s: field 'layer_types' has %d entries, num_hidden_layers is %" PRId64, path, n,
                         c->num_hidden_layers);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, types) {
        if (cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0) {
            c->layer_sliding[i] = 0;
        } else if (cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0) {
            c->layer_sliding[i] = 1;
        } else {
            char field[32];
            snprintf(field, sizeof field, "layer_types[%d]", i);
            return rlx__hf_wrong_type(path, field, "\"full_attention\" or \"sliding_attention\"", e);
        }
        i++;
    }
    return RLX_OK;
}

rlx_status rlx__hf_read_qwen_sliding(const char *path, const cJSON *root, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    rlx_status st;
    if ((st = rlx__hf_bool(path, root, "use_sliding_window", 0, &c->use_sliding_window)) != RLX_OK)
        return st;
    /* Unlike the other optional fields, null here is meaningful: no window at all. */
    const cJSON *window = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    int window_null = cJSON_IsNull(window);
    if (window_null)
        c->sliding_window = 0;
    else if ((st = rlx__hf_int(path, root, "sliding_window", 4096, 1, INT32_MAX, &c->sliding_window)) != RLX_OK)
        return st;
    if ((st = rlx__hf_int(path, root, "max_window_layers", c->num_hidden_layers, 0, INT32_MAX,
                          &c->max_window_layers)) != RLX_OK)
        return st;
    if ((st = get_layer_types(path, root, window_null, c)) != RLX_OK)
        return st;
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        if (c->layer_sliding[i] && c->sliding_window == 0)
            return rlx_error(RLX_E_FORMAT,
                             "%s: field 'sliding_window' is null but layer %" PRId64 " uses sliding attention", path,
                             i);
        d->layers[i].window = c->layer_sliding[i] ? (uint32_t)c->sliding_window : 0;
    }
    return RLX_OK;
}

/* Llama 3.1's per-pair frequency divisors, as transformers' _compute_llama3_parameters scales
 * inv_freq (and llama.cpp's converter writes them as rope_freqs): pairs whose wavelength is
 * shorter than original_max_position_embeddings / high_freq_factor keep their frequency, those
 * longer than original / low_freq_factor are divided by factor, and those between are smoothed. */
static rlx_status llama3_factors(const char *path, rlx__model_desc *d) {
    const rlx__rope_llama3 *p = &d->llama3;
    const int64_t half = d->cfg.head_dim / 2;
    if (!(d->rope_freqs = rlx__malloc((size_t)half * sizeof *d->rope_freqs)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    const double low_wavelen = (double)p->original_max_position_embeddings / p->low_freq_factor;
    const double high_wavelen = (double)p->original_max_position_embeddings / p->high_freq_factor;
    for (int64_t i = 0; i < half; i++) {
        const double inv_freq = pow(d->cfg.rope_theta, -2.0 * (double)i / (double)d->cfg.head_dim);
        const double wavelen = 6.283185307179586 / inv_freq; /* 2 pi */
        double divisor = 1.0;
        if (wavelen > low_wavelen) {
            divisor = p->factor;
        } else if (wavelen >= high_wavelen) {
            const double smooth = ((double)p->original_max_position_embeddings / wavelen - p->low_freq_factor) /
                                  (p->high_freq_factor - p->low_freq_factor);
            divisor = 1.0 / ((1 - smooth) / p->factor + smooth);
        }
        d->rope_freqs[i] = (float)divisor;
    }
    d->rope_type = RLX__ROPE_LLAMA3;
    return RLX_OK;
}

/* Scaled RoPE changes every position's angles; running a model of a scaling rlx does not know
 * with plain RoPE would give wrong results without any error, so any other type is refused. */
rlx_status rlx__hf_read_rope_scaling(const char *path, const cJSON *root, rlx__model_desc *d) {
    d->rope_type = RLX__ROPE_DEFAULT;
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!scaling || cJSON_IsNull(scaling))
        return RLX_OK;
    if (!cJSON_IsObject(scaling))
        return rlx__hf_wrong_type(path, "rope_scaling", "an object or null", scaling);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(scaling, "rope_type");
    if (!type)
        type = cJSON_GetObjectItemCaseSensitive(scaling, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0)
        return RLX_OK;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "llama3") != 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: field 'rope_scaling' (type %.32s) is not supported; rlx runs plain RoPE and type llama3",
                         path, cJSON_IsString(type) ? type->valuestring : "unknown");
    char where[512];
    snprintf(where, sizeof where, "%s: rope_scaling", path);
    rlx__rope_llama3 *p = &d->llama3;
    rlx_status st;
    if ((st = get_positive(where, scaling, "factor", 1, 0, &p->factor)) != RLX_OK ||
        (st = get_positive(where, scaling, "low_freq_factor", 1, 0, &p->low_freq_factor)) != RLX_OK ||
        (st = get_positive(where, scaling, "high_freq_factor", 1, 0, &p->high_freq_factor)) != RLX_OK ||
        (st = rlx__hf_int(where, scaling, "original_max_position_embeddings", REQUIRED, 1, INT32_MAX,
                          &p->original_max_position_embeddings)) != RLX_OK)
        return st;
    if (!(p->high_freq_factor > p->low_freq_factor))
        return rlx_error(RLX_E_FORMAT, "%s: high_freq_factor (%g) must be greater than low_freq_factor (%g)", where,
                         p->high_freq_factor, p->low_freq_factor);
    return llama3_factors(path, d);
}

rlx_status rlx__hf_read_decoder(const char *path, const cJSON *root, const rlx__hf_defaults *def, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    rlx_status st;
    if ((st = rlx__hf_int(path, root, "vocab_size", REQUIRED, 1, INT32_MAX, &c->vocab_size)) != RLX_OK)
        return st;
    if ((st = rlx__hf_int(path, root, "hidden_size", REQUIRED, 1, INT32_MAX, &c->hidden_size)) != RLX_OK)
        return st;
    if ((st = rlx__hf_int(path, root, "intermediate_size", def->intermediate_optional ? 0 : REQUIRED, 1, INT32_MAX,
                          &c->intermediate_size)) != RLX_OK)
        return st;
    if ((st = rlx__hf_int(path, root, "num_hidden_layers", REQUIRED, 1, RLX_MAX_LAYERS, &c->num_hidden_layers)) !=
        RLX_OK)
        return st;
    if (!(d->layers = rlx__calloc((size_t)c->num_hidden_layers, sizeof *d->layers)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    if ((st = rlx__hf_int(path, root, "num_attention_heads", REQUIRED, 1, INT32_MAX, &c->num_attention_heads)) !=
        RLX_OK)
        return st;
    if ((st = get_positive(path, root, "rms_norm_eps", 1, 0, &c->rms_norm_eps)) != RLX_OK)
        return st;

    if ((st = rlx__hf_int(path, root, "num_key_value_heads", c->num_attention_heads, 1, INT32_MAX,
                          &c->num_key_value_heads)) != RLX_OK)
        return st;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: field 'num_key_value_heads' (%" PRId64 ") does not divide num_attention_heads (%" PRId64
                         ")",
                         path, c->num_key_value_heads, c->num_attention_heads);
    const cJSON *head_dim = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if ((!head_dim || cJSON_IsNull(head_dim)) && !def->head_dim && c->hidden_size % c->num_attention_heads != 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: field 'head_dim' is missing and hidden_size (%" PRId64
                         ") is not a multiple of num_attention_heads (%" PRId64 ")",
                         path, c->hidden_size, c->num_attention_heads);
    if ((st = rlx__hf_int(path, root, "head_dim",
                          def->head_dim ? def->head_dim : c->hidden_size / c->num_attention_heads, 1, INT32_MAX,
                          &c->head_dim)) != RLX_OK)
        return st;
    if (c->head_dim % 2 != 0) /* rotate-half RoPE pairs dimension i with i + head_dim / 2 */
        return rlx_error(RLX_E_FORMAT, "%s: field 'head_dim' is %" PRId64 "; rotary embeddings need an even size", path,
                         c->head_dim);
    if ((st = rlx__hf_int(path, root, "max_position_embeddings", def->max_position_embeddings, 1, INT32_MAX,
                          &c->max_position_embeddings)) != RLX_OK)
        return st;
    if ((st = get_positive(path, root, "rope_theta", 0, 10000.0, &c->rope_theta)) != RLX_OK)
        return st;
    if ((st = rlx__hf_read_rope_scaling(path, root, d)) != RLX_OK)
        return st;
    return rlx__hf_bool(path, root, "tie_word_embeddings", 0, &c->tie_word_embeddings);
}

static rlx_status parse_config(const char *path, const cJSON *root, rlx__model_desc *d) {
    rlx_status st;
    if (!cJSON_IsObject(root))
        return rlx_error(RLX_E_FORMAT, "%s: the top level is not a JSON object", path);
    if ((st = get_arch(path, root, d)) != RLX_OK)
        return st;
    if ((st = d->arch->read_hf(path, root, d)) != RLX_OK)
        return st;
    rlx_model_config *c = &d->cfg;
    /* a multimodal checkpoint (Qwen3.5) keeps the language model's ids in text_config */
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    int64_t bos;
    if ((st = rlx__hf_int(path, root, "bos_token_id", -1, 0, INT32_MAX, &bos)) != RLX_OK)
        return st;
    if (bos < 0 && cJSON_IsObject(text) &&
        (st = rlx__hf_int(path, text, "bos_token_id", -1, 0, INT32_MAX, &bos)) != RLX_OK)
        return st;
    c->bos_id = (int32_t)bos;
    if ((st = add_token_ids(path, "eos_token_id", cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), c->eos_ids,
                            &c->n_eos)) != RLX_OK ||
        !cJSON_IsObject(text))
        return st;
    return add_token_ids(path, "text_config.eos_token_id", cJSON_GetObjectItemCaseSensitive(text, "eos_token_id"),
                         c->eos_ids, &c->n_eos);
}

void rlx__model_desc_free(rlx__model_desc *d) {
    if (!d)
        return;
    free(d->layers);
    d->layers = NULL;
    free(d->rope_freqs);
    d->rope_freqs = NULL;
    free(d->shexp_ones);
    d->shexp_ones = NULL;
}

void rlx__desc_window_every_layer(rlx__model_desc *d, int64_t window) {
    d->cfg.sliding_window = window;
    d->cfg.use_sliding_window = window > 0;
    for (int64_t i = 0; i < d->cfg.num_hidden_layers; i++)
        d->layers[i].window = (uint32_t)window;
}

void rlx__model_desc_project(rlx__model_desc *d) {
    for (int64_t i = 0; i < d->cfg.num_hidden_layers; i++)
        d->cfg.layer_sliding[i] = d->layers[i].window != 0;
}

static rlx_status desc_load_file(const char *config_path, rlx__model_desc *out) {
    cJSON *root;
    rlx_status st = rlx__json_load(config_path, 0, &root);
    if (st != RLX_OK)
        return st;
    /* Parsed aside so that *out is written only on success. */
    rlx__model_desc d;
    memset(&d, 0, sizeof d);
    st = parse_config(config_path, root, &d);
    cJSON_Delete(root);
    if (st != RLX_OK) {
        rlx__model_desc_free(&d);
        return st;
    }
    rlx__model_desc_project(&d);
    *out = d;
    return RLX_OK;
}

rlx_status rlx_model_config_load(const char *config_path, rlx_model_config *out) {
    if (!config_path || !out)
        return rlx_error(RLX_E_INVALID, "rlx_model_config_load: config_path and out must not be NULL");
    rlx__model_desc d;
    rlx_status st = desc_load_file(config_path, &d);
    if (st == RLX_OK) {
        *out = d.cfg;
        rlx__model_desc_free(&d);
    }
    return st;
}

rlx_status rlx_model_config_load_generation(const char *path, rlx_model_config *cfg) {
    if (!path || !cfg || cfg->n_eos > RLX_MAX_EOS)
        return rlx_error(RLX_E_INVALID, "rlx_model_config_load_generation: path and a loaded cfg are required");
    cJSON *root;
    rlx_status st = rlx__json_load(path, 1, &root);
    if (st != RLX_OK || !root)
        return st;
    /* Merged into a copy so that cfg is unchanged on failure. */
    int32_t ids[RLX_MAX_EOS];
    uint32_t n = cfg->n_eos;
    memcpy(ids, cfg->eos_ids, sizeof ids);
    if (!cJSON_IsObject(root))
        st = rlx_error(RLX_E_FORMAT, "%s: the top level is not a JSON object", path);
    else
        st = add_token_ids(path, "eos_token_id", cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), ids, &n);
    cJSON_Delete(root);
    if (st == RLX_OK) {
        memcpy(cfg->eos_ids, ids, sizeof ids);
        cfg->n_eos = n;
    }
    return st;
}

// ---- generation_config.json sampling keys

/* A number field in [min, max] as a float, with the bounds' meaning in the message; absent or
 * null leaves *out and *given alone. */
static rlx_status get_sampling_number(const char *path, const cJSON *root, const char *key, double min, int min_open,
                                      double max, const char *range, float *out, int *given) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!item || cJSON_IsNull(item))
        return RLX_OK;
    if (!cJSON_IsNumber(item))
        return rlx__hf_wrong_type(path, key, "a number", item);
    double v = item->valuedouble;
    if (!(min_open ? v > min : v >= min) || !(v <= max))
        return rlx_error(RLX_E_FORMAT, "%s: field '%s' is %g, must be %s", path, key, v, range);
    *out = (float)v;
    *given = 1;
    return RLX_OK;
}

static rlx_status parse_generation_defaults(const char *path, const cJSON *root, rlx_generation_defaults *g) {
    rlx_status st;
    if (!cJSON_IsObject(root))
        return rlx_error(RLX_E_FORMAT, "%s: the top level is not a JSON object", path);
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    g->has_do_sample = item && !cJSON_IsNull(item);
    if ((st = rlx__hf_bool(path, root, "do_sample", 0, &g->do_sample)) != RLX_OK)
        return st;
    /* 3.4e38: near FLT_MAX, so the float holds what the file says */
    if ((st = get_sampling_number(path, root, "temperature", 0, 0, 3.4e38, "a finite number >= 0", &g->temperature,
                                  &g->has_temperature)) != RLX_OK)
        return st;
    if ((st = get_sampling_number(path, root, "top_p", 0, 1, 1, "in (0, 1]", &g->top_p, &g->has_top_p)) != RLX_OK)
        return st;
    if ((st = get_sampling_number(path, root, "min_p", 0, 0, 1, "in [0, 1]", &g->min_p, &g->has_min_p)) != RLX_OK)
        return st;
    if ((st = get_sampling_number(path, root, "repetition_penalty", 0, 1, 3.4e38, "a finite number > 0",
                                  &g->repetition_penalty, &g->has_repetition_penalty)) != RLX_OK)
        return st;
    item = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (item && !cJSON_IsNull(item)) {
        int64_t k;
        if ((st = rlx__hf_int(path, root, "top_k", REQUIRED, 0, INT32_MAX, &k)) != RLX_OK)
            return st;
        g->top_k = (int32_t)k;
        g->has_top_k = 1;
    }
    return RLX_OK;
}

/* A GGUF file has no generation_config.json: llama.cpp's sampling defaults (temperature 0.8,
 * top-k 40, top-p 0.95, min-p 0.05), which its users expect, as far as the file's
 * general.sampling.* keys (written from the checkpoint's generation_config.json) do not say
 * otherwise. */
static rlx_status gguf_generation_defaults(const rlx__gguf *g, rlx_generation_defaults *out) {
    rlx_status st = RLX_OK;
    rlx_generation_defaults d = {.has_do_sample = 1,
                                 .do_sample = 1,
                                 .has_temperature = 1,
                                 .temperature = 0.8f,
                                 .has_top_k = 1,
                                 .top_k = 40,
                                 .has_top_p = 1,
                                 .top_p = 0.95f,
                                 .has_min_p = 1,
                                 .min_p = 0.05f,
                                 .repetition_penalty = 1.0f};
    const struct {
        const char *key;
        float *value;
    } floats[] = {{"general.sampling.temp", &d.temperature},
                  {"general.sampling.top_p", &d.top_p},
                  {"general.sampling.min_p", &d.min_p}};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0] && (st == RLX_OK || st == RLX_E_NOT_FOUND); i++) {
        double v;
        if ((st = rlx__gguf_float(g, floats[i].key, 1, &v)) == RLX_OK)
            *floats[i].value = (float)v;
    }
    int64_t k;
    if ((st == RLX_OK || st == RLX_E_NOT_FOUND) && (st = rlx__gguf_int(g, "general.sampling.top_k", 1, &k)) == RLX_OK)
        d.top_k = k < 0 || k > INT32_MAX ? -1 : (int32_t)k;
    if (st == RLX_E_NOT_FOUND)
        st = RLX_OK;
    if (st == RLX_OK &&
        (!(d.temperature >= 0) || !(d.top_p > 0 && d.top_p <= 1) || !(d.min_p >= 0 && d.min_p <= 1) || d.top_k < 0))
        st = rlx_error(RLX_E_FORMAT, "%s: a general.sampling.* value is out of range", g->path);
    if (st == RLX_OK)
        *out = d;
    return st;
}

rlx_status rlx_generation_config_of(const rlx_model *m, rlx_generation_defaults *out) {
    if (!m || !out)
        return rlx_error(RLX_E_INVALID, "rlx_generation_config_of: m and out must not be NULL");
    const rlx__gguf *g = rlx__weights_gguf(rlx_model_weights(m));
    return g ? gguf_generation_defaults(g, out) : rlx_generation_config_load(rlx_model_dir(m), out);
}

rlx_status rlx_generation_config_load(const char *model_dir, rlx_generation_defaults *out) {
    if (!model_dir || !out)
        return rlx_error(RLX_E_INVALID, "rlx_generation_config_load: model_dir and out must not be NULL");
    int gguf;
    rlx_status st = rlx__weights_path_is_gguf(model_dir, &gguf);
    if (st != RLX_OK || gguf) {
        rlx__gguf *g = NULL;
        if (st == RLX_OK && (st = rlx__gguf_open(model_dir, &g)) == RLX_OK)
            st = gguf_generation_defaults(g, out);
        rlx__gguf_close(g);
        return st;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/generation_config.json", model_dir) >= (int)sizeof path)
        return rlx_error(RLX_E_INVALID, "%s: the model directory's path is too long", model_dir);
    /* Hugging Face's GenerationConfig defaults */
    rlx_generation_defaults g = {.temperature = 1.0f, .top_k = 50, .top_p = 1.0f, .repetition_penalty = 1.0f};
    cJSON *root;
    st = rlx__json_load(path, 1, &root);
    if (st == RLX_OK && root)
        st = parse_generation_defaults(path, root, &g);
    cJSON_Delete(root);
    if (st == RLX_OK)
        *out = g;
    return st;
}

int rlx_model_config_layer_is_moe(const rlx_model_config *cfg, int64_t layer) {
    if (!cfg || layer < 0 || layer >= cfg->num_hidden_layers || layer >= RLX_MAX_LAYERS || cfg->num_experts <= 0 ||
        cfg->decoder_sparse_step <= 0)
        return 0;
    return !cfg->layer_dense_mlp[layer] && (layer + 1) % cfg->decoder_sparse_step == 0;
}

/* dir/config.json and dir/generation_config.json into path and gen_path. */
static rlx_status config_paths(const char *model_dir, char *path, char *gen_path, size_t len) {
    if (snprintf(path, len, "%s/config.json", model_dir) >= (int)len)
        return rlx_error(RLX_E_INVALID, "%s: the model directory's path is too long", model_dir);
    snprintf(gen_path, len, "%s/generation_config.json", model_dir);
    return RLX_OK;
}

rlx_status rlx__model_desc_load_dir(const char *model_dir, rlx__model_desc *out) {
    char path[4096], gen_path[4096];
    rlx_status rc = config_paths(model_dir, path, gen_path, sizeof path);
    if (rc == RLX_OK && (rc = desc_load_file(path, out)) == RLX_OK &&
        (rc = rlx_model_config_load_generation(gen_path, &out->cfg)) != RLX_OK)
        rlx__model_desc_free(out);
    return rc;
}

rlx_status rlx_model_config_load_model(const char *model_path, rlx_model_config *out) {
    if (!model_path || !out)
        return rlx_error(RLX_E_INVALID, "rlx_model_config_load_model: NULL argument");
    int gguf;
    rlx_status rc = rlx__weights_path_is_gguf(model_path, &gguf);
    if (rc != RLX_OK)
        return rc;
    if (!gguf) {
        char path[4096], gen_path[4096];
        if ((rc = config_paths(model_path, path, gen_path, sizeof path)) == RLX_OK &&
            (rc = rlx_model_config_load(path, out)) == RLX_OK)
            rc = rlx_model_config_load_generation(gen_path, out);
        return rc;
    }
    rlx_weights *w;
    if ((rc = rlx_weights_open(model_path, &w)) == RLX_OK)
        rc = rlx__model_config_from_gguf(w, out);
    rlx_weights_close(w);
    return rc;
}
