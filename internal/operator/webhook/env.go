package webhook

import (
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ownValueIs reports whether c's env entry i names file: its value, with
// the $(NAME) references the kubelet would expand expanded (envValue),
// is that path. One the webhook cannot know (valueFrom, a reference to a
// name no earlier entry defines) is not.
func ownValueIs(c *corev1.Container, i int, file string) bool {
	v, known := envValue(c, i)
	return known && path.Clean(v) == file
}

// lastEnvIndex is the index in c.Env of the entry of env var name that
// takes effect, the last one (the kubelet lets a later entry override an
// earlier one); -1 when none.
func lastEnvIndex(c *corev1.Container, name string) int {
	for i := len(c.Env) - 1; i >= 0; i-- {
		if c.Env[i].Name == name {
			return i
		}
	}
	return -1
}

// envFromSources names c's envFrom sources that may set variable name: the
// webhook cannot read their keys (a Secret's, or a ConfigMap that may
// change before the pod starts), only see whether their prefix allows it.
func envFromSources(c *corev1.Container, name string) []string {
	var out []string
	for _, s := range c.EnvFrom {
		if !strings.HasPrefix(name, s.Prefix) {
			continue
		}
		var src string
		switch {
		case s.ConfigMapRef != nil:
			src = "ConfigMap " + s.ConfigMapRef.Name
		case s.SecretRef != nil:
			src = "Secret " + s.SecretRef.Name
		default:
			continue
		}
		if s.Prefix != "" {
			src += " (prefix " + s.Prefix + ")"
		}
		out = append(out, src)
	}
	return out
}
