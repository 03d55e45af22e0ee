package flagvar_test

import (
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/openeuler/urma-k8s/internal/flagvar"
)

func TestListAndUint32(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	list := []string{"default"}
	n := uint32(7)
	flagvar.List(fs, &list, "list", "")
	flagvar.Uint32(fs, &n, "n", "")
	if got := fs.Lookup("n").DefValue; got != "7" {
		t.Errorf("default shown as %q, want 7", got)
	}
	if err := fs.Parse([]string{"-list", " a, ,b ", "-n", "4294967295"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(list, []string{"a", "b"}) || n != 4294967295 {
		t.Fatalf("list %q n %d", list, n)
	}
	for _, bad := range []string{"-1", "4294967296", "x"} {
		if err := fs.Parse([]string{"-n", bad}); err == nil {
			t.Errorf("-n %s accepted", bad)
		}
	}
	if flagvar.Split("") != nil {
		t.Error("Split of an empty string is not empty")
	}
}
