package main

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	urmav1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

func TestFormatStatus(t *testing.T) {
	tests := []struct {
		name    string
		status  urmav1.UrmaEndpointStatus
		want    []string
		notWant []string
	}{
		{name: "nothing yet", want: []string{"no conditions yet"}, notWant: []string{"device limits", "ConfigMap"}},
		{
			name: "ready and clamped",
			status: urmav1.UrmaEndpointStatus{
				Conditions: []metav1.Condition{
					{Type: urmav1.ConditionReady, Status: metav1.ConditionTrue, Reason: urmav1.ReasonRendered, Message: "ConfigMap echo-urma-flags holds flags abc"},
					{Type: urmav1.ConditionClamped, Status: metav1.ConditionTrue, Reason: urmav1.ReasonValuesClamped, Message: "urma_sq_size 8192 -> 4096 (device max_jfs_depth); urma_rq_size 8192 -> 4096 (device max_jfr_depth)"},
				},
				DeviceLimits:          &urmav1.DeviceLimits{MaxJFSDepth: 8192, MaxJFRDepth: 4096, MaxJFCDepth: 4194304, MaxMsgSize: 1 << 32, JettiesPerDevice: 2016},
				LimitsSource:          urmav1.LimitsFromNodes,
				NodeGroups:            []urmav1.NodeGroup{{NodeCount: 1, Nodes: []string{"ub-node-1"}, Limits: &urmav1.DeviceLimits{MaxJFSDepth: 8192, MaxJFRDepth: 4096, MaxJFCDepth: 16, MaxMsgSize: 1 << 20}}, {NodeCount: 2, Nodes: []string{"a", "b"}}},
				RegisteredBytesPerPod: 35131392,
				ConfigMapName:         "echo-urma-flags",
				FlagsHash:             "bc2e0a9f17da406c",
				MatchedPods:           3,
				PodsOnCurrentFlags:    2,
			},
			want: []string{
				"Ready", "True", "Rendered",
				"ValuesClamped", "urma_sq_size 8192 -> 4096 (device max_jfs_depth)\n", "urma_rq_size 8192 -> 4096",
				"device limits (NodeFacts): max depth jfs/jfr/jfc 8192/4096/4194304, max message 4 GiB, 2016 jetties per device",
				"node group 1: 1 node(s) ub-node-1: jfs/jfr/jfc 8192/4096/16, max message 1 MiB",
				"node group 2: 2 node(s) a,b: no node facts",
				"registered (locked) memory per pod: 33.5 MiB",
				"hash bc2e0a9f17da406c; pods: 3 matched, 2 on the current flags",
			},
		},
		{
			name:    "software limits without numbers",
			status:  urmav1.UrmaEndpointStatus{LimitsSource: urmav1.LimitsSoftware},
			want:    []string{"device limits: Software"},
			notWant: []string{"registered"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := formatStatus(tc.status)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("status lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("status should not contain %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestEndpointReady(t *testing.T) {
	ready := metav1.Condition{Type: urmav1.ConditionReady, Status: metav1.ConditionTrue}
	notReady := metav1.Condition{Type: urmav1.ConditionReady, Status: metav1.ConditionFalse}
	tests := []struct {
		name     string
		gen, obs int64
		conds    []metav1.Condition
		want     bool
	}{
		{name: "ready for this generation", gen: 2, obs: 2, conds: []metav1.Condition{ready}, want: true},
		{name: "ready for an older generation", gen: 2, obs: 1, conds: []metav1.Condition{ready}},
		{name: "not ready", gen: 1, obs: 1, conds: []metav1.Condition{notReady}},
		{name: "no conditions", gen: 1, obs: 1},
	}
	for _, tc := range tests {
		ep := &urmav1.UrmaEndpoint{ObjectMeta: metav1.ObjectMeta{Generation: tc.gen},
			Status: urmav1.UrmaEndpointStatus{ObservedGeneration: tc.obs, Conditions: tc.conds}}
		if got := endpointReady(ep); got != tc.want {
			t.Errorf("%s: endpointReady = %v", tc.name, got)
		}
	}
}

func TestDescribe(t *testing.T) {
	f := nodefacts.Facts{DeviceCount: 1, MaxJFSDepth: 8192, MaxJFRDepth: 4096, MaxJFCDepth: 64, MaxMsgSize: 1 << 32, JettiesPerDevice: 2016, JettiesPerUnit: 16}
	soft := f
	soft.Software = true
	tests := []struct{ got, want string }{
		{describeFacts(f.Annotations()), "1 UB device(s), max depth jfs/jfr/jfc 8192/4096/64, max message 4 GiB, 2016 jetties per device"},
		{describeFacts(soft.Annotations()), "1 software device(s)"},
		{describeFacts(map[string]string{nodefacts.AnnotationDeviceCount: "x"}), "is not an unsigned"},
		{describeSpec(demoUrmaEndpoint().Spec), "objective Throughput, messages 4Ki (max 64Ki), 4 conns x 64 in flight, jetty budget 32, memory budget 64Mi"},
		{kindOf(&corev1.Node{}), "Node"},
		{kindOf(demoUrmaEndpoint()), "UrmaEndpoint"},
	}
	for i, tc := range tests {
		if !strings.Contains(tc.got, tc.want) {
			t.Errorf("case %d: %q lacks %q", i, tc.got, tc.want)
		}
	}
}
