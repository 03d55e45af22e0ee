/*
 * urma_compat.h: our own declarations of the part of liburma that
 * pkg/urma/liburma calls and cmd/liburma-soft implements, written for
 * urma-k8s.
 *
 * Pinned to UMDK 26.06.0 (openeuler-mirror/umdk commit 00cc16f1,
 * URMA_API_VERSION 0.9). Every type keeps liburma's name and is declared in
 * full, field by field in liburma's order, so that code written against this
 * header compiles against UMDK's urma_api.h too and sees the same layout.
 * liburma's layouts change without a version bump (its SONAME stays
 * liburma.so.0 and it has no symbol versions), so moving to another UMDK
 * release means re-checking every declaration below against that release's
 * urma_types.h and urma_opcode.h (hack/liburma-abi-check.sh does); shim.c
 * and abi.c assert the sizes and offsets they rely on.
 *
 * shim.c (with the test fake in testdata/fakeurma) and cmd/liburma-soft's
 * abi.c, which implements these functions over the software provider,
 * include this header. The provider links nothing: it resolves the
 * functions with dlsym.
 */
#ifndef URMA_K8S_URMA_COMPAT_H
#define URMA_K8S_URMA_COMPAT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- return codes and enumerations (urma_opcode.h) ---- */

typedef int urma_status_t;
#define URMA_SUCCESS 0
#define URMA_EAGAIN  EAGAIN
#define URMA_ENOMEM  ENOMEM
#define URMA_EINVAL  EINVAL
#define URMA_EEXIST  EEXIST
#define URMA_FAIL    0x1000

#define URMA_TOKEN_NONE       0
#define URMA_TOKEN_PLAIN_TEXT 1

#define URMA_ACCESS_LOCAL_ONLY (1 << 0)
#define URMA_ACCESS_READ       (1 << 1)
#define URMA_ACCESS_WRITE      (1 << 2)
#define URMA_ACCESS_ATOMIC     (1 << 3)

typedef enum urma_opcode {
    URMA_OPC_WRITE = 0x00,
    URMA_OPC_WRITE_IMM = 0x01,
    URMA_OPC_WRITE_NOTIFY = 0x02,
    URMA_OPC_READ = 0x10,
    URMA_OPC_CAS = 0x20,
    URMA_OPC_SWAP = 0x21,
    URMA_OPC_FADD = 0x22,
    URMA_OPC_FSUB = 0x23,
    URMA_OPC_FAND = 0x24,
    URMA_OPC_FOR = 0x25,
    URMA_OPC_FXOR = 0x26,
    URMA_OPC_SEND = 0x40,
    URMA_OPC_SEND_IMM = 0x41,
    URMA_OPC_SEND_INVALIDATE = 0x42,
    URMA_OPC_NOP = 0x51,
    URMA_OPC_WRITE_ATOMIC = 0x60,
    URMA_OPC_FLUSH_DMA = 0x80,
    URMA_OPC_LAST
} urma_opcode_t;

typedef enum urma_cr_status {
    URMA_CR_SUCCESS = 0,
    URMA_CR_UNSUPPORTED_OPCODE_ERR,
    URMA_CR_LOC_LEN_ERR,
    URMA_CR_LOC_OPERATION_ERR,
    URMA_CR_LOC_ACCESS_ERR,
    URMA_CR_REM_RESP_LEN_ERR,
    URMA_CR_REM_UNSUPPORTED_REQ_ERR,
    URMA_CR_REM_OPERATION_ERR,
    URMA_CR_REM_ACCESS_ABORT_ERR,
    URMA_CR_ACK_TIMEOUT_ERR,
    URMA_CR_RNR_RETRY_CNT_EXC_ERR,
    URMA_CR_WR_FLUSH_ERR,
    URMA_CR_WR_SUSPEND_DONE,
    URMA_CR_WR_FLUSH_ERR_DONE,
    URMA_CR_WR_UNHANDLED,
    URMA_CR_LOC_DATA_POISON,
    URMA_CR_REM_DATA_POISON,
} urma_cr_status_t;

typedef enum urma_cr_opcode {
    URMA_CR_OPC_SEND = 0x00,
    URMA_CR_OPC_SEND_WITH_IMM,
    URMA_CR_OPC_SEND_WITH_INV,
    URMA_CR_OPC_WRITE_WITH_IMM,
    URMA_CR_OPC_FLUSH_WRITE,
} urma_cr_opcode_t;

