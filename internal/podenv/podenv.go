// Package podenv is the environment a URMA container gets: the names of the
// variables the node drivers (device plugin and DRA driver) and the
// operator's pod webhook set, and the format of URMA_DEVICES. pkg/transport
// reads them through this package, so writer and reader cannot drift apart.
//
// It imports nothing but the standard library, so that every side can
// depend on it: the drivers, the webhook and pkg/transport (and through it
// every workload).
package podenv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Variables set by the node drivers at allocation (the device plugin's
// Allocate answer, the DRA driver's CDI spec).
const (
	// Device names the device the container opens: the one holding most
	// of its jetties (ties: by name).
	Device = "URMA_DEVICE"
	// JettyBudget is the jetties (not units) the container may use on
	// Device.
	JettyBudget = "URMA_JETTY_BUDGET"
	// EID is Device's lowest-index EID (hardware devices only).
	EID = "URMA_EID"
	// Devices lists every device of the container with its jetties, most
	// first, when they are more than one: FormatDevices and ParseDevices.
	Devices = "URMA_DEVICES"
	// Provider is ProviderSoft when Device is a software-provider device.
	Provider = "URMA_PROVIDER"
	// ShmDir is the directory where the software providers of the pods of
	// one node meet for shared memory, mounted at the same path as on the
	// host.
	ShmDir = "URMA_SHM_DIR"
	// ShmSocketDir is the container's own subdirectory of ShmDir, where
	// its shm device creates its socket; unset, it is ShmDir itself.
	ShmSocketDir = "URMA_SHM_SOCKET_DIR"
)

// ProviderSoft is Provider's value for software devices.
const ProviderSoft = "soft"

// FlagsFile is set by the operator's pod webhook: the path of the mounted
// urma_* flags file (the gflags format of pkg/transport/flags).
const FlagsFile = "URMA_FLAGS_FILE"

// MaxDeviceName bounds a device name in Devices: UBCORE_MAX_DEV_NAME (64)
// less the terminating NUL, as sysfs discovery bounds it.
const MaxDeviceName = 63

// MaxJetties bounds a device's jetties in Devices: a device's jetty count
// is a uint32 (urma.DeviceCaps.MaxJetty).
const MaxJetties = 1<<32 - 1

// DeviceJetties is one device of a container and its jetties there.
type DeviceJetties struct {
	Device string
	// Jetties is the device's jetty budget; 0 when the entry names the
	// device alone (a hand-written "udma0").
	Jetties uint64
}

// FormatDevices writes Devices' value: "udma0:64,udma1:32", in the order
// given (the drivers give most jetties first).
func FormatDevices(list []DeviceJetties) string {
	var b strings.Builder
	for i, d := range list {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(d.Device)
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(d.Jetties, 10))
	}
	return b.String()
}

// ParseDevices reads Devices' value, in order. Each comma-separated entry is
// "<device>:<jetties>" as FormatDevices writes it, or a bare "<device>"
// (Jetties 0); spaces around entries and empty entries are ignored. An
// empty device name, one longer than MaxDeviceName or holding a space, and
// a jetty count that is not a decimal integer in 1..MaxJetties, are errors
// naming the entry.
func ParseDevices(v string) ([]DeviceJetties, error) {
	var out []DeviceJetties
	for entry := range strings.SplitSeq(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, count, hasCount := strings.Cut(entry, ":")
		if err := checkName(name); err != nil {
			return nil, fmt.Errorf("%s entry %q: %w", Devices, entry, err)
		}
		d := DeviceJetties{Device: name}
		if hasCount {
			n, err := strconv.ParseUint(count, 10, 32)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("%s entry %q: jetties %q is not an integer in 1..%d", Devices, entry, count, MaxJetties)
			}
			d.Jetties = n
		}
		out = append(out, d)
	}
	return out, nil
}

func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty device name")
	case len(name) > MaxDeviceName:
		return fmt.Errorf("device name longer than %d bytes", MaxDeviceName)
	case strings.ContainsAny(name, " \t\n\r\v\f"):
		return errors.New("device name holds a space")
	}
	return nil
}
