/* SPDX-License-Identifier: MIT */
/*
 * llama_dl.c - llama.cpp's libraries opened with dlopen (llama_dl.h).
 *
 * Invariants: after a successful kvl_api_open every pointer of the table is
 * set; after a failed one nothing stays loaded. The libraries carry
 * RUNPATH $ORIGIN, so libllama finds libggml beside it; they are opened
 * RTLD_GLOBAL in dependency order so that the CPU back ends ggml loads
 * later resolve against the same copies.
 */
#define _POSIX_C_SOURCE 200809L
#include "llama_dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVL_DEFAULT_LIB_DIR
#define KVL_DEFAULT_LIB_DIR ""
#endif

/* llama.cpp's log: nothing is printed (a failure is one line, the tool's);
 * its first error since kvl_llama_error_clear is kept for that line (the
 * ones after it follow from it; a message may come in pieces:
 * GGML_LOG_LEVEL_CONT continues one). */
static char errors[256];
static int in_error;

static void log_errors(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level != GGML_LOG_LEVEL_ERROR && !(level == GGML_LOG_LEVEL_CONT && in_error)) {
        in_error = 0;
        return;
    }
    size_t len = strlen(errors);
    if (level == GGML_LOG_LEVEL_ERROR && len) { /* the first says most; the rest follow from it */
        in_error = 0;
        return;
    }
    snprintf(errors + len, sizeof errors - len, "%s", text);
    in_error = 1;
    for (char *p = errors; *p; p++) /* one line */
        if (*p == '\n')
            *p = ' ';
    len = strlen(errors);
    while (len && errors[len - 1] == ' ')
        errors[--len] = '\0';
}

void kvl_llama_error_clear(void)
{
    errors[0] = '\0';
    in_error = 0;
}

const char *kvl_llama_error(void)
{
    return errors[0] ? errors : "it gave no reason";
}

void kvl_api_close(kvl_api *api)
{
    for (int k = 2; k >= 0; k--)
        if (api->handle[k])
            dlclose(api->handle[k]);
    memset(api, 0, sizeof *api);
}

int kvl_api_open(kvl_api *api, const char *dir, char *msg, size_t cap)
{
    memset(api, 0, sizeof *api);
    if (!dir)
        dir = getenv("KVEVICT_LLAMA_LIB");
    if (!dir || !*dir)
        dir = KVL_DEFAULT_LIB_DIR;
    if (!*dir) {
        snprintf(msg, cap, "no folder of llama.cpp's libraries: set KVEVICT_LLAMA_LIB or "
                           "--llama-lib (the build was configured without one)");
        return -1;
    }
    snprintf(api->dir, sizeof api->dir, "%s", dir);
    static const char *const libs[3] = {KVL_LIBGGML_BASE, KVL_LIBGGML, KVL_LIBLLAMA};
    for (int k = 0; k < 3; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, libs[k]);
        if (!(api->handle[k] = dlopen(path, RTLD_NOW | RTLD_GLOBAL))) {
            snprintf(msg, cap, "cannot load llama.cpp's %s from %s (set KVEVICT_LLAMA_LIB or "
                               "--llama-lib to the folder that holds it): %s",
                     libs[k], dir, dlerror());
            kvl_api_close(api);
            return -1;
        }
    }
    /* Each call from the library that defines it (dlsym on llama's handle
     * finds ggml's through its dependencies as well). */
#define KVL_RESOLVE(name)                                                                          \
    {                                                                                              \
        void *sym = dlsym(api->handle[2], #name);                                                  \
        if (!sym) {                                                                                \
            snprintf(msg, cap, "llama.cpp in %s has no %s: not the release kvevict-llama was "     \
                               "built for (node-llama-cpp 3.21.1)", dir, #name);                    \
            kvl_api_close(api);                                                                    \
            return -1;                                                                             \
        }                                                                                          \
        memcpy(&api->name, &sym, sizeof sym);                                                      \
    }
    KVL_CALLS(KVL_RESOLVE)
#undef KVL_RESOLVE
    api->llama_log_set(log_errors, NULL);
    api->ggml_backend_load_all_from_path(dir);
    api->llama_backend_init();
    return 0;
}