typedef enum urma_jetty_state {
    URMA_JETTY_STATE_RESET = 0,
    URMA_JETTY_STATE_READY,
    URMA_JETTY_STATE_SUSPENDED,
    URMA_JETTY_STATE_ERROR
} urma_jetty_state_t;

/* ---- devices (urma_types.h) ---- */

#define URMA_MAX_NAME         64
#define URMA_MAX_PATH         4096
#define URMA_EID_SIZE         16
#define URMA_GUID_SIZE        16
#define MAX_PORT_CNT          8
#define URMA_MAX_PRIORITY_CNT 16
#define URMA_OPT_REVERSED_NUM 4

typedef struct urma_init_attr {
    uint64_t token;
    uint32_t uasid;
} urma_init_attr_t;

typedef enum urma_mtu {
    URMA_MTU_256 = 1,
    URMA_MTU_512,
    URMA_MTU_1024,
    URMA_MTU_2048,
    URMA_MTU_4096,
    URMA_MTU_8192,
} urma_mtu_t;

typedef enum urma_port_state {
    URMA_PORT_NOP = 0,
    URMA_PORT_DOWN,
    URMA_PORT_INIT,
    URMA_PORT_ARMED,
    URMA_PORT_ACTIVE,
    URMA_PORT_ACTIVE_DEFER,
} urma_port_state_t;

typedef enum urma_speed {
    URMA_SP_10M = 0,
    URMA_SP_100M,
    URMA_SP_1G,
    URMA_SP_2_5G,
    URMA_SP_5G,
    URMA_SP_10G,
    URMA_SP_14G,
    URMA_SP_25G,
    URMA_SP_40G,
    URMA_SP_50G,
    URMA_SP_100G,
    URMA_SP_200G,
    URMA_SP_400G,
    URMA_SP_800G,
} urma_speed_t;

typedef enum urma_link_width {
    URMA_LINK_X1 = 0x1,
    URMA_LINK_X2 = 0x1 << 1,
    URMA_LINK_X4 = 0x1 << 2,
    URMA_LINK_X8 = 0x1 << 3,
    URMA_LINK_X16 = 0x1 << 4,
    URMA_LINK_X32 = 0x1 << 5,
} urma_link_width_t;

/* 16 bytes in network order, viewed three ways. */
typedef union urma_eid {
    uint8_t raw[URMA_EID_SIZE];
    struct {
        uint64_t reserved;
        uint32_t prefix;
        uint32_t addr;
    } in4;
    struct {
        uint64_t subnet_prefix;
        uint64_t interface_id;
    } in6;
} urma_eid_t;

typedef struct urma_ref {
    atomic_ulong atomic_cnt;
} urma_ref_t;

typedef struct urma_port_attr {
    urma_mtu_t max_mtu;
    urma_port_state_t state;
    urma_link_width_t active_width;
    urma_speed_t active_speed;
    urma_mtu_t active_mtu;
} urma_port_attr_t;

union urma_tp_type_en {
    struct {
        uint32_t rtp : 1;
        uint32_t ctp : 1;
        uint32_t utp : 1;
        uint32_t reserved : 29;
    } bs;
    uint32_t value;
};

struct urma_sl_info {
    uint32_t SL;
    union urma_tp_type_en tp_type;
};

typedef union urma_device_feature {
    struct {
        uint32_t oor : 1;
        uint32_t jfc_per_wr : 1;
        uint32_t stride_op : 1;
        uint32_t load_store_op : 1;
        uint32_t non_pin : 1;
        uint32_t pmem : 1;
        uint32_t jfc_inline : 1;
        uint32_t spray_en : 1;
        uint32_t selective_retrans : 1;
        uint32_t live_migrate : 1;
        uint32_t dca : 1;
        uint32_t jetty_grp : 1;
        uint32_t error_suspend : 1;
        uint32_t outorder_comp : 1;
        uint32_t mn : 1;
        uint32_t clan : 1;
        uint32_t muti_seg_per_token_id : 1;
        uint32_t ipourma_en : 1;
        uint32_t ctp_en : 1;
        uint32_t uboe : 1;
        uint32_t reserved : 12;
    } bs;
    uint32_t value;
} urma_device_feature_t;

typedef union urma_atomic_feature {
    struct {
        uint32_t cas : 1;
        uint32_t swap : 1;
        uint32_t fetch_and_add : 1;
        uint32_t fetch_and_sub : 1;
        uint32_t fetch_and_and : 1;
        uint32_t fetch_and_or : 1;
        uint32_t fetch_and_xor : 1;
        uint32_t reserved : 25;
    } bs;
    uint32_t value;
} urma_atomic_feature_t;

