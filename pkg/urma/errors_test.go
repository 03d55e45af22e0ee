package urma

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestCodeString(t *testing.T) {
	tests := []struct {
		code Code
		want string
	}{
		{CodeSuccess, "SUCCESS"},
		{CodeFail, "URMA_FAIL"},
		{CodeAgain, syscall.EAGAIN.Error()},
		{CodeInval, syscall.EINVAL.Error()},
		{CodeNoSupport, syscall.EOPNOTSUPP.Error()},
	}
	for _, tc := range tests {
		if got := tc.code.String(); got != tc.want {
			t.Errorf("Code(%d).String() = %q, want %q", int(tc.code), got, tc.want)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"no detail", &Error{Op: "post_send", Code: CodeAgain}, "urma post_send: " + syscall.EAGAIN.Error()},
		{"detail", &Error{Op: "import_seg", Code: CodeAccess, Detail: "token mismatch"}, "urma import_seg: " + syscall.EACCES.Error() + ": token mismatch"},
		{"Errorf formats", Errorf("create_jfc", CodeInval, "depth %d above max %d", 9000, 4096), "urma create_jfc: " + syscall.EINVAL.Error() + ": depth 9000 above max 4096"},
		{"URMA_FAIL", Errorf("open", CodeFail, "x"), "urma open: URMA_FAIL: x"},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%s: Error() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestErrorIsMatchesCodeNotOp(t *testing.T) {
	sentinels := []struct {
		name string
		err  *Error
	}{
		{"ErrFail", ErrFail}, {"ErrAgain", ErrAgain}, {"ErrNoMem", ErrNoMem}, {"ErrAccess", ErrAccess},
		{"ErrInval", ErrInval}, {"ErrNoDev", ErrNoDev}, {"ErrNoEnt", ErrNoEnt}, {"ErrTimeout", ErrTimeout},
		{"ErrClosed", ErrClosed}, {"ErrUnreachable", ErrUnreachable}, {"ErrNoSupport", ErrNoSupport},
	}
	for _, s := range sentinels {
		err := Errorf("some_verb", s.err.Code, "detail")
		wrapped := fmt.Errorf("while doing a thing: %w", err)
		for _, other := range sentinels {
			want := other.err.Code == s.err.Code
			if got := errors.Is(wrapped, other.err); got != want {
				t.Errorf("errors.Is(%s-coded error, %s) = %v, want %v", s.name, other.name, got, want)
			}
		}
	}
}

func TestSentinelCodesAreDistinct(t *testing.T) {
	seen := map[Code]string{}
	for name, e := range map[string]*Error{
		"ErrFail": ErrFail, "ErrAgain": ErrAgain, "ErrNoMem": ErrNoMem, "ErrAccess": ErrAccess,
		"ErrInval": ErrInval, "ErrNoDev": ErrNoDev, "ErrNoEnt": ErrNoEnt, "ErrTimeout": ErrTimeout,
		"ErrClosed": ErrClosed, "ErrUnreachable": ErrUnreachable, "ErrNoSupport": ErrNoSupport,
	} {
		if prev, dup := seen[e.Code]; dup {
			t.Errorf("%s and %s share code %v: errors.Is could not tell them apart", name, prev, e.Code)
		}
		seen[e.Code] = name
	}
}

func TestErrorAsReadsOpAndCode(t *testing.T) {
	err := fmt.Errorf("dial: %w", Errorf("import_jetty", CodeConnRefused, "peer %s", "::1"))
	var ue *Error
	if !errors.As(err, &ue) {
		t.Fatalf("errors.As found no *Error in %v", err)
	}
	if ue.Op != "import_jetty" || ue.Code != CodeConnRefused || ue.Detail != "peer ::1" {
		t.Fatalf("got %+v", *ue)
	}
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a CONNREFUSED error is not ErrUnreachable")
	}
}

func TestErrorfKeepsWrappedCause(t *testing.T) {
	errCanceled := context.Canceled
	tests := []struct {
		name      string
		err       error
		detail    string
		causes    []error // errors.Is finds each
		notCauses []error // and none of these
	}{
		{"no %w", Errorf("poll", CodeFail, "poll eventfd: %v", syscall.EBADF), "poll eventfd: " + syscall.EBADF.Error(),
			nil, []error{syscall.EBADF}},
		{"errno", Errorf("poll", CodeFail, "poll eventfd: %w", syscall.EBADF), "poll eventfd: " + syscall.EBADF.Error(),
			[]error{syscall.EBADF, ErrFail}, []error{syscall.EINVAL, ErrTimeout}},
		{"context", Errorf("import", CodeTimeout, "connect to %s: %w", "peer", errCanceled), "connect to peer: context canceled",
			[]error{errCanceled, ErrTimeout}, []error{context.DeadlineExceeded, ErrUnreachable}},
		{"two causes", Errorf("import", CodeConnRefused, "%w after %w", syscall.ECONNRESET, errCanceled), syscall.ECONNRESET.Error() + " after context canceled",
			[]error{syscall.ECONNRESET, errCanceled, ErrUnreachable}, []error{syscall.EPIPE}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ue *Error
			if !errors.As(tc.err, &ue) || ue.Detail != tc.detail {
				t.Fatalf("got %#v, want Detail %q", tc.err, tc.detail)
			}
			for _, c := range tc.causes {
				if !errors.Is(tc.err, c) {
					t.Errorf("errors.Is(%v, %v) = false, want true", tc.err, c)
				}
			}
			for _, c := range tc.notCauses {
				if errors.Is(tc.err, c) {
					t.Errorf("errors.Is(%v, %v) = true, want false", tc.err, c)
				}
			}
		})
	}
	var errno syscall.Errno
	if err := fmt.Errorf("wait: %w", Errorf("wait_jfc", CodeFail, "poll: %w", syscall.EINTR)); !errors.As(err, &errno) || errno != syscall.EINTR {
		t.Errorf("errors.As found errno %v through two wraps, want EINTR", errno)
	}
}

func TestErrorIsRejectsOtherErrorTypes(t *testing.T) {
	if errors.Is(Errorf("x", CodeInval, ""), syscall.EINVAL) {
		t.Error("*Error matched a bare syscall.Errno; Is should only compare *Error codes")
	}
	if errors.Is(errors.New("plain"), ErrInval) {
		t.Error("a plain error matched ErrInval")
	}
}
