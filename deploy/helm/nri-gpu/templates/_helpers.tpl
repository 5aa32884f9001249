{{/* Only the template subset hack/testbed/helm_render.py implements is used here: see README.md. */}}
{{- define "nri-gpu.name" -}}
{{ default .Chart.Name .Values.nameOverride }}
{{- end }}

{{- define "nri-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nri-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nri-gpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "nri-gpu.runtimeConfigDir" -}}
{{ if eq .Values.nodeSetup.runtime "crio" }}{{ .Values.nodeSetup.config }}{{ else }}{{ dir .Values.nodeSetup.config }}{{ end }}
{{- end }}