/* Ordering a device offers: ot is target ordering, which an in-order byte
 * stream over RM needs. */
typedef union urma_order_type_cap {
    struct {
        uint32_t ot : 1;
        uint32_t oi : 1;
        uint32_t ol : 1;
        uint32_t no : 1;
        uint32_t reserved : 28;
    } bs;
    uint32_t value;
} urma_order_type_cap_t;

typedef union urma_tp_type_cap {
    struct {
        uint32_t rtp : 1;
        uint32_t ctp : 1;
        uint32_t utp : 1;
        uint32_t reserved : 29;
    } bs;
    uint32_t value;
} urma_tp_type_cap_t;

typedef union urma_tp_feature {
    struct {
        uint32_t rm_multi_path : 1;
        uint32_t rc_multi_path : 1;
        uint32_t reserved : 30;
    } bs;
    uint32_t value;
} urma_tp_feature_t;

typedef struct urma_device_cap {
    urma_device_feature_t feature;
    uint32_t max_jfc;
    uint32_t max_jfs;
    uint32_t max_jfr;
    uint32_t max_jetty;
    uint32_t max_jetty_grp;
    uint32_t max_jetty_in_jetty_grp;
    uint32_t max_jfc_depth;
    uint32_t max_jfs_depth;
    uint32_t max_jfr_depth;
    uint32_t max_jfs_inline_len;
    uint32_t max_jfs_sge;
    uint32_t max_jfs_rsge;
    uint32_t max_jfr_sge;
    uint64_t max_msg_size;
    uint32_t max_read_size;
    uint32_t max_write_size;
    uint32_t max_cas_size;
    uint32_t max_swap_size;
    uint32_t max_fetch_and_add_size;
    uint32_t max_fetch_and_sub_size;
    uint32_t max_fetch_and_and_size;
    uint32_t max_fetch_and_or_size;
    uint32_t max_fetch_and_xor_size;
    urma_atomic_feature_t atomic_feat;
    uint16_t trans_mode; /* URMA_TM_* bits */
    uint16_t reserved;
    uint16_t congestion_ctrl_alg;
    uint32_t ceq_cnt;
    uint32_t max_tp_in_tpg;
    uint32_t max_eid_cnt;
    uint64_t page_size_cap;
    uint32_t max_oor_cnt;
    uint32_t mn;
    uint32_t max_netaddr_cnt;
    urma_order_type_cap_t rm_order_cap;
    urma_order_type_cap_t rc_order_cap;
    urma_tp_type_cap_t rm_tp_cap;
    urma_tp_type_cap_t rc_tp_cap;
    urma_tp_type_cap_t um_tp_cap;
    urma_tp_feature_t tp_feature;
    struct urma_sl_info priority_info[URMA_MAX_PRIORITY_CNT];
} urma_device_cap_t;

typedef struct urma_guid {
    uint8_t raw[URMA_GUID_SIZE];
} urma_guid_t;

typedef struct urma_device_attr {
    urma_guid_t guid;
    urma_device_cap_t dev_cap;
    uint8_t port_cnt;
    struct urma_port_attr port_attr[MAX_PORT_CNT];
    uint32_t reserved_jetty_id_min;
    uint32_t reserved_jetty_id_max;
} urma_device_attr_t;

typedef struct urma_token {
    uint32_t token;
} urma_token_t;

struct urma_sysfs_dev;
struct urma_ops;
struct urma_provider_ops;

typedef enum urma_transport_type {
    URMA_TRANSPORT_INVALID = -1,
    URMA_TRANSPORT_UB = 0,
    URMA_TRANSPORT_IB = 1,
    URMA_TRANSPORT_IP = 2,
    URMA_TRANSPORT_SOFTUB = 3,
    URMA_TRANSPORT_HNS_UB = 5,
    URMA_TRANSPORT_MAX
} urma_transport_type_t;

typedef enum urma_transport_mode {
    URMA_TM_RM = 0x1,
    URMA_TM_RC = 0x1 << 1,
    URMA_TM_UM = 0x1 << 2,
} urma_transport_mode_t;

typedef struct urma_device {
    char name[URMA_MAX_NAME];
    char path[URMA_MAX_PATH];
    urma_transport_type_t type;
    struct urma_provider_ops *ops;
    struct urma_sysfs_dev *sysfs_dev;
} urma_device_t;

typedef enum urma_context_aggr_mode {
    URMA_AGGR_MODE_STANDALONE,
    URMA_AGGR_MODE_ACTIVE_BACKUP,
    URMA_AGGR_MODE_BALANCE,
} urma_context_aggr_mode_t;

