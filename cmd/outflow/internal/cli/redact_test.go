package cli_test

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Every start-up and error path of the outflow commands, with secrets in
// every URL (userinfo and password-like query parameters): bad hosts,
// refused connections, invalid URLs, wrong credentials against the real
// servers, and a successful start. Nothing the process prints, on stdout
// or stderr, holds a secret.
func TestNoSecretInAnyOutput(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	const (
		pw    = "Pw7Secret1"  // a userinfo password
		qpw   = "Qpw7Secret2" // ?password=
		token = "Tok7Secret3" // other secret parameters, a NATS token
	)
	secrets := []string{pw, qpw, token}
	refused := freeAddr(t) // nothing listens there
	dbu, err := url.Parse(s.URL)
	require.NoError(t, err)
	withSecrets := func(u *url.URL, user string) string {
		c := *u
		c.User = url.UserPassword(user, pw)
		q := c.Query()
		q.Set("password", qpw)
		q.Set("sslpassword", token)
		c.RawQuery = q.Encode()
		return c.String()
	}
	goodDB := withSecrets(dbu, "postgres") // trust auth: the passwords are ignored, the connection works
	hostDB := func(host string) string { c := *dbu; c.Host = host; return withSecrets(&c, "postgres") }
	amqpWrong := strings.Replace(testservers.AMQPURL(), "guest:guest@", "guest:"+pw+"@", 1)
	natsHost := strings.TrimPrefix(testservers.NATSURL(), "nats://")

	type tc struct {
		name string
		env  map[string]string
		args []string
	}
	var cases []tc
	dbCommands := [][]string{{"migrate", "up"}, {"migrate", "status"}, {"stats"}, {"outbox", "parked"}, {"dlq", "list"},
		{"forward"}, {"worker"}, {"serve"}, {"serve", "--roles", "forwarder,worker"}}
	for _, db := range []struct{ name, url string }{
		{"refused", hostDB(refused)},
		{"bad host", hostDB("no-such-host.invalid:5432")},
		{"invalid URL", fmt.Sprintf("postgres://postgres:%s@[::1/x?password=%s&token=%s", pw, qpw, token)},
		{"bad port", fmt.Sprintf("postgres://postgres:%s@127.0.0.1:99999/x?password=%s", pw, qpw)},
		{"no such database", func() string { c := *dbu; c.Path = "/no_such_db_7"; return withSecrets(&c, "postgres") }()},
	} {
		for _, args := range dbCommands {
			cases = append(cases, tc{"DATABASE_URL " + db.name + " " + strings.Join(args, " "), map[string]string{"DATABASE_URL": db.url}, args})
		}
	}
	brokerURLs := map[string][]struct{ name, url string }{
		"redis": {
			{"refused", fmt.Sprintf("redis://user:%s@%s/0?token=%s", pw, refused, token)},
			{"bad host", fmt.Sprintf("redis://:%s@no-such-host.invalid:6379/0", pw)},
			{"invalid URL", fmt.Sprintf("redis://:%s@[::1/0", pw)},
			{"wrong password", fmt.Sprintf("redis://default:%s@%s/0", pw, strings.TrimPrefix(testservers.RedisURL(), "redis://"))},
		},
		"amqp": {
			{"refused", fmt.Sprintf("amqp://guest:%s@%s/", pw, refused)},
			{"bad host", fmt.Sprintf("amqp://guest:%s@no-such-host.invalid:5672/", pw)},
			{"invalid URL", fmt.Sprintf("amqp://guest:%s@[::1/", pw)},
			{"wrong password", amqpWrong},
		},
		"nats": {
			{"refused", fmt.Sprintf("nats://user:%s@%s", pw, refused)},
			{"token refused", fmt.Sprintf("nats://%s@%s", token, refused)},
			{"bad host", fmt.Sprintf("nats://user:%s@no-such-host.invalid:4222", pw)},
			{"invalid URL", fmt.Sprintf("nats://user:%s@[::1", pw)},
			{"token", fmt.Sprintf("nats://%s@%s", token, natsHost)},
		},
		"sql": {
			{"refused", hostDB(refused)},
			{"bad host", hostDB("no-such-host.invalid:5432")},
			{"invalid URL", fmt.Sprintf("postgres://postgres:%s@[::1/x?password=%s", pw, qpw)},
		},
		"kafka": {
			{"credentials in the list", fmt.Sprintf("user:%s@%s", pw, refused)},
		},
	}
	envKey := map[string]string{"redis": "REDIS_URL", "amqp": "AMQP_URL", "nats": "NATS_URL", "sql": "BROKER_DATABASE_URL", "kafka": "KAFKA_BROKERS"}
	for broker, urls := range brokerURLs {
		for _, u := range urls {
			for _, args := range [][]string{{"forward"}, {"worker"}, {"serve", "--roles", "api,forwarder"}} {
				cases = append(cases, tc{fmt.Sprintf("%s %s %s", envKey[broker], u.name, strings.Join(args, " ")),
					map[string]string{"DATABASE_URL": goodDB, "OUTFLOW_BROKER": broker, envKey[broker]: u.url}, args})
			}
		}
	}
	// The same through flags rather than the environment; and starts that
	// work, which log their configuration.
	cases = append(cases,
		tc{"serving", map[string]string{"DATABASE_URL": goodDB}, []string{"serve"}},
		tc{"forwarding", map[string]string{"DATABASE_URL": goodDB, "REDIS_URL": testservers.RedisURL() + "?password=" + qpw}, []string{"forward"}},
		tc{"working", map[string]string{"DATABASE_URL": goodDB}, []string{"worker"}},
		tc{"--database-url refused", nil, []string{"--database-url", hostDB(refused), "migrate", "up"}},
		tc{"--redis-url refused", map[string]string{"DATABASE_URL": goodDB}, []string{"--redis-url", fmt.Sprintf("redis://:%s@%s/0", pw, refused), "forward"}},
	)

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := command(c.env, c.args...)
			cmd.Env = append(cmd.Env, "HTTP_ADDR="+freeAddr(t), "LOG_LEVEL=debug")
			out := runUntilSettled(ctx, t, cmd)
			for _, sec := range secrets {
				require.NotContains(t, out, sec, "a secret in the output of %v:\n%s", c.args, out)
			}
		})
	}
}

// runUntilSettled runs cmd and returns all it printed: until it exits, or,
// for a command that starts serving, until it has logged its start-up and
// has been stopped with SIGTERM.
func runUntilSettled(ctx context.Context, t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var out outflowtest.LogBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return out.String()
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("%v neither exited nor started: %s", cmd.Args, out.String())
		case <-tick.C:
			// Running: each of these says a role is up.
			o := out.String()
			if strings.Contains(o, "msg=serving") || strings.Contains(o, "forwarder started") || strings.Contains(o, "worker started") ||
				strings.Contains(o, "msg=\"worker running\"") {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				<-done
				return out.String()
			}
		}
	}
}
