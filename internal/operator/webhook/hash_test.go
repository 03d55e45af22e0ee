package webhook

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
)

// The flags hash says the pod runs the endpoint's flags. A pod that
// already brings a volume of the webhook's name (a manifest copied from a
// pod of another endpoint, a chart that templates it) keeps it, so it
// does not run this endpoint's ConfigMap and must not be counted on its
// flags.
func TestInjectStampsTheHashOnlyWhenThePodMountsTheEndpointsConfigMap(t *testing.T) {
	otherVolume := func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: VolumeName, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.ConfigMapName("other")}}}}}
	}
	cases := []struct {
		name   string
		mutate func(*corev1.Pod)
		want   bool
	}{
		{name: "bare pod", want: true},
		{name: "the pod already has the endpoints volume", want: true, mutate: func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: VolumeName, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.ConfigMapName("ep")}}}}}
		}},
		{name: "a volume of the webhooks name from another endpoints ConfigMap", mutate: otherVolume},
		{name: "a volume of the webhooks name that is no ConfigMap", mutate: func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: VolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}},
		{name: "every container mounts something else at the flags path", mutate: func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "own", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
				for i := range list {
					list[i].VolumeMounts = []corev1.VolumeMount{{Name: "own", MountPath: v1alpha1.FlagsMountPath}}
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			if c.mutate != nil {
				c.mutate(p)
			}
			Inject(p, Injection{Endpoint: "ep", Hash: "h1", JettyUnits: 3})
			if got := p.Annotations[v1alpha1.AnnotationFlagsHash] == "h1"; got != c.want {
				t.Errorf("hash stamped %v, want %v (volumes %+v)", got, c.want, p.Spec.Volumes)
			}
		})
	}
}
