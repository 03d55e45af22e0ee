/*
 * cperf.c: make e2e's C workload. A C program that links liburma (-lurma)
 * and nothing of urma-k8s, and speaks pkg/transport's wire format
 * (docs/wire-format.md) as brpc's UrmaTransport does: the TCP hello (v2,
 * with the extension and host blocks, so that a server on this host picks
 * the shm fabric), the peer's segment then jetty imported, the ACK, then a
 * byte stream of SENDs with receive credits returned by SEND_IMM, events
 * from the JFCE fd in epoll. Over that stream it runs urma-perf's protocol
 * against an `urma-perf server --echo` (a header, then requests echoed
 * back) for a while, and then the same over plain TCP, and prints both:
 *
 *   cperf SERVER:PORT SIZE SECONDS
 *
 * Lines on stdout: "liburma <path>" (where the loader found liburma),
 * "device <name> eid <hex>", "urma <bytes> <seconds>", "tcp <bytes> <seconds>",
 * "OK". Any failure prints "FAIL: ..." on stderr and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "urma_compat.h"

#define SQ 64
#define RQ 64
#define BUF (64u << 10)
#define RESERVED 3 /* work requests kept for credits (wire-format.md) */

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

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int dial(const char *addr)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    CHECK(colon != NULL && (size_t)(colon - addr) < sizeof(host), "address %s: want HOST:PORT", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    CHECK(getaddrinfo(host, colon + 1, &hints, &res) == 0, "resolve %s", addr);
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0, "connect to %s", addr);
    freeaddrinfo(res);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void tcp_write(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = write(fd, b, n);
        CHECK(k > 0, "TCP write");
        b += k;
        n -= (size_t)k;
    }
}

static void tcp_read(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = read(fd, b, n);
        CHECK(k > 0, "TCP read (%zd)", k);
        b += k;
        n -= (size_t)k;
    }
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8), p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)(v >> 16)), put16(p + 2, (uint16_t)v); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)), put32(p + 4, (uint32_t)v); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) << 16 | get16(p + 2); }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

/* boot_id is the kernel's boot id (the host block: same host, same id). */
static void boot_id(uint8_t out[16])
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    CHECK(f != NULL, "open boot_id");
    char s[64] = {0};
    CHECK(fgets(s, sizeof(s), f) != NULL, "read boot_id");
    fclose(f);
    int k = 0;
    for (char *p = s; *p && k < 16; p++) {
        unsigned v;
        if (*p == '-' || *p == '\n') {
            continue;
        }
        CHECK(sscanf(p, "%2x", &v) == 1, "boot_id %s", s);
        out[k++] = (uint8_t)v;
        p++;
    }
    CHECK(k == 16, "boot_id %s", s);
}

/* One URMA connection: the transport's data plane over liburma. */
typedef struct {
    int tcp, ep;
    urma_context_t *ctx;
    urma_jfce_t *jfce;
    urma_jfc_t *jfc;
    urma_jfr_t *jfr;
    urma_jetty_t *jetty;
    urma_target_seg_t *seg, *peer_seg;
    urma_target_jetty_t *peer;
    urma_jetty_id_t peer_id;
    uint8_t *pool; /* RQ receive buffers, then SQ send buffers */
    uint32_t msg_max; /* min of both buffer sizes */
    int sq_window, remote_window, capacity, credits_out, unreturned, threshold;
    uint64_t send_next, send_done; /* send buffer ring */
    uint8_t *stream;                /* bytes received, not yet read */
    size_t stream_len, stream_cap;
} conn_t;

static void post_recv(conn_t *c, uint32_t slot)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(c->pool + (size_t)slot * BUF), .len = BUF, .tseg = c->seg};
    urma_jfr_wr_t wr = {.src = {&sge, 1}, .user_ctx = slot};
    urma_jfr_wr_t *bad;
    CHECK(urma_post_jfr_wr(c->jfr, &wr, &bad) == URMA_SUCCESS, "urma_post_jfr_wr");
}

static void post(conn_t *c, urma_opcode_t op, uint64_t user_ctx, uint64_t imm, const uint8_t *data, uint32_t len)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)data, .len = len, .tseg = c->seg};
    urma_jfs_wr_t wr;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = op;
    wr.flag.bs.complete_enable = 1;
    wr.flag.bs.solicited_enable = op == URMA_OPC_SEND_IMM;
    wr.tjetty = c->peer;
    wr.user_ctx = user_ctx;
    wr.send.src.sge = &sge;
    wr.send.src.num_sge = len > 0;
    wr.send.imm_data = imm;
    urma_jfs_wr_t *bad;
    int st = urma_post_jetty_send_wr(c->jetty, &wr, &bad);
    CHECK(st == URMA_SUCCESS, "urma_post_jetty_send_wr: %d", st);
}

