package certs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// scriptedWatcher answers Watch from a function; nothing else of
// client.WithWatch is used by the rotator's watch loop.
type scriptedWatcher struct {
	client.WithWatch
	watch func() (watch.Interface, error)
}

func (s scriptedWatcher) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return s.watch()
}

// watchLoop runs the rotator's watch of one configuration until the test
// ends, with its waits between watches reported on the returned channel.
// A wait returns at once, or never when block is set.
func watchLoop(t *testing.T, w func() (watch.Interface, error), block bool) (waits <-chan time.Duration, changed <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	delays := make(chan time.Duration)
	r := &Rotator{Log: testr.New(t), Watcher: scriptedWatcher{watch: w}}
	r.after = func(d time.Duration) <-chan time.Time {
		c := make(chan time.Time, 1)
		select {
		case delays <- d:
			if !block {
				c <- time.Time{}
			}
		case <-ctx.Done():
		}
		return c
	}
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.watch(ctx, &admissionv1.MutatingWebhookConfigurationList{}, "urma-operator-mutating", ch)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return delays, ch
}

func TestWatchBacksOffWhileWatchesFail(t *testing.T) {
	tests := []struct {
		name  string
		watch func() (watch.Interface, error)
	}{
		{"watch refused", func() (watch.Interface, error) { return nil, errors.New("forbidden") }},
		// The server ending every watch at once must not make a busy loop.
		{"watch ended at once", func() (watch.Interface, error) {
			w := watch.NewFake()
			w.Stop()
			return w, nil
		}},
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 32 * time.Second, maxWatchBackoff, maxWatchBackoff}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			waits, _ := watchLoop(t, tt.watch, false)
			for i, w := range want {
				select {
				case got := <-waits:
					if got != w {
						t.Fatalf("wait %d: %v, want %v", i, got, w)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("no wait %d before watching again", i)
				}
			}
		})
	}
}

func TestWatchEventsAskForChecksAndErrorsEndTheWatch(t *testing.T) {
	fw := watch.NewFake()
	waits, changed := watchLoop(t, func() (watch.Interface, error) { return fw, nil }, true)
	const timeout = 10 * time.Second
	select {
	case <-changed: // each new watch asks for a check
	case <-time.After(timeout):
		t.Fatal("a new watch asked for no check")
	}
	fw.Modify(&admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "urma-operator-mutating"}})
	select {
	case <-changed:
	case d := <-waits:
		t.Fatalf("a change ended the watch (watching again after %v)", d)
	case <-time.After(timeout):
		t.Fatal("a change asked for no check")
	}
	fw.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	select {
	case d := <-waits:
		if d != time.Second {
			t.Errorf("watching again after %v, want the first backoff of 1s", d)
		}
	case <-changed:
		t.Fatal("an error event was taken for a change")
	case <-time.After(timeout):
		t.Fatal("an error event did not end the watch")
	}
}
