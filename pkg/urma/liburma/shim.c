//go:build linux && cgo

/*
 * shim.c: the only code that touches liburma's types. It resolves liburma's
 * functions with dlsym into a dispatch table (nothing links -lurma), and does
 * for Go what cgo cannot: bit-fields, anonymous unions, the packed
 * urma_ubva_t, architecture-dependent offsets behind pthread_mutex_t, and
 * work-request chains built in C memory.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "urma_compat.h"
#include "shim.h"

/* The layout facts this file relies on, for UMDK 26.06.0 on LP64 Linux. A
 * failure here means the declarations in urma_compat.h no longer describe
 * the ABI. */
_Static_assert(sizeof(void *) == 8, "LP64 only");
_Static_assert(sizeof(urma_eid_t) == 16, "urma_eid_t");
_Static_assert(sizeof(urma_jetty_id_t) == 24, "urma_jetty_id_t");
_Static_assert(sizeof(urma_ubva_t) == 28, "urma_ubva_t is packed");
_Static_assert(offsetof(urma_ubva_t, va) == 20, "urma_ubva_t.va is misaligned");
_Static_assert(sizeof(urma_seg_t) == 48, "urma_seg_t");
_Static_assert(offsetof(urma_seg_t, len) == 32, "urma_seg_t.len");
_Static_assert(offsetof(urma_seg_t, token_id) == 44, "urma_seg_t.token_id");
_Static_assert(offsetof(urma_target_seg_t, seg) == 0, "urma_target_seg_t.seg");
_Static_assert(sizeof(urma_cr_t) == 80, "urma_cr_t");
_Static_assert(offsetof(urma_cr_t, user_ctx) == 8, "urma_cr_t.user_ctx");
_Static_assert(offsetof(urma_cr_t, flag) == 20, "urma_cr_t.flag");
_Static_assert(offsetof(urma_cr_t, completion_len) == 24, "urma_cr_t.completion_len");
_Static_assert(offsetof(urma_cr_t, remote_id) == 32, "urma_cr_t.remote_id");
_Static_assert(offsetof(urma_cr_t, imm_data) == 56, "urma_cr_t.imm_data");
_Static_assert(sizeof(urma_cr_flag_t) == 1, "urma_cr_flag_t is one byte");
_Static_assert(sizeof(urma_sge_t) == 32, "urma_sge_t");
_Static_assert(sizeof(urma_jfs_wr_t) == 80, "urma_jfs_wr_t");
_Static_assert(offsetof(urma_jfs_wr_t, send) == 24, "urma_jfs_wr_t union");
_Static_assert(offsetof(urma_jfs_wr_t, next) == 72, "urma_jfs_wr_t.next");
_Static_assert(offsetof(urma_send_wr_t, imm_data) == 24, "urma_send_wr_t.imm_data");
_Static_assert(sizeof(urma_jfr_wr_t) == 32, "urma_jfr_wr_t");
_Static_assert(offsetof(urma_jfce_t, fd) == 8, "urma_jfce_t.fd");
_Static_assert(offsetof(urma_jfc_t, jfc_id) == 8, "urma_jfc_t.jfc_id");
_Static_assert(offsetof(urma_jfr_t, jfr_id) == 8, "urma_jfr_t.jfr_id");
_Static_assert(offsetof(urma_jetty_t, jetty_id) == 8, "urma_jetty_t.jetty_id");
_Static_assert(offsetof(urma_context_t, eid) == 24 + sizeof(pthread_mutex_t), "urma_context_t.eid follows the mutex");
_Static_assert(sizeof(urma_jfs_cfg_t) == 40, "urma_jfs_cfg_t");
_Static_assert(offsetof(urma_jfs_cfg_t, rnr_retry) == 20, "urma_jfs_cfg_t.rnr_retry");
_Static_assert(sizeof(urma_jfr_cfg_t) == 48, "urma_jfr_cfg_t");
_Static_assert(offsetof(urma_jfr_cfg_t, token_value) == 32, "urma_jfr_cfg_t.token_value");
_Static_assert(sizeof(urma_jetty_cfg_t) == 80, "urma_jetty_cfg_t");
_Static_assert(offsetof(urma_jetty_cfg_t, shared) == 48, "urma_jetty_cfg_t.shared");
_Static_assert(sizeof(urma_rjetty_t) == 48, "urma_rjetty_t");
_Static_assert(sizeof(urma_seg_cfg_t) == 48, "urma_seg_cfg_t");
_Static_assert(sizeof(urma_device_cap_t) == 304, "urma_device_cap_t");
_Static_assert(offsetof(urma_device_cap_t, max_msg_size) == 56, "urma_device_cap_t.max_msg_size");
_Static_assert(offsetof(urma_device_cap_t, trans_mode) == 104, "urma_device_cap_t.trans_mode");
_Static_assert(offsetof(urma_device_cap_t, rm_order_cap) == 148, "urma_device_cap_t.rm_order_cap");
_Static_assert(sizeof(urma_device_attr_t) == 496, "urma_device_attr_t");
_Static_assert(offsetof(urma_device_t, type) == URMA_MAX_NAME + URMA_MAX_PATH, "urma_device_t.type");

