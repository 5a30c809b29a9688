//go:build tools

// Package tools pins the helm command the real-API-server tier builds from this module.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
