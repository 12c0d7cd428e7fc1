package testservers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outflow-dev/outflow/migrations"
)

// LogicalPostgres is a PostgreSQL server of one test's own, with
// wal_level=logical: what the WAL mode's relay (package walrelay) reads
// through a replication slot. The shared test server runs with
// wal_level=replica, and a slot is a server-wide resource a test must be
// free to invalidate, so such tests get a cluster each.
type LogicalPostgres struct {
	// URL connects to its database "outflow", whose public schema holds
	// the framework's migrations.
	URL string
	// Pool is connected to URL and closed when the test ends.
	Pool *pgxpool.Pool
	// Port is the TCP port it listens on, at 127.0.0.1.
	Port int
}

// pgBinDir finds initdb and postgres: $OUTFLOW_PG_BIN, then the newest
// /usr/lib/postgresql/*/bin, then $PATH.
func pgBinDir() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("OUTFLOW_PG_BIN"); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("OUTFLOW_PG_BIN=%s holds no initdb and postgres", d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("the PostgreSQL server binaries initdb and postgres are not installed (looked in $OUTFLOW_PG_BIN, /usr/lib/postgresql/*/bin and $PATH): " +
		"run scripts/services.sh tools, or install Debian's postgresql package")
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// StartLogicalPostgres initdb's a cluster in a directory of its own, starts
// it on a free port with wal_level=logical (fsync off: a test's data need
// not survive a power cut) and each of settings ("name=value", e.g.
// "max_slot_wal_keep_size=64MB"), migrates it, and stops and removes it
// when t ends. It fails t, saying what is missing, when the server's
// binaries are not installed; it never skips. Run as root, the server runs
// as the postgres user, as PostgreSQL requires.
func StartLogicalPostgres(t testing.TB, settings ...string) *LogicalPostgres {
	t.Helper()
	lp, stop, err := RunLogicalPostgres(context.Background(), append([]string{"fsync=off", "full_page_writes=off"}, settings...)...)
	if err != nil {
		t.Fatalf("outflowtest: StartLogicalPostgres: %v", err)
	}
	t.Cleanup(stop)
	return lp
}

// RunLogicalPostgres is StartLogicalPostgres for a program (a benchmark):
// the server runs with PostgreSQL's defaults (fsync on) but for
// wal_level=logical and settings, until stop.
func RunLogicalPostgres(ctx context.Context, settings ...string) (lp *LogicalPostgres, stop func(), err error) {
	var cleanups []func()
	stop = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	bin, err := pgBinDir()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "outflow-logical-pg-")
	if err != nil {
		return nil, nil, err
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, nil, fmt.Errorf("running as root, PostgreSQL needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		// The temp directory's parents are world-traversable (/tmp); the
		// directory itself is made the server's.
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "wal_level=logical", "-c", "max_replication_slots=8", "-c", "max_wal_senders=8", "-c", "max_connections=100",
		"-c", "shared_buffers=32MB", "-c", "logging_collector=off"}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	srv := exec.Command(filepath.Join(bin, "postgres"), args...)
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, nil, err
	}
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); logf.Close(); close(exited) }()
	cleanups = append(cleanups, func() {
		// SIGINT is the fast shutdown: sessions are ended, nothing waits
		// for clients. SIGKILL if it does not stop.
		_ = srv.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
	})
	lp = &LogicalPostgres{Port: port}
	admin := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var conn *pgx.Conn
	for {
		conn, err = pgx.Connect(cctx, admin)
		if err == nil {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			return nil, nil, fmt.Errorf("postgres exited at start:\n%s", log)
		case <-cctx.Done():
			return nil, nil, fmt.Errorf("postgres on port %d did not answer: %w", port, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	_, err = conn.Exec(cctx, "CREATE DATABASE outflow")
	conn.Close(cctx)
	if err != nil {
		return nil, nil, fmt.Errorf("create database: %w", err)
	}
	lp.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/outflow?sslmode=disable", port)
	lp.Pool, err = pgxpool.New(cctx, lp.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("pool: %w", err)
	}
	cleanups = append(cleanups, lp.Pool.Close)
	db := stdlib.OpenDBFromPool(lp.Pool)
	defer db.Close()
	if _, err := migrations.Up(cctx, db); err != nil {
		return nil, nil, fmt.Errorf("migrate: %w", err)
	}
	return lp, stop, nil
}

// String is the server's URL, for messages.
func (p *LogicalPostgres) String() string { return strings.TrimSuffix(p.URL, "?sslmode=disable") }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
