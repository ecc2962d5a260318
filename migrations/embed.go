// Package migrations holds the numbered SQL migrations of the bridge schema.
// They are embedded into the binary and applied by `bridge migrate`
// (internal/database.Migrate).
package migrations

import "embed"

// FS holds every migration file, named NNNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
