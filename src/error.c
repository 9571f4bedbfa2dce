/* SPDX-License-Identifier: MIT */
/*
 * error.c - status names and the per-thread error message.
 *
 * Invariant: the message buffer is thread-local and always NUL-terminated;
 * kve_set_error truncates messages longer than the buffer rather than
 * failing, and the message is one line: no control characters survive in
 * it. The library's own failures (kve__fail) and those of the layers built
 * on it (kve_set_error) write the same buffer; a message may quote the one
 * it replaces.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[256];

const char *kve_status_name(kve_status s)
{
    switch (s) {
    case KVE_OK: return "KVE_OK";
    case KVE_EINVAL: return "KVE_EINVAL";
    case KVE_ENOMEM: return "KVE_ENOMEM";
    case KVE_ERANGE: return "KVE_ERANGE";
    case KVE_EFORMAT: return "KVE_EFORMAT";
    case KVE_EIO: return "KVE_EIO";
    case KVE_ECANCELED: return "KVE_ECANCELED";
    }
    return "KVE_UNKNOWN";
}

const char *kve_last_error(void)
{
    return last_error;
}

kve_status kve_set_error(kve_status s, const char *fmt, ...)
{
    if (!fmt) {
        last_error[0] = '\0';
        return s;
    }
    /* Formatted apart first: the arguments may quote the message it replaces
     * ("layer 3: %s", kve_last_error()). */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    /* Messages quote user text (spec values, .npy headers, paths): control
     * characters become '?' so the message stays one printable line. */
    for (char *c = last_error; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return s;
}
