#!/usr/bin/env bash
# Compare pkg/urma/liburma/urma_compat.h with a UMDK release's own headers:
# the size of every type the provider touches and the offset of every field,
# and the bit each flag sets, must be the same. Run it when moving the pin
# (urma_compat.h names the release it follows):
#
#   hack/liburma-abi-check.sh /path/to/umdk            # native compiler
#   CC=aarch64-linux-gnu-gcc hack/liburma-abi-check.sh /path/to/umdk
#
# It also compiles cmd/liburma-soft/abi.c, liburma.so.0 over the software
# provider, against UMDK's urma_api.h instead of urma_compat.h: every
# function it defines must have liburma's own prototype.
#
# The UMDK checkout provides src/urma/lib/urma/core/include/urma_api.h; it is
# read, never copied. With a cross compiler the program is not run: the
# values are read back from the object file's symbol sizes.
set -euo pipefail
umdk=${1:?usage: $0 UMDK_CHECKOUT}
inc="$umdk/src/urma/lib/urma/core/include"
[ -f "$inc/urma_api.h" ] || { echo "no urma_api.h under $inc" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
cc=${CC:-gcc}
nm=${NM:-${cc%gcc}nm}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/probe.c" <<'PY'
import sys
types = {
 'urma_init_attr_t': ['token', 'uasid'],
 'urma_eid_t': ['raw', 'in4', 'in6'],
 'urma_port_attr_t': ['max_mtu', 'state', 'active_width', 'active_speed', 'active_mtu'],
 'urma_device_cap_t': ['feature', 'max_jfc', 'max_jfs', 'max_jfr', 'max_jetty', 'max_jetty_grp', 'max_jetty_in_jetty_grp',
                       'max_jfc_depth', 'max_jfs_depth', 'max_jfr_depth', 'max_jfs_inline_len', 'max_jfs_sge', 'max_jfs_rsge',
                       'max_jfr_sge', 'max_msg_size', 'max_read_size', 'atomic_feat', 'trans_mode', 'reserved',
                       'congestion_ctrl_alg', 'ceq_cnt', 'max_tp_in_tpg', 'max_eid_cnt', 'page_size_cap', 'max_oor_cnt', 'mn',
                       'max_netaddr_cnt', 'rm_order_cap', 'rc_order_cap', 'rm_tp_cap', 'rc_tp_cap', 'um_tp_cap', 'tp_feature',
                       'priority_info'],
 'urma_device_attr_t': ['guid', 'dev_cap', 'port_cnt', 'port_attr', 'reserved_jetty_id_min', 'reserved_jetty_id_max'],
 'urma_device_t': ['name', 'path', 'type', 'ops', 'sysfs_dev'],
 'urma_context_t': ['dev', 'ops', 'dev_fd', 'async_fd', 'mutex', 'eid', 'eid_index', 'uasid', 'ref', 'aggr_mode'],
 'urma_eid_info_t': ['eid', 'eid_index'],
 'urma_jfce_t': ['urma_ctx', 'fd', 'ref'],
 'urma_jfc_cfg_t': ['depth', 'flag', 'ceqn', 'jfce', 'user_ctx'],
 'urma_jetty_id_t': ['eid', 'uasid', 'id'],
 'urma_jfc_t': ['urma_ctx', 'jfc_id', 'jfc_cfg', 'handle', 'event_mutex', 'event_cond', 'comp_events_acked',
                'async_events_acked', 'urma_jfc_opt'],
 'urma_jfs_cfg_t': ['depth', 'flag', 'trans_mode', 'priority', 'max_sge', 'max_rsge', 'max_inline_data', 'rnr_retry',
                    'err_timeout', 'jfc', 'user_ctx'],
 'urma_jfr_cfg_t': ['id', 'depth', 'flag', 'trans_mode', 'max_sge', 'min_rnr_timer', 'jfc', 'token_value', 'user_ctx'],
 'urma_jfr_t': ['urma_ctx', 'jfr_id', 'jfr_cfg', 'handle', 'event_mutex', 'event_cond', 'async_events_acked', 'urma_jfr_opt'],
 'urma_jetty_cfg_t': ['id', 'flag', 'jfs_cfg', 'shared', 'jfr_cfg', 'jetty_grp', 'user_ctx'],
 'urma_rjetty_t': ['jetty_id', 'trans_mode', 'policy', 'type', 'flag', 'tp_type'],
 'urma_target_jetty_t': ['urma_ctx', 'id', 'handle', 'trans_mode', 'tp', 'type', 'flag', 'policy', 'tp_type'],
 'urma_jetty_attr_t': ['mask', 'rx_threshold', 'state'],
 'urma_jetty_t': ['urma_ctx', 'jetty_id', 'remote_jetty', 'jetty_cfg', 'handle', 'event_mutex', 'event_cond',
                  'async_events_acked', 'urma_jetty_opt'],
 'urma_ubva_t': ['eid', 'uasid', 'va'],
 'urma_token_id_t': ['urma_ctx', 'token_id', 'handle', 'ref', 'flag'],
 'urma_seg_cfg_t': ['va', 'len', 'token_id', 'token_value', 'flag', 'user_ctx', 'iova'],
 'urma_seg_t': ['ubva', 'len', 'attr', 'token_id'],
 'urma_target_seg_t': ['seg', 'user_ctx', 'mva', 'urma_ctx', 'token_id', 'handle'],
 'urma_sge_t': ['addr', 'len', 'tseg', 'user_tseg'],
 'urma_sg_t': ['sge', 'num_sge'],
 'urma_send_wr_t': ['src', 'target_hint', 'imm_data', 'tseg'],
 'urma_jfs_wr_t': ['opcode', 'flag', 'tjetty', 'user_ctx', 'rw', 'send', 'cas', 'faa', 'next'],
 'urma_jfr_wr_t': ['src', 'user_ctx', 'next'],
 'urma_cr_t': ['status', 'user_ctx', 'opcode', 'flag', 'completion_len', 'local_id', 'remote_id', 'imm_data',
               'invalid_token', 'tpn', 'user_data'],
 'urma_rw_wr_t': ['src', 'dst', 'target_hint', 'notify_data'],
 'urma_user_ctl_in_t': ['addr', 'len', 'opcode'],
 'urma_user_ctl_out_t': ['addr', 'len', 'reserved'],
 'urma_vlog_level_t': [],
}
bits = {
 'urma_jfr_flag_t': ['token_policy', 'order_type'], 'urma_reg_seg_flag_t': ['token_policy', 'access', 'token_id_valid'],
 'urma_jfs_wr_flag_t': ['solicited_enable', 'complete_enable', 'inline_flag'], 'urma_cr_flag_t': ['s_r', 'jetty', 'flush_err_done'],
 'urma_jetty_flag_t': ['share_jfr'], 'urma_import_jetty_flag_t': ['token_policy'], 'urma_seg_attr_t': ['token_policy'],
 'urma_import_seg_flag_t': ['access', 'mapping'], 'urma_order_type_cap_t': ['ot'],
}
# Every size and offset becomes the size of an array, so that a cross build
# can be read back with nm -S. Flag bits need a run: bits.c prints them.
out = ['#include <stddef.h>', '#include HDR']
n = 0
for t, fs in types.items():
    out.append(f'char v{n}[sizeof({t}) + 1]; /* {t} */'); n += 1
    for f in fs:
        out.append(f'char v{n}[offsetof({t}, {f}) + 1]; /* {t}.{f} */'); n += 1
prog = ['#include <stdio.h>', '#include HDR', 'int main(void) {']
for u, fs in bits.items():
    for f in fs:
        prog.append(f'{{ {u} x = {{0}}; x.bs.{f} = 1; printf("{u}.bs.{f} %llu\\n", (unsigned long long)x.value); }}')
prog.append('return 0; }')
open(sys.argv[1].replace('probe.c', 'bits.c'), 'w').write('\n'.join(prog) + '\n')
open(sys.argv[1], 'w').write('\n'.join(out) + '\n')
PY
for side in theirs ours; do
  if [ $side = theirs ]; then hdr="\"$inc/urma_api.h\""; else hdr="\"$here/pkg/urma/liburma/urma_compat.h\""; fi
  "$cc" -c -DHDR="$hdr" -I"$inc" -o "$tmp/$side.o" "$tmp/probe.c"
  "$nm" -S "$tmp/$side.o" | awk '{print $4, $2}' | sort > "$tmp/$side.txt"
done
if [ "$("$cc" -dumpmachine)" = "$(cc -dumpmachine)" ]; then
  for side in theirs ours; do
    if [ $side = theirs ]; then hdr="\"$inc/urma_api.h\""; else hdr="\"$here/pkg/urma/liburma/urma_compat.h\""; fi
    "$cc" -DHDR="$hdr" -I"$inc" -o "$tmp/bits-$side" "$tmp/bits.c"
    "$tmp/bits-$side" >> "$tmp/$side.txt"
  done
fi
# abi.c against UMDK's prototypes: an urma_compat.h that is UMDK's, and no
# cgo export header (lsoft.h declares the Go half).
mkdir "$tmp/umdk-compat"
echo '#include "urma_api.h"' > "$tmp/umdk-compat/urma_compat.h"
: > "$tmp/umdk-compat/_cgo_export.h"
if ! "$cc" -c -Wall -Werror -I"$tmp/umdk-compat" -I"$inc" -I"$here/cmd/liburma-soft" -o "$tmp/abi.o" "$here/cmd/liburma-soft/abi.c"; then
  echo "cmd/liburma-soft/abi.c does not compile against $umdk's urma_api.h" >&2
  exit 1
fi
if diff -u "$tmp/theirs.txt" "$tmp/ours.txt"; then
  echo "urma_compat.h matches $umdk ($(wc -l < "$tmp/ours.txt") sizes, offsets and flag bits, $("$cc" -dumpmachine))"
else
  echo "urma_compat.h differs from $umdk; the lines above name vN, see $tmp/probe.c" >&2
  trap - EXIT
  exit 1
fi
