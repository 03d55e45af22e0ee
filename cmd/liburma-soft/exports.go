//go:build linux && cgo

package main

/*
#include <stdint.h>
#include "lsoft.h"
*/
import "C"

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/openeuler/urma-k8s/internal/liburmasoft"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// The Go half of the library: every function here is called by abi.c,
// with flat arguments (lsoft.h), and answers with liburma's status codes
// (liburmasoft.Status). A negative count is -status.

func status(err error) C.int { return C.int(liburmasoft.Status(err)) }

func badHandle() C.int { return C.int(syscall.EINVAL) }

//export lsoft_init
func lsoft_init() C.int {
	cfg, err := liburmasoft.ConfigFromEnv(os.LookupEnv)
	if err != nil {
		lib.log.Error(err, "urma_init: the environment does not configure the software provider")
		return C.int(urma.CodeFail)
	}
	lib.setLevel(cfg.LogLevel)
	err = lib.core.Init(cfg)
	var e *urma.Error
	if errors.As(err, &e) && e.Code != urma.CodeExist {
		lib.log.Error(err, "urma_init")
	}
	return status(err)
}

//export lsoft_uninit
func lsoft_uninit() C.int {
	err := lib.core.Uninit()
	if err != nil {
		lib.log.Error(err, "urma_uninit")
	}
	return status(err)
}

//export lsoft_device_names
func lsoft_device_names(out *C.lsoft_name, room C.int) C.int {
	devs, err := lib.core.Devices()
	if err != nil {
		return -status(err)
	}
	names := unsafe.Slice(out, int(room))
	n := 0
	for _, d := range devs {
		if n == len(names) {
			break
		}
		putString(names[n].name[:], d.Name)
		n++
	}
	return C.int(n)
}

func putString(dst []C.char, s string) {
	n := copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(dst)-1), s)
	dst[n] = 0
}

//export lsoft_device_info
func lsoft_device_info(name *C.char, out *C.lsoft_dev) C.int {
	d, err := lib.core.Device(C.GoString(name))
	if err != nil {
		return status(err)
	}
	c := d.Caps
	*out = C.lsoft_dev{
		transport_type: C.uint32_t(d.TransportType),
		max_jfc:        C.uint32_t(c.MaxJFC), max_jfs: C.uint32_t(c.MaxJFS), max_jfr: C.uint32_t(c.MaxJFR),
		max_jetty: C.uint32_t(c.MaxJetty), max_jetty_grp: C.uint32_t(c.MaxJettyGrp),
		max_jfc_depth: C.uint32_t(c.MaxJFCDepth), max_jfs_depth: C.uint32_t(c.MaxJFSDepth), max_jfr_depth: C.uint32_t(c.MaxJFRDepth),
		max_inline: C.uint32_t(c.MaxJFSInlineSize), max_jfs_sge: C.uint32_t(c.MaxJFSSge), max_jfs_rsge: C.uint32_t(c.MaxJFSRsge),
		max_jfr_sge: C.uint32_t(c.MaxJFRSge), trans_mode: C.uint32_t(c.TransMode), max_eid_cnt: C.uint32_t(c.MaxEIDCnt),
		max_msg_size: C.uint64_t(c.MaxMsgSize),
		reserved_min: C.uint32_t(d.ReservedJetty.Min), reserved_max: C.uint32_t(d.ReservedJetty.Max),
	}
	if c.OrderedRM {
		out.ordered_rm = 1
	}
	for i, p := range d.Ports {
		if i == len(out.port_state) {
			break
		}
		out.port_state[i] = C.uint32_t(p.State)
		out.port_mtu[i] = C.uint32_t(p.ActiveMTU)
		out.port_cnt++
	}
	return 0
}

//export lsoft_device_eids
func lsoft_device_eids(name *C.char, out *C.lsoft_eid, room C.int) C.int {
	d, err := lib.core.Device(C.GoString(name))
	if err != nil {
		return -status(err)
	}
	eids := unsafe.Slice(out, int(room))
	n := 0
	for _, e := range d.EIDs {
		if n == len(eids) {
			break
		}
		putBytes(eids[n].eid[:], e.EID[:])
		eids[n].index = C.uint32_t(e.Index)
		n++
	}
	return C.int(n)
}

