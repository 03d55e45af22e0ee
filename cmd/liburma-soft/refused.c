/*
 * refused.c: the rest of liburma's API (UMDK 26.06 urma_api.h), which the
 * software provider does not implement. Each function is here so that a
 * program linked against liburma loads (also with -z now) and gets an
 * error it handles instead of a missing symbol: what liburma returns when
 * the provider lacks the operation (core/urma_cp_api.c's
 * URMA_CHECK_OP_INVALID_RETURN_*): URMA_EINVAL for a status, NULL with
 * errno EINVAL for an object, -URMA_EINVAL for a count, nothing for a
 * void function. The first call of each is logged (lsoft_refused).
 *
 * Arguments are never read, so they are declared by kind only (pointer,
 * integer): the calling convention of every argument liburma passes is
 * that of its kind, and the result's is what matters here.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "urma_compat.h"
#include "_cgo_export.h"

#define P void *

#define REFUSE_STATUS(name, ...)        \
    urma_status_t name(__VA_ARGS__);    \
    urma_status_t name(__VA_ARGS__)     \
    {                                   \
        lsoft_refused(#name);           \
        return URMA_EINVAL;             \
    }

#define REFUSE_POINTER(type, name, ...) \
    type name(__VA_ARGS__);             \
    type name(__VA_ARGS__)              \
    {                                   \
        lsoft_refused(#name);           \
        errno = EINVAL;                 \
        return NULL;                    \
    }

#define REFUSE_COUNT(name, ...)         \
    int name(__VA_ARGS__);              \
    int name(__VA_ARGS__)               \
    {                                   \
        lsoft_refused(#name);           \
        return -URMA_EINVAL;            \
    }

#define REFUSE_VOID(name, ...)          \
    void name(__VA_ARGS__);             \
    void name(__VA_ARGS__)              \
    {                                   \
        lsoft_refused(#name);           \
    }

/* contexts */
REFUSE_STATUS(urma_set_context_opt, P ctx, int opt_name, const void *opt_value, size_t opt_len)
REFUSE_STATUS(urma_get_uasid, P uasid)

/* JFC variants */
REFUSE_STATUS(urma_modify_jfc, P jfc, P attr)
REFUSE_STATUS(urma_alloc_jfc, P ctx, P cfg, P jfc)
REFUSE_STATUS(urma_set_jfc_opt, P jfc, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_active_jfc, P jfc)
REFUSE_STATUS(urma_get_jfc_opt, P jfc, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_deactive_jfc, P jfc)
REFUSE_STATUS(urma_free_jfc, P jfc)
REFUSE_STATUS(urma_delete_jfc_batch, P jfc_arr, int jfc_num, P bad_jfc)

/* standalone JFS */
REFUSE_POINTER(void *, urma_create_jfs, P ctx, P jfs_cfg)
REFUSE_STATUS(urma_modify_jfs, P jfs, P attr)
REFUSE_STATUS(urma_query_jfs, P jfs, P cfg, P attr)
REFUSE_STATUS(urma_delete_jfs, P jfs)
REFUSE_STATUS(urma_delete_jfs_batch, P jfs_arr, int jfs_num, P bad_jfs)
REFUSE_COUNT(urma_flush_jfs, P jfs, int cr_cnt, P cr)
REFUSE_STATUS(urma_alloc_jfs, P ctx, P cfg, P jfs)
REFUSE_STATUS(urma_set_jfs_opt, P jfs, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_active_jfs, P jfs)
REFUSE_STATUS(urma_get_jfs_opt, P jfs, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_deactive_jfs, P jfs)
REFUSE_STATUS(urma_free_jfs, P jfs)
REFUSE_STATUS(urma_post_jfs_wr, P jfs, P wr, P bad_wr)

/* JFR variants, JFR targets */
REFUSE_STATUS(urma_modify_jfr, P jfr, P attr)
REFUSE_STATUS(urma_query_jfr, P jfr, P cfg, P attr)
REFUSE_STATUS(urma_delete_jfr_batch, P jfr_arr, int jfr_num, P bad_jfr)
REFUSE_POINTER(urma_target_jetty_t *, urma_import_jfr, P ctx, P rjfr, P token_value)
REFUSE_POINTER(urma_target_jetty_t *, urma_import_jfr_ex, P ctx, P rjfr, P token_value, P cfg)
REFUSE_STATUS(urma_unimport_jfr, P target_jfr)
REFUSE_STATUS(urma_advise_jfr, P jfs, P tjfr)
REFUSE_STATUS(urma_advise_jfr_async, P jfs, P tjfr, P cb_fun, P cb_arg)
REFUSE_STATUS(urma_unadvise_jfr, P jfs, P tjfr)
REFUSE_STATUS(urma_alloc_jfr, P ctx, P cfg, P jfr)
REFUSE_STATUS(urma_set_jfr_opt, P jfr, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_active_jfr, P jfr)
REFUSE_STATUS(urma_get_jfr_opt, P jfr, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_deactive_jfr, P jfr)
REFUSE_STATUS(urma_free_jfr, P jfr)

