// Package schemadump describes a PostgreSQL schema's objects and rows as
// text, for tests that compare two schemas: an upgraded database against a
// fresh install, the rows of a database before and after an upgrade.
package schemadump

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Placeholder replaces the schema's name in a [Definition], so that the
// definitions of two schemas compare equal when their objects are.
const Placeholder = "<schema>"

// Definition lists the objects of schema from the catalogs: tables and
// their columns (type, nullability, default, identity), constraints,
// indexes, sequences (parameters, not values), functions, triggers and
// views, one line each, sorted. Tables named in exclude, and everything on
// them, are left out.
func Definition(ctx context.Context, pool *pgxpool.Pool, schema string, exclude ...string) (string, error) {
	const q = `
WITH t AS (
	SELECT c.oid, c.relname FROM pg_class c
	WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm') AND NOT c.relname = ANY($2)
)
SELECT format('table %s %s', t.relname, c.relkind) FROM t JOIN pg_class c ON c.oid = t.oid
UNION ALL
SELECT format('column %s.%s %s %s null=%s default=%s identity=%s generated=%s',
	t.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
	pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated)
FROM t JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = t.oid AND d.adnum = a.attnum
UNION ALL
SELECT format('constraint %s.%s %s %s deferrable=%s deferred=%s', t.relname, co.conname, co.contype,
	pg_get_constraintdef(co.oid), co.condeferrable, co.condeferred)
FROM t JOIN pg_constraint co ON co.conrelid = t.oid
UNION ALL
SELECT format('index %s %s', i.relname, pg_get_indexdef(i.oid))
FROM t JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class i ON i.oid = x.indexrelid
UNION ALL
SELECT format('trigger %s.%s %s', t.relname, tg.tgname, pg_get_triggerdef(tg.oid))
FROM t JOIN pg_trigger tg ON tg.tgrelid = t.oid AND NOT tg.tgisinternal
UNION ALL
SELECT format('view %s %s', t.relname, pg_get_viewdef(t.oid)) FROM t JOIN pg_class c ON c.oid = t.oid AND c.relkind IN ('v', 'm')
UNION ALL
SELECT format('sequence %s %s start=%s inc=%s min=%s max=%s cache=%s cycle=%s owned_by=%s', s.relname,
	format_type(q.seqtypid, NULL), q.seqstart, q.seqincrement, q.seqmin, q.seqmax, q.seqcache, q.seqcycle,
	(SELECT o.relname || '.' || a.attname FROM pg_depend dp
	 JOIN pg_class o ON o.oid = dp.refobjid
	 JOIN pg_attribute a ON a.attrelid = dp.refobjid AND a.attnum = dp.refobjsubid
	 WHERE dp.classid = 'pg_class'::regclass AND dp.objid = s.oid AND dp.deptype IN ('a', 'i')))
FROM pg_class s JOIN pg_sequence q ON q.seqrelid = s.oid
WHERE s.relnamespace = $1::regnamespace
  AND NOT EXISTS (SELECT 1 FROM pg_depend dp JOIN pg_class o ON o.oid = dp.refobjid
                  WHERE dp.classid = 'pg_class'::regclass AND dp.objid = s.oid AND o.relname = ANY($2))
UNION ALL
SELECT format('function %s %s', p.proname, pg_get_functiondef(p.oid))
FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
UNION ALL
SELECT format('type %s %s', ty.typname, ty.typtype) FROM pg_type ty
WHERE ty.typnamespace = $1::regnamespace AND ty.typtype NOT IN ('c', 'b') -- row types follow their tables
`
	if exclude == nil {
		exclude = []string{}
	}
	rows, err := pool.Query(ctx, q, pgx.Identifier{schema}.Sanitize(), exclude)
	if err != nil {
		return "", fmt.Errorf("describe schema %s: %w", schema, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("describe schema %s: %w", schema, err)
	}
	for i, l := range lines {
		l = strings.ReplaceAll(l, pgx.Identifier{schema}.Sanitize()+".", Placeholder+".")
		// And as a literal: a function's pinned search_path names it so.
		l = strings.ReplaceAll(l, "'"+schema+"'", "'"+Placeholder+"'")
		lines[i] = strings.ReplaceAll(l, schema+".", Placeholder+".")
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}

// Rows returns every row of every table of schema, as JSON, keyed by table
// and sorted, leaving out the tables named in exclude.
func Rows(ctx context.Context, pool *pgxpool.Pool, schema string, exclude ...string) (map[string][]string, error) {
	// A partition's rows are read through its partitioned table.
	rows, err := pool.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p') AND NOT relispartition`,
		pgx.Identifier{schema}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("list tables of %s: %w", schema, err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list tables of %s: %w", schema, err)
	}
	out := make(map[string][]string, len(tables))
	for _, table := range tables {
		if slices.Contains(exclude, table) {
			continue
		}
		rows, err := pool.Query(ctx, `SELECT to_jsonb(r)::text FROM `+pgx.Identifier{schema, table}.Sanitize()+` r`)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
		vals, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
		slices.Sort(vals)
		out[table] = vals
	}
	return out, nil
}
