/* Does this CPU/VM run AMX tile instructions, and only after the process asked Linux for permission?
 *
 * Why: vLLM 0.32's CPU kernels for bfloat16 attention and fused MoE run AMX tile instructions whenever
 * torch's cpuinfo reports AMX, but never call arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), which
 * Linux (5.16+) requires before a process touches tile data. This probe shows on real hardware what such
 * code meets: each case runs in a forked child and reports how it ended.
 *
 * Build (static, so it runs on any x86-64 Linux): gcc -O1 -static -mamx-tile -o amx_probe amx_permission_probe.c
 * Output: one `key=value` line per fact, then one line per case: `case=<name> result=<exit N | signal NAME>`.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_SUPP 0x1021
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct tile_config {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static int use_tiles(void) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = 16;
    cfg.colsb[0] = 64;
    __asm__ volatile("ldtilecfg %0" :: "m"(cfg) : "memory");
    __asm__ volatile("tilezero %%tmm0" ::: "memory"); /* first touch of tile data: traps without permission */
    __asm__ volatile("tilerelease" ::: "memory");
    return 0;
}

static long request_permission(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

static void run_case(const char *name, int request, int via_grandchild) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (request && request_permission() != 0) _exit(3);
        if (via_grandchild) { /* permission asked for by the parent, tiles used by a forked child */
            pid_t g = fork();
            if (g == 0) _exit(use_tiles());
            int gs = 0;
            waitpid(g, &gs, 0);
            if (WIFSIGNALED(gs)) raise(WTERMSIG(gs));
            _exit(WEXITSTATUS(gs));
        }
        _exit(use_tiles());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        printf("case=%s result=signal %s\n", name, sigabbrev_np(WTERMSIG(status)));
    else
        printf("case=%s result=exit %d\n", name, WEXITSTATUS(status));
}

int main(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __cpuid_count(7, 0, a, b, c, d);
    int amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1, amx_int8 = (d >> 25) & 1;
    printf("cpuid_amx_tile=%d\ncpuid_amx_bf16=%d\ncpuid_amx_int8=%d\n", amx_tile, amx_bf16, amx_int8);
    __cpuid(1, a, b, c, d);
    int osxsave = (c >> 27) & 1;
    uint64_t xcr0 = 0;
    if (osxsave) {
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((uint64_t)hi << 32) | lo;
    }
    printf("xcr0=0x%llx\nxcr0_xtilecfg=%d\nxcr0_xtiledata=%d\n", (unsigned long long)xcr0,
           (int)((xcr0 >> 17) & 1), (int)((xcr0 >> 18) & 1));
    uint64_t supp = 0, perm = 0;
    long rs = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_SUPP, &supp);
    long rp = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm);
    printf("xcomp_supp_rc=%ld\nxcomp_supp_xtiledata=%d\n", rs, rs == 0 ? (int)((supp >> 18) & 1) : -1);
    printf("xcomp_perm_at_start_rc=%ld\nxcomp_perm_at_start_xtiledata=%d\n", rp, rp == 0 ? (int)((perm >> 18) & 1) : -1);
    if (!amx_tile) {
        printf("case=no_amx result=skipped (cpuid reports no AMX-TILE)\n");
        return 0;
    }
    run_case("tiles_without_permission", 0, 0);
    run_case("tiles_after_permission", 1, 0);
    run_case("tiles_in_fork_child_of_permitted_process", 1, 1);
    return 0;
}
