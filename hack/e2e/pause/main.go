//go:build unix

// Command pause is the pod sandbox ("pause") image's program for make e2e:
// it holds a pod's namespaces open until the runtime stops it. As PID 1 of a
// pod that shares its process namespace it also reaps orphaned children, as
// Kubernetes' own pause does. It is built static (CGO_ENABLED=0) and packed
// into an image by hack/e2e, so the node needs no registry.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("urma-k8s e2e pause")
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			// The runtime stops the sandbox: exit cleanly.
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
