/*
 * abi.c: liburma's functions over the software provider. This file alone
 * reads and writes liburma's structures (urma_compat.h, UMDK 26.06): it
 * checks arguments as liburma does, flattens them into lsoft.h's
 * structures for the Go half (exports.go), and builds the objects it
 * returns with C malloc, their public fields filled as liburma fills
 * them. Each object names its Go object by a handle: in liburma's own
 * handle field where the structure has one, in a wrapper's otherwise
 * (context, JFCE). Nothing here keeps a Go pointer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "urma_compat.h"
#include "lsoft.h"
#include "_cgo_export.h"

/* The layouts this file relies on (the same the Go provider's shim
 * asserts), for UMDK 26.06.0 on LP64 Linux. */
_Static_assert(sizeof(void *) == 8, "LP64 only");
_Static_assert(sizeof(urma_jetty_id_t) == 24, "urma_jetty_id_t");
_Static_assert(sizeof(urma_seg_t) == 48, "urma_seg_t");
_Static_assert(sizeof(urma_cr_t) == 80, "urma_cr_t");
_Static_assert(sizeof(urma_jfs_wr_t) == 80, "urma_jfs_wr_t");
_Static_assert(sizeof(urma_jfr_wr_t) == 32, "urma_jfr_wr_t");
_Static_assert(sizeof(urma_device_attr_t) == 496, "urma_device_attr_t");
_Static_assert(sizeof(urma_user_ctl_in_t) == 16, "urma_user_ctl_in_t");
_Static_assert(sizeof(urma_user_ctl_out_t) == 16, "urma_user_ctl_out_t");

/*
 * SIGPIPE. The Go runtime of this library installs a SIGPIPE handler
 * when the library loads, and hands a SIGPIPE raised on a thread of the
 * program to the handler it found, SIG_DFL killing the process. A program
 * that ignores SIGPIPE only when no handler is set (brpc,
 * global.cpp:354-358) then dies of a write to a closed socket. This
 * constructor runs before the runtime's (constructors with a priority
 * come first) and ignores SIGPIPE when nobody handles it, so the runtime
 * records SIG_IGN and forwards nothing. A program that set its own
 * handler before loading the library keeps it.
 */
__attribute__((constructor(101))) static void lsoft_ignore_sigpipe(void)
{
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) {
        signal(SIGPIPE, SIG_IGN);
    }
}

/* ---- objects without a handle field ---- */

#define CTX_MAGIC  0x75726d61637478ULL /* "urmactx" */
#define JFCE_MAGIC 0x75726d616a666365ULL

typedef struct lsoft_context {
    urma_context_t base; /* first: the program holds &base */
    uint64_t magic;
    uint64_t h;
} lsoft_context;

typedef struct lsoft_jfce {
    urma_jfce_t base;
    uint64_t magic;
    uint64_t h;
} lsoft_jfce;

static lsoft_context *ctx_of(urma_context_t *c)
{
    lsoft_context *x = (lsoft_context *)c;
    return x != NULL && x->magic == CTX_MAGIC ? x : NULL;
}

static lsoft_jfce *jfce_of(urma_jfce_t *e)
{
    lsoft_jfce *x = (lsoft_jfce *)e;
    return x != NULL && x->magic == JFCE_MAGIC ? x : NULL;
}

static void *fail_null(int status)
{
    errno = status;
    return NULL;
}

/* ---- initialisation ---- */

urma_status_t urma_init(urma_init_attr_t *conf)
{
    (void)conf;
    return lsoft_init();
}

urma_status_t urma_uninit(void)
{
    return lsoft_uninit();
}

/* ---- devices ----
 * A device structure lives as long as the process: programs read
 * ctx->dev->name after urma_free_device_list (brpc urma_helper.cpp:187),
 * and after urma_uninit too. */

#define MAX_DEVICES_EVER 64

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static urma_device_t *devices[MAX_DEVICES_EVER];
static int ndevices;

static urma_device_t *device_named(const char *name)
{
    pthread_mutex_lock(&dev_mu);
    for (int i = 0; i < ndevices; i++) {
        if (strcmp(devices[i]->name, name) == 0) {
            pthread_mutex_unlock(&dev_mu);
            return devices[i];
        }
    }
    urma_device_t *d = NULL;
    if (ndevices < MAX_DEVICES_EVER && (d = calloc(1, sizeof(*d))) != NULL) {
        memcpy(d->name, name, strnlen(name, URMA_MAX_NAME - 1)); /* calloc left the NUL */
        /* What it is: liburma's software UB. A Go program that finds this
         * library where it looks for liburma (pkg/transport, urma_provider
         * auto) then takes its own software provider, not a second Go
         * runtime carrying its bytes: auto wants a UB device. */
        d->type = URMA_TRANSPORT_SOFTUB;
        devices[ndevices++] = d;
    }
    pthread_mutex_unlock(&dev_mu);
    return d;
}

/* ours is whether d is one of this library's devices. */
static int ours(urma_device_t *d)
{
    int found = 0;
    pthread_mutex_lock(&dev_mu);
    for (int i = 0; i < ndevices && !found; i++) {
        found = devices[i] == d;
    }
    pthread_mutex_unlock(&dev_mu);
    return found;
}

urma_device_t **urma_get_device_list(int *num_devices)
{
    if (num_devices == NULL) {
        return fail_null(EINVAL);
    }
    lsoft_name names[LSOFT_MAX_DEVICES];
    int n = lsoft_device_names(names, LSOFT_MAX_DEVICES);
    if (n <= 0) {
        *num_devices = 0;
        return fail_null(n < 0 ? -n : ENODEV);
    }
    urma_device_t **list = calloc((size_t)n + 1, sizeof(*list));
    if (list == NULL) {
        return fail_null(ENOMEM);
    }
    for (int i = 0; i < n; i++) {
        names[i].name[LSOFT_NAME_LEN - 1] = 0;
        if ((list[i] = device_named(names[i].name)) == NULL) {
            free(list);
            return fail_null(ENOMEM);
        }
    }
    *num_devices = n;
    return list;
}

void urma_free_device_list(urma_device_t **device_list)
{
    free(device_list);
}

urma_device_t *urma_get_device_by_name(char *dev_name)
{
    if (dev_name == NULL || strnlen(dev_name, URMA_MAX_NAME) >= URMA_MAX_NAME) {
        return fail_null(EINVAL);
    }
    int n = 0;
    urma_device_t **list = urma_get_device_list(&n);
    if (list == NULL) {
        return NULL;
    }
    urma_device_t *d = NULL;
    for (int i = 0; i < n && d == NULL; i++) {
        if (strcmp(list[i]->name, dev_name) == 0) {
            d = list[i];
        }
    }
    free(list);
    if (d == NULL) {
        errno = ENODEV;
    }
    return d;
}

urma_eid_info_t *urma_get_eid_list(urma_device_t *dev, uint32_t *cnt)
{
    if (dev == NULL || cnt == NULL || !ours(dev)) {
        return fail_null(EINVAL);
    }
    lsoft_eid eids[LSOFT_MAX_EIDS];
    int n = lsoft_device_eids(dev->name, eids, LSOFT_MAX_EIDS);
    if (n <= 0) {
        return fail_null(n < 0 ? -n : EIO); /* liburma: no EID is EIO */
    }
    urma_eid_info_t *list = calloc((size_t)n, sizeof(*list));
    if (list == NULL) {
        return fail_null(ENOMEM);
    }
    for (int i = 0; i < n; i++) {
        memcpy(list[i].eid.raw, eids[i].eid, URMA_EID_SIZE);
        list[i].eid_index = eids[i].index;
    }
    *cnt = (uint32_t)n;
    return list;
}

void urma_free_eid_list(urma_eid_info_t *eid_list)
{
    free(eid_list);
}

urma_device_t *urma_get_device_by_eid(urma_eid_t eid, urma_transport_type_t type)
{
    int n = 0;
    urma_device_t **list = urma_get_device_list(&n);
    if (list == NULL) {
        return NULL;
    }
    urma_device_t *d = NULL;
    for (int i = 0; i < n && d == NULL; i++) {
        if (list[i]->type != type) {
            continue;
        }
        lsoft_eid eids[LSOFT_MAX_EIDS];
        int k = lsoft_device_eids(list[i]->name, eids, LSOFT_MAX_EIDS);
        for (int j = 0; j < k && d == NULL; j++) {
            if (memcmp(eids[j].eid, eid.raw, URMA_EID_SIZE) == 0) {
                d = list[i];
            }
        }
    }
    free(list);
    if (d == NULL) {
        errno = ENODEV;
    }
    return d;
}

static urma_mtu_t mtu_enum(uint32_t bytes)
{
    switch (bytes) {
    case 256: return URMA_MTU_256;
    case 512: return URMA_MTU_512;
    case 1024: return URMA_MTU_1024;
    case 2048: return URMA_MTU_2048;
    case 8192: return URMA_MTU_8192;
    default: return URMA_MTU_4096;
    }
}

urma_status_t urma_query_device(urma_device_t *dev, urma_device_attr_t *dev_attr)
{
    if (dev == NULL || dev_attr == NULL || !ours(dev)) {
        return URMA_EINVAL;
    }
    lsoft_dev d;
    int st = lsoft_device_info(dev->name, &d);
    if (st != 0) {
        return st;
    }
    memset(dev_attr, 0, sizeof(*dev_attr));
    lsoft_eid eids[LSOFT_MAX_EIDS];
    if (lsoft_device_eids(dev->name, eids, LSOFT_MAX_EIDS) > 0) {
        memcpy(dev_attr->guid.raw, eids[0].eid, URMA_GUID_SIZE); /* unique per device */
    }
    urma_device_cap_t *c = &dev_attr->dev_cap;
    c->max_jfc = d.max_jfc;
    c->max_jfs = d.max_jfs;
    c->max_jfr = d.max_jfr;
    c->max_jetty = d.max_jetty;
    c->max_jetty_grp = d.max_jetty_grp;
    c->max_jfc_depth = d.max_jfc_depth;
    c->max_jfs_depth = d.max_jfs_depth;
    c->max_jfr_depth = d.max_jfr_depth;
    c->max_jfs_inline_len = d.max_inline;
    c->max_jfs_sge = d.max_jfs_sge;
    c->max_jfs_rsge = d.max_jfs_rsge;
    c->max_jfr_sge = d.max_jfr_sge;
    c->max_msg_size = d.max_msg_size;
    c->trans_mode = (uint16_t)d.trans_mode; /* the Go API's bits are URMA_TM_*'s */
    c->max_eid_cnt = d.max_eid_cnt;
    c->page_size_cap = (uint64_t)sysconf(_SC_PAGESIZE);
    c->rm_order_cap.bs.ot = d.ordered_rm ? 1 : 0;
    c->rc_order_cap.bs.ot = 1;
    /* CTP, the transport path brpc's hello advertises and looks for
     * (urma_helper.cpp FindUrmaPriorityForTpType), at every priority. */
    c->rm_tp_cap.bs.ctp = 1;
    c->rc_tp_cap.bs.ctp = 1;
    for (int i = 0; i < URMA_MAX_PRIORITY_CNT; i++) {
        c->priority_info[i].SL = (uint32_t)i;
        c->priority_info[i].tp_type.bs.ctp = 1;
    }
    dev_attr->port_cnt = (uint8_t)(d.port_cnt > MAX_PORT_CNT ? MAX_PORT_CNT : d.port_cnt);
    for (int i = 0; i < dev_attr->port_cnt; i++) {
        urma_port_attr_t *p = &dev_attr->port_attr[i];
        p->max_mtu = p->active_mtu = mtu_enum(d.port_mtu[i]);
        p->state = (urma_port_state_t)d.port_state[i];
        p->active_width = URMA_LINK_X1;
        p->active_speed = URMA_SP_100G;
    }
    dev_attr->reserved_jetty_id_min = d.reserved_min;
    dev_attr->reserved_jetty_id_max = d.reserved_max;
    return URMA_SUCCESS;
}

/* ---- contexts ---- */

urma_context_t *urma_create_context(urma_device_t *dev, uint32_t eid_index)
{
    if (dev == NULL || !ours(dev)) {
        return fail_null(EINVAL);
    }
    lsoft_context *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return fail_null(ENOMEM);
    }
    lsoft_id id;
    int st = lsoft_create_context(dev->name, eid_index, &c->h, &id);
    if (st != 0) {
        free(c);
        return fail_null(st);
    }
    /* async_fd: the software provider reports no asynchronous event (port
     * down, jetty errors reach the program as completions), so this fd
     * never becomes readable; programs that poll it (Mooncake) wait on it
     * harmlessly. */
    c->base.async_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->base.async_fd < 0) {
        int e = errno;
        lsoft_close(c->h, LSOFT_CONTEXT);
        free(c);
        return fail_null(e);
    }
    c->base.dev = dev;
    c->base.ops = NULL;
    c->base.dev_fd = -1;
    pthread_mutex_init(&c->base.mutex, NULL);
    memcpy(c->base.eid.raw, id.eid, URMA_EID_SIZE);
    c->base.eid_index = eid_index;
    c->base.uasid = id.uasid;
    atomic_init(&c->base.ref.atomic_cnt, 1);
    c->base.aggr_mode = URMA_AGGR_MODE_STANDALONE;
    c->magic = CTX_MAGIC;
    return &c->base;
}

