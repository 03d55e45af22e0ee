/*
 * brpcflow.c: a C program that drives liburma through the calls brpc's
 * UrmaTransport makes, in its order (src/brpc/urma/urma_helper.cpp and
 * urma_endpoint.cpp), against a Go peer on pkg/urma/soft. It is linked
 * against liburma.so.0 (-lurma, as brpc links) and talks to the peer's
 * test through stdin and stdout, one line a step, as brpc exchanges ids
 * in its TCP hello:
 *
 *   C  -> Go  HELLO <eid> <uasid> <jetty> <seg va> <seg len> <seg token id> <guarded jetty>
 *   Go -> C   HELLO <eid> <uasid> <jetty> <seg va> <seg len> <seg token id> <guarded jetty> <jetty without receives>
 *   Go -> C   SENT <n>           the peer sent n messages (SEND, SEND_IMM)
 *   C  -> Go  SENT <n>           received them, echoed them back
 *   Go -> C   GUARD              sent one message with a wrong token, one with the right one
 *   C  -> Go  GUARDED            received only the right one; sent the same both ways
 *   C  -> Go  FLUSHED            the two-phase flush checked
 *   C  -> Go  OK                 torn down in brpc's order
 *
 * Every check failing prints FAIL and the reason on stderr and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "urma_compat.h"

/* Not in urma_compat.h: the library refuses it (refused.c). */
urma_status_t urma_get_async_event(urma_context_t *ctx, void *event);

#define RQ 16              /* receives posted (brpc: urma_rq_size) */
#define SQ 16              /* send queue depth */
#define BUF (1u << 20)     /* one receive buffer */
#define POOL (2 * RQ * BUF) /* receive buffers, then send buffers */
#define GUARD_TOKEN 0x5eed
#define MSGS 6

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (errno %d)\n", errno);
    va_end(ap);
    exit(1);
}

#define CHECK(cond, ...)       \
    do {                       \
        if (!(cond)) {         \
            fail(__VA_ARGS__); \
        }                      \
    } while (0)

/* The sizes the peer sends, in order; SEND_IMM (odd) carry imm i+1000. */
static const uint32_t sizes[MSGS] = {1, 0, 4096, 100, 65536, 1u << 20};

static uint8_t pattern(uint32_t msg, uint32_t i)
{
    return (uint8_t)(msg * 31 + i * 7);
}

static char line[512];

static void expect_line(const char *prefix)
{
    if (fgets(line, sizeof(line), stdin) == NULL) {
        fail("stdin closed waiting for %s", prefix);
    }
    CHECK(strncmp(line, prefix, strlen(prefix)) == 0, "got line %s, want %s", line, prefix);
}

static void eid_hex(const urma_eid_t *e, char *out)
{
    for (int i = 0; i < URMA_EID_SIZE; i++) {
        sprintf(out + 2 * i, "%02x", e->raw[i]);
    }
}

static void parse_eid(const char *hex, urma_eid_t *e)
{
    CHECK(strlen(hex) == 32, "EID %s is not 32 hex digits", hex);
    for (int i = 0; i < URMA_EID_SIZE; i++) {
        unsigned v;
        CHECK(sscanf(hex + 2 * i, "%2x", &v) == 1, "bad EID %s", hex);
        e->raw[i] = (uint8_t)v;
    }
}

/* brpc's objects: one context, a pool segment, and per connection a JFCE,
 * a JFC with it, a shared JFR (RM, no token: brpc's), a jetty. */
static urma_context_t *ctx;
static urma_target_seg_t *pool_seg;
static uint8_t *pool;

typedef struct {
    urma_jfce_t *jfce;
    urma_jfc_t *jfc;
    urma_jfr_t *jfr;
    urma_jetty_t *jetty;
} conn_t;