/* jetty variants */
REFUSE_STATUS(urma_query_jetty, P jetty, P cfg, P attr)
REFUSE_STATUS(urma_delete_jetty_batch, P jetty_arr, int jetty_num, P bad_jetty)
REFUSE_POINTER(urma_target_jetty_t *, urma_import_jetty_ex, P ctx, P rjetty, P token_value, P cfg)
REFUSE_STATUS(urma_advise_jetty, P jetty, P tjetty)
REFUSE_STATUS(urma_unadvise_jetty, P jetty, P tjetty)
REFUSE_STATUS(urma_bind_jetty_ex, P jetty, P tjetty, P cfg)
REFUSE_STATUS(urma_get_rjetty, P jetty, P rjetty, P length)
REFUSE_VOID(urma_put_rjetty, P rjetty)
REFUSE_POINTER(urma_target_jetty_t *, urma_import_jetty_async, P notifier, const void *rjetty, const void *token_value,
               uint64_t user_ctx, int timeout)
REFUSE_STATUS(urma_unimport_jetty_async, P tjetty)
REFUSE_STATUS(urma_bind_jetty_async, P notifier, P jetty, P tjetty, uint64_t user_ctx, int timeout)
REFUSE_STATUS(urma_unbind_jetty_async, P jetty)
REFUSE_POINTER(void *, urma_create_notifier, P ctx)
REFUSE_STATUS(urma_delete_notifier, P notifier)
REFUSE_STATUS(urma_alloc_jetty, P ctx, P cfg, P jetty)
REFUSE_STATUS(urma_set_jetty_opt, P jetty, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_active_jetty, P jetty)
REFUSE_STATUS(urma_get_jetty_opt, P jetty, uint64_t opt, P buf, uint32_t len)
REFUSE_STATUS(urma_deactive_jetty, P jetty)
REFUSE_STATUS(urma_free_jetty, P jetty)
REFUSE_COUNT(urma_wait_notify, P notifier, uint32_t cnt, P notify, int timeout)
REFUSE_STATUS(urma_ack_notify, P ctx, uint32_t cnt, P notify)
REFUSE_POINTER(void *, urma_create_jetty_grp, P ctx, P cfg)
REFUSE_STATUS(urma_delete_jetty_grp, P jetty_grp)
REFUSE_COUNT(urma_get_tpn, P jetty)

/* asynchronous events: none is ever reported (the context's async_fd
 * never becomes readable) */
REFUSE_STATUS(urma_get_async_event, P ctx, P event)
REFUSE_VOID(urma_ack_async_event, P event)

/* token ids and segment contexts */
REFUSE_POINTER(urma_token_id_t *, urma_alloc_token_id, P ctx)
REFUSE_POINTER(urma_token_id_t *, urma_alloc_token_id_ex, P ctx, uint32_t flag)
REFUSE_STATUS(urma_free_token_id, P token_id)
REFUSE_STATUS(urma_get_seg_ctx, P tseg, P seg, P size)
REFUSE_VOID(urma_put_seg_ctx, P seg)

/* one-call data path over a standalone JFS */
REFUSE_STATUS(urma_write, P jfs, P target_jfr, P dst_tseg, P src_tseg, uint64_t dst, uint64_t src, uint32_t len,
              uint32_t flag, uint64_t user_ctx)
REFUSE_STATUS(urma_read, P jfs, P target_jfr, P dst_tseg, P src_tseg, uint64_t dst, uint64_t src, uint32_t len,
              uint32_t flag, uint64_t user_ctx)
REFUSE_STATUS(urma_send, P jfs, P target_jfr, P src_tseg, uint64_t src, uint32_t len, uint32_t flag,
              uint64_t user_ctx)
REFUSE_STATUS(urma_recv, P jfr, P recv_tseg, uint64_t buf, uint32_t len, uint64_t user_ctx)

/* logging hooks */
REFUSE_STATUS(urma_register_log_func, P func)
REFUSE_STATUS(urma_register_loc_log_func, P func)
REFUSE_STATUS(urma_unregister_log_func, void)
REFUSE_POINTER(const char *, urma_log_get_thread_tag, void)
REFUSE_VOID(urma_log_set_thread_tag, const char *tag)

/* transport paths and addresses */
REFUSE_POINTER(void *, urma_get_net_addr_list, P ctx, P cnt)
REFUSE_VOID(urma_free_net_addr_list, P net_addr_list)
REFUSE_COUNT(urma_modify_tp, P ctx, uint32_t tpn, P cfg, P attr, uint64_t mask)
REFUSE_STATUS(urma_get_tp_list, P ctx, P cfg, P tp_cnt, P tp_list)
REFUSE_STATUS(urma_set_tp_attr, const void *ctx, uint64_t tp_handle, uint8_t tp_attr_cnt, uint32_t tp_attr_bitmap,
              const void *tp_attr)
REFUSE_STATUS(urma_get_tp_attr, const void *ctx, uint64_t tp_handle, P tp_attr_cnt, P tp_attr_bitmap, P tp_attr)
REFUSE_STATUS(urma_get_eid_by_ip, const void *ctx, const void *net_addr, P eid)
REFUSE_STATUS(urma_get_ip_by_eid, const void *ctx, const void *eid, P net_addr)
REFUSE_STATUS(urma_get_smac, const void *ctx, P mac)
REFUSE_STATUS(urma_get_dmac, const void *ctx, const void *net_addr, P mac)