func putBytes(dst []C.uint8_t, src []byte) {
	for i := range dst {
		dst[i] = C.uint8_t(src[i])
	}
}

func getBytes(dst []byte, src []C.uint8_t) {
	for i := range dst {
		dst[i] = byte(src[i])
	}
}

func putID(out *C.lsoft_id, id urma.JettyID) {
	putBytes(out.eid[:], id.EID[:])
	out.uasid = C.uint32_t(id.UASID)
	out.id = C.uint32_t(id.ID)
}

func getID(in *C.lsoft_id) urma.JettyID {
	var id urma.JettyID
	getBytes(id.EID[:], in.eid[:])
	id.UASID, id.ID = uint32(in.uasid), uint32(in.id)
	return id
}

//export lsoft_create_context
func lsoft_create_context(name *C.char, eidIndex C.uint32_t, h *C.uint64_t, id *C.lsoft_id) C.int {
	c, err := lib.core.Open(C.GoString(name), uint32(eidIndex))
	if err != nil {
		return status(err)
	}
	*h = C.uint64_t(lib.objs.add(c))
	putID(id, urma.JettyID{EID: c.EID(), UASID: c.UASID()})
	return 0
}

// closer is every object lsoft_close deletes.
type closer interface{ Close() error }

//export lsoft_close
func lsoft_close(h C.uint64_t, kind C.int) C.int {
	var obj closer
	var ok bool
	switch kind {
	case C.LSOFT_CONTEXT:
		obj, ok = lookup[*liburmasoft.Context](&lib.objs, uint64(h))
	case C.LSOFT_JFCE:
		obj, ok = lookup[*liburmasoft.JFCE](&lib.objs, uint64(h))
	case C.LSOFT_JFC:
		obj, ok = lookup[*liburmasoft.JFC](&lib.objs, uint64(h))
	case C.LSOFT_JFR:
		obj, ok = lookup[*liburmasoft.JFR](&lib.objs, uint64(h))
	case C.LSOFT_JETTY:
		obj, ok = lookup[*liburmasoft.Jetty](&lib.objs, uint64(h))
	case C.LSOFT_TJETTY:
		obj, ok = lookup[*liburmasoft.TargetJetty](&lib.objs, uint64(h))
	case C.LSOFT_SEG:
		obj, ok = lookup[*liburmasoft.Segment](&lib.objs, uint64(h))
	case C.LSOFT_TSEG:
		obj, ok = lookup[*liburmasoft.TargetSegment](&lib.objs, uint64(h))
	}
	if !ok {
		return badHandle()
	}
	if err := obj.Close(); err != nil {
		return status(err)
	}
	lib.objs.remove(uint64(h))
	return 0
}

func contextOf(h C.uint64_t) (*liburmasoft.Context, bool) {
	return lookup[*liburmasoft.Context](&lib.objs, uint64(h))
}

//export lsoft_create_jfce
func lsoft_create_jfce(ctx C.uint64_t, h *C.uint64_t, fd *C.int) C.int {
	c, ok := contextOf(ctx)
	if !ok {
		return badHandle()
	}
	e, err := c.CreateJFCE()
	if err != nil {
		return status(err)
	}
	*h, *fd = C.uint64_t(lib.objs.add(e)), C.int(e.Fd())
	return 0
}

//export lsoft_create_jfc
func lsoft_create_jfc(ctx C.uint64_t, depth C.uint32_t, jfce C.uint64_t, userCtx C.uint64_t, cptr C.uintptr_t, h *C.uint64_t, id *C.uint32_t) C.int {
	c, ok := contextOf(ctx)
	if !ok {
		return badHandle()
	}
	var e *liburmasoft.JFCE
	if jfce != 0 {
		if e, ok = lookup[*liburmasoft.JFCE](&lib.objs, uint64(jfce)); !ok {
			return badHandle()
		}
	}
	q, err := c.CreateJFC(uint32(depth), e, uint64(userCtx), uintptr(cptr))
	if err != nil {
		return status(err)
	}
	*h, *id = C.uint64_t(lib.objs.add(q)), C.uint32_t(q.ID())
	return 0
}

