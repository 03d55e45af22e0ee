package webhook

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestExpandEnv(t *testing.T) {
	vars := map[string]string{"DIR": "/etc/urma", "EMPTY": "", "REF": "$(DIR)"}
	lookup := func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
	for _, c := range []struct {
		in, want string
		resolved bool
	}{
		{in: "", want: "", resolved: true},
		{in: "/etc/urma/urma.flags", want: "/etc/urma/urma.flags", resolved: true},
		{in: "$(DIR)/urma.flags", want: "/etc/urma/urma.flags", resolved: true},
		{in: "$(DIR)$(DIR)", want: "/etc/urma/etc/urma", resolved: true},
		{in: "$(EMPTY)/f", want: "/f", resolved: true},
		// A value is not expanded twice.
		{in: "$(REF)", want: "$(DIR)", resolved: true},
		{in: "$$(DIR)/f", want: "$(DIR)/f", resolved: true},
		{in: "$$$(DIR)", want: "$/etc/urma", resolved: true},
		{in: "$$$$", want: "$$", resolved: true},
		{in: "a$b", want: "a$b", resolved: true},
		{in: "cost$", want: "cost$", resolved: true},
		{in: "$(DIR", want: "$(DIR", resolved: true},
		{in: "$($(DIR)", want: "$($(DIR)", resolved: false}, // one reference, to the name "$(DIR"
		{in: "$(NOPE)/urma.flags", want: "$(NOPE)/urma.flags", resolved: false},
		{in: "$(NOPE)$(DIR)", want: "$(NOPE)/etc/urma", resolved: false},
		{in: "$()", want: "$()", resolved: false},
		{in: "$(dir)", want: "$(dir)", resolved: false},
	} {
		got, resolved := expandEnv(c.in, lookup)
		if got != c.want || resolved != c.resolved {
			t.Errorf("expandEnv(%q) = %q, %v; want %q, %v", c.in, got, resolved, c.want, c.resolved)
		}
	}
}

func TestEnvValue(t *testing.T) {
	lit := func(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }
	from := func(name string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}
	}
	for _, c := range []struct {
		name  string
		env   []corev1.EnvVar
		want  string
		known bool
	}{
		{name: "plain", env: []corev1.EnvVar{lit("F", "/f")}, want: "/f", known: true},
		{name: "an earlier entry", env: []corev1.EnvVar{lit("D", "/etc/urma"), lit("F", "$(D)/urma.flags")},
			want: "/etc/urma/urma.flags", known: true},
		{name: "a chain of earlier entries", env: []corev1.EnvVar{lit("R", "/etc"), lit("D", "$(R)/urma"), lit("F", "$(D)/urma.flags")},
			want: "/etc/urma/urma.flags", known: true},
		{name: "the last of an earlier names entries", env: []corev1.EnvVar{lit("D", "/a"), lit("D", "/b"), lit("F", "$(D)/f")},
			want: "/b/f", known: true},
		{name: "a later entry is not defined yet", env: []corev1.EnvVar{lit("F", "$(D)/f"), lit("D", "/a")},
			want: "$(D)/f", known: false},
		{name: "an earlier entry from valueFrom", env: []corev1.EnvVar{from("D"), lit("F", "$(D)/f")},
			want: "$(D)/f", known: false},
		{name: "valueFrom replaced by a later literal", env: []corev1.EnvVar{from("D"), lit("D", "/a"), lit("F", "$(D)/f")},
			want: "/a/f", known: true},
		{name: "a literal replaced by a later valueFrom", env: []corev1.EnvVar{lit("D", "/a"), from("D"), lit("F", "$(D)/f")},
			want: "$(D)/f", known: false},
		{name: "an earlier entry with an unknown reference", env: []corev1.EnvVar{lit("D", "$(HOME)/u"), lit("F", "$(D)/f")},
			want: "$(D)/f", known: false},
		{name: "the entry itself from valueFrom", env: []corev1.EnvVar{lit("D", "/a"), from("F")}, known: false},
		{name: "escaped", env: []corev1.EnvVar{lit("D", "/a"), lit("F", "$$(D)/f")}, want: "$(D)/f", known: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctr := &corev1.Container{Env: c.env}
			got, known := envValue(ctr, lastEnvIndex(ctr, "F"))
			if got != c.want || known != c.known {
				t.Errorf("envValue = %q, %v; want %q, %v", got, known, c.want, c.known)
			}
		})
	}
}
