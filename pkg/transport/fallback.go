package transport

import "fmt"

// fallback is a reason with its detail.
type fallback struct {
	reason Reason
	detail string
}

func (f fallback) String() string {
	if f.reason == "" {
		return ""
	}
	if f.detail == "" {
		return string(f.reason)
	}
	return string(f.reason) + ": " + f.detail
}

func fallbackf(r Reason, format string, args ...any) *fallback {
	return &fallback{reason: r, detail: fmt.Sprintf(format, args...)}
}