//export lsoft_create_jfr
func lsoft_create_jfr(ctx C.uint64_t, cfg *C.lsoft_jfr_cfg, h *C.uint64_t, id *C.lsoft_id) C.int {
	c, ok := contextOf(ctx)
	if !ok {
		return badHandle()
	}
	q, ok := lookup[*liburmasoft.JFC](&lib.objs, uint64(cfg.jfc))
	if !ok {
		return badHandle()
	}
	r, err := c.CreateJFR(liburmasoft.JFRConfig{
		Mode: uint32(cfg.mode), Depth: uint32(cfg.depth), MaxSGE: uint32(cfg.max_sge),
		MinRNRTimer: uint8(min(cfg.min_rnr_timer, 255)), JFC: q,
		TokenPolicy: uint32(cfg.token_policy), Token: uint32(cfg.token),
	})
	if err != nil {
		return status(err)
	}
	*h = C.uint64_t(lib.objs.add(r))
	putID(id, r.ID())
	return 0
}

//export lsoft_create_jetty
func lsoft_create_jetty(ctx C.uint64_t, cfg *C.lsoft_jetty_cfg, h *C.uint64_t, id *C.lsoft_id) C.int {
	c, ok := contextOf(ctx)
	if !ok {
		return badHandle()
	}
	q, ok1 := lookup[*liburmasoft.JFC](&lib.objs, uint64(cfg.send_jfc))
	r, ok2 := lookup[*liburmasoft.JFR](&lib.objs, uint64(cfg.jfr))
	if !ok1 || !ok2 {
		return badHandle()
	}
	j, err := c.CreateJetty(liburmasoft.JettyConfig{
		ShareJFR: cfg.share_jfr != 0, Mode: uint32(cfg.mode), Depth: uint32(cfg.depth),
		Priority: uint8(cfg.priority), MaxSGE: uint8(cfg.max_sge), MaxInline: uint32(cfg.max_inline),
		RNRRetry: uint8(cfg.rnr_retry), ErrTimeout: uint8(cfg.err_timeout), SendJFC: q, JFR: r,
	})
	if err != nil {
		return status(err)
	}
	*h = C.uint64_t(lib.objs.add(j))
	putID(id, j.ID())
	return 0
}

func putSegID(out *C.lsoft_seg_id, id urma.SegmentID) {
	putBytes(out.eid[:], id.EID[:])
	out.uasid, out.token_id = C.uint32_t(id.UASID), C.uint32_t(id.TokenID)
	out.va, out.len = C.uint64_t(id.VA), C.uint64_t(id.Len)
}

//export lsoft_register_seg
func lsoft_register_seg(ctx C.uint64_t, va unsafe.Pointer, length C.uint64_t, access, policy, token C.uint32_t, h *C.uint64_t, id *C.lsoft_seg_id) C.int {
	c, ok := contextOf(ctx)
	if !ok {
		return badHandle()
	}
	if va == nil || length == 0 || uint64(length) > uint64(^uint(0)>>1) {
		return C.int(syscall.EINVAL)
	}
	s, err := c.RegisterSegment(unsafe.Slice((*byte)(va), int(length)), uint32(access), uint32(policy), uint32(token))
	if err != nil {
		return status(err)
	}
	*h = C.uint64_t(lib.objs.add(s))
	putSegID(id, s.ID())
	return 0
}

//export lsoft_import_seg
func lsoft_import_seg(ctx C.uint64_t, in *C.lsoft_seg_id, token C.uint32_t, h *C.uint64_t) C.int {
	c, ok := contextOf(ctx)
	if !ok {
		return badHandle()
	}
	var id urma.SegmentID
	getBytes(id.EID[:], in.eid[:])
	id.UASID, id.TokenID, id.VA, id.Len = uint32(in.uasid), uint32(in.token_id), uint64(in.va), uint64(in.len)
	t, err := c.ImportSegment(id, uint32(token))
	if err != nil {
		return status(err)
	}
	*h = C.uint64_t(lib.objs.add(t))
	return 0
}

