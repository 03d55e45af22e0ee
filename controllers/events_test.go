package controllers_test

import (
	"fmt"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
	"github.com/openeuler/urma-k8s/internal/eventually"
)

// TestLongMessagesStillRecordEvents: the events.k8s.io API refuses an
// event whose note is longer than 1024 bytes, and a Degraded message that
// describes many node groups is longer than that. The event must still be
// recorded, its note shortened; the full message stays in the condition.
func TestLongMessagesStillRecordEvents(t *testing.T) {
	ns := newNamespace(t)
	const group = "long-messages"
	for i := range 12 {
		newNode(t, group, hw(uint32(64+16*i), 4096, 8192))
	}
	ep := newEndpoint(ns, "ep", group)
	ep.Spec.Profile.InflightPerConnection = 1000
	create(t, ep)
	got := settled(t, ns, "ep", metav1.ConditionTrue)
	dg := condition(t, got, v1alpha1.ConditionDegraded)
	if dg.Reason != v1alpha1.ReasonNodeGroupsDiffer || len(dg.Message) <= 1024 {
		t.Fatalf("Degraded %s with a %d-byte message; the test needs NodeGroupsDiffer over 1024 bytes", dg.Reason, len(dg.Message))
	}
	eventually.Succeeds(t, "Degraded event", 0, func() error {
		var evs eventsv1.EventList
		if err := env.c.List(ctx(), &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == controllers.EventDegraded && e.Regarding.UID == got.UID {
				if len(e.Note) > 1024 {
					return fmt.Errorf("note of %d bytes", len(e.Note))
				}
				return nil
			}
		}
		return fmt.Errorf("no %s event among %d events", controllers.EventDegraded, len(evs.Items))
	})
}
