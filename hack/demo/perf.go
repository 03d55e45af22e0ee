package main

import (
	"context"
	"errors"
)

// runPerf runs urma-perf's server and clients over the software provider.
func (d *demo) runPerf(ctx context.Context) error {
	return errors.New("not written yet")
}
