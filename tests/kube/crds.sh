#!/usr/bin/env bash
# The CRDs kube-check installs, from their upstream YAML in fetched repositories (the
# search tool's `fetch` of kubeflow/spark-operator, prometheus-operator/prometheus-operator
# and cert-manager/cert-manager answers with their git directories).
# Usage: crds.sh SPARK_OPERATOR_GIT PROMETHEUS_OPERATOR_GIT CERT_MANAGER_GIT [OUT]
# OUT defaults to $KUBE_KIT/crds (~/.cache/echelon-kube/crds), where kube-check looks.
set -euo pipefail
SPARK=${1:?spark-operator git dir}; PROM=${2:?prometheus-operator git dir}; CM=${3:?cert-manager git dir}
OUT=${4:-${KUBE_KIT:-$HOME/.cache/echelon-kube}/crds}
mkdir -p "$OUT"
for f in sparkapplications scheduledsparkapplications; do
  git --git-dir "$SPARK" show "HEAD:charts/spark-operator-chart/crds/sparkoperator.k8s.io_$f.yaml" > "$OUT/sparkoperator.k8s.io_$f.yaml"
done
for f in servicemonitors prometheusrules; do
  git --git-dir "$PROM" show "HEAD:example/prometheus-operator-crd/monitoring.coreos.com_$f.yaml" > "$OUT/monitoring.coreos.com_$f.yaml"
done
for f in certificates issuers; do
  git --git-dir "$CM" show "HEAD:deploy/crds/cert-manager.io_$f.yaml" > "$OUT/cert-manager.io_$f.yaml"
done
for d in "$SPARK" "$PROM" "$CM"; do echo "$(git --git-dir "$d" rev-parse HEAD) $d"; done > "$OUT/SOURCES"
ls -la "$OUT"