static void create_conn(conn_t *c, uint32_t token_policy, uint32_t token, uint8_t rnr_retry)
{
    c->jfce = urma_create_jfce(ctx);
    CHECK(c->jfce != NULL && c->jfce->fd >= 0, "urma_create_jfce");
    urma_jfc_cfg_t jfc_cfg = {.depth = SQ + RQ, .jfce = c->jfce};
    c->jfc = urma_create_jfc(ctx, &jfc_cfg);
    CHECK(c->jfc != NULL, "urma_create_jfc");
    urma_jfr_cfg_t jfr_cfg = {.depth = RQ, .trans_mode = URMA_TM_RM, .max_sge = 1, .min_rnr_timer = 12, .jfc = c->jfc};
    jfr_cfg.flag.bs.token_policy = token_policy;
    jfr_cfg.token_value.token = token;
    c->jfr = urma_create_jfr(ctx, &jfr_cfg);
    CHECK(c->jfr != NULL, "urma_create_jfr");
    urma_jetty_cfg_t jetty_cfg;
    memset(&jetty_cfg, 0, sizeof(jetty_cfg));
    jetty_cfg.flag.bs.share_jfr = 1;
    jetty_cfg.jfs_cfg.depth = SQ;
    jetty_cfg.jfs_cfg.trans_mode = URMA_TM_RM;
    jetty_cfg.jfs_cfg.priority = 0;
    jetty_cfg.jfs_cfg.max_sge = 1;
    jetty_cfg.jfs_cfg.rnr_retry = rnr_retry;
    jetty_cfg.jfs_cfg.err_timeout = 17;
    jetty_cfg.jfs_cfg.jfc = c->jfc;
    jetty_cfg.shared.jfr = c->jfr;
    jetty_cfg.shared.jfc = c->jfc;
    c->jetty = urma_create_jetty(ctx, &jetty_cfg);
    CHECK(c->jetty != NULL, "urma_create_jetty");
    CHECK(c->jetty->jetty_cfg.jfs_cfg.jfc == c->jfc, "jetty_cfg.jfs_cfg.jfc is not the JFC given");
}

static void delete_conn(conn_t *c)
{
    /* brpc's ~UrmaResource order */
    CHECK(urma_delete_jetty(c->jetty) == URMA_SUCCESS, "urma_delete_jetty");
    CHECK(urma_delete_jfr(c->jfr) == URMA_SUCCESS, "urma_delete_jfr");
    CHECK(urma_delete_jfc(c->jfc) == URMA_SUCCESS, "urma_delete_jfc");
    CHECK(urma_delete_jfce(c->jfce) == URMA_SUCCESS, "urma_delete_jfce");
}

static void post_recv(conn_t *c, uint32_t slot)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(pool + (size_t)slot * BUF), .len = BUF, .tseg = pool_seg};
    urma_jfr_wr_t wr = {.src = {&sge, 1}, .user_ctx = slot, .next = NULL};
    urma_jfr_wr_t *bad = NULL;
    CHECK(urma_post_jfr_wr(c->jfr, &wr, &bad) == URMA_SUCCESS, "urma_post_jfr_wr slot %u", slot);
}

static void post_send(conn_t *c, urma_target_jetty_t *to, urma_opcode_t op, uint64_t user_ctx, uint64_t imm,
                      const uint8_t *data, uint32_t len)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)data, .len = len, .tseg = pool_seg};
    urma_jfs_wr_t wr;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = op;
    wr.flag.bs.complete_enable = 1;
    wr.flag.bs.solicited_enable = op == URMA_OPC_SEND_IMM;
    wr.tjetty = to;
    wr.user_ctx = user_ctx;
    wr.send.src.sge = &sge;
    wr.send.src.num_sge = len > 0 ? 1 : 0;
    wr.send.imm_data = imm;
    urma_jfs_wr_t *bad = NULL;
    int st = urma_post_jetty_send_wr(c->jetty, &wr, &bad);
    CHECK(st == URMA_SUCCESS, "urma_post_jetty_send_wr: %d", st);
}

/* poll_events takes n records from c's JFC as brpc's PollCq does: the
 * JFCE fd in epoll, edge-triggered; on an edge urma_wait_jfc(1, 0), drain,
 * urma_ack_jfc, urma_rearm_jfc, drain again. */
static int poll_events(conn_t *c, int ep, urma_cr_t *out, int n)
{
    int got = 0;
    while (got < n) {
        struct epoll_event ev;
        int k = epoll_wait(ep, &ev, 1, 10000);
        CHECK(k == 1, "no JFCE edge within 10 s after %d of %d records", got, n);
        for (;;) {
            urma_jfc_t *fired = NULL;
            int w = urma_wait_jfc(c->jfce, 1, 0, &fired);
            if (w == 0) {
                CHECK(errno == EAGAIN, "urma_wait_jfc with nothing: errno %d, want EAGAIN", errno);
                break; /* brpc: back to epoll for the next edge */
            }
            CHECK(w == 1 && fired == c->jfc, "urma_wait_jfc: %d, JFC %p, want 1, %p", w, (void *)fired, (void *)c->jfc);
            int p;
            while ((p = urma_poll_jfc(c->jfc, n - got, out + got)) > 0) {
                got += p;
            }
            CHECK(p == 0, "urma_poll_jfc: %d", p);
            uint32_t one = 1;
            urma_ack_jfc(&fired, &one, 1);
            CHECK(urma_rearm_jfc(c->jfc, false) == URMA_SUCCESS, "urma_rearm_jfc");
            while (got < n && (p = urma_poll_jfc(c->jfc, n - got, out + got)) > 0) {
                got += p;
            }
        }
    }
    return got;
}

