package outflowtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq" // registers the "postgres" driver for OpenLibPQ

	"github.com/outflow-dev/outflow/migrations"
)

// DefaultDatabaseURL is the test database used when OUTFLOW_TEST_DATABASE_URL
// is not set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/outflow_test?sslmode=disable"

// DatabaseURL returns the test database URL.
func DatabaseURL() string {
	if u := os.Getenv("OUTFLOW_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabaseURL
}

// Schema is a migrated schema of its own for one test.
type Schema struct {
	// Name is the schema's name.
	Name string
	// URL connects with search_path set to the schema.
	URL string
	// Pool is connected to URL and closed when the test ends.
	Pool *pgxpool.Pool
}

// schemaPrefix marks schemas made by this package; stale ones (from a test
// binary that was killed) are dropped by later runs.
const schemaPrefix = "outflowtest_"

// staleAfter is how old a leftover schema must be before it is dropped, long
// enough that a concurrently running test binary never loses its schema.
const staleAfter = time.Hour

var cleanOnce sync.Once

// NewSchema creates a schema for t, applies the framework's migrations and
// then each of sets (a service's own migrations) in order, and drops the
// schema when t ends.
func NewSchema(t testing.TB, sets ...migrations.Set) *Schema {
	t.Helper()
	s := NewEmptySchema(t)
	db := s.OpenDB(t)
	for _, set := range append([]migrations.Set{migrations.Framework()}, sets...) {
		m, err := migrations.NewMigrator(db, set, migrations.Config{})
		if err == nil {
			_, err = m.Up(context.Background())
		}
		if err != nil {
			t.Fatalf("outflowtest: migrate schema %s: %v", s.Name, err)
		}
	}
	return s
}

// NewEmptySchema creates a schema for t without migrating it.
func NewEmptySchema(t testing.TB) *Schema {
	t.Helper()
	ctx := context.Background()
	admin := connectAdmin(t)
	cleanOnce.Do(func() { dropStaleSchemas(ctx, admin) })

	name := fmt.Sprintf("%s%d_%s", schemaPrefix, time.Now().Unix(), randomHex(4))
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("outflowtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		// Cleanup runs after the pools below are closed (LIFO), so no session
		// of the test still holds locks in the schema.
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("outflowtest: drop schema %s: %v", name, err)
		}
		admin.Close(context.Background())
	})

	u, err := url.Parse(DatabaseURL())
	if err != nil {
		t.Fatalf("outflowtest: OUTFLOW_TEST_DATABASE_URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	s := &Schema{Name: name, URL: u.String()}

	pool, err := pgxpool.New(ctx, s.URL)
	if err != nil {
		t.Fatalf("outflowtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	s.Pool = pool
	return s
}

// OpenDB returns a database/sql handle (pgx driver) on the schema, closed
// when t ends.
func (s *Schema) OpenDB(t testing.TB) *sql.DB {
	t.Helper()
	db := stdlib.OpenDBFromPool(s.Pool)
	t.Cleanup(func() { db.Close() })
	return db
}

// OpenLibPQ returns a database/sql handle on the schema through lib/pq,
// closed when t ends.
func (s *Schema) OpenLibPQ(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", s.URL)
	if err != nil {
		t.Fatalf("outflowtest: open lib/pq: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func connectAdmin(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dbURL := DatabaseURL()
	conn, err := pgx.Connect(ctx, dbURL)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "3D000" { // invalid_catalog_name
		if cerr := createDatabase(ctx, dbURL); cerr != nil {
			t.Fatalf("outflowtest: create test database: %v", cerr)
		}
		conn, err = pgx.Connect(ctx, dbURL)
	}
	if err != nil {
		t.Fatalf("outflowtest: PostgreSQL is not reachable at %s: %v\n"+
			"Start it with `make services-up` (local binaries or docker compose), "+
			"or point OUTFLOW_TEST_DATABASE_URL at a server you run.", redact(dbURL), err)
	}
	return conn
}

func createDatabase(ctx context.Context, dbURL string) error {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") { // created concurrently
		return nil
	}
	return err
}

func dropStaleSchemas(ctx context.Context, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE $1`, schemaPrefix+"%")
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, n := range names {
		parts := strings.SplitN(strings.TrimPrefix(n, schemaPrefix), "_", 2)
		created, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil || time.Since(time.Unix(created, 0)) < staleAfter {
			continue
		}
		// Best effort: another run may be dropping it too.
		_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{n}.Sanitize()+" CASCADE")
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// redact hides a password in a database URL.
func redact(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}
