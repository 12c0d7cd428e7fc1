package outflowtest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/schemacheck"
)

// UpdateEventSchemasEnv is the environment variable that makes
// [RequireCompatibleEvents] write the snapshot instead of failing: set to
// 1 (or true) by the developer who means the change, never by CI.
const UpdateEventSchemasEnv = "OUTFLOW_UPDATE_EVENT_SCHEMAS"

// CompatOption tunes [RequireCompatibleEvents].
type CompatOption func(*schemacheck.Options)

// WithCompatMode checks in mode m instead of schemacheck.Backward: Full
// also protects consumers still on the old code from what the new code
// writes.
func WithCompatMode(m schemacheck.Mode) CompatOption {
	return func(o *schemacheck.Options) { o.Mode = m }
}

// WithStoredSamples adds real stored payloads (copied from the outbox's
// history, say) that must still decode, their validation included.
func WithStoredSamples(samples ...schemacheck.StoredSample) CompatOption {
	return func(o *schemacheck.Options) { o.Samples = append(o.Samples, samples...) }
}

// compatT is the part of testing.TB RequireCompatibleEvents uses.
type compatT interface {
	Helper()
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	FailNow()
	Name() string
}

// RequireCompatibleEvents fails t unless the event types of reg read every
// event stored under the snapshot committed at snapshotPath (a JSON file
// of package schemacheck), listing each violation with its type, version,
// field and rule. It also fails when the snapshot is out of date with a
// compatible change (a new optional field, a new type, a new version whose
// upcasters read the old ones): the file must describe what is stored.
//
// With OUTFLOW_UPDATE_EVENT_SCHEMAS=1 in the environment it writes the
// snapshot instead ([schemacheck.Update]: the current versions recorded,
// the older ones kept frozen) and logs the breaks it accepted: a break is
// never recorded without that explicit run, and the failure says so.
func RequireCompatibleEvents(t testing.TB, reg *events.Registry, snapshotPath string, opts ...CompatOption) {
	t.Helper()
	requireCompatibleEvents(t, reg, snapshotPath, os.Getenv(UpdateEventSchemasEnv), opts...)
}

func requireCompatibleEvents(t compatT, reg *events.Registry, path, updateEnv string, opts ...CompatOption) {
	t.Helper()
	var o schemacheck.Options
	for _, f := range opts {
		f(&o)
	}
	update, _ := strconv.ParseBool(updateEnv)
	old, err := schemacheck.Load(path)
	missing := errors.Is(err, schemacheck.ErrNoSnapshot)
	if err != nil && !missing {
		t.Errorf("outflowtest: %v", err)
		t.FailNow()
	}
	var violations []schemacheck.Violation
	if !missing {
		if violations, err = schemacheck.Compare(old, reg, o); err != nil {
			t.Errorf("outflowtest: check event schemas: %v", err)
			t.FailNow()
		}
	}
	next, err := schemacheck.Update(old, reg)
	if err != nil {
		t.Errorf("outflowtest: event schemas: %v", err)
		t.FailNow()
	}
	want, err := next.Marshal()
	if err != nil {
		t.Errorf("outflowtest: event schemas: %v", err)
		t.FailNow()
	}
	have, _ := os.ReadFile(path)
	upToDate := !missing && bytes.Equal(have, want)
	rerun := fmt.Sprintf("%s=1 go test -run '^%s$' .", UpdateEventSchemasEnv, t.Name())

	if update {
		if !upToDate {
			if err := next.Write(path); err != nil {
				t.Errorf("outflowtest: %v", err)
				t.FailNow()
			}
			t.Logf("outflowtest: wrote the event schema snapshot %s: review its diff and commit it", path)
		}
		if len(violations) > 0 {
			t.Logf("outflowtest: %s=1 ACCEPTED these breaks into %s (%s mode); their readers are yours to handle:\n%s",
				UpdateEventSchemasEnv, path, modeName(o.Mode), listViolations(violations))
		}
		return
	}
	switch {
	case missing:
		t.Errorf("outflowtest: no event schema snapshot at %s: record it with\n\t%s\nand commit it", path, rerun)
	case len(violations) > 0:
		t.Errorf("outflowtest: the event types break readers of stored events (%s mode, snapshot %s):\n%s\n"+
			"Fix the change (a new schema version with an upcaster, see docs/events.md). To ship it anyway, knowing who breaks, "+
			"accept these breaks explicitly: run\n\t%s\nand commit the snapshot (an update records the breaks above; nothing else does)",
			modeName(o.Mode), path, listViolations(violations), rerun)
	case !upToDate:
		t.Errorf("outflowtest: the event schema snapshot %s is out of date: the change is compatible (%s mode), record it with\n\t%s\nand commit the snapshot",
			path, modeName(o.Mode), rerun)
	}
}

func modeName(m schemacheck.Mode) string {
	if m == "" {
		return string(schemacheck.Backward)
	}
	return string(m)
}

func listViolations(vs []schemacheck.Violation) string {
	var b strings.Builder
	for _, v := range vs {
		b.WriteString("  - ")
		b.WriteString(v.String())
		b.WriteString("\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}