#define FN(name) __typeof__(name) *name
struct shim_lib {
    void *handle;
    FN(urma_init);
    FN(urma_uninit);
    FN(urma_get_device_list);
    FN(urma_free_device_list);
    FN(urma_get_eid_list);
    FN(urma_free_eid_list);
    FN(urma_get_device_by_name);
    FN(urma_query_device);
    FN(urma_create_context);
    FN(urma_delete_context);
    FN(urma_create_jfce);
    FN(urma_delete_jfce);
    FN(urma_create_jfc);
    FN(urma_delete_jfc);
    FN(urma_create_jfr);
    FN(urma_delete_jfr);
    FN(urma_create_jetty);
    FN(urma_modify_jetty);
    FN(urma_delete_jetty);
    FN(urma_flush_jetty);
    FN(urma_import_jetty);
    FN(urma_unimport_jetty);
    FN(urma_bind_jetty);
    FN(urma_unbind_jetty);
    FN(urma_register_seg);
    FN(urma_unregister_seg);
    FN(urma_import_seg);
    FN(urma_unimport_seg);
    FN(urma_post_jfr_wr);
    FN(urma_post_jetty_send_wr);
    FN(urma_poll_jfc);
    FN(urma_rearm_jfc);
    FN(urma_wait_jfc);
    FN(urma_ack_jfc);
    int (*kill_context)(urma_context_t *ctx); /* the fake's test hook, or NULL */
};
#undef FN

/* shim_handle is the library's dlopen handle: the same file under any name
 * (a symlink, another path) gives the same one. */
void *shim_handle(shim_lib *l)
{
    return l->handle;
}

/* shim_free drops a table whose library another table keeps loaded: its
 * dlopen reference goes, the library stays. */
void shim_free(shim_lib *l)
{
    dlclose(l->handle);
    free(l);
}

shim_lib *shim_open(const char *path, char *err, size_t errlen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(err, errlen, "%s", dlerror());
        return NULL;
    }
    shim_lib *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        dlclose(h);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    l->handle = h;
