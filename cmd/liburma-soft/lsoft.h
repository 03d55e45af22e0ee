/*
 * lsoft.h: the flat structures through which the C half of liburma-soft
 * (abi.c, which alone touches liburma's layouts) and its Go half
 * (exports.go) talk. Only fixed-size integer fields: cgo reads and writes
 * them as they are, and no Go pointer crosses. Handles are the Go half's
 * names for its objects; 0 names none.
 */
#ifndef URMA_K8S_LSOFT_H
#define URMA_K8S_LSOFT_H

#include <stdint.h>

/* The most SGEs one work request carries: the software provider's limit. */
#define LSOFT_MAX_SGE 16
/* The most devices the library lists (liburmasoft.MaxDevices). */
#define LSOFT_MAX_DEVICES 16
/* The most EIDs a device reports. */
#define LSOFT_MAX_EIDS 16
#define LSOFT_NAME_LEN 64

/* What lsoft_close closes: the handle must name an object of that kind. */
enum lsoft_kind {
    LSOFT_CONTEXT = 1,
    LSOFT_JFCE,
    LSOFT_JFC,
    LSOFT_JFR,
    LSOFT_JETTY,
    LSOFT_TJETTY,
    LSOFT_SEG,
    LSOFT_TSEG,
};

typedef struct lsoft_name {
    char name[LSOFT_NAME_LEN];
} lsoft_name;

typedef struct lsoft_id {
    uint8_t eid[16];
    uint32_t uasid;
    uint32_t id;
} lsoft_id;

typedef struct lsoft_eid {
    uint8_t eid[16];
    uint32_t index;
    uint32_t pad;
} lsoft_eid;

typedef struct lsoft_dev {
    uint32_t transport_type;
    uint32_t max_jfc, max_jfs, max_jfr, max_jetty, max_jetty_grp;
    uint32_t max_jfc_depth, max_jfs_depth, max_jfr_depth;
    uint32_t max_inline, max_jfs_sge, max_jfs_rsge, max_jfr_sge;
    uint32_t trans_mode, max_eid_cnt, ordered_rm;
    uint64_t max_msg_size;
    uint32_t port_cnt;
    uint32_t port_state[8];
    uint32_t port_mtu[8];
    uint32_t reserved_min, reserved_max;
} lsoft_dev;

typedef struct lsoft_seg_id {
    uint8_t eid[16];
    uint32_t uasid;
    uint32_t token_id;
    uint64_t va;
    uint64_t len;
} lsoft_seg_id;

typedef struct lsoft_sge {
    uint64_t addr;
    uint64_t seg; /* handle of the segment the SGE names, 0 for none */
    uint32_t len;
    uint32_t pad;
} lsoft_sge;

typedef struct lsoft_send {
    uint32_t opcode;
    uint8_t complete, solicited, inline_data, pad;
    uint64_t target; /* handle of the target jetty, 0 for none */
    uint64_t user_ctx;
    uint64_t imm;
    uint32_t nsge;
    uint32_t pad2;
    lsoft_sge sge[LSOFT_MAX_SGE];
} lsoft_send;

typedef struct lsoft_recv {
    uint64_t user_ctx;
    uint32_t nsge;
    uint32_t pad;
    lsoft_sge sge[LSOFT_MAX_SGE];
} lsoft_recv;

typedef struct lsoft_jfr_cfg {
    uint32_t mode, depth, max_sge, min_rnr_timer, token_policy, token;
    uint64_t jfc;
} lsoft_jfr_cfg;

typedef struct lsoft_jetty_cfg {
    uint32_t share_jfr, mode, depth, max_inline;
    uint8_t priority, max_sge, rnr_retry, err_timeout;
    uint32_t pad;
    uint64_t send_jfc;
    uint64_t jfr;
} lsoft_jetty_cfg;

typedef struct lsoft_cr {
    uint64_t user_ctx;
    uint64_t imm;
    uint8_t remote_eid[16];
    uint32_t remote_uasid;
    uint32_t remote_id;
    uint32_t status;
    uint32_t opcode;
    uint32_t completion_len;
    uint32_t local_id;
    uint8_t recv;
    uint8_t pad[7];
} lsoft_cr;

/* The Go half (exports.go); cgo declares the same in _cgo_export.h, and
 * abi.c includes both, so that the compiler holds them to each other. A
 * count returned negative is -status. */
int lsoft_init(void);
int lsoft_uninit(void);
int lsoft_device_names(lsoft_name *out, int max);
int lsoft_device_info(char *name, lsoft_dev *out);
int lsoft_device_eids(char *name, lsoft_eid *out, int max);
int lsoft_create_context(char *name, uint32_t eid_index, uint64_t *h, lsoft_id *id);
int lsoft_close(uint64_t h, int kind);
int lsoft_create_jfce(uint64_t ctx, uint64_t *h, int *fd);
int lsoft_create_jfc(uint64_t ctx, uint32_t depth, uint64_t jfce, uint64_t user_ctx, uintptr_t cptr, uint64_t *h,
                     uint32_t *id);
int lsoft_create_jfr(uint64_t ctx, lsoft_jfr_cfg *cfg, uint64_t *h, lsoft_id *id);
int lsoft_create_jetty(uint64_t ctx, lsoft_jetty_cfg *cfg, uint64_t *h, lsoft_id *id);
int lsoft_register_seg(uint64_t ctx, void *va, uint64_t length, uint32_t access, uint32_t policy, uint32_t token,
                       uint64_t *h, lsoft_seg_id *id);
int lsoft_import_seg(uint64_t ctx, lsoft_seg_id *in, uint32_t token, uint64_t *h);
int lsoft_import_jetty(uint64_t ctx, lsoft_id *in, uint32_t mode, uint32_t target_type, uint32_t token,
                       uint64_t *h);
int lsoft_bind_jetty(uint64_t jetty, uint64_t tjetty);
int lsoft_unbind_jetty(uint64_t jetty);
int lsoft_modify_jetty(uint64_t jetty, uint32_t mask, uint32_t state);
int lsoft_flush_jetty(uint64_t jetty, int n, lsoft_cr *out);
int lsoft_post_send(uint64_t jetty, lsoft_send *w);
int lsoft_post_recv(uint64_t jfr, lsoft_recv *w);
int lsoft_post_jetty_recv(uint64_t jetty, lsoft_recv *w);
int lsoft_poll(uint64_t jfc, int n, lsoft_cr *out);
int lsoft_rearm(uint64_t jfc, int solicited_only);
int lsoft_wait(uint64_t jfce, int n, int timeout_ms, uintptr_t *out);
void lsoft_ack(uint64_t jfc, uint32_t n);
void lsoft_refused(char *fn);
void lsoft_set_log_level(int level);
int lsoft_log_level(void);

#endif /* URMA_K8S_LSOFT_H */
