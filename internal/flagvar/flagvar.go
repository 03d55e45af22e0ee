// Package flagvar has the flag kinds the project's commands share beyond
// the standard library's: comma-separated lists and unsigned 32-bit
// numbers.
package flagvar

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// Split splits a comma-separated list, trimming spaces and dropping empty
// entries.
func Split(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// List registers a comma-separated list flag; each use replaces the list.
func List(fs *flag.FlagSet, dst *[]string, name, usage string) {
	fs.Func(name, usage, func(s string) error {
		*dst = Split(s)
		return nil
	})
}

// Uint32 registers an unsigned 32-bit number flag defaulting to *dst.
func Uint32(fs *flag.FlagSet, dst *uint32, name, usage string) {
	fs.Var((*uint32Value)(dst), name, usage)
}

type uint32Value uint32

func (v *uint32Value) String() string {
	if v == nil {
		return "0"
	}
	return fmt.Sprint(uint32(*v))
}

func (v *uint32Value) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil {
		return fmt.Errorf("%q is not an unsigned 32-bit number", s)
	}
	*v = uint32Value(n)
	return nil
}
