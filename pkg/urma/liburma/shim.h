/*
 * shim.h: the flat C interface Go calls. liburma's own types stay behind it
 * (shim.c includes urma_compat.h): Go sees opaque pointers to liburma objects
 * and plain structs without bit-fields, unions or packing, which cgo maps
 * faithfully. Go passes only memory that holds no Go pointers, and C keeps
 * nothing Go owns after a call returns.
 */
#ifndef URMA_K8S_SHIM_H
#define URMA_K8S_SHIM_H

#include <stddef.h>
#include <stdint.h>

struct urma_device;
struct urma_context;
struct urma_jfce;
struct urma_jfc;
struct urma_jfr;
struct urma_jetty;
struct urma_target_jetty;
struct urma_target_seg;

/* A loaded liburma: its dlopen handle and the functions we call. */
typedef struct shim_lib shim_lib;

#define SHIM_MAX_SGE   64 /* urma_jfs_cfg_t.max_sge is a uint8_t; udma allows far fewer */
#define SHIM_MAX_PORTS 8

typedef struct shim_port {
    uint32_t max_mtu, state, active_width, active_speed, active_mtu;
} shim_port;

typedef struct shim_dev_info {
    char name[64];
    int32_t transport_type;
    uint8_t guid[16];
    uint32_t feature, max_jfc, max_jfs, max_jfr, max_jetty, max_jetty_grp;
    uint32_t max_jfc_depth, max_jfs_depth, max_jfr_depth, max_jfs_inline_len;
    uint32_t max_jfs_sge, max_jfs_rsge, max_jfr_sge, trans_mode, max_eid_cnt;
    uint32_t rm_order_ot; /* rm_order_cap has target ordering */
    uint64_t max_msg_size;
    uint32_t port_cnt;
    shim_port ports[SHIM_MAX_PORTS];
    uint32_t reserved_jetty_min, reserved_jetty_max;
} shim_dev_info;

typedef struct shim_eid {
    uint8_t raw[16];
    uint32_t index;
} shim_eid;

typedef struct shim_id {
    uint8_t eid[16];
    uint32_t uasid, id;
} shim_id;

typedef struct shim_seg_id {
    uint8_t eid[16];
    uint32_t uasid, token_id;
    uint64_t va, len;
} shim_seg_id;

typedef struct shim_jfr_cfg {
    uint32_t depth, mode, max_sge, min_rnr_timer, token_policy, token;
} shim_jfr_cfg;

typedef struct shim_jetty_cfg {
    uint32_t depth, mode, priority, max_sge, max_inline, rnr_retry, err_timeout;
} shim_jetty_cfg;

typedef struct shim_sge {
    uint64_t addr;
    uint32_t len;
    struct urma_target_seg *tseg;
} shim_sge;

/* One send work request, built into a chain of one by shim_post_send. */
typedef struct shim_send {
    uint32_t opcode;
    uint32_t complete, solicited, inline_data;
    uint64_t user_ctx, imm;
    uint32_t nsge;
    shim_sge sges[SHIM_MAX_SGE];
} shim_send;

typedef struct shim_recv {
    uint64_t user_ctx;
    uint32_t nsge;
    shim_sge sges[SHIM_MAX_SGE];
} shim_recv;

/* A completion record with its flags and union taken apart: what udma
 * fills (remote.uasid is 0; udma does not report it). */
typedef struct shim_cr {
    uint32_t status, opcode;
    uint8_t recv, jetty, pad[2];
    uint32_t completion_len, local_id;
    shim_id remote;
    uint64_t imm, user_ctx;
} shim_cr;

shim_lib *shim_open(const char *path, char *err, size_t errlen);
void *shim_handle(shim_lib *l);
void shim_free(shim_lib *l);
int shim_init(shim_lib *l);
int shim_uninit(shim_lib *l);

/* shim_list_devices returns the devices it filled in, or which call failed
 * (with its errno or status in *err) */
#define SHIM_ERR_GET_DEVICE_LIST (-1)
#define SHIM_ERR_QUERY_DEVICE    (-2)
int shim_list_devices(shim_lib *l, shim_dev_info *out, int max, int *err);
int shim_list_eids(shim_lib *l, const char *dev, shim_eid *out, int max, int *err);

