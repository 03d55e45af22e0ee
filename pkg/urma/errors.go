package urma

import (
	"errors"
	"fmt"
	"syscall"
)

// Code is a URMA API return code: errno-style values (EAGAIN, EINVAL, ...)
// plus URMA_FAIL.
type Code int

// Return codes (urma_status_t). The errno values are Linux's.
const (
	CodeSuccess     Code = 0
	CodeFail        Code = 0x1000 // URMA_FAIL: a generic failure
	CodeAgain       Code = Code(syscall.EAGAIN)
	CodeNoMem       Code = Code(syscall.ENOMEM)
	CodeAccess      Code = Code(syscall.EACCES)
	CodeBusy        Code = Code(syscall.EBUSY)
	CodeExist       Code = Code(syscall.EEXIST)
	CodeInval       Code = Code(syscall.EINVAL)
	CodeNoDev       Code = Code(syscall.ENODEV)
	CodeNoEnt       Code = Code(syscall.ENOENT)
	CodeNoSpace     Code = Code(syscall.ENOSPC)
	CodeTimeout     Code = Code(syscall.ETIMEDOUT)
	CodeConnRefused Code = Code(syscall.ECONNREFUSED)
	CodeNoSupport   Code = Code(syscall.EOPNOTSUPP)
)

func (c Code) String() string {
	switch c {
	case CodeSuccess:
		return "SUCCESS"
	case CodeFail:
		return "URMA_FAIL"
	}
	return syscall.Errno(c).Error()
}

// Error is the error every provider returns for a failed verb. Callers match
// it with errors.Is against the Err* sentinels (which compare Codes) or
// errors.As to read Op and Code. Cause, when set, is the failure below the
// verb (a system call's errno, a cancelled context, a provider's own
// sentinel): errors.Is and errors.As reach it too.
type Error struct {
	Op     string // the verb, e.g. "post_send"
	Code   Code
	Detail string // what exactly was wrong, for people
	Cause  error  // what failed underneath, already told in Detail; may be nil
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("urma %s: %s", e.Op, e.Code)
	}
	return fmt.Sprintf("urma %s: %s: %s", e.Op, e.Code, e.Detail)
}

// Is matches another *Error by Code, so errors.Is(err, urma.ErrAgain) works
// whatever the Op.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) {
		return false
	}
	return t.Code == e.Code
}

// Unwrap gives errors.Is and errors.As the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Errorf builds an *Error; providers use it so every failure names its verb.
// As with fmt.Errorf, a %w verb's operand (or several) becomes the Cause,
// so that callers can tell, say, a cancelled wait from a dead peer without
// parsing Detail. Wrap errors from below the verb, not other *Errors, whose
// codes would then match errors.Is as well.
func Errorf(op string, code Code, format string, args ...any) error {
	w := fmt.Errorf(format, args...)
	e := &Error{Op: op, Code: code, Detail: w.Error()}
	if c := errors.Unwrap(w); c != nil {
		e.Cause = c
	} else if m, ok := w.(interface{ Unwrap() []error }); ok { // several %w
		e.Cause = errors.Join(m.Unwrap()...)
	}
	return e
}

// Sentinels for errors.Is.
var (
	ErrFail        = &Error{Code: CodeFail}
	ErrAgain       = &Error{Code: CodeAgain} // queue full: posting past the depth
	ErrNoMem       = &Error{Code: CodeNoMem}
	ErrAccess      = &Error{Code: CodeAccess} // wrong token or access flags
	ErrBusy        = &Error{Code: CodeBusy}   // destroying an object others still use
	ErrInval       = &Error{Code: CodeInval}
	ErrNoDev       = &Error{Code: CodeNoDev}
	ErrNoEnt       = &Error{Code: CodeNoEnt}
	ErrTimeout     = &Error{Code: CodeTimeout}
	ErrClosed      = &Error{Code: Code(syscall.EBADF)} // object already destroyed
	ErrUnreachable = &Error{Code: CodeConnRefused}     // peer device cannot be reached
	ErrNoSupport   = &Error{Code: CodeNoSupport}
)
