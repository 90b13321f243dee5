/* Private to the kernels on AMX tiles (kern_bf16.c, kern_qamx.h): the tile configuration that
 * LDTILECFG loads, palette 1 (8 tile registers of at most 16 rows of 64 bytes). */
#ifndef RLX_PLUGINS_KERN_AMX_H
#define RLX_PLUGINS_KERN_AMX_H

#include <immintrin.h>
#include <stdint.h>

/* LDTILECFG's 64-byte operand. */
typedef struct kern_amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kern_amx_cfg;

/* Configures tile register t as rows[t] rows of colsb[t] bytes, t < 8, for the calling thread. */
static inline __attribute__((target("amx-tile"))) void kern_amx_config(const uint8_t rows[8], const uint16_t colsb[8]) {
    _Alignas(64) kern_amx_cfg cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = rows[t];
        cfg.colsb[t] = colsb[t];
    }
    _tile_loadconfig(&cfg);
}

#endif
