// Package api holds the OpenAPI document of the admin HTTP API
// (internal/adminapi), checked in as openapi.json and embedded so the binary
// serves exactly the file in the repository at GET /openapi.json.
package api

import _ "embed"

// OpenAPI is api/openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte
