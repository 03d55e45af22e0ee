/*
 * fakeurma.c: a stand-in for liburma.so.0, written for urma-k8s's tests.
 *
 * UMDK has no software device: liburma finds devices only through the
 * kernel (/sys/class/ubcore, /dev/uburma), so the tests replace the library
 * itself. This one implements, in one process, the functions
 * pkg/urma/liburma calls, against the same declarations (urma_compat.h),
 * with the behaviour of UB hardware that the Go provider must cope with:
 *
 *  - two UB devices, udma0 and udma1, each with one EID; a context is a
 *    "process" on a device, and messages between contexts copy real bytes;
 *  - a real eventfd in every JFCE, readable exactly while events wait;
 *    events fire once per arm, solicited-only arms honoured; acks are
 *    counted and urma_delete_jfc blocks until every event was acked;
 *  - URMA_ENOMEM when a send or receive queue is full;
 *  - receiver-not-ready retries with the receiver's min_rnr_timer, rnr_retry
 *    0..7 with 7 meaning forever, RNR_RETRY_CNT_EXC when they run out;
 *  - tokens stored at import and checked on every message against the
 *    target JFR's (REM_ACCESS_ABORT; nothing checked under TOKEN_NONE);
 *  - a send error leaves the jetty in ERROR with the rest of its queue
 *    unhandled; moving it to ERROR yields FLUSH_ERR_DONE, and only then
 *    does urma_flush_jetty return the unhandled requests (WR_UNHANDLED),
 *    at most the SQ depth per call (EINVAL beyond, as liburma checks);
 *  - an RC jetty sends to its bound target only, a bound RC target
 *    cannot be unimported, and a bound RC jetty cannot be deleted
 *    (URMA_ENOPERM until urma_unbind_jetty);
 *  - urma_delete_jetty drops the jetty's records from its JFCs;
 *  - send completions carry no opcode (garbage, as in liburma), and
 *    urma_poll_jfc leaves garbage in every field udma does not fill (the
 *    remote uasid, the flush_err_done bit, imm_data without an immediate);
 *  - uninitialised (before urma_init, after urma_uninit) it lists no
 *    device: liburma matches sysfs devices to the providers urma_init
 *    loaded, and has none then (ENODEV);
 *  - fakeurma_error_jetty errors a jetty as the device does on its own:
 *    FLUSH_ERR_DONE with no failed send before it;
 *  - fakeurma_gate holds a call (urma_get_device_list, urma_create_jfc) in
 *    the middle of its work, and the call fails with EFAULT when
 *    urma_uninit, urma_delete_context or urma_delete_jfce ran meanwhile
 *    (liburma frees what it reads under it);
 *  - fakeurma_kill_context makes a context and the path to its device
 *    vanish, as a crashed node or a cut link would: sends to the device
 *    complete with ACK_TIMEOUT and imports from it fail with ETIMEDOUT,
 *    until liburma is initialised again;
 *  - fakeurma_bad_cqe adds a CQE udma cannot parse: the urma_poll_jfc
 *    that reaches it consumes it and the records before it in its batch,
 *    and returns -1 (-UDMA_INTER_ERR) with those records in cr;
 *  - fakeurma_overcount_wait makes the next urma_wait_jfc return more
 *    events than it wrote, as liburma passes on the kernel's count;
 *  - fakeurma_miscount_poll and fakeurma_miscount_flush make the next
 *    urma_poll_jfc or urma_flush_jetty return a count of the test's choice
 *    (beyond cr_cnt, or negative) instead of the records it wrote, which
 *    udma never does;
 *  - fakeurma_fail_delete fails the next call of one delete, unimport or
 *    unregister function, which leaves its object alive, of
 *    urma_uninit, which leaves liburma initialised, or of
 *    urma_create_jfc (ENOMEM); calls add up;
 *    fakeurma_live_contexts counts the contexts not deleted.
 *
 * One mutex guards everything; a send is delivered by the posting thread,
 * and a helper thread runs the retry timers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "../../urma_compat.h"

#define NDEV      2
#define MAX_IDS   1024 /* jetties and JFRs per device */
#define MAX_SGE   16
#ifndef FAKE_DEVICE_SGE
/* the SGEs query_device reports; a test builds the fake with more than the
 * provider can post (-DFAKE_DEVICE_SGE=200: urma_jfs_cfg_t.max_sge is a
 * uint8_t, so a device may report up to 255) */
#define FAKE_DEVICE_SGE MAX_SGE
#endif
#define MAX_INL   256
#define MAX_MSG   (16u << 20)
#define RNR_INF   7
#define NO_OPCODE ((urma_cr_opcode_t)0xff) /* what a send completion carries */

typedef struct fdev fdev_t;
typedef struct fctx fctx_t;
typedef struct fjfce fjfce_t;
typedef struct fjfc fjfc_t;
typedef struct fjfr fjfr_t;
typedef struct fjetty fjetty_t;
typedef struct ftjetty ftjetty_t;
typedef struct fseg fseg_t;

struct fdev {
    urma_device_t base;
    urma_eid_t eid;
    int unreachable;
    fjetty_t *jetties[MAX_IDS];
    fjfr_t *jfrs[MAX_IDS];
    uint32_t next_jfc, next_token_id;
};

struct fctx {
    urma_context_t base;
    fdev_t *dev;
    int dead;
    int children;
};

struct fjfce {
    urma_jfce_t base;
    fctx_t *ctx;
    int users;
    fjfc_t **events;
    int nev, cap;
};

struct fjfc {
    urma_jfc_t base;
    fctx_t *ctx;
    fjfce_t *jfce;
    urma_cr_t *ring;
    uint32_t depth, head, n;
    int overflowed;
    int armed, solicited_only;
    uint32_t reported, acked;
    pthread_cond_t acked_cv;
    int users;
};

typedef struct rwr {
    uint64_t user_ctx;
    uint32_t nsge;
    uint64_t size;
    urma_sge_t sge[MAX_SGE];
} rwr_t;

struct fjfr {
    urma_jfr_t base;
    fctx_t *ctx;
    fjfc_t *jfc;
    rwr_t *ring;
    uint32_t depth, head, n;
    int users;
};

typedef struct swr {
    urma_opcode_t opcode;
    int complete, solicited, is_inline;
    ftjetty_t *target;
    uint64_t user_ctx, imm;
    uint32_t nsge;
    uint64_t len;
    urma_cr_status_t local_err; /* found at post, reported in turn */
    uint8_t retries;
    urma_sge_t sge[MAX_SGE];
    uint8_t inline_buf[MAX_INL];
} swr_t;

struct fjetty {
    urma_jetty_t base;
    fctx_t *ctx;
    fjfc_t *sjfc;
    fjfr_t *jfr;
    swr_t *ring;
    uint32_t depth;
    uint64_t head, tail;
    int error;
    int flushable; /* FLUSH_ERR_DONE reported: urma_flush_jetty may drain */
    int flush_done;
    int stalled;
    struct timespec retry_at;
    ftjetty_t *bound;
};

struct ftjetty {
    urma_target_jetty_t base;
    fctx_t *ctx;
    uint32_t token;
    int bound_by;
};

struct fseg {
    urma_target_seg_t base;
    fctx_t *ctx;
    int imported;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t timer_cv = PTHREAD_COND_INITIALIZER;
static pthread_t timer_thread;
static int initialised, stopping;
static uint32_t next_uasid = 100;
static fdev_t devs[NDEV];
static int devs_ready;
/* The gate, a test hook: while it is armed for a call, that call waits in
 * the middle of its work (gated says one does). uninits, ctx_deletes and
 * jfce_deletes count urma_uninit, urma_delete_context and urma_delete_jfce
 * calls, so a gated call can tell that what it reads was freed under it. */
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static char gate_call[64];
static int gated;
static uint64_t uninits, ctx_deletes, jfce_deletes;
/* live_contexts counts contexts created and not deleted, in the whole
 * process: a test that leaves one here leaves its objects too. */
static int live_contexts;

/* gate holds the calling function while the gate is armed for it, and says
 * whether liburma or a context went meanwhile; mu is held */
static int gate(const char *call)
{
    uint64_t u = uninits, d = ctx_deletes, e = jfce_deletes;
    if (strcmp(gate_call, call) != 0) {
        return 0;
    }
    gated = 1;
    pthread_cond_broadcast(&gate_cv);
    while (strcmp(gate_call, call) == 0) {
        pthread_cond_wait(&gate_cv, &mu);
    }
    gated = 0;
    return u != uninits || d != ctx_deletes || e != jfce_deletes;
}

/* fail_calls name the functions whose next calls fail
 * (fakeurma_fail_delete), as a delete's ioctl can on hardware; a name
 * given twice fails two calls */
static char fail_calls[4][64];

/* failing says, mu held, whether this call of fn fails; the failure is
 * used up */
static int failing(const char *fn)
{
    for (int i = 0; i < 4; i++) {
        if (fail_calls[i][0] != '\0' && strcmp(fail_calls[i], fn) == 0) {
            fail_calls[i][0] = '\0';
            return 1;
        }
    }
    return 0;
}

/* fakeurma_fail_delete makes the next call of the function call names
 * fail: a delete, unimport or unregister function (its object stays
 * alive), urma_uninit, or urma_create_jfc. Failures add up, four at most.
 * A test hook. */
int fakeurma_fail_delete(void *call)
{
    int st = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < 4; i++) {
        if (fail_calls[i][0] == '\0') {
            snprintf(fail_calls[i], sizeof(fail_calls[i]), "%s", call != NULL ? (const char *)call : "");
            st = 0;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return st;
}

static void setup_devices(void)
{
    if (devs_ready) {
        return;
    }
    devs_ready = 1;
    for (int i = 0; i < NDEV; i++) {
        fdev_t *d = &devs[i];
        memset(d, 0, sizeof(*d));
        snprintf(d->base.name, sizeof(d->base.name), "udma%d", i);
        snprintf(d->base.path, sizeof(d->base.path), "/sys/class/ubcore/udma%d", i);
        d->base.type = URMA_TRANSPORT_UB;
        /* ::ffff:10.99.0.<i+1>, an IPv4-mapped EID as liburma derives */
        d->eid.raw[10] = 0xff;
        d->eid.raw[11] = 0xff;
        d->eid.raw[12] = 10;
        d->eid.raw[13] = 99;
        d->eid.raw[15] = (uint8_t)(i + 1);
    }
}

static fdev_t *dev_by_eid(const urma_eid_t *eid)
{
    for (int i = 0; i < NDEV; i++) {
        if (memcmp(devs[i].eid.raw, eid->raw, 16) == 0) {
            return &devs[i];
        }
    }
    return NULL;
}

/* ---- process and devices ---- */

static void *timer_loop(void *arg);

urma_status_t urma_init(urma_init_attr_t *conf)
{
    (void)conf;
#ifdef FAKE_INIT_STATUS
    /* a test builds the fake with -DFAKE_INIT_STATUS=<status> to fail
     * urma_init as liburma does when no provider registers
     * (core/urma_main.c: URMA_FAIL) */
    return FAKE_INIT_STATUS;
#endif
    pthread_mutex_lock(&mu);
    if (initialised) {
        pthread_mutex_unlock(&mu);
        return URMA_EEXIST; /* core/urma_main.c: once per process */
    }
    setup_devices();
    for (int i = 0; i < NDEV; i++) {
        devs[i].unreachable = 0;
    }
    initialised = 1;
    stopping = 0;
    /* the retry timers run on the monotonic clock */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_destroy(&timer_cv);
    pthread_cond_init(&timer_cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_unlock(&mu);
    if (pthread_create(&timer_thread, NULL, timer_loop, NULL) != 0) {
        return URMA_FAIL;
    }
    return URMA_SUCCESS;
}

urma_status_t urma_uninit(void)
{
    pthread_mutex_lock(&mu);
    if (!initialised || failing("urma_uninit")) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    stopping = 1;
    pthread_cond_broadcast(&timer_cv);
    pthread_mutex_unlock(&mu);
    pthread_join(timer_thread, NULL);
    pthread_mutex_lock(&mu);
    initialised = 0;
    uninits++;
    pthread_mutex_unlock(&mu);
    return URMA_SUCCESS;
}

urma_device_t **urma_get_device_list(int *num_devices)
{
    pthread_mutex_lock(&mu);
    if (!initialised) {
        pthread_mutex_unlock(&mu);
        *num_devices = 0;
        errno = ENODEV;
        return NULL;
    }
    setup_devices();
    if (gate(__func__)) {
        /* liburma's urma_uninit frees the device list (and unloads the
         * providers) this call is reading: a crash there, an error here */
        pthread_mutex_unlock(&mu);
        *num_devices = 0;
        errno = EFAULT;
        return NULL;
    }
    pthread_mutex_unlock(&mu);
    urma_device_t **l = calloc(NDEV + 1, sizeof(*l));
    if (l == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < NDEV; i++) {
        l[i] = &devs[i].base;
    }
    *num_devices = NDEV;
    return l;
}

/* fakeurma_gate arms the gate for the function call names, or opens it
 * (NULL). A test hook. */
int fakeurma_gate(void *call)
{
    pthread_mutex_lock(&mu);
    snprintf(gate_call, sizeof(gate_call), "%s", call != NULL ? (const char *)call : "");
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&mu);
    return 0;
}

/* fakeurma_wait_gated returns once a call waits at the gate. A test
 * hook. */
int fakeurma_wait_gated(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!gated) {
        pthread_cond_wait(&gate_cv, &mu);
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

void urma_free_device_list(urma_device_t **device_list)
{
    free(device_list);
}

urma_device_t *urma_get_device_by_name(char *name)
{
    setup_devices();
    for (int i = 0; i < NDEV; i++) {
        if (strcmp(devs[i].base.name, name) == 0) {
            return &devs[i].base;
        }
    }
    errno = ENODEV;
    return NULL;
}

urma_eid_info_t *urma_get_eid_list(urma_device_t *dev, uint32_t *cnt)
{
    urma_eid_info_t *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    l[0].eid = ((fdev_t *)dev)->eid;
    l[0].eid_index = 0;
    *cnt = 1;
    return l;
}

void urma_free_eid_list(urma_eid_info_t *eid_list)
{
    free(eid_list);
}

urma_status_t urma_query_device(urma_device_t *dev, urma_device_attr_t *a)
{
    fdev_t *d = (fdev_t *)dev;
    memset(a, 0, sizeof(*a));
    a->guid.raw[15] = d->eid.raw[15];
    urma_device_cap_t *c = &a->dev_cap;
    c->max_jfc = c->max_jfs = c->max_jfr = c->max_jetty = MAX_IDS - 1;
    c->max_jfc_depth = 1 << 16;
    c->max_jfs_depth = c->max_jfr_depth = 4096;
    c->max_jfs_inline_len = MAX_INL;
    c->max_jfs_sge = c->max_jfs_rsge = c->max_jfr_sge = FAKE_DEVICE_SGE;
    c->max_msg_size = MAX_MSG;
    c->trans_mode = URMA_TM_RM | URMA_TM_RC;
    c->max_eid_cnt = 1;
    c->rm_order_cap.bs.ot = 1;
    a->port_cnt = 1;
    a->port_attr[0].state = URMA_PORT_ACTIVE;
    a->port_attr[0].max_mtu = a->port_attr[0].active_mtu = URMA_MTU_4096;
    a->reserved_jetty_id_min = 1;
    a->reserved_jetty_id_max = 0;
    return URMA_SUCCESS;
}

urma_context_t *urma_create_context(urma_device_t *dev, uint32_t eid_index)
{
    if (eid_index != 0) {
        errno = EINVAL;
        return NULL;
    }
    fctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&mu);
    c->dev = (fdev_t *)dev;
    c->base.dev = dev;
    c->base.eid = c->dev->eid;
    c->base.eid_index = eid_index;
    c->base.uasid = next_uasid++;
    live_contexts++;
    pthread_mutex_unlock(&mu);
    return &c->base;
}

urma_status_t urma_delete_context(urma_context_t *ctx)
{
    fctx_t *c = (fctx_t *)ctx;
    pthread_mutex_lock(&mu);
    if (failing(__func__)) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    if (c->children > 0) {
        pthread_mutex_unlock(&mu);
        return URMA_EAGAIN; /* objects still alive */
    }
    ctx_deletes++;
    live_contexts--;
    pthread_mutex_unlock(&mu);
    free(c);
    return URMA_SUCCESS;
}

/* fakeurma_live_contexts stores in *(int *)out how many contexts were
 * created and not deleted. A test hook. */
int fakeurma_live_contexts(void *out)
{
    pthread_mutex_lock(&mu);
    *(int *)out = live_contexts;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* fakeurma_kill_context makes a context vanish, and its device with it:
 * nothing there answers any more. Its objects can still be deleted. */
int fakeurma_kill_context(urma_context_t *ctx)
{
    pthread_mutex_lock(&mu);
    ((fctx_t *)ctx)->dead = 1;
    ((fctx_t *)ctx)->dev->unreachable = 1;
    pthread_cond_broadcast(&timer_cv);
    pthread_mutex_unlock(&mu);
    return 0;
}

/* ---- events and completion queues ---- */

urma_jfce_t *urma_create_jfce(urma_context_t *ctx)
{
    fjfce_t *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    /* Blocking, as uburma's JFCE fd is: the provider must make it
     * non-blocking for Go's poller. */
    e->base.fd = eventfd(0, EFD_CLOEXEC);
    if (e->base.fd < 0) {
        free(e);
        return NULL;
    }
    e->base.urma_ctx = ctx;
    e->ctx = (fctx_t *)ctx;
    pthread_mutex_lock(&mu);
    e->ctx->children++;
    pthread_mutex_unlock(&mu);
    return &e->base;
}

urma_status_t urma_delete_jfce(urma_jfce_t *jfce)
{
    fjfce_t *e = (fjfce_t *)jfce;
    pthread_mutex_lock(&mu);
    if (failing(__func__)) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    if (e->users > 0) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    e->ctx->children--;
    jfce_deletes++;
    pthread_mutex_unlock(&mu);
    close(e->base.fd);
    free(e->events);
    free(e);
    return URMA_SUCCESS;
}

/* the eventfd is readable exactly while events wait; mu is held */
static void jfce_push(fjfce_t *e, fjfc_t *q)
{
    if (e->nev == e->cap) {
        int cap = e->cap ? 2 * e->cap : 8;
        fjfc_t **n = realloc(e->events, cap * sizeof(*n));
        if (n == NULL) {
            return;
        }
        e->events = n;
        e->cap = cap;
    }
    e->events[e->nev++] = q;
    if (e->nev == 1) {
        uint64_t one = 1;
        (void)!write(e->base.fd, &one, sizeof(one));
    }
}

static void jfce_drain(fjfce_t *e)
{
    uint64_t v;
    (void)!read(e->base.fd, &v, sizeof(v));
}

/* push adds a completion record and fires the armed JFC; mu is held */
static void push(fjfc_t *q, const urma_cr_t *cr, int solicited)
{
    if (q->n == q->depth) {
        q->overflowed = 1; /* hardware reports a JFC error */
        return;
    }
    q->ring[(q->head + q->n) % q->depth] = *cr;
    q->n++;
    if (q->armed && (!q->solicited_only || solicited || cr->status != URMA_CR_SUCCESS)) {
        q->armed = 0;
        jfce_push(q->jfce, q);
    }
}

urma_jfc_t *urma_create_jfc(urma_context_t *ctx, urma_jfc_cfg_t *cfg)
{
    if (cfg->depth == 0 || cfg->jfce == NULL) {
        errno = EINVAL;
        return NULL;
    }
    fjfc_t *q = calloc(1, sizeof(*q));
    if (q == NULL || (q->ring = calloc(cfg->depth, sizeof(urma_cr_t))) == NULL) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    pthread_cond_init(&q->acked_cv, NULL);
    pthread_mutex_lock(&mu);
    if (gate(__func__)) {
        /* the context or the JFCE was deleted under the call */
        pthread_mutex_unlock(&mu);
        pthread_cond_destroy(&q->acked_cv);
        free(q->ring);
        free(q);
        errno = EFAULT;
        return NULL;
    }
    if (failing(__func__)) {
        /* out of queue memory, as the kernel can be */
        pthread_mutex_unlock(&mu);
        pthread_cond_destroy(&q->acked_cv);
        free(q->ring);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->ctx = (fctx_t *)ctx;
    q->jfce = (fjfce_t *)cfg->jfce;
    q->jfce->users++;
    q->depth = cfg->depth;
    q->base.urma_ctx = ctx;
    q->base.jfc_cfg = *cfg;
    q->base.jfc_id.id = ++q->ctx->dev->next_jfc;
    q->ctx->children++;
    pthread_mutex_unlock(&mu);
    return &q->base;
}

urma_status_t urma_delete_jfc(urma_jfc_t *jfc)
{
    fjfc_t *q = (fjfc_t *)jfc;
    pthread_mutex_lock(&mu);
    if (failing(__func__)) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    if (q->users > 0) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    fjfce_t *e = q->jfce;
    int k = 0;
    for (int i = 0; i < e->nev; i++) {
        if (e->events[i] != q) {
            e->events[k++] = e->events[i];
        }
    }
    if (e->nev > 0 && k == 0) {
        jfce_drain(e);
    }
    e->nev = k;
    /* core/urma_cmd.c: wait until every reported event is acked */
    while (q->acked != q->reported) {
        pthread_cond_wait(&q->acked_cv, &mu);
    }
    e->users--;
    q->ctx->children--;
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&q->acked_cv);
    free(q->ring);
    free(q);
    return URMA_SUCCESS;
}

/* unfilled scribbles on the fields udma_u_poll_jfc never writes, so that
 * they keep whatever the caller's buffer held (hw/udma/udma_u_jfc.c
 * udma_u_parse_cqe_for_jfc): the remote uasid and the flush_err_done bit
 * always, imm_data unless a receive carries one, and a FLUSH_ERR_DONE's
 * user_ctx. A reader of them gets garbage, as on hardware. */
static void unfilled(urma_cr_t *cr)
{
    cr->remote_id.uasid = 0xa5a5a5a5u;
    cr->flag.bs.flush_err_done = cr->status != URMA_CR_WR_FLUSH_ERR_DONE;
    if (!cr->flag.bs.s_r || (cr->opcode != URMA_CR_OPC_SEND_WITH_IMM && cr->opcode != URMA_CR_OPC_WRITE_WITH_IMM)) {
        cr->imm_data = 0xa5a5a5a5a5a5a5a5ull;
    }
    if (cr->status == URMA_CR_WR_FLUSH_ERR_DONE) {
        cr->user_ctx = 0xa5a5a5a5a5a5a5a5ull;
    }
}

/* BAD_CQE is the status fakeurma_bad_cqe gives a record: a CQE udma cannot
 * parse (its status is out of range, or its jetty was destroyed). */
#define BAD_CQE ((urma_cr_status_t)0x7fffbad0)

/* fakeurma_bad_cqe adds a CQE udma fails to parse to the JFC. A test
 * hook. */
int fakeurma_bad_cqe(void *jfc)
{
    urma_cr_t cr;
    memset(&cr, 0, sizeof(cr));
    cr.status = BAD_CQE;
    pthread_mutex_lock(&mu);
    push((fjfc_t *)jfc, &cr, 0);
    pthread_mutex_unlock(&mu);
    return 0;
}

/* miscount is the count the next call of a function returns instead of
 * the records it wrote, when armed (fakeurma_miscount_poll,
 * fakeurma_miscount_flush); mu guards it. */
typedef struct {
    int armed, count;
} miscount_t;
static miscount_t poll_miscount, flush_miscount;

static int arm_miscount(miscount_t *m, void *count)
{
    if (count == NULL) {
        return EINVAL;
    }
    pthread_mutex_lock(&mu);
    m->armed = 1;
    m->count = *(int *)count;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* recount returns the armed miscount in place of k, once; mu is held */
static int recount(miscount_t *m, int k)
{
    if (!m->armed) {
        return k;
    }
    m->armed = 0;
    return m->count;
}

/* fakeurma_miscount_poll makes the next urma_poll_jfc return *(int *)count
 * whatever it wrote: more records than cr_cnt, or a negative count other
 * than -1, its error. The records it wrote are consumed. A test hook. */
int fakeurma_miscount_poll(void *count)
{
    return arm_miscount(&poll_miscount, count);
}

int urma_poll_jfc(urma_jfc_t *jfc, int cr_cnt, urma_cr_t *cr)
{
    fjfc_t *q = (fjfc_t *)jfc;
    pthread_mutex_lock(&mu);
    if (q->overflowed) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    int k = 0;
    while (k < cr_cnt && q->n > 0) {
        urma_cr_t *r = &q->ring[q->head];
        q->head = (q->head + 1) % q->depth;
        q->n--;
        if (r->status == BAD_CQE) {
            /* udma_u_poll_jfc (hw/udma/udma_u_jfc.c:822-847): the bad CQE
             * is consumed and the whole call returns -UDMA_INTER_ERR; the
             * records parsed before it stay in cr, consumed too, and the
             * bad one's status is never written. */
            urma_cr_status_t unwritten = cr[k].status;
            cr[k] = *r;
            cr[k].status = unwritten;
            pthread_mutex_unlock(&mu);
            return -1;
        }
        cr[k] = *r;
        unfilled(&cr[k++]);
    }
    k = recount(&poll_miscount, k);
    pthread_mutex_unlock(&mu);
    return k;
}

urma_status_t urma_rearm_jfc(urma_jfc_t *jfc, bool solicited_only)
{
    fjfc_t *q = (fjfc_t *)jfc;
    pthread_mutex_lock(&mu);
    q->armed = 1;
    q->solicited_only = solicited_only;
    pthread_mutex_unlock(&mu);
    return URMA_SUCCESS;
}

/* wait_overcount is added to the count the next urma_wait_jfc that takes
 * events returns (fakeurma_overcount_wait); mu guards it. */
static int wait_overcount;

/* fakeurma_overcount_wait makes the next urma_wait_jfc that takes events
 * return *(int *)extra more than it wrote: liburma returns the kernel's
 * event count as it is, having copied at most jfc_cnt JFCs
 * (core/urma_cmd.c:2568-2571). Faithful when that call fills jfc_cnt. A
 * test hook. */
int fakeurma_overcount_wait(void *extra)
{
    pthread_mutex_lock(&mu);
    wait_overcount = *(int *)extra;
    pthread_mutex_unlock(&mu);
    return 0;
}

int urma_wait_jfc(urma_jfce_t *jfce, uint32_t jfc_cnt, int time_out, urma_jfc_t *jfc[])
{
    fjfce_t *e = (fjfce_t *)jfce;
    for (;;) {
        pthread_mutex_lock(&mu);
        if (e->nev > 0) {
            int k = 0;
            while ((uint32_t)k < jfc_cnt && k < e->nev) {
                jfc[k] = &e->events[k]->base;
                e->events[k]->reported++;
                k++;
            }
            memmove(e->events, e->events + k, (e->nev - k) * sizeof(*e->events));
            e->nev -= k;
            if (e->nev == 0) {
                jfce_drain(e);
            }
            int ret = k + wait_overcount;
            wait_overcount = 0;
            pthread_mutex_unlock(&mu);
            return ret;
        }
        pthread_mutex_unlock(&mu);
        if (time_out == 0) {
            errno = EAGAIN;
            return 0;
        }
        struct pollfd p = {.fd = e->base.fd, .events = POLLIN};
        int r = poll(&p, 1, time_out);
        if (r == 0) {
            return 0;
        }
        if (r < 0 && errno != EINTR) {
            return -1;
        }
    }
}

void urma_ack_jfc(urma_jfc_t *jfc[], uint32_t nevents[], uint32_t jfc_cnt)
{
    pthread_mutex_lock(&mu);
    for (uint32_t i = 0; i < jfc_cnt; i++) {
        fjfc_t *q = (fjfc_t *)jfc[i];
        q->acked += nevents[i];
        pthread_cond_broadcast(&q->acked_cv);
    }
    pthread_mutex_unlock(&mu);
}

/* ---- receive queues ---- */

urma_jfr_t *urma_create_jfr(urma_context_t *ctx, urma_jfr_cfg_t *cfg)
{
    fctx_t *c = (fctx_t *)ctx;
    if (cfg->depth == 0 || cfg->jfc == NULL || cfg->max_sge > MAX_SGE) {
        errno = EINVAL;
        return NULL;
    }
    fjfr_t *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->ring = calloc(cfg->depth, sizeof(rwr_t))) == NULL) {
        free(r);
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&mu);
    uint32_t id = 1;
    while (id < MAX_IDS && c->dev->jfrs[id] != NULL) {
        id++;
    }
    if (id == MAX_IDS) {
        pthread_mutex_unlock(&mu);
        free(r->ring);
        free(r);
        errno = ENOMEM;
        return NULL;
    }
    c->dev->jfrs[id] = r;
    r->ctx = c;
    r->jfc = (fjfc_t *)cfg->jfc;
    r->jfc->users++;
    r->depth = cfg->depth;
    r->base.urma_ctx = ctx;
    r->base.jfr_cfg = *cfg;
    r->base.jfr_id.eid = c->base.eid;
    r->base.jfr_id.uasid = c->base.uasid;
    r->base.jfr_id.id = id;
    c->children++;
    pthread_mutex_unlock(&mu);
    return &r->base;
}

urma_status_t urma_delete_jfr(urma_jfr_t *jfr)
{
    fjfr_t *r = (fjfr_t *)jfr;
    pthread_mutex_lock(&mu);
    if (failing(__func__)) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    if (r->users > 0) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    r->ctx->dev->jfrs[r->base.jfr_id.id] = NULL;
    r->jfc->users--;
    r->ctx->children--;
    pthread_mutex_unlock(&mu);
    free(r->ring);
    free(r);
    return URMA_SUCCESS;
}

/* local_sge checks that an SGE names memory the context registered */
static int local_sge(fctx_t *c, const urma_sge_t *s)
{
    fseg_t *g = (fseg_t *)s->tseg;
    if (g == NULL || g->imported || g->ctx != c) {
        return 0;
    }
    uint64_t va = g->base.seg.ubva.va, len = g->base.seg.len;
    return s->addr >= va && s->addr - va <= len && s->len <= len - (s->addr - va);
}

urma_status_t urma_post_jfr_wr(urma_jfr_t *jfr, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr)
{
    fjfr_t *r = (fjfr_t *)jfr;
    pthread_mutex_lock(&mu);
    for (; wr != NULL; wr = wr->next) {
        if (wr->src.num_sge > r->base.jfr_cfg.max_sge && wr->src.num_sge > 1) {
            *bad_wr = wr;
            pthread_mutex_unlock(&mu);
            return URMA_EINVAL;
        }
        if (r->n == r->depth) {
            *bad_wr = wr;
            pthread_mutex_unlock(&mu);
            return URMA_ENOMEM; /* hw/udma/udma_u_jfr.c: work queue full */
        }
        rwr_t *w = &r->ring[(r->head + r->n) % r->depth];
        w->user_ctx = wr->user_ctx;
        w->nsge = wr->src.num_sge;
        w->size = 0;
        int ok = 1;
        for (uint32_t i = 0; i < w->nsge; i++) {
            w->sge[i] = wr->src.sge[i];
            w->size += w->sge[i].len;
            ok = ok && local_sge(r->ctx, &w->sge[i]);
        }
        if (!ok) {
            urma_cr_t cr = {.status = URMA_CR_LOC_ACCESS_ERR, .user_ctx = wr->user_ctx, .local_id = r->base.jfr_id.id};
            cr.flag.bs.s_r = 1;
            push(r->jfc, &cr, 0);
            continue;
        }
        r->n++;
    }
    pthread_mutex_unlock(&mu);
    return URMA_SUCCESS;
}

/* ---- jetties ---- */

urma_jetty_t *urma_create_jetty(urma_context_t *ctx, urma_jetty_cfg_t *cfg)
{
    fctx_t *c = (fctx_t *)ctx;
    fjfr_t *r = (fjfr_t *)cfg->shared.jfr;
    if (!cfg->flag.bs.share_jfr || r == NULL || cfg->jfs_cfg.jfc == NULL || cfg->jfs_cfg.depth == 0 ||
        cfg->jfs_cfg.max_sge > MAX_SGE || cfg->jfs_cfg.rnr_retry > RNR_INF || cfg->jfs_cfg.max_inline_data > MAX_INL) {
        errno = EINVAL;
        return NULL;
    }
    if (cfg->jfs_cfg.trans_mode != r->base.jfr_cfg.trans_mode) {
        errno = EINVAL; /* hw/udma/udma_u_jetty.c: JFS and JFR modes differ */
        return NULL;
    }
    fjetty_t *j = calloc(1, sizeof(*j));
    if (j == NULL || (j->ring = calloc(cfg->jfs_cfg.depth, sizeof(swr_t))) == NULL) {
        free(j);
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&mu);
    uint32_t id = 1; /* the lowest free id: ids are reused */
    while (id < MAX_IDS && c->dev->jetties[id] != NULL) {
        id++;
    }
    if (id == MAX_IDS) {
        pthread_mutex_unlock(&mu);
        free(j->ring);
        free(j);
        errno = ENOMEM;
        return NULL;
    }
    c->dev->jetties[id] = j;
    j->ctx = c;
    j->jfr = r;
    j->sjfc = (fjfc_t *)cfg->jfs_cfg.jfc;
    j->depth = cfg->jfs_cfg.depth;
    r->users++;
    j->sjfc->users++;
    j->base.urma_ctx = ctx;
    j->base.jetty_cfg = *cfg;
    j->base.jetty_id.eid = c->base.eid;
    j->base.jetty_id.uasid = c->base.uasid;
    j->base.jetty_id.id = id;
    c->children++;
    pthread_mutex_unlock(&mu);
    return &j->base;
}

/* clean_jfc drops a deleted jetty's records from a JFC, as
 * hw/udma/udma_u_jfc.c udma_u_clean_jfc does: every record whose local id
 * is the jetty's, sends and receives alike; mu is held */
static void clean_jfc(fjfc_t *q, uint32_t jetty_id)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        urma_cr_t *cr = &q->ring[(q->head + i) % q->depth];
        if (cr->local_id != jetty_id) {
            q->ring[(q->head + k++) % q->depth] = *cr;
        }
    }
    q->n = k;
}

urma_status_t urma_delete_jetty(urma_jetty_t *jetty)
{
    fjetty_t *j = (fjetty_t *)jetty;
    pthread_mutex_lock(&mu);
    if (failing(__func__)) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    if (j->base.jetty_cfg.jfs_cfg.trans_mode == URMA_TM_RC && j->bound != NULL) {
        pthread_mutex_unlock(&mu);
        return EPERM; /* core/urma_cp_api.c: URMA_ENOPERM, "try unbind first" */
    }
    clean_jfc(j->sjfc, j->base.jetty_id.id);
    if (j->jfr->jfc != j->sjfc) {
        clean_jfc(j->jfr->jfc, j->base.jetty_id.id);
    }
    j->ctx->dev->jetties[j->base.jetty_id.id] = NULL;
    j->jfr->users--;
    j->sjfc->users--;
    j->ctx->children--;
    pthread_mutex_unlock(&mu);
    free(j->ring);
    free(j);
    return URMA_SUCCESS;
}

static swr_t *slot(fjetty_t *j, uint64_t seq)
{
    return &j->ring[seq % j->depth];
}

/* complete reports a send when it failed or asked to be told; mu is held */
static void complete(fjetty_t *j, swr_t *w, urma_cr_status_t st)
{
    if (st == URMA_CR_SUCCESS && !w->complete) {
        return;
    }
    urma_cr_t cr;
    memset(&cr, 0, sizeof(cr));
    cr.status = st;
    cr.user_ctx = w->user_ctx;
    cr.opcode = NO_OPCODE;
    cr.flag.bs.jetty = 1;
    cr.completion_len = st == URMA_CR_SUCCESS ? (uint32_t)w->len : 0;
    cr.local_id = j->base.jetty_id.id;
    cr.remote_id = w->target->base.id;
    cr.user_data = (uintptr_t)&j->base;
    push(j->sjfc, &cr, 0);
}

/* copy moves a message from the sender's pieces into the receiver's */
static void copy_msg(swr_t *w, rwr_t *rw)
{
    uint32_t di = 0;
    uint64_t doff = 0;
    for (uint32_t si = 0; si < (w->is_inline ? 1 : w->nsge); si++) {
        const uint8_t *src = w->is_inline ? w->inline_buf : (const uint8_t *)(uintptr_t)w->sge[si].addr;
        uint64_t left = w->is_inline ? w->len : w->sge[si].len;
        while (left > 0 && di < rw->nsge) {
            uint64_t room = rw->sge[di].len - doff;
            uint64_t n = left < room ? left : room;
            memcpy((uint8_t *)(uintptr_t)rw->sge[di].addr + doff, src, n);
            src += n;
            left -= n;
            doff += n;
            if (doff == rw->sge[di].len) {
                di++;
                doff = 0;
            }
        }
    }
}

#define RNR_NAK ((urma_cr_status_t)0xff)

/* deliver carries one send to its target; mu is held */
static urma_cr_status_t deliver(fjetty_t *j, swr_t *w, uint8_t *rnr_timer)
{
    if (w->local_err != URMA_CR_SUCCESS) {
        return w->local_err;
    }
    ftjetty_t *t = w->target;
    fdev_t *d = dev_by_eid(&t->base.id.eid);
    if (d == NULL || d->unreachable) {
        return URMA_CR_ACK_TIMEOUT_ERR;
    }
    fjetty_t *tj = t->base.id.id < MAX_IDS ? d->jetties[t->base.id.id] : NULL;
    if (tj == NULL) {
        return URMA_CR_REM_ACCESS_ABORT_ERR; /* the id names nothing */
    }
    if (tj->ctx->dead) {
        return URMA_CR_ACK_TIMEOUT_ERR;
    }
    fjfr_t *r = tj->jfr;
    /* "URMA User Guide": the target checks the token on every packet */
    if (r->base.jfr_cfg.flag.bs.token_policy != URMA_TOKEN_NONE && r->base.jfr_cfg.token_value.token != t->token) {
        return URMA_CR_REM_ACCESS_ABORT_ERR;
    }
    if (r->n == 0) {
        *rnr_timer = r->base.jfr_cfg.min_rnr_timer;
        return RNR_NAK;
    }
    rwr_t *rw = &r->ring[r->head];
    r->head = (r->head + 1) % r->depth;
    r->n--;
    urma_cr_t cr;
    memset(&cr, 0, sizeof(cr));
    cr.user_ctx = rw->user_ctx;
    cr.flag.bs.s_r = 1;
    cr.flag.bs.jetty = 1;
    cr.local_id = tj->base.jetty_id.id;
    cr.remote_id = j->base.jetty_id;
    cr.opcode = w->opcode == URMA_OPC_SEND_IMM ? URMA_CR_OPC_SEND_WITH_IMM : URMA_CR_OPC_SEND;
    if (w->opcode == URMA_OPC_SEND_IMM) {
        cr.imm_data = w->imm;
    }
    if (rw->size < w->len) {
        cr.status = URMA_CR_LOC_LEN_ERR;
        push(r->jfc, &cr, w->solicited);
        return URMA_CR_REM_OPERATION_ERR;
    }
    copy_msg(w, rw);
    cr.status = URMA_CR_SUCCESS;
    cr.completion_len = (uint32_t)w->len;
    push(r->jfc, &cr, w->solicited);
    return URMA_CR_SUCCESS;
}

/* rnr_delay is soft's scale: 10us << t/2 (x1.5 for odd t), backing off
 * exponentially up to max(base, 10ms) */
static uint64_t rnr_delay_ns(uint8_t t, uint8_t retry)
{
    uint64_t base = 10000ull << (t >> 1);
    if (t & 1) {
        base += base / 2;
    }
    uint64_t limit = base > 10000000ull ? base : 10000000ull;
    uint64_t d = base << (retry > 16 ? 16 : retry - 1);
    return d < limit ? d : limit;
}

/* pump transmits queued sends in order until the queue stalls; mu is held */
static void pump(fjetty_t *j)
{
    while (j->head < j->tail && !j->stalled && !j->error) {
        swr_t *w = slot(j, j->head);
        uint8_t rnr_timer = 0;
        urma_cr_status_t st = deliver(j, w, &rnr_timer);
        if (st == RNR_NAK) {
            uint8_t limit = j->base.jetty_cfg.jfs_cfg.rnr_retry;
            if (limit != RNR_INF && w->retries >= limit) {
                st = URMA_CR_RNR_RETRY_CNT_EXC_ERR;
            } else {
                w->retries++;
                j->stalled = 1;
                clock_gettime(CLOCK_MONOTONIC, &j->retry_at);
                uint64_t ns = j->retry_at.tv_nsec + rnr_delay_ns(rnr_timer, w->retries);
                j->retry_at.tv_sec += ns / 1000000000ull;
                j->retry_at.tv_nsec = ns % 1000000000ull;
                pthread_cond_broadcast(&timer_cv);
                return;
            }
        }
        complete(j, w, st);
        j->head++;
        if (st != URMA_CR_SUCCESS) {
            /* the rest stays unhandled until the jetty is flushed */
            j->error = 1;
        }
    }
}

static int before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* timer_loop retries stalled sends when their time comes */
static void *timer_loop(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!stopping) {
        struct timespec now, next = {0, 0};
        int have = 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        for (int d = 0; d < NDEV; d++) {
            for (int i = 1; i < MAX_IDS; i++) {
                fjetty_t *j = devs[d].jetties[i];
                if (j == NULL || !j->stalled) {
                    continue;
                }
                if (!before(&now, &j->retry_at)) {
                    j->stalled = 0;
                    pump(j);
                    if (!j->stalled) {
                        continue;
                    }
                }
                if (!have || before(&j->retry_at, &next)) {
                    next = j->retry_at;
                    have = 1;
                }
            }
        }
        if (have) {
            pthread_cond_timedwait(&timer_cv, &mu, &next);
        } else {
            pthread_cond_wait(&timer_cv, &mu);
        }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

urma_status_t urma_post_jetty_send_wr(urma_jetty_t *jetty, urma_jfs_wr_t *wr, urma_jfs_wr_t **bad_wr)
{
    fjetty_t *j = (fjetty_t *)jetty;
    const urma_jfs_cfg_t *cfg = &j->base.jetty_cfg.jfs_cfg;
    pthread_mutex_lock(&mu);
    for (; wr != NULL; wr = wr->next) {
        /* an RC jetty sends to its bound target, whatever the WR says
         * (hw/udma/udma_u_jfs.c) */
        ftjetty_t *t = cfg->trans_mode == URMA_TM_RC ? j->bound : (ftjetty_t *)wr->tjetty;
        uint32_t n = wr->send.src.num_sge;
        /* no check of j->error: udma_u_post_sq_wr takes a post on a jetty
         * in ERROR, which stays queued (flushed if a flush is still to come,
         * otherwise never completed) */
        int bad = t == NULL || (wr->opcode != URMA_OPC_SEND && wr->opcode != URMA_OPC_SEND_IMM) ||
                  (n > cfg->max_sge && n > 1) || n > MAX_SGE;
        if (bad) {
            *bad_wr = wr;
            pthread_mutex_unlock(&mu);
            return URMA_EINVAL;
        }
        if (j->tail - j->head >= j->depth) {
            *bad_wr = wr;
            pthread_mutex_unlock(&mu);
            return URMA_ENOMEM; /* hw/udma/udma_u_jfs.c: JFS overflow */
        }
        swr_t *w = slot(j, j->tail);
        memset(w, 0, offsetof(swr_t, sge));
        w->opcode = wr->opcode;
        w->complete = wr->flag.bs.complete_enable;
        w->solicited = wr->flag.bs.solicited_enable;
        w->is_inline = wr->flag.bs.inline_flag;
        w->target = t;
        w->user_ctx = wr->user_ctx;
        w->imm = wr->send.imm_data;
        w->nsge = n;
        for (uint32_t i = 0; i < n; i++) {
            w->sge[i] = wr->send.src.sge[i];
            w->len += w->sge[i].len;
            if (!local_sge(j->ctx, &w->sge[i])) {
                w->local_err = URMA_CR_LOC_ACCESS_ERR;
            }
        }
        if (w->local_err == URMA_CR_SUCCESS && w->len > MAX_MSG) {
            w->local_err = URMA_CR_LOC_LEN_ERR;
        }
        if (w->is_inline && w->local_err == URMA_CR_SUCCESS) {
            if (w->len > cfg->max_inline_data) {
                *bad_wr = wr;
                pthread_mutex_unlock(&mu);
                return URMA_EINVAL;
            }
            uint8_t *p = w->inline_buf;
            for (uint32_t i = 0; i < n; i++) {
                memcpy(p, (const void *)(uintptr_t)w->sge[i].addr, w->sge[i].len);
                p += w->sge[i].len;
            }
        }
        j->tail++;
        pump(j);
    }
    pthread_mutex_unlock(&mu);
    return URMA_SUCCESS;
}

/* jetty_to_error moves a jetty to ERROR and reports FLUSH_ERR_DONE once;
 * mu is held */
static void jetty_to_error(fjetty_t *j)
{
    j->error = 1;
    if (j->stalled) {
        /* a send between RNR retries was handled by the device: it
         * completes with WR_FLUSH_ERR before the flush ends */
        j->stalled = 0;
        complete(j, slot(j, j->head), URMA_CR_WR_FLUSH_ERR);
        j->head++;
    }
    if (!j->flush_done) {
        j->flush_done = 1;
        urma_cr_t cr;
        memset(&cr, 0, sizeof(cr));
        cr.status = URMA_CR_WR_FLUSH_ERR_DONE;
        cr.user_ctx = 0xdeadbeef; /* invalid, as liburma says */
        cr.opcode = NO_OPCODE;
        cr.flag.bs.jetty = 1; /* udma sets no flush_err_done bit: the status says it */
        cr.local_id = j->base.jetty_id.id;
        push(j->sjfc, &cr, 0);
        j->flushable = 1; /* hw/udma/udma_u_jfc.c sets flush_flag here */
    }
}

urma_status_t urma_modify_jetty(urma_jetty_t *jetty, urma_jetty_attr_t *attr)
{
    if (!(attr->mask & JETTY_STATE) || attr->state != URMA_JETTY_STATE_ERROR) {
        return URMA_EINVAL;
    }
    pthread_mutex_lock(&mu);
    jetty_to_error((fjetty_t *)jetty);
    pthread_mutex_unlock(&mu);
    return URMA_SUCCESS;
}

/* fakeurma_error_jetty errors a jetty as the device does on its own (a
 * jetty error event): FLUSH_ERR_DONE arrives with no failed send before it.
 * A test hook; liburma has no such call. */
int fakeurma_error_jetty(void *jetty)
{
    pthread_mutex_lock(&mu);
    jetty_to_error((fjetty_t *)jetty);
    pthread_mutex_unlock(&mu);
    return 0;
}

/* fakeurma_miscount_flush makes the next urma_flush_jetty that passes
 * liburma's checks return *(int *)count whatever it wrote: more records
 * than cr_cnt, or a negative count. The requests it wrote are consumed. A
 * test hook. */
int fakeurma_miscount_flush(void *count)
{
    return arm_miscount(&flush_miscount, count);
}

int urma_flush_jetty(urma_jetty_t *jetty, int cr_cnt, urma_cr_t *cr)
{
    fjetty_t *j = (fjetty_t *)jetty;
    /* core/urma_cp_api.c urma_flush_jetty: at most the SQ depth per call */
    if (cr == NULL || cr_cnt <= 0 || (uint32_t)cr_cnt > j->base.jetty_cfg.jfs_cfg.depth) {
        return -URMA_EINVAL;
    }
    pthread_mutex_lock(&mu);
    int k = 0;
    while (j->flushable && k < cr_cnt && j->head < j->tail) {
        swr_t *w = slot(j, j->head++);
        memset(&cr[k], 0, sizeof(cr[k]));
        cr[k].status = URMA_CR_WR_UNHANDLED;
        cr[k].user_ctx = w->user_ctx;
        cr[k].opcode = NO_OPCODE;
        cr[k].flag.bs.jetty = 1;
        cr[k].completion_len = (uint32_t)w->len;
        cr[k].local_id = j->base.jetty_id.id;
        cr[k].remote_id.id = w->target->base.id.id;
        k++;
    }
    k = recount(&flush_miscount, k);
    pthread_mutex_unlock(&mu);
    return k;
}

/* ---- targets ---- */

urma_target_jetty_t *urma_import_jetty(urma_context_t *ctx, urma_rjetty_t *rjetty, urma_token_t *token)
{
    pthread_mutex_lock(&mu);
    fdev_t *d = dev_by_eid(&rjetty->jetty_id.eid);
    if (d == NULL) {
        pthread_mutex_unlock(&mu);
        errno = ECONNREFUSED;
        return NULL;
    }
    fjetty_t *tj = rjetty->jetty_id.id < MAX_IDS ? d->jetties[rjetty->jetty_id.id] : NULL;
    if (d->unreachable || (tj != NULL && tj->ctx->dead)) {
        pthread_mutex_unlock(&mu);
        errno = ETIMEDOUT; /* nobody answers the connection setup */
        return NULL;
    }
    ftjetty_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        pthread_mutex_unlock(&mu);
        errno = ENOMEM;
        return NULL;
    }
    t->ctx = (fctx_t *)ctx;
    t->base.urma_ctx = ctx;
    t->base.id = rjetty->jetty_id;
    t->base.trans_mode = rjetty->trans_mode;
    t->base.type = rjetty->type;
    t->base.flag = rjetty->flag;
    t->base.tp_type = rjetty->tp_type;
    /* udma stores the token, it does not check it (udma_u_jetty.c) */
    if (rjetty->flag.bs.token_policy != URMA_TOKEN_NONE && token != NULL) {
        t->token = token->token;
    }
    t->ctx->children++;
    pthread_mutex_unlock(&mu);
    return &t->base;
}