/* The mutex before eid is 40 bytes on x86_64 and 48 on aarch64, so eid's
 * offset differs by architecture; read it through this declaration only. */
typedef struct urma_context {
    struct urma_device *dev;
    struct urma_ops *ops;
    int dev_fd;
    int async_fd;
    pthread_mutex_t mutex;
    urma_eid_t eid;
    uint32_t eid_index;
    uint32_t uasid;
    struct urma_ref ref;
    urma_context_aggr_mode_t aggr_mode;
} urma_context_t;

typedef struct urma_eid_info {
    urma_eid_t eid;
    uint32_t eid_index;
} urma_eid_info_t;

/* ---- completion events and queues ---- */

typedef struct urma_jfce {
    urma_context_t *urma_ctx;
    int fd;
    struct urma_ref ref;
} urma_jfce_t;

typedef union urma_jfc_flag {
    struct {
        uint32_t lock_free : 1;
        uint32_t jfc_inline : 1;
        uint32_t non_blocking : 1;
        uint32_t has_drv_ext : 1;
        uint32_t reserved : 28;
    } bs;
    uint32_t value;
} urma_jfc_flag_t;

typedef struct urma_jfc_cfg {
    uint32_t depth;
    urma_jfc_flag_t flag;
    uint32_t ceqn;
    urma_jfce_t *jfce;
    uint64_t user_ctx;
} urma_jfc_cfg_t;

typedef struct urma_jetty_id {
    urma_eid_t eid;
    uint32_t uasid;
    uint32_t id;
} urma_jetty_id_t;

typedef struct urma_jetty_id urma_jfs_id_t;
typedef struct urma_jetty_id urma_jfr_id_t;
typedef struct urma_jetty_id urma_jfc_id_t;

union urma_jfc_opt_mask {
    struct {
        uint64_t urma_jfc_cqe_base_addr : 1;
        uint64_t urma_jfc_db_addr : 1;
        uint64_t urma_jfc_id : 1;
        uint64_t urma_jfc_pi : 1;
        uint64_t urma_jfc_pi_type : 1;
        uint64_t urma_jfc_ci : 1;
        uint64_t urma_jfc_db_status : 1;
        uint64_t reserved : 57;
    } bs;
    uint64_t value;
};

typedef struct urma_jfc_opt {
    union urma_jfc_opt_mask jfc_opt_mask;
    bool is_actived;
    uint64_t urma_jfc_cqe_base_addr;
    uint32_t urma_jfc_id;
    uint64_t urma_jfc_db_addr;
    uint8_t urma_jfc_db_status;
    uint16_t urma_jfc_pi;
    uint16_t urma_jfc_pi_type;
    uint16_t urma_jfc_ci;
    uint64_t reserved[URMA_OPT_REVERSED_NUM];
} urma_jfc_opt_t;

typedef struct urma_jfc {
    urma_context_t *urma_ctx;
    urma_jfc_id_t jfc_id;
    urma_jfc_cfg_t jfc_cfg;
    uint64_t handle;
    pthread_mutex_t event_mutex;
    pthread_cond_t event_cond;
    uint32_t comp_events_acked;
    uint32_t async_events_acked;
    urma_jfc_opt_t urma_jfc_opt;
} urma_jfc_t;

/* ---- send and receive queues, jetties ---- */

typedef union urma_jfs_flag {
    struct {
        uint32_t lock_free : 1;
        uint32_t error_suspend : 1;
        uint32_t outorder_comp : 1;
        uint32_t order_type : 8;
        uint32_t multi_path : 1;
        uint32_t ctp_rc_mul_path_mode : 1;
        uint32_t non_blocking : 1;
        uint32_t has_drv_ext : 1;
        uint32_t reserved : 17;
    } bs;
    uint32_t value;
} urma_jfs_flag_t;

union urma_jfs_opt_mask {
    struct {
        uint64_t urma_jfs_cqe_base_addr : 1;
        uint64_t urma_jfs_db_addr : 1;
        uint64_t urma_jfs_id : 1;
        uint64_t urma_jfs_pi : 1;
        uint64_t urma_jfs_pi_type : 1;
        uint64_t urma_jfs_ci : 1;
        uint64_t urma_jfs_db_status : 1;
        uint64_t reserved : 57;
    } bs;
    uint64_t value;
};