urma_status_t urma_delete_context(urma_context_t *ctx)
{
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(c->h, LSOFT_CONTEXT);
    if (st != 0) {
        return st;
    }
    c->magic = 0;
    close(c->base.async_fd);
    pthread_mutex_destroy(&c->base.mutex);
    free(c);
    return URMA_SUCCESS;
}

/* urma_user_ctl passes a driver's private commands (brpc: a bonding
 * device's mode). The software provider has none: liburma's answer for a
 * provider without user_ctl (core/urma_cp_api.c) is URMA_EINVAL. */
urma_status_t urma_user_ctl(urma_context_t *ctx, urma_user_ctl_in_t *in, urma_user_ctl_out_t *out)
{
    if (ctx_of(ctx) == NULL || in == NULL || out == NULL) {
        return URMA_EINVAL;
    }
    lsoft_refused("urma_user_ctl");
    return URMA_EINVAL;
}

static void put_jetty_id(urma_jetty_id_t *o, const lsoft_id *id)
{
    memcpy(o->eid.raw, id->eid, URMA_EID_SIZE);
    o->uasid = id->uasid;
    o->id = id->id;
}

/* ---- completion events and queues ---- */

urma_jfce_t *urma_create_jfce(urma_context_t *ctx)
{
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL) {
        return fail_null(EINVAL);
    }
    lsoft_jfce *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return fail_null(ENOMEM);
    }
    int fd = -1;
    int st = lsoft_create_jfce(c->h, &e->h, &fd);
    if (st != 0) {
        free(e);
        return fail_null(st);
    }
    e->base.urma_ctx = ctx;
    e->base.fd = fd;
    atomic_init(&e->base.ref.atomic_cnt, 1);
    e->magic = JFCE_MAGIC;
    return &e->base;
}

urma_status_t urma_delete_jfce(urma_jfce_t *jfce)
{
    lsoft_jfce *e = jfce_of(jfce);
    if (e == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(e->h, LSOFT_JFCE);
    if (st != 0) {
        return st;
    }
    e->magic = 0;
    free(e);
    return URMA_SUCCESS;
}

urma_jfc_t *urma_create_jfc(urma_context_t *ctx, urma_jfc_cfg_t *jfc_cfg)
{
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL || jfc_cfg == NULL) {
        return fail_null(EINVAL);
    }
    uint64_t eh = 0;
    if (jfc_cfg->jfce != NULL) {
        lsoft_jfce *e = jfce_of(jfc_cfg->jfce);
        if (e == NULL) {
            return fail_null(EINVAL);
        }
        eh = e->h;
    }
    urma_jfc_t *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        return fail_null(ENOMEM);
    }
    uint32_t id = 0;
    int st = lsoft_create_jfc(c->h, jfc_cfg->depth, eh, jfc_cfg->user_ctx, (uintptr_t)q, &q->handle, &id);
    if (st != 0) {
        free(q);
        return fail_null(st);
    }
    q->urma_ctx = ctx;
    q->jfc_id.eid = ctx->eid;
    q->jfc_id.uasid = ctx->uasid;
    q->jfc_id.id = id;
    q->jfc_cfg = *jfc_cfg;
    pthread_mutex_init(&q->event_mutex, NULL);
    pthread_cond_init(&q->event_cond, NULL);
    return q;
}