urma_status_t urma_unimport_jetty(urma_target_jetty_t *tjetty)
{
    ftjetty_t *t = (ftjetty_t *)tjetty;
    pthread_mutex_lock(&mu);
    if (failing(__func__)) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    if (t->base.trans_mode == URMA_TM_RC && t->bound_by > 0) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL; /* hw/udma/udma_u_jetty.c: RC target still in use */
    }
    t->ctx->children--;
    pthread_mutex_unlock(&mu);
    free(t);
    return URMA_SUCCESS;
}

urma_status_t urma_bind_jetty(urma_jetty_t *jetty, urma_target_jetty_t *tjetty)
{
    fjetty_t *j = (fjetty_t *)jetty;
    ftjetty_t *t = (ftjetty_t *)tjetty;
    pthread_mutex_lock(&mu);
    if (j->base.jetty_cfg.jfs_cfg.trans_mode != URMA_TM_RC || t->base.trans_mode != URMA_TM_RC || j->bound != NULL) {
        pthread_mutex_unlock(&mu);
        return URMA_EINVAL;
    }
    j->bound = t;
    j->base.remote_jetty = tjetty;
    t->bound_by++;
    pthread_mutex_unlock(&mu);
    return URMA_SUCCESS;
}

/* unbind_failures fails that many urma_unbind_jetty calls, as the unbind
 * ioctl can (hw/udma/udma_u_jetty.c udma_u_unbind_jetty: URMA_FAIL) */
