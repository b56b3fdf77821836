/* SPDX-License-Identifier: Apache-2.0 */
/* Cleaning outside text before a terminal or a log sees it (text.h). */
#include "text.h"

char *rs_text_clean(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            *p = '?';
        else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            p[0] = p[1] = '?', p++;
    }
    return s;
}