typedef struct urma_jfs_opt {
    union urma_jfs_opt_mask jfs_opt_mask;
    bool is_actived;
    uint64_t urma_jfs_sqe_base_addr;
    uint32_t urma_jfs_id;
    uint64_t urma_jfs_db_addr;
    uint8_t urma_jfs_db_status;
    uint16_t urma_jfs_pi;
    uint16_t urma_jfs_pi_type;
    uint16_t urma_jfs_ci;
    uint64_t reserved[URMA_OPT_REVERSED_NUM];
} urma_jfs_opt_t;

typedef struct urma_jfs_cfg {
    uint32_t depth;
    urma_jfs_flag_t flag;
    urma_transport_mode_t trans_mode;
    uint8_t priority;
    uint8_t max_sge;
    uint8_t max_rsge;
    uint32_t max_inline_data;
    uint8_t rnr_retry;   /* 0..7; 7 retries without end */
    uint8_t err_timeout; /* 0..31: 4.096 us << err_timeout */
    urma_jfc_t *jfc;
    uint64_t user_ctx;
} urma_jfs_cfg_t;

typedef union urma_jfr_flag {
    struct {
        uint32_t token_policy : 3;
        uint32_t tag_matching : 1;
        uint32_t lock_free : 1;
        uint32_t order_type : 8;
        uint32_t has_drv_ext : 1;
        uint32_t non_blocking : 1;
        uint32_t reserved : 17;
    } bs;
    uint32_t value;
} urma_jfr_flag_t;

union urma_jfr_opt_mask {
    struct {
        uint64_t urma_jfr_cqe_base_addr : 1;
        uint64_t urma_jfr_db_addr : 1;
        uint64_t urma_jfr_id : 1;
        uint64_t urma_jfr_pi : 1;
        uint64_t urma_jfr_pi_type : 1;
        uint64_t urma_jfr_ci : 1;
        uint64_t urma_jfr_db_status : 1;
        uint64_t reserved : 57;
    } bs;
    uint64_t value;
};

typedef struct urma_jfr_opt {
    union urma_jfr_opt_mask jfr_opt_mask;
    bool is_actived;
    uint64_t urma_jfr_rqe_base_addr;
    uint32_t urma_jfr_id;
    uint64_t urma_jfr_db_addr;
    uint8_t urma_jfr_db_status;
    uint16_t urma_jfr_pi;
    uint16_t urma_jfr_pi_type;
    uint16_t urma_jfr_ci;
    uint64_t reserved[URMA_OPT_REVERSED_NUM];
} urma_jfr_opt_t;

typedef struct urma_jfr_cfg {
    uint32_t id;
    uint32_t depth;
    urma_jfr_flag_t flag;
    urma_transport_mode_t trans_mode;
    uint8_t max_sge;
    uint8_t min_rnr_timer; /* 0..31 */
    urma_jfc_t *jfc;
    urma_token_t token_value; /* what every message to this JFR must carry */
    uint64_t user_ctx;
} urma_jfr_cfg_t;

typedef struct urma_jfr {
    urma_context_t *urma_ctx;
    urma_jfr_id_t jfr_id;
    urma_jfr_cfg_t jfr_cfg;
    uint64_t handle;
    pthread_mutex_t event_mutex;
    pthread_cond_t event_cond;
    uint32_t async_events_acked;
    urma_jfr_opt_t urma_jfr_opt;
} urma_jfr_t;

typedef union urma_import_jetty_flag {
    struct {
        uint32_t token_policy : 3;
        uint32_t order_type : 8;
        uint32_t share_tp : 1;
        uint32_t has_drv_ext : 1;
        uint32_t has_user_info : 1;
        uint32_t reserved : 18;
    } bs;
    uint32_t value;
} urma_import_jetty_flag_t;

typedef enum urma_tp_type {
    URMA_RTP,
    URMA_CTP,
    URMA_UTP
} urma_tp_type_t;

typedef struct urma_tp {
    uint32_t tpn;
} urma_tp_t;

typedef union urma_jetty_flag {
    struct {
        uint32_t share_jfr : 1;
        uint32_t non_blocking : 1;
        uint32_t has_drv_ext : 1;
        uint32_t has_user_info : 1;
        uint32_t reserved : 28;
    } bs;
    uint32_t value;
} urma_jetty_flag_t;

typedef struct urma_jetty_grp urma_jetty_grp_t; /* never dereferenced here */

typedef struct urma_jetty_cfg {
    uint32_t id;
    urma_jetty_flag_t flag;
    urma_jfs_cfg_t jfs_cfg;
    union {
        struct {
            urma_jfr_t *jfr;
            urma_jfc_t *jfc;
        } shared;
        urma_jfr_cfg_t *jfr_cfg; /* deprecated by liburma */
    };
    urma_jetty_grp_t *jetty_grp;
    uint64_t user_ctx;
} urma_jetty_cfg_t;

