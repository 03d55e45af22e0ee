package webhook

import (
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
)

func hasVolume(pod *corev1.Pod, name string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

// hasMount reports whether c mounts the VolumeName volume, or anything at
// FlagsMountPath. Paths are compared cleaned: "/etc/urma/" is the same
// mount point, which the API server (comparing strings) lets through twice,
// so the container would get two mounts there, one hiding the other.
func hasMount(c *corev1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == VolumeName || path.Clean(m.MountPath) == v1alpha1.FlagsMountPath {
			return true
		}
	}
	return false
}

// flagsVolume is where the pod's VolumeName volume holds the flags key,
// and whether that file is the endpoint's (see flagsPath); "" when the pod
// has no such volume.
func flagsVolume(pod *corev1.Pod, endpoint string) (inVolume string, endpoints bool) {
	for i := range pod.Spec.Volumes {
		if v := &pod.Spec.Volumes[i]; v.Name == VolumeName {
			return flagsPath(v, v1alpha1.ConfigMapName(endpoint))
		}
	}
	return "", false
}

// flagsPath is where volume v holds the flags key (a cleaned path in the
// volume; "" when it holds none), and whether that is the key of ConfigMap
// cm, the endpoint's. A ConfigMap or Secret volume holds it under its name,
// or the path its items give it. A projected volume holds it only through
// a source of ConfigMap cm: its other sources (a token, pod info, another
// ConfigMap) may put any file there, not the endpoint's flags. A volume of
// another kind (the pod's own flags, kept) is taken to hold it under its
// name, as a mount at FlagsMountPath is.
func flagsPath(v *corev1.Volume, cm string) (inVolume string, endpoints bool) {
	switch {
	case v.ConfigMap != nil:
		return keyPath(v.ConfigMap.Items), v.ConfigMap.Name == cm
	case v.Secret != nil:
		return keyPath(v.Secret.Items), false
	case v.Projected != nil:
		if i := flagsSource(v.Projected, cm); i >= 0 {
			return keyPath(v.Projected.Sources[i].ConfigMap.Items), true
		}
		return "", false
	}
	return v1alpha1.ConfigMapKeyFlags, false
}

// flagsSource is the index of the first source of projected volume p that
// shows the flags key of ConfigMap cm, -1 when none does.
func flagsSource(p *corev1.ProjectedVolumeSource, cm string) int {
	for i, s := range p.Sources {
		if s.ConfigMap != nil && s.ConfigMap.Name == cm && keyPath(s.ConfigMap.Items) != "" {
			return i
		}
	}
	return -1
}

