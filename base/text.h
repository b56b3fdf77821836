/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Text from outside (a manifest's tensor names, a peer's reasons, a file's contents) on its
 * way to a terminal or a log: what a terminal would act on is replaced, the rest kept.
 */
#ifndef RS_TEXT_H
#define RS_TEXT_H

/* Replaces, in place, the C0 control bytes (ESC starts an escape sequence; a newline would
 * forge a line of its own), DEL, and the C1 controls as UTF-8 writes them (U+0080 to U+009F,
 * CSI among them) with '?'; everything else, UTF-8 names included, is kept. Returns s. */
char *rs_text_clean(char *s);

#endif
