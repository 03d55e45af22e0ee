/*
 * refusals.c: functions of liburma's API that the software provider does
 * not implement, one of each kind of result, before and after urma_init.
 * Each must return what liburma returns for an operation its provider
 * lacks, and never crash: URMA_EINVAL, NULL with errno EINVAL,
 * -URMA_EINVAL, or nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "urma_compat.h"

/* Declared here, as the program's own header would: urma_compat.h has only
 * what the library implements. */
urma_status_t urma_alloc_jfs(urma_context_t *ctx, urma_jfs_cfg_t *cfg, void **jfs);
void *urma_create_jfs(urma_context_t *ctx, urma_jfs_cfg_t *cfg);
int urma_flush_jfs(void *jfs, int cr_cnt, urma_cr_t *cr);
void urma_put_rjetty(urma_rjetty_t *rjetty);
urma_token_id_t *urma_alloc_token_id(urma_context_t *ctx);
const char *urma_log_get_thread_tag(void);
urma_status_t urma_write(void *jfs, urma_target_jetty_t *t, urma_target_seg_t *d, urma_target_seg_t *s, uint64_t dst,
                         uint64_t src, uint32_t len, urma_jfs_wr_flag_t flag, uint64_t user_ctx);

static int check(const char *when)
{
    urma_jfs_wr_flag_t flag = {.value = 0};
    errno = 0;
    if (urma_alloc_jfs(NULL, NULL, NULL) != URMA_EINVAL) {
        fprintf(stderr, "FAIL %s: urma_alloc_jfs\n", when);
        return 1;
    }
    errno = 0;
    if (urma_create_jfs(NULL, NULL) != NULL || errno != EINVAL) {
        fprintf(stderr, "FAIL %s: urma_create_jfs\n", when);
        return 1;
    }
    errno = 0;
    if (urma_alloc_token_id(NULL) != NULL || errno != EINVAL) {
        fprintf(stderr, "FAIL %s: urma_alloc_token_id\n", when);
        return 1;
    }
    if (urma_flush_jfs(NULL, 1, NULL) != -URMA_EINVAL) {
        fprintf(stderr, "FAIL %s: urma_flush_jfs\n", when);
        return 1;
    }
    if (urma_write(NULL, NULL, NULL, NULL, 0, 0, 0, flag, 0) != URMA_EINVAL) {
        fprintf(stderr, "FAIL %s: urma_write\n", when);
        return 1;
    }
    errno = 0;
    if (urma_log_get_thread_tag() != NULL || errno != EINVAL) {
        fprintf(stderr, "FAIL %s: urma_log_get_thread_tag\n", when);
        return 1;
    }
    urma_put_rjetty(NULL);
    /* and the implemented functions' own checks of null arguments */
    if (urma_query_device(NULL, NULL) != URMA_EINVAL || urma_delete_context(NULL) != URMA_EINVAL ||
        urma_poll_jfc(NULL, 1, NULL) != -1 || urma_create_context(NULL, 0) != NULL ||
        urma_post_jetty_send_wr(NULL, NULL, NULL) != URMA_EINVAL || urma_flush_jetty(NULL, 1, NULL) != -URMA_EINVAL) {
        fprintf(stderr, "FAIL %s: a null argument was not refused\n", when);
        return 1;
    }
    return 0;
}

int main(void)
{
    if (check("before urma_init")) {
        return 1;
    }
    int n = -1;
    errno = 0;
    if (urma_get_device_list(&n) != NULL || errno != ENODEV) {
        fprintf(stderr, "FAIL: urma_get_device_list before urma_init: errno %d, want ENODEV\n", errno);
        return 1;
    }
    urma_init_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    if (urma_init(&attr) != URMA_SUCCESS || check("after urma_init") || urma_uninit() != URMA_SUCCESS) {
        return 1;
    }
    printf("OK\n");
    return 0;
}