typedef enum urma_jetty_grp_policy {
    URMA_JETTY_GRP_POLICY_RR = 0,
    URMA_JETTY_GRP_POLICY_HASH_HINT = 1
} urma_jetty_grp_policy_t;

typedef enum urma_target_type {
    URMA_JFR = 0,
    URMA_JETTY,
    URMA_JETTY_GROUP
} urma_target_type_t;

typedef struct urma_rjetty {
    urma_jetty_id_t jetty_id;
    urma_transport_mode_t trans_mode;
    urma_jetty_grp_policy_t policy;
    urma_target_type_t type;
    urma_import_jetty_flag_t flag;
    urma_tp_type_t tp_type;
} urma_rjetty_t;

typedef struct urma_target_jetty {
    urma_context_t *urma_ctx;
    urma_jetty_id_t id;
    uint64_t handle;
    urma_transport_mode_t trans_mode;
    urma_tp_t tp;
    urma_target_type_t type;
    urma_import_jetty_flag_t flag;
    urma_jetty_grp_policy_t policy;
    urma_tp_type_t tp_type;
} urma_target_jetty_t;

typedef enum urma_jetty_attr_mask {
    JETTY_RX_THRESHOLD = 0x1,
    JETTY_STATE = 0x1 << 1
} urma_jetty_attr_mask_t;

typedef struct urma_jetty_attr {
    uint32_t mask;
    uint32_t rx_threshold;
    urma_jetty_state_t state;
} urma_jetty_attr_t;

typedef struct urma_jetty_opt {
    bool is_actived;
    urma_jfs_opt_t jfs_opt;
    uint64_t reserved[URMA_OPT_REVERSED_NUM];
} urma_jetty_opt_t;

typedef struct urma_jetty {
    urma_context_t *urma_ctx;
    urma_jetty_id_t jetty_id;
    urma_target_jetty_t *remote_jetty; /* set by urma_bind_jetty (RC) */
    urma_jetty_cfg_t jetty_cfg;
    uint64_t handle;
    pthread_mutex_t event_mutex;
    pthread_cond_t event_cond;
    uint32_t async_events_acked;
    urma_jetty_opt_t urma_jetty_opt;
} urma_jetty_t;

/* ---- segments ---- */

/* Packed: va sits at offset 20, misaligned, which cgo cannot express. */
typedef struct urma_ubva {
    urma_eid_t eid;
    uint32_t uasid;
    uint64_t va;
} __attribute__((packed)) urma_ubva_t;

typedef union urma_reg_seg_flag {
    struct {
        uint32_t token_policy : 3;
        uint32_t cacheable : 1;
        uint32_t dsva : 1;
        uint32_t access : 6; /* URMA_ACCESS_* */
        uint32_t non_pin : 1;
        uint32_t user_iova : 1;
        uint32_t token_id_valid : 1;
        uint32_t reserved : 18;
    } bs;
    uint32_t value;
} urma_reg_seg_flag_t;

typedef union urma_seg_attr {
    struct {
        uint32_t token_policy : 3;
        uint32_t cacheable : 1;
        uint32_t dsva : 1;
        uint32_t access : 6;
        uint32_t non_pin : 1;
        uint32_t user_iova : 1;
        uint32_t user_token_id : 1;
        uint32_t has_user_info : 1;
        uint32_t reserved : 17;
    } bs;
    uint32_t value;
} urma_seg_attr_t;

typedef union urma_import_seg_flag {
    struct {
        uint32_t cacheable : 1;
        uint32_t access : 6;
        uint32_t mapping : 1;
        uint32_t reserved : 24;
    } bs;
    uint32_t value;
} urma_import_seg_flag_t;

typedef union urma_token_id_flag {
    struct {
        uint32_t multi_seg : 1;
        uint32_t reserved : 31;
    } bs;
    uint32_t value;
} urma_token_id_flag_t;

typedef struct urma_token_id {
    urma_context_t *urma_ctx;
    uint32_t token_id;
    uint64_t handle;
    urma_ref_t ref;
    urma_token_id_flag_t flag;
} urma_token_id_t;

typedef struct urma_seg_cfg {
    uint64_t va;
    uint64_t len;
    urma_token_id_t *token_id; /* NULL: liburma allocates one */
    urma_token_t token_value;
    urma_reg_seg_flag_t flag;
    uint64_t user_ctx;
    uint64_t iova;
} urma_seg_cfg_t;

