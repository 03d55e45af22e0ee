package main

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	urmav1 "github.com/openeuler/urma-k8s/api/v1alpha1"
)

// formatBytes prints a byte count with a binary unit: 4096 -> "4 KiB".
func formatBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if n == float64(int64(n)) {
		return fmt.Sprintf("%d %s", int64(n), units[i])
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// formatStatus renders an UrmaEndpoint's status: conditions (with what was
// clamped and why), the device limits the flags were tuned against, the node
// groups and the pool each pod registers.
func formatStatus(s urmav1.UrmaEndpointStatus) string {
	var b strings.Builder
	if len(s.Conditions) == 0 {
		b.WriteString("no conditions yet\n")
	} else {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CONDITION\tSTATUS\tREASON\tMESSAGE")
		for _, c := range s.Conditions {
			msg := c.Message
			// A multi-clamp message is a list: one clamp per line reads best.
			msg = strings.ReplaceAll(msg, "; ", "\n\t\t\t")
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, msg)
		}
		tw.Flush()
	}
	if l := s.DeviceLimits; l != nil {
		fmt.Fprintf(&b, "device limits (%s): max depth jfs/jfr/jfc %d/%d/%d, max message %s",
			orText(string(s.LimitsSource), "unknown source"), l.MaxJFSDepth, l.MaxJFRDepth, l.MaxJFCDepth, formatBytes(float64(l.MaxMsgSize)))
		if l.JettiesPerDevice > 0 {
			fmt.Fprintf(&b, ", %d jetties per device", l.JettiesPerDevice)
		}
		b.WriteString("\n")
	} else if s.LimitsSource != "" {
		fmt.Fprintf(&b, "device limits: %s\n", s.LimitsSource)
	}
	for i, g := range s.NodeGroups {
		lim := "no node facts (software provider limits)"
		if g.Limits != nil {
			lim = fmt.Sprintf("jfs/jfr/jfc %d/%d/%d, max message %s", g.Limits.MaxJFSDepth, g.Limits.MaxJFRDepth, g.Limits.MaxJFCDepth, formatBytes(float64(g.Limits.MaxMsgSize)))
		}
		fmt.Fprintf(&b, "node group %d: %d node(s) %s: %s\n", i+1, g.NodeCount, strings.Join(g.Nodes, ","), lim)
	}
	if s.RegisteredBytesPerPod > 0 {
		fmt.Fprintf(&b, "registered (locked) memory per pod: %s\n", formatBytes(float64(s.RegisteredBytesPerPod)))
	}
	if s.ConfigMapName != "" {
		fmt.Fprintf(&b, "flags in ConfigMap %s, hash %s; pods: %d matched, %d on the current flags\n",
			s.ConfigMapName, orText(s.FlagsHash, "-"), s.MatchedPods, s.PodsOnCurrentFlags)
	}
	return b.String()
}

func orText(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