#define LOAD(name)                                                                  \
    do {                                                                            \
        *(void **)(&l->name) = dlsym(h, #name);                                     \
        if (l->name == NULL) {                                                      \
            snprintf(err, errlen, "%s has no symbol %s (not liburma, or an older " \
                     "UMDK than 26.06.0)", path, #name);                            \
            dlclose(h);                                                             \
            free(l);                                                                \
            return NULL;                                                            \
        }                                                                           \
    } while (0)
    LOAD(urma_init);
    LOAD(urma_uninit);
    LOAD(urma_get_device_list);
    LOAD(urma_free_device_list);
    LOAD(urma_get_eid_list);
    LOAD(urma_free_eid_list);
    LOAD(urma_get_device_by_name);
    LOAD(urma_query_device);
    LOAD(urma_create_context);
    LOAD(urma_delete_context);
    LOAD(urma_create_jfce);
    LOAD(urma_delete_jfce);
    LOAD(urma_create_jfc);
    LOAD(urma_delete_jfc);
    LOAD(urma_create_jfr);
    LOAD(urma_delete_jfr);
    LOAD(urma_create_jetty);
    LOAD(urma_modify_jetty);
    LOAD(urma_delete_jetty);
    LOAD(urma_flush_jetty);
    LOAD(urma_import_jetty);
    LOAD(urma_unimport_jetty);
    LOAD(urma_bind_jetty);
    LOAD(urma_unbind_jetty);
    LOAD(urma_register_seg);
    LOAD(urma_unregister_seg);
    LOAD(urma_import_seg);
    LOAD(urma_unimport_seg);
    LOAD(urma_post_jfr_wr);
    LOAD(urma_post_jetty_send_wr);
    LOAD(urma_poll_jfc);
    LOAD(urma_rearm_jfc);
    LOAD(urma_wait_jfc);
    LOAD(urma_ack_jfc);
#undef LOAD
    *(void **)(&l->kill_context) = dlsym(h, "fakeurma_kill_context");
    return l;
}

int shim_init(shim_lib *l)
{
    urma_init_attr_t attr;
    memset(&attr, 0, sizeof(attr)); /* a uasid is assigned */
    return l->urma_init(&attr);
}

int shim_uninit(shim_lib *l)
{
    return l->urma_uninit();
}

/* fail reports a call that returned NULL: errno when it says something. */
static int fail(void)
{
    return errno != 0 ? errno : URMA_FAIL;
}

static void fill_dev_info(shim_dev_info *o, const urma_device_t *d, const urma_device_attr_t *a)
{
    const urma_device_cap_t *c = &a->dev_cap;
    memset(o, 0, sizeof(*o));
    snprintf(o->name, sizeof(o->name), "%s", d->name);
    o->transport_type = d->type;
    memcpy(o->guid, a->guid.raw, sizeof(o->guid));
    o->feature = c->feature.value;
    o->max_jfc = c->max_jfc;
    o->max_jfs = c->max_jfs;
    o->max_jfr = c->max_jfr;
    o->max_jetty = c->max_jetty;
    o->max_jetty_grp = c->max_jetty_grp;
    o->max_jfc_depth = c->max_jfc_depth;
    o->max_jfs_depth = c->max_jfs_depth;
    o->max_jfr_depth = c->max_jfr_depth;
    o->max_jfs_inline_len = c->max_jfs_inline_len;
    o->max_jfs_sge = c->max_jfs_sge;
    o->max_jfs_rsge = c->max_jfs_rsge;
    o->max_jfr_sge = c->max_jfr_sge;
    o->max_msg_size = c->max_msg_size;
    o->trans_mode = c->trans_mode;
    o->max_eid_cnt = c->max_eid_cnt;
    o->rm_order_ot = c->rm_order_cap.bs.ot;
    o->port_cnt = a->port_cnt > MAX_PORT_CNT ? MAX_PORT_CNT : a->port_cnt;
    for (uint32_t i = 0; i < o->port_cnt; i++) {
        const urma_port_attr_t *p = &a->port_attr[i];
        o->ports[i] = (shim_port){p->max_mtu, p->state, p->active_width, p->active_speed, p->active_mtu};
    }
    o->reserved_jetty_min = a->reserved_jetty_id_min;
    o->reserved_jetty_max = a->reserved_jetty_id_max;
}

int shim_list_devices(shim_lib *l, shim_dev_info *out, int max, int *err)
{
    int n = 0;
    errno = 0;
    urma_device_t **list = l->urma_get_device_list(&n);
    if (list == NULL) {
        int e = errno;
        if (e == 0 || e == ENODEV) { /* no device is not an error */
            *err = 0;
            return 0;
        }
        *err = e; /* calloc failed, or sysfs changed under the scan */
        return SHIM_ERR_GET_DEVICE_LIST;
    }
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        urma_device_attr_t attr;
        memset(&attr, 0, sizeof(attr));
        int st = l->urma_query_device(list[i], &attr);
        if (st != URMA_SUCCESS) {
            *err = st;
            l->urma_free_device_list(list);
            return SHIM_ERR_QUERY_DEVICE;
        }
        fill_dev_info(&out[k++], list[i], &attr);
    }
    l->urma_free_device_list(list);
    *err = 0;
    return k;
}

