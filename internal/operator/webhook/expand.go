package webhook

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// expandEnv resolves the $(NAME) references in an env value the way the
// kubelet does before it starts the container: $(NAME) is lookup's value of
// NAME, $$ is a literal $, and any other $ (an unclosed "$(" included) is
// kept as written. A reference lookup cannot resolve is kept literally, as
// the kubelet keeps a name it does not know; resolved is false then, since
// the kubelet may know the name where the webhook does not (envFrom,
// service variables), and so may run the container with another value.
// It follows the kubelet's expansion (third_party/forked/golang/expansion
// in k8s.io/kubernetes, not a module this one can import) rule for rule.
func expandEnv(s string, lookup func(name string) (string, bool)) (out string, resolved bool) {
	if !strings.Contains(s, "$") {
		return s, true
	}
	var b strings.Builder
	resolved = true
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				// No closing parenthesis: not a reference.
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
				resolved = false
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), resolved
}

// envValue is the value the kubelet gives c's env entry i, as far as the
// webhook can tell: its value with $(NAME) references to the entries
// before it expanded (expandEnv). known is false when that value depends
// on something only the kubelet reads: a valueFrom source (of the entry, or
// of one it refers to) or a name no earlier entry defines.
func envValue(c *corev1.Container, i int) (value string, known bool) {
	// The earlier entries' values, in order, a later one of a name
	// overriding an earlier one, as in the kubelet; absent when unknown.
	defined := map[string]string{}
	lookup := func(name string) (string, bool) {
		v, ok := defined[name]
		return v, ok
	}
	for _, e := range c.Env[:i] {
		v, ok := expandEnv(e.Value, lookup)
		if e.ValueFrom != nil || !ok {
			delete(defined, e.Name)
			continue
		}
		defined[e.Name] = v
	}
	if c.Env[i].ValueFrom != nil {
		return "", false
	}
	return expandEnv(c.Env[i].Value, lookup)
}