//export lsoft_import_jetty
func lsoft_import_jetty(ctx C.uint64_t, in *C.lsoft_id, mode, targetType, token C.uint32_t, h *C.uint64_t) C.int {
	c, ok := contextOf(ctx)
	if !ok {
		return badHandle()
	}
	t, err := c.ImportJetty(getID(in), uint32(mode), uint32(targetType), uint32(token))
	if err != nil {
		return status(err)
	}
	*h = C.uint64_t(lib.objs.add(t))
	return 0
}

func jetty(h C.uint64_t) (*liburmasoft.Jetty, bool) {
	return lookup[*liburmasoft.Jetty](&lib.objs, uint64(h))
}

//export lsoft_bind_jetty
func lsoft_bind_jetty(jh, th C.uint64_t) C.int {
	j, ok1 := jetty(jh)
	t, ok2 := lookup[*liburmasoft.TargetJetty](&lib.objs, uint64(th))
	if !ok1 || !ok2 {
		return badHandle()
	}
	return status(j.Bind(t))
}

//export lsoft_unbind_jetty
func lsoft_unbind_jetty(jh C.uint64_t) C.int {
	j, ok := jetty(jh)
	if !ok {
		return badHandle()
	}
	return status(j.Unbind())
}

//export lsoft_modify_jetty
func lsoft_modify_jetty(jh C.uint64_t, mask, state C.uint32_t) C.int {
	j, ok := jetty(jh)
	if !ok {
		return badHandle()
	}
	return status(j.Modify(uint32(mask), uint32(state)))
}

// crBatch is the most records one poll or flush call converts; abi.c
// asks for no more.
const crBatch = 32

var crBufs = sync.Pool{New: func() any { return new([crBatch]urma.Completion) }}

func putCRs(out *C.lsoft_cr, crs []urma.Completion) {
	dst := unsafe.Slice(out, len(crs))
	for i := range crs {
		c, o := &crs[i], &dst[i]
		*o = C.lsoft_cr{
			user_ctx: C.uint64_t(c.UserCtx), imm: C.uint64_t(c.Imm),
			remote_uasid: C.uint32_t(c.RemoteID.UASID), remote_id: C.uint32_t(c.RemoteID.ID),
			status: C.uint32_t(c.Status), opcode: C.uint32_t(c.Opcode),
			completion_len: C.uint32_t(c.CompletionLen), local_id: C.uint32_t(c.LocalID),
		}
		putBytes(o.remote_eid[:], c.RemoteID.EID[:])
		if c.Recv {
			o.recv = 1
		}
	}
}

//export lsoft_flush_jetty
func lsoft_flush_jetty(jh C.uint64_t, n C.int, out *C.lsoft_cr) C.int {
	j, ok := jetty(jh)
	if !ok {
		return -badHandle()
	}
	buf := crBufs.Get().(*[crBatch]urma.Completion)
	defer crBufs.Put(buf)
	k, err := j.Flush(buf[:min(int(n), crBatch)])
	if err != nil {
		return -status(err)
	}
	putCRs(out, buf[:k])
	return C.int(k)
}

// sges reads a work request's SGEs. One whose handle names no segment of
// this library goes without a segment: the provider completes it with
// LOC_ACCESS, as it does any SGE outside registered memory.
func sges(dst []liburmasoft.SGE, src []C.lsoft_sge) []liburmasoft.SGE {
	for i := range src {
		s := &src[i]
		seg, _ := lookup[*liburmasoft.Segment](&lib.objs, uint64(s.seg))
		dst = append(dst, liburmasoft.SGE{Addr: uint64(s.addr), Len: uint32(s.len), Seg: seg})
	}
	return dst
}

var sendBufs = sync.Pool{New: func() any { return &liburmasoft.Send{SGEs: make([]liburmasoft.SGE, 0, C.LSOFT_MAX_SGE)} }}

