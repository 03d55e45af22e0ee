{{/*
Chart name, truncated to 63 characters (the DNS label limit of object names).
*/}}
{{- define "urma-k8s.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every object name. Service names, DNS labels of at most 63
characters, get suffixes of up to 22 ("-device-plugin-metrics"), so the
prefix is kept to 41.
*/}}
{{- define "urma-k8s.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 41 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 41 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 41 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "urma-k8s.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "urma-k8s.labels" -}}
helm.sh/chart: {{ include "urma-k8s.chart" . }}
app.kubernetes.io/name: {{ include "urma-k8s.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: urma-k8s
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of one component; call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "urma-k8s.selectorLabels" -}}
app.kubernetes.io/name: {{ include "urma-k8s.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
All labels of one component; call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "urma-k8s.componentLabels" -}}
{{ include "urma-k8s.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Image reference; call with (dict "ctx" $ "image" .Values.operator.image).
The registry is the image's own, else global.imageRegistry, put in front of
the repository unless the repository already starts with a registry host (a
first part with a "." or ":", or localhost, as container runtimes read a
name). A digest wins over a tag; the tag is the image's own, else
global.imageTag, else the chart's appVersion.
*/}}
{{- define "urma-k8s.image" -}}
{{- $global := .ctx.Values.global | default dict }}
{{- $repo := .image.repository }}
{{- $first := first (splitList "/" $repo) }}
{{- $hasHost := and (contains "/" $repo) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $registry := .image.registry | default $global.imageRegistry | default "" | trimSuffix "/" }}
{{- $name := $repo }}
{{- if and $registry (not $hasHost) }}
{{- $name = printf "%s/%s" $registry $repo }}
{{- end }}
{{- if .image.digest -}}
{{- printf "%s@%s" $name .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (.image.tag | default $global.imageTag | default .ctx.Chart.AppVersion) -}}
{{- end -}}
{{- end }}

{{- define "urma-k8s.devicePlugin.fullname" -}}
{{- printf "%s-device-plugin" (include "urma-k8s.fullname" .) }}
{{- end }}

{{- define "urma-k8s.devicePlugin.serviceAccountName" -}}
{{- if .Values.devicePlugin.serviceAccount.create }}
{{- default (include "urma-k8s.devicePlugin.fullname" .) .Values.devicePlugin.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.devicePlugin.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "urma-k8s.draDriver.fullname" -}}
{{- printf "%s-dra-driver" (include "urma-k8s.fullname" .) }}
{{- end }}

{{- define "urma-k8s.draDriver.serviceAccountName" -}}
{{- if .Values.draDriver.serviceAccount.create }}
{{- default (include "urma-k8s.draDriver.fullname" .) .Values.draDriver.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.draDriver.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The label the chart's NodeFeatureRule puts on UB nodes. NFD allows the
feature.node.kubernetes.io/ namespace without extra configuration.
*/}}
{{- define "urma-k8s.devicePlugin.nfdLabel" -}}
feature.node.kubernetes.io/urma-ub
{{- end }}

{{/*
Where the host's NFD features.d is mounted in the plugin's container.
*/}}
{{- define "urma-k8s.devicePlugin.featuresMount" -}}
/host/nfd/features.d
{{- end }}

{{/*
"true" when the API server serves ValidatingAdmissionPolicy v1 (GA and on by
default since Kubernetes 1.30), "" otherwise. Helm's offline capabilities
(helm template, helm lint) list group/versions only, so the version decides.
*/}}
{{- define "urma-k8s.servesVAP" -}}
{{- if or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/*
Fails the render when an optional API the values ask for is not served.
Call with (dict "ctx" $ "api" "group/version" "value" "a.b.c" "what" "...").
Optional keys, for a setting that is not a boolean turned on:
  "setting"  what asks for the API (default "<value>=true"),
  "instead"  the setting that does without it (default "<value>=false"),
  "served"   "true" or "" when more than the group/version decides (default:
             whether the API server serves "api"),
  "offline"  the `helm template` flags that describe a cluster with the API
             (default "--api-versions <api>").
*/}}
{{- define "urma-k8s.requireAPI" -}}
{{- $served := .ctx.Capabilities.APIVersions.Has .api }}
{{- if hasKey . "served" }}
{{- $served = get . "served" }}
{{- end }}
{{- if not $served }}
{{- $setting := default (printf "%s=true" .value) (get . "setting") }}
{{- $instead := default (printf "%s=false" .value) (get . "instead") }}
{{- $offline := default (printf "--api-versions %s" .api) (get . "offline") }}
{{- fail (printf "%s needs the %s API, which this cluster does not serve: %s first, or set %s. (With `helm template`, pass %s when the cluster has it.)" $setting .api .what $instead $offline) }}
{{- end }}
{{- end }}

