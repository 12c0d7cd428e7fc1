package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// walMeter charges the WAL PostgreSQL writes between two marks to the
// relations its records touch, as a DBA would read it: pg_waldump over the
// server's pg_wal, each record's total length (full-page images included)
// charged to the relation of its first block, the relations of one schema
// named, everything else summed as "(other)", and the records without a
// block (commits, above all) of the transactions that wrote to the schema
// as "(no relation)": those of other sessions on the server, and the
// server's own (checkpoints, running-transaction snapshots), are left out,
// so that what the machine does meanwhile does not count. It reads the pg_wal directory
// of the server, so the benchmark runs on the database's host, as root or
// the postgres user. Written here rather than taken from a library: no Go
// library parses WAL records, and pg_waldump, PostgreSQL's own reader, is
// the reference a DBA uses.
type walMeter struct {
	pool   *pgxpool.Pool
	schema string
	dir    string // pg_wal
	bin    string // pg_waldump
}

func newWALMeter(ctx context.Context, pool *pgxpool.Pool) (*walMeter, error) {
	m := &walMeter{pool: pool}
	var data, version string
	if err := pool.QueryRow(ctx, `SELECT current_setting('data_directory'), current_setting('server_version_num'), current_schema()`).
		Scan(&data, &version, &m.schema); err != nil {
		return nil, fmt.Errorf("wal meter: %w", err)
	}
	m.dir = filepath.Join(data, "pg_wal")
	if _, err := os.ReadDir(m.dir); err != nil {
		return nil, fmt.Errorf("wal meter: read %s (run on the database's host, as root or postgres): %w", m.dir, err)
	}
	major := version[:max(len(version)-4, 0)] // 150019 -> 15
	for _, bin := range []string{"/usr/lib/postgresql/" + major + "/bin/pg_waldump", "pg_waldump"} {
		if p, err := exec.LookPath(bin); err == nil {
			m.bin = p
			break
		}
	}
	if m.bin == "" {
		return nil, fmt.Errorf("wal meter: pg_waldump of PostgreSQL %s not found (Debian: postgresql-%s)", major, major)
	}
	return m, nil
}

// mark ends what came before with a CHECKPOINT, so that the first change
// of every page after it writes a full-page image as in production, and
// returns the WAL position to measure from.
func (m *walMeter) mark(ctx context.Context) (string, error) {
	if _, err := m.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return "", fmt.Errorf("wal meter: checkpoint: %w", err)
	}
	var lsn string
	err := m.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walLen matches a pg_waldump record's total length, walBlock the
// tablespace/database/relfilenode of its first block.
var (
	walLen   = regexp.MustCompile(`len \(rec/tot\):\s*\d+/\s*(\d+),`)
	walTx    = regexp.MustCompile(`tx:\s*(\d+),`)
	walBlock = regexp.MustCompile(`blkref #0: rel (\d+)/(\d+)/(\d+)`)
)

// since returns the WAL bytes written from start to now, by relation name.
func (m *walMeter) since(ctx context.Context, start string) (map[string]int64, error) {
	var end string
	if err := m.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
		return nil, err
	}
	// A synchronous commit flushes the WAL up to it: pg_waldump reads only
	// what is on disk, and the forwarder's marks commit asynchronously.
	if _, err := m.pool.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		return nil, err
	}
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, m.bin, "-p", m.dir, "-s", start, "-e", end)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil && out.Len() == 0 {
		return nil, fmt.Errorf("wal meter: pg_waldump: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	names, err := m.relations(ctx)
	if err != nil {
		return nil, err
	}
	var db uint32
	if err := m.pool.QueryRow(ctx, `SELECT oid FROM pg_database WHERE datname = current_database()`).Scan(&db); err != nil {
		return nil, err
	}
	by := map[string]int64{}
	ours := map[string]bool{} // transactions that wrote to the schema
	var noRelation []struct {
		tx string
		n  int64
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		l := walLen.FindStringSubmatch(line)
		if l == nil {
			continue
		}
		n, _ := strconv.ParseInt(l[1], 10, 64)
		tx := ""
		if t := walTx.FindStringSubmatch(line); t != nil && t[1] != "0" {
			tx = t[1]
		}
		g := walBlock.FindStringSubmatch(line)
		switch {
		case g == nil:
			noRelation = append(noRelation, struct {
				tx string
				n  int64
			}{tx, n})
		case g[2] != strconv.FormatUint(uint64(db), 10):
			by["(other)"] += n
		default:
			node, _ := strconv.ParseUint(g[3], 10, 32)
			if name, ok := names[uint32(node)]; ok {
				by[name] += n
				if tx != "" {
					ours[tx] = true
				}
			} else {
				by["(other)"] += n
			}
		}
	}
	for _, r := range noRelation {
		if ours[r.tx] {
			by["(no relation)"] += r.n
		} else {
			by["(other)"] += r.n
		}
	}
	return by, sc.Err()
}

// relations maps the relfilenodes of the schema's relations (and of their
// TOAST tables and indexes) to their names.
func (m *walMeter) relations(ctx context.Context) (map[uint32]string, error) {
	rows, err := m.pool.Query(ctx, `
		SELECT c.relfilenode, c.relname FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relfilenode <> 0
		UNION ALL
		SELECT t.relfilenode, 'toast of ' || c.relname FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid
		WHERE c.relnamespace = $1::regnamespace
		UNION ALL
		SELECT i.relfilenode, 'toast index of ' || c.relname FROM pg_class c JOIN pg_index x ON x.indrelid = c.reltoastrelid
		JOIN pg_class i ON i.oid = x.indexrelid WHERE c.relnamespace = $1::regnamespace`, m.schema)
	if err != nil {
		return nil, fmt.Errorf("wal meter: relations: %w", err)
	}
	defer rows.Close()
	names := map[uint32]string{}
	for rows.Next() {
		var node uint32
		var name string
		if err := rows.Scan(&node, &name); err != nil {
			return nil, err
		}
		names[node] = name
	}
	return names, rows.Err()
}

// walTable formats bytes by relation per event, largest first, with the
// relations whose name starts with one of prefixes (and "(no relation)")
// in the total.
func walTable(by map[string]int64, events int, prefixes ...string) (string, float64) {
	type row struct {
		name  string
		bytes int64
	}
	var rows []row
	var total int64
	for name, b := range by {
		if name == "(other)" {
			continue
		}
		keep := name == "(no relation)"
		for _, p := range prefixes {
			keep = keep || strings.HasPrefix(name, p) || strings.HasPrefix(name, "toast of "+p) || strings.HasPrefix(name, "toast index of "+p)
		}
		if !keep {
			continue
		}
		rows = append(rows, row{name, b})
		total += b
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].bytes > rows[j].bytes })
	var sb strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&sb, "      %-40s %8.0f B/event\n", r.name, float64(r.bytes)/float64(events))
	}
	return sb.String(), float64(total) / float64(events)
}