static urma_device_t *device(shim_lib *l, const char *name)
{
    return l->urma_get_device_by_name((char *)name);
}

int shim_list_eids(shim_lib *l, const char *name, shim_eid *out, int max, int *err)
{
    urma_device_t *d = device(l, name);
    if (d == NULL) {
        *err = ENODEV;
        return -1;
    }
    uint32_t cnt = 0;
    errno = 0;
    urma_eid_info_t *eids = l->urma_get_eid_list(d, &cnt);
    if (eids == NULL) {
        *err = errno;
        return errno == 0 ? 0 : -1;
    }
    int k = 0;
    for (uint32_t i = 0; i < cnt && k < max; i++) {
        memcpy(out[k].raw, eids[i].eid.raw, 16);
        out[k].index = eids[i].eid_index;
        k++;
    }
    l->urma_free_eid_list(eids);
    *err = 0;
    return k;
}

static void put_id(shim_id *o, const urma_jetty_id_t *id)
{
    memcpy(o->eid, id->eid.raw, 16);
    o->uasid = id->uasid;
    o->id = id->id;
}

struct urma_context *shim_create_context(shim_lib *l, const char *name, uint32_t eid_index, shim_id *id, int *err)
{
    urma_device_t *d = device(l, name);
    if (d == NULL) {
        *err = ENODEV;
        return NULL;
    }
    errno = 0;
    urma_context_t *c = l->urma_create_context(d, eid_index);
    if (c == NULL) {
        *err = fail();
        return NULL;
    }
    memcpy(id->eid, c->eid.raw, 16);
    id->uasid = c->uasid;
    id->id = 0;
    return c;
}

int shim_delete_context(shim_lib *l, struct urma_context *c)
{
    return l->urma_delete_context(c);
}

struct urma_jfce *shim_create_jfce(shim_lib *l, struct urma_context *c, int *fd, int *err)
{
    errno = 0;
    urma_jfce_t *e = l->urma_create_jfce(c);
    if (e == NULL) {
        *err = fail();
        return NULL;
    }
    *fd = e->fd;
    return e;
}

int shim_delete_jfce(shim_lib *l, struct urma_jfce *e)
{
    return l->urma_delete_jfce(e);
}

struct urma_jfc *shim_create_jfc(shim_lib *l, struct urma_context *c, uint32_t depth, struct urma_jfce *e,
                                 uint32_t *id, int *err)
{
    urma_jfc_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.depth = depth;
    cfg.jfce = e;
    errno = 0;
    urma_jfc_t *q = l->urma_create_jfc(c, &cfg);
    if (q == NULL) {
        *err = fail();
        return NULL;
    }
    *id = q->jfc_id.id;
    return q;
}

int shim_delete_jfc(shim_lib *l, struct urma_jfc *q)
{
    return l->urma_delete_jfc(q);
}

struct urma_jfr *shim_create_jfr(shim_lib *l, struct urma_context *c, const shim_jfr_cfg *in, struct urma_jfc *q,
                                 shim_id *id, int *err)
{
    urma_jfr_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.depth = in->depth;
    cfg.flag.bs.token_policy = in->token_policy;
    cfg.trans_mode = (urma_transport_mode_t)in->mode;
    cfg.max_sge = (uint8_t)in->max_sge;
    cfg.min_rnr_timer = (uint8_t)in->min_rnr_timer;
    cfg.jfc = q;
    cfg.token_value.token = in->token;
    errno = 0;
    urma_jfr_t *r = l->urma_create_jfr(c, &cfg);
    if (r == NULL) {
        *err = fail();
        return NULL;
    }
    put_id(id, &r->jfr_id);
    return r;
}

int shim_delete_jfr(shim_lib *l, struct urma_jfr *r)
{
    return l->urma_delete_jfr(r);
}