struct urma_context *shim_create_context(shim_lib *l, const char *dev, uint32_t eid_index, shim_id *id, int *err);
int shim_delete_context(shim_lib *l, struct urma_context *c);

struct urma_jfce *shim_create_jfce(shim_lib *l, struct urma_context *c, int *fd, int *err);
int shim_delete_jfce(shim_lib *l, struct urma_jfce *e);
struct urma_jfc *shim_create_jfc(shim_lib *l, struct urma_context *c, uint32_t depth, struct urma_jfce *e,
                                 uint32_t *id, int *err);
int shim_delete_jfc(shim_lib *l, struct urma_jfc *q);
struct urma_jfr *shim_create_jfr(shim_lib *l, struct urma_context *c, const shim_jfr_cfg *cfg, struct urma_jfc *q,
                                 shim_id *id, int *err);
int shim_delete_jfr(shim_lib *l, struct urma_jfr *r);
struct urma_jetty *shim_create_jetty(shim_lib *l, struct urma_context *c, const shim_jetty_cfg *cfg,
                                     struct urma_jfc *send_jfc, struct urma_jfr *jfr, shim_id *id, int *err);
int shim_delete_jetty(shim_lib *l, struct urma_jetty *j);
int shim_jetty_to_error(shim_lib *l, struct urma_jetty *j);
/* shim_flush_jetty returns the records it put in out, at most n; *err is
 * urma_flush_jetty's return when that was negative (an error) or more than
 * n, and there are no records then. */
int shim_flush_jetty(shim_lib *l, struct urma_jetty *j, int n, shim_cr *out, int *err);

struct urma_target_jetty *shim_import_jetty(shim_lib *l, struct urma_context *c, const shim_id *id, uint32_t mode,
                                            uint32_t token, int *err);
int shim_unimport_jetty(shim_lib *l, struct urma_target_jetty *t);
int shim_bind_jetty(shim_lib *l, struct urma_jetty *j, struct urma_target_jetty *t);
int shim_unbind_jetty(shim_lib *l, struct urma_jetty *j);

struct urma_target_seg *shim_register_seg(shim_lib *l, struct urma_context *c, uint64_t va, uint64_t len,
                                          uint32_t access, uint32_t token_policy, uint32_t token, shim_seg_id *id,
                                          int *err);
int shim_unregister_seg(shim_lib *l, struct urma_target_seg *s);
struct urma_target_seg *shim_import_seg(shim_lib *l, struct urma_context *c, const shim_seg_id *id, uint32_t token,
                                        int *err);
int shim_unimport_seg(shim_lib *l, struct urma_target_seg *s);

int shim_post_send(shim_lib *l, struct urma_jetty *j, struct urma_target_jetty *t, const shim_send *wr);
int shim_post_recv(shim_lib *l, struct urma_jfr *r, const shim_recv *wr);
/* shim_poll returns the records it put in out; *err is urma_poll_jfc's
 * return when that was an error (negative) or more than n. On its error,
 * -1, the records are those the failed call had taken already; on any
 * other negative count or one above n there are none. */
int shim_poll(shim_lib *l, struct urma_jfc *q, int n, shim_cr *out, int *err);
int shim_rearm(shim_lib *l, struct urma_jfc *q, int solicited_only);
int shim_wait(shim_lib *l, struct urma_jfce *e, int n, int timeout_ms, struct urma_jfc **out, int *err);
void shim_ack(shim_lib *l, struct urma_jfc *q, uint32_t n);

/* A call with no work, for measuring what a cgo call costs. */
int shim_nop(shim_lib *l);

/* Test hook: the fake liburma exports fakeurma_kill_context; liburma does
 * not. Returns ENOSYS when the library lacks it. */
int shim_kill_context(shim_lib *l, struct urma_context *c);

/* Test hook: calls the fake liburma's int name(void *arg). Returns ENOSYS
 * when the library has no such function (liburma has none). */
int shim_fake_hook(shim_lib *l, const char *name, void *arg);

#endif /* URMA_K8S_SHIM_H */
