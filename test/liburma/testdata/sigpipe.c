/*
 * sigpipe.c: a program that, as brpc, leaves SIGPIPE alone, and writes to a
 * pipe nobody reads once liburma.so.0 is loaded and initialised: the write
 * must fail with EPIPE, not kill the process. Built with -DDLOPEN, the
 * program handles SIGPIPE itself before it dlopens the library: its own
 * handler must still be the one called.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "urma_compat.h"

#ifdef DLOPEN
#include <dlfcn.h>
static volatile sig_atomic_t handled;
static void on_sigpipe(int sig)
{
    (void)sig;
    handled = 1;
}
#endif

int main(int argc, char **argv)
{
    urma_init_attr_t attr;
    memset(&attr, 0, sizeof(attr));
#ifdef DLOPEN
    if (argc != 2) {
        fprintf(stderr, "usage: %s liburma.so.0\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, on_sigpipe);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "FAIL: dlopen: %s\n", dlerror());
        return 1;
    }
    urma_status_t (*init)(urma_init_attr_t *);
    *(void **)&init = dlsym(lib, "urma_init");
    if (init == NULL || init(&attr) != URMA_SUCCESS) {
        fprintf(stderr, "FAIL: urma_init\n");
        return 1;
    }
#else
    (void)argc;
    (void)argv;
    if (urma_init(&attr) != URMA_SUCCESS) {
        fprintf(stderr, "FAIL: urma_init\n");
        return 1;
    }
#endif
    int p[2];
    if (pipe(p) != 0) {
        perror("pipe");
        return 1;
    }
    close(p[0]);
    errno = 0;
    if (write(p[1], "x", 1) != -1 || errno != EPIPE) {
        fprintf(stderr, "FAIL: write to a closed pipe: errno %d, want EPIPE\n", errno);
        return 1;
    }
#ifdef DLOPEN
    if (!handled) {
        fprintf(stderr, "FAIL: the program's own SIGPIPE handler was not called\n");
        return 1;
    }
#endif
    printf("OK\n");
    return 0;
}
