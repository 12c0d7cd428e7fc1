package testservers

import (
	"context"
	"fmt"
	"github.com/outflow-dev/outflow/outflowtest"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartPgBouncer starts a PgBouncer of the test's own on a free port, in
// transaction pooling mode (the mode where a session's state, LISTEN
// included, does not survive its transaction), in front of s's database,
// and returns a URL for it; it is stopped when t ends. The URL names a
// database alias whose server connections are set to s's schema (PgBouncer
// does not pass search_path through), and sets no query exec mode: pgx's
// default named prepared statements need PgBouncer 1.21's
// max_prepared_statements, so callers add default_query_exec_mode=exec (or
// simple_protocol) as a user of such a PgBouncer must.
//
// When pgbouncer is not installed and the test runs as root with apt-get,
// it installs Debian's package; otherwise it fails the test saying how to.
func StartPgBouncer(t testing.TB, s *outflowtest.Schema, poolSize int) string {
	t.Helper()
	bin := findPgBouncer(t)
	u, err := url.Parse(outflowtest.DatabaseURL())
	if err != nil {
		t.Fatalf("outflowtest: OUTFLOW_TEST_DATABASE_URL: %v", err)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	user := u.User.Username()
	if user == "" {
		user = "postgres"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	// Not t.TempDir: when started as root, pgbouncer drops to another user
	// that must still write its log there.
	dir, err := os.MkdirTemp("", "outflow-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	setPath := "SET search_path = " + pgx.Identifier{s.Name}.Sanitize()
	ini := fmt.Sprintf(`[databases]
bouncer = host=%s port=%s dbname=%s user=%s connect_query='%s'

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = 200
logfile = %s
pidfile = %s
`, host, port, strings.TrimPrefix(u.Path, "/"), user, strings.ReplaceAll(setPath, "'", "''"), listen, poolSize,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	cfgPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(cfgPath, []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-q", cfgPath} // -q: the log goes to logfile only
	if os.Geteuid() == 0 {
		args = append([]string{"-u", pgBouncerUser()}, args...) // it refuses to run as root
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatalf("outflowtest: start pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	})
	bouncerURL := fmt.Sprintf("postgres://%s@127.0.0.1:%d/bouncer?sslmode=disable", user, listen)

	// Ready when a query goes through it to PostgreSQL.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, bouncerURL+"&default_query_exec_mode=exec")
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return bouncerURL
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("outflowtest: pgbouncer on port %d did not answer: %v\n%s", listen, err, log)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
	}
}

func findPgBouncer(t testing.TB) string {
	t.Helper()
	look := func() string {
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			return p
		}
		if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
			return "/usr/sbin/pgbouncer"
		}
		return ""
	}
	if p := look(); p != "" {
		return p
	}
	const how = "install PgBouncer (Debian/Ubuntu: apt-get install pgbouncer; macOS: brew install pgbouncer)"
	if _, err := exec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
		t.Fatalf("outflowtest: this test starts its own pgbouncer and none is installed: %s", how)
	}
	out, err := exec.Command("apt-get", "install", "-y", "pgbouncer").CombinedOutput()
	if err != nil {
		if upd, uerr := exec.Command("apt-get", "update").CombinedOutput(); uerr != nil {
			t.Fatalf("outflowtest: pgbouncer is not installed and apt-get update failed (%v): %s\n%s", uerr, upd, how)
		}
		out, err = exec.Command("apt-get", "install", "-y", "pgbouncer").CombinedOutput()
	}
	if p := look(); err != nil || p == "" {
		t.Fatalf("outflowtest: pgbouncer is not installed and apt-get install pgbouncer failed (%v): %s\n%s", err, out, how)
	}
	return look()
}

// pgBouncerUser is the unprivileged user a root test runs pgbouncer as.
func pgBouncerUser() string {
	for _, u := range []string{"postgres", "nobody"} {
		if out, err := exec.Command("id", "-u", u).Output(); err == nil {
			if _, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil {
				return u
			}
		}
	}
	return "nobody"
}
