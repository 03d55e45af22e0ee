// Package webhook holds the operator's admission webhooks: the pod mutator
// that gives pods labelled urma.openeuler.org/endpoint=<name> their flags,
// jetty request and flags hash, and the UrmaEndpoint validator that rejects
// bad overrides and warns about what the hardware will clamp.
//
// Files by concern: pod.go is the pod webhook's handler (the reads it
// makes, what it answers); inject.go the pure injection it applies
// (Inject, its Injection and Report); volume.go the analysis of the pod's
// own flags volume and projected sources; env.go and expand.go the
// container environment (which entry of URMA_FLAGS_FILE takes effect, its
// $(VAR) references, envFrom sources); claims.go the DRA ResourceClaims a
// container gets instead of units; endpoint.go the UrmaEndpoint validator;
// register.go the wiring into the manager.
package webhook