urma_status_t urma_delete_jfc(urma_jfc_t *jfc)
{
    if (jfc == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(jfc->handle, LSOFT_JFC); /* waits for every event's ack */
    if (st != 0) {
        return st;
    }
    pthread_cond_destroy(&jfc->event_cond);
    pthread_mutex_destroy(&jfc->event_mutex);
    free(jfc);
    return URMA_SUCCESS;
}

urma_status_t urma_rearm_jfc(urma_jfc_t *jfc, bool solicited_only)
{
    if (jfc == NULL) {
        return URMA_EINVAL;
    }
    return lsoft_rearm(jfc->handle, solicited_only ? 1 : 0);
}

/* urma_wait_jfc: with time_out 0 and no event, 0 and errno EAGAIN, as
 * liburma's (core/urma_cmd.c:2558-2562) */
int urma_wait_jfc(urma_jfce_t *jfce, uint32_t jfc_cnt, int time_out, urma_jfc_t *jfc[])
{
    lsoft_jfce *e = jfce_of(jfce);
    if (e == NULL || jfc_cnt == 0 || jfc == NULL) {
        errno = EINVAL;
        return -1;
    }
    uintptr_t got[16];
    int n = lsoft_wait(e->h, jfc_cnt > 16 ? 16 : (int)jfc_cnt, time_out, got);
    if (n < 0) {
        errno = -n;
        return -1;
    }
    if (n == 0) {
        errno = EAGAIN;
        return 0;
    }
    for (int i = 0; i < n; i++) {
        jfc[i] = (urma_jfc_t *)got[i];
    }
    return n;
}

void urma_ack_jfc(urma_jfc_t *jfc[], uint32_t nevents[], uint32_t jfc_cnt)
{
    if (jfc == NULL || nevents == NULL || jfc_cnt == 0) {
        return;
    }
    for (uint32_t i = 0; i < jfc_cnt; i++) {
        if (jfc[i] == NULL || nevents[i] == 0) {
            continue;
        }
        pthread_mutex_lock(&jfc[i]->event_mutex);
        jfc[i]->comp_events_acked += nevents[i];
        pthread_mutex_unlock(&jfc[i]->event_mutex);
        lsoft_ack(jfc[i]->handle, nevents[i]);
    }
}

/* put_cr fills a completion record as liburma defines it. */
static void put_cr(urma_cr_t *o, const lsoft_cr *c)
{
    memset(o, 0, sizeof(*o));
    o->status = (urma_cr_status_t)c->status;
    o->user_ctx = c->user_ctx;
    if (c->recv) {
        o->opcode = (urma_cr_opcode_t)c->opcode; /* liburma: receives only */
        o->imm_data = c->imm;
    }
    o->flag.bs.s_r = c->recv;
    o->flag.bs.jetty = 1; /* local_id names a jetty: there is no standalone JFS here */
    o->flag.bs.flush_err_done = c->status == URMA_CR_WR_FLUSH_ERR_DONE;
    o->completion_len = c->completion_len;
    o->local_id = c->local_id;
    memcpy(o->remote_id.eid.raw, c->remote_eid, URMA_EID_SIZE);
    o->remote_id.uasid = c->remote_uasid;
    o->remote_id.id = c->remote_id;
}

#define CR_BATCH 32 /* exports.go crBatch */

int urma_poll_jfc(urma_jfc_t *jfc, int cr_cnt, urma_cr_t *cr)
{
    if (jfc == NULL || cr == NULL || cr_cnt < 0) {
        return -1;
    }
    lsoft_cr buf[CR_BATCH];
    int total = 0;
    while (total < cr_cnt) {
        int want = cr_cnt - total > CR_BATCH ? CR_BATCH : cr_cnt - total;
        int k = lsoft_poll(jfc->handle, want, buf);
        if (k < 0) {
            errno = -k;
            return total > 0 ? total : -1;
        }
        for (int i = 0; i < k; i++) {
            put_cr(&cr[total + i], &buf[i]);
        }
        total += k;
        if (k < want) {
            break;
        }
    }
    return total;
}

/* ---- receive queues and jetties ---- */

urma_jfr_t *urma_create_jfr(urma_context_t *ctx, urma_jfr_cfg_t *jfr_cfg)
{
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL || jfr_cfg == NULL || jfr_cfg->jfc == NULL) {
        return fail_null(EINVAL);
    }
    lsoft_jfr_cfg in = {
        .mode = jfr_cfg->trans_mode,
        .depth = jfr_cfg->depth,
        .max_sge = jfr_cfg->max_sge,
        .min_rnr_timer = jfr_cfg->min_rnr_timer,
        .token_policy = jfr_cfg->flag.bs.token_policy,
        .token = jfr_cfg->token_value.token,
        .jfc = jfr_cfg->jfc->handle,
    };
    urma_jfr_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return fail_null(ENOMEM);
    }
    lsoft_id id;
    int st = lsoft_create_jfr(c->h, &in, &r->handle, &id);
    if (st != 0) {
        free(r);
        return fail_null(st);
    }
    r->urma_ctx = ctx;
    put_jetty_id(&r->jfr_id, &id);
    r->jfr_cfg = *jfr_cfg;
    pthread_mutex_init(&r->event_mutex, NULL);
    pthread_cond_init(&r->event_cond, NULL);
    return r;
}