static void handle(conn_t *c, const urma_cr_t *cr)
{
    CHECK(cr->status == URMA_CR_SUCCESS, "completion status %d (s_r %d)", cr->status, cr->flag.bs.s_r);
    if (!cr->flag.bs.s_r) {
        if (cr->user_ctx != 0) {
            c->sq_window++; /* a data send */
            c->send_done++;
        } else {
            c->credits_out--;
        }
        return;
    }
    uint32_t slot = (uint32_t)cr->user_ctx;
    if (cr->remote_id.id != c->peer_id.id || memcmp(&cr->remote_id.eid, &c->peer_id.eid, URMA_EID_SIZE) != 0) {
        post_recv(c, slot); /* not from the peer: dropped unread */
        return;
    }
    if (cr->opcode == URMA_CR_OPC_SEND_WITH_IMM && cr->imm_data > 0) {
        c->remote_window += (int)cr->imm_data;
        CHECK(c->remote_window <= c->capacity, "credits past the window");
        post_recv(c, slot); /* a credit's receive: reposted, not counted */
        return;
    }
    CHECK(cr->completion_len > 0, "a zero-length receive without credits");
    if (c->stream_len + cr->completion_len > c->stream_cap) {
        c->stream_cap = 2 * (c->stream_len + cr->completion_len);
        c->stream = realloc(c->stream, c->stream_cap);
        CHECK(c->stream != NULL, "allocate the stream buffer");
    }
    memcpy(c->stream + c->stream_len, c->pool + (size_t)slot * BUF, cr->completion_len);
    c->stream_len += cr->completion_len;
    post_recv(c, slot);
    c->unreturned++;
}

/* pump takes what completed, waiting for an event when nothing did, and
 * returns credits past the threshold. */
static void pump(conn_t *c)
{
    urma_cr_t crs[32];
    int n = urma_poll_jfc(c->jfc, 32, crs);
    CHECK(n >= 0, "urma_poll_jfc");
    if (n == 0) {
        CHECK(urma_rearm_jfc(c->jfc, false) == URMA_SUCCESS, "urma_rearm_jfc");
        n = urma_poll_jfc(c->jfc, 32, crs);
        if (n == 0) {
            struct epoll_event ev;
            CHECK(epoll_wait(c->ep, &ev, 1, 10000) == 1, "no completion for 10 s");
            urma_jfc_t *fired;
            int w;
            while ((w = urma_wait_jfc(c->jfce, 1, 0, &fired)) == 1) {
                uint32_t one = 1;
                urma_ack_jfc(&fired, &one, 1);
            }
            CHECK(w == 0, "urma_wait_jfc");
            n = urma_poll_jfc(c->jfc, 32, crs);
        }
    }
    for (int i = 0; i < n; i++) {
        handle(c, &crs[i]);
    }
    if (c->unreturned > c->threshold && c->credits_out < RESERVED) {
        post(c, URMA_OPC_SEND_IMM, 0, (uint64_t)c->unreturned, NULL, 0);
        c->credits_out++;
        c->unreturned = 0;
    }
}

static void conn_write(conn_t *c, const uint8_t *p, size_t n)
{
    while (n > 0) {
        while (c->sq_window == 0 || c->remote_window == 0) {
            pump(c);
        }
        uint32_t len = n > c->msg_max ? c->msg_max : (uint32_t)n;
        uint8_t *slot = c->pool + (size_t)(RQ + c->send_next % SQ) * BUF;
        memcpy(slot, p, len);
        post(c, URMA_OPC_SEND, 1, 0, slot, len);
        c->send_next++;
        c->sq_window--;
        c->remote_window--;
        p += len;
        n -= len;
    }
}

static void conn_read(conn_t *c, uint8_t *p, size_t n)
{
    while (c->stream_len < n) {
        pump(c);
    }
    memcpy(p, c->stream, n);
    memmove(c->stream, c->stream + n, c->stream_len - n);
    c->stream_len -= n;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        sprintf(out + 2 * i, "%02x", b[i]);
    }
}

