/*
 * colibri_demo_dl - loads a model library at run time, as an application on
 * the board would, and runs it like colibri_demo:
 *
 *   colibri_demo_dl path/to/libcolibri_<model>.so [--tokens 3,17,42] [--generate N] [--print-logits]
 *
 * Only the colibri_* entry points are looked up (dlsym); the arena is a fresh
 * anonymous mapping, so the library's own static arena stays untouched.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <string.h>
#include <stdint.h>
#include <stdio.h>

#include "colibri.h"
#include "demo_common.h"

#define PROG "colibri_demo_dl"

typedef const void *(*model_blob_fn)(size_t *len);

/* ISO C forbids converting void * to a function pointer; POSIX guarantees it works (dlsym). */
#define LOOKUP(lib, sym, dst, ok)                                              \
    do {                                                                      \
        void *p_ = dlsym((lib), (sym));                                       \
        if (!p_) (ok) = 0;                                                    \
        else memcpy(&(dst), &p_, sizeof p_);                                  \
    } while (0)

int main(int argc, char **argv)
{
    static demo_args a;
    static const int32_t default_tokens[] = {1, 2, 3};
    int rc = demo_parse(argc, argv, PROG, 1, default_tokens, 3, 16, &a);
    if (rc != DEMO_CONTINUE)
        return rc;
    void *lib = dlopen(a.model, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return demo_io_error(PROG, a.model, dlerror());
    demo_api api;
    model_blob_fn model_blob = NULL;
    int ok = 1;
    LOOKUP(lib, "colibri_arena_bytes", api.arena_bytes, ok);
    LOOKUP(lib, "colibri_init", api.init, ok);
    LOOKUP(lib, "colibri_forward", api.forward, ok);
    LOOKUP(lib, "colibri_info", api.info, ok);
    LOOKUP(lib, "colibri_strerror", api.strerror, ok);
    LOOKUP(lib, "colibri_set_parallel", api.set_parallel, ok);
    LOOKUP(lib, "colibri_sample_init", api.sample_init, ok);
    LOOKUP(lib, "colibri_sample_next", api.sample_next, ok);
    LOOKUP(lib, "colibri_sample_is_stop", api.sample_is_stop, ok);
    LOOKUP(lib, "colibri_utf8_feed", api.utf8_feed, ok);
    LOOKUP(lib, "colibri_utf8_flush", api.utf8_flush, ok);
    api.token_piece = NULL;
    api.piece_user = NULL;
    api.tokenize = NULL; /* ids only */
    api.tok_strerror = NULL;
    api.chat_prefix = api.chat_suffix = NULL;
    api.chat_prefix_len = api.chat_suffix_len = 0;
    LOOKUP(lib, "colibri_model_blob", model_blob, ok);
    if (!ok)
        return demo_io_error(PROG, a.model, "not a colibri model library (a colibri_* entry point is missing)");
    size_t len = 0;
    const void *blob = model_blob(&len);
    return demo_start(&api, blob, len, &a, PROG, a.model);
}