typedef struct urma_seg {
    urma_ubva_t ubva;
    uint64_t len;
    urma_seg_attr_t attr;
    uint32_t token_id;
} urma_seg_t;

typedef struct urma_target_seg {
    urma_seg_t seg;
    uint64_t user_ctx;
    uint64_t mva;
    urma_context_t *urma_ctx;
    urma_token_id_t *token_id;
    uint64_t handle;
} urma_target_seg_t;

/* ---- work requests and completion records ---- */

typedef struct urma_user_target_seg {
    urma_seg_attr_t attr;
    uint32_t token_id;
    urma_token_t token_value;
} urma_user_tseg_t;

typedef struct urma_sge {
    uint64_t addr;
    uint32_t len;
    urma_target_seg_t *tseg;
    urma_user_tseg_t *user_tseg;
} urma_sge_t;

typedef struct urma_sg {
    urma_sge_t *sge;
    uint32_t num_sge;
} urma_sg_t;

typedef union urma_jfs_wr_flag {
    struct {
        uint32_t place_order : 2;
        uint32_t comp_order : 1;
        uint32_t fence : 1;
        uint32_t solicited_enable : 1;
        uint32_t complete_enable : 1;
        uint32_t inline_flag : 1;
        uint32_t db_bypass : 1;
        uint32_t udf : 1;
        uint32_t has_drv_ext : 1;
        uint32_t reserved : 22;
    } bs;
    uint32_t value;
} urma_jfs_wr_flag_t;

typedef struct urma_rw_wr {
    urma_sg_t src;
    urma_sg_t dst;
    uint8_t target_hint;
    uint64_t notify_data;
} urma_rw_wr_t;

typedef struct urma_send_wr {
    urma_sg_t src;
    uint8_t target_hint;
    uint64_t imm_data;
    urma_target_seg_t *tseg;
} urma_send_wr_t;

typedef struct urma_cas_wr {
    urma_sge_t *dst;
    urma_sge_t *src;
    union {
        uint64_t cmp_data;
        uint64_t cmp_addr;
    };
    union {
        uint64_t swap_data;
        uint64_t swap_addr;
    };
} urma_cas_wr_t;

typedef struct urma_faa_wr {
    urma_sge_t *dst;
    urma_sge_t *src;
    union {
        uint64_t operand;
        uint64_t operand_addr;
    };
} urma_faa_wr_t;

typedef struct urma_jfs_wr {
    urma_opcode_t opcode;
    urma_jfs_wr_flag_t flag;
    urma_target_jetty_t *tjetty; /* ignored for an RC jetty: the bound one is used */
    uint64_t user_ctx;
    union {
        urma_rw_wr_t rw;
        urma_send_wr_t send;
        urma_cas_wr_t cas;
        urma_faa_wr_t faa;
    };
    struct urma_jfs_wr *next;
} urma_jfs_wr_t;

typedef struct urma_jfr_wr {
    urma_sg_t src;
    uint64_t user_ctx;
    struct urma_jfr_wr *next;
} urma_jfr_wr_t;

typedef union urma_cr_flag {
    struct {
        uint8_t s_r : 1;   /* 0 send, 1 receive */
        uint8_t jetty : 1; /* local_id names a jetty, not a JFS or JFR */
        uint8_t suspend_done : 1;
        uint8_t flush_err_done : 1;
        uint8_t reserved : 4;
    } bs;
    uint8_t value;
} urma_cr_flag_t;

typedef struct urma_cr_token {
    uint32_t token_id;
    urma_token_t token_value;
} urma_cr_token_t;

typedef struct urma_cr {
    urma_cr_status_t status;
    uint64_t user_ctx;
    urma_cr_opcode_t opcode; /* receives only */
    urma_cr_flag_t flag;
    uint32_t completion_len;
    uint32_t local_id;
    urma_jetty_id_t remote_id;
    union {
        uint64_t imm_data;
        urma_cr_token_t invalid_token;
    };
    uint32_t tpn;
    uintptr_t user_data;
} urma_cr_t;

/* ---- driver commands and logging (urma_types.h) ---- */

typedef struct urma_user_ctl_in {
    uint64_t addr; /* the command's input */
    uint32_t len;
    uint32_t opcode; /* the driver's command */
} urma_user_ctl_in_t;

typedef struct urma_user_ctl_out {
    uint64_t addr; /* where the driver writes its answer */
    uint32_t len;
    uint32_t reserved;
} urma_user_ctl_out_t;

