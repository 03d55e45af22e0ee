package inventory

import (
	"flag"

	"github.com/openeuler/urma-k8s/internal/flagvar"
	"github.com/openeuler/urma-k8s/internal/node/selection"
)

// AddFlags registers the flags every command that discovers devices takes
// (the device plugin's serve and discover, the DRA driver): the host
// reserve, selection and software devices. The unit flags are the device
// plugin's own.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	flagvar.Uint32(fs, &c.Budget.HostReserve, "host-reserve", "jetties per device kept for host processes and never advertised")
	flagvar.List(fs, &c.Selection.Include, "include", "comma-separated glob patterns; only matching device names are advertised (default: all)")
	flagvar.List(fs, &c.Selection.Exclude, "exclude", "comma-separated glob patterns of device names never advertised")
	flagvar.List(fs, &c.Selection.Drivers, "drivers", "comma-separated driver names to advertise (default: any)")
	fs.Func("transports", "comma-separated transport types to advertise: UB, IB, IP, HNS_UB or numbers (default: any)", func(s string) error {
		c.Selection.Transports = nil
		for _, part := range flagvar.Split(s) {
			t, err := selection.ParseTransport(part)
			if err != nil {
				return err
			}
			c.Selection.Transports = append(c.Selection.Transports, t)
		}
		return nil
	})
	fs.Func("bonding", "bonding policy: auto (only bonding devices when any exists), only, never, all (default auto)", func(s string) error {
		c.Selection.Bonding = selection.BondingPolicy(s)
		return nil
	})
	fs.IntVar(&c.SoftDevices, "soft-devices", c.SoftDevices, "advertise this many software-provider devices (soft0, soft1, ...) for nodes without UB hardware")
	flagvar.Uint32(fs, &c.SoftJetties, "soft-jetties", "max_jetty of each software device")
}

// AddHealthFlags registers the health debounce flags.
func (c *Config) AddHealthFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Debounce.Observations, "health-debounce-scans", c.Debounce.Observations, "consecutive scans a health change must be seen in before it is reported")
	fs.DurationVar(&c.Debounce.Hold, "health-debounce-hold", c.Debounce.Hold, "least time a health change must persist before it is reported")
}