struct urma_jetty *shim_create_jetty(shim_lib *l, struct urma_context *c, const shim_jetty_cfg *in,
                                     struct urma_jfc *send_jfc, struct urma_jfr *jfr, shim_id *id, int *err)
{
    urma_jetty_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.flag.bs.share_jfr = 1;
    cfg.jfs_cfg.depth = in->depth;
    cfg.jfs_cfg.trans_mode = (urma_transport_mode_t)in->mode;
    cfg.jfs_cfg.priority = (uint8_t)in->priority;
    cfg.jfs_cfg.max_sge = (uint8_t)in->max_sge;
    cfg.jfs_cfg.max_inline_data = in->max_inline;
    cfg.jfs_cfg.rnr_retry = (uint8_t)in->rnr_retry;
    cfg.jfs_cfg.err_timeout = (uint8_t)in->err_timeout;
    cfg.jfs_cfg.jfc = send_jfc;
    cfg.shared.jfr = jfr;
    cfg.shared.jfc = jfr->jfr_cfg.jfc;
    errno = 0;
    urma_jetty_t *j = l->urma_create_jetty(c, &cfg);
    if (j == NULL) {
        *err = fail();
        return NULL;
    }
    put_id(id, &j->jetty_id);
    return j;
}

int shim_delete_jetty(shim_lib *l, struct urma_jetty *j)
{
    return l->urma_delete_jetty(j);
}

int shim_jetty_to_error(shim_lib *l, struct urma_jetty *j)
{
    urma_jetty_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.mask = JETTY_STATE;
    attr.state = URMA_JETTY_STATE_ERROR;
    return l->urma_modify_jetty(j, &attr);
}

/* put_cr reads only what udma's poll writes (hw/udma/udma_u_jfc.c
 * udma_u_parse_cqe_for_jfc): it never fills remote_id.uasid or the
 * flush_err_done bit, which keep whatever the buffer held. The remote
 * uasid stays 0, and FLUSH_ERR_DONE is known by its status. */
static void put_cr(shim_cr *o, const urma_cr_t *c)
{
    memset(o, 0, sizeof(*o));
    o->status = c->status;
    o->recv = c->flag.bs.s_r;
    o->jetty = c->flag.bs.jetty;
    o->opcode = (uint32_t)c->opcode; /* meaningful for receives only: Go drops the rest */
    o->completion_len = c->completion_len;
    o->local_id = c->local_id;
    memcpy(o->remote.eid, c->remote_id.eid.raw, 16);
    o->remote.id = c->remote_id.id;
    o->imm = c->imm_data; /* filled for receives with an immediate only: Go drops the rest */
    o->user_ctx = c->user_ctx;
}

/* Completion records are converted through a bounded stack buffer, so the
 * hot path allocates nothing. */
#define CR_BATCH 32

int shim_flush_jetty(shim_lib *l, struct urma_jetty *j, int n, shim_cr *out, int *err)
{
    urma_cr_t crs[CR_BATCH];
    if (n > CR_BATCH) {
        n = CR_BATCH;
    }
    *err = 0;
    int k = l->urma_flush_jetty(j, n, crs);
    if (k < 0 || k > n) {
        /* Negative is liburma's error (-status, core/urma_cp_api.c); more
         * than n is a count udma never returns (udma_u_flush_jetty stops
         * at cr_cnt), and converting it would run past crs and out. */
        *err = k;
        return 0;
    }
    for (int i = 0; i < k; i++) {
        put_cr(&out[i], &crs[i]);
    }
    return k;
}

