package controllers

// RBAC the operator needs beyond the reconciler's own reads and writes.
//
// Setting blockOwnerDeletion on the ConfigMap's ownerReference requires
// update on the owner's finalizers subresource (OwnerReferencesPermission
// Enforcement); the operator adds no finalizer itself.
//
// +kubebuilder:rbac:groups=urma.openeuler.org,resources=urmaendpoints/finalizers,verbs=update
//
// Leader election: a Lease in the operator's namespace, and the events it
// records there. The chart renders this Role into its release namespace.
//
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=urma-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",namespace=urma-system,resources=events,verbs=create;patch
//
// The metrics endpoint authenticates scrapers with TokenReviews and
// authorizes them (get on the non-resource URL /metrics) with
// SubjectAccessReviews (controller-runtime's
// filters.WithAuthenticationAndAuthorization).
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
