package schema

import (
	"embed"
	"io/fs"

	"github.com/outflow-dev/outflow/migrations"
)

//go:embed sql/*.sql
var embedded embed.FS

// VersionTable records which of the webhook migrations are applied.
const VersionTable = "outflow_webhooks_schema_migrations"

// Set returns the webhook tables' migrations.
func Set() migrations.Set {
	sub, err := fs.Sub(embedded, "sql")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return migrations.Set{Name: "webhooks", FS: sub, VersionTable: VersionTable}
}