struct urma_target_jetty *shim_import_jetty(shim_lib *l, struct urma_context *c, const shim_id *id, uint32_t mode,
                                            uint32_t token, int *err)
{
    urma_rjetty_t r;
    memset(&r, 0, sizeof(r));
    memcpy(r.jetty_id.eid.raw, id->eid, 16);
    r.jetty_id.uasid = id->uasid;
    r.jetty_id.id = id->id;
    r.trans_mode = (urma_transport_mode_t)mode;
    r.type = URMA_JETTY;
    r.tp_type = URMA_CTP; /* what brpc's hello advertises */
    /* The token travels with every message; the target decides whether
     * to check it (its JFR's policy). */
    r.flag.bs.token_policy = URMA_TOKEN_PLAIN_TEXT;
    urma_token_t t = {.token = token};
    errno = 0;
    urma_target_jetty_t *tj = l->urma_import_jetty(c, &r, &t);
    if (tj == NULL) {
        *err = fail();
        return NULL;
    }
    return tj;
}

int shim_unimport_jetty(shim_lib *l, struct urma_target_jetty *t)
{
    return l->urma_unimport_jetty(t);
}

int shim_bind_jetty(shim_lib *l, struct urma_jetty *j, struct urma_target_jetty *t)
{
    return l->urma_bind_jetty(j, t);
}

int shim_unbind_jetty(shim_lib *l, struct urma_jetty *j)
{
    return l->urma_unbind_jetty(j);
}

static void put_seg_id(shim_seg_id *o, const urma_seg_t *s)
{
    memcpy(o->eid, s->ubva.eid.raw, 16);
    o->uasid = s->ubva.uasid;
    o->va = s->ubva.va; /* a misaligned read the compiler does right */
    o->len = s->len;
    o->token_id = s->token_id;
}

struct urma_target_seg *shim_register_seg(shim_lib *l, struct urma_context *c, uint64_t va, uint64_t len,
                                          uint32_t access, uint32_t token_policy, uint32_t token, shim_seg_id *id,
                                          int *err)
{
    urma_seg_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.va = va;
    cfg.len = len;
    cfg.token_value.token = token;
    cfg.flag.bs.token_policy = token_policy;
    cfg.flag.bs.access = access;
    errno = 0;
    urma_target_seg_t *s = l->urma_register_seg(c, &cfg);
    if (s == NULL) {
        *err = fail();
        return NULL;
    }
    put_seg_id(id, &s->seg);
    return s;
}

int shim_unregister_seg(shim_lib *l, struct urma_target_seg *s)
{
    return l->urma_unregister_seg(s);
}

struct urma_target_seg *shim_import_seg(shim_lib *l, struct urma_context *c, const shim_seg_id *id, uint32_t token,
                                        int *err)
{
    urma_seg_t s;
    memset(&s, 0, sizeof(s));
    memcpy(s.ubva.eid.raw, id->eid, 16);
    s.ubva.uasid = id->uasid;
    s.ubva.va = id->va;
    s.len = id->len;
    s.token_id = id->token_id;
    s.attr.bs.token_policy = URMA_TOKEN_PLAIN_TEXT; /* udma refuses anything stronger */
    urma_token_t t = {.token = token};
    urma_import_seg_flag_t flag = {.value = 0};
    flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE | URMA_ACCESS_ATOMIC;
    errno = 0;
    urma_target_seg_t *ts = l->urma_import_seg(c, &s, &t, 0, flag);
    if (ts == NULL) {
        *err = fail();
        return NULL;
    }
    return ts;
}

int shim_unimport_seg(shim_lib *l, struct urma_target_seg *s)
{
    return l->urma_unimport_seg(s);
}

static void put_sges(urma_sge_t *out, const shim_sge *in, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        out[i].addr = in[i].addr;
        out[i].len = in[i].len;
        out[i].tseg = in[i].tseg;
        out[i].user_tseg = NULL;
    }
}

int shim_post_send(shim_lib *l, struct urma_jetty *j, struct urma_target_jetty *t, const shim_send *in)
{
    urma_sge_t sges[SHIM_MAX_SGE];
    uint32_t n = in->nsge > SHIM_MAX_SGE ? SHIM_MAX_SGE : in->nsge;
    put_sges(sges, in->sges, n);
    urma_jfs_wr_t wr;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = (urma_opcode_t)in->opcode;
    wr.flag.bs.complete_enable = in->complete;
    wr.flag.bs.solicited_enable = in->solicited;
    wr.flag.bs.inline_flag = in->inline_data;
    wr.tjetty = t;
    wr.user_ctx = in->user_ctx;
    wr.send.src.sge = sges;
    wr.send.src.num_sge = n;
    wr.send.imm_data = in->imm;
    wr.next = NULL;
    urma_jfs_wr_t *bad = NULL;
    return l->urma_post_jetty_send_wr(j, &wr, &bad);
}

