package lifecycle

import (
	"errors"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

type obj struct {
	kind string
	log  *[]string
}

func (o *obj) Kind() string { return o.kind }
func (o *obj) ForceClose()  { *o.log = append(*o.log, o.kind) }

// A context with children refuses to close and says what is left; empty, it
// closes once; closed, it adopts nothing.
func TestClose(t *testing.T) {
	var c Children
	var log []string
	j, r := &obj{"jetty", &log}, &obj{"JFR", &log}
	for _, ch := range []Child{j, r, &obj{"jetty", &log}} {
		if err := c.Adopt(ch, "create"); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Close("delete_context")
	if !errors.Is(err, urma.ErrBusy) || !strings.Contains(err.Error(), "context still has 1 JFR, 2 jetty; destroy them first") {
		t.Fatalf("close with children: %v", err)
	}
	c = Children{}
	if done, err := c.Close("delete_context"); !done || err != nil {
		t.Fatalf("close an empty context: %v, %v", done, err)
	}
	if done, err := c.Close("delete_context"); done || err != nil {
		t.Fatalf("close twice: %v, %v", done, err)
	}
	if err := c.Adopt(j, "create_jetty"); !errors.Is(err, urma.ErrClosed) {
		t.Fatalf("adopt after close: %v", err)
	}
	if err := c.Check("create_jfc"); !errors.Is(err, urma.ErrClosed) {
		t.Fatalf("check after close: %v", err)
	}
}

// ForceClose destroys users before what they use.
func TestForceCloseOrder(t *testing.T) {
	var c Children
	var log []string
	for _, k := range []string{"segment", "JFCE", "JFC", "JFR", "remote segment", "remote jetty", "jetty"} {
		if err := c.Adopt(&obj{k, &log}, "create"); err != nil {
			t.Fatal(err)
		}
	}
	released := &obj{"jetty", &log}
	_ = c.Adopt(released, "create")
	c.Release(released)
	c.ForceClose()
	if got := strings.Join(log, ","); got != strings.Join(TeardownOrder, ",") {
		t.Fatalf("teardown order %s, want %s", got, strings.Join(TeardownOrder, ","))
	}
	if err := c.Check("x"); !errors.Is(err, urma.ErrClosed) {
		t.Fatalf("check after ForceClose: %v", err)
	}
}
