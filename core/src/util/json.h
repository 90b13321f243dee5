/* JSON files and values as every part of the core reads them (config.json, safetensors headers
 * and indexes, tokenizer.json, tokenizer_config.json): bounded reads, errors that name the file
 * and the place, integers only where a double holds them exactly. */
#ifndef RLX_UTIL_JSON_H
#define RLX_UTIL_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rlx/status.h"

/* Reads and parses the JSON file at path. On success *out is the document, which the caller frees
 * with cJSON_Delete. A file that cannot be read is RLX_E_IO naming path and the system error, except
 * that a missing file with missing_ok set is RLX_OK with *out NULL. Text that is not JSON is
 * RLX_E_FORMAT naming path and the line, column and byte offset of the error. */
rlx_status rlx__json_load(const char *path, int missing_ok, cJSON **out);

/* Stores the value of item in *out when it is a JSON number holding an integer that a double
 * represents exactly (|v| <= 2^53) and returns 1; returns 0 for anything else (3.5, "3", null). */
int rlx__json_int(const cJSON *item, int64_t *out);

/* rlx__json_int for a non-negative integer. */
int rlx__json_u64(const cJSON *item, uint64_t *out);

/* item as an error message's "got ..." shows it: the number, the string (cut at 40 bytes), true,
 * false, null, "an array" or "an object". */
void rlx__json_describe(const cJSON *item, char *buf, size_t size);

#endif
