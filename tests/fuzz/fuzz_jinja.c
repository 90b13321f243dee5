/* libFuzzer target: the Jinja engine of chat templates (core/src/text/jinja.c). Input: a
 * template, optionally followed by a NUL byte and a JSON object of variables (else a fixed
 * conversation with tools, a tool call and reasoning). The template is parsed and rendered with
 * small limits; any error must be a clean status with a message, and a rendering's markup spans
 * must be sorted, apart and inside the text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char conversation[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Q <|im_end|>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nA\", \"reasoning_content\": null,"
    " \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": [1, 2.5]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
    "\"f\", \"parameters\": {\"type\": \"object\"}}}], \"add_generation_prompt\": true, \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t tmpl_len = nul ? (size_t)(nul - text) : size;
    cJSON *vars = NULL;
    if (nul) {
        size_t json_len = size - tmpl_len - 1;
        char *json = malloc(json_len + 1);
        if (!json)
            return 0;
        memcpy(json, nul + 1, json_len);
        json[json_len] = '\0';
        vars = cJSON_Parse(json);
        free(json);
        if (!cJSON_IsObject(vars)) {
            cJSON_Delete(vars);
            return 0;
        }
    } else {
        vars = cJSON_Parse(conversation);
    }
    cJSON *trusted = cJSON_Parse("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}");
    rlx__jinja *t = NULL;
    if (rlx__jinja_parse(text, tmpl_len, &t) == RLX_OK) {
        rlx__jinja_limits limits = {
            .max_output = 1 << 20, .max_memory = 32 << 20, .max_steps = 100000, .max_depth = 200};
        char *out = NULL;
        size_t len = 0, n = 0;
        rlx_text_span *spans = NULL;
        if (rlx__jinja_render(t, vars, trusted, &limits, &out, &len, &spans, &n) == RLX_OK) {
            if (strlen(out) > len)
                abort();
            for (size_t i = 0; i < n; i++)
                if (!spans[i].len || spans[i].off + spans[i].len > len ||
                    (i && spans[i].off <= spans[i - 1].off + spans[i - 1].len))
                    abort();
        } else if (!rlx_last_error()[0]) {
            abort();
        }
        free(out);
        free(spans);
        rlx__jinja_free(t);
    } else if (!strstr(rlx_last_error(), "chat template")) {
        fprintf(stderr, "a parse error without a position: %s\n", rlx_last_error());
        abort();
    }
    cJSON_Delete(vars);
    cJSON_Delete(trusted);
    return 0;
}