urma_status_t urma_delete_jfr(urma_jfr_t *jfr)
{
    if (jfr == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(jfr->handle, LSOFT_JFR);
    if (st != 0) {
        return st;
    }
    pthread_cond_destroy(&jfr->event_cond);
    pthread_mutex_destroy(&jfr->event_mutex);
    free(jfr);
    return URMA_SUCCESS;
}

urma_jetty_t *urma_create_jetty(urma_context_t *ctx, urma_jetty_cfg_t *jetty_cfg)
{
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL || jetty_cfg == NULL || jetty_cfg->jfs_cfg.jfc == NULL) {
        return fail_null(EINVAL);
    }
    int share = jetty_cfg->flag.bs.share_jfr;
    if (share && jetty_cfg->shared.jfr == NULL) {
        return fail_null(EINVAL);
    }
    const urma_jfs_cfg_t *s = &jetty_cfg->jfs_cfg;
    lsoft_jetty_cfg in = {
        .share_jfr = (uint32_t)share,
        .mode = s->trans_mode,
        .depth = s->depth,
        .max_inline = s->max_inline_data,
        .priority = s->priority,
        .max_sge = s->max_sge,
        .rnr_retry = s->rnr_retry,
        .err_timeout = s->err_timeout,
        .send_jfc = s->jfc->handle,
        .jfr = share ? jetty_cfg->shared.jfr->handle : 0,
    };
    urma_jetty_t *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        return fail_null(ENOMEM);
    }
    lsoft_id id;
    int st = lsoft_create_jetty(c->h, &in, &j->handle, &id);
    if (st != 0) {
        free(j);
        return fail_null(st);
    }
    j->urma_ctx = ctx;
    put_jetty_id(&j->jetty_id, &id);
    j->jetty_cfg = *jetty_cfg;
    if (j->jetty_cfg.shared.jfc == NULL) {
        j->jetty_cfg.shared.jfc = jetty_cfg->shared.jfr->jfr_cfg.jfc; /* as liburma's urma_init_jetty_cfg */
    }
    pthread_mutex_init(&j->event_mutex, NULL);
    pthread_cond_init(&j->event_cond, NULL);
    return j;
}

urma_status_t urma_delete_jetty(urma_jetty_t *jetty)
{
    if (jetty == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(jetty->handle, LSOFT_JETTY);
    if (st != 0) {
        return st;
    }
    pthread_cond_destroy(&jetty->event_cond);
    pthread_mutex_destroy(&jetty->event_mutex);
    free(jetty);
    return URMA_SUCCESS;
}

urma_status_t urma_modify_jetty(urma_jetty_t *jetty, urma_jetty_attr_t *attr)
{
    if (jetty == NULL || attr == NULL) {
        return URMA_EINVAL;
    }
    return lsoft_modify_jetty(jetty->handle, attr->mask, (uint32_t)attr->state);
}

int urma_flush_jetty(urma_jetty_t *jetty, int cr_cnt, urma_cr_t *cr)
{
    /* liburma's own check (core/urma_cp_api.c): at most the SQ depth */
    if (jetty == NULL || cr == NULL || cr_cnt <= 0 || (uint32_t)cr_cnt > jetty->jetty_cfg.jfs_cfg.depth) {
        return -URMA_EINVAL;
    }
    lsoft_cr buf[CR_BATCH];
    int total = 0;
    while (total < cr_cnt) {
        int want = cr_cnt - total > CR_BATCH ? CR_BATCH : cr_cnt - total;
        int k = lsoft_flush_jetty(jetty->handle, want, buf);
        if (k < 0) {
            return total > 0 ? total : k;
        }
        for (int i = 0; i < k; i++) {
            put_cr(&cr[total + i], &buf[i]);
        }
        total += k;
        if (k < want) {
            break;
        }
    }
    return total;
}

/* ---- targets ---- */

urma_target_jetty_t *urma_import_jetty(urma_context_t *ctx, urma_rjetty_t *rjetty, urma_token_t *token_value)
{
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL || rjetty == NULL) {
        return fail_null(EINVAL);
    }
    lsoft_id id;
    memcpy(id.eid, rjetty->jetty_id.eid.raw, URMA_EID_SIZE);
    id.uasid = rjetty->jetty_id.uasid;
    id.id = rjetty->jetty_id.id;
    urma_target_jetty_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return fail_null(ENOMEM);
    }
    int st = lsoft_import_jetty(c->h, &id, rjetty->trans_mode, rjetty->type,
                                token_value != NULL ? token_value->token : 0, &t->handle);
    if (st != 0) {
        free(t);
        return fail_null(st);
    }
    t->urma_ctx = ctx;
    t->id = rjetty->jetty_id;
    t->trans_mode = rjetty->trans_mode;
    t->type = rjetty->type;
    t->flag = rjetty->flag;
    t->policy = rjetty->policy;
    t->tp_type = rjetty->tp_type;
    return t;
}