static int epoll_on(conn_t *c)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0, "epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c->jfce->fd, &ev) == 0, "epoll_ctl on the JFCE fd");
    CHECK(urma_rearm_jfc(c->jfc, false) == URMA_SUCCESS, "urma_rearm_jfc");
    return ep;
}

/* poll_plain takes n records from a JFC by polling alone. */
static void poll_plain(urma_jfc_t *q, urma_cr_t *out, int n)
{
    int got = 0;
    for (int tries = 0; got < n; tries++) {
        CHECK(tries < 10000, "%d of %d records after 10 s", got, n);
        int p = urma_poll_jfc(q, n - got, out + got);
        CHECK(p >= 0, "urma_poll_jfc: %d", p);
        got += p;
        if (p == 0) {
            usleep(1000);
        }
    }
}

static void check_send_cr(const urma_cr_t *cr, uint64_t user_ctx, uint32_t len, const urma_jetty_t *j,
                          const urma_target_jetty_t *to, urma_cr_status_t status)
{
    CHECK(cr->status == status, "send %" PRIu64 ": status %d, want %d", user_ctx, cr->status, status);
    CHECK(cr->flag.bs.s_r == 0, "send %" PRIu64 ": s_r 1", user_ctx);
    CHECK(cr->user_ctx == user_ctx, "send record user_ctx %" PRIu64 ", want %" PRIu64, cr->user_ctx, user_ctx);
    CHECK(cr->local_id == j->jetty_id.id, "send record local_id %u, want %u", cr->local_id, j->jetty_id.id);
    CHECK(cr->remote_id.id == to->id.id, "send record remote id %u, want %u", cr->remote_id.id, to->id.id);
    if (status == URMA_CR_SUCCESS) {
        CHECK(cr->completion_len == len, "send record length %u, want %u", cr->completion_len, len);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* ---- GlobalUrmaInitializeImpl ---- */
    urma_init_attr_t init_attr;
    memset(&init_attr, 0, sizeof(init_attr));
    CHECK(urma_init(&init_attr) == URMA_SUCCESS, "urma_init");
    CHECK(urma_init(&init_attr) == URMA_EEXIST, "second urma_init is not EEXIST");
    int ndev = 0;
    urma_device_t **devs = urma_get_device_list(&ndev);
    CHECK(devs != NULL && ndev >= 1, "urma_get_device_list: %d", ndev);
    urma_device_t *dev = devs[0];
    urma_device_attr_t attr;
    CHECK(urma_query_device(dev, &attr) == URMA_SUCCESS, "urma_query_device");
    CHECK(attr.dev_cap.max_jfs_sge >= 1 && attr.dev_cap.max_msg_size >= BUF, "device caps: sge %u msg %" PRIu64,
          attr.dev_cap.max_jfs_sge, attr.dev_cap.max_msg_size);
    int ctp = -1;
    for (int p = 0; p < URMA_MAX_PRIORITY_CNT && ctp < 0; p++) {
        union urma_tp_type_en want = {.value = 0};
        want.bs.ctp = 1;
        if (attr.dev_cap.priority_info[p].tp_type.value == want.value) {
            ctp = p;
        }
    }
    CHECK(ctp >= 0, "no priority reports CTP, which brpc looks for");
    CHECK(attr.port_cnt >= 1 && attr.port_attr[0].state == URMA_PORT_ACTIVE, "no active port");
    uint32_t eid_cnt = 0;
    urma_eid_info_t *eids = urma_get_eid_list(dev, &eid_cnt);
    CHECK(eids != NULL && eid_cnt >= 1, "urma_get_eid_list");
    urma_eid_t local_eid = eids[0].eid;
    ctx = urma_create_context(dev, eids[0].eid_index);
    urma_free_eid_list(eids);
    urma_free_device_list(devs);
    CHECK(ctx != NULL, "urma_create_context");
    CHECK(strcmp(ctx->dev->name, dev->name) == 0, "ctx->dev->name after urma_free_device_list");
    CHECK(memcmp(&ctx->eid, &local_eid, sizeof(local_eid)) == 0, "ctx->eid is not the EID asked for");
    /* brpc's bonding step: a driver command the software provider has not */
    urma_user_ctl_in_t in = {0};
    urma_user_ctl_out_t out = {0};
    CHECK(urma_user_ctl(ctx, &in, &out) == URMA_EINVAL, "urma_user_ctl is not URMA_EINVAL");
    /* A function the library refuses returns liburma's error, no crash. */
    CHECK(urma_get_async_event(ctx, NULL) == URMA_EINVAL, "urma_get_async_event, which the library refuses");

    pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pool != MAP_FAILED, "mmap the pool");
    urma_seg_cfg_t seg_cfg;
    memset(&seg_cfg, 0, sizeof(seg_cfg));
    seg_cfg.va = (uint64_t)(uintptr_t)pool;
    seg_cfg.len = POOL;
    seg_cfg.flag.bs.token_policy = URMA_TOKEN_NONE;
    seg_cfg.flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE | URMA_ACCESS_ATOMIC;
    seg_cfg.user_ctx = (uint64_t)(uintptr_t)pool;
    pool_seg = urma_register_seg(ctx, &seg_cfg);
    CHECK(pool_seg != NULL, "urma_register_seg of the program's own mmap");
    CHECK(pool_seg->seg.ubva.va == seg_cfg.va && pool_seg->seg.len == POOL, "segment va/len");

    /* ---- AllocateResources, PostRecv, hello ---- */
    conn_t conn, guarded;
    create_conn(&conn, URMA_TOKEN_NONE, 0, 7);
    create_conn(&guarded, URMA_TOKEN_PLAIN_TEXT, GUARD_TOKEN, 7);
    for (uint32_t i = 0; i < RQ; i++) {
        post_recv(&conn, i);
    }
    int ep = epoll_on(&conn); /* brpc arms the JFC in AllocateResources */
    {
        urma_jfc_t *none[1];
        CHECK(urma_wait_jfc(conn.jfce, 1, 0, none) == 0 && errno == EAGAIN, "urma_wait_jfc(0) with nothing fired");
    }
    char eid[33];
    eid_hex(&conn.jetty->jetty_id.eid, eid);
    printf("HELLO %s %u %u %" PRIu64 " %" PRIu64 " %u %u\n", eid, conn.jetty->jetty_id.uasid, conn.jetty->jetty_id.id,
           (uint64_t)pool_seg->seg.ubva.va, pool_seg->seg.len, pool_seg->seg.token_id, guarded.jetty->jetty_id.id);

    /* ---- ImportPeer: the segment first, then the jetty ---- */
    expect_line("HELLO ");
    char peer_eid_hex[64];
    unsigned peer_uasid, peer_jetty, peer_token_id, peer_guarded, peer_norecv;
    uint64_t peer_va, peer_len;
    CHECK(sscanf(line, "HELLO %63s %u %u %" SCNu64 " %" SCNu64 " %u %u %u", peer_eid_hex, &peer_uasid, &peer_jetty,
                 &peer_va, &peer_len, &peer_token_id, &peer_guarded, &peer_norecv) == 8,
          "peer hello %s", line);
    urma_seg_t peer_seg;
    memset(&peer_seg, 0, sizeof(peer_seg));
    urma_eid_t peer_eid;
    parse_eid(peer_eid_hex, &peer_eid);
    peer_seg.ubva.eid = peer_eid;
    peer_seg.ubva.uasid = peer_uasid;
    peer_seg.ubva.va = peer_va;
    peer_seg.len = peer_len;
    peer_seg.token_id = peer_token_id;
    urma_token_t no_token = {0};
    urma_import_seg_flag_t seg_flag = {.value = 0};
    seg_flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE | URMA_ACCESS_ATOMIC;
    urma_target_seg_t *remote_seg = urma_import_seg(ctx, &peer_seg, &no_token, 0, seg_flag);
    CHECK(remote_seg != NULL, "urma_import_seg");
    urma_rjetty_t rjetty;
    memset(&rjetty, 0, sizeof(rjetty));
    rjetty.jetty_id.eid = peer_eid;
    rjetty.jetty_id.uasid = peer_uasid;
    rjetty.jetty_id.id = peer_jetty;
    rjetty.trans_mode = URMA_TM_RM;
    rjetty.type = URMA_JETTY;
    rjetty.tp_type = URMA_CTP;
    urma_target_jetty_t *remote = urma_import_jetty(ctx, &rjetty, &no_token);
    CHECK(remote != NULL, "urma_import_jetty");

    /* ---- the peer's messages, in event mode ---- */
    expect_line("SENT ");
    urma_cr_t crs[2 * MSGS];
    poll_events(&conn, ep, crs, MSGS);
    for (uint32_t m = 0; m < MSGS; m++) {
        const urma_cr_t *cr = &crs[m];
        CHECK(cr->status == URMA_CR_SUCCESS, "receive %u: status %d", m, cr->status);
        CHECK(cr->flag.bs.s_r == 1, "receive %u: s_r 0", m);
        CHECK(cr->user_ctx == m, "receive %u: user_ctx %" PRIu64 " (receives complete in order)", m, cr->user_ctx);
        CHECK(cr->completion_len == sizes[m], "receive %u: length %u, want %u", m, cr->completion_len, sizes[m]);
        CHECK(cr->local_id == conn.jetty->jetty_id.id, "receive %u: local_id %u", m, cr->local_id);
        CHECK(cr->remote_id.id == peer_jetty && memcmp(&cr->remote_id.eid, &peer_eid, URMA_EID_SIZE) == 0,
              "receive %u: remote id %u", m, cr->remote_id.id);
        if (m % 2 == 1) {
            CHECK(cr->opcode == URMA_CR_OPC_SEND_WITH_IMM && cr->imm_data == 1000 + m,
                  "receive %u: opcode %d imm %" PRIu64 ", want SEND_WITH_IMM %u", m, cr->opcode, cr->imm_data, 1000 + m);
        } else {
            CHECK(cr->opcode == URMA_CR_OPC_SEND, "receive %u: opcode %d, want SEND", m, cr->opcode);
        }
        const uint8_t *data = pool + (size_t)m * BUF;
        for (uint32_t i = 0; i < sizes[m]; i++) {
            CHECK(data[i] == pattern(m, i), "receive %u: byte %u is %#x, want %#x", m, i, data[i], pattern(m, i));
        }
        post_recv(&conn, m); /* brpc reposts as it consumes */
    }
    /* ---- and back: the same messages, from the program's memory ---- */
    for (uint32_t m = 0; m < MSGS; m++) {
        uint8_t *src = pool + (size_t)(RQ + m) * BUF;
        memcpy(src, pool + (size_t)m * BUF, sizes[m]);
        post_send(&conn, remote, m % 2 ? URMA_OPC_SEND_IMM : URMA_OPC_SEND, 100 + m, 2000 + m, src, sizes[m]);
    }
    poll_events(&conn, ep, crs, MSGS);
    for (uint32_t m = 0; m < MSGS; m++) {
        check_send_cr(&crs[m], 100 + m, sizes[m], conn.jetty, remote, URMA_CR_SUCCESS);
    }
    printf("SENT %d\n", MSGS);

    /* ---- tokens, checked per message ---- */
    expect_line("GUARD");
    post_recv(&guarded, 2 * RQ - 1);
    urma_cr_t cr;
    poll_plain(guarded.jfc, &cr, 1);
    CHECK(cr.status == URMA_CR_SUCCESS && cr.flag.bs.s_r == 1 && cr.completion_len == 5 &&
              memcmp(pool + (size_t)(2 * RQ - 1) * BUF, "right", 5) == 0,
          "guarded receive: status %d len %u", cr.status, cr.completion_len);
    CHECK(urma_poll_jfc(guarded.jfc, 1, &cr) == 0, "a message with a wrong token was received");
    rjetty.jetty_id.id = peer_guarded;
    urma_token_t wrong = {.token = GUARD_TOKEN + 1}, right = {.token = GUARD_TOKEN};
    urma_target_jetty_t *wrong_to = urma_import_jetty(ctx, &rjetty, &wrong);
    urma_target_jetty_t *right_to = urma_import_jetty(ctx, &rjetty, &right);
    CHECK(wrong_to != NULL && right_to != NULL, "import the peer's guarded jetty (imports check no token)");
    uint8_t *gsrc = pool + (size_t)RQ * BUF;
    memcpy(gsrc, "wrong", 5);
    post_send(&guarded, wrong_to, URMA_OPC_SEND, 1, 0, gsrc, 5);
    poll_plain(guarded.jfc, &cr, 1);
    check_send_cr(&cr, 1, 5, guarded.jetty, wrong_to, URMA_CR_REM_ACCESS_ABORT_ERR);
    /* the error moved the jetty to ERROR: flush it, then a fresh one */
    urma_jetty_attr_t to_error = {.mask = JETTY_STATE, .state = URMA_JETTY_STATE_ERROR};
    CHECK(urma_modify_jetty(guarded.jetty, &to_error) == URMA_SUCCESS, "urma_modify_jetty(ERROR)");
    poll_plain(guarded.jfc, &cr, 1);
    CHECK(cr.status == URMA_CR_WR_FLUSH_ERR_DONE, "after a send error: %d, want FLUSH_ERR_DONE", cr.status);
    CHECK(urma_unimport_jetty(wrong_to) == URMA_SUCCESS, "urma_unimport_jetty");
    CHECK(urma_unimport_jetty(right_to) == URMA_SUCCESS, "urma_unimport_jetty");
    delete_conn(&guarded);
    create_conn(&guarded, URMA_TOKEN_NONE, 0, 7);
    right_to = urma_import_jetty(ctx, &rjetty, &right);
    CHECK(right_to != NULL, "import the guarded jetty again");
    memcpy(gsrc, "right", 5);
    post_send(&guarded, right_to, URMA_OPC_SEND, 2, 0, gsrc, 5);
    poll_plain(guarded.jfc, &cr, 1);
    check_send_cr(&cr, 2, 5, guarded.jetty, right_to, URMA_CR_SUCCESS);
    printf("GUARDED\n");

    /* ---- the two-phase flush: FLUSH_ERR_DONE, then urma_flush_jetty ---- */
    rjetty.jetty_id.id = peer_norecv;
    urma_target_jetty_t *norecv = urma_import_jetty(ctx, &rjetty, &no_token);
    CHECK(norecv != NULL, "import the peer's jetty without receives");
    for (uint64_t i = 0; i < 3; i++) {
        post_send(&guarded, norecv, URMA_OPC_SEND, 10 + i, 0, gsrc, 5); /* rnr_retry 7: retried until flushed */
    }
    urma_cr_t flushed[SQ + 1];
    CHECK(urma_flush_jetty(guarded.jetty, 4, flushed) == 0, "urma_flush_jetty before ERROR returned records");
    CHECK(urma_modify_jetty(guarded.jetty, &to_error) == URMA_SUCCESS, "urma_modify_jetty(ERROR)");
    poll_plain(guarded.jfc, &cr, 1);
    CHECK(cr.status == URMA_CR_WR_FLUSH_ERR_DONE && cr.flag.bs.flush_err_done == 1 &&
              cr.local_id == guarded.jetty->jetty_id.id,
          "first record after ERROR: status %d, want FLUSH_ERR_DONE", cr.status);
    CHECK(urma_poll_jfc(guarded.jfc, 4, flushed) == 0, "records past FLUSH_ERR_DONE on the JFC");
    CHECK(urma_flush_jetty(guarded.jetty, SQ + 1, flushed) == -URMA_EINVAL, "flush of more than the SQ depth");
    int nf = urma_flush_jetty(guarded.jetty, SQ, flushed);
    CHECK(nf == 3, "urma_flush_jetty: %d records, want 3", nf);
    for (int i = 0; i < 3; i++) {
        CHECK(flushed[i].status == URMA_CR_WR_UNHANDLED && flushed[i].user_ctx == (uint64_t)(10 + i),
              "flushed record %d: status %d user_ctx %" PRIu64, i, flushed[i].status, flushed[i].user_ctx);
    }
    CHECK(urma_flush_jetty(guarded.jetty, SQ, flushed) == 0, "urma_flush_jetty once drained");
    printf("FLUSHED\n");

    /* ---- teardown, brpc's order: the resources, then GlobalRelease ---- */
    close(ep);
    CHECK(urma_unimport_jetty(norecv) == URMA_SUCCESS, "urma_unimport_jetty");
    CHECK(urma_unimport_jetty(right_to) == URMA_SUCCESS, "urma_unimport_jetty");
    delete_conn(&guarded);
    CHECK(urma_unimport_jetty(remote) == URMA_SUCCESS, "urma_unimport_jetty");
    CHECK(urma_unimport_seg(remote_seg) == URMA_SUCCESS, "urma_unimport_seg");
    delete_conn(&conn);
    CHECK(urma_unregister_seg(pool_seg) == URMA_SUCCESS, "urma_unregister_seg");
    CHECK(munmap(pool, POOL) == 0, "munmap the pool");
    CHECK(urma_delete_context(ctx) == URMA_SUCCESS, "urma_delete_context");
    CHECK(urma_uninit() == URMA_SUCCESS, "urma_uninit");
    printf("OK\n");
    return 0;
}