//export lsoft_post_send
func lsoft_post_send(jh C.uint64_t, w *C.lsoft_send) C.int {
	j, ok := jetty(jh)
	if !ok || w.nsge > C.LSOFT_MAX_SGE {
		return badHandle()
	}
	s := sendBufs.Get().(*liburmasoft.Send)
	defer sendBufs.Put(s)
	*s = liburmasoft.Send{
		Opcode: uint32(w.opcode), Complete: w.complete != 0, Solicited: w.solicited != 0, Inline: w.inline_data != 0,
		UserCtx: uint64(w.user_ctx), Imm: uint64(w.imm),
		SGEs: sges(s.SGEs[:0], w.sge[:w.nsge]),
	}
	if w.target != 0 {
		if s.Target, ok = lookup[*liburmasoft.TargetJetty](&lib.objs, uint64(w.target)); !ok {
			return badHandle()
		}
	}
	err := j.PostSend(s)
	clear(s.SGEs)
	s.Target = nil
	return status(err)
}

var recvSGEs = sync.Pool{New: func() any { s := make([]liburmasoft.SGE, 0, C.LSOFT_MAX_SGE); return &s }}

//export lsoft_post_recv
func lsoft_post_recv(rh C.uint64_t, w *C.lsoft_recv) C.int {
	r, ok := lookup[*liburmasoft.JFR](&lib.objs, uint64(rh))
	if !ok || w.nsge > C.LSOFT_MAX_SGE {
		return badHandle()
	}
	return postRecv(r, w)
}

func postRecv(r *liburmasoft.JFR, w *C.lsoft_recv) C.int {
	buf := recvSGEs.Get().(*[]liburmasoft.SGE)
	defer recvSGEs.Put(buf)
	s := sges((*buf)[:0], w.sge[:w.nsge])
	err := r.PostRecv(uint64(w.user_ctx), s)
	clear(s)
	return status(err)
}

// lsoft_post_jetty_recv posts to a jetty's shared JFR
// (urma_post_jetty_recv_wr).
//
//export lsoft_post_jetty_recv
func lsoft_post_jetty_recv(jh C.uint64_t, w *C.lsoft_recv) C.int {
	j, ok := jetty(jh)
	if !ok || w.nsge > C.LSOFT_MAX_SGE {
		return badHandle()
	}
	return postRecv(j.JFR(), w)
}

//export lsoft_poll
func lsoft_poll(qh C.uint64_t, n C.int, out *C.lsoft_cr) C.int {
	q, ok := lookup[*liburmasoft.JFC](&lib.objs, uint64(qh))
	if !ok {
		return -badHandle()
	}
	buf := crBufs.Get().(*[crBatch]urma.Completion)
	defer crBufs.Put(buf)
	k, err := q.Poll(buf[:min(int(n), crBatch)])
	if err != nil {
		return -status(err)
	}
	putCRs(out, buf[:k])
	return C.int(k)
}

//export lsoft_rearm
func lsoft_rearm(qh C.uint64_t, solicitedOnly C.int) C.int {
	q, ok := lookup[*liburmasoft.JFC](&lib.objs, uint64(qh))
	if !ok {
		return badHandle()
	}
	return status(q.Rearm(solicitedOnly != 0))
}

//export lsoft_wait
func lsoft_wait(eh C.uint64_t, n C.int, timeoutMs C.int, out *C.uintptr_t) C.int {
	e, ok := lookup[*liburmasoft.JFCE](&lib.objs, uint64(eh))
	if !ok {
		return -badHandle()
	}
	var ptrs [16]uintptr
	k, err := e.Wait(ptrs[:min(int(n), len(ptrs))], int(timeoutMs))
	if err != nil {
		return -status(err)
	}
	dst := unsafe.Slice(out, k)
	for i := range k {
		dst[i] = C.uintptr_t(ptrs[i])
	}
	return C.int(k)
}

//export lsoft_ack
func lsoft_ack(qh C.uint64_t, n C.uint32_t) {
	if q, ok := lookup[*liburmasoft.JFC](&lib.objs, uint64(qh)); ok {
		q.Ack(uint32(n))
	}
}

//export lsoft_refused
func lsoft_refused(fn *C.char) {
	lib.refused(C.GoString(fn))
}

//export lsoft_set_log_level
func lsoft_set_log_level(level C.int) { lib.setLevel(int(level)) }

//export lsoft_log_level
func lsoft_log_level() C.int { return C.int(lib.level()) }
