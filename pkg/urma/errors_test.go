package urma

import (
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

func TestErrorIsRejectsOtherErrorTypes(t *testing.T) {
	if errors.Is(Errorf("x", CodeInval, ""), syscall.EINVAL) {
		t.Error("*Error matched a bare syscall.Errno; Is should only compare *Error codes")
	}
	if errors.Is(errors.New("plain"), ErrInval) {
		t.Error("a plain error matched ErrInval")
	}
}
