package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// committedSnapshot is the reference app's, from this package's directory.
var committedSnapshot = filepath.Join("..", "..", "..", "..", "app", "paymentevents", "event-schemas.json")

// run runs the outflow binary and returns its output and whether it
// exited 0.
func runEvents(t *testing.T, args ...string) (string, bool) {
	t.Helper()
	out, err := command(nil, args...).CombinedOutput()
	if err != nil {
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "%v: %s", args, out)
		return string(out), false
	}
	return string(out), true
}

// `outflow events check` passes on the committed snapshot, fails listing
// the violation (type, version, field, rule) on a change that breaks
// stored events, and records the snapshot only when asked.
func TestEventsCheck(t *testing.T) {
	t.Parallel()
	committed, err := os.ReadFile(committedSnapshot)
	require.NoError(t, err)

	out, ok := runEvents(t, "events", "check", "--snapshot", committedSnapshot, "--mode", "full")
	require.True(t, ok, out)
	require.Contains(t, out, "4 event types compatible")

	// Stored payment.created events had a string amount, by this
	// snapshot: this build's integer cannot read them. And a type this
	// build no longer registers.
	broken := strings.Replace(string(committed), `"amount": {
                "required": true,
                "kind": "integer"`, `"amount": {
                "required": true,
                "kind": "string"`, 1)
	require.NotEqual(t, string(committed), broken)
	broken = strings.Replace(broken, `"events": {`, `"events": {
    "payment.disputed": {"versions": [{"version": 1, "go_type": "paymentevents.Disputed", "shape": {"kind": "object"}}]},`, 1)
	path := filepath.Join(t.TempDir(), "event-schemas.json")
	require.NoError(t, os.WriteFile(path, []byte(broken), 0o644))

	out, ok = runEvents(t, "events", "check", "--snapshot", path)
	require.False(t, ok, out)
	require.Contains(t, out, "payment.canceled v1 field amount: type-changed")
	require.Contains(t, out, "payment.disputed v1: type-unregistered")
	require.Contains(t, out, "2 change(s) of the event types break readers")
	require.Contains(t, out, "--update")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, broken, string(after), "a failing check leaves the snapshot as it was")

	// Forward mode does not judge a type no longer written.
	out, ok = runEvents(t, "events", "check", "--snapshot", path, "--mode", "FORWARD")
	require.False(t, ok, out)
	require.NotContains(t, out, "type-unregistered")

	// --update accepts the breaks, says so, and writes what the
	// registry is: the committed snapshot again.
	out, ok = runEvents(t, "events", "check", "--snapshot", path, "--update")
	require.True(t, ok, out)
	require.Contains(t, out, "--update accepted the 2 break(s) above")
	after, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(committed), string(after))
	out, ok = runEvents(t, "events", "check", "--snapshot", path)
	require.True(t, ok, out)
}

func TestEventsCheckBadInputNamesTheFlag(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "none.json")
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"format": 7, "events": {}}`), 0o644))
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "sideways"}, `invalid --mode: unknown compatibility mode "sideways": backward, forward or full`},
		{[]string{"--snapshot", ""}, "--snapshot: empty"},
		{[]string{"--snapshot", missing}, "--snapshot: no event schema snapshot at " + missing + ": record it with --update"},
		{[]string{"--snapshot", bad}, "--snapshot: " + bad + ": event schema snapshot: format 7"},
		{[]string{"--update=maybe"}, `invalid argument "maybe" for "--update"`},
	} {
		out, ok := runEvents(t, append([]string{"events", "check"}, tt.args...)...)
		require.False(t, ok, "%v: %s", tt.args, out)
		require.Contains(t, out, tt.want, "%v", tt.args)
	}
	_, err := os.Stat(missing)
	require.ErrorIs(t, err, os.ErrNotExist, "a failed check writes nothing")

	out, ok := runEvents(t, "events", "check", "--snapshot", missing, "--update")
	require.True(t, ok, out)
	require.Contains(t, out, "wrote "+missing)
}