urma_status_t urma_unimport_jetty(urma_target_jetty_t *tjetty)
{
    if (tjetty == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(tjetty->handle, LSOFT_TJETTY);
    if (st != 0) {
        return st;
    }
    free(tjetty);
    return URMA_SUCCESS;
}

urma_status_t urma_bind_jetty(urma_jetty_t *jetty, urma_target_jetty_t *tjetty)
{
    if (jetty == NULL || tjetty == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_bind_jetty(jetty->handle, tjetty->handle);
    if (st == 0) {
        jetty->remote_jetty = tjetty;
    }
    return st;
}

urma_status_t urma_unbind_jetty(urma_jetty_t *jetty)
{
    if (jetty == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_unbind_jetty(jetty->handle);
    if (st == 0) {
        jetty->remote_jetty = NULL;
    }
    return st;
}

/* ---- segments ---- */

/* mapped is whether [va, va+len) lies in memory the process has mapped:
 * the software provider copies to and from it, where a device would pin it
 * (and fail on a hole with EFAULT). */
static int mapped(uint64_t va, uint64_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = va & ~((uint64_t)page - 1);
    uint64_t pages = (va + len - start + (uint64_t)page - 1) / (uint64_t)page;
    unsigned char vec[256];
    for (uint64_t done = 0; done < pages;) {
        uint64_t n = pages - done > sizeof(vec) ? sizeof(vec) : pages - done;
        if (mincore((void *)(uintptr_t)(start + done * (uint64_t)page), n * (uint64_t)page, vec) != 0) {
            return 0;
        }
        done += n;
    }
    return 1;
}

urma_target_seg_t *urma_register_seg(urma_context_t *ctx, urma_seg_cfg_t *seg_cfg)
{
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL || seg_cfg == NULL || seg_cfg->va == 0 || seg_cfg->len == 0 ||
        seg_cfg->va + seg_cfg->len < seg_cfg->va) {
        return fail_null(EINVAL);
    }
    if (!mapped(seg_cfg->va, seg_cfg->len)) {
        return fail_null(EFAULT);
    }
    urma_target_seg_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return fail_null(ENOMEM);
    }
    lsoft_seg_id id;
    int st = lsoft_register_seg(c->h, (void *)(uintptr_t)seg_cfg->va, seg_cfg->len, seg_cfg->flag.bs.access,
                                seg_cfg->flag.bs.token_policy, seg_cfg->token_value.token, &s->handle, &id);
    if (st != 0) {
        free(s);
        return fail_null(st);
    }
    memcpy(s->seg.ubva.eid.raw, id.eid, URMA_EID_SIZE);
    s->seg.ubva.uasid = id.uasid;
    s->seg.ubva.va = id.va;
    s->seg.len = id.len;
    s->seg.attr.bs.token_policy = seg_cfg->flag.bs.token_policy;
    s->seg.attr.bs.access = seg_cfg->flag.bs.access;
    s->seg.attr.bs.cacheable = seg_cfg->flag.bs.cacheable;
    s->seg.token_id = id.token_id;
    s->user_ctx = seg_cfg->user_ctx;
    s->urma_ctx = ctx;
    s->token_id = seg_cfg->token_id;
    return s;
}

urma_status_t urma_unregister_seg(urma_target_seg_t *target_seg)
{
    if (target_seg == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(target_seg->handle, LSOFT_SEG);
    if (st != 0) {
        return st;
    }
    free(target_seg);
    return URMA_SUCCESS;
}

urma_target_seg_t *urma_import_seg(urma_context_t *ctx, urma_seg_t *seg, urma_token_t *token_value, uint64_t addr,
                                   urma_import_seg_flag_t flag)
{
    (void)flag;
    lsoft_context *c = ctx_of(ctx);
    if (c == NULL || seg == NULL) {
        return fail_null(EINVAL);
    }
    lsoft_seg_id id;
    memcpy(id.eid, seg->ubva.eid.raw, URMA_EID_SIZE);
    id.uasid = seg->ubva.uasid;
    id.va = seg->ubva.va;
    id.len = seg->len;
    id.token_id = seg->token_id;
    urma_target_seg_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return fail_null(ENOMEM);
    }
    int st = lsoft_import_seg(c->h, &id, token_value != NULL ? token_value->token : 0, &t->handle);
    if (st != 0) {
        free(t);
        return fail_null(st);
    }
    t->seg = *seg;
    t->mva = addr;
    t->urma_ctx = ctx;
    return t;
}

urma_status_t urma_unimport_seg(urma_target_seg_t *tseg)
{
    if (tseg == NULL) {
        return URMA_EINVAL;
    }
    int st = lsoft_close(tseg->handle, LSOFT_TSEG);
    if (st != 0) {
        return st;
    }
    free(tseg);
    return URMA_SUCCESS;
}

/* ---- work requests ---- */

/* put_sges flattens a scatter/gather list; 0 when it is not one. */
static int put_sges(lsoft_sge *out, uint32_t *n, const urma_sg_t *sg)
{
    if (sg->num_sge > LSOFT_MAX_SGE || (sg->num_sge > 0 && sg->sge == NULL)) {
        return 0;
    }
    for (uint32_t i = 0; i < sg->num_sge; i++) {
        out[i].addr = sg->sge[i].addr;
        out[i].len = sg->sge[i].len;
        out[i].seg = sg->sge[i].tseg != NULL ? sg->sge[i].tseg->handle : 0;
        out[i].pad = 0;
    }
    *n = sg->num_sge;
    return 1;
}

urma_status_t urma_post_jetty_send_wr(urma_jetty_t *jetty, urma_jfs_wr_t *wr, urma_jfs_wr_t **bad_wr)
{
    if (jetty == NULL || wr == NULL) {
        if (bad_wr != NULL) {
            *bad_wr = wr;
        }
        return URMA_EINVAL;
    }
    lsoft_send w;
    for (; wr != NULL; wr = wr->next) {
        memset(&w, 0, offsetof(lsoft_send, sge));
        w.opcode = wr->opcode;
        w.complete = wr->flag.bs.complete_enable;
        w.solicited = wr->flag.bs.solicited_enable;
        w.inline_data = wr->flag.bs.inline_flag;
        w.target = wr->tjetty != NULL ? wr->tjetty->handle : 0;
        w.user_ctx = wr->user_ctx;
        int ok = 1;
        switch (wr->opcode) {
        case URMA_OPC_SEND:
        case URMA_OPC_SEND_IMM:
            w.imm = wr->send.imm_data;
            ok = put_sges(w.sge, &w.nsge, &wr->send.src);
            break;
        default:
            break; /* the Go half refuses the opcode */
        }
        int st = ok ? lsoft_post_send(jetty->handle, &w) : URMA_EINVAL;
        if (st != 0) {
            if (bad_wr != NULL) {
                *bad_wr = wr;
            }
            return st;
        }
    }
    return URMA_SUCCESS;
}

static urma_status_t post_recv(uint64_t h, int jetty, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr)
{
    lsoft_recv w;
    for (; wr != NULL; wr = wr->next) {
        memset(&w, 0, offsetof(lsoft_recv, sge));
        w.user_ctx = wr->user_ctx;
        int st = URMA_EINVAL;
        if (put_sges(w.sge, &w.nsge, &wr->src)) {
            st = jetty ? lsoft_post_jetty_recv(h, &w) : lsoft_post_recv(h, &w);
        }
        if (st != 0) {
            if (bad_wr != NULL) {
                *bad_wr = wr;
            }
            return st;
        }
    }
    return URMA_SUCCESS;
}

urma_status_t urma_post_jfr_wr(urma_jfr_t *jfr, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr)
{
    if (jfr == NULL || wr == NULL) {
        if (bad_wr != NULL) {
            *bad_wr = wr;
        }
        return URMA_EINVAL;
    }
    return post_recv(jfr->handle, 0, wr, bad_wr);
}

urma_status_t urma_post_jetty_recv_wr(urma_jetty_t *jetty, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr)
{
    if (jetty == NULL || wr == NULL) {
        if (bad_wr != NULL) {
            *bad_wr = wr;
        }
        return URMA_EINVAL;
    }
    return post_recv(jetty->handle, 1, wr, bad_wr);
}

/* ---- logging ---- */

urma_vlog_level_t urma_log_get_level(void)
{
    switch (lsoft_log_level()) {
    case 0: return URMA_VLOG_LEVEL_ERR;
    case 1: return URMA_VLOG_LEVEL_WARNING;
    case 2: return URMA_VLOG_LEVEL_INFO;
    default: return URMA_VLOG_LEVEL_DEBUG;
    }
}

void urma_log_set_level(urma_vlog_level_t level)
{
    if (level <= URMA_VLOG_LEVEL_ERR) {
        lsoft_set_log_level(0);
    } else if (level <= URMA_VLOG_LEVEL_NOTICE) {
        lsoft_set_log_level(1);
    } else if (level == URMA_VLOG_LEVEL_INFO) {
        lsoft_set_log_level(2);
    } else if (level < URMA_VLOG_LEVEL_MAX) {
        lsoft_set_log_level(3);
    }
}
