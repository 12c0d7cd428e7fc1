package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
)

// rowsFixture makes the row an action acts on and returns the query that
// counts it changed, with its arguments (the row's id first).
type rowsFixture func(t *testing.T, e *env) (changed string, args []any)

func parkedFixture(t *testing.T, e *env) (string, []any) {
	id := e.insertOutbox(t, "p1", 1, false, true)
	return `SELECT count(*) FROM outbox_failures WHERE id = $1 AND parked_at IS NULL`, []any{id}
}

func deadFixture(t *testing.T, e *env) (string, []any) {
	id := e.insertDead(t, "notify-merchant", "00000000-0000-0000-0000-000000000001", "a", 1, "dead")
	return `SELECT count(*) FROM dead_letters WHERE id = $1 AND status <> 'dead'`, []any{id}
}

// requireBothOrNeither checks an action's invariant: the change and its
// record in outflow_operator_actions are both there, or neither is. A failed
// attempt may be recorded too, with its error: it changed nothing.
func requireBothOrNeither(t *testing.T, e *env, changed string, args []any) {
	t.Helper()
	didChange := e.count(t, changed, args...) > 0
	recorded := e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE error = '' AND result_count > 0`) > 0
	require.Equal(t, didChange, recorded, "changed %v, recorded %v: an action and its record go together", didChange, recorded)
	require.Zero(t, e.count(t, `SELECT count(*) FROM outflow_operator_actions WHERE error <> '' AND result_count <> 0`),
		"a failed action changed nothing")
}

// A NUL byte in a field the action does not use (PostgreSQL's text and
// jsonb refuse it) leaves the action and its record both done, or neither:
// never a change that the audit trail misses.
func TestActionWithABadIgnoredFieldIsRecordedOrUndone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, path string
		form       url.Values
		setup      rowsFixture
	}{
		{"retry every parked row, a NUL consumer", "/parked/retry", url.Values{"all": {"1"}, "consumer": {"x\x00"}}, parkedFixture},
		{"discard every parked row, a NUL status", "/parked/discard", url.Values{"all": {"1"}, "status": {"\x00"}}, parkedFixture},
		{"retry every dead letter, a NUL topic", "/dead/retry", url.Values{"all": {"1"}, "topic": {"\x00"}}, deadFixture},
		{"discard every dead letter, a NUL topic", "/dead/discard", url.Values{"all": {"1"}, "topic": {"a\x00b"}}, deadFixture},
		{"retry a chosen parked row, a NUL note", "/parked/retry", url.Values{"note": {"\x00"}}, parkedFixture},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			changed, args := tc.setup(t, e)
			c := e.client(t)
			form := url.Values{"csrf_token": {e.login(t, c)}, "confirm": {"yes"}}
			for k, v := range tc.form {
				form[k] = v
			}
			if form.Get("all") == "" {
				form.Set("id", strconv.FormatInt(args[0].(int64), 10))
			}
			res, body := do(t, c, http.MethodPost, e.srv.URL+tc.path, form)
			requireBothOrNeither(t, e, changed, args)
			require.Contains(t, []int{http.StatusBadRequest, http.StatusSeeOther}, res.StatusCode,
				"refused, or done and recorded; never a 500: %s", strings.TrimSpace(body))
		})
	}
}

// A client that gives up (a 0.5 s timeout) while the action runs leaves
// the action and its record both done, or neither. A lock the test holds
// makes the console wait, on its record or on the action itself, until
// the client is gone.
func TestActionWhoseClientGivesUpIsRecordedOrUndone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		table string // the test holds a SHARE lock on it: the console's write waits
		path  string // ?all: every row, not the fixture's
		setup rowsFixture
	}{
		{"retry a parked row, the record waits", "outflow_operator_actions", "/parked/retry", parkedFixture},
		{"retry a parked row, the action waits", "outbox_failures", "/parked/retry", parkedFixture},
		{"discard a dead letter, the record waits", "outflow_operator_actions", "/dead/discard", deadFixture},
		{"retry every dead letter, the record waits", "outflow_operator_actions", "/dead/retry?all", deadFixture},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			changed, args := tc.setup(t, e)
			c := e.client(t)
			form := url.Values{"csrf_token": {e.login(t, c)}, "confirm": {"yes"}}
			path, all, _ := strings.Cut(tc.path, "?")
			if all != "" {
				form.Set("all", "1")
			} else {
				form.Set("id", strconv.FormatInt(args[0].(int64), 10))
			}

			ctx := context.Background()
			lock, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = lock.Rollback(ctx) }()
			_, err = lock.Exec(ctx, `LOCK TABLE `+tc.table+` IN SHARE MODE`)
			require.NoError(t, err)

			served := e.served.Load()
			impatient := &http.Client{Jar: c.Jar, CheckRedirect: c.CheckRedirect, Timeout: 500 * time.Millisecond}
			gaveUp := make(chan error, 1)
			go func() {
				req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(form.Encode()))
				if err != nil {
					gaveUp <- err
					return
				}
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				res, err := impatient.Do(req)
				if err == nil {
					res.Body.Close()
				}
				gaveUp <- err
			}()
			var clientErr error
			returned := false
			outflowtest.WaitFor(t, 30*time.Second, "the console waiting on the lock, or the client gone", func() bool {
				select {
				case clientErr = <-gaveUp:
					returned = true
				default:
				}
				return returned || e.count(t, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass`, tc.table) > 0
			})
			if !returned {
				clientErr = <-gaveUp // within its timeout: the console waits on the lock
			}
			require.Error(t, clientErr, "the client gave up")
			require.NoError(t, lock.Rollback(ctx), "release the lock")
			outflowtest.WaitFor(t, 30*time.Second, "the console's handler to end", func() bool { return e.served.Load() > served })
			requireBothOrNeither(t, e, changed, args)
		})
	}
}
