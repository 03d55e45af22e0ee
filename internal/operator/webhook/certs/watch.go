package certs

import (
	"context"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

type watchedConfig struct {
	name string
	list client.ObjectList
}

func (r *Rotator) watched() []watchedConfig {
	var out []watchedConfig
	for _, n := range r.MutatingWebhooks {
		out = append(out, watchedConfig{n, &admissionv1.MutatingWebhookConfigurationList{}})
	}
	for _, n := range r.ValidatingWebhooks {
		out = append(out, watchedConfig{n, &admissionv1.ValidatingWebhookConfigurationList{}})
	}
	return out
}

// watch sends on changed (without blocking) at every event on the named
// configuration, including the initial one of each new watch, until ctx
// ends. A watch that fails or ends in an error is started again after a
// growing delay.
func (r *Rotator) watch(ctx context.Context, list client.ObjectList, name string, changed chan<- struct{}) {
	backoff := time.Second
	for ctx.Err() == nil {
		began := time.Now()
		w, err := r.Watcher.Watch(ctx, list, client.MatchingFields{"metadata.name": name})
		failed := err != nil
		if err != nil {
			r.Log.Error(err, "cannot watch webhook configuration; relying on the periodic check until it works", "name", name, "retryIn", backoff)
		} else {
			// A watch the server ends at once is no better than an error:
			// do not spin on it.
			failed = r.drain(ctx, w, name, changed) || time.Since(began) < time.Second
		}
		if !failed {
			backoff = time.Second
			continue
		}
		wait := time.After
		if r.after != nil {
			wait = r.after
		}
		select {
		case <-ctx.Done():
		case <-wait(backoff):
		}
		backoff = min(backoff*2, maxWatchBackoff)
	}
}

// drain forwards one watch's events and reports whether it ended in error.
// It asks for a check once at the start too: a change between two watches
// would go unseen otherwise.
func (r *Rotator) drain(ctx context.Context, w watch.Interface, name string, changed chan<- struct{}) bool {
	defer w.Stop()
	notify(changed)
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false // the server ended the watch (timeout): watch again
			}
			if ev.Type == watch.Error {
				r.Log.Info("watch of webhook configuration ended in an error; watching again", "name", name,
					"error", apierrors.FromObject(ev.Object).Error())
				return true
			}
			notify(changed)
		}
	}
}

// notify asks for a check without blocking; one already due covers it.
func notify(changed chan<- struct{}) {
	select {
	case changed <- struct{}{}:
	default:
	}
}