/* setup opens the device as brpc does and shakes hands on fd. */
static void setup(conn_t *c, int fd)
{
    memset(c, 0, sizeof(*c));
    c->tcp = fd;
    urma_init_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    CHECK(urma_init(&attr) == URMA_SUCCESS, "urma_init");
    int ndev = 0;
    urma_device_t **devs = urma_get_device_list(&ndev);
    CHECK(devs != NULL && ndev > 0, "urma_get_device_list: no device");
    urma_device_t *dev = devs[0];
    uint32_t neid = 0;
    urma_eid_info_t *eids = urma_get_eid_list(dev, &neid);
    CHECK(eids != NULL && neid > 0, "urma_get_eid_list");
    c->ctx = urma_create_context(dev, eids[0].eid_index);
    CHECK(c->ctx != NULL, "urma_create_context");
    char eidhex[33];
    hex(eids[0].eid.raw, 16, eidhex);
    printf("device %s eid %s\n", dev->name, eidhex);
    urma_free_eid_list(eids);
    urma_free_device_list(devs);

    c->pool = mmap(NULL, (size_t)(RQ + SQ) * BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(c->pool != MAP_FAILED, "mmap");
    urma_seg_cfg_t sc;
    memset(&sc, 0, sizeof(sc));
    sc.va = (uint64_t)(uintptr_t)c->pool;
    sc.len = (uint64_t)(RQ + SQ) * BUF;
    sc.flag.bs.token_policy = URMA_TOKEN_NONE;
    sc.flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE | URMA_ACCESS_ATOMIC;
    c->seg = urma_register_seg(c->ctx, &sc);
    CHECK(c->seg != NULL, "urma_register_seg");
    c->jfce = urma_create_jfce(c->ctx);
    CHECK(c->jfce != NULL, "urma_create_jfce");
    urma_jfc_cfg_t qc = {.depth = SQ + RQ + 1, .jfce = c->jfce};
    c->jfc = urma_create_jfc(c->ctx, &qc);
    CHECK(c->jfc != NULL, "urma_create_jfc");
    urma_jfr_cfg_t rc = {.depth = RQ, .trans_mode = URMA_TM_RM, .max_sge = 1, .min_rnr_timer = 12, .jfc = c->jfc};
    c->jfr = urma_create_jfr(c->ctx, &rc);
    CHECK(c->jfr != NULL, "urma_create_jfr");
    urma_jetty_cfg_t jc;
    memset(&jc, 0, sizeof(jc));
    jc.flag.bs.share_jfr = 1;
    jc.jfs_cfg.depth = SQ;
    jc.jfs_cfg.trans_mode = URMA_TM_RM;
    jc.jfs_cfg.max_sge = 1;
    jc.jfs_cfg.rnr_retry = 7;
    jc.jfs_cfg.err_timeout = 17;
    jc.jfs_cfg.jfc = c->jfc;
    jc.shared.jfr = c->jfr;
    c->jetty = urma_create_jetty(c->ctx, &jc);
    CHECK(c->jetty != NULL, "urma_create_jetty");
    for (uint32_t i = 0; i < RQ; i++) {
        post_recv(c, i);
    }
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    CHECK(c->ep >= 0 && epoll_ctl(c->ep, EPOLL_CTL_ADD, c->jfce->fd, &ev) == 0, "epoll on the JFCE");

    /* Our hello: v2, the extension block (no token, our SQ depth) and the
     * host block (the boot id). */
    uint8_t h[122];
    memset(h, 0, sizeof(h));
    memcpy(h, "URMA", 4);
    put16(h + 4, sizeof(h));
    put16(h + 6, 2);
    put16(h + 8, 1);
    put32(h + 10, BUF);
    put32(h + 14, RQ - 1);
    put32(h + 18, c->jetty->jetty_id.id);
    memcpy(h + 22, c->ctx->eid.raw, 16);
    put32(h + 38, c->jetty->jetty_id.uasid);
    h[42] = URMA_CTP;
    memcpy(h + 46, c->seg->seg.ubva.eid.raw, 16);
    put32(h + 62, c->seg->seg.ubva.uasid);
    put64(h + 66, c->seg->seg.ubva.va);
    put64(h + 74, c->seg->seg.len);
    put32(h + 82, c->seg->seg.token_id);
    memcpy(h + 86, "K8ST", 4);
    put32(h + 94, SQ);
    memcpy(h + 102, "K8SH", 4);
    boot_id(h + 106);
    tcp_write(fd, h, sizeof(h));

    /* The server's hello. */
    uint8_t s[4096];
    tcp_read(fd, s, 86);
    CHECK(memcmp(s, "URMA", 4) == 0, "the server answered no URMA hello");
    uint16_t len = get16(s + 4);
    CHECK(len >= 86 && len <= sizeof(s), "hello length %u", len);
    tcp_read(fd, s + 86, (size_t)len - 86);
    CHECK(get16(s + 6) == 2 && get32(s + 18) != 0, "the server fell back (its hello is the fallback hello)");
    uint32_t peer_buf = get32(s + 10), peer_rq = get32(s + 14) + 1, token = 0, peer_sq = 0;
    if (len >= 102 && memcmp(s + 86, "K8ST", 4) == 0) {
        peer_sq = get32(s + 94);
        if (get32(s + 98) & 1) {
            token = get32(s + 90);
        }
    }
    memcpy(c->peer_id.eid.raw, s + 22, 16);
    c->peer_id.uasid = get32(s + 38);
    c->peer_id.id = get32(s + 18);
    c->msg_max = peer_buf < BUF ? peer_buf : BUF;
    c->capacity = (SQ < (int)peer_rq ? SQ : (int)peer_rq) - RESERVED;
    c->sq_window = c->remote_window = c->capacity;
    c->threshold = peer_sq ? ((RQ < (int)peer_sq ? RQ : (int)peer_sq) - RESERVED) / 2 : ((RQ < 16 ? RQ : 16) - RESERVED) / 2;

    /* brpc's order: the segment, then the jetty. */
    urma_seg_t ps;
    memset(&ps, 0, sizeof(ps));
    urma_eid_t seg_eid;
    memcpy(seg_eid.raw, s + 46, 16);
    ps.ubva.eid = seg_eid;
    ps.ubva.uasid = get32(s + 62);
    ps.ubva.va = get64(s + 66);
    ps.len = get64(s + 74);
    ps.token_id = get32(s + 82);
    urma_token_t tok = {.token = token};
    urma_import_seg_flag_t sf = {.value = 0};
    sf.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE | URMA_ACCESS_ATOMIC;
    c->peer_seg = urma_import_seg(c->ctx, &ps, &tok, 0, sf);
    CHECK(c->peer_seg != NULL, "urma_import_seg");
    urma_rjetty_t rj;
    memset(&rj, 0, sizeof(rj));
    rj.jetty_id = c->peer_id;
    rj.trans_mode = URMA_TM_RM;
    rj.type = URMA_JETTY;
    rj.tp_type = URMA_CTP;
    rj.flag.bs.token_policy = URMA_TOKEN_PLAIN_TEXT;
    c->peer = urma_import_jetty(c->ctx, &rj, &tok);
    CHECK(c->peer != NULL, "urma_import_jetty");
    uint8_t ack[4];
    put32(ack, 1);
    tcp_write(fd, ack, 4);
    CHECK(urma_rearm_jfc(c->jfc, false) == URMA_SUCCESS, "urma_rearm_jfc");
}

/* bench runs urma-perf's protocol for secs: a header, then size-byte
 * requests echoed back. It returns the bytes echoed. */
typedef struct {
    void (*write)(void *, const uint8_t *, size_t);
    void (*read)(void *, uint8_t *, size_t);
    void *c;
} io_t;

static uint64_t bench(io_t io, uint32_t size, double secs, double *took)
{
    uint8_t hdr[16];
    memcpy(hdr, "UPRF", 4);
    put32(hdr + 4, 1);
    put32(hdr + 8, size);
    put32(hdr + 12, 0);
    io.write(io.c, hdr, 16);
    uint8_t ans[8];
    io.read(io.c, ans, 8);
    CHECK(memcmp(ans, "UPRF", 4) == 0 && get32(ans + 4) == size, "the server is no urma-perf echo server");
    uint8_t *req = malloc(size), *resp = malloc(size);
    CHECK(req != NULL && resp != NULL, "allocate requests");
    uint64_t moved = 0;
    double start = now();
    for (uint64_t seq = 0; now() - start < secs; seq++) {
        memset(req, (int)(seq & 0xff), size);
        memcpy(req, &seq, sizeof(seq));
        io.write(io.c, req, size);
        io.read(io.c, resp, size);
        CHECK(memcmp(req, resp, size) == 0, "the echo differs from the request");
        moved += size;
    }
    *took = now() - start;
    free(req);
    free(resp);
    return moved;
}

static void uw(void *c, const uint8_t *p, size_t n) { conn_write(c, p, n); }
static void ur(void *c, uint8_t *p, size_t n) { conn_read(c, p, n); }
static void tw(void *c, const uint8_t *p, size_t n) { tcp_write(*(int *)c, p, n); }
static void tr(void *c, uint8_t *p, size_t n) { tcp_read(*(int *)c, p, n); }

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s SERVER:PORT SIZE SECONDS\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint32_t size = (uint32_t)strtoul(argv[2], NULL, 10);
    double secs = strtod(argv[3], NULL);
    CHECK(size >= 1 && size <= (64u << 20) && secs > 0, "size %s or seconds %s out of range", argv[2], argv[3]);
    Dl_info where;
    CHECK(dladdr((void *)urma_init, &where) != 0 && where.dli_fname != NULL, "dladdr(urma_init)");
    printf("liburma %s\n", where.dli_fname);

    conn_t c;
    setup(&c, dial(argv[1]));
    double took;
    uint64_t moved = bench((io_t){uw, ur, &c}, size, secs, &took);
    printf("urma %" PRIu64 " %.3f\n", moved, took);
    close(c.tcp); /* the connection's end; the process's end releases the rest */

    int fd = dial(argv[1]);
    moved = bench((io_t){tw, tr, &fd}, size, secs, &took);
    printf("tcp %" PRIu64 " %.3f\n", moved, took);
    close(fd);
    printf("OK\n");
    return 0;
}
