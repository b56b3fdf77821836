/* SPDX-License-Identifier: Apache-2.0 */
/* Running the project's binaries from tests. */
#ifndef RS_TEST_RUN_UTIL_H
#define RS_TEST_RUN_UTIL_H

#include <stddef.h>

/* Runs `cmd` through the shell; stdout (and stderr, merged) into out. Returns the exit
 * status, or -1 when it did not exit normally. */
int run_capture(const char *cmd, char *out, size_t n);
/* The same for a printf-formatted command (of at most 4 KiB, asserted). */
int run_capturef(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The build directory under test: $RESHARD_BUILD, else "build". */
const char *build_dir(void);

#endif
