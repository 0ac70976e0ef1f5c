/* One AMX tile instruction sequence, callable from Python through ctypes: the smallest stand-in for vLLM CPU's AMX
 * attention kernel, to check on an AMX CPU that servescope's engine_site/sitecustomize.py gives every Python process
 * of a server the tile permission (benchmarks/gpu/amx_site_check.py).
 *
 * Build: gcc -O1 -shared -fPIC -mamx-tile -o amx_tiles.so amx_tiles.c
 */
#include <stdint.h>
#include <string.h>

struct tile_config {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

int servescope_use_tiles(void) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = 16;
    cfg.colsb[0] = 64;
    __asm__ volatile("ldtilecfg %0" :: "m"(cfg) : "memory");
    __asm__ volatile("tilezero %%tmm0" ::: "memory"); /* first touch of tile data: SIGILL without the permission */
    __asm__ volatile("tilerelease" ::: "memory");
    return 0;
}