typedef enum urma_vlog_level {
    URMA_VLOG_LEVEL_EMERG = 0,
    URMA_VLOG_LEVEL_ALERT = 1,
    URMA_VLOG_LEVEL_CRIT = 2,
    URMA_VLOG_LEVEL_ERR = 3,
    URMA_VLOG_LEVEL_WARNING = 4,
    URMA_VLOG_LEVEL_NOTICE = 5,
    URMA_VLOG_LEVEL_INFO = 6,
    URMA_VLOG_LEVEL_DEBUG = 7,
    URMA_VLOG_LEVEL_MAX = 8,
} urma_vlog_level_t;

/* ---- the functions pkg/urma/liburma calls (urma_api.h) ---- */

urma_status_t urma_init(urma_init_attr_t *conf);
urma_status_t urma_uninit(void);
urma_device_t **urma_get_device_list(int *num_devices);
void urma_free_device_list(urma_device_t **device_list);
urma_eid_info_t *urma_get_eid_list(urma_device_t *dev, uint32_t *cnt);
void urma_free_eid_list(urma_eid_info_t *eid_list);
urma_device_t *urma_get_device_by_name(char *dev_name);
urma_status_t urma_query_device(urma_device_t *dev, urma_device_attr_t *dev_attr);
urma_context_t *urma_create_context(urma_device_t *dev, uint32_t eid_index);
urma_status_t urma_delete_context(urma_context_t *ctx);
urma_jfce_t *urma_create_jfce(urma_context_t *ctx);
urma_status_t urma_delete_jfce(urma_jfce_t *jfce);
urma_jfc_t *urma_create_jfc(urma_context_t *ctx, urma_jfc_cfg_t *jfc_cfg);
urma_status_t urma_delete_jfc(urma_jfc_t *jfc);
urma_jfr_t *urma_create_jfr(urma_context_t *ctx, urma_jfr_cfg_t *jfr_cfg);
urma_status_t urma_delete_jfr(urma_jfr_t *jfr);
urma_jetty_t *urma_create_jetty(urma_context_t *ctx, urma_jetty_cfg_t *jetty_cfg);
urma_status_t urma_modify_jetty(urma_jetty_t *jetty, urma_jetty_attr_t *attr);
urma_status_t urma_delete_jetty(urma_jetty_t *jetty);
int urma_flush_jetty(urma_jetty_t *jetty, int cr_cnt, urma_cr_t *cr);
urma_target_jetty_t *urma_import_jetty(urma_context_t *ctx, urma_rjetty_t *rjetty, urma_token_t *token_value);
urma_status_t urma_unimport_jetty(urma_target_jetty_t *tjetty);
urma_status_t urma_bind_jetty(urma_jetty_t *jetty, urma_target_jetty_t *tjetty);
urma_status_t urma_unbind_jetty(urma_jetty_t *jetty);
urma_target_seg_t *urma_register_seg(urma_context_t *ctx, urma_seg_cfg_t *seg_cfg);
urma_status_t urma_unregister_seg(urma_target_seg_t *target_seg);
urma_target_seg_t *urma_import_seg(urma_context_t *ctx, urma_seg_t *seg, urma_token_t *token_value, uint64_t addr,
                                   urma_import_seg_flag_t flag);
urma_status_t urma_unimport_seg(urma_target_seg_t *tseg);
urma_status_t urma_post_jfr_wr(urma_jfr_t *jfr, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr);
urma_status_t urma_post_jetty_send_wr(urma_jetty_t *jetty, urma_jfs_wr_t *wr, urma_jfs_wr_t **bad_wr);
int urma_poll_jfc(urma_jfc_t *jfc, int cr_cnt, urma_cr_t *cr);
urma_status_t urma_rearm_jfc(urma_jfc_t *jfc, bool solicited_only);
int urma_wait_jfc(urma_jfce_t *jfce, uint32_t jfc_cnt, int time_out, urma_jfc_t *jfc[]);
void urma_ack_jfc(urma_jfc_t *jfc[], uint32_t nevents[], uint32_t jfc_cnt);

/* ---- and those cmd/liburma-soft implements besides ---- */

urma_status_t urma_user_ctl(urma_context_t *ctx, urma_user_ctl_in_t *in, urma_user_ctl_out_t *out);
urma_device_t *urma_get_device_by_eid(urma_eid_t eid, urma_transport_type_t type);
urma_status_t urma_post_jetty_recv_wr(urma_jetty_t *jetty, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr);
urma_vlog_level_t urma_log_get_level(void);
void urma_log_set_level(urma_vlog_level_t level);

#endif /* URMA_K8S_URMA_COMPAT_H */
