/* SPDX-License-Identifier: Apache-2.0 */
#include "run_util.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int run_capture(const char *cmd, char *out, size_t n)
{
    size_t len = strlen(cmd) + 8;
    char *full = malloc(len);
    if (!full)
        return -1;
    snprintf(full, len, "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    free(full);
    if (!f)
        return -1;
    size_t used = 0, got;
    while (used + 1 < n && (got = fread(out + used, 1, n - 1 - used, f)) > 0)
        used += got;
    out[used] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof(sink), f) > 0)
        ;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int run_capturef(char *out, size_t n, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    cr_assert(len > 0 && len < (int)sizeof(cmd), "command too long: %.80s...", cmd);
    return run_capture(cmd, out, n);
}

const char *build_dir(void)
{
    const char *b = getenv("RESHARD_BUILD");
    return b && *b ? b : "build";
}
