package liburma

import "github.com/go-logr/logr"

// DefaultLibrary is the shared object New loads when neither Options.Library
// nor $URMA_LIBRARY names one: the SONAME the umdk-urma runtime package
// installs.
const DefaultLibrary = "liburma.so.0"

// EnvLibrary names the environment variable that overrides the library.
const EnvLibrary = "URMA_LIBRARY"

// Name is what Provider.Name reports.
const Name = "liburma"

// Options configures New.
type Options struct {
	// Library is the shared object to load: a file name for the dynamic
	// linker's search or a path. "" takes $URMA_LIBRARY, then
	// DefaultLibrary.
	Library string
	// Logger receives what the provider notices outside any call's error;
	// zero discards.
	Logger logr.Logger
}
