/*
 * A C program against include/portalloc.h and libportalloc.so, built and run by
 * tests/capi.rs (c_program_against_the_header_and_cdylib) with an environment selecting a
 * small real host device. Prints "capi_c: ok" on success; exits 1 with a message otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "portalloc.h"

#define PROGRAM "capi_c"
#include "capi_check.h"

/* An allocation made on a thread of its own, with `thread_tag` set there first (unless
 * NULL) and `tag` passed (NULL: none). */
struct Work {
    PortallocAllocator *allocator;
    uint64_t size;
    const char *thread_tag;
    const char *tag;
    uint64_t handle;
    PortallocStatus status;
};

static void *allocate_on_a_thread(void *argument) {
    struct Work *w = argument;
    w->status = PORTALLOC_STATUS_OK;
    if (w->thread_tag != NULL) {
        w->status = portalloc_set_thread_tag(w->thread_tag);
    }
    if (w->status == PORTALLOC_STATUS_OK) {
        w->status = portalloc_allocate(w->allocator, w->size, 0, 0, w->tag, &w->handle, NULL);
    }
    return NULL;
}

int main(void) {
    PortallocAllocator *a = NULL;
    PortallocStatus s = portalloc_create_from_env(0, &a);
    CHECK(s == PORTALLOC_STATUS_OK, "create_from_env: %s", portalloc_status_name(s));

    uint64_t h = 0;
    void *p = NULL;
    s = portalloc_allocate(a, 4096, 0, 0, "buffer", &h, &p);
    CHECK(s == PORTALLOC_STATUS_OK && p != NULL, "allocate: %s", portalloc_status_name(s));
    memset(p, 0x5a, 4096); /* real host memory */

    PortallocStats st;
    s = portalloc_stats(a, &st);
    CHECK(s == PORTALLOC_STATUS_OK && st.live_allocations == 1, "stats");

    uint64_t donated = 0;
    s = portalloc_donate(a, h, "output", &donated);
    CHECK(s == PORTALLOC_STATUS_OK, "donate");
    s = portalloc_free(a, h);
    CHECK(s == PORTALLOC_STATUS_INVALID_HANDLE, "free of a donated handle: %s",
          portalloc_status_name(s));
    CHECK(strstr(portalloc_last_error(), "buffer has been deleted or donated") != NULL,
          "message of a donated handle");

    size_t len = 0;
    s = portalloc_ledger_json(a, NULL, 0, &len);
    CHECK(s == PORTALLOC_STATUS_BUFFER_TOO_SMALL && len > 0, "ledger length");
    char *json = malloc(len + 1);
    CHECK(json != NULL, "malloc");
    s = portalloc_ledger_json(a, json, len + 1, &len);
    CHECK(s == PORTALLOC_STATUS_OK && strlen(json) == len, "ledger json");
    CHECK(strstr(json, "\"output\"") != NULL, "ledger names the consumer's tag");
    free(json);

    s = portalloc_free_ptr(a, p);
    CHECK(s == PORTALLOC_STATUS_OK, "free_ptr");
    s = portalloc_free_ptr(a, p);
    CHECK(s == PORTALLOC_STATUS_UNKNOWN_POINTER, "double free_ptr: %s", portalloc_status_name(s));
    s = portalloc_allocate(a, 256, 3, 0, NULL, &h, &p);
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT, "alignment 3");
    s = portalloc_allocate(NULL, 256, 0, 0, NULL, &h, &p);
    CHECK(s == PORTALLOC_STATUS_NULL_ARGUMENT, "null allocator");

    /* The PyTorch hooks. */
    void *t = portalloc_torch_alloc(1 << 20, 0, NULL);
    CHECK(t != NULL, "torch alloc");
    memset(t, 1, 1 << 20);
    portalloc_torch_free(t, 1 << 20, 0, NULL);
    CHECK(portalloc_torch_alloc(-5, 0, NULL) == NULL, "negative torch size");

    s = portalloc_destroy(a);
    CHECK(s == PORTALLOC_STATUS_OK, "destroy");
    s = portalloc_destroy(a);
    CHECK(s == PORTALLOC_STATUS_INVALID_ALLOCATOR, "double destroy");

    /* Explicit options: portalloc_options_default and portalloc_create are the header's
     * macros, which pass this header's sizeof(struct PortallocOptions), so peer_access (not in
     * 0.1.0's layout) is written and read. */
    PortallocOptions o;
    memset(&o, 0x55, sizeof o);
    s = portalloc_options_default(&o);
    CHECK(s == PORTALLOC_STATUS_OK && o.peer_access == -1 && o.preallocate == -1 &&
              o.ignore_env == 0 && o.strategy == NULL,
          "options_default: %s", portalloc_status_name(s));
    o.ignore_env = 1;
    o.strategy = "bfc";
    o.backend = "host";
    o.host_simulated = 1;
    o.host_capacity = 64u << 20;
    o.mem_fraction = 0.5;
    o.preallocate = 0;
    o.peer_access = 7;
    PortallocAllocator *b = NULL;
    s = portalloc_create(&o, &b);
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT &&
              strstr(portalloc_last_error(), "options.peer_access = 7") != NULL,
          "peer_access 7 is read and refused: %s", portalloc_status_name(s));
    /* One device: nothing to enable, which is not an error. */
    o.peer_access = 1;
    s = portalloc_create(&o, &b);
    CHECK(s == PORTALLOC_STATUS_OK && b != NULL, "create with peer access: %s",
          portalloc_status_name(s));
    s = portalloc_allocate(b, 4096, 0, 0, "peer", &h, &p);
    CHECK(s == PORTALLOC_STATUS_OK, "allocate with peer access");
    s = portalloc_free(b, h);
    CHECK(s == PORTALLOC_STATUS_OK, "free");
    s = portalloc_destroy(b);
    CHECK(s == PORTALLOC_STATUS_OK, "destroy");

    /* Sleep and wake on vmm (the host backend's real memory): the same pointer, the same
     * bytes; bfc refuses them. */
    s = portalloc_sleep(b = NULL, "weights", true);
    CHECK(s == PORTALLOC_STATUS_NULL_ARGUMENT || s == PORTALLOC_STATUS_INVALID_ALLOCATOR,
          "sleep of no allocator: %s", portalloc_status_name(s));
    o.peer_access = -1;
    s = portalloc_create(&o, &b);
    CHECK(s == PORTALLOC_STATUS_OK, "create bfc: %s", portalloc_status_name(s));
    s = portalloc_sleep(b, "weights", true);
    CHECK(s == PORTALLOC_STATUS_UNSUPPORTED && strstr(portalloc_last_error(), "vmm") != NULL,
          "sleep on bfc: %s", portalloc_status_name(s));
    s = portalloc_destroy(b);
    CHECK(s == PORTALLOC_STATUS_OK, "destroy bfc");
    o.strategy = "vmm";
    o.host_simulated = 0;
    s = portalloc_create(&o, &b);
    CHECK(s == PORTALLOC_STATUS_OK, "create vmm: %s", portalloc_status_name(s));
    uint64_t weights = 0;
    void *wp = NULL;
    s = portalloc_allocate(b, 8u << 20, 0, 0, "weights", &weights, &wp);
    CHECK(s == PORTALLOC_STATUS_OK && wp != NULL, "allocate weights");
    memset(wp, 0xA5, 8u << 20);
    s = portalloc_sleep(b, NULL, true);
    CHECK(s == PORTALLOC_STATUS_NULL_ARGUMENT, "sleep of a null tag: %s", portalloc_status_name(s));
    s = portalloc_sleep(b, "weights", true);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep: %s", portalloc_status_name(s));
    uint64_t asleep = 0, host = 0;
    s = portalloc_sleep_stats(b, &asleep, &host);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == (8u << 20) && host == (8u << 20),
          "sleep stats: %llu asleep, %llu on the host", (unsigned long long)asleep,
          (unsigned long long)host);
    s = portalloc_wake(b, "weights");
    CHECK(s == PORTALLOC_STATUS_OK, "wake: %s", portalloc_status_name(s));
    void *again = NULL;
    uint64_t size = 0;
    s = portalloc_handle_info(b, weights, &again, &size);
    CHECK(s == PORTALLOC_STATUS_OK && again == wp, "the same pointer after the wake");
    for (size_t i = 0; i < (8u << 20); i++) {
        CHECK(((const unsigned char *)wp)[i] == 0xA5, "byte %zu lost across sleep and wake", i);
    }
    s = portalloc_set_thread_tag("kv");
    CHECK(s == PORTALLOC_STATUS_OK, "set thread tag");
    uint64_t kv = 0;
    s = portalloc_allocate(b, 4u << 20, 0, 0, NULL, &kv, NULL);
    CHECK(s == PORTALLOC_STATUS_OK, "allocate under the thread tag");
    s = portalloc_set_thread_tag(NULL);
    CHECK(s == PORTALLOC_STATUS_OK, "clear thread tag");
    s = portalloc_sleep(b, "kv", false);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep kv");
    s = portalloc_sleep_stats(b, &asleep, &host);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == (4u << 20) && host == 0, "kv asleep, nothing kept");
    s = portalloc_wake(b, "kv");
    CHECK(s == PORTALLOC_STATUS_OK, "wake kv");
    s = portalloc_free(b, weights);
    CHECK(s == PORTALLOC_STATUS_OK, "free weights");
    s = portalloc_free(b, kv);
    CHECK(s == PORTALLOC_STATUS_OK, "free kv");

    /* Tags that can sleep: declared by portalloc_declare_sleep_tag or by setting a thread or
     * process tag; a bad one is refused with a status and a message. */
    s = portalloc_declare_sleep_tag(NULL);
    CHECK(s == PORTALLOC_STATUS_NULL_ARGUMENT, "declare null: %s", portalloc_status_name(s));
    s = portalloc_declare_sleep_tag("");
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT && strstr(portalloc_last_error(), "empty"),
          "declare empty: %s", portalloc_status_name(s));
    char oversize[1026];
    memset(oversize, 'x', 1025);
    oversize[1025] = '\0';
    s = portalloc_declare_sleep_tag(oversize);
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT && strstr(portalloc_last_error(), "1024"),
          "declare 1025 bytes: %s", portalloc_status_name(s));
    s = portalloc_set_process_tag("");
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT, "process tag empty: %s",
          portalloc_status_name(s));
    s = portalloc_set_process_tag(oversize);
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT, "process tag 1025 bytes: %s",
          portalloc_status_name(s));
    s = portalloc_set_thread_tag(oversize);
    CHECK(s == PORTALLOC_STATUS_INVALID_ARGUMENT, "thread tag 1025 bytes: %s",
          portalloc_status_name(s));
    s = portalloc_declare_sleep_tag("c-declared");
    CHECK(s == PORTALLOC_STATUS_OK, "declare: %s", portalloc_status_name(s));

    /* The process tag labels what a thread with no thread tag allocates untagged (the
     * autograd-thread case); a thread tag wins over it, an explicit tag over both. Which tag a
     * buffer got is read from what a sleep of each tag puts to sleep. */
    s = portalloc_set_process_tag("c-region");
    CHECK(s == PORTALLOC_STATUS_OK, "set process tag: %s", portalloc_status_name(s));
    struct Work plain = {b, 1u << 20, NULL, NULL, 0, PORTALLOC_STATUS_INTERNAL};
    struct Work mine = {b, 2u << 20, "c-mine", NULL, 0, PORTALLOC_STATUS_INTERNAL};
    struct Work named = {b, 512u << 10, "c-mine", "c-explicit", 0, PORTALLOC_STATUS_INTERNAL};
    struct Work *works[] = {&plain, &mine, &named};
    for (size_t i = 0; i < 3; i++) {
        pthread_t thread;
        CHECK(pthread_create(&thread, NULL, allocate_on_a_thread, works[i]) == 0,
              "pthread_create");
        CHECK(pthread_join(thread, NULL) == 0, "pthread_join");
        CHECK(works[i]->status == PORTALLOC_STATUS_OK, "allocate on thread %zu: %s", i,
              portalloc_status_name(works[i]->status));
    }
    s = portalloc_sleep(b, "c-region", true);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep c-region: %s", portalloc_status_name(s));
    s = portalloc_sleep_stats(b, &asleep, NULL);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == (1u << 20),
          "the process tag labels the other thread's buffer (and it alone): %llu asleep",
          (unsigned long long)asleep);
    s = portalloc_sleep(b, "c-mine", true);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep c-mine: %s", portalloc_status_name(s));
    s = portalloc_sleep_stats(b, &asleep, NULL);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == (3u << 20),
          "the thread tag wins over the process tag: %llu asleep", (unsigned long long)asleep);
    s = portalloc_sleep(b, "c-explicit", true);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep c-explicit: %s", portalloc_status_name(s));
    s = portalloc_sleep_stats(b, &asleep, NULL);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == (3u << 20) + (512u << 10),
          "an explicit tag wins over both: %llu asleep", (unsigned long long)asleep);
    const char *woken[] = {"c-region", "c-mine", "c-explicit"};
    for (size_t i = 0; i < 3; i++) {
        s = portalloc_wake(b, woken[i]);
        CHECK(s == PORTALLOC_STATUS_OK, "wake %s: %s", woken[i], portalloc_status_name(s));
        s = portalloc_free(b, works[i]->handle);
        CHECK(s == PORTALLOC_STATUS_OK, "free %s", woken[i]);
    }
    s = portalloc_set_process_tag(NULL);
    CHECK(s == PORTALLOC_STATUS_OK, "clear process tag: %s", portalloc_status_name(s));

    /* A buffer freed while work on another stream may use it (portalloc_record_stream) waits
     * for that work before going back to the allocator; from its free on it is no sleeper. */
    uint64_t deferred = 0, live = 0;
    void *dp = NULL, *lp = NULL;
    s = portalloc_allocate(b, 1u << 20, 0, 0, "c-deferred", &deferred, &dp);
    CHECK(s == PORTALLOC_STATUS_OK, "allocate the deferred buffer");
    s = portalloc_allocate(b, 2u << 20, 0, 0, "c-deferred", &live, &lp);
    CHECK(s == PORTALLOC_STATUS_OK, "allocate the live buffer");
    memset(lp, 0x6B, 2u << 20);
    s = portalloc_record_stream(b, dp, 0x7777);
    CHECK(s == PORTALLOC_STATUS_OK, "record_stream: %s", portalloc_status_name(s));
    s = portalloc_free(b, deferred);
    CHECK(s == PORTALLOC_STATUS_OK, "free the deferred buffer");
    s = portalloc_sleep(b, "c-deferred", true);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep c-deferred: %s", portalloc_status_name(s));
    s = portalloc_sleep_stats(b, &asleep, &host);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == (2u << 20) && host == (2u << 20),
          "a deferred free is no sleeper: %llu asleep, %llu on the host",
          (unsigned long long)asleep, (unsigned long long)host);
    s = portalloc_wake(b, "c-deferred");
    CHECK(s == PORTALLOC_STATUS_OK, "wake c-deferred: %s", portalloc_status_name(s));
    for (size_t i = 0; i < (2u << 20); i++) {
        CHECK(((const unsigned char *)lp)[i] == 0x6B, "live byte %zu lost", i);
    }
    s = portalloc_free(b, live);
    CHECK(s == PORTALLOC_STATUS_OK, "free the live buffer");

    /* A donated buffer sleeps with its consumer's tag, not its giver's: a sleep of the
     * giver's tag that discards its contents leaves the consumer's bytes alone. */
    s = portalloc_allocate(b, 4u << 20, 0, 0, "c-weights", &weights, &wp);
    CHECK(s == PORTALLOC_STATUS_OK, "allocate c-weights");
    memset(wp, 0x3C, 4u << 20);
    uint64_t output = 0;
    s = portalloc_donate(b, weights, "c-output", &output);
    CHECK(s == PORTALLOC_STATUS_OK, "donate: %s", portalloc_status_name(s));
    s = portalloc_sleep(b, "c-output", true);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep c-output: %s", portalloc_status_name(s));
    s = portalloc_sleep_stats(b, &asleep, &host);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == (4u << 20) && host == (4u << 20),
          "the consumer's tag sleeps the donated buffer: %llu asleep, %llu on the host",
          (unsigned long long)asleep, (unsigned long long)host);
    s = portalloc_wake(b, "c-output");
    CHECK(s == PORTALLOC_STATUS_OK, "wake c-output: %s", portalloc_status_name(s));
    s = portalloc_sleep(b, "c-weights", false);
    CHECK(s == PORTALLOC_STATUS_OK, "sleep c-weights: %s", portalloc_status_name(s));
    s = portalloc_sleep_stats(b, &asleep, NULL);
    CHECK(s == PORTALLOC_STATUS_OK && asleep == 0,
          "the giver's tag sleeps the donated buffer: %llu asleep", (unsigned long long)asleep);
    s = portalloc_wake(b, "c-weights");
    CHECK(s == PORTALLOC_STATUS_OK, "wake c-weights: %s", portalloc_status_name(s));
    for (size_t i = 0; i < (4u << 20); i++) {
        CHECK(((const unsigned char *)wp)[i] == 0x3C, "donated byte %zu lost", i);
    }
    s = portalloc_free(b, output);
    CHECK(s == PORTALLOC_STATUS_OK, "free c-output");

    s = portalloc_destroy(b);
    CHECK(s == PORTALLOC_STATUS_OK, "destroy vmm");

    printf("capi_c: ok (portalloc %s)\n", portalloc_version());
    return 0;
}
