/*
 * A C program as portalloc 0.1.0 built it, linked to today's libportalloc.so. 0.1.0's
 * PortallocOptions is today's up to ignore_env (the struct only grows at its end), and its
 * portalloc_options_default / portalloc_create were plain functions: this program calls those
 * functions (today's header makes the names macros; #undef reaches the functions, as a binary
 * built against 0.1.0 does) on an object of 0.1.0's size, offsetof(PortallocOptions,
 * peer_access), followed by bytes the program owns but portalloc must not touch: 0x7f, which
 * as peer_access (0x7f7f7f7f) would be refused, so a library that read past 0.1.0's struct
 * fails here, as one that wrote past it does. (tests/capi.rs also declares 0.1.0's struct on
 * its own: callers_compiled_against_the_first_layout_keep_working.)
 *
 * Built and run by tests/capi.rs (c_program_of_the_first_layout) with an environment selecting
 * a small real host device. Prints "capi_v1: ok" on success; exits 1 with a message otherwise.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "portalloc.h"

#undef portalloc_options_default
#undef portalloc_create

#define PROGRAM "capi_v1"
#include "capi_check.h"

/* The size of 0.1.0's struct: its fields end where peer_access starts (no padding before it),
 * at a multiple of the struct's alignment. */
#define V1_SIZE offsetof(PortallocOptions, peer_access)

/* An object of 0.1.0's size (aligned as the struct) and bytes after it. */
union guarded {
    PortallocOptions options; /* read and written through only as far as V1_SIZE */
    unsigned char bytes[sizeof(PortallocOptions) + 32];
};

static int after_intact(const union guarded *g) {
    for (size_t i = V1_SIZE; i < sizeof g->bytes; i++)
        if (g->bytes[i] != 0x7f) return 0;
    return 1;
}

int main(void) {
    /* sizeof(PortallocOptions) of 0.1.0's header on a 64-bit target. */
    CHECK(sizeof(void *) != 8 || V1_SIZE == 56, "0.1.0's size: %zu", (size_t)V1_SIZE);
    union guarded g;
    memset(&g, 0x7f, sizeof g);
    PortallocStatus s = portalloc_options_default(&g.options);
    CHECK(s == PORTALLOC_STATUS_OK, "options_default: %s", portalloc_status_name(s));
    CHECK(after_intact(&g), "portalloc_options_default wrote past 0.1.0's struct");
    CHECK(g.options.preallocate == -1 && g.options.host_simulated == -1 &&
              g.options.backtrace == -1 && g.options.ignore_env == 0 &&
              g.options.strategy == NULL && g.options.backend == NULL &&
              g.options.device == 0 && g.options.host_capacity == 0,
          "the defaults");

    g.options.ignore_env = 1;
    g.options.strategy = "bfc";
    g.options.backend = "host";
    g.options.host_simulated = 0;
    g.options.host_capacity = 64u << 20;
    g.options.mem_fraction = 0.5;
    g.options.preallocate = 0;
    PortallocAllocator *a = NULL;
    s = portalloc_create(&g.options, &a);
    CHECK(s == PORTALLOC_STATUS_OK && a != NULL, "create: %s", portalloc_status_name(s));
    CHECK(after_intact(&g), "portalloc_create wrote past 0.1.0's struct");

    uint64_t h = 0;
    void *p = NULL;
    s = portalloc_allocate(a, 4096, 0, 0, "v1", &h, &p);
    CHECK(s == PORTALLOC_STATUS_OK && p != NULL, "allocate: %s", portalloc_status_name(s));
    memset(p, 0x5a, 4096); /* real host memory */
    void *q = NULL;
    uint64_t size = 0;
    s = portalloc_handle_info(a, h, &q, &size);
    CHECK(s == PORTALLOC_STATUS_OK && q == p && size == 4096, "handle_info");
    s = portalloc_free(a, h);
    CHECK(s == PORTALLOC_STATUS_OK, "free");

    /* 0.1.0's fields are still checked. */
    g.options.backtrace = 5;
    PortallocAllocator *b = NULL;
    s = portalloc_create(&g.options, &b);
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT &&
              strstr(portalloc_last_error(), "backtrace") != NULL,
          "backtrace 5: %s", portalloc_status_name(s));

    s = portalloc_destroy(a);
    CHECK(s == PORTALLOC_STATUS_OK, "destroy");
    printf("capi_v1: ok (portalloc %s)\n", portalloc_version());
    return 0;
}
