package controllers

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// TestOwnDriverSlices: every endpoint retunes on a ResourceSlice event, so
// only the URMA DRA driver's slices may pass; a GPU driver's slices (which
// change with every device health update) must not wake them all.
func TestOwnDriverSlices(t *testing.T) {
	slice := func(driver string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s-" + driver},
			Spec: resourceapi.ResourceSliceSpec{Driver: driver, Pool: resourceapi.ResourcePool{Name: "n1"}}}
	}
	p := ownDriverSlices()
	for _, c := range []struct {
		driver string
		want   bool
	}{{slicefacts.DriverName, true}, {"gpu.example.com", false}, {"", false}} {
		s := slice(c.driver)
		got := map[string]bool{
			"create":  p.Create(event.CreateEvent{Object: s}),
			"update":  p.Update(event.UpdateEvent{ObjectOld: s, ObjectNew: s.DeepCopy()}),
			"delete":  p.Delete(event.DeleteEvent{Object: s}),
			"generic": p.Generic(event.GenericEvent{Object: s}),
		}
		for kind, pass := range got {
			if pass != c.want {
				t.Errorf("driver %q, %s: passes %v, want %v", c.driver, kind, pass, c.want)
			}
		}
	}
}
