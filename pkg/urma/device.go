package urma

// TransportType is the device's transport as ubcore reports it in the
// transport_type sysfs file.
type TransportType int

// Transport types (urma_transport_type_t).
const (
	TransportUB    TransportType = 0
	TransportIB    TransportType = 1
	TransportIP    TransportType = 2
	TransportHNSUB TransportType = 5
)

func (t TransportType) String() string {
	switch t {
	case TransportUB:
		return "UB"
	case TransportIB:
		return "IB"
	case TransportIP:
		return "IP"
	case TransportHNSUB:
		return "HNS_UB"
	}
	return "UNKNOWN"
}

// PortState is a port's state as ubcore reports it in port<N>/state.
type PortState int

// Port states (urma_port_state_t).
const (
	PortNOP         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNOP:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return "UNKNOWN"
}

// Usable reports whether traffic can flow through a port in this state: only
// ACTIVE and ACTIVE_DEFER carry traffic.
func (s PortState) Usable() bool { return s == PortActive || s == PortActiveDefer }

// TransMode is a bit set of the transport modes a device supports.
type TransMode uint32

// Transport mode bits (URMA_TM_*).
const (
	TransModeRM TransMode = 1 << 0 // reliable message, connectionless
	TransModeRC TransMode = 1 << 1 // reliable connection, one-to-one
	TransModeUM TransMode = 1 << 2 // unreliable message
)

// Range is an inclusive range of jetty ids.
type Range struct {
	Min uint32 `json:"min"`
	Max uint32 `json:"max"`
}

// Len is the number of ids in the range; an empty range (Max < Min) has none.
func (r Range) Len() uint32 {
	if r.Max < r.Min {
		return 0
	}
	return r.Max - r.Min + 1
}

// DeviceCaps are the capabilities a device reports (urma_device_cap_t and the
// ubcore sysfs files of the same names).
type DeviceCaps struct {
	Feature          uint32    `json:"feature"`
	MaxJFC           uint32    `json:"maxJfc"`
	MaxJFS           uint32    `json:"maxJfs"`
	MaxJFR           uint32    `json:"maxJfr"`
	MaxJetty         uint32    `json:"maxJetty"`
	MaxJettyGrp      uint32    `json:"maxJettyGrp"`
	MaxJFCDepth      uint32    `json:"maxJfcDepth"`
	MaxJFSDepth      uint32    `json:"maxJfsDepth"`
	MaxJFRDepth      uint32    `json:"maxJfrDepth"`
	MaxJFSInlineSize uint32    `json:"maxJfsInlineSize"`
	MaxJFSSge        uint32    `json:"maxJfsSge"`
	MaxJFSRsge       uint32    `json:"maxJfsRsge"`
	MaxJFRSge        uint32    `json:"maxJfrSge"`
	MaxMsgSize       uint64    `json:"maxMsgSize"`
	TransMode        TransMode `json:"transMode"`
	PortCount        uint32    `json:"portCount"`
	MaxEIDCnt        uint32    `json:"maxEidCnt"`
	// OrderedRM reports that RM jetties deliver in order (order_type OT with
	// rm_order_cap); a byte stream over RM needs it.
	OrderedRM bool `json:"orderedRM"`
}

// Port is one port of a device.
type Port struct {
	Index       int       `json:"index"`
	State       PortState `json:"state"`
	MaxMTU      uint32    `json:"maxMtu,omitempty"`
	ActiveMTU   uint32    `json:"activeMtu,omitempty"`
	ActiveSpeed uint32    `json:"activeSpeed,omitempty"`
	ActiveWidth uint32    `json:"activeWidth,omitempty"`
}

// EIDEntry is one populated slot of a device's EID table.
type EIDEntry struct {
	Index int `json:"index"`
	EID   EID `json:"eid"`
}

// DeviceInfo describes a device as a provider lists it.
type DeviceInfo struct {
	Name          string        `json:"name"`
	Driver        string        `json:"driver"`
	TransportType TransportType `json:"transportType"`
	GUID          string        `json:"guid,omitempty"`
	Caps          DeviceCaps    `json:"caps"`
	ReservedJetty Range         `json:"reservedJetty"`
	Ports         []Port        `json:"ports"`
	EIDs          []EIDEntry    `json:"eids"`
}

// Bonding reports whether the device aggregates other devices; bonding
// devices are named bonding_dev_<N> and must be given a bonding mode right
// after their context is created.
func (d *DeviceInfo) Bonding() bool {
	return len(d.Name) >= len("bonding") && d.Name[:len("bonding")] == "bonding"
}

// HasUsablePort reports whether some port is ACTIVE or ACTIVE_DEFER.
func (d *DeviceInfo) HasUsablePort() bool {
	for _, p := range d.Ports {
		if p.State.Usable() {
			return true
		}
	}
	return false
}
