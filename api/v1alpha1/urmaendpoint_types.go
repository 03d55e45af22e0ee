package v1alpha1

import (
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Names shared by the operator, its webhook and the workloads.
const (
	// LabelEndpoint on a pod names the UrmaEndpoint (in the pod's namespace)
	// whose flags the pod runs with. Only pods with this label are sent to
	// the pod webhook and counted in status.
	LabelEndpoint = "urma.openeuler.org/endpoint"
	// AnnotationFlagsHash on a pod is the hash of the flags it was given at
	// admission; on the ConfigMap it is the hash of its urma.flags.
	AnnotationFlagsHash = "urma.openeuler.org/flags-hash"
	// AnnotationDeviceLimits on the ConfigMap records the device limits the
	// flags were tuned against (JSON), so that a transiently empty node read
	// keeps them instead of falling back to other limits.
	AnnotationDeviceLimits = "urma.openeuler.org/device-limits"
	// ConfigMapKeyFlags holds the flags, one --urma_name=value a line.
	ConfigMapKeyFlags = "urma.flags"
	// ConfigMapKeyHash holds the hash of ConfigMapKeyFlags.
	ConfigMapKeyHash = "urma.flags.hash"
	// ConfigMapSuffix is appended to the endpoint's name to name its ConfigMap.
	ConfigMapSuffix = "-urma-flags"
	// FlagsMountPath is where the pod webhook mounts the ConfigMap.
	FlagsMountPath = "/etc/urma"
)

// ConfigMapName is the name of the ConfigMap the operator renders for the
// endpoint named endpoint.
func ConfigMapName(endpoint string) string { return endpoint + ConfigMapSuffix }

// ClaimTemplateSuffix ends the name of the ResourceClaimTemplate the
// operator keeps for an endpoint when the cluster runs the DRA driver.
const ClaimTemplateSuffix = "-urma-jetties"

// ClaimTemplateName is the ResourceClaimTemplate of the endpoint named
// endpoint: one request for its jettyBudget jetties (DRA driver).
func ClaimTemplateName(endpoint string) string { return endpoint + ClaimTemplateSuffix }

// ControlledByPredecessor reports whether obj is controlled by an earlier
// UrmaEndpoint of ep's name (deleted and created again, so another UID).
// The garbage collector deletes such an object: until then it is neither
// ep's nor someone else's conflicting one.
func ControlledByPredecessor(obj metav1.Object, ep *UrmaEndpoint) bool {
	ref := metav1.GetControllerOfNoCopy(obj)
	return ref != nil && ref.Kind == "UrmaEndpoint" && ref.Name == ep.Name && ref.UID != ep.UID &&
		strings.HasPrefix(ref.APIVersion, GroupVersion.Group+"/")
}

// Objective is what a workload optimises for.
// +kubebuilder:validation:Enum=Latency;Throughput;Balanced
type Objective string

// Objectives.
const (
	ObjectiveLatency    Objective = "Latency"
	ObjectiveThroughput Objective = "Throughput"
	ObjectiveBalanced   Objective = "Balanced"
)

// CompletionMode is how the transport learns that work completed.
// +kubebuilder:validation:Enum=Auto;Event;Polling
type CompletionMode string

// Completion modes.
const (
	// CompletionAuto picks polling for Latency and events otherwise.
	CompletionAuto    CompletionMode = "Auto"
	CompletionEvent   CompletionMode = "Event"
	CompletionPolling CompletionMode = "Polling"
)

// BondingMode is the mode of a bonding device.
// +kubebuilder:validation:Enum=Standalone;ActiveBackup;Balance
type BondingMode string

// Bonding modes (urma_bonding_mode 0, 1, 2).
const (
	BondingStandalone   BondingMode = "Standalone"
	BondingActiveBackup BondingMode = "ActiveBackup"
	BondingBalance      BondingMode = "Balance"
)

// BondingLevel is the level at which a bonding device bonds.
// +kubebuilder:validation:Enum=IODIE;Port
type BondingLevel string

// Bonding levels (urma_bonding_level 0, 1).
const (
	BondingLevelIODIE BondingLevel = "IODIE"
	BondingLevelPort  BondingLevel = "Port"
)

// TrafficProfile says what a pod's traffic looks like.
// +kubebuilder:validation:XValidation:rule="quantity(string(self.messageSize)).isGreaterThan(quantity('0'))",message="spec.profile.messageSize must be positive"
// +kubebuilder:validation:XValidation:rule="quantity(string(self.messageSize)).compareTo(quantity('1Ti')) <= 0",message="spec.profile.messageSize must be at most 1Ti"
// +kubebuilder:validation:XValidation:rule="!has(self.maxMessageSize) || quantity(string(self.maxMessageSize)).compareTo(quantity('1Ti')) <= 0",message="spec.profile.maxMessageSize must be at most 1Ti"
// +kubebuilder:validation:XValidation:rule="!has(self.maxMessageSize) || quantity(string(self.messageSize)).compareTo(quantity(string(self.maxMessageSize))) <= 0",message="spec.profile.messageSize must not exceed spec.profile.maxMessageSize"
// +kubebuilder:validation:XValidation:rule="!has(self.memoryBudget) || quantity(string(self.memoryBudget)).compareTo(quantity('16Ki')) >= 0",message="spec.profile.memoryBudget must be at least 16Ki (16 buffers of 1Ki)"
// +kubebuilder:validation:XValidation:rule="!has(self.memoryBudget) || quantity(string(self.memoryBudget)).compareTo(quantity('1Ei')) <= 0",message="spec.profile.memoryBudget must be at most 1Ei"
type TrafficProfile struct {
	// MessageSize is the typical message, in bytes ("4Ki"). Buffers are
	// sized so that one holds such a message.
	MessageSize resource.Quantity `json:"messageSize"`
	// MaxMessageSize is the largest message; queues are deep enough to have
	// one in flight at once. Defaults to messageSize.
	// +optional
	MaxMessageSize *resource.Quantity `json:"maxMessageSize,omitempty"`
	// ConnectionsPerPod is how many URMA connections one pod holds.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	// +kubebuilder:default=1
	// +optional
	ConnectionsPerPod int32 `json:"connectionsPerPod,omitempty"`
	// InflightPerConnection is how many messages a connection has in flight
	// at once. At most 4093: a queue holds 4096 entries, 3 kept for credits.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4093
	// +kubebuilder:default=32
	// +optional
	InflightPerConnection int32 `json:"inflightPerConnection,omitempty"`
	// Objective is what to optimise for: Latency, Throughput or Balanced.
	// +kubebuilder:default=Balanced
	// +optional
	Objective Objective `json:"objective,omitempty"`
	// MemoryBudget caps the registered (and locked) buffer pool per pod:
	// 16Ki to 1Ei. Without it the pool is as large as the queues need.
	// +optional
	MemoryBudget *resource.Quantity `json:"memoryBudget,omitempty"`
}

// Bonding configures bonding devices.
type Bonding struct {
	// Mode of the bonding device.
	// +kubebuilder:default=Standalone
	// +optional
	Mode BondingMode `json:"mode,omitempty"`
	// Level at which the device bonds.
	// +kubebuilder:default=IODIE
	// +optional
	Level BondingLevel `json:"level,omitempty"`
}

// FlagValue is the text value of one urma_* flag, as in a gflags file: one
// word, since the file has one --flag=value per line and a newline in a value
// would add flags of its own (pkg/transport/flags refuses the same
// characters, naming the one it found).
// +kubebuilder:validation:MaxLength=256
// +kubebuilder:validation:XValidation:rule="!self.matches(r'[\\p{Cc}\\p{Z}]')",message="a flag value must be one word: no newline, other whitespace or control characters"
type FlagValue string

// UrmaEndpointSpec declares a workload's traffic; the operator derives the
// transport flags from it.
type UrmaEndpointSpec struct {
	// NodeSelector picks the nodes whose device limits the flags are tuned
	// against before any pod runs (nodes with URMA device facts only).
	// Nodes of running pods are always included. Empty means every node
	// with URMA devices.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// JettyBudget is the jetties each URMA container (see containers)
	// requests as urma.openeuler.org/jetty, unless it already requests some.
	// Kubelet allocates devices per container: every container that opens a
	// URMA device needs its own request to get the device node and
	// URMA_DEVICE.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	JettyBudget int32 `json:"jettyBudget"`
	// Containers names the pod's containers (and init containers) that use
	// URMA: each gets the flags and its own jetty request. Empty means every
	// container and init container of the pod. Names a pod does not have
	// are ignored with an admission warning.
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Containers []string `json:"containers,omitempty"`
	// Profile describes the traffic.
	Profile TrafficProfile `json:"profile"`
	// Completion is the completion mode; Auto derives it from the objective.
	// +kubebuilder:default=Auto
	// +optional
	Completion CompletionMode `json:"completion,omitempty"`
	// HandshakeVersion is the hello clients send: 2 (binary, every brpc
	// release with URMA) or 3 (protobuf).
	// +kubebuilder:validation:Enum=2;3
	// +kubebuilder:default=2
	// +optional
	HandshakeVersion int32 `json:"handshakeVersion,omitempty"`
	// Bonding configures bonding devices.
	// +optional
	Bonding *Bonding `json:"bonding,omitempty"`
	// Overrides sets urma_* flags by hand (full flag names, values as in a
	// gflags file, e.g. urma_sq_size: "256"). They replace what the rules
	// derive; device limits still clamp them, and the Clamped condition
	// says so.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k in ['urma_bonding_level', 'urma_bonding_mode', 'urma_buffer_count', 'urma_buffer_size', 'urma_client_handshake_version', 'urma_cqe_poll_once', 'urma_device', 'urma_disable_bthread', 'urma_max_sge', 'urma_poller_num', 'urma_poller_yield', 'urma_prepared_jetty_cnt', 'urma_recv_zerocopy', 'urma_rq_size', 'urma_sq_size', 'urma_use_polling', 'urma_zerocopy_min_size'])",message="spec.overrides: unknown flag; the known flags are urma_bonding_level, urma_bonding_mode, urma_buffer_count, urma_buffer_size, urma_client_handshake_version, urma_cqe_poll_once, urma_device, urma_disable_bthread, urma_max_sge, urma_poller_num, urma_poller_yield, urma_prepared_jetty_cnt, urma_recv_zerocopy, urma_rq_size, urma_sq_size, urma_use_polling, urma_zerocopy_min_size"
	// +kubebuilder:validation:XValidation:rule="!('urma_sq_size' in self) || (self['urma_sq_size'].matches('^[0-9]{1,4}$') && int(self['urma_sq_size']) >= 16 && int(self['urma_sq_size']) <= 4096)",message="spec.overrides.urma_sq_size must be an integer from 16 to 4096"
	// +kubebuilder:validation:XValidation:rule="!('urma_rq_size' in self) || (self['urma_rq_size'].matches('^[0-9]{1,4}$') && int(self['urma_rq_size']) >= 16 && int(self['urma_rq_size']) <= 4096)",message="spec.overrides.urma_rq_size must be an integer from 16 to 4096"
	// +kubebuilder:validation:XValidation:rule="!('urma_buffer_size' in self) || self['urma_buffer_size'] in ['1024', '2048', '4096', '8192', '16384', '32768', '65536', '131072', '262144', '524288', '1048576', '2097152', '4194304', '8388608', '16777216', '33554432', '67108864']",message="spec.overrides.urma_buffer_size must be a power of two from 1024 to 67108864"
	// +optional
	Overrides map[string]FlagValue `json:"overrides,omitempty"`
}

// DeviceLimits are the device capabilities the flags were tuned against.
type DeviceLimits struct {
	MaxJFSDepth      int64 `json:"maxJfsDepth"`
	MaxJFRDepth      int64 `json:"maxJfrDepth"`
	MaxJFCDepth      int64 `json:"maxJfcDepth"`
	MaxMsgSize       int64 `json:"maxMsgSize"`
	JettiesPerDevice int64 `json:"jettiesPerDevice,omitempty"`
	DeviceCount      int64 `json:"deviceCount,omitempty"`
}

// LimitsSource says where the device limits came from.
type LimitsSource string

// Limits sources.
const (
	// LimitsFromNodes: the URMA device facts of the nodes.
	LimitsFromNodes LimitsSource = "NodeFacts"
	// LimitsSoftware: no node reports facts; the software provider's limits.
	LimitsSoftware LimitsSource = "Software"
	// LimitsLastKnown: no relevant node reports facts now (none matches,
	// or the pods' nodes briefly publish none); the limits the current
	// ConfigMap was tuned against are kept.
	LimitsLastKnown LimitsSource = "LastKnown"
)

// NodeGroup is a set of nodes whose devices report identical limits.
type NodeGroup struct {
	// Limits of every node in the group; absent when the nodes report no
	// facts (their pods were tuned with the limits the current ConfigMap
	// recorded or, before any were recorded, the software provider's).
	// +optional
	Limits *DeviceLimits `json:"limits,omitempty"`
	// NodeCount is the number of nodes in the group.
	NodeCount int32 `json:"nodeCount"`
	// Nodes names up to five of them.
	// +listType=atomic
	// +optional
	Nodes []string `json:"nodes,omitempty"`
}

// Condition types.
const (
	// ConditionReady is True when the ConfigMap holds the flags for the
	// current spec and device limits.
	ConditionReady = "Ready"
	// ConditionClamped is True when a device or budget limit changed a value
	// the rules or overrides wanted; the message lists each one.
	ConditionClamped = "Clamped"
	// ConditionDegraded is True when the flags were rendered with less than
	// full information (no node facts, differing node groups, hardware
	// warnings); the reason says which.
	ConditionDegraded = "Degraded"
)

// Condition reasons.
const (
	ReasonRendered          = "Rendered"
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonConfigMapConflict = "ConfigMapConflict"
	// ReasonClaimTemplateConflict: the endpoint's ResourceClaimTemplate
	// name (DRA driver) is taken by one it does not control.
	ReasonClaimTemplateConflict = "ClaimTemplateConflict"
	ReasonApplyFailed           = "ApplyFailed"
	ReasonValuesClamped         = "ValuesClamped"
	ReasonNoClamps              = "NoClamps"
	ReasonAsExpected            = "AsExpected"
	ReasonNoNodeFacts           = "NoNodeFacts"
	ReasonInvalidNodeFacts      = "InvalidNodeFacts"
	ReasonNodeGroupsDiffer      = "NodeGroupsDiffer"
	ReasonHardwareWarnings      = "HardwareWarnings"
)

// UrmaEndpointStatus is what the operator rendered and how many pods run it.
type UrmaEndpointStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, Clamped, Degraded.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Effective is every urma_* flag in force, by name.
	// +optional
	Effective map[string]string `json:"effective,omitempty"`
	// FlagsHash is the hash of the rendered flags; pods stamped with it run
	// the current flags.
	// +optional
	FlagsHash string `json:"flagsHash,omitempty"`
	// ConfigMapName is the ConfigMap holding the flags (key urma.flags).
	// +optional
	ConfigMapName string `json:"configMapName,omitempty"`
	// MatchedPods is the number of running or pending pods labelled with
	// this endpoint.
	// +optional
	MatchedPods int32 `json:"matchedPods"`
	// PodsOnCurrentFlags is how many of them were admitted with the current
	// flags (their flags-hash annotation equals FlagsHash). The others need
	// a restart to pick the flags up.
	// +optional
	PodsOnCurrentFlags int32 `json:"podsOnCurrentFlags"`
	// DeviceLimits are the limits the flags were tuned against: the smallest
	// of each limit over all node groups.
	// +optional
	DeviceLimits *DeviceLimits `json:"deviceLimits,omitempty"`
	// LimitsSource says where DeviceLimits came from.
	// +optional
	LimitsSource LimitsSource `json:"limitsSource,omitempty"`
	// NodeGroups lists the groups of nodes with identical limits (at most 16).
	// +listType=atomic
	// +optional
	NodeGroups []NodeGroup `json:"nodeGroups,omitempty"`
	// JettyUnitsPerPod is the urma.openeuler.org/jetty request the pod
	// webhook adds to each URMA container: jettyBudget in the device
	// plugin's units (the smallest unit among the relevant nodes, so every
	// node gives at least the budget; the plugin's default unit while no
	// node has published facts).
	// +optional
	JettyUnitsPerPod int64 `json:"jettyUnitsPerPod,omitempty"`
	// RegisteredBytesPerPod is the buffer pool each pod registers and locks;
	// the pod's RLIMIT_MEMLOCK must allow it.
	// +optional
	RegisteredBytesPerPod int64 `json:"registeredBytesPerPod,omitempty"`
}

// UrmaEndpoint declares what a workload's URMA traffic looks like. The
// operator renders tuned urma_* flags into a ConfigMap, and pods labelled
// urma.openeuler.org/endpoint=<name> get it mounted at admission.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ue;urmaep,categories=urma
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: pods name their endpoint in the label urma.openeuler.org/endpoint"
// +kubebuilder:printcolumn:name="Objective",type=string,JSONPath=`.spec.profile.objective`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Clamped",type=string,JSONPath=`.status.conditions[?(@.type=="Clamped")].status`
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].reason`,priority=1
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.matchedPods`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.podsOnCurrentFlags`
// +kubebuilder:printcolumn:name="Hash",type=string,JSONPath=`.status.flagsHash`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type UrmaEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   UrmaEndpointSpec   `json:"spec"`
	Status UrmaEndpointStatus `json:"status,omitempty"`
}

// UrmaEndpointList is a list of UrmaEndpoints.
//
// +kubebuilder:object:root=true
type UrmaEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UrmaEndpoint `json:"items"`
}