// collisions names the other sources of the pod's projected VolumeName
// volume that may put a file at inVolume, where it holds the endpoint's
// flags: the kubelet writes every source's files into one directory, a
// later one replacing an earlier one's file of the same path. A ConfigMap
// or Secret without items projects every key it has, which the webhook
// does not read (a Secret's it may not, and either may change before the
// pod starts): one of them may be a key of inVolume's name (a key has no
// "/", so only a file at the volume's top). An item or a path any source
// gives inVolume surely does (the API server refuses only a path spelled
// the same as another). The endpoint's ConfigMap showing its flags key
// there again is the same file.
func collisions(pod *corev1.Pod, endpoint, inVolume string) []string {
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == VolumeName })
	if i < 0 || pod.Spec.Volumes[i].Projected == nil {
		return nil
	}
	p := pod.Spec.Volumes[i].Projected
	cm := v1alpha1.ConfigMapName(endpoint)
	own := flagsSource(p, cm)
	topLevel := !strings.Contains(inVolume, "/")
	at := func(paths ...string) bool {
		return slices.ContainsFunc(paths, func(s string) bool { return s != "" && path.Clean(s) == inVolume })
	}
	// items: whether items put a file at inVolume; the keys of ConfigMap
	// cm that are its flags key are the endpoint's own file.
	items := func(list []corev1.KeyToPath, ours bool) bool {
		return slices.ContainsFunc(list, func(it corev1.KeyToPath) bool {
			return at(it.Path) && (!ours || it.Key != v1alpha1.ConfigMapKeyFlags)
		})
	}
	var out []string
	for j, s := range p.Sources {
		if j == own {
			continue
		}
		var what string
		switch {
		case s.ConfigMap != nil:
			ours := s.ConfigMap.Name == cm
			// Every key of the endpoint's own, which the operator
			// writes: its flags key is the same file, its hash key
			// not.
			all := topLevel && !ours || ours && inVolume == v1alpha1.ConfigMapKeyHash
			if len(s.ConfigMap.Items) == 0 && all || items(s.ConfigMap.Items, ours) {
				what = "ConfigMap " + s.ConfigMap.Name
			}
		case s.Secret != nil:
			if len(s.Secret.Items) == 0 && topLevel || items(s.Secret.Items, false) {
				what = "Secret " + s.Secret.Name
			}
		case s.DownwardAPI != nil:
			if slices.ContainsFunc(s.DownwardAPI.Items, func(f corev1.DownwardAPIVolumeFile) bool { return at(f.Path) }) {
				what = "downwardAPI"
			}
		case s.ServiceAccountToken != nil:
			if at(s.ServiceAccountToken.Path) {
				what = "serviceAccountToken"
			}
		case s.ClusterTrustBundle != nil:
			if at(s.ClusterTrustBundle.Path) {
				what = "clusterTrustBundle"
			}
		case s.PodCertificate != nil:
			if c := s.PodCertificate; at(c.CredentialBundlePath, c.KeyPath, c.CertificateChainPath) {
				what = "podCertificate"
			}
		}
		if what != "" {
			out = append(out, fmt.Sprintf("sources[%d] (%s)", j, what))
		}
	}
	return out
}

// keyPath is where items put the flags key: under its name when there are
// no items (every key), "" when they leave it out.
func keyPath(items []corev1.KeyToPath) string {
	if len(items) == 0 {
		return v1alpha1.ConfigMapKeyFlags
	}
	for _, it := range items {
		if it.Key == v1alpha1.ConfigMapKeyFlags {
			return path.Clean(it.Path)
		}
	}
	return ""
}

// mountedFile is where mount m of the VolumeName volume shows the file at
// inVolume (a cleaned path in the volume): under MountPath, at MountPath
// itself when the mount's subPath is that file, or under MountPath when the
// subPath is a directory holding it. It is "" when the mount shows another
// part of the volume, or one only the kubelet resolves (subPathExpr).
func mountedFile(m corev1.VolumeMount, inVolume string) string {
	if inVolume == "" || m.SubPathExpr != "" {
		return ""
	}
	sub := path.Clean(m.SubPath)
	switch sub {
	case ".":
		return path.Join(m.MountPath, inVolume)
	case inVolume:
		return path.Clean(m.MountPath)
	}
	if rest, ok := strings.CutPrefix(inVolume, sub+"/"); ok {
		return path.Join(m.MountPath, rest)
	}
	return ""
}

// flagsFile is where container c (after the mount is added) finds the
// flags, given where the VolumeName volume holds them (flagsVolume):
// through its first mount of that volume that shows them; else, when it
// mounts something else at FlagsMountPath, the pod's own flags there (own).
// It is "" when c mounts the volume but sees no flags through it (its
// items or the mount's subPath leave them out), or mounts neither.
func flagsFile(c *corev1.Container, inVolume string) (file string, own bool) {
	for _, m := range c.VolumeMounts {
		if !isFlagsVolume(m) {
			continue
		}
		if f := mountedFile(m, inVolume); f != "" {
			return f, false
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, isFlagsVolume) && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return path.Clean(m.MountPath) == v1alpha1.FlagsMountPath
	}) {
		return path.Join(v1alpha1.FlagsMountPath, v1alpha1.ConfigMapKeyFlags), true
	}
	return "", false
}

func isFlagsVolume(m corev1.VolumeMount) bool { return m.Name == VolumeName }
