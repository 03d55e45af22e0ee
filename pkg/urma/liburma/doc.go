// Package liburma is the hardware URMA provider: urma.Provider over openEuler
// UMDK's liburma, the user-space library of UB devices.
//
// The library is loaded at run time (dlopen of liburma.so.0, or the file
// $URMA_LIBRARY names), so a binary that imports this package builds, links
// and runs on machines without it; New then fails with an error naming the
// library. Builds without cgo, or for other systems than Linux, get New
// returning urma.ErrNoSupport. The device plugin and the operator do not
// import this package and stay static (CGO_ENABLED=0).
package liburma