int shim_post_recv(shim_lib *l, struct urma_jfr *r, const shim_recv *in)
{
    urma_sge_t sges[SHIM_MAX_SGE];
    uint32_t n = in->nsge > SHIM_MAX_SGE ? SHIM_MAX_SGE : in->nsge;
    put_sges(sges, in->sges, n);
    urma_jfr_wr_t wr;
    memset(&wr, 0, sizeof(wr));
    wr.src.sge = sges;
    wr.src.num_sge = n;
    wr.user_ctx = in->user_ctx;
    urma_jfr_wr_t *bad = NULL;
    return l->urma_post_jfr_wr(r, &wr, &bad);
}

/* CR_UNWRITTEN is no urma_cr_status_t: a record still holding it was not
 * parsed by the poll. */
#define CR_UNWRITTEN ((urma_cr_status_t)0x7fffffff)

/* POLL_ERR is urma_poll_jfc's only error: -1 from liburma's own checks
 * (core/urma_dp_api.c) and -UDMA_INTER_ERR, which is -1, from udma's poll
 * (hw/udma/udma_u_jfc.c udma_u_poll_jfc). */
#define POLL_ERR (-1)

int shim_poll(shim_lib *l, struct urma_jfc *q, int n, shim_cr *out, int *err)
{
    urma_cr_t crs[CR_BATCH];
    if (n > CR_BATCH) {
        n = CR_BATCH;
    }
    for (int i = 0; i < n; i++) {
        crs[i].status = CR_UNWRITTEN;
    }
    *err = 0;
    int k = l->urma_poll_jfc(q, n, crs);
    if (k > n || k < POLL_ERR) {
        /* A count beyond the array, or a negative one liburma never
         * returns: none of it can be trusted. */
        *err = k;
        return 0;
    }
    if (k == POLL_ERR) {
        /* udma_u_poll_jfc (hw/udma/udma_u_jfc.c:822-847) fails the whole
         * call on a CQE it cannot parse, after consuming it and the records
         * before it, which are in crs. It writes a record's status last and
         * only when the parse succeeds (udma_u_get_cr_status, :546-556;
         * udma_u_parse_cqe_for_recv/send, :699-706 and :719-727), so the
         * records before the first unwritten status are whole. */
        *err = k;
        for (k = 0; k < n && crs[k].status != CR_UNWRITTEN; k++) {
        }
    }
    for (int i = 0; i < k; i++) {
        put_cr(&out[i], &crs[i]);
    }
    return k;
}

int shim_rearm(shim_lib *l, struct urma_jfc *q, int solicited_only)
{
    return l->urma_rearm_jfc(q, solicited_only != 0);
}

int shim_wait(shim_lib *l, struct urma_jfce *e, int n, int timeout_ms, struct urma_jfc **out, int *err)
{
    errno = 0;
    int k = l->urma_wait_jfc(e, (uint32_t)n, timeout_ms, out);
    *err = k < 0 ? fail() : 0;
    return k;
}

void shim_ack(shim_lib *l, struct urma_jfc *q, uint32_t n)
{
    urma_jfc_t *one[1] = {q};
    uint32_t cnt[1] = {n};
    l->urma_ack_jfc(one, cnt, 1);
}

int shim_nop(shim_lib *l)
{
    return l == NULL;
}

int shim_kill_context(shim_lib *l, struct urma_context *c)
{
    if (l->kill_context == NULL) {
        return ENOSYS;
    }
    return l->kill_context(c);
}

int shim_fake_hook(shim_lib *l, const char *name, void *arg)
{
    int (*hook)(void *);
    *(void **)(&hook) = dlsym(l->handle, name);
    if (hook == NULL) {
        return ENOSYS;
    }
    return hook(arg);
}