static int unbind_failures;

/* fakeurma_fail_unbind fails the next urma_unbind_jetty. A test hook. */
int fakeurma_fail_unbind(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    unbind_failures++;
    pthread_mutex_unlock(&mu);
    return 0;
}

urma_status_t urma_unbind_jetty(urma_jetty_t *jetty)
{
    fjetty_t *j = (fjetty_t *)jetty;
    pthread_mutex_lock(&mu);
    if (j->bound == NULL) {
        pthread_mutex_unlock(&mu);
        return URMA_EINVAL;
    }
    if (unbind_failures > 0) {
        unbind_failures--;
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    j->bound->bound_by--;
    j->bound = NULL;
    j->base.remote_jetty = NULL;
    pthread_mutex_unlock(&mu);
    return URMA_SUCCESS;
}

/* ---- segments ---- */

urma_target_seg_t *urma_register_seg(urma_context_t *ctx, urma_seg_cfg_t *cfg)
{
    uint32_t acc = cfg->flag.bs.access;
    if (cfg->va == 0 || cfg->len == 0 || acc == 0 || ((acc & URMA_ACCESS_LOCAL_ONLY) && acc != URMA_ACCESS_LOCAL_ONLY) ||
        ((acc & URMA_ACCESS_WRITE) && !(acc & URMA_ACCESS_READ))) {
        errno = EINVAL;
        return NULL;
    }
    fseg_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    fctx_t *c = (fctx_t *)ctx;
    pthread_mutex_lock(&mu);
    g->ctx = c;
    g->base.urma_ctx = ctx;
    g->base.seg.ubva.eid = c->base.eid;
    g->base.seg.ubva.uasid = c->base.uasid;
    g->base.seg.ubva.va = cfg->va;
    g->base.seg.len = cfg->len;
    g->base.seg.attr.bs.token_policy = cfg->flag.bs.token_policy;
    g->base.seg.attr.bs.access = acc;
    g->base.seg.token_id = ++c->dev->next_token_id;
    c->children++;
    pthread_mutex_unlock(&mu);
    return &g->base;
}

/* free_seg frees a registered or imported segment, unless fn is to fail
 * (fakeurma_fail_delete) */
static urma_status_t free_seg(fseg_t *g, const char *fn)
{
    pthread_mutex_lock(&mu);
    if (failing(fn)) {
        pthread_mutex_unlock(&mu);
        return URMA_FAIL;
    }
    g->ctx->children--;
    pthread_mutex_unlock(&mu);
    free(g);
    return URMA_SUCCESS;
}

urma_status_t urma_unregister_seg(urma_target_seg_t *target_seg)
{
    return free_seg((fseg_t *)target_seg, __func__);
}

urma_target_seg_t *urma_import_seg(urma_context_t *ctx, urma_seg_t *seg, urma_token_t *token, uint64_t addr,
                                   urma_import_seg_flag_t flag)
{
    (void)token;
    (void)addr;
    (void)flag;
    if (seg->attr.bs.token_policy > URMA_TOKEN_PLAIN_TEXT) {
        errno = EINVAL; /* hw/udma/udma_u_segment.c refuses stronger policies */
        return NULL;
    }
    fseg_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&mu);
    g->ctx = (fctx_t *)ctx;
    g->imported = 1;
    g->base.urma_ctx = ctx;
    g->base.seg = *seg; /* purely local: nothing is asked of the owner */
    g->ctx->children++;
    pthread_mutex_unlock(&mu);
    return &g->base;
}

urma_status_t urma_unimport_seg(urma_target_seg_t *tseg)
{
    return free_seg((fseg_t *)tseg, __func__);
}
