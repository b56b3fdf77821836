/* SPDX-License-Identifier: Apache-2.0 */
/* The one clock every deadline and measurement reads: CLOCK_MONOTONIC. */
#ifndef RS_CLOCK_H
#define RS_CLOCK_H

#include <stdint.h>

/* Milliseconds since an arbitrary start, for deadlines. */
int64_t rs_now_ms(void);
/* The same in fractional milliseconds, for measurements. */
double rs_now_ms_f(void);

#endif
