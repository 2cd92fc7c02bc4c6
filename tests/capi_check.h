/*
 * CHECK for the C programs tests/capi.rs builds (capi_c.c, capi_v1.c): when `cond` is false,
 * prints PROGRAM (which the including file defines), the line, the message and portalloc's
 * last error, and returns 1 from the enclosing function (main).
 */
#ifndef PORTALLOC_TEST_CAPI_CHECK_H
#define PORTALLOC_TEST_CAPI_CHECK_H

#include <stdio.h>

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s: line %d: ", PROGRAM, __LINE__);            \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, " (last error: %s)\n", portalloc_last_error()); \
            return 1;                                                       \
        }                                                                   \
    } while (0)

#endif