{{/*
The resource.k8s.io version of the DRA driver's ResourceSlices and of the
chart's DeviceClass (files/dra/deviceclass.yaml): v1, GA and served by
default since Kubernetes 1.34.
*/}}
{{- define "urma-k8s.dra.apiVersion" -}}
resource.k8s.io/v1
{{- end }}

{{/*
"true" when the API server serves the DRA API the driver uses, "" otherwise.
A cluster serves resource.k8s.io/v1 only from 1.34 on; the version matters
for `helm template`, whose offline capabilities list every group/version its
client library knows whatever --kube-version says.
*/}}
{{- define "urma-k8s.servesDRA" -}}
{{- if and (.Capabilities.APIVersions.Has (include "urma-k8s.dra.apiVersion" .)) (semverCompare ">=1.34-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{- define "urma-k8s.operator.fullname" -}}
{{- printf "%s-operator" (include "urma-k8s.fullname" .) }}
{{- end }}

{{- define "urma-k8s.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "urma-k8s.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Names shared by the webhook Service, its configuration, its certificate and
the operator's flags: they must agree, so they are defined once.
*/}}
{{- define "urma-k8s.webhook.serviceName" -}}
{{- printf "%s-webhook" (include "urma-k8s.fullname" .) }}
{{- end }}

{{- define "urma-k8s.webhook.certSecretName" -}}
{{- printf "%s-webhook-cert" (include "urma-k8s.fullname" .) }}
{{- end }}

{{- define "urma-k8s.webhook.certificateName" -}}
{{- printf "%s-webhook" (include "urma-k8s.fullname" .) }}
{{- end }}

{{- define "urma-k8s.webhook.issuerName" -}}
{{- printf "%s-selfsigned" (include "urma-k8s.fullname" .) }}
{{- end }}

{{/*
Rules of the operator's generated RBAC (files/rbac/role.yaml, a copy of
config/rbac/role.yaml), as YAML lists under "cluster" (ClusterRole rules) and
"namespaced" (Role rules; controller-gen writes them for the namespace in the
marker, the chart grants them in the release namespace).
*/}}
{{- define "urma-k8s.operator.generatedRules" -}}
{{- $cluster := list }}
{{- $namespaced := list }}
{{- range $doc := regexSplit "(?m)^---\\s*$" (.Files.Get "files/rbac/role.yaml") -1 }}
{{- $o := fromYaml $doc }}
{{- if hasKey $o "Error" }}
{{- fail (printf "files/rbac/role.yaml is not valid YAML: %s" $o.Error) }}
{{- end }}
{{- if eq (toString $o.kind) "ClusterRole" }}
{{- $cluster = concat $cluster $o.rules }}
{{- else if eq (toString $o.kind) "Role" }}
{{- $namespaced = concat $namespaced $o.rules }}
{{- end }}
{{- end }}
{{- if not $cluster }}
{{- fail "files/rbac/role.yaml has no ClusterRole rules: run hack/sync-chart-crds.sh" }}
{{- end }}
{{- toYaml (dict "cluster" $cluster "namespaced" $namespaced) }}
{{- end }}

{{/*
Milliseconds of a Prometheus duration such as 1m30s (values.schema.json's
promDuration: units y, w, d, h, m, s, ms, in that order); call with the string.
*/}}
{{- define "urma-k8s.promDurationMs" -}}
{{- $re := "^(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?$" }}
{{- $ms := 0 }}
{{- range $i, $unit := list 31536000000 604800000 86400000 3600000 60000 1000 1 }}
{{- with regexReplaceAll $re $ (printf "${%d}" (add1 $i)) }}
{{- $ms = add $ms (mul (int64 .) $unit) }}
{{- end }}
{{- end }}
{{- $ms }}
{{- end }}

{{/*
Checks of value combinations that values.schema.json cannot express; they
fail the render with a message that names the values.
*/}}
{{- define "urma-k8s.validate" -}}
{{- if and .Values.operator.enabled (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail "operator.replicas > 1 needs operator.leaderElection.enabled=true: replicas would reconcile the same UrmaEndpoints at once" }}
{{- end }}
{{- if .Values.operator.enabled }}
{{- /* The operator listens on each port; two alike crash-loop it (address already in use). */}}
{{- $ports := list (list "operator.metrics.port" .Values.operator.metrics.port) (list "operator.healthProbePort" .Values.operator.healthProbePort) }}
{{- if .Values.webhook.enabled }}
{{- $ports = append $ports (list "webhook.port" .Values.webhook.port) }}
{{- end }}
{{- range $i, $a := $ports }}
{{- range $b := slice $ports (add1 $i) }}
{{- if eq (int (index $a 1)) (int (index $b 1)) }}
{{- fail (printf "%s=%v and %s=%v: the operator listens on both, so it could not start (address already in use); give them different ports" (index $a 0) (index $a 1) (index $b 0) (index $b 1)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- /*
An existing ServiceAccount must be named: with create=false and no name the
chart would bind the component's roles to the namespace's "default" account,
which every other pod there runs as.
*/}}
{{- $accounts := list }}
{{- if .Values.operator.enabled }}
{{- $accounts = append $accounts (list "operator" .Values.operator.serviceAccount) }}
{{- end }}
{{- if and .Values.devicePlugin.enabled (eq .Values.driver "devicePlugin") .Values.devicePlugin.nodeLabels.enabled }}
{{- $accounts = append $accounts (list "devicePlugin" .Values.devicePlugin.serviceAccount) }}
{{- end }}
{{- if eq .Values.driver "dra" }}
{{- $accounts = append $accounts (list "draDriver" .Values.draDriver.serviceAccount) }}
{{- end }}
{{- range $accounts }}
{{- $sa := index . 1 }}
{{- if and (not $sa.create) (not $sa.name) }}
{{- fail (printf "%s.serviceAccount.create=false needs %s.serviceAccount.name: without it the chart would grant the %s's permissions to the namespace's default ServiceAccount, which every other pod there runs as" (index . 0) (index . 0) (index . 0)) }}
{{- end }}
{{- end }}
{{- if and .Values.webhook.enabled (not .Values.operator.enabled) }}
{{- fail "webhook.enabled=true needs operator.enabled=true: the operator serves the webhook, and a webhook without a server blocks labelled pods" }}
{{- end }}
{{- if and .Values.devicePlugin.enabled (eq .Values.driver "devicePlugin") }}
{{- range .Values.devicePlugin.extraArgs }}
{{- if hasPrefix "--nfd-features-dir" . }}
{{- fail "devicePlugin.extraArgs: use devicePlugin.nfd.featuresDir instead of --nfd-features-dir, so that the host directory is mounted into the plugin" }}
{{- end }}
{{- end }}
{{- end }}
{{- $sm := .Values.metrics.serviceMonitor }}
{{- /*
A null interval or scrapeTimeout leaves it to Prometheus' global setting, which
the chart does not know (and Prometheus caps a global timeout at the interval).
Only a ServiceMonitor the chart renders is checked (servicemonitor.yaml: the
operator's, and the device plugin's when it is the node agent).
*/}}
{{- $monitored := or .Values.operator.enabled (and .Values.devicePlugin.enabled (eq .Values.driver "devicePlugin")) }}
{{- if and $sm.enabled $monitored $sm.interval $sm.scrapeTimeout }}
{{- $timeout := include "urma-k8s.promDurationMs" (toString $sm.scrapeTimeout) | int64 }}
{{- $interval := include "urma-k8s.promDurationMs" (toString $sm.interval) | int64 }}
{{- if gt $timeout $interval }}
{{- fail (printf "metrics.serviceMonitor.scrapeTimeout=%s exceeds metrics.serviceMonitor.interval=%s: Prometheus refuses a scrape timeout longer than the scrape interval, so nothing would be scraped" $sm.scrapeTimeout $sm.interval) }}
{{- end }}
{{- end }}
{{- $pdb := .Values.operator.podDisruptionBudget }}
{{- if and .Values.operator.enabled $pdb.enabled }}
{{- /* Kubernetes rounds a percentage minAvailable up. */}}
{{- $replicas := int .Values.operator.replicas }}
{{- $min := $pdb.minAvailable }}
{{- $need := 0 }}
{{- if and (kindIs "string" $min) (hasSuffix "%" $min) }}
{{- $need = div (add (mul (int (trimSuffix "%" $min)) $replicas) 99) 100 }}
{{- else }}
{{- $need = int $min }}
{{- end }}
{{- if ge $need $replicas }}
{{- fail (printf "operator.podDisruptionBudget.minAvailable=%v keeps all %d operator replicas: the budget allows no eviction and node drains block; raise operator.replicas or lower minAvailable" $min $replicas) }}
{{- end }}
{{- end }}
{{- if eq .Values.driver "dra" }}
{{- /* The driver publishes ResourceSlices whatever installDeviceClass says. */}}
{{- include "urma-k8s.requireAPI" (dict "ctx" . "api" (include "urma-k8s.dra.apiVersion" .) "served" (include "urma-k8s.servesDRA" .) "setting" "driver=dra" "instead" "driver=devicePlugin" "what" "upgrade to Kubernetes 1.34 or later (which serves it by default)" "offline" (printf "--api-versions %s and --kube-version 1.34 or later" (include "urma-k8s.dra.apiVersion" .))) }}
{{- $r := .Values.draDriver.jettyRequest }}
{{- if lt (int $r.default) (int $r.min) }}
{{- fail (printf "draDriver.jettyRequest.default=%v is below draDriver.jettyRequest.min=%v: the DRA driver would refuse to start" $r.default $r.min) }}
{{- end }}
{{- if ne (mod (sub (int $r.default) (int $r.min)) (int $r.step)) 0 }}
{{- fail (printf "draDriver.jettyRequest.default=%v is not draDriver.jettyRequest.min=%v plus a multiple of draDriver.jettyRequest.step=%v: the DRA driver would refuse to start" $r.default $r.min $r.step) }}
{{- end }}
{{- end }}
{{- if and .Values.webhook.enabled .Values.operator.enabled (eq (int .Values.operator.replicas) 0) (eq .Values.webhook.failurePolicy "Fail") }}
{{- fail "operator.replicas=0 with webhook.enabled=true and webhook.failurePolicy=Fail blocks every pod labelled urma.openeuler.org/endpoint; set webhook.enabled=false or webhook.failurePolicy=Ignore" }}
{{- end }}
{{- end }}

{{/*
liburma injection (docs/liburma-soft.md), shared by both node agents: their
flags, the read-only mounts through which they look for the host's liburma
(the parents of liburma.hostLibDir and liburma.hostProviderDir under /host),
and, with software devices (.soft), the directory they copy their own
liburma into. Called with (dict "ctx" $ "soft" <bool>).
*/}}
{{- define "urma-k8s.liburma.args" -}}
{{- $l := .ctx.Values.liburma }}
- --inject-liburma={{ $l.inject }}
{{- if $l.inject }}
- --liburma-host-root=/host
- --liburma-host-dir={{ $l.hostLibDir }}
- --liburma-provider-dir={{ $l.hostProviderDir }}
- --liburma-library-path={{ $l.setLibraryPath }}
{{- if .soft }}
- --liburma-soft-dir={{ $l.softDir }}
{{- end }}
{{- end }}
{{- end }}

{{- define "urma-k8s.liburma.separateProviderParent" -}}
{{- $l := .ctx.Values.liburma }}
{{- if not (hasPrefix (printf "%s/" (dir $l.hostLibDir)) (printf "%s/" (dir $l.hostProviderDir))) }}true{{ end }}
{{- end }}

{{- define "urma-k8s.liburma.volumeMounts" -}}
{{- $l := .ctx.Values.liburma }}
{{- if $l.inject }}
- name: liburma-host
  mountPath: /host{{ dir $l.hostLibDir }}
  readOnly: true
{{- if include "urma-k8s.liburma.separateProviderParent" . }}
- name: liburma-providers
  mountPath: /host{{ dir $l.hostProviderDir }}
  readOnly: true
{{- end }}
{{- if .soft }}
- name: liburma-soft
  mountPath: {{ $l.softDir }}
{{- end }}
{{- end }}
{{- end }}

{{- define "urma-k8s.liburma.volumes" -}}
{{- $l := .ctx.Values.liburma }}
{{- if $l.inject }}
- name: liburma-host
  hostPath:
    path: {{ dir $l.hostLibDir }}
    type: Directory
{{- if include "urma-k8s.liburma.separateProviderParent" . }}
- name: liburma-providers
  hostPath:
    path: {{ dir $l.hostProviderDir }}
    type: Directory
{{- end }}
{{- if .soft }}
- name: liburma-soft
  hostPath:
    path: {{ $l.softDir }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
{{- end }}
