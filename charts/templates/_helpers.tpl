{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "gnn-faas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name: RELEASE-gnn-faas, or RELEASE when it already holds the chart name. */}}
{{- define "gnn-faas.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gnn-faas.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels (stable across upgrades). */}}
{{- define "gnn-faas.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gnn-faas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* app.kubernetes.io/* labels of every object. */}}
{{- define "gnn-faas.labels" -}}
helm.sh/chart: {{ include "gnn-faas.chart" . }}
{{ include "gnn-faas.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gnn-faas
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of one function: ctx = dict "root" $ "model" MODEL "kind" memory|compute. */}}
{{- define "gnn-faas.functionLabels" -}}
{{ include "gnn-faas.labels" .root }}
app.kubernetes.io/component: {{ .kind }}-function
gnn-faas.io/model: {{ .model.name | quote }}
gnn-faas.io/function-kind: {{ .kind }}
gnn-faas.io/function: {{ include "gnn-faas.functionName" . }}
{{- end }}

{{/* The gateway's function name MODEL-KIND (FunctionSpec.name in the data plane). */}}
{{- define "gnn-faas.functionName" -}}
{{- printf "%s-%s" .model.name .kind }}
{{- end }}

{{/* Kubernetes name of a function's Knative Service / OpenFaaS Function: FULLNAME-MODEL-KIND,
at most 49 characters, so that Knative's derived names (NAME-00001-private) stay DNS labels
(63). A longer name keeps its first 40 characters and gets "-" + the first 8 hex digits of the
sha256 of the whole name: two long names that share a prefix never collide. */}}
{{- define "gnn-faas.functionResourceName" -}}
{{- $full := printf "%s-%s-%s" (include "gnn-faas.fullname" .root) .model.name .kind }}
{{- if le (len $full) 49 }}
{{- $full }}
{{- else }}
{{- printf "%s-%s" ($full | trunc 40 | trimSuffix "-") ($full | sha256sum | trunc 8) }}
{{- end }}
{{- end }}

{{- define "gnn-faas.gatewayName" -}}
{{- printf "%s-gateway" (include "gnn-faas.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The gateway's ServiceAccount: created by the chart, or an existing one named in
serviceAccount.name (never the namespace's `default`: the gateway's Role is bound to it). */}}
{{- define "gnn-faas.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gnn-faas.gatewayName" .) .Values.serviceAccount.name }}
{{- else }}
{{- if or (not .Values.serviceAccount.name) (eq .Values.serviceAccount.name "default") }}
{{- fail "serviceAccount.create=false needs serviceAccount.name: an existing ServiceAccount for the gateway alone (not `default`: every pod of the namespace would get the gateway's Role)" }}
{{- end }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The function pods' ServiceAccount: no token, no Role. */}}
{{- define "gnn-faas.functionServiceAccountName" -}}
{{- printf "%s-function" (include "gnn-faas.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Namespace of the functions (OpenFaaS may put them in its own function namespace). */}}
{{- define "gnn-faas.functionNamespace" -}}
{{- if eq .Values.platform "openfaas" }}{{ default .Release.Namespace .Values.openfaas.functionNamespace }}{{ else }}{{ .Release.Namespace }}{{ end }}
{{- end }}

{{/* Image reference of one of the three images: ctx = dict "root" $ "kind" memory|compute|gateway.
REGISTRY/REPOSITORY:TAG[@DIGEST], where image.KIND overrides the registry and tag of image.*
and a digest pins the exact image (`make push` records them). */}}
{{- define "gnn-faas.image" -}}
{{- $v := .root.Values.image }}
{{- $i := get $v .kind }}
{{- $registry := default $v.registry $i.registry | trimSuffix "/" }}
{{- $tag := default (default .root.Chart.AppVersion $v.tag) $i.tag }}
{{- $ref := printf "%s:%s" $i.repository $tag }}
{{- if $registry }}{{ $ref = printf "%s/%s" $registry $ref }}{{ end }}
{{- if $i.digest }}{{ $ref = printf "%s@%s" $ref $i.digest }}{{ end }}
{{- $ref }}
{{- end }}

{{/* A function's settings: the kind's defaults with the model's sizing on top (a dict). */}}
{{- define "gnn-faas.functionSettings" -}}
{{- $base := deepCopy (get .root.Values.functions .kind) }}
{{- $sizing := get (get .root.Values.sizing .model.name | default dict) .kind | default dict }}
{{- toYaml (mergeOverwrite $base $sizing) }}
{{- end }}

{{/* Store URI without credentials (the Redis URL comes from the Secret at run time). */}}
{{- define "gnn-faas.storeUri" -}}
{{- if eq .Values.store.type "s3" }}
{{- printf "s3://%s/%s" .Values.store.s3.bucket .Values.store.s3.prefix | trimSuffix "/" }}
{{- else }}
{{- "$(GNN_FAAS_STORE)" }}
{{- end }}
{{- end }}

{{/* Environment of every container reading the store: GNN_FAAS_STORE and the read-only
credentials; with `dict "root" $ "write" true` (the prepare Job only) the read-write ones. */}}
{{- define "gnn-faas.storeEnv" -}}
{{- $root := default . .root }}
{{- $write := and (hasKey . "write") .write }}
{{- with $root }}
{{- if eq .Values.store.type "s3" }}
- name: GNN_FAAS_STORE
  value: {{ include "gnn-faas.storeUri" . | quote }}
- name: AWS_REGION
  value: {{ .Values.store.s3.region | quote }}
{{- with .Values.store.s3.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ ternary .Values.store.s3.writeSecret .Values.store.s3.existingSecret $write }}
      key: {{ .Values.store.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ ternary .Values.store.s3.writeSecret .Values.store.s3.existingSecret $write }}
      key: {{ .Values.store.s3.secretAccessKeyKey }}
{{- else }}
- name: GNN_FAAS_STORE
  valueFrom:
    secretKeyRef:
      name: {{ ternary .Values.store.redis.writeSecret .Values.store.redis.existingSecret $write }}
      key: {{ .Values.store.redis.urlKey }}
{{- end }}
{{- end }}
{{- end }}

{{/* Container security context of every container (restricted Pod Security Standard). */}}
{{- define "gnn-faas.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "gnn-faas.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Resources from cpu, memoryMb (requests = limits) and gpus (nvidia.com/gpu limit). */}}
{{- define "gnn-faas.functionResources" -}}
requests:
  cpu: {{ .cpu | quote }}
  memory: {{ printf "%vMi" .memoryMb | quote }}
limits:
  cpu: {{ .cpu | quote }}
  memory: {{ printf "%vMi" .memoryMb | quote }}
  {{- if .gpus }}
  nvidia.com/gpu: {{ .gpus | quote }}
  {{- end }}
{{- end }}

{{/* Init container pulling a model's checkpoint from the store into /model. */}}
{{- define "gnn-faas.fetchModelContainer" -}}
- name: {{ .name | default "fetch-model" }}
  image: {{ include "gnn-faas.image" (dict "root" .root "kind" "memory") }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["gnn-faas", "model", "pull", "--store", "$(GNN_FAAS_STORE)", "--name", {{ .model.name | quote }}, "--out", {{ .out | quote }}]
  {{- if .scratch }}
  workingDir: /scratch
  {{- end }}
  env:
    {{- include "gnn-faas.storeEnv" .root | nindent 4 }}
    {{- if .scratch }}
    {{- include "gnn-faas.knativeScratchEnv" . | nindent 4 }}
    {{- end }}
  securityContext:
    {{- include "gnn-faas.containerSecurityContext" . | nindent 4 }}
  resources:
    {{- toYaml .root.Values.fetchModelResources | nindent 4 }}
  volumeMounts:
    {{- if .scratch }}
    - {name: scratch, mountPath: /scratch}
    {{- else }}
    - {name: tmp, mountPath: /tmp}
    {{- end }}
    - {name: model, mountPath: /model}
{{- end }}

{{/* A CPU quantity ("500m", "2", 1.5) as a number of cores (for the serving YAML). */}}
{{- define "gnn-faas.cores" -}}
{{- $c := toString . }}
{{- if hasSuffix "m" $c }}{{ divf (trimSuffix "m" $c | float64) 1000 }}{{ else }}{{ $c | float64 }}{{ end }}
{{- end }}

{{/* Knative reserves /tmp (and /, /dev, /var, ...) as mount paths: its functions write to an
emptyDir at /scratch instead, and every variable the images point at /tmp follows it. */}}
{{- define "gnn-faas.knativeScratchEnv" -}}
{{- range $name, $sub := dict "TMPDIR" "" "HOME" "" "XDG_CACHE_HOME" "/.cache" "MPLCONFIGDIR" "/matplotlib" "TORCH_HOME" "/.cache/torch" "TORCHINDUCTOR_CACHE_DIR" "/.cache/inductor" }}
- name: {{ $name }}
  value: {{ printf "/scratch%s" $sub | quote }}
{{- end }}
{{- end }}

{{/* The served models' names, comma-separated. */}}
{{- define "gnn-faas.modelNames" -}}
{{- $names := list }}
{{- range .Values.models }}{{ $names = append $names .name }}{{ end }}
{{- join "," $names }}
{{- end }}
